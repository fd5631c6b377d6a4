import math

import pytest
import torch

from rlcourse.losses import (agg_denominators, agg_loss, bradley_terry_loss, compute_pg_loss, compute_policy_loss,
                             compute_value_loss, get_policy_loss, kl_penalty)



@pytest.fixture(autouse=True)
def float64():
    """These checks compare against closed forms in double precision; restore the default after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def categorical(seed=0, V=6):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(V, generator=g, dtype=torch.float64).requires_grad_()
    ref = torch.log_softmax(torch.randn(V, generator=g, dtype=torch.float64), -1)
    return theta, ref


def test_kl_estimators_monte_carlo_against_exact_kl():
    theta, ref = categorical()
    logp = torch.log_softmax(theta, -1).detach()
    exact = float((logp.exp() * (logp - ref)).sum())
    g = torch.Generator().manual_seed(1)
    n = 400_000
    y = torch.multinomial(logp.exp(), n, replacement=True, generator=g)
    est = {k: kl_penalty(logp[y], ref[y], k).mean().item() for k in ("k1", "k2", "k3", "k3+")}
    se = {k: kl_penalty(logp[y], ref[y], k).std().item() / math.sqrt(n) for k in ("k1", "k3")}
    assert abs(est["k1"] - exact) < 4 * se["k1"]
    assert abs(est["k3"] - exact) < 4 * se["k3"]
    # k3+ is straight-through: k3's value, k2's gradient (not k3's)
    lp = logp[y[:1000]].clone().requires_grad_(True)
    g_plus, = torch.autograd.grad(kl_penalty(lp, ref[y[:1000]], "k3+").sum(), lp)
    g_k2, = torch.autograd.grad(kl_penalty(lp, ref[y[:1000]], "k2").sum(), lp)
    g_k3, = torch.autograd.grad(kl_penalty(lp, ref[y[:1000]], "k3").sum(), lp)
    assert torch.allclose(g_plus, g_k2) and not torch.allclose(g_plus, g_k3)
    assert torch.allclose(kl_penalty(lp, ref[y[:1000]], "k3+"), kl_penalty(lp, ref[y[:1000]], "k3"))
    # k2 is biased: its exact expectation is not the KL
    k2_exact = float((logp.exp() * 0.5 * (logp - ref) ** 2).sum())
    assert abs(k2_exact - exact) > 1e-3
    assert est["k2"] == pytest.approx(k2_exact, rel=0.02)
    assert se["k3"] < se["k1"]  # k3's lower variance is why it is the default in losses


def expected_grad(theta, ref, kind):
    """Gradient of E_{y~pi}[k(y)] with the sampling distribution held fixed, as a loss does."""
    logp = torch.log_softmax(theta, -1)
    loss = (logp.exp().detach() * kl_penalty(logp, ref, kind)).sum()
    (grad,) = torch.autograd.grad(loss, theta)
    return grad


def test_k2_and_k3plus_gradients_are_the_kl_gradient_k1_k3_are_not():
    theta, ref = categorical(3)
    logp = torch.log_softmax(theta, -1)
    (true,) = torch.autograd.grad((logp.exp() * (logp - ref)).sum(), theta)
    assert torch.allclose(expected_grad(theta, ref, "k2"), true)
    assert torch.allclose(expected_grad(theta, ref, "k3+"), true)
    assert not torch.allclose(expected_grad(theta, ref, "k3"), true, atol=1e-3)
    assert not torch.allclose(expected_grad(theta, ref, "k1"), true, atol=1e-3)
    # k3's expected gradient is that of the *forward* KL(pi_ref || pi)
    (forward,) = torch.autograd.grad((ref.exp() * (ref - torch.log_softmax(theta, -1))).sum(), theta)
    assert torch.allclose(expected_grad(theta, ref, "k3"), forward)


def test_k3plus_pointwise_gradient_equals_k2():
    lp = torch.randn(3, 4).requires_grad_()
    ref = torch.randn(3, 4)
    (g_plus,) = torch.autograd.grad(kl_penalty(lp, ref, "k3+").sum(), lp)
    (g_k2,) = torch.autograd.grad(kl_penalty(lp, ref, "k2").sum(), lp)
    assert torch.allclose(g_plus, g_k2)
    assert torch.allclose(kl_penalty(lp, ref, "k3+"), kl_penalty(lp, ref, "k3"))
    with pytest.raises(ValueError, match="unknown KL estimator 'k9'"):
        kl_penalty(lp, ref, "k9")


MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("mode", MODES)
def test_micro_batch_gradient_invariance(mode):
    torch.manual_seed(0)
    B, T = 8, 7
    w = torch.randn(T, requires_grad=True)
    x = torch.randn(B, T)
    mask = (torch.rand(B, T) > 0.3).double()
    mask[:, 0] = 1

    def loss_of(rows, **kw):
        return agg_loss((x[rows] * w) ** 2, mask[rows], mode, **kw)

    (full,) = torch.autograd.grad(loss_of(slice(0, B)), w)
    den = agg_denominators(mask)
    kw = {"max_len": T, **den} if mode == "seq-mean-token-sum-norm" else den
    total = sum(loss_of(slice(s, s + 3), **kw) for s in range(0, B, 3))
    (micro,) = torch.autograd.grad(total, w)
    assert torch.allclose(full, micro)
    assert torch.allclose(total, loss_of(slice(0, B)))
    if mode == "token-mean":  # local denominators do differ: the bug the global ones prevent
        local = sum(loss_of(slice(s, s + 3)) for s in range(0, B, 3)) / math.ceil(B / 3)
        assert not torch.allclose(local, loss_of(slice(0, B)))


def test_length_bias_of_seq_mean_token_mean():
    """Two sequences, the same per-token loss, lengths 2 and 6: seq-mean-token-mean gives each token of
    the short one 3x the weight; token-mean and the constant normaliser weigh all tokens equally."""
    mask = torch.zeros(2, 6)
    mask[0, :2] = 1
    mask[1, :] = 1
    lm = torch.ones(2, 6, requires_grad=True)
    for mode, ratio in [("seq-mean-token-mean", 3.0), ("token-mean", 1.0), ("seq-mean-token-sum-norm", 1.0),
                        ("seq-mean-token-sum", 1.0)]:
        (g,) = torch.autograd.grad(agg_loss(lm, mask, mode), lm)
        assert g[0, 0] / g[1, 0] == pytest.approx(ratio), mode
    with pytest.raises(ValueError, match="unknown loss aggregation mode"):
        agg_loss(lm, mask, "mean")


def test_ratio_one_gives_reinforce_gradient_and_no_clipping():
    torch.manual_seed(0)
    lp = torch.randn(4, 5).requires_grad_()
    adv = torch.randn(4, 5)
    mask = torch.ones(4, 5)
    loss, m = compute_policy_loss(lp.detach(), lp, adv, mask)
    (g,) = torch.autograd.grad(loss, lp)
    assert torch.allclose(g, -adv / 20)  # d/dlogp of -A*exp(logp - old) at old = logp, token-mean
    assert m["pg_clipfrac"] == 0 and m["ratio_mean"] == pytest.approx(1.0) and m["ppo_kl"] == 0
    (g2,) = torch.autograd.grad(compute_pg_loss(lp.detach(), lp, adv, mask)[0], lp)
    assert torch.allclose(g, g2)
    assert get_policy_loss("vanilla") is compute_policy_loss


def test_clipping_hand_cases():
    old = torch.zeros(1, 4)
    lp = torch.log(torch.tensor([[1.5, 1.5, 0.5, 0.5]])).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    loss, m = compute_policy_loss(old, lp, adv, torch.ones(1, 4), 0.2, 0.2)
    # A>0, r=1.5 -> clipped at 1.2: -1.2 (no grad); A<0, r=1.5 -> max(1.5, 1.2) = 1.5 (grad)
    # A>0, r=0.5 -> max(-0.5, -0.8) = -0.5 (grad); A<0, r=0.5 -> max(0.5, 0.8) = 0.8 (no grad)
    assert loss.item() == pytest.approx((-1.2 + 1.5 - 0.5 + 0.8) / 4)
    (g,) = torch.autograd.grad(loss, lp)
    assert g[0, 0] == 0 and g[0, 3] == 0 and g[0, 1] != 0 and g[0, 2] != 0
    assert m["pg_clipfrac"] == pytest.approx(0.5)
    # dual clip caps a negative-advantage token with a huge ratio at -A*c
    lp2 = torch.log(torch.tensor([[10.0]]))
    l2, m2 = compute_policy_loss(torch.zeros(1, 1), lp2, torch.tensor([[-1.0]]), torch.ones(1, 1), clip_ratio_c=3.0)
    assert l2.item() == pytest.approx(3.0) and m2["pg_clipfrac_lower"] == 1.0
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_policy_loss(old, lp, adv, torch.ones(1, 4), clip_ratio_c=0.5)
    with pytest.raises(ValueError, match="shape mismatch"):
        compute_policy_loss(old, lp, adv[:, :2], torch.ones(1, 4))


def test_value_loss_clipping():
    v = torch.tensor([[1.0, 0.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0]])
    ret = torch.tensor([[2.0, 1.0]])
    loss, clipfrac = compute_value_loss(v, ret, old, torch.ones(1, 2), cliprange_value=0.5)
    # token 0: unclipped (1-2)^2 = 1, clipped (0.5-2)^2 = 2.25 -> 2.25; token 1: both 1
    assert loss.item() == pytest.approx(0.5 * (2.25 + 1) / 2)
    assert clipfrac == pytest.approx(0.5)


def test_bradley_terry_loss_and_gradient():
    rc = torch.tensor([2.0, 0.0], requires_grad=True)
    rr = torch.tensor([1.0, 1.0])
    loss = bradley_terry_loss(rc, rr)
    expected = -(math.log(1 / (1 + math.exp(-1))) + math.log(1 / (1 + math.exp(1)))) / 2
    assert loss.item() == pytest.approx(expected)
    (g,) = torch.autograd.grad(loss, rc)
    eps = 1e-6
    for i in range(2):
        d = torch.zeros(2, dtype=torch.float64)
        d[i] = eps
        fd = (bradley_terry_loss(rc.detach() + d, rr) - bradley_terry_loss(rc.detach() - d, rr)) / (2 * eps)
        assert g[i].item() == pytest.approx(fd.item(), rel=1e-5)
