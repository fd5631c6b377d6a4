"""PIPO: the telescoping identity, the layback coefficients on a hand example, the gate, the
preconditioned-ascent identity by Monte Carlo, both window modes, the loss's two parts and their
normalisation, the one-step fold against the paper's two steps, and the registered parts in the
Trainer (cached rows, scores not re-drawn, exact resume)."""
import copy

import numpy as np
import pytest
import torch

import rlcourse
from rlcourse.losses import POLICY_LOSSES, compute_policy_loss
from rlcourse.methods.pipo import (PipoController, compute_pipo_loss, layback_coefficients, layback_scale,
                                   progress_signal, step_window, telescoping_improvement)
from rlcourse.studies.pipo import BanditConfig, max_drawdown, train_bandit
from rlcourse.rollout import SAMPLERS


def test_telescoping_identity():
    J = np.random.default_rng(0).normal(size=50).cumsum()
    s = telescoping_improvement(J)
    np.testing.assert_allclose(s, J - J[0], atol=1e-12)
    with pytest.raises(ValueError):
        telescoping_improvement(np.zeros((2, 2)))


def test_layback_coefficients_hand_example():
    # two groups of n = 4; group 0: Abar = (1, -1, 0.5, -0.5), sum |A| = 3; group 1: (2, 0, 0, -2), sum 4
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, 0.0, -2.0])
    index = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    xi = 0.6
    C = layback_coefficients(adv, index, xi, eps=0.0)
    expected = torch.tensor([4 / 3, -4 / 3, 2 / 3, -2 / 3, 2.0, 0.0, 0.0, -2.0], dtype=torch.float64) * xi
    torch.testing.assert_close(C, expected)
    # the sign of C_i is that of Abar_i * xi
    C_neg = layback_coefficients(adv, index, -2.0, eps=0.0)
    assert (torch.sign(C_neg) == torch.sign(-adv.double())).all()
    # the clip at +-10
    assert layback_coefficients(adv, index, 1e3).abs().max() == 10.0
    with pytest.raises(ValueError, match="shape"):
        layback_coefficients(adv, index[:3], xi)


def test_gate_skips_negative_progress_with_s_neg_zero():
    assert layback_scale(-0.1, -1.0, s_neg=0.0) == 0.0
    assert layback_scale(-0.1, -1.0, s_neg=0.1) == 0.1
    assert layback_scale(0.0, 0.0, s_neg=0.0) == 1.0
    assert layback_scale(0.2, 0.05, s_neg=0.1, threshold=0.1) == 0.0  # the dead zone
    with pytest.raises(ValueError):
        layback_scale(0.1, 0.1, s_neg=-1.0)
    # and in the bandit: with s_neg = 0 no step after a drop has a layback term
    out = train_bandit("pipo", BanditConfig(steps=40, flip=0.2), seed=0, s_neg=0.0)
    assert ((out["xi"] < 0) & (out["scale"] > 0)).sum() == 0 and (out["scale"] > 0).any()


def test_preconditioned_ascent_monte_carlo():
    """E[(g . grad J) g] = E[g g^T] grad J, so its inner product with grad J is >= 0."""
    rng = np.random.default_rng(1)
    d, n = 5, 400_000
    H = -np.diag(rng.uniform(0.5, 2.0, d))  # a concave quadratic J(x) = 0.5 x^T H x + b^T x
    b, x = rng.normal(size=d), rng.normal(size=d)
    grad = H @ x + b
    L = rng.normal(size=(d, d)) / np.sqrt(d)
    m = 0.3 * rng.normal(size=d)
    g = m + rng.normal(size=(n, d)) @ L.T  # random update directions, E[g g^T] = L L^T + m m^T
    est = ((g @ grad)[:, None] * g).mean(0)
    exact = (L @ L.T + np.outer(m, m)) @ grad
    se = ((g @ grad)[:, None] * g).std(0) / np.sqrt(n)
    assert np.all(np.abs(est - exact) < 5 * se)
    assert est @ grad > 0 and exact @ grad > 0


def test_window_modes():
    K, c, mu = 8, 0.5, 0.9
    strict_hist = [c] * K
    anchor, new = step_window(strict_hist, mu, K, "strict")
    assert anchor == [c] * K and new == [c] * (K - 1) + [mu]
    assert progress_signal(mu, anchor)["delta"] == pytest.approx(mu - c)
    anchor_r, new_r = step_window(strict_hist, mu, K, "released")
    assert anchor_r == [c] * (K - 1) + [mu] and new_r == [c] * (K - 2) + [mu, mu]
    # the released anchor holds mu_t itself: Delta shrinks by (K - 1) / K
    assert progress_signal(mu, anchor_r)["delta"] == pytest.approx((mu - c) * (K - 1) / K)
    # warm-up: strict is ready after K steps of history, released after K / 2 (two entries a step)
    for mode, first in (("strict", K + 1), ("released", K // 2 + 1)):
        ctl, hist, ready = PipoController(window=K, window_mode=mode), [], []
        for t in range(1, 2 * K):
            sig, hist = ctl.step(hist, 0.1 * t)
            ready.append(sig["ready"])
        assert ready.index(True) + 1 == first, (mode, ready)
    with pytest.raises(ValueError, match="window_mode"):
        step_window([], 0.0, K, "other")
    # sigma: population std, replaced by 1 when (almost) zero
    assert progress_signal(1.0, [0.5, 0.5])["sigma"] == 1.0
    assert progress_signal(1.0, [0.0, 1.0])["sigma"] == pytest.approx(0.5)
    assert progress_signal(100.0, [0.0, 1.0])["delta"] == 5.0


def _rows(B=6, T=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64)
    new = (old + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).clone()
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[1, 3:] = 0
    mask[4, 2:] = 0
    return old, new, adv, mask


def _extras(mask, cached_rows, coef):
    B, T = mask.shape
    cached = torch.zeros(B, T, dtype=torch.float64)
    cached[cached_rows] = 1
    part = cached[:, 0] > 0
    tokens, seqs = torch.zeros(B, T, dtype=torch.float64), torch.zeros(B, T, dtype=torch.float64)
    for p in (part, ~part):
        tokens[p] = mask[p].sum()
        seqs[p] = float(p.sum())
    return dict(pipo_coef=coef[:, None] * mask * cached, pipo_phi=1 - cached, pipo_cached=cached,
                pipo_tokens=tokens, pipo_seqs=seqs)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_loss_parts_and_their_normalisation(mode):
    old, new, adv, mask = _rows()
    coef = torch.tensor([0.0, 0.0, 0.0, 1.5, -0.7, 2.0], dtype=torch.float64)
    ex = _extras(mask, [3, 4, 5], coef)
    glob = dict(global_tokens=float(mask.sum()), global_seqs=6.0)
    loss, m = compute_pipo_loss(old, new, adv, mask, loss_agg_mode=mode, **glob, **ex)
    fresh = mask.clone()
    fresh[3:] = 0
    base, _ = compute_policy_loss(old[:3], new[:3], adv[:3], mask[:3], loss_agg_mode=mode)
    ratio = torch.exp(new - old)
    lb_tok = -torch.minimum(ratio, ratio.clamp(0.8, 1.2)) * coef[:, None]
    from rlcourse.losses import agg_loss
    lb = agg_loss(lb_tok[3:], mask[3:], mode)
    torch.testing.assert_close(loss, base + lb)
    assert m["pipo_cached_frac"] == 0.5
    # micro-batches: the sum of the parts' losses is the full-batch loss
    parts = sum(compute_pipo_loss(old[r], new[r], adv[r], mask[r], loss_agg_mode=mode, **glob,
                                  **{k: v[r] for k, v in ex.items()})[0] for r in ([0, 3], [1, 4, 5], [2]))
    torch.testing.assert_close(parts, loss)
    # without extras the loss is the base loss; with only some of them it is an error
    alone, _ = compute_pipo_loss(old, new, adv, mask, loss_agg_mode=mode, **glob)
    torch.testing.assert_close(alone, compute_policy_loss(old, new, adv, mask, loss_agg_mode=mode, **glob)[0])
    with pytest.raises(ValueError, match="extras"):
        compute_pipo_loss(old, new, adv, mask, pipo_coef=ex["pipo_coef"])


def test_layback_gradient_reapplies_the_previous_signal():
    """On-policy (r = 1), the layback term's gradient is -mean_t(C_i grad log pi): the policy gradient of
    the cached rows with advantages C_i."""
    old, _, adv, mask = _rows(seed=3)
    new = old.clone().requires_grad_(True)
    coef = torch.tensor([0.5, -1.0, 2.0, 0.3, -0.2, 1.0], dtype=torch.float64)
    ex = _extras(mask, [0, 1, 2, 3, 4, 5], coef)
    loss, _ = compute_pipo_loss(old, new, adv, mask, global_tokens=float(mask.sum()), global_seqs=6.0, **ex)
    g, = torch.autograd.grad(loss, new)
    torch.testing.assert_close(g, -coef[:, None] * mask / mask.sum())


def test_fold_is_first_order_equal_to_two_steps():
    """One step on the sum of both terms against the paper's two steps: their difference after the
    same updates shrinks like lr^2 (halving lr divides it by about 4)."""
    diffs = []
    for lr in (0.2, 0.1, 0.05):
        cfg = BanditConfig(steps=12, lr=lr, flip=0.2)
        a = train_bandit("pipo", cfg, seed=1, window=2, fold=True)["J"]
        b = train_bandit("pipo", cfg, seed=1, window=2, fold=False)["J"]
        diffs.append(np.abs(a - b).max())
    assert diffs[0] > 0
    ratios = diffs[0] / diffs[1], diffs[1] / diffs[2]
    assert all(3.0 < r < 5.0 for r in ratios), (diffs, ratios)


def test_max_drawdown_and_bandit_learns():
    assert max_drawdown(np.array([0.0, 1.0, 0.5, 0.8]), smooth=1) == 0.5
    assert max_drawdown(np.arange(10.0), smooth=3) == 0.0
    out = train_bandit("grpo", BanditConfig(steps=60, flip=0.0, lr=8.0), seed=0)
    assert out["J"][-10:].mean() > out["J"][0] + 0.1 and (out["scale"] == 0).all()


def _trainer(model, tok, steps, **kw):
    from rlcourse.methods.noisy import make_noisy_reward
    from rlcourse.train import RLConfig, Trainer

    cfg = RLConfig(num_generations=4, prompts_per_step=2, max_completion_length=6, steps=steps, progress=False,
                   sampler="pipo", policy_loss="pipo", sampler_kwargs=dict(window=2), seed=3,
                   reward=make_noisy_reward(0.2, 0.2, seed=0), **kw)
    return Trainer(copy.deepcopy(model), tok, "addition", cfg)


@pytest.fixture(scope="module")
def smoke_model():
    from rlcourse.lm.zoo import load_base_model
    return load_base_model("addition", prof=rlcourse.profile("smoke"), progress=False)


def test_registered_parts_in_the_trainer(smoke_model, tmp_path):
    model, tok = smoke_model
    assert SAMPLERS.get("pipo") is not None and POLICY_LOSSES.get("pipo") is compute_pipo_loss
    tr = _trainer(model, tok, 5, micro_batch_size=3)
    tr.train()
    h = tr.history  # the sampler's batch.metrics, logged with each step
    assert [m["pipo_ready"] for m in h] == [0, 0, 1, 1, 1]
    assert [m["pipo_cached_frac"] > 0 for m in h] == [m["pipo_layback"] == 1 for m in h]
    assert set(tr.state["pipo"]) == {"history", "cache"}
    # the loop's reward averages over the cached rows too; pipo_fresh_reward is the fresh rows' mean,
    # the noisy verifier's observed mean of the step (it is called once a step, on the fresh rows)
    np.testing.assert_allclose([m["pipo_fresh_reward"] for m in h], tr.state["noisy_verifier"]["observed_reward"],
                               atol=1e-6)
    np.testing.assert_allclose([m["pipo_mu"] for m in h], [m["pipo_fresh_reward"] for m in h])
    assert all(m["reward"] == m["pipo_fresh_reward"] for m in h if not m["pipo_layback"])
    # the noisy reward is drawn once a step, for the fresh rows only
    assert tr.state["noisy_verifier"]["calls"] == 5
    # exact resume: 2 steps, a checkpoint, 3 more, against 5 straight
    a = _trainer(model, tok, 5, output_dir=str(tmp_path / "a"), save_every=2)
    a.train(steps=2)
    b = _trainer(model, tok, 5, output_dir=str(tmp_path / "a"), save_every=2)
    b.__init__(b.model, tok, "addition", b.config, resume=True)
    b.train()
    ref = _trainer(model, tok, 5)
    ref.train()
    for p, q in zip(b.model.parameters(), ref.model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    keys = ("pipo_mu", "pipo_xi", "pipo_scale", "pipo_layback", "pipo_fresh_reward")
    assert [[m[k] for k in keys] for m in b.history] == [[m[k] for k in keys] for m in ref.history]
    assert b.state["pipo"]["history"] == ref.state["pipo"]["history"]


def test_sampler_with_another_loss_appends_nothing(smoke_model):
    model, tok = smoke_model
    from rlcourse.methods.noisy import make_noisy_reward
    from rlcourse.train import RLConfig, Trainer

    cfg = RLConfig(num_generations=4, prompts_per_step=2, max_completion_length=6, steps=4, progress=False,
                   sampler="pipo", sampler_kwargs=dict(window=2), reward=make_noisy_reward(0.2, 0.2, seed=0))
    tr = Trainer(copy.deepcopy(model), tok, "addition", cfg)
    with pytest.warns(UserWarning, match="no layback"):
        tr.train()
    assert not any(m["pipo_layback"] for m in tr.history) and all("pipo_cached_frac" not in m for m in tr.history)
    with pytest.raises(ValueError, match="window_mode"):
        PipoController(window_mode="twice")


def test_verdict_reward_sets_mu(smoke_model):
    """With ``verdict_reward="task"`` the window sees the clean reward of the fresh rows (the oracle
    control), while the advantages keep the noisy scores."""
    model, tok = smoke_model
    tr = _trainer(model, tok, 3)
    tr.config.sampler_kwargs["verdict_reward"] = "task"
    tr.train()
    noisy = tr.state["noisy_verifier"]
    np.testing.assert_allclose([m["pipo_mu"] for m in tr.history], noisy["true_reward"], atol=1e-6)


def _json(metrics):
    import json

    return json.loads(json.dumps(metrics))


def test_bandit_study_cell_alone_equals_the_grid_and_bad_arms_are_named():
    from rlcourse.studies import run_study
    from rlcourse.studies.pipo import bandit_study, lr_study, run_bandit_cell

    study = bandit_study(rlcourse.profile("smoke"), seeds=2)
    res = run_study(study, jobs=1, cache=False)
    arm, seed = study.cells()[-1]  # a later cell: the last arm of the high-lr setting on seed 1
    assert seed == 1 and arm.startswith("noisy, high lr | ")
    assert res.metrics[(arm, seed)] == _json(run_bandit_cell(arm, seed, study.sizes))
    assert set(res.verdicts()) == {"noisy/final", "noisy/drawdown", "noisy-high-lr/final", "noisy-high-lr/drawdown",
                                   "noisy/final-equal-step", "control/final", "control/drawdown"}
    with pytest.raises(ValueError, match="noisy \\| GRPO"):
        run_bandit_cell("no such arm", 0, study.sizes)
    with pytest.raises(ValueError, match="lr=2.0"):
        run_bandit_cell("noisy | GRPO", 0, lr_study(rlcourse.profile("smoke")).sizes)


def test_lm_study_cell_alone_equals_the_grid_and_bad_arms_are_named():
    from rlcourse.studies import run_study
    from rlcourse.studies.pipo import BASE, lm_base_study, lm_study, run_lm_base_cell, run_lm_cell

    study = lm_study(rlcourse.profile("smoke"), seeds=2, steps=2)
    res = run_study(study, jobs=1, cache=False)
    arm, seed = study.cells()[-1]  # a later cell: PIPO with the oracle verdict on seed 1
    assert res.metrics[(arm, seed)] == _json(run_lm_cell(arm, seed, study.sizes))
    base = lm_base_study(rlcourse.profile("smoke"), steps=2)
    assert 0.0 <= run_lm_base_cell(BASE, 0, base.sizes)["base_acc"] <= 1.0
    with pytest.raises(ValueError, match="GRPO\\+PIPO"):
        run_lm_cell("no such arm", 0, study.sizes)
    with pytest.raises(ValueError, match="base model"):
        run_lm_base_cell("GRPO", 0, base.sizes)
