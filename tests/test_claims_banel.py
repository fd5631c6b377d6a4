"""BaNEL's claims in the book profile: the same experiment functions the chapter calls.

The thresholds follow from the claims: BaNEL finds more successful attacks than the attacker's own
samples and than the count bonus with GRPO under the same budget of reward evaluations (margin 0),
and the positive control (the true failure set as the region) finds more than the attacker's own
samples; on the exact toy BaNEL finds more of the two rare successes than prior samples.

A book run of the same functions (3 seeds, 192 evaluations per arm, 2 Dec 2026, on a shared machine
under heavy load; the chapter's own book execution hit the 900 s cell limit there) gave: base rate
0.0165 on 2000 attacker samples (every two-digit and leading-zero query breaks the target, no
one-digit query does); distinct successes found, attacker samples 2, 7, 3; count bonus + GRPO
(lr 1e-3) 0, 40, 0 (two seeds collapsed to malformed queries); BaNEL 64 on seed 0 (final sampler
success rate 0.91 against the attacker's 0.008 on that seed; 160 s per BaNEL seed); the remaining
seeds and the oracle control had not finished when this was written.
"""
import numpy as np
import pytest

import rlcourse
from rlcourse.methods import banel as B

pytestmark = pytest.mark.claims


def test_toy_banel_finds_more_rare_successes_than_the_prior():
    P = rlcourse.profile()
    toy = B.toy_experiment(P.toy_seeds)
    final = {m: c[:, -1] for m, c in toy["curves"].items()}
    assert final["oracle"].mean() == 2.0
    assert final["banel"].mean() > final["random"].mean()


def test_attack_claims_direction():
    out = B.attack_experiment(rlcourse.profile())
    runs = out["runs"]
    found = {arm: np.mean([r["distinct"] for r in rs]) for arm, rs in runs.items()}
    assert found["oracle"] > found["random"], found  # the control: the budget can find successes
    assert found["banel"] > found["random"], found
    assert found["banel"] > found["novelty"], found
    assert out["verdicts"]["control"].verdict != "does not hold"
