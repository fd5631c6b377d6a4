"""EPM-RL claims in the book profile: the experiment function the chapter calls.

Asserted, with thresholds from the claims, not from a run: the positive control holds (GRPO with the
label reward alone lifts a weak LoRA adapter's balanced accuracy by more than 0.02), every measured rate
lies in [0, 1], and every verdict follows the decision rule. The paper's claim (RL over PEFT-only at each
noise level) and the judge ablation can come out either way; their verdicts are evaluated, not asserted.

Book run: not yet recorded in this file (see the chapter's book run in the session report).
"""
import pytest

import rlcourse
from rlcourse.claims import decide
from rlcourse.methods import epm_rl as E

pytestmark = pytest.mark.claims


@pytest.fixture(scope="module")
def result():
    return E.run_experiment(rlcourse.profile())


def test_control_and_rates(result):
    V = E.verdicts(result)
    assert V["control"].verdict == "holds", V["control"].sentence()
    for rs in result["runs"].values():
        for r in rs:
            for name, d in r.items():
                if isinstance(d, dict):
                    assert 0.0 <= d["accuracy"] <= 1.0 and 0.0 <= d["faithful"] <= 1.0, name


def test_verdicts_follow_the_rule(result):
    for v in E.verdicts(result).values():
        assert v.verdict == decide(v.claim.kind, v.claim.margin, v.low, v.high, v.seeds)
