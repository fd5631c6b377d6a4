"""OTB on a testbed built for it: long, high-entropy wrong answers and short, confident right ones.

Companion of :mod:`rlcourse.methods.otb` (Li et al., 2026, *The Optimal Token Baseline*, arXiv:2602.07078).
On the tabular policy of that module no baseline can make N = 4 match N = 32 (see
:func:`~rlcourse.methods.otb.tabular_oracle_nsr`), so a negative result there says nothing about OTB.
:class:`LongWrongTask` is a tabular testbed where a response's gradient energy correlates with failure,
the regime the paper's abstract describes; the chapter's claims about OTB are tested on it, with an oracle
baseline as the positive control (the grid, the learning-rate rule, the claims and their verdicts are in
:mod:`rlcourse.studies.otb`).
"""
from __future__ import annotations

import numpy as np
import torch

from .otb import otb_advantage

__all__ = ["LongWrongTask", "longwrong_value", "longwrong_true_gradient", "longwrong_oracle_baseline",
           "longwrong_sample", "longwrong_advantages", "longwrong_gradient", "longwrong_nsr", "run_longwrong"]


# ---------------------------------------------------------------------- a testbed where loud answers are wrong
class LongWrongTask:
    """A tabular testbed in which a response's gradient energy correlates with failure.

    Tokens are ``0 = C`` (give the right answer and stop, reward 1), ``1 = S`` (a wrong answer, stop,
    reward 0) and ``n_fillers`` filler tokens (keep going; a response that reaches ``max_len``
    tokens gets reward 0). The logits are a table ``theta[x, t]`` per prompt ``x`` and position
    ``t`` (the prefix of a live response is always fillers, so ``(x, t)`` is its context). At the
    start, ``P(C)`` at ``t = 0`` is spread over ``p_first`` across prompts: right answers are short
    and, on easy prompts, confident (small energy :math:`w = 1 - 2\\pi_C + \\sum\\pi^2`); later
    positions are near-uniform over the fillers with ``P(C) = P(S) = p_late``, so wrong answers are
    long, high-entropy and loud.

    ============== ============ ===============================================
    attribute      shape        meaning
    ============== ============ ===============================================
    theta          ``(K,L,V)``  initial logits (V = 2 + n_fillers)
    ============== ============ ===============================================
    """

    def __init__(self, n_prompts: int = 8, max_len: int = 16, n_fillers: int = 6, p_first=(0.25, 0.75),
                 p_late: float = 0.06):
        if n_prompts < 1 or max_len < 2 or n_fillers < 1:
            raise ValueError(f"need n_prompts >= 1, max_len >= 2, n_fillers >= 1; got {n_prompts}, {max_len}, "
                             f"{n_fillers}")
        if not 0 < p_late < 0.5:
            raise ValueError(f"p_late must be in (0, 0.5), got {p_late}")
        K, L, V = n_prompts, max_len, 2 + n_fillers
        self.K, self.L, self.V = K, L, V
        probs = np.zeros((K, L, V))
        pc = np.linspace(p_first[0], p_first[1], K)
        probs[:, 0, 0], probs[:, 0, 1] = pc, p_late
        probs[:, 0, 2:] = ((1 - pc - p_late) / n_fillers)[:, None]
        probs[:, 1:, 0] = probs[:, 1:, 1] = p_late
        probs[:, 1:, 2:] = (1 - 2 * p_late) / n_fillers
        self.theta = np.log(probs)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def longwrong_value(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact quantities of the :class:`LongWrongTask` policy ``theta`` ``(K,L,V)``.

    Returns ``J (K,)`` expected reward per prompt, ``alive (K,L)`` probability that a response is
    still going at position ``t``, and ``v (K,L+1)`` the value :math:`\\mathbb E[R \\mid \\text{alive at } t]`
    (``v[:, L] = 0``).
    """
    p = _softmax(theta)
    K, L, _ = theta.shape
    v = np.zeros((K, L + 1))
    for t in reversed(range(L)):
        v[:, t] = p[:, t, 0] + p[:, t, 2:].sum(-1) * v[:, t + 1]
    alive = np.concatenate([np.ones((K, 1)), np.cumprod(p[:, :-1, 2:].sum(-1), 1)], 1)
    return v[:, 0], alive, v


def longwrong_true_gradient(theta: np.ndarray) -> np.ndarray:
    """Exact :math:`\\nabla_\\theta` of the mean over prompts of the expected reward, ``(K,L,V)``."""
    p = _softmax(theta)
    _, alive, v = longwrong_value(theta)
    K, L, V = theta.shape
    g_tok = np.zeros((K, L, V))  # expected return after choosing each token at (x, t)
    g_tok[..., 0] = 1.0
    g_tok[..., 2:] = v[:, 1:, None]
    q = (p * g_tok).sum(-1, keepdims=True)  # = v[:, t]
    return alive[..., None] * p * (g_tok - q) / K


def longwrong_oracle_baseline(theta: np.ndarray) -> np.ndarray:
    """The exact variance-optimal baseline of each context ``(x, t)``,
    :math:`\\mathbb E[w_t G_t \\mid x, t] / \\mathbb E[w_t \\mid x, t]`, ``(K,L)`` (scores of different
    contexts are orthogonal, so each context's baseline is optimised on its own)."""
    p = _softmax(theta)
    _, _, v = longwrong_value(theta)
    w = 1.0 - 2.0 * p + (p * p).sum(-1, keepdims=True)  # energy of each token choice
    g_tok = np.zeros_like(p)
    g_tok[..., 0] = 1.0
    g_tok[..., 2:] = v[:, 1:, None]
    # E[w (G - b)^2]: for a filler G is random with mean v[t+1]; the optimum only needs E[w G]
    return (p * w * g_tok).sum(-1) / (p * w).sum(-1)


def longwrong_sample(theta: np.ndarray, group_size: int, rng: np.random.Generator) -> dict:
    """Sample ``group_size`` responses for every prompt (rows of a prompt are contiguous).

    ======== ========== ===========================================
    key      shape      meaning
    ======== ========== ===========================================
    x        ``(B,)``   prompt of each row, B = K * group_size
    tokens   ``(B,L)``  sampled tokens (-1 past the end)
    mask     ``(B,L)``  1 on the response's tokens
    reward   ``(B,)``   1 if the response ends with C
    logp     ``(B,L)``  log pi(y_t); ``sumsq`` ``(B,L)`` sum_v pi_v^2 (0 past the end)
    ======== ========== ===========================================
    """
    K, L, V = theta.shape
    p = _softmax(theta)
    x = np.repeat(np.arange(K), group_size)
    B = len(x)
    tokens = -np.ones((B, L), dtype=int)
    mask, logp, sumsq = np.zeros((B, L)), np.zeros((B, L)), np.zeros((B, L))
    alive = np.ones(B, dtype=bool)
    reward = np.zeros(B)
    for t in range(L):
        pt = p[x, t]
        a = (pt.cumsum(1) > rng.random((B, 1))).argmax(1)
        a = np.minimum(a, V - 1)
        tokens[alive, t] = a[alive]
        mask[alive, t] = 1.0
        logp[alive, t] = np.log(pt[alive, a[alive]])
        sumsq[alive, t] = (pt[alive] ** 2).sum(1)
        reward[alive & (a == 0)] = 1.0
        alive &= a >= 2
    return {"x": x, "tokens": tokens, "mask": mask, "reward": reward, "logp": logp, "sumsq": sumsq}


def longwrong_advantages(theta: np.ndarray, s: dict, group_size: int, baseline: str) -> np.ndarray:
    """Per-token advantages ``(B,L)`` of a sample from :func:`longwrong_sample`: ``"mean"`` (the group
    mean, Dr. GRPO), ``"otb"`` (:func:`otb_advantage`, verl's single-turn default: no zero-tail rule),
    ``"otb_tail"`` (with it), ``"oracle"`` (:func:`longwrong_oracle_baseline`) or ``"none"``."""
    R, mask = s["reward"], s["mask"]
    if baseline == "mean":
        if group_size < 2:
            raise ValueError("the group-mean baseline needs group_size >= 2")
        b = np.repeat(R.reshape(-1, group_size).mean(1), group_size)
        return (R - b)[:, None] * mask
    if baseline in ("otb", "otb_tail"):
        last = mask.sum(1).astype(int) - 1
        tlr = np.zeros_like(mask)
        tlr[np.arange(len(R)), last] = R
        adv, _ = otb_advantage(torch.tensor(tlr), torch.tensor(mask), torch.tensor(s["x"]),
                               logprobs=torch.tensor(s["logp"]), sum_pi_sq=torch.tensor(s["sumsq"]),
                               handle_zero_tail=baseline == "otb_tail")
        return adv.double().numpy()
    if baseline == "oracle":
        # G_t = R for every valid position of a response (outcome reward)
        b = longwrong_oracle_baseline(theta)[s["x"]]
        return (R[:, None] - b) * mask
    if baseline == "none":
        return R[:, None] * mask
    raise ValueError(f"baseline must be 'mean', 'otb', 'otb_tail', 'oracle' or 'none', got {baseline!r}")


def longwrong_gradient(theta: np.ndarray, s: dict, adv: np.ndarray) -> np.ndarray:
    """The policy-gradient estimate :math:`\\frac{1}{B}\\sum_i\\sum_t A_{it}(e_{y_{it}} - \\pi_{x_i t})`, ``(K,L,V)``
    (averaged over the rows, so it estimates :func:`longwrong_true_gradient`)."""
    K, L, V = theta.shape
    p = _softmax(theta)
    B = len(s["x"])
    grad = np.zeros((K, L, V))
    rows, ts = np.nonzero(s["mask"])
    a = adv[rows, ts]
    np.add.at(grad, (s["x"][rows], ts), -a[:, None] * p[s["x"][rows], ts])
    np.add.at(grad, (s["x"][rows], ts, s["tokens"][rows, ts]), a)
    return grad / B


def longwrong_nsr(task: LongWrongTask, group_size: int, baseline: str, n_draws: int = 2000, seed: int = 0) -> dict:
    """Noise-to-signal ratio of one step's gradient (all prompts, ``group_size`` responses each) at the
    initial policy, by Monte Carlo over ``n_draws`` steps: ``nsr`` is
    :math:`\\mathrm{tr\\,Cov}(\\hat g) / \\|\\mathbb E\\hat g\\|^2` (unchanged if the advantages are rescaled, as
    :func:`~rlcourse.methods.otb.tabular_gradient_variance` defines it), ``nsr_true`` divides by
    :math:`\\|\\nabla J\\|^2` instead, and ``cos`` is the cosine between the average estimate and the exact
    gradient."""
    rng = np.random.default_rng(seed)
    theta = task.theta
    true = longwrong_true_gradient(theta).ravel()
    gs = np.stack([longwrong_gradient(theta, s, longwrong_advantages(theta, s, group_size, baseline)).ravel()
                   for s in (longwrong_sample(theta, group_size, rng) for _ in range(n_draws))])
    mean = gs.mean(0)
    var = float(((gs - mean) ** 2).sum(1).mean())
    return {"nsr": var / float(mean @ mean), "nsr_true": var / float(true @ true),
            "cos": float(mean @ true / np.linalg.norm(mean) / np.linalg.norm(true))}


def run_longwrong(task: LongWrongTask, baseline: str, group_size: int, steps: int, lr: float, seed: int,
                  optimizer: str = "adam", betas: tuple = (0.9, 0.999), eps: float = 1e-8) -> dict:
    """Policy-gradient ascent on the logits of :class:`LongWrongTask` (no gradient clipping), with Adam
    (default; bias-corrected, ``betas``, ``eps``), as the paper trains, or plain SGD (``optimizer="sgd"``).

    Adam divides each coordinate's step by its running gradient scale, so a baseline that only shrinks
    the expected gradient by a constant (the group mean's :math:`(N-1)/N`) does not shorten the step; with
    SGD at one learning rate it does, and a comparison of baselines then mixes step length with noise.

    ============ =============== ===========================================
    key          shape           meaning
    ============ =============== ===========================================
    reward       ``(steps+1,)``  exact expected reward (mean over prompts), before each step and at the end
    tokens       ``(steps+1,)``  tokens generated so far (0 first)
    grad_norm    ``(steps,)``    norm of each step's gradient estimate
    ============ =============== ===========================================
    """
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    if not (lr > 0 and np.isfinite(lr)):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    rng = np.random.default_rng(seed)
    theta = task.theta.copy()
    m1, m2 = np.zeros_like(theta), np.zeros_like(theta)
    reward, tokens, gnorm = [float(longwrong_value(theta)[0].mean())], [0.0], []
    for k in range(1, steps + 1):
        s = longwrong_sample(theta, group_size, rng)
        g = longwrong_gradient(theta, s, longwrong_advantages(theta, s, group_size, baseline))
        gnorm.append(float(np.linalg.norm(g)))
        if optimizer == "sgd":
            theta += lr * g
        else:
            m1 = betas[0] * m1 + (1 - betas[0]) * g
            m2 = betas[1] * m2 + (1 - betas[1]) * g * g
            theta += lr * (m1 / (1 - betas[0] ** k)) / (np.sqrt(m2 / (1 - betas[1] ** k)) + eps)
        tokens.append(tokens[-1] + float(s["mask"].sum()))
        reward.append(float(longwrong_value(theta)[0].mean()))
    return {"reward": np.array(reward), "tokens": np.array(tokens), "grad_norm": np.array(gnorm)}
