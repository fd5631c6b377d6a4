"""GIPO: the effective weight's maximum, on-policy consistency, the loss's gradient against its
closed form, and the exact bias/variance of the weighted importance-sampling gradient."""
import numpy as np
import pytest
import torch

from rlcourse.losses import POLICY_LOSSES, compute_pg_loss
from rlcourse.methods.gipo import AUTHORS, compute_gipo_loss, compute_sapo_loss, effective_weight, \
    gaussian_trust_weight, is_gradient_moments, ppo_effective_weight, sapo_effective_weight, train_stale_bandit, \
    BanditConfig
from rlcourse.studies.gipo import dominated_share, frontier, random_instance


@pytest.mark.parametrize("sigma", [0.3, 0.7, 1.0, 1.5])
def test_effective_weight_peaks_at_exp_sigma_squared(sigma):
    rho = np.exp(np.linspace(-8, 8, 400_001))
    f = effective_weight(rho, sigma)
    assert rho[f.argmax()] == pytest.approx(np.exp(sigma**2), rel=1e-3)
    assert f.max() == pytest.approx(np.exp(sigma**2 / 2), rel=1e-9)
    assert (f > 0).all()


def test_weight_is_one_with_zero_slope_on_policy():
    lr = torch.tensor([0.0], dtype=torch.float64, requires_grad=True)
    w = gaussian_trust_weight(lr, 0.8)
    (g,) = torch.autograd.grad(w.sum(), lr)
    assert w.item() == 1.0 and g.item() == 0.0
    with pytest.raises(ValueError, match="sigma"):
        gaussian_trust_weight(lr, 0.0)


def _grad_wrt_logits(loss_fn, logits, old_logits, actions, adv, **kw):
    logits = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(logits, -1).gather(1, actions[:, None])
    old = torch.log_softmax(old_logits, -1).gather(1, actions[:, None])
    loss, _ = loss_fn(old_log_prob=old, log_prob=logp, advantages=adv[:, None], response_mask=torch.ones_like(adv[:, None]), **kw)
    (g,) = torch.autograd.grad(loss, logits)
    return g


def test_gipo_gradient_matches_closed_form():
    torch.manual_seed(0)
    N, K, sigma = 7, 5, 0.9
    logits, old_logits = torch.randn(N, K, dtype=torch.float64), torch.randn(N, K, dtype=torch.float64)
    actions, adv = torch.randint(0, K, (N,)), torch.randn(N, dtype=torch.float64)
    g = _grad_wrt_logits(compute_gipo_loss, logits, old_logits, actions, adv, sigma=sigma, sigma_neg=None)
    pi = torch.softmax(logits, -1)
    rho = (pi.gather(1, actions[:, None]) / torch.softmax(old_logits, -1).gather(1, actions[:, None])).squeeze(1)
    f = torch.as_tensor(effective_weight(rho.numpy(), sigma))
    expected = -(f * adv)[:, None] * (torch.nn.functional.one_hot(actions, K) - pi) / N  # token-mean over N
    torch.testing.assert_close(g, expected, rtol=1e-9, atol=1e-12)


def test_asymmetric_width_damps_negative_advantages_more():
    torch.manual_seed(1)
    N, K = 6, 4
    logits, old_logits = torch.randn(N, K, dtype=torch.float64), torch.randn(N, K, dtype=torch.float64)
    actions = torch.randint(0, K, (N,))
    neg = -torch.ones(N, dtype=torch.float64)
    g_sym = _grad_wrt_logits(compute_gipo_loss, logits, old_logits, actions, neg, sigma=1.0, sigma_neg=None)
    g_asym = _grad_wrt_logits(compute_gipo_loss, logits, old_logits, actions, neg, sigma=1.0, sigma_neg=0.5)
    assert g_asym.norm() < g_sym.norm()


def test_on_policy_gipo_equals_the_policy_gradient():
    torch.manual_seed(2)
    logits = torch.randn(9, 6, dtype=torch.float64)
    actions, adv = torch.randint(0, 6, (9,)), torch.randn(9, dtype=torch.float64)
    g_gipo = _grad_wrt_logits(compute_gipo_loss, logits, logits, actions, adv, sigma=0.5, sigma_neg=0.5)
    g_pg = _grad_wrt_logits(compute_pg_loss, logits, logits, actions, adv)
    torch.testing.assert_close(g_gipo, g_pg, rtol=0, atol=1e-15)


def test_registered_and_bad_sigma():
    assert POLICY_LOSSES.get("gipo") is compute_gipo_loss
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="sigma"):
        compute_gipo_loss(x, x, x, torch.ones(2, 3), sigma=-1.0)


def test_unclipped_estimator_is_unbiased_and_moments_match_monte_carlo():
    rng = np.random.default_rng(3)
    pi, mu, r = random_instance(rng, K=5, shift=1.0)
    bias, var = is_gradient_moments(pi, mu, r, lambda rho, s: rho)
    assert bias < 1e-20
    # Monte Carlo of the GIPO estimator's mean and variance
    sigma = 0.6
    b_exact, v_exact = is_gradient_moments(pi, mu, r, lambda rho, s: effective_weight(rho, sigma))
    adv = r - pi @ r
    score = np.eye(5) - pi
    draws = rng.choice(5, size=400_000, p=mu)
    est = (effective_weight(pi[draws] / mu[draws], sigma) * adv[draws])[:, None] * score[draws]
    target = (pi * adv) @ score
    assert ((est.mean(0) - target) ** 2).sum() == pytest.approx(b_exact, rel=0.05, abs=1e-6)
    assert ((est - est.mean(0)) ** 2).sum(1).mean() == pytest.approx(v_exact, rel=0.02)


def test_ppo_weight_and_dominance_share():
    w = ppo_effective_weight(np.array([0.5, 1.1, 1.5, 0.7]), np.array([1, 1, 1, -1]), 0.2)
    np.testing.assert_allclose(w, [0.5, 1.1, 0.0, 0.0])
    pts = {"gipo": np.array([[0.0, 1.0]]), "ppo": np.array([[0.1, 2.0], [0.0, 0.5]])}
    assert dominated_share(pts) == 0.5
    pi, mu, r = random_instance(np.random.default_rng(0))
    out = frontier(pi, mu, r, [0.5, 1.0], [0.2])
    assert out["gipo"].shape == (2, 2) and out["ppo"].shape == (1, 2)


def test_stale_bandit_runs_and_learns_on_policy():
    cfg = BanditConfig(contexts=4, actions=4, steps=40, epochs=2, lr=2.0, actor_every=1, kl_coef=0.0,
                       reuse_scale=False)
    out = train_stale_bandit("gipo", 0, cfg, seed=0, sigma=1.0, sigma_neg=0.5)
    assert out["reward"].shape == (40,) and out["reward"][-5:].mean() > out["reward"][0] + 0.2


def test_sapo_gradient_is_its_effective_weight_and_pg_on_policy():
    torch.manual_seed(0)
    old = torch.randn(3, 5, dtype=torch.float64)
    logp = (old + 0.8 * torch.randn(3, 5, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(3, 5, dtype=torch.float64)
    mask = torch.ones_like(adv)
    loss, m = compute_sapo_loss(old, logp, adv, mask, loss_agg_mode="token-mean")
    (g,) = torch.autograd.grad(loss, logp)
    rho = torch.exp(logp.detach() - old).numpy()
    f = sapo_effective_weight(rho, np.sign(adv.numpy()), 1.0, 2.0)
    # d/d logp of -(4/tau) sigmoid(tau (rho - 1)) A / N is -f(rho) A / N
    np.testing.assert_allclose(g.numpy(), -f * adv.numpy() / adv.numel(), rtol=1e-10, atol=1e-12)
    assert 0.0 <= m["pg_clipfrac"] <= 1.0
    # on-policy the gate's slope is 1: the gradient is the policy gradient, for either sign of A
    lp = old.clone().requires_grad_(True)
    (g1,) = torch.autograd.grad(compute_sapo_loss(old, lp, adv, mask)[0], lp)
    lp2 = old.clone().requires_grad_(True)
    (g2,) = torch.autograd.grad(compute_pg_loss(old, lp2, adv, mask)[0], lp2)
    torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-15)
    assert sapo_effective_weight(1.0, 1.0) == pytest.approx(1.0) and sapo_effective_weight(1.0, -1.0) == 1.0
    assert (sapo_effective_weight(np.exp(np.linspace(-5, 5, 101)), 1.0) > 0).all()
    with pytest.raises(ValueError, match="tau"):
        compute_sapo_loss(old, lp, adv, mask, tau_neg=0.0)
    assert "sapo" in POLICY_LOSSES


def test_authors_protocol_one_policy_step_per_batch_and_equal_on_fresh_data():
    """In the authors' protocol the one policy step of a batch is taken at ratio 1, so on fresh data the
    hard clip, GIPO, SAPO and the unclipped surrogate give the same run; on stale data they differ."""
    assert (AUTHORS.epochs, AUTHORS.actor_every, AUTHORS.kl_coef, AUTHORS.reuse_scale) == (10, 10, 0.1, True)
    cfg = BanditConfig(contexts=4, actions=6, steps=15, lr=8.0)
    runs = {name: train_stale_bandit(loss, 0, cfg, seed=3, **kw) for name, (loss, kw) in
            {"pg": ("pg", {}), "ppo": ("vanilla", {}), "gipo": ("gipo", {}), "sapo": ("sapo", {})}.items()}
    for name in ("ppo", "gipo", "sapo"):
        np.testing.assert_allclose(runs[name]["reward"], runs["pg"]["reward"], rtol=1e-6)
    stale = {name: train_stale_bandit(loss, 4, cfg, seed=3) for name, loss in (("pg", "pg"), ("ppo", "vanilla"))}
    assert not np.allclose(stale["pg"]["reward"], stale["ppo"]["reward"])
    # the KL term has zero gradient on fresh data (behaviour = current) and changes a stale run
    no_kl = BanditConfig(contexts=4, actions=6, steps=15, lr=8.0, kl_coef=0.0)
    np.testing.assert_allclose(train_stale_bandit("pg", 0, no_kl, seed=3)["reward"], runs["pg"]["reward"], rtol=1e-6)
    assert not np.allclose(train_stale_bandit("pg", 4, no_kl, seed=3)["reward"], stale["pg"]["reward"])
    with pytest.raises(ValueError, match="actor_every"):
        BanditConfig(actor_every=0)
