"""The advantages chapter's claims, in the book profile (slow: `make claims`).

The accuracy race (RACE_STEPS = 200 steps, learning rate 2e-4 decayed linearly to zero over them; see the
chapter's note on tuning) over P.seeds seeds: the chapter states, from the claim objects, that every
estimator lifts held-out greedy accuracy by more than 20 points over the base model; this test asserts
those positive controls are "holds". An earlier version ran 300 steps and reported GRPO's 90% (the
settings' tuning target) as a measurement; the race decides only its controls, so it was shortened,
and the target went with the steps that reached it. Before the cut, two pilots chose the step count:
100 steps on seeds 0-1 lifted by 0.19-0.24, and 150 steps on seeds 10-11 lifted GRPO by 0.25 and 0.23.
The gradient-noise measurement must rank its positive control (rewards shifted by +1, no baseline) below
every baseline estimator, or it could not have shown a baseline's effect. A one-seed book-profile
measurement made while writing gave SNRs of 0.067 (control), 0.242 (REINFORCE), 0.193 (batch-mean
baseline), 0.147 (RLOO), 0.149 (GRPO), 0.147 (Dr. GRPO): RLOO below REINFORCE, as exercise 3's cross term
allows. The length-bias claim had only a one-seed pilot (wrong answers 6.31 vs 6.20 tokens late in
training, grpo vs dapo); its margin is now 0.5 token, fixed before the 3-seed run.

Book run of 6 Dec 2026 (code f37f59b, 5 seeds, Student-t intervals on the paired differences;
`scripts/execute_book.py --only book/advantages` in the book profile, 915 s on one thread; race at 300 steps): every
estimator lifts accuracy (GRPO +0.329 [0.291, 0.367], REINFORCE +0.356 [0.320, 0.392], RLOO +0.330
[0.296, 0.363]); the SNR control holds (REINFORCE over the shifted control +0.714 [0.488, 0.941]); the
paper's RLOO-over-REINFORCE SNR claim does not hold (-0.123 [-0.214, -0.033], p = 0.99): RLOO's SNR is
below REINFORCE's, as in the one-seed pilot; and the length-bias claim does not hold: GRPO's loss
lengthens late wrong answers by +0.195 tokens [0.020, 0.370], above zero but below the 0.5-token margin
fixed before the run. Those two verdicts are pinned here as computed. The same chapter at 300 steps on
another machine (7 Dec 2026, e424ecb, `make book` from a fresh clone) gave the same race effects to the
digit. At 200 steps (beb197c, same day and machine) the race gave GRPO +0.290 [0.248, 0.332],
REINFORCE +0.298 [0.253, 0.343] and RLOO +0.279 [0.261, 0.297]: all hold; the other verdicts unchanged.
"""
import numpy as np
import pytest

import rlcourse
from rlcourse.experiments import gradient_snr, snr_control_verdict, snr_verdict
from rlcourse.studies.advantages import length_bias_verdict, race_verdicts, run_advantage_race, run_length_bias
from rlcourse.profiles import one_torch_thread


@pytest.mark.claims
def test_race_every_estimator_lifts_accuracy():
    race = run_advantage_race(rlcourse.profile("book"))
    v = race_verdicts(race)
    assert sorted(v) == ["grpo-lifts", "reinforce-lifts", "rloo-lifts"]
    for key in v:
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
    # the control as a claim: REINFORCE's SNR above the shifted control's, over the seeds
    assert snr_control_verdict(runs).verdict == "holds", snr_control_verdict(runs).sentence()
    # the paper's claim, RLOO's leave-one-out baseline raising the SNR over REINFORCE: the book run of
    # 6 Dec 2026 computed "does not hold" (-0.123 [-0.214, -0.033] at 5 seeds), pinned here
    v = snr_verdict(runs)
    assert v.verdict == "does not hold", v.sentence()


def late_wrong_lengths(runs: dict, loss_type: str) -> list[np.ndarray]:
    """Per seed, the mean lengths of the wrong answers over the last quarter of the steps (the
    window of :func:`rlcourse.studies.advantages.length_bias_verdict`), NaN where a step had none."""
    return [runs[s][loss_type][-max(1, len(runs[s][loss_type]) // 4):, 0] for s in sorted(runs)]


@pytest.mark.claims
def test_length_bias_claim_is_measured_and_holds():
    P = rlcourse.profile("book")
    lb = run_length_bias(P)
    assert sorted(lb["runs"]) == list(range(P.seeds))
    for lt in ("grpo", "dapo"):
        # the metric is a length: every seed has wrong answers late in training (else it is the 0.0 fallback)
        tails = late_wrong_lengths(lb["runs"], lt)
        assert all(np.isfinite(t).any() for t in tails), (lt, tails)
        assert all(np.nanmean(t) >= 1 for t in tails), (lt, tails)  # an answer has at least one token
    v = length_bias_verdict(lb)
    # the paper's claim: seq-mean-token-mean lengthens wrong answers by more than the 0.5-token margin;
    # the book run of 6 Dec 2026 computed +0.195 [0.020, 0.370]: "does not hold", pinned here
    assert v.claim.margin == 0.5
    assert v.verdict == "does not hold", v.sentence()
    assert v.seeds == P.seeds and v.method_values != v.baseline_values, v.sentence()
