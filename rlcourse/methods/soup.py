"""Thinking Seeds (SOUP): past checkpoints write prefixes, the current policy continues, token ratios
against the true behaviour policy.

Course material for *SOUP: Token-level Single-sample Mix-policy Reinforcement Learning for Large
Language Models*, Lei Yang, Wei Bi, Chenxi Sun, Renren Jin, Deyi Xiong (2026, arXiv:2601.21476),
whose abstract names the method Thinking Seeds. No code is public: the samplers and the objective
below are a reconstruction from the abstract (the chapter says so).

Two registered samplers, built on :mod:`rlcourse.bank`: ``"soup_prefix"`` (half of each group starts
from a bank policy's prefix of 25-50% of its response, the current policy continues) and
``"bank_sequence_mix"`` (half of each group is written wholly by a bank policy: sequence-level
mixing). Both record the true behaviour log-prob of every token in ``batch.logprobs``, so any policy
loss of the loop (PPO-clip ``"vanilla"`` by default) computes token-level ratios against it.

Also here: the exact gradient of token-level ratios on a tabular three-token language model
(:func:`expected_gradient`) and the proposition's bound on its bias (:func:`bias_bound`). The
chapter's experiments (the exact bias on random tabular instances, and two-digit addition) and their
claims are :mod:`rlcourse.studies.thinking_seeds`.
"""
from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np
import torch

from ..bank import bank_mixed_batch
from ..rollout import register_sampler

PAPER = ("SOUP: Token-level Single-sample Mix-policy Reinforcement Learning for Large Language Models, L. Yang, "
         "W. Bi, C. Sun, R. Jin, D. Xiong (2026, arXiv:2601.21476)")


@register_sampler("soup_prefix")
def soup_prefix_sampler(model, tokenizer, prompts, config, generator, state, step, every: int = 5,
                        max_snapshots: int = 2, which: str = "oldest", seeded: int | None = None,
                        prefix_frac: Sequence[float] = (0.25, 0.5)):
    """Thinking Seeds: ``seeded`` (default ``G // 2``) rows of each group start from a prefix of
    ``prefix_frac`` of a bank policy's response; the current policy continues. See
    :func:`rlcourse.bank.bank_mixed_batch` for the batch it returns."""
    return bank_mixed_batch(model, tokenizer, prompts, config, generator, state, step, every=every,
                            max_snapshots=max_snapshots, which=which, seeded=seeded, prefix_frac=prefix_frac)


@register_sampler("bank_sequence_mix")
def sequence_mix_sampler(model, tokenizer, prompts, config, generator, state, step, every: int = 5,
                         max_snapshots: int = 2, which: str = "oldest", seeded: int | None = None):
    """Sequence-level mixing: ``seeded`` (default ``G // 2``) rows of each group are written wholly by a
    bank policy (``prefix_frac = (1, 1)`` of :func:`rlcourse.bank.bank_mixed_batch`)."""
    return bank_mixed_batch(model, tokenizer, prompts, config, generator, state, step, every=every,
                            max_snapshots=max_snapshots, which=which, seeded=seeded, prefix_frac=(1.0, 1.0))


# ---------------------------------------------------------------------- the tabular three-token model
V, T3 = 3, 3  # vocabulary and length of the tabular model
SEQS = np.array(list(itertools.product(range(V), repeat=T3)))  # (27, 3) every sequence


def _context_index(prefix: Sequence[int]) -> int:
    """Contexts are the prefixes of length 0, 1, 2: index 0, then ``1 + a``, then ``1 + V + a V + b``."""
    return int(sum(V**i for i in range(len(prefix))) + sum(a * V**(len(prefix) - 1 - i) for i, a in enumerate(prefix)))


N_CTX = sum(V**i for i in range(T3))  # 13
CTX = np.array([[_context_index(y[:t]) for t in range(T3)] for y in SEQS])  # (27, 3)


def softmax(theta: np.ndarray) -> np.ndarray:
    z = np.exp(theta - theta.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def token_probs(theta: np.ndarray) -> np.ndarray:
    """``(27, 3)``: ``pi(y_t | y_<t)`` of every token of every sequence, for logits ``theta`` ``(13, V)``."""
    if theta.shape != (N_CTX, V):
        raise ValueError(f"theta must have shape {(N_CTX, V)}, got {theta.shape}")
    return softmax(theta)[CTX, SEQS]


def score_functions(theta: np.ndarray) -> np.ndarray:
    """``(27, 3, 13, V)``: ``grad_theta log pi(y_t | y_<t)`` = ``e_ctx (e_{y_t} - pi(.|ctx))``."""
    p = softmax(theta)
    out = np.zeros((len(SEQS), T3, N_CTX, V))
    for i, y in enumerate(SEQS):
        for t in range(T3):
            c = CTX[i, t]
            out[i, t, c] = -p[c]
            out[i, t, c, y[t]] += 1.0
    return out


def expected_gradient(theta: np.ndarray, theta_hist: np.ndarray, reward: np.ndarray, cut: int,
                      weighting: str = "token") -> np.ndarray:
    """Exact expectation of the importance-weighted policy gradient when the first ``cut`` tokens come
    from ``pi_hist`` and the rest from ``pi_theta``.

    The estimator is ``sum_t w_t R(y) grad log pi_theta(y_t | y_<t)`` with ``w_t = rho_t`` on prefix
    tokens and 1 after (``weighting="token"``: Thinking Seeds' token-level ratios), or ``w_t =
    prod_{j<cut} rho_j`` for every token (``"sequence"``: the exact correction), ``rho = pi_theta / pi_hist``.

    ========== ============ ============================================
    theta      ``(13, V)``  current logits (one row per context)
    theta_hist ``(13, V)``  the historical policy's logits
    reward     ``(27,)``    reward of every sequence (``SEQS`` order)
    cut        int          prefix length, 0 (on-policy) to 3 (whole sequence)
    returns    ``(13, V)``  the expected gradient
    ========== ============ ============================================
    """
    if not 0 <= cut <= T3:
        raise ValueError(f"cut must be in [0, {T3}], got {cut}")
    if weighting not in ("token", "sequence"):
        raise ValueError(f"weighting must be 'token' or 'sequence', got {weighting!r}")
    reward = np.asarray(reward, dtype=float)
    if reward.shape != (len(SEQS),):
        raise ValueError(f"reward must have shape ({len(SEQS)},), got {reward.shape}")
    pi, h = token_probs(theta), token_probs(theta_hist)
    pre = np.arange(T3) < cut
    mu = np.where(pre, h, pi).prod(1)  # behaviour probability of each sequence
    rho = np.where(pre, pi / h, 1.0)
    w = rho if weighting == "token" else np.repeat(rho.prod(1, keepdims=True), T3, 1)
    return np.einsum("i,i,it,itcv->cv", mu, reward, w, score_functions(theta))


def bias_bound(theta: np.ndarray, theta_hist: np.ndarray, reward: np.ndarray, cut: int) -> float:
    """The bound of the chapter's proposition on ``||E[g_token] - grad J||``:
    ``2 delta sum_t G_t n_t``, with ``delta`` the largest total-variation distance between ``pi_hist``
    and ``pi_theta`` over contexts of the prefix, ``G_t = max_y |R(y)| ||grad log pi(y_t|y_<t)||``,
    ``n_t = cut - 1`` for a prefix token and ``cut`` for a continuation token."""
    p, q = softmax(theta), softmax(theta_hist)
    prefix_ctx = [c for c in range(N_CTX) if c < sum(V**i for i in range(cut))]
    delta = max((0.5 * np.abs(p[c] - q[c]).sum() for c in prefix_ctx), default=0.0)
    norms = np.sqrt((score_functions(theta) ** 2).sum((2, 3)))  # (27, 3)
    G = (np.abs(np.asarray(reward))[:, None] * norms).max(0)
    n = np.where(np.arange(T3) < cut, cut - 1, cut)
    return float(2 * delta * (G * n).sum())


def ascent_trajectory(reward: np.ndarray, steps: int, lr: float, seed: int) -> np.ndarray:
    """``(steps + 1, 13, V)``: logits of exact policy-gradient ascent on ``J = E_pi[R]`` from random
    logits (``N(0, 1)``): the checkpoints a bank would hold, one per step."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=(N_CTX, V))
    out = [theta]
    for _ in range(steps):
        theta = theta + lr * expected_gradient(theta, theta, reward, 0)
        out.append(theta)
    return np.stack(out)


def monte_carlo_gradient(theta: np.ndarray, theta_hist: np.ndarray, reward: np.ndarray, cut: int, n: int,
                         seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The token-level gradient estimated from ``n`` sampled sequences *through the loop's own policy
    loss* (``"pg"``, the unclipped surrogate ``-rho A``, aggregated ``seq-mean-token-sum``), with the
    behaviour log-probs recorded at sampling time; returns the mean and its standard error per entry."""
    from ..losses import get_policy_loss

    rng = np.random.default_rng(seed)
    p_cur, p_hist = softmax(theta), softmax(theta_hist)
    ys = np.zeros((n, T3), dtype=int)
    for t in range(T3):
        ctx = np.array([_context_index(y[:t]) for y in ys])
        probs = (p_hist if t < cut else p_cur)[ctx]
        ys[:, t] = (rng.random((n, 1)) > probs.cumsum(1)).sum(1).clip(max=V - 1)
    rows = np.array([int(np.ravel_multi_index(tuple(y), (V,) * T3)) for y in ys])
    ctx = torch.as_tensor(CTX[rows])
    tok = torch.as_tensor(ys)
    behaviour = torch.as_tensor(np.log(np.where(np.arange(T3) < cut, token_probs(theta_hist), token_probs(theta))[rows]))
    logits = torch.tensor(theta, requires_grad=True)
    logp = torch.log_softmax(logits, -1)[ctx, tok]
    adv = torch.as_tensor(reward[rows], dtype=torch.float64)[:, None].expand(n, T3)
    loss, _ = get_policy_loss("pg")(old_log_prob=behaviour, log_prob=logp, advantages=adv,
                                    response_mask=torch.ones(n, T3, dtype=torch.float64),
                                    loss_agg_mode="seq-mean-token-sum")
    (g,) = torch.autograd.grad(-loss, logits)
    # per-sample values for the standard error (the same estimator, written out)
    pre = np.arange(T3) < cut
    rho = np.where(pre, token_probs(theta)[rows] / token_probs(theta_hist)[rows], 1.0)
    per = np.einsum("i,it,itcv->icv", reward[rows], rho, score_functions(theta)[rows])
    return g.numpy(), per.std(0, ddof=1) / np.sqrt(n)
