"""Claims of the generative chapters, run in the book profile (slow; `pytest -m claims`).

Each test calls the chapter's experiment and the chapter's verdict function (the same claim objects) and
asserts the verdicts. A comment and its assert say the same thing; thresholds come from the claims
(rlcourse.studies.paretoslider.CLAIMS, rlcourse.generative.fdfo.CLAIMS), never from the last run.
"""
import numpy as np
import pytest

import rlcourse


@pytest.mark.claims
def test_paretoslider_one_conditioned_model_matches_the_fixed_models():
    from rlcourse.studies.paretoslider import paretoslider_verdicts, run_paretoslider_experiment

    prof = rlcourse.profile("book")
    res = run_paretoslider_experiment(prof)
    assert res["seeds"] == prof.toy_seeds >= 5
    v = paretoslider_verdicts(res)
    # the paper's claim, per model: the conditioned model's hypervolume is above 0.97 of the five fixed
    # models' over the seeds' interval ("matches or exceeds")
    assert v["matches"].verdict == "holds", v["matches"].sentence()
    # ... and so at equal total reward calls, where each fixed model trains a fifth as long
    assert res["fixed_eq_reward_calls"] == res["cond_reward_calls"]
    assert v["equal-calls"].verdict == "holds", v["equal-calls"].sentence()
    # late scalarisation beats early scalarisation when the rewards' scales differ (paired by seed)
    assert v["late-vs-early"].verdict == "holds", v["late-vs-early"].sentence()
    # each objective moves monotonically with its weight, in every seed
    assert (res["spearman_J1"] > 0.95).all() and (res["spearman_J2"] < -0.95).all()
    # digits: the slider moves both classifier probabilities in the right direction
    d = res["digits_cond_J"]
    assert d[-1, 0] > d[0, 0] and d[-1, 1] < d[0, 1]
    assert np.isfinite(res["digits_hv_cond"])


@pytest.mark.claims
def test_fdfo_faster_on_digits_and_not_in_2d():
    """5 Dec 2026, the study with settings chosen on tuning seeds 100-101 and verdicts on the 5 reported
    seeds, Student-t intervals (660 s wall on a heavily loaded machine, 89 CPU seconds): digits +0.071
    [-0.004, 0.146], p = 0.03, inconclusive (before both changes it held on the bootstrap interval);
    ring -0.606 [-0.809, -0.403], does not hold."""
    from rlcourse.generative.fdfo import fdfo_verdicts, run_fdfo_experiment

    prof = rlcourse.profile("book")
    res = run_fdfo_experiment(prof)
    assert res["seeds"] == prof.toy_seeds >= 5
    v = fdfo_verdicts(res)
    # the paper's claim on 64-dim digits: FDFO's reward curve lies above the per-step policy gradient's
    # (area under the curve over the same reward-call budget, paired by seed); at 5 seeds the t-interval
    # may not clear 0, but it must not lie wholly below it
    assert v["digits"].verdict != "does not hold", v["digits"].sentence()
    # in 2-D the chapter's computed verdict: the per-step policy gradient's curve lies above FDFO's, so
    # the claim does not hold there ...
    assert v["ring"].verdict == "does not hold", v["ring"].sentence()
    # ... although FDFO does learn (the control of that negative verdict: it raises the reward, and on
    # digits the same code and protocol give "holds")
    assert res["ring"]["fdfo"]["final"] > res["ring"]["base_reward"]
    d = res["digits"]
    assert d["fdfo"]["final"] > d["base_reward"] + 0.5
    # and on digits FDFO's samples stay closer to the real digits than the policy gradient's
    best_fd = d["fdfo"]["curves"][d["fdfo"]["best"]]
    best_pg = d["pg"]["curves"][d["pg"]["best"]]
    assert best_fd[:, -1, 1].mean() < best_pg[:, -1, 1].mean()
