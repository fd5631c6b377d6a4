"""BaNEL's claims in the book profile: the same experiment functions the chapter calls.

The thresholds follow from the claims: BaNEL finds more successful attacks than the attacker's own
samples and than the count bonus with GRPO under the same budget of reward evaluations (margin 0),
and the positive control (the true failure set as the region) finds more than the attacker's own
samples; on the exact toy BaNEL finds more of the two rare successes than prior samples.

An earlier version of this experiment (verdicts on percentile-bootstrap intervals, not gated on the
control). A book run of the same functions (3 seeds, 192 evaluations per arm, 2 Dec 2026, on a shared,
loaded machine: 364 s for the attack; the whole chapter then executed in the book profile in 225 s
(load ~5; an earlier book execution under load ~20 hit the 900 s cell limit
) gave: base rate 0.0165 on 2000 attacker samples (every
two-digit and leading-zero query breaks the target, no one-digit query does); distinct successes
found: attacker samples 2, 7, 3; count bonus + GRPO (lr 1e-3) 0, 40, 0 (two seeds collapsed to
malformed queries); BaNEL 64, 51, 39; oracle region (control) 177, 184, 178. Verdicts: BaNEL vs
attacker +47.3 [36.0, 62.0], holds; BaNEL vs count bonus +38.0 [11.0, 64.0], holds; final sampler
rate minus 10 x the attacker's +0.604 [0.344, 0.828], holds (BaNEL's final rates 0.91, 0.66, 0.88);
control +175.7 [175.0, 177.0], holds; sign-flip p = 0.25 for each (3 seeds).
The same per-seed values decided on 95% t-intervals (re-evaluated, not re-run): BaNEL vs attacker +47.3
[14.3, 80.4], holds; BaNEL vs count bonus +38.0 [-27.9, 103.9], inconclusive (the count-bonus seeds
0, 40, 0 spread too far for 3 seeds); control +175.7 [172.8, 178.5], holds. The current version (the
three comparisons gated on the control), in the fresh-clone `make book JOBS=2` of 6 Dec 2026 (5 seeds,
95% t-intervals): control +175.4 [174.3, 176.5] holds; BaNEL vs attacker +45.2 [31.9, 58.5] holds; BaNEL vs
count bonus +33.2 [5.2, 61.2] holds; final rate minus 10 x the attacker's +0.564 [0.318, 0.810] holds.
The attack test pins these.
"""
import numpy as np
import pytest

import rlcourse
from rlcourse.studies import banel as S

pytestmark = pytest.mark.claims


def test_toy_banel_finds_more_rare_successes_than_the_prior():
    P = rlcourse.profile()
    toy = S.toy_experiment(P.toy_seeds)
    final = {m: c[:, -1] for m, c in toy["curves"].items()}
    assert final["oracle"].mean() == 2.0
    assert final["banel"].mean() > final["random"].mean()


def test_attack_claims_direction():
    out = S.attack_experiment(rlcourse.profile())
    runs = out["runs"]
    found = {arm: np.mean([r["distinct"] for r in rs]) for arm, rs in runs.items()}
    assert found["oracle"] > found["random"], found  # the control: the budget can find successes
    assert found["banel"] > found["random"], found
    assert found["banel"] > found["novelty"], found
    assert out["verdicts"]["control"].verdict != "does not hold"
    v = out["verdicts"]
    for name in ("vs_random", "vs_novelty", "final_rate"):
        assert v[name].claim.control == v["control"].claim.key
        assert (v[name].verdict == "uninformative") == (not v["control"].holds), name
        assert v[name].verdict == "holds", v[name].sentence()
    assert v["control"].verdict == "holds", v["control"].sentence()
