"""EPM-RL claims in the book profile: the experiment function the chapter calls.

Asserted, with thresholds from the claims, not from a run: the positive control holds (GRPO with the
label reward alone lifts a weak LoRA adapter's balanced accuracy by more than 0.02), every measured rate
lies in [0, 1], and every verdict follows the decision rule. The paper's claim (RL over PEFT-only at each
noise level) and the judge ablation can come out either way; their verdicts are evaluated, not asserted.

Book runs of run_experiment (3 seeds, this machine's 2 cores shared with other jobs):
- 2 Dec 2026, GRPO 30 steps at lr 1e-3: 161 s wall. Noise 0.2: +0.028 [-0.022, 0.058] inconclusive;
  noise 0.7: -0.014 [-0.029, 0.006] does not hold; no judge, accuracy +0.008 [-0.008, 0.029] holds;
  faithfulness -0.026 [-0.059, 0.008] inconclusive; positive control 0.548 -> 0.576, +0.028
  [-0.100, 0.054] inconclusive: the RL stage could not be shown to lift anything.
- Then, on the control alone and on seeds 10-12 (not the evaluated 0-2), only the RL stage varied:
  80 steps at 3e-4 lifted the weak adapter by 0.015 to 0.097; every arm now uses it (the chapter's
  admonition says so).
- 3 Dec 2026, GRPO 80 steps at lr 3e-4: the chapter ran in 285 s (load ~2-3). Noise 0.2: SFT-LoRA+RL
  over SFT-LoRA +0.049 [0.031, 0.071] holds; noise 0.7: -0.016 [-0.052, 0.024] inconclusive; no judge,
  accuracy +0.045 [0.002, 0.090] inconclusive; faithfulness +0.027 [-0.027, 0.086] inconclusive;
  positive control 0.576 -> 0.595, +0.019 [-0.050, 0.062] inconclusive (seeds: +0.045, -0.050, +0.062).
  The control still does not hold, so test_control is a strict expected failure: the negatives and
  inconclusives at noise 0.7 are no evidence against the paper until the control holds.
"""
import pytest

import rlcourse
from rlcourse.claims import decide
from rlcourse.methods import epm_rl as E

pytestmark = pytest.mark.claims


@pytest.fixture(scope="module")
def result():
    return E.run_experiment(rlcourse.profile())


# A known failure, recorded rather than hidden: strict, so the day the control holds this test fails
# (XPASS) and the marker and this docstring must be updated with the chapter's new run.
@pytest.mark.xfail(strict=True, reason="book runs of 2 and 3 Dec 2026: label-only RL did not lift the weak "
                   "adapter beyond the 0.02 margin over 3 seeds (+0.028 and +0.019, intervals below 0 at the low end)")
def test_control(result):
    V = E.verdicts(result)
    assert V["control"].verdict == "holds", V["control"].sentence()


def test_rates(result):
    for rs in result["runs"].values():
        for r in rs:
            for name, d in r.items():
                if isinstance(d, dict):
                    assert 0.0 <= d["accuracy"] <= 1.0 and 0.0 <= d["faithful"] <= 1.0, name


def test_verdicts_follow_the_rule(result):
    for v in E.verdicts(result).values():
        assert v.verdict == decide(v.claim.kind, v.claim.margin, v.low, v.high, v.seeds)
