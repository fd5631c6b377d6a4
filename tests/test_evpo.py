"""EVPO (arXiv:2604.19485): the Kalman family of baselines, the EV boundary and the gate."""
import copy

import numpy as np
import pytest
import torch

import rlcourse
import rlcourse.methods.evpo  # noqa: F401  (registers "evpo")
from rlcourse.advantages import compute_gae_advantage_return, compute_grpo_outcome_advantage, get_estimator
from rlcourse.methods.evpo import (ev_out_of_sample, evpo_advantage, explained_variance_batch, kalman_gain,
                                   kalman_variance, reward_to_go, run_evpo_bandit)


def test_registered():
    assert get_estimator("evpo") is evpo_advantage


def test_ev_is_positive_exactly_when_the_optimal_gain_exceeds_one_half():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(4, 64))
        R = torch.tensor(rng.binomial(1, rng.uniform(0.1, 0.9), n), dtype=torch.float64)
        if R.var() == 0:
            R[0] = 1 - R[0]
        V = R * rng.uniform(-1, 1) + torch.tensor(rng.normal(0, rng.uniform(0.01, 1.5), n))
        ev, k = explained_variance_batch(R, V), kalman_gain(R, V)
        # EV = (2 K* - 1) Var(V) / Var(R): the critic's end of the parabola is lower iff K* > 1/2
        assert ev == pytest.approx((2 * k - 1) * float(V.var(unbiased=False)) / float(R.var(unbiased=False)),
                                   abs=1e-12)
        assert (ev > 0) == (k > 0.5)


def test_one_batch_ev_predicts_a_fresh_batch_away_from_the_boundary():
    sigmas = np.array([0.0, 0.1, 0.15, 0.35, 0.45, 0.6])
    out = ev_out_of_sample(sigmas, trials=100, seed=1)
    s_star = out["sigma_star"]
    assert s_star == pytest.approx(0.9 / np.sqrt(12), rel=0.02)  # sd of m spread evenly on [0.05, 0.95]
    # well away from the population boundary the decision made on one batch holds on the next
    assert (out["agree"] >= 0.9).all(), out["agree"]
    assert (out["use_critic"][sigmas < 0.7 * s_star] > 0.9).all()
    assert (out["use_critic"][sigmas > 1.3 * s_star] < 0.1).all()
    with pytest.raises(ValueError, match="sigmas"):
        ev_out_of_sample([[0.1]])


def test_verdicts_from_a_synthetic_grid():
    from rlcourse.studies.evpo import ARMS, CLAIMS, KEYS, arm_name, evpo_verdicts, run_cell
    from rlcourse.studies.runner import Results, Study
    seeds, steps = 6, 60
    better = {"informative": "ppo", "noise": "grpo"}
    study = Study(name="evpo", arms=ARMS, seeds=tuple(range(seeds)), run=run_cell, sizes={"steps": steps})
    rng = np.random.default_rng(0)
    metrics = {}
    for critic in ("informative", "noise"):
        for m in ("ppo", "grpo", "evpo"):
            base = 0.8 + (0.02 if m == better[critic] else 0.0) + (0.03 if m == "evpo" else 0.0)
            for s in range(seeds):  # the gate opens between steps 18 and 23, a little differently on every seed
                cell = {k: [0.0] * steps for k in KEYS}
                cell["reward"] = [base + 0.001 * rng.standard_normal()] * steps
                cell["use_critic"] = [float(t >= 18 + s) for t in range(steps)]
                metrics[(arm_name(critic, m), s)] = cell
    v = evpo_verdicts(Results(study=study, metrics=metrics, seconds={c: 1.0 for c in metrics}, cpu={}))
    assert v["informative"].verdict == "holds" and v["informative"].extra["better_arm"] == "ppo"
    assert v["noise"].verdict == "holds" and v["noise"].extra["better_arm"] == "grpo"
    assert v["gate"].verdict == "holds" and v["gate"].claim is CLAIMS["gate"]


def test_study_cells_do_not_depend_on_the_grid_or_its_order():
    """A cell run by the runner (on its own, in the grid, cached and read back) gives the numbers of the
    same (arm, seed) run directly: each cell seeds its own generator."""
    from rlcourse.studies.evpo import evpo_study, run_cell, run_evpo_experiment
    from rlcourse.studies.runner import Study, run_study
    P = rlcourse.profile("smoke")
    study = evpo_study(P)
    small = Study(name="evpo", arms=study.arms[::-1], seeds=(1, 0), run=run_cell, sizes=dict(study.sizes, steps=6))
    res = run_study(small, jobs=1, cache=False)
    for arm, seed in [("noise evpo", 1), ("informative ppo", 0)]:
        direct = run_cell(arm, seed, dict(small.sizes))
        assert res.metrics[(arm, seed)] == direct
        log = run_evpo_bandit(arm.split()[1], arm.split()[0], seed=seed, **small.sizes)
        assert np.array_equal(np.asarray(direct["ev"], dtype=float), log["ev"], equal_nan=True)
    out = run_evpo_experiment(P, cache=False)
    assert out["runs"][("informative", "evpo")]["reward"].shape == (len(study.seeds), study.sizes["steps"])
    assert out["config"]["seeds"] == len(study.seeds) and out["seconds"] > 0
    with pytest.raises(ValueError, match="informative ppo"):
        run_cell("informative a2c", 0, dict(small.sizes))


def test_kalman_variance_is_the_quadratic_and_gain_is_its_argmin():
    rng = np.random.default_rng(1)
    R = torch.tensor(rng.binomial(1, 0.4, 200), dtype=torch.float64)
    V = 0.3 * R + torch.tensor(rng.normal(0, 0.4, 200))
    Ks = torch.linspace(-1, 2, 30001, dtype=torch.float64)
    var = kalman_variance(R, V, Ks)
    r, v = R - R.mean(), V - V.mean()
    quad = (r * r).mean() - 2 * Ks * (r * v).mean() + Ks**2 * (v * v).mean()
    assert torch.allclose(var, quad, atol=1e-12)
    k_star = kalman_gain(R, V)
    assert abs(float(Ks[var.argmin()]) - k_star) < 2e-4
    # the two ends: K=0 is the mean baseline, K=1 the critic
    assert float(kalman_variance(R, V, 0.0)) == pytest.approx(float(R.var(unbiased=False)))
    assert float(kalman_variance(R, V, 1.0)) == pytest.approx(float((R - V).var(unbiased=False)))


def test_signal_noise_form_by_monte_carlo():
    rng = np.random.default_rng(2)
    n = 200_000
    m = rng.uniform(0.05, 0.95, n)  # E[R | s]
    R = rng.binomial(1, m).astype(float)
    for sigma in (0.1, 0.2, 0.35):
        V = m + rng.normal(0, sigma, n)
        ev = explained_variance_batch(torch.tensor(R), torch.tensor(V))
        predicted = (m.var() - sigma**2) / R.var()
        assert ev == pytest.approx(predicted, abs=0.015)
        assert (ev > 0) == (sigma**2 < m.var())


def test_brief_instance_noisy_critic_on_constant_prompt():
    rng = np.random.default_rng(3)
    R = rng.binomial(1, 0.3, 200_000).astype(float)
    V = 0.3 + rng.normal(0, 0.6, R.size)
    ev = explained_variance_batch(torch.tensor(R), torch.tensor(V))
    assert ev == pytest.approx(-0.36 / 0.21, abs=0.05)  # population value -1.714
    assert np.var(R - V) > np.var(R - R.mean())


def test_group_mean_is_scaled_leave_one_out():
    rng = np.random.default_rng(4)
    G = 4
    R = torch.tensor(rng.binomial(1, 0.5, 40), dtype=torch.float64)
    g = R.reshape(-1, G)
    loo = ((g.sum(1, keepdim=True) - g) / (G - 1)).reshape(-1)
    mean = g.mean(1).repeat_interleave(G)
    assert torch.allclose(R - mean, (G - 1) / G * (R - loo))


def _batch(values, rewards, G=4):
    B = len(rewards)
    mask = torch.ones(B, 3)
    mask[::2, 2] = 0  # ragged responses
    tlr = torch.zeros(B, 3)
    last = mask.sum(1).long() - 1
    tlr[torch.arange(B), last] = rewards
    vals = values[:, None].expand(B, 3).clone() * mask
    return tlr, mask, torch.arange(B // G).repeat_interleave(G), vals


def test_gate_picks_critic_for_perfect_critic_and_mean_for_noise():
    rng = np.random.default_rng(5)
    m = torch.tensor(np.repeat(rng.uniform(0.05, 0.95, 64), 4), dtype=torch.float32)
    R = torch.bernoulli(m, generator=torch.Generator().manual_seed(0))
    tlr, mask, index, vals = _batch(m, R)
    state = {}
    adv, ret = evpo_advantage(tlr, mask, index, vals, state=state, step=1)
    assert state["evpo"]["use_critic"] and state["evpo"]["ev"] > 0
    gae_adv, gae_ret = compute_gae_advantage_return(tlr, vals, mask)
    assert torch.allclose(adv, gae_adv) and torch.allclose(ret, gae_ret)
    noise = torch.tensor(rng.normal(0.5, 1.0, len(R)), dtype=torch.float32)
    tlr, mask, index, vals = _batch(noise, R)
    adv, ret = evpo_advantage(tlr, mask, index, vals, state=state, step=2)
    assert not state["evpo"]["use_critic"] and state["evpo"]["ev"] < 0
    grpo, _ = compute_grpo_outcome_advantage(tlr, mask, index)
    assert torch.allclose(adv, grpo)
    # the critic still gets its targets in the mean branch
    assert torch.allclose(ret, compute_gae_advantage_return(tlr, vals, mask)[1])
    assert [h[2] for h in state["evpo_history"]] == [True, False]


def test_constant_rewards_fall_back_to_mean_branch_and_ema():
    tlr, mask, index, vals = _batch(torch.rand(8), torch.ones(8))
    state = {}
    adv, _ = evpo_advantage(tlr, mask, index, vals, state=state, step=1)
    assert np.isnan(state["evpo"]["ev"]) and not state["evpo"]["use_critic"]
    assert torch.all(adv == 0)
    # with an EMA, one good batch after a bad one is not enough to switch
    R = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0])
    st = {"evpo": {"ev_used": -1.0}}
    tlr, mask, index, vals = _batch(R.clone(), R)
    evpo_advantage(tlr, mask, index, vals, state=st, step=2, ev_ema=0.9)
    assert st["evpo"]["ev"] == pytest.approx(1.0) and st["evpo"]["ev_used"] == pytest.approx(-0.8)
    assert not st["evpo"]["use_critic"]


def test_reward_to_go_and_errors():
    r = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    m = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    out = reward_to_go(r, m, gamma=0.5)
    assert torch.allclose(out, torch.tensor([[1 + 0.5 * 3, 0, 3, 0]]))
    tlr, mask, index, vals = _batch(torch.rand(8), torch.rand(8))
    with pytest.raises(ValueError, match="critic"):
        evpo_advantage(tlr, mask, index, None)
    with pytest.raises(ValueError, match="shape"):
        evpo_advantage(tlr, mask, index, vals[:, :2])
    with pytest.raises(ValueError, match="zero variance"):
        explained_variance_batch(torch.ones(5), torch.rand(5))
    with pytest.raises(ValueError, match="1-D"):
        kalman_gain(torch.rand(2, 3), torch.rand(2, 3))
    with pytest.raises(ValueError, match="ev_ema"):
        evpo_advantage(tlr, mask, index, vals, ev_ema=1.0)
    with pytest.raises(ValueError, match="method"):
        run_evpo_bandit("a2c", "noise")


def test_bandit_run_is_deterministic_and_logs():
    a = run_evpo_bandit("evpo", "informative", seed=3, steps=5)
    b = run_evpo_bandit("evpo", "informative", seed=3, steps=5)
    for k in a:
        assert np.array_equal(a[k], b[k], equal_nan=True)
    assert a["reward"].shape == (5,)
    # adv_var is the variance of whichever baseline the gate chose
    chosen = np.where(a["use_critic"] == 1, a["var_critic"], a["var_mean"])
    assert np.allclose(a["adv_var"], chosen)


def test_trainer_runs_evpo_with_a_critic():
    from rlcourse.lm import build_model, build_tokenizer
    from rlcourse.train import RLConfig, Trainer
    tok = build_tokenizer()
    model = build_model(tok, rlcourse.profile("smoke"), seed=0)
    cfg = RLConfig(num_generations=4, prompts_per_step=3, max_completion_length=6, steps=2, progress=False,
                   train_pool_size=50, eval_prompts=8, advantage_estimator="evpo")
    tr = Trainer(copy.deepcopy(model), tok, "sort", cfg)
    assert tr.value_model is not None
    tr.train()
    assert len(tr.state["evpo_history"]) == 2
