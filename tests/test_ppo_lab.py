"""The PPO chapter's propositions, checked on the package's losses (fast; no model), and its
epsilon x reuse sweep and study grid on a smoke-sized model."""
import math

import numpy as np
import pytest
import torch

from rlcourse.losses import compute_pg_loss, compute_policy_loss, compute_value_loss
from rlcourse.methods.ppo_lab import (NO_CLIP, adaptive_kl_beta, clip_zero_grad_region, mdp_quantities,
                                      surrogate_objective, trust_region_bound)
from rlcourse.studies.ppo import (ARMS, BASE, choose_ppo_lr, monotone_trend, ppo_claims, ppo_config, ppo_study,
                                  run_cell, run_clip_reuse_sweep, trend_sentence)
from rlcourse.studies.runner import run_study
from rlcourse.profiles import profile


def _random(seed=0, B=32, T=9):
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(B, T, generator=g, dtype=torch.float64) - 2
    logp = (old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    adv[adv.abs() < 0.1] = 0.0
    return old, logp, adv, torch.ones(B, T, dtype=torch.float64)


@pytest.mark.parametrize("c", [None, 3.0])
@pytest.mark.parametrize("eps", [(0.2, 0.2), (0.1, 0.28)])
def test_gradient_vanishes_exactly_in_the_predicted_region(c, eps):
    old, logp, adv, mask = _random()
    B = old.shape[0]
    loss, _ = compute_policy_loss(old, logp, adv, mask, eps[0], eps[1], clip_ratio_c=c, loss_agg_mode="seq-mean-token-sum")
    (grad,) = torch.autograd.grad(loss, logp)
    ratio = torch.exp(logp - old).detach()
    zero = clip_zero_grad_region(ratio, adv, eps[0], eps[1], c)
    assert zero.any() and (~zero).any()
    assert torch.all(grad[zero] == 0)
    assert torch.allclose(grad[~zero], (-adv * ratio / B)[~zero])


def test_first_pass_equals_plain_policy_gradient():
    old, _, adv, mask = _random(1)
    lp = old.clone().requires_grad_(True)
    (g1,) = torch.autograd.grad(compute_policy_loss(old, lp, adv, mask, 0.2, 0.2)[0], lp)
    (g2,) = torch.autograd.grad(compute_pg_loss(old, lp, adv, mask)[0], lp)
    assert torch.equal(g1, g2)


def test_dual_clip_caps_the_loss_of_negative_advantage_tokens():
    args = (torch.zeros(1, 1), torch.full((1, 1), math.log(5.0)), -torch.ones(1, 1), torch.ones(1, 1))
    assert compute_policy_loss(*args, clip_ratio_c=3.0)[0].item() == pytest.approx(3.0)
    assert compute_policy_loss(*args)[0].item() == pytest.approx(5.0)


def test_value_clip_zero_gradient_region():
    g = torch.Generator().manual_seed(2)
    B, T, c = 16, 7, 0.2
    v_old = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = (v_old + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    R = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.float64)
    vf, _ = compute_value_loss(v, R, v_old, mask, cliprange_value=c, loss_agg_mode="seq-mean-token-sum")
    (gv,) = torch.autograd.grad(vf, v)
    vd = v.detach()
    edge = v_old + (vd - v_old).clamp(-c, c)
    zero = ((vd - v_old).abs() > c) & ((edge - R).abs() > (vd - R).abs())
    assert zero.any()
    assert torch.all(gv[zero] == 0)
    assert torch.allclose(gv[~zero], ((vd - R) / B)[~zero])


def test_region_rejects_bad_input():
    with pytest.raises(ValueError, match="shape"):
        clip_zero_grad_region(torch.ones(2), torch.ones(3))
    with pytest.raises(ValueError, match="positive"):
        clip_zero_grad_region(torch.zeros(2), torch.ones(2))


def test_arms_differ_only_in_clip_and_passes():
    P = profile("book")
    cfgs = {name: ppo_config(P, eps, mu) for name, (eps, mu) in ARMS.items()}
    ref = cfgs["clip 0.2, 1 pass"].to_dict()
    for name, cfg in cfgs.items():
        diff = {k for k, v in cfg.to_dict().items() if ref[k] != v}
        assert diff <= {"epsilon", "num_iterations"}, (name, diff)
    assert cfgs["no clip, 4 passes"].epsilon == NO_CLIP
    assert ppo_config(P, 0.2, 1, estimator="gae").advantage_estimator == "gae"
    assert {c.key.split("/")[0] for c in ppo_claims().values()} == {"ppo"}
    claims = ppo_claims()
    assert claims["control"].role == "positive control"
    assert claims["gae"].control == claims["reuse"].control == claims["control"].key
    assert ppo_config(P, 0.2, 4, learning_rate=5e-5).learning_rate == 5e-5
    with pytest.raises(ValueError, match="learning_rate"):
        ppo_config(P, 0.2, 1, learning_rate=0.0)
    with pytest.raises(ValueError, match="overlap"):
        choose_ppo_lr(P, seeds=[2, 10])


def _random_mdp(seed, S=5, A=3, gamma=0.9):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(S), size=(S, A))
    return P, rng.normal(size=(S, A)), gamma, rng.dirichlet(np.ones(S)), rng


def _softmax_rows(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_performance_difference_identity_and_the_trust_region_bound():
    """J(pi') - J(pi) = sum_s d_pi'(s) sum_a pi'(a|s) A_pi(s, a) / (1 - gamma) exactly; the surrogate,
    which uses d_pi instead, agrees with J to first order (the gap over alpha^2 stays bounded as the
    step shrinks) and never exceeds J by more than the TRPO/Kakade-Langford penalty."""
    for seed in range(5):
        P, r, gamma, rho0, rng = _random_mdp(seed)
        z = rng.normal(size=r.shape)
        pi = _softmax_rows(z)
        old = mdp_quantities(P, r, pi, gamma, rho0)
        assert np.allclose(old["d"].sum(), 1) and np.allclose((pi * old["A"]).sum(1), 0)
        direction = rng.normal(size=r.shape)
        ratios = []
        for delta in (1.0, 0.1, 0.01, 0.001):
            pi2 = _softmax_rows(z + delta * direction)
            new = mdp_quantities(P, r, pi2, gamma, rho0)
            pdl = old["J"] + float(new["d"] @ (pi2 * old["A"]).sum(1)) / (1 - gamma)
            assert pdl == pytest.approx(new["J"], abs=1e-10)
            b = trust_region_bound(P, r, pi, pi2, gamma, rho0)
            assert b["J_new"] >= b["bound"] - 1e-12 and b["alpha"] ** 2 <= b["max_kl"] + 1e-12
            assert b["surrogate"] == pytest.approx(surrogate_objective(P, r, pi, pi2, gamma, rho0))
            ratios.append(abs(new["J"] - b["surrogate"]) / b["alpha"] ** 2)
        assert max(ratios[1:]) < 4 * old["A"].__abs__().max() * gamma / (1 - gamma) ** 2
        assert ratios[-1] < 10 * ratios[-2] + 1e-6  # second order: the ratio does not blow up as the step shrinks
    with pytest.raises(ValueError, match="policy"):
        mdp_quantities(P, r, pi[:, :2], gamma, rho0)


def test_adaptive_kl_coefficient_follows_the_papers_rule():
    assert adaptive_kl_beta(1.0, 0.001, 0.01) == 0.5  # KL far below target: weaker penalty
    assert adaptive_kl_beta(1.0, 0.1, 0.01) == 2.0  # far above: stronger
    assert adaptive_kl_beta(1.0, 0.01, 0.01) == 1.0  # within a factor 1.5: unchanged
    with pytest.raises(ValueError, match="beta"):
        adaptive_kl_beta(0.0, 0.01, 0.01)


def test_sweep_returns_one_entry_per_epsilon_and_reuse():
    eps, reuse = (0.1, 0.3), (1, 2, 3)
    sw = run_clip_reuse_sweep(profile("smoke"), epsilons=eps, reuse=reuse, seeds=[0, 1], steps=1)
    assert sw["epsilons"] == eps and sw["reuse"] == reuse and sw["seeds"] == [0, 1] and sw["steps"] == 1
    for key in ("clipfrac", "kl", "final_accuracy"):
        assert sw[key].shape == (3, 2, 2), key
        assert np.isfinite(sw[key]).all(), key
    assert ((sw["clipfrac"] >= 0) & (sw["clipfrac"] <= 1)).all()
    assert ((sw["final_accuracy"] >= 0) & (sw["final_accuracy"] <= 1)).all()
    assert sw["base_accuracy"].shape == (2,)
    # one pass: the ratio is 1 for every token, so nothing is clipped and the KL estimate is ~0
    assert (sw["clipfrac"][0] == 0).all() and np.abs(sw["kl"][0]).max() < 1e-5
    # with one pass epsilon cannot matter: the runs of a seed are the same run
    assert np.array_equal(sw["final_accuracy"][0, 0], sw["final_accuracy"][0, 1])
    with pytest.raises(ValueError, match="reuse"):
        run_clip_reuse_sweep(profile("smoke"), reuse=(0,), seeds=[0], steps=1)


def test_monotone_trend_and_its_sentences():
    up = np.array([[[0.0, 0.1], [0.2, 0.3], [0.4, 0.25]]])  # (1 line, 3 points, 2 seeds)
    t = monotone_trend(up, increasing=True)
    assert t["mean_holds"] and t["seed_pairs"] == 4 and t["seed_breaks"] == 1
    assert "1 of the 4" in trend_sentence(t, "x rises", ["a"], ["p", "q", "r"])
    clean = monotone_trend(up[:, :2], increasing=True)
    assert clean["seed_breaks"] == 0 and trend_sentence(clean, "x rises", ["a"], ["p", "q"]).startswith("As predicted")
    down = monotone_trend(up, increasing=False)
    assert not down["mean_holds"] and down["mean_breaks"] == [(0, 0), (0, 1)]
    assert "contradicts" in trend_sentence(down, "x falls", ["a"], ["p", "q", "r"])
    with pytest.raises(ValueError, match="shape"):
        monotone_trend(np.zeros((2, 1, 3)), True)


TIMING = {"seconds", "time_rollout", "time_reward", "time_reference", "time_update", "sample_seconds", "step_seconds"}


def _untimed(metrics: dict) -> dict:
    return {k: [{j: x for j, x in h.items() if j not in TIMING} for h in v] if k == "history" else v
            for k, v in metrics.items()}


def test_study_cell_alone_equals_the_grid_and_bad_arms_are_named():
    study = ppo_study(profile("smoke"), seeds=[0, 1], steps=1)
    res = run_study(study, jobs=1, cache=False)
    assert study.arms[0] == BASE and set(res.metrics) == set(study.cells())
    arm, seed = study.cells()[-1]  # a later cell: the GAE arm of seed 1
    assert _untimed(res.metrics[(arm, seed)]) == _untimed(run_cell(arm, seed, study.sizes))
    assert res.metrics[(BASE, 1)] == run_cell(BASE, 1, study.sizes)
    with pytest.raises(ValueError, match="clip 0.2, 1 pass"):
        run_cell("no such arm", 0, study.sizes)
