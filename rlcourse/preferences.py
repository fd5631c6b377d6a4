"""Synthetic preferences on the addition task, Bradley-Terry reward models, and best-of-N over-optimisation.

The chapter *Reward models* builds everything here. A *true* reward with graded quality scores a
completion of the addition task by how far its final answer is from the sum; pairs of the base
model's own samples are labelled by that reward through a Bradley-Terry coin (so labels are noisy the
way human labels are); a reward model (:class:`~rlcourse.lm.heads.ScalarHeadModel`) is fitted with
:func:`~rlcourse.supervised.train_reward_model`; then best-of-N selection by the learned (proxy) reward is
compared with selection by the true reward.

=============================  ===============================================================
:func:`true_reward`            ``-log10(1 + |answer - sum|)``; malformed answers get the floor
:func:`bt_preference_prob`     ``sigmoid(beta * (r_a - r_b))``, the Bradley-Terry model
:func:`make_preference_pairs`  pairs within each prompt's samples, labelled by a Bradley-Terry coin
:func:`pair_accuracy`          how often a reward model orders held-out pairs like the true reward
:func:`best_of_n_curve`        expected proxy and true reward of best-of-N (unbiased, from n >= N)
:func:`expected_max_normal`    ``E[max of N standard normals]`` by quadrature
:func:`gaussian_best_of_n`     closed form of best-of-N under a Gaussian proxy
:func:`sample_groups`          ``n`` samples of each prompt and their true rewards
=============================  ===============================================================

The chapter's experiment, its grid over seeds and its claims, is the study
:mod:`rlcourse.studies.reward_models`.
"""
from __future__ import annotations

from math import comb, erf, pi, sqrt
from typing import Sequence

import numpy as np
import torch

from .lm.heads import ScalarHeadModel
from .lm.sampling import sample
from .tasks import Example
from .train import PreferencePair, reward_model_scores

MAX_ERROR = 999  # errors are capped here; a malformed answer counts as this error


def parse_final_answer(completion: str) -> int | None:
    """The integer after the last ``|`` of an addition completion, or ``None`` when there is none."""
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a string, got {type(completion).__name__}")
    if "|" not in completion:
        return None
    tail = completion.rsplit("|", 1)[1].strip()
    if not tail or not (tail.isdigit() or (tail[0] == "-" and tail[1:].isdigit())):
        return None
    return int(tail)


def self_consistent(completion: str) -> bool:
    """True when an addition completion is well formed and its scratchpad (the digits before ``|``)
    reversed equals its final answer, e.g. ``231|132``; says nothing about whether the sum is right."""
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a string, got {type(completion).__name__}")
    if completion.count("|") != 1:
        return False
    pad, answer = completion.split("|")
    return answer.isdigit() and pad[::-1] == answer


def true_reward(completion: str, example: Example, max_error: int = MAX_ERROR) -> float:
    """Graded true reward of an addition completion: :math:`-\\log_{10}(1 + \\min(|\\hat s - s|, E))`.

    0 for the right sum, about -0.3 for an error of 1, -1 for an error of 9, and the floor
    :math:`-\\log_{10}(1 + E)` (-3 for ``max_error=999``) for a malformed answer.
    """
    if max_error < 1:
        raise ValueError(f"max_error must be >= 1, got {max_error}")
    try:
        target = int(example.answer)
    except (TypeError, ValueError) as err:
        raise ValueError(f"example {example.prompt!r} has no integer answer: {example.answer!r}") from err
    value = parse_final_answer(completion)
    error = max_error if value is None else min(abs(value - target), max_error)
    return -float(np.log10(1.0 + error))


def true_rewards(completions: Sequence[str], examples: Sequence[Example]) -> np.ndarray:
    """:func:`true_reward` of each completion, ``(N,)`` float64; one example per completion."""
    if len(completions) != len(examples):
        raise ValueError(f"{len(completions)} completions but {len(examples)} examples")
    return np.array([true_reward(c, e) for c, e in zip(completions, examples)], dtype=np.float64)


def bt_preference_prob(r_a, r_b, beta: float = 1.0):
    """Bradley-Terry probability that ``a`` is preferred to ``b``: :math:`\\sigma(\\beta (r_a - r_b))`.

    ====== ======== ==========================================
    r_a    ``(N,)`` reward of the first answer (array or float)
    r_b    ``(N,)`` reward of the second answer, same shape
    beta   scalar   inverse temperature (label noise: small beta, noisy labels)
    ====== ======== ==========================================
    """
    r_a, r_b = np.asarray(r_a, dtype=float), np.asarray(r_b, dtype=float)
    if r_a.shape != r_b.shape:
        raise ValueError(f"r_a {r_a.shape} and r_b {r_b.shape} must have the same shape")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    return 0.5 * (1.0 + np.tanh(0.5 * beta * (r_a - r_b)))  # = sigmoid, without overflow


def make_preference_pairs(prompts: Sequence[str], texts: Sequence[Sequence[str]], rewards: np.ndarray,
                          pairs_per_prompt: int, beta: float | None, rng: np.random.Generator):
    """Preference pairs from ``G`` samples of each prompt, labelled by a Bradley-Terry coin.

    For each prompt, up to ``pairs_per_prompt`` distinct pairs ``(i, j)`` of samples whose true rewards
    differ are drawn; ``i`` is labelled *chosen* with probability ``sigmoid(beta * (r_i - r_j))``
    (``beta=None``: always the one with the higher true reward). Pairs with equal true rewards are
    skipped: a labeller would flip a fair coin, and they carry no information about the reward.

    ======== ========== ==========================================
    prompts  ``P``      prompt strings
    texts    ``P x G``  the ``G`` sampled completions of each prompt
    rewards  ``(P, G)`` their true rewards
    returns             list of :class:`~rlcourse.supervised.PreferencePair` and ``(M,)`` bool: label agrees with
                        the true reward
    ======== ========== ==========================================
    """
    rewards = np.asarray(rewards, dtype=float)
    if rewards.ndim != 2 or rewards.shape[0] != len(prompts) or any(len(t) != rewards.shape[1] for t in texts) \
            or len(texts) != len(prompts):
        raise ValueError(f"rewards {rewards.shape} must be (P, G) for {len(prompts)} prompts with G texts each")
    if pairs_per_prompt < 1:
        raise ValueError(f"pairs_per_prompt must be >= 1, got {pairs_per_prompt}")
    if beta is not None and not beta > 0:
        raise ValueError(f"beta must be > 0 or None, got {beta}")
    G = rewards.shape[1]
    all_pairs = [(i, j) for i in range(G) for j in range(i + 1, G)]
    pairs, agrees = [], []
    for p, prompt in enumerate(prompts):
        usable = [(i, j) for i, j in all_pairs if rewards[p, i] != rewards[p, j]]
        if not usable:
            continue
        for s in rng.permutation(len(usable))[:pairs_per_prompt]:
            i, j = usable[int(s)]
            if rng.random() < 0.5:  # random order, so the label is not tied to the sample index
                i, j = j, i
            p_i = 1.0 if beta is None else float(bt_preference_prob(rewards[p, i], rewards[p, j], beta))
            i_wins = (rewards[p, i] > rewards[p, j]) if beta is None else rng.random() < p_i
            c, r = (i, j) if i_wins else (j, i)
            pairs.append(PreferencePair(prompt, texts[p][c], texts[p][r]))
            agrees.append(rewards[p, c] > rewards[p, r])
    return pairs, np.array(agrees, dtype=bool)


@torch.no_grad()
def score_completions(reward_model: ScalarHeadModel, tokenizer, prompts: Sequence[str], completions: Sequence[str],
                      batch_size: int = 512) -> np.ndarray:
    """Reward-model scores ``(N,)`` (float64) of many completions, in batches, without gradient."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    out = [reward_model_scores(reward_model, tokenizer, prompts[i:i + batch_size], completions[i:i + batch_size])
           for i in range(0, len(prompts), batch_size)]
    return torch.cat(out).double().numpy()


def pair_accuracy(reward_model: ScalarHeadModel, tokenizer, prompts: Sequence[str], texts: Sequence[Sequence[str]],
                  rewards: np.ndarray, proxy: np.ndarray | None = None) -> float:
    """Fraction of all within-prompt pairs with different true rewards that the reward model orders
    the same way (a tie in the model's scores counts one half).

    ======= ========== ============================================
    texts   ``P x G``  completions of each prompt
    rewards ``(P, G)`` true rewards
    proxy   ``(P, G)`` reward-model scores, if already computed
    ======= ========== ============================================
    """
    rewards = np.asarray(rewards, dtype=float)
    if proxy is None:
        flat = score_completions(reward_model, tokenizer, [p for p, t in zip(prompts, texts) for _ in t],
                                 [c for t in texts for c in t])
        proxy = flat.reshape(rewards.shape)
    proxy = np.asarray(proxy, dtype=float)
    if proxy.shape != rewards.shape:
        raise ValueError(f"proxy {proxy.shape} and rewards {rewards.shape} must have the same shape")
    dr = np.sign(rewards[:, :, None] - rewards[:, None, :])
    dp = np.sign(proxy[:, :, None] - proxy[:, None, :])
    usable = dr > 0
    if not usable.any():
        raise ValueError("no pair with different true rewards: accuracy is undefined")
    return float(((dp[usable] > 0) + 0.5 * (dp[usable] == 0)).mean())


def best_of_n_weights(n: int, k: int) -> np.ndarray:
    """Probability that the ``i``-th highest of ``n`` samples (0-based) is the highest of a uniformly
    random ``k``-subset: :math:`\\binom{n-1-i}{k-1} / \\binom{n}{k}`, shape ``(n,)``."""
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    return np.array([comb(n - 1 - i, k - 1) for i in range(n)], dtype=float) / comb(n, k)


def best_of_n_curve(proxy: np.ndarray, true: np.ndarray, Ns: Sequence[int]) -> dict:
    """Expected proxy and true reward of best-of-N selection by the proxy, for each ``N`` in ``Ns``,
    estimated without bias from ``n >= max(Ns)`` samples per prompt (the best-of-k estimator of
    :func:`rlcourse.metrics.best_of_k`, averaged over prompts), and the same for selection by the
    true reward (the oracle).

    ======= ========== ====================================================
    proxy   ``(P, n)`` proxy (reward-model) score of each sample
    true    ``(P, n)`` true reward of each sample
    returns            dict of ``(len(Ns),)`` arrays: ``proxy`` (proxy of the proxy-selected sample), ``true``
                       (its true reward), ``oracle`` (true reward of the true-selected sample)
    ======= ========== ====================================================
    """
    proxy, true = np.asarray(proxy, dtype=float), np.asarray(true, dtype=float)
    if proxy.shape != true.shape or proxy.ndim != 2:
        raise ValueError(f"proxy {proxy.shape} and true {true.shape} must be the same (P, n) shape")
    n = proxy.shape[1]
    if not all(1 <= int(N) <= n for N in Ns):
        raise ValueError(f"every N must be in [1, n={n}], got {list(Ns)}")
    order = np.argsort(-proxy, axis=1, kind="stable")
    p_sorted = np.take_along_axis(proxy, order, 1)
    t_by_proxy = np.take_along_axis(true, order, 1)
    t_sorted = -np.sort(-true, axis=1)
    out = {"proxy": [], "true": [], "oracle": []}
    for N in Ns:
        w = best_of_n_weights(n, int(N))
        out["proxy"].append(float((p_sorted @ w).mean()))
        out["true"].append(float((t_by_proxy @ w).mean()))
        out["oracle"].append(float((t_sorted @ w).mean()))
    return {k: np.array(v) for k, v in out.items()}


def _phi(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * x * x) / sqrt(2 * pi)


def _Phi(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(erf)(x / sqrt(2.0)))


def expected_max_normal(N: int, grid: int = 20001, lim: float = 12.0) -> float:
    """:math:`e_N = \\mathbb{E}[\\max(Z_1..Z_N)] = \\int x\\, N \\varphi(x) \\Phi(x)^{N-1} dx` for iid
    standard normals, by the trapezoidal rule on ``[-lim, lim]`` (error far below 1e-8 for N <= 10^4)."""
    if not isinstance(N, (int, np.integer)) or N < 1:
        raise ValueError(f"N must be a positive integer, got {N!r}")
    x = np.linspace(-lim, lim, grid)
    f = x * N * _phi(x) * _Phi(x) ** (N - 1)
    return float(np.trapezoid(f, x) if hasattr(np, "trapezoid") else np.trapz(f, x))


def gaussian_best_of_n(N: int, sigma: float) -> dict:
    """Best-of-N under the Gaussian proxy model :math:`R \\sim N(0,1)`, :math:`S = R + \\varepsilon`,
    :math:`\\varepsilon \\sim N(0, \\sigma^2)` independent: the expected proxy score of the selected
    sample, :math:`\\sqrt{1+\\sigma^2}\\, e_N`, its expected true reward, :math:`e_N / \\sqrt{1+\\sigma^2}`,
    and the gap :math:`e_N \\sigma^2 / \\sqrt{1+\\sigma^2}`."""
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    e = expected_max_normal(N)
    s = sqrt(1.0 + sigma**2)
    return {"proxy": s * e, "true": e / s, "gap": e * sigma**2 / s, "e_N": e}


def best_of_n_monte_carlo(N: int, n_trials: int, rng: np.random.Generator, sigma: float = 1.0,
                          noise: str = "normal", df: float = 2.0) -> dict:
    """Monte Carlo of best-of-N with :math:`R \\sim N(0,1)` and proxy :math:`S = R + \\sigma\\varepsilon`,
    :math:`\\varepsilon` standard normal (``noise="normal"``) or Student-t with ``df`` degrees of
    freedom (``noise="t"``, heavy tails). Returns the mean proxy and true reward of the selected sample
    and their standard errors."""
    if noise not in ("normal", "t"):
        raise ValueError(f"noise must be 'normal' or 't', got {noise!r}")
    if N < 1 or n_trials < 2:
        raise ValueError(f"need N >= 1 and n_trials >= 2, got {N}, {n_trials}")
    R = rng.standard_normal((n_trials, N))
    eps = rng.standard_normal((n_trials, N)) if noise == "normal" else rng.standard_t(df, (n_trials, N))
    S = R + sigma * eps
    pick = S.argmax(1)
    s_sel, r_sel = S[np.arange(n_trials), pick], R[np.arange(n_trials), pick]
    return {"proxy": float(s_sel.mean()), "true": float(r_sel.mean()),
            "proxy_se": float(s_sel.std() / sqrt(n_trials)), "true_se": float(r_sel.std() / sqrt(n_trials))}


# ---------------------------------------------------------------------- sampling
def sample_groups(model, tokenizer, examples: Sequence[Example], n: int, max_new_tokens: int, temperature: float,
                  generator: torch.Generator, chunk: int = 64):
    """``n`` samples for each example: returns ``texts`` (``P x n`` list) and true rewards ``(P, n)``."""
    texts: list[list[str]] = []
    for s in range(0, len(examples), chunk):
        part = list(examples[s:s + chunk])
        batch = sample(model, tokenizer, [e.prompt for e in part], num_generations=n, max_new_tokens=max_new_tokens,
                       temperature=temperature, generator=generator)
        texts += [batch.texts[i * n:(i + 1) * n] for i in range(len(part))]
    rewards = np.array([[true_reward(c, e) for c in t] for t, e in zip(texts, examples)])
    return texts, rewards
