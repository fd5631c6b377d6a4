"""The advantages chapter's claims, in the book profile (slow: `make claims`).

The accuracy race (300 steps, learning rate 2e-4 decayed linearly; see the chapter's note on tuning)
over P.seeds seeds: the chapter states, from the claim objects, that every estimator lifts held-out
greedy accuracy by more than 20 points over the base model and that GRPO ends at or above 90%; this
test asserts those verdicts are "holds". The gradient-noise measurement must rank its positive
control (rewards shifted by +1, no baseline) below every baseline estimator, or it could not have
shown a baseline's effect. A one-seed book-profile measurement made while writing gave SNRs of 0.067
(control), 0.242 (REINFORCE), 0.193 (batch-mean baseline), 0.147 (RLOO), 0.149 (GRPO), 0.147 (Dr.
GRPO): RLOO below REINFORCE, as exercise 3's cross term allows, so the RLOO claim is asserted not to
hold (the 3-seed verdict itself was not run while writing). The length-bias claim had only a one-seed
run (wrong answers 6.31 vs 6.20 tokens late in training, grpo vs dapo), so only a valid verdict is
asserted for it.
"""
import numpy as np
import pytest

import rlcourse
from rlcourse.experiments import (gradient_snr, length_bias_verdict, race_verdicts, run_advantage_race,
                                  run_length_bias, snr_verdict)
from rlcourse.profiles import one_torch_thread

VALID = ("holds", "does not hold", "inconclusive")


@pytest.mark.claims
def test_race_every_estimator_lifts_accuracy_and_grpo_reaches_90_percent():
    v = race_verdicts(run_advantage_race(rlcourse.profile("book")))
    for key in ("reinforce-lifts", "rloo-lifts", "grpo-lifts", "grpo-90"):
        # each holds: every seed clears the claim's margin
        assert v[key].verdict == "holds", v[key].sentence()


@pytest.mark.claims
def test_gradient_snr_control_and_rloo_claim():
    P = rlcourse.profile("book")
    with one_torch_thread():
        runs = [gradient_snr(P, seed=s) for s in range(P.seeds)]
    mean = {e: np.mean([r[e]["snr"] for r in runs]) for e in runs[0] if e != "seconds"}
    # the positive control has the lowest SNR of all estimators
    assert all(mean["reinforce_shifted"] < m for e, m in mean.items() if e != "reinforce_shifted"), mean
    # RLOO's SNR is not above REINFORCE's on this model (the one-seed measurement: 0.147 vs 0.242)
    assert snr_verdict(runs).verdict != "holds", snr_verdict(runs).sentence()


@pytest.mark.claims
def test_length_bias_claim_yields_a_verdict():
    assert length_bias_verdict(run_length_bias(rlcourse.profile("book"))).verdict in VALID
