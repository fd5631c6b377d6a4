"""The PPO chapter's propositions, checked on the package's losses (fast; no model), and its
epsilon x reuse sweep on a smoke-sized model."""
import math

import numpy as np
import pytest
import torch

from rlcourse.losses import compute_pg_loss, compute_policy_loss, compute_value_loss
from rlcourse.methods.ppo_lab import (ARMS, NO_CLIP, clip_zero_grad_region, monotone_trend, ppo_claims, ppo_config,
                                      run_clip_reuse_sweep, trend_sentence)
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
