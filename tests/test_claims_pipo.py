"""The PIPO chapter's claims, in the book profile (slow: `pytest -m claims`).

The same experiment functions, with the same arguments, as book/pipo.md: the GRPO learning-rate sweep
(`run_lr_sweep`), the bandit experiment (`run_bandit_experiment`, decided by `bandit_verdicts`) and the
tiny-LM run (`run_lm_experiment`, `lm_verdicts`), at the profile's defaults.

What is asserted follows from the claims and the chapter's reading, not from a run's numbers:
- the testbed can show a benefit of the closed loop: the positive control (PIPO with an exact, oracle
  improvement signal) ends above GRPO at learning rate 2 (its verdict holds);
- the high-learning-rate setting is one where a larger step hurts GRPO (the sweep's final reward at
  the largest rate is below its best), which is what the chapter says it chose it for;
- every PIPO verdict is computed over P.toy_seeds paired seeds, and none of the paper's claims comes
  out *against* PIPO where the chapter would have to say so in other words than it does: the
  chapter's text is written for any verdict, so only the verdicts' consistency with their numbers is
  asserted for them (a "holds" for a greater-claim has a positive interval, and so on).

The book run of the chapter (5 seeds) gave, at learning rate 2: PIPO 0.729 against GRPO 0.665 (holds,
interval [0.039, 0.089]), twice GRPO's learning rate 0.767, the oracle control 0.791 (holds, [0.098,
0.155]); at learning rate 96: PIPO 0.717 against GRPO 0.643 (inconclusive, [-0.020, 0.169]), twice
the rate 0.475; all three drawdown verdicts, the oracle's included, inconclusive; GRPO's sweep 0.665,
0.832, 0.844, 0.643 at rates 2, 8, 32, 96. The tiny LM (3 seeds, 30 steps): PIPO 0.443 against GRPO
0.490, "does not hold" ([-0.102, 0.000]); its control, PIPO with a clean verdict, 0.508 (holds, [0.008,
0.039]); all three below the base model's 0.547. This file passed in the book profile. A review's book run of
the chapter (after the sampler's measurements moved to batch.metrics) gave the same numbers, in 843 s
under a load of about 4.4 on the 2 cores (three jobs at once; the sweep 205 s, the bandit 256 s, the LM
274 s).
"""
import numpy as np
import pytest

import rlcourse
from rlcourse.methods import pipo


@pytest.fixture(scope="module")
def P():
    return rlcourse.profile("book")


@pytest.fixture(scope="module")
def bandit(P):
    out = pipo.run_bandit_experiment(P)
    return out, pipo.bandit_verdicts(out)


def _consistent(v):
    c = v.claim
    if v.verdict == "holds":
        return v.low > c.margin if c.kind == "greater" else v.high < -c.margin
    if v.verdict == "does not hold":
        return v.high <= c.margin if c.kind == "greater" else v.low >= -c.margin
    return True


@pytest.mark.claims
def test_positive_control_and_verdicts(P, bandit):
    out, v = bandit
    assert out["seeds"] == P.toy_seeds and set(out["settings"]) == set(pipo.SETTINGS)
    assert v["control/final"].verdict == "holds", v["control/final"].sentence()
    for key, verdict in v.items():
        assert verdict.seeds == P.toy_seeds and _consistent(verdict), (key, verdict.sentence())
    for key in out["final"]:
        assert np.isfinite(out["final"][key]).all() and (out["drawdown"][key] >= 0).all()


@pytest.mark.claims
def test_high_rate_hurts_grpo(P):
    sweep = pipo.run_lr_sweep(P)
    means = {lr: sweep["final"][lr].mean() for lr in sweep["lrs"]}
    assert pipo.SETTINGS["noisy, high lr"]["lr"] == max(sweep["lrs"])
    assert means[max(sweep["lrs"])] < max(means.values()), means


@pytest.mark.claims
def test_lm_parts_train_the_tiny_model(P):
    lm = pipo.run_lm_experiment(P)
    for v in pipo.lm_verdicts(lm).values():
        assert v.seeds == P.seeds and _consistent(v), v.sentence()
    assert lm["layback_frac"]["GRPO+PIPO"].mean() > 0.5 and (lm["layback_frac"]["GRPO"] == 0).all()
    assert lm["layback_frac"]["GRPO+PIPO (oracle verdict)"].mean() > 0.5
    assert lm["true_reward"]["GRPO+PIPO"].shape == (P.seeds, lm["steps"])
