"""Compute-aligned training's claims in the book profile: the same experiment functions the chapter calls.

The thresholds follow from the claims, not from a run: on the exact bandit (training budget 30,
fixed before the claims' run), pass@8-aligned training ends above standard training at pass@8 (margin 0, the abstract's "improves test time scaling over
standard training"); standard training ends above pass@8-aligned at pass@1 (the trade-off at k = 1); maj@8-aligned against
standard at maj@8 is asserted only to be consistent with claims.decide (the budget sweep of the chapter
shows its sign changing with the budget);
and the positive control, pass@8-aligned training raising pass@8 above its start, must hold. On the
tiny language model the control (standard training raises pass@1 above the base model) must not come
out "does not hold"; the aligned arms' verdicts are recorded, and their direction is asserted only
to be consistent with claims.decide on the measured interval.

Book run: not yet recorded in this docstring (see the commit that adds it).
"""
import numpy as np
import pytest

import rlcourse
from rlcourse.claims import decide
from rlcourse.methods import compute_aligned as C

pytestmark = pytest.mark.claims


def test_bandit_claims_direction():
    P = rlcourse.profile()
    out = C.run_bandit_experiment(P, C.BanditConfig(steps=P.pick(smoke=30, book=150), budget=30.0))
    runs = out["runs"]
    ik, i1, jm = C.PASS_KS.index(8), C.PASS_KS.index(1), C.MAJ_KS.index(8)
    final = lambda arm, key, i: np.mean([r["final"][key][i] for r in runs[arm]])  # noqa: E731
    start = np.mean([r["start"]["pass"][ik] for r in runs["pass@k"]])
    assert final("pass@k", "pass", ik) > start  # the control: the budget moves pass@8
    assert final("pass@k", "pass", ik) > final("standard", "pass", ik)
    assert final("standard", "pass", i1) > final("pass@k", "pass", i1)
    v = C.bandit_verdicts(out)
    assert v["control"].verdict == "holds" and v["pass"].verdict == "holds"
    # maj@8: the chapter's budget sweep shows the sign depends on the budget; only consistency is asserted
    assert v["maj"].verdict == decide("greater", 0.0, v["maj"].low, v["maj"].high, v["maj"].seeds)


def test_lm_claims_consistent():
    out = C.run_lm_experiment(rlcourse.profile())
    v = C.lm_verdicts(out)
    assert v["control"].verdict != "does not hold", v["control"].sentence()
    for verdict in v.values():
        assert verdict.verdict == decide(verdict.claim.kind, verdict.claim.margin, verdict.low, verdict.high,
                                         verdict.seeds)
