"""The Poly-EPO chapter's claims, in the book profile (slow: `pytest -m claims`).

The same experiment functions, with the same arguments, as book/poly_epo.md: the multi-strategy
bandit (`run_bandit_experiment`, decided by `bandit_verdicts`) and the tiny-LM run on countdown
(`run_lm_experiment`, `lm_verdicts`), at the profile's defaults.

What is asserted follows from the claims, not from a run's numbers:
- the bandit can show the effect: its positive control (set RL with f = max r, which pays for
  coverage directly) beats GRPO at pass@16 (its verdict holds);
- the abstract's claims on the bandit (higher pass@k for k >= 4, more strategies kept, better on the
  held-out prompts only minority strategies solve) point the claimed way: Poly-EPO's mean is above
  GRPO's for each (the chapter's text is written for any verdict, so verdicts themselves are only
  checked to be consistent with their intervals);
- GRPO collapses: its mean mass on the dominant strategy ends above 0.9 (the mechanism the chapter
  describes);
- the LM verdicts are computed over P.seeds paired seeds and are consistent with their intervals.

An earlier version of this experiment (verdicts on percentile-bootstrap intervals). A book run of the
bandit (5 seeds, 150 steps, under a load average near 13 on the 2 cores, 36 s)
gave pass@(1, 2, 4, 8, 16): GRPO 0.593 0.611 0.621 0.640 0.674 (dominant mass 0.96-0.98, 1-2
strategies above 1%), additive bonus 0.513 0.664 0.780 0.856 0.909, set-max 0.494 0.704 0.867 0.944
0.972, Poly-EPO 0.454 0.667 0.849 0.953 0.991 (6 strategies in every seed); held-out minority pass@1
0.01 for GRPO against 0.16-0.25 for Poly-EPO; the initial policy's pass@16 was 0.976.

The tiny LM (3 seeds, 30 steps, 48 held-out prompts x 16 samples; 812 s under a load average above
20) gave pass@8 0.592 (Poly-EPO) against 0.585 (GRPO), inconclusive ([-0.017, 0.038]); distinct
correct strategies per prompt 1.02 against 0.99, inconclusive; the control (GRPO's pass@1 0.139 above
the base model's 0.124) holds ([0.003, 0.026]).

The bandit on Student-t intervals, with the pass@k claims gated on the set-max control (5 Dec 2026, book
profile, 2 s): the same per-seed numbers; pass@4 +0.227 [0.199, 0.255], pass@16 +0.314 [0.269, 0.358],
strategies +4.4 [3.72, 5.08], held-out minority +0.179 [0.137, 0.221], control +0.295 [0.246, 0.344]:
all hold, as before. The LM part has not been re-run.
"""
import numpy as np
import pytest

import rlcourse
from rlcourse.claims import decide
from rlcourse.studies import poly_epo as study


@pytest.fixture(scope="module")
def P():
    return rlcourse.profile("book")


def _consistent(v):
    """The verdict is the one the claim's decision rule gives for its seed differences (or
    'uninformative', when the control it rests on did not hold)."""
    base = v.baseline_values if v.baseline_values is not None else v.claim.reference
    want = decide(v.claim.kind, v.claim.margin, np.asarray(v.method_values) - np.asarray(base))
    return v.verdict == want or (v.verdict == "uninformative" and v.control_verdict != "holds")


@pytest.mark.claims
def test_bandit_claims(P):
    out = study.run_bandit_experiment(P)
    v = study.bandit_verdicts(out)
    assert out["seeds"] == P.toy_seeds
    assert v["control"].verdict == "holds", v["control"].sentence()
    assert v["pass16"].claim.control == v["control"].claim.key
    for key in ("pass4", "pass16", "modes", "held"):
        assert v[key].method_mean > v[key].baseline_mean, v[key].sentence()
        assert _consistent(v[key]), v[key].sentence()
    assert out["dominant"]["GRPO"].mean() > 0.9


@pytest.mark.claims
def test_lm_claims(P):
    out = study.run_lm_experiment(P)
    v = study.lm_verdicts(out)
    assert out["seeds"] == P.seeds >= 3
    for key, verdict in v.items():
        assert verdict.seeds == P.seeds and _consistent(verdict), (key, verdict.sentence())
    assert np.isfinite(out["base"]["pass"]).all()
