"""Compute-aligned training's claims in the book profile: the same experiment functions the chapter calls.

The thresholds follow from the claims, not from a run. On the exact bandit (training budget 30, fixed
before the claims' run): pass@8-aligned training ends above standard training at pass@8 (margin 0,
the abstract's "improves test time scaling over standard training"); standard training ends above
pass@8-aligned at pass@1 (the trade-off at k = 1); the positive control, pass@8-aligned training
raising pass@8 above its start, must hold; maj@8-aligned against standard at maj@8 is asserted only
to be consistent with claims.decide (the chapter's budget sweep shows its sign changing with the
budget). On the tiny language model the control (standard training raises pass@1 above the base
model) must not come out "does not hold"; the aligned arms' verdicts are asserted only to be
consistent with claims.decide on the measured interval.

The verdicts are decided by claims.decide (Student-t interval on the paired per-seed differences);
the LM's pass@k claim is gated on the hard-prompt control (lm_control_verdict): uninformative unless
that control holds. Numbers of an earlier run, under the earlier percentile-bootstrap rule:

Book run, 2 Dec 2026 (both tests passed in 298 s wall, 76 s CPU, load 12-16 on the shared 2-core
machine; the chapter executed in the book profile in 344 s wall, 84 s CPU, load 13-15, and in 62 s at
load about 2 before the one-seed sensitivity run was added). Exact bandit, 5 bandits, budget 30:
pass@8 aligned 0.993 vs standard 0.807, +0.185 [0.182, 0.190], holds; maj@8 aligned 0.676 vs 0.672,
+0.004 [-0.003, 0.010], inconclusive; pass@1 standard 0.589 vs pass@8-aligned 0.502, +0.087
[0.080, 0.093], holds; control pass@8 0.993 vs 0.642 at the start, holds (sign-flip p = 0.0625 for
each, 5 bandits). Budget sweep (aligned minus standard): pass@8 +0.068, +0.132, +0.185, +0.077 and
maj@8 +0.015, +0.021, +0.004, -0.056 at budgets 7.5, 15, 30, 60. Tiny LM (weak addition base, 40 steps
of 8 prompts x 8, k = 4, 3 seeds): pass@16 aligned 0.740 vs RLOO 0.594, +0.146 [0.141, 0.156],
holds; maj@16 0.151 vs 0.141, +0.010 [-0.062, 0.094], inconclusive; control pass@1 0.105 vs base
0.088, +0.018 [0.005, 0.027], holds (p = 0.25, 3 seeds). The one-seed check at 16 prompts per step
reverses the pass@16 sign (RLOO 0.734, aligned 0.719).
"""
import numpy as np
import pytest

import rlcourse
from rlcourse.claims import decide
from rlcourse.methods import compute_aligned as C

pytestmark = pytest.mark.claims


def _consistent(v) -> bool:
    """The verdict is claims.decide's on its own per-seed differences (unless a control gates it)."""
    m = np.asarray(v.method_values, dtype=float)
    d = m - (np.asarray(v.baseline_values, dtype=float) if v.baseline_values is not None else v.claim.reference)
    if v.control_verdict is not None and v.control_verdict != "holds":
        return v.verdict == "uninformative"
    return v.verdict == decide(v.claim.kind, v.claim.margin, d)


def test_bandit_claims_direction():
    P = rlcourse.profile()
    out = C.run_bandit_experiment(P, C.BanditConfig(steps=P.pick(smoke=30, book=150), budget=30.0))
    runs = out["runs"]
    ik, i1 = C.PASS_KS.index(8), C.PASS_KS.index(1)
    final = lambda arm, key, i: np.mean([r["final"][key][i] for r in runs[arm]])  # noqa: E731
    start = np.mean([r["start"]["pass"][ik] for r in runs["pass@k"]])
    assert final("pass@k", "pass", ik) > start  # the control: the budget moves pass@8
    assert final("pass@k", "pass", ik) > final("standard", "pass", ik)
    assert final("standard", "pass", i1) > final("pass@k", "pass", i1)
    v = C.bandit_verdicts(out)
    assert v["control"].verdict == "holds", v["control"].sentence()
    assert v["pass"].verdict == "holds", v["pass"].sentence()  # a mechanism check: close to guaranteed
    # maj@8 (its sign changes with the budget in the chapter's sweep) and the pass@1 trade-off: consistency
    for key in ("maj", "tradeoff"):
        assert _consistent(v[key]), v[key].sentence()


def test_lm_claims_consistent():
    P = rlcourse.profile()
    control = C.lm_control_verdict(C.run_lm_control(P))
    v = C.lm_verdicts(C.run_lm_experiment(P), control=control)
    assert v["control"].verdict != "does not hold", v["control"].sentence()
    assert _consistent(control), control.sentence()
    for verdict in v.values():
        assert _consistent(verdict), verdict.sentence()
