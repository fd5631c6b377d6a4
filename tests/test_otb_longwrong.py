"""OTB's oracle bound on the tabular policy and the LongWrongTask testbed (arXiv:2602.07078)."""
import numpy as np
import pytest

import rlcourse
from rlcourse.methods.otb import TabularAR, tabular_gradient_variance, tabular_oracle_nsr
from rlcourse.methods.otb_longwrong import (LongWrongTask, longwrong_advantages, longwrong_gradient, longwrong_nsr,
                                            longwrong_oracle_baseline, longwrong_sample, longwrong_true_gradient,
                                            longwrong_value, run_longwrong)
from rlcourse.studies.otb import CLAIMS, choose_longwrong_lr, otb_verdicts, run_longwrong_experiment


def test_oracle_nsr_orders_and_scales_like_one_over_n():
    env = TabularAR(max_len=4, seed=2)
    o4, o8 = tabular_oracle_nsr(env, 4), tabular_oracle_nsr(env, 8)
    assert o4["optimal"] <= o4["value"] <= o4["none"]
    for k in o4:
        assert o8[k] == pytest.approx(o4[k] / 2)
    with pytest.raises(ValueError, match="group_size"):
        tabular_oracle_nsr(env, 0)


def test_oracle_bound_blocks_n4_matching_n32_on_the_tabular_policy():
    env = TabularAR(max_len=5, seed=0)
    mean32 = tabular_gradient_variance(env, 32, "mean", n_groups=400, seed=1)["nsr"]
    # the best prefix baseline with 4 samples is far noisier than the plain mean with 32
    assert tabular_oracle_nsr(env, 4)["optimal"] > 3 * mean32


def test_longwrong_value_and_gradient_are_exact():
    task = LongWrongTask(n_prompts=3, max_len=5, n_fillers=2)
    theta = task.theta + np.random.default_rng(0).normal(0, 0.3, task.theta.shape)
    J = lambda th: longwrong_value(th)[0].mean()  # noqa: E731
    g = longwrong_true_gradient(theta)
    eps = 1e-6
    for idx in [(0, 0, 0), (1, 2, 3), (2, 4, 1), (0, 1, 2)]:
        d = np.zeros_like(theta)
        d[idx] = eps
        assert g[idx] == pytest.approx((J(theta + d) - J(theta - d)) / (2 * eps), abs=1e-7)
    # the sampler agrees with the exact expected reward
    rng = np.random.default_rng(1)
    s = longwrong_sample(theta, 4000, rng)
    assert s["reward"].reshape(3, -1).mean(1) == pytest.approx(longwrong_value(theta)[0], abs=0.03)
    assert (s["mask"].sum(1) >= 1).all() and (s["sumsq"] > 0).sum() == s["mask"].sum()


def test_oracle_baseline_is_unbiased_and_estimates_are_consistent():
    task = LongWrongTask(n_prompts=2, max_len=6, n_fillers=3)
    theta = task.theta
    true = longwrong_true_gradient(theta)
    rng = np.random.default_rng(2)
    gs = [longwrong_gradient(theta, s, longwrong_advantages(theta, s, 8, "oracle"))
          for s in (longwrong_sample(theta, 8, rng) for _ in range(3000))]
    mean = np.mean(gs, 0)
    assert float(mean.ravel() @ true.ravel()) / np.linalg.norm(mean) / np.linalg.norm(true) > 0.99
    b = longwrong_oracle_baseline(theta)
    assert b.shape == theta.shape[:2] and ((b >= 0) & (b <= 1)).all()
    with pytest.raises(ValueError, match="baseline"):
        longwrong_advantages(theta, longwrong_sample(theta, 2, rng), 2, "median")


def test_otb_lowers_the_noise_where_loud_answers_are_wrong():
    task = LongWrongTask()
    mean4 = longwrong_nsr(task, 4, "mean", n_draws=300, seed=0)["nsr"]
    otb4 = longwrong_nsr(task, 4, "otb", n_draws=300, seed=0)["nsr"]
    assert otb4 < 0.7 * mean4


def test_runs_are_deterministic_and_the_experiment_yields_verdicts():
    task = LongWrongTask()
    for opt, lr in (("sgd", 3.0), ("adam", 0.1)):
        a, b = (run_longwrong(task, "otb", 4, 5, lr, 7, optimizer=opt) for _ in range(2))
        for k in a:
            assert np.array_equal(a[k], b[k])
        assert a["reward"].shape == (6,) and a["grad_norm"].shape == (5,) and a["tokens"][0] == 0
    out = run_longwrong_experiment(rlcourse.profile("smoke"), cache=False)
    v = otb_verdicts(out["results"])
    assert set(v) == set(CLAIMS)
    # one seed: the controls are inconclusive, so the claims resting on them are uninformative
    assert {k: x.verdict for k, x in v.items()} == {"control": "inconclusive", "negative": "inconclusive",
                                                    "tokens-control": "inconclusive", "match": "uninformative",
                                                    "tokens": "uninformative"}
    assert out["choice"]["seeds"][0] == 100 and out["config"]["lr"] in out["choice"]["grid"]
    with pytest.raises(ValueError, match="optimizer"):
        run_longwrong(task, "otb", 4, 2, 0.1, 0, optimizer="rmsprop")


def test_adam_step_does_not_depend_on_a_constant_shrink_of_the_gradient():
    """The reason the experiment uses Adam: the group mean shrinks the expected gradient by (N-1)/N, a
    constant; Adam's step is invariant to a constant factor on every gradient (up to eps), SGD's is not.
    Rescaling the advantages by 3/4 leaves Adam's trajectory unchanged and shortens SGD's first step."""
    import rlcourse.methods.otb_longwrong as lw

    task = LongWrongTask()
    orig = lw.longwrong_advantages
    runs = {}
    for scale in (1.0, 0.75):
        lw.longwrong_advantages = lambda th, s, n, b, c=scale: c * orig(th, s, n, b)
        try:
            runs[scale] = {o: run_longwrong(task, "mean", 4, 6, lr, 3, optimizer=o)["reward"]
                           for o, lr in (("adam", 0.1), ("sgd", 3.0))}
        finally:
            lw.longwrong_advantages = orig
    assert np.allclose(runs[1.0]["adam"], runs[0.75]["adam"], atol=1e-6)
    assert runs[0.75]["sgd"][1] < runs[1.0]["sgd"][1]


def test_the_learning_rate_rule_takes_the_smallest_rate_where_the_oracle_matches():
    task = LongWrongTask()
    c = choose_longwrong_lr(task, steps=40, n_seeds=2, grid=(0.01, 0.1, 0.2), margin=0.02)
    assert c["seeds"] == [100, 101] and c["gaps"].shape == (3,)
    ok = [lr for lr, g in zip(c["grid"], c["gaps"]) if abs(g) <= 0.02]
    assert ok and c["lr"] == ok[0] and abs(c["gaps"][0]) > 0.02  # 0.01 is too slow for the oracle to catch up
    with pytest.raises(ValueError, match="n_seeds"):
        choose_longwrong_lr(task, steps=5, n_seeds=0)


def test_study_cells_do_not_depend_on_the_grid_or_its_order():
    """A cell run by the runner (in a grid of other arms and seeds, in another order) gives the numbers of the
    same (arm, seed) run directly: each cell seeds its own generator."""
    from rlcourse.studies.otb import ARMS, longwrong_study, run_cell
    from rlcourse.studies.runner import Study, run_study
    study = longwrong_study(rlcourse.profile("smoke"), lr=0.1)
    small = Study(name="otb-longwrong", arms=ARMS[::-1], seeds=(2, 0), run=run_cell, sizes=dict(study.sizes, steps=3))
    res = run_study(small, jobs=1, cache=False)
    for arm, seed in [("otb-4", 2), ("sgd mean-4 rescaled", 0)]:
        direct = run_cell(arm, seed, dict(small.sizes))
        assert res.metrics[(arm, seed)] == direct
    adam = run_longwrong(LongWrongTask(), "otb", 4, 8 * 3, 0.1, 2)
    assert res.metrics[("otb-4", 2)]["reward"] == adam["reward"].tolist()
    sgd = run_longwrong(LongWrongTask(), "mean", 4, 3, 3.0 * (31 / 32) / (3 / 4), 0, optimizer="sgd")
    assert res.metrics[("sgd mean-4 rescaled", 0)]["reward"] == sgd["reward"].tolist()
    with pytest.raises(ValueError, match="oracle-4"):
        run_cell("oracle-8", 0, dict(small.sizes))
