"""OTB (arXiv:2602.07078): the logit-gradient identity, the optimal baseline, the estimator."""
import copy
import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch

import rlcourse
import rlcourse.methods.otb  # noqa: F401  (registers "otb" and "otb_policy")
from rlcourse.advantages import compute_dr_grpo_outcome_advantage, get_estimator
from rlcourse.methods.otb import (TabularAR, logit_grad_energy, otb_advantage, sum_pi_sq_from_logits,
                                  tabular_gradient_variance)


def test_registered():
    assert get_estimator("otb") is otb_advantage


def test_logit_gradient_norm_identity_by_autograd():
    gen = torch.Generator().manual_seed(0)
    for V in (2, 7, 50):
        z = (torch.randn(V, generator=gen, dtype=torch.float64) * 3).requires_grad_(True)
        pi = torch.softmax(z, -1).detach()
        for a in range(V):
            (g,) = torch.autograd.grad(torch.log_softmax(z, -1)[a], z)
            assert torch.allclose(g, torch.eye(V, dtype=torch.float64)[a] - pi, atol=1e-12)
            closed = 1 - 2 * pi[a] + (pi**2).sum()
            assert abs(float(g.pow(2).sum() - closed)) < 1e-10
            w = logit_grad_energy(torch.log(pi[a]).reshape(1, 1), (pi**2).sum().reshape(1, 1))
            assert abs(float(w) - float(closed)) < 1e-6


def test_sum_pi_sq_is_stable_and_exact():
    z = torch.randn(4, 6, 30, dtype=torch.float64) * 5
    assert torch.allclose(sum_pi_sq_from_logits(z).double(), (torch.softmax(z, -1) ** 2).sum(-1), atol=1e-6)
    big = torch.tensor([[1000.0, 999.0, -1000.0]])
    assert torch.isfinite(sum_pi_sq_from_logits(big)).all()
    with pytest.raises(ValueError, match="vocabulary"):
        sum_pi_sq_from_logits(torch.tensor(1.0))


def _rand_batch(B=8, T=5, G=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    R = torch.randint(0, 2, (B,), generator=gen).float()
    tlr = torch.zeros(B, T)
    tlr[torch.arange(B), lengths - 1] = R
    logp = torch.log(torch.rand(B, T, generator=gen) * 0.9 + 0.05) * mask
    sumsq = (logp.exp() ** 2 + torch.rand(B, T, generator=gen) * 0.1).clamp(max=1.0) * mask
    return tlr, mask, torch.arange(B // G).repeat_interleave(G), logp, sumsq


def test_baseline_matches_a_naive_loop():
    tlr, mask, index, logp, sumsq = _rand_batch(B=12, T=6, G=4, seed=1)
    adv, ret = otb_advantage(tlr, mask, index, logprobs=logp, sum_pi_sq=sumsq, handle_zero_tail=False)
    w = (1 - 2 * logp.exp() + sumsq) * mask
    B, T = mask.shape
    for i in range(B):
        for t in range(T):
            if mask[i, t] == 0:
                assert adv[i, t] == 0
                continue
            Gt = lambda k: float((tlr[k, t:] * mask[k, t:]).sum())  # noqa: E731
            Wt = lambda k: float((w[k, :t + 1]).sum()) * float(mask[k, t])  # noqa: E731
            rows = [k for k in range(B) if index[k] == index[i]]
            b = sum(Gt(k) * Wt(k) for k in rows) / (sum(Wt(k) for k in rows) + 1e-8)
            assert float(adv[i, t]) == pytest.approx(Gt(i) - b, abs=1e-5)
            assert float(ret[i, t]) == pytest.approx(Gt(i), abs=1e-6)


def test_equal_energy_reduces_to_group_mean_and_single_sample_to_no_baseline():
    B, T, G = 8, 4, 4
    mask = torch.ones(B, T)
    R = torch.tensor([1.0, 0, 0, 1, 1, 1, 0, 1])
    tlr = torch.zeros(B, T)
    tlr[:, -1] = R
    logp = torch.full((B, T), np.log(0.3))
    sumsq = torch.full((B, T), 0.2)
    index = torch.arange(B // G).repeat_interleave(G)
    adv, _ = otb_advantage(tlr, mask, index, logprobs=logp, sum_pi_sq=sumsq)
    ref, _ = compute_dr_grpo_outcome_advantage(tlr, mask, index)
    assert torch.allclose(adv, ref, atol=1e-6)
    adv1, ret1 = otb_advantage(tlr, mask, torch.arange(B), logprobs=logp, sum_pi_sq=sumsq)
    assert torch.allclose(adv1, ret1)  # N = 1: A = G


def test_zero_tail_rule():
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])
    tlr = torch.tensor([[0.0, 0, 0, 1], [0, 1, 0, 0]])
    logp, sumsq = torch.full((2, 4), -1.0) * mask, torch.full((2, 4), 0.3) * mask
    on, _ = otb_advantage(tlr, mask, torch.zeros(2), logprobs=logp, sum_pi_sq=sumsq)
    off, _ = otb_advantage(tlr, mask, torch.zeros(2), logprobs=logp, sum_pi_sq=sumsq, handle_zero_tail=False)
    assert torch.allclose(on[0, 2:], torch.ones(2))  # past the second-longest response: baseline 0
    assert torch.allclose(off[0, 2:], torch.zeros(2), atol=1e-6)  # otherwise baselined against itself
    assert torch.allclose(on[:, :2], off[:, :2])


def test_errors():
    tlr, mask, index, logp, sumsq = _rand_batch()
    with pytest.raises(ValueError, match="sum_pi_sq"):
        otb_advantage(tlr, mask, index, logprobs=logp)
    with pytest.raises(ValueError, match="shape"):
        otb_advantage(tlr, mask, index, logprobs=logp[:, :3], sum_pi_sq=sumsq)
    with pytest.raises(ValueError, match="index"):
        otb_advantage(tlr, mask, index[:3], logprobs=logp, sum_pi_sq=sumsq)
    with pytest.raises(ValueError, match="baseline"):
        tabular_gradient_variance(TabularAR(max_len=2), 4, "opt")


def test_optimal_constant_baseline_by_enumeration():
    env = TabularAR(max_len=4, seed=2)
    s = env.score.sum(1)  # (n, D) sequence score
    e = (s**2).sum(1)
    # tabular: the per-token scores of a response live in different rows, so energies add up
    assert np.allclose(e, ((1 - 2 * np.exp(env.logp) + env.sumsq) * env.mask).sum(1))
    b_star = (env.prob * e * env.reward).sum() / (env.prob * e).sum()
    bs = np.linspace(-0.5, 1.5, 4001)
    second_moment = [(env.prob * e * (env.reward - b) ** 2).sum() for b in bs]
    assert abs(bs[int(np.argmin(second_moment))] - b_star) < 1e-3
    # and the baseline leaves the mean gradient unchanged
    assert np.allclose((env.prob[:, None] * s).sum(0), 0, atol=1e-12)


def test_score_martingale_for_shared_parameters():
    # a policy whose logits are shared by every position: per-token scores are not orthogonal,
    # but their cross terms vanish in expectation, so E||sum_t s_t||^2 = sum_t E||s_t||^2
    rng = np.random.default_rng(0)
    z = rng.normal(0, 1, 3)
    pi = np.exp(z) / np.exp(z).sum()
    L = 4
    total, parts = 0.0, 0.0
    for seq in itertools.product(range(3), repeat=L):
        p = np.prod(pi[list(seq)])
        scores = np.eye(3)[list(seq)] - pi
        total += p * (scores.sum(0) ** 2).sum()
        parts += p * (scores**2).sum()
    assert total == pytest.approx(parts, rel=1e-12)
    assert parts == pytest.approx(L * (1 - (pi**2).sum()), rel=1e-12)


def test_otb_lowers_variance_at_n16_on_the_tabular_policy():
    env = TabularAR(max_len=5, seed=0)
    mean16 = tabular_gradient_variance(env, 16, "mean", n_groups=1500, seed=1)
    otb16 = tabular_gradient_variance(env, 16, "otb", n_groups=1500, seed=1)
    assert otb16["total_var"] < 0.95 * mean16["total_var"]
    rloo4 = tabular_gradient_variance(env, 4, "rloo", n_groups=500, seed=1)
    mean4 = tabular_gradient_variance(env, 4, "mean", n_groups=500, seed=1)
    assert rloo4["nsr"] == pytest.approx(mean4["nsr"], rel=1e-9)  # same direction, rescaled


def test_sampler_and_trainer():
    from rlcourse.lm import build_model, build_tokenizer
    from rlcourse.train import RLConfig, Trainer
    tok = build_tokenizer()
    model = build_model(tok, rlcourse.profile("smoke"), seed=0)
    cfg = RLConfig(num_generations=4, prompts_per_step=2, max_completion_length=6, steps=1, progress=False,
                   train_pool_size=50, eval_prompts=8, advantage_estimator="otb", sampler="otb_policy")
    tr = Trainer(copy.deepcopy(model), tok, "sort", cfg)
    tr.train()
    from rlcourse.methods.otb import otb_policy_sampler
    batch = otb_policy_sampler(tr.model, tok, ["sort 4179:"], cfg, torch.Generator().manual_seed(0), {})
    m = batch.response_mask > 0
    s = batch.extras["sum_pi_sq"]
    assert (s[m] <= 1 + 1e-6).all()
    assert (s[m] >= batch.logprobs.exp()[m] ** 2 - 1e-6).all()
    # a declared field: it survives selection (an undeclared attribute was lost by select/replace)
    assert torch.equal(batch.select([1, 0]).extras["sum_pi_sq"], s[[1, 0]])
    tlr = torch.zeros_like(batch.response_mask)
    tlr[:, 0] = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv, _ = otb_advantage(tlr, batch.response_mask, batch.index, batch=batch)
    plain = dataclasses.replace(batch, extras={})  # what the plain "policy" sampler returns
    with pytest.raises(ValueError, match="otb_policy"):
        otb_advantage(tlr, plain.response_mask, plain.index, batch=plain)
    # given the model that sampled the batch, the estimator computes sum_pi_sq itself: the same advantages
    adv2, _ = otb_advantage(tlr, plain.response_mask, plain.index, batch=plain, model=tr.model)
    assert torch.allclose(adv, adv2, atol=1e-6)
    # so OTB combines with another sampler from the config alone
    cfg2 = dataclasses.replace(cfg, sampler="policy")
    assert math.isfinite(Trainer(copy.deepcopy(model), tok, "sort", cfg2).step()["loss"])


def test_negative_control_sentence_follows_its_verdict():
    """The prose about the negative control is computed from its verdict: each of the three outcomes of
    the equivalence test (and one without spread) gives its own sentence, with the numbers in it."""
    from rlcourse.claims import evaluate
    from rlcourse.studies.otb import CLAIMS, negative_control_sentence

    claim, base = CLAIMS["negative"], [0.5] * 5
    far = evaluate(claim, [0.40, 0.41, 0.39, 0.40, 0.42], base, profile="book")
    near = evaluate(claim, [0.501, 0.499, 0.500, 0.502, 0.498], base, profile="book")
    edge = evaluate(claim, [0.47, 0.50, 0.49, 0.46, 0.51], base, profile="book")
    flat = evaluate(claim, [0.45] * 5, base, profile="book")
    assert (far.verdict, near.verdict, edge.verdict, flat.verdict) == (
        "does not hold", "holds", "inconclusive", "inconclusive")
    assert "outside the margin" in negative_control_sentence(far)
    assert "already matches 32" in negative_control_sentence(near) and near.interval() in negative_control_sentence(near)
    s = negative_control_sentence(edge)
    assert "inside the margin" in s and edge.interval() in s and "either way" in s
    assert "no spread" in negative_control_sentence(flat)
    on = evaluate(claim, [0.475, 0.481, 0.479, 0.484, 0.481], base, profile="book")  # mean difference -0.020
    assert on.verdict == "inconclusive" and "sits on the margin" in negative_control_sentence(on)
