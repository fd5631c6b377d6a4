"""Metrics: pass@k and its siblings (unbiased estimators), diversity (distinct answers, entropy, modes, mixed groups), entropy of logits, explained variance, PPO diagnostics."""
from __future__ import annotations

import itertools
from collections import Counter
from math import comb
from typing import Hashable, Sequence

import numpy as np
import torch

from .ops import check_same_shape, masked_mean, masked_var


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator of pass@k from ``n`` samples of which ``c`` are correct:
    :math:`1 - \\binom{n-c}{k} / \\binom{n}{k}` (Chen et al., 2021), computed as a stable product."""
    if not (isinstance(n, (int, np.integer)) and isinstance(c, (int, np.integer)) and isinstance(k, (int, np.integer))):
        raise TypeError("n, c and k must be integers")
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def best_of_k(scores: Sequence[float], correct: Sequence[float], k: int) -> float:
    """Unbiased estimator of best-of-k accuracy: the expected correctness of the highest-scoring
    answer among ``k`` drawn without replacement from the ``n`` samples.

    Sorting the samples by score (descending, ties broken by position), the ``i``-th (0-based) is
    the best of a random ``k``-subset with probability :math:`\\binom{n-1-i}{k-1}/\\binom{n}{k}`."""
    scores, correct = np.asarray(scores, dtype=float), np.asarray(correct, dtype=float)
    if scores.shape != correct.shape or scores.ndim != 1:
        raise ValueError(f"scores {scores.shape} and correct {correct.shape} must be 1-D and the same length")
    n = len(scores)
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n = {n}, got k={k}")
    order = np.argsort(-scores, kind="stable")
    weights = np.array([comb(n - 1 - i, k - 1) for i in range(n)], dtype=float) / comb(n, k)
    return float((weights * correct[order]).sum())


def majority_vote(answers: Sequence[Hashable]) -> Hashable:
    """The most frequent answer (ties: the one that appears first)."""
    if len(answers) == 0:
        raise ValueError("majority_vote of no answers")
    counts = Counter(answers)
    top = max(counts.values())
    return next(a for a in answers if counts[a] == top)


def maj_at_k(answers: Sequence[Hashable], reference: Hashable, k: int, max_subsets: int = 20000,
             rng: np.random.Generator | None = None) -> float:
    """Probability that the majority vote of ``k`` samples drawn without replacement from ``answers``
    equals ``reference``: exact by enumerating the subsets when there are at most ``max_subsets``,
    otherwise a Monte Carlo estimate over ``max_subsets`` random subsets. ``None`` answers
    (unparseable) never count as the reference."""
    n = len(answers)
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n = {n}, got k={k}")
    if comb(n, k) <= max_subsets:
        subsets = itertools.combinations(range(n), k)
        total = comb(n, k)
    else:
        rng = rng or np.random.default_rng(0)
        subsets = (rng.choice(n, size=k, replace=False) for _ in range(max_subsets))
        total = max_subsets
    hits = 0
    for s in subsets:
        vote = majority_vote([answers[i] for i in s])
        hits += vote is not None and vote == reference
    return hits / total


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the last axis, in float32: ``(..., V) -> (...)``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """:math:`1 - \\mathrm{Var}[R - V] / \\mathrm{Var}[R]` over the mask: 1 for a perfect critic, 0 for a
    constant one, negative for one worse than a constant. NaN when the returns do not vary."""
    mask = torch.ones_like(returns) if mask is None else mask
    check_same_shape(values=values, returns=returns, mask=mask)
    var_r = masked_var(returns.float(), mask)
    if var_r <= 0:
        return float("nan")
    return float(1.0 - masked_var((returns - values).float(), mask) / var_r)


def approx_kl(log_prob: torch.Tensor, old_log_prob: torch.Tensor, mask: torch.Tensor) -> float:
    """k3 estimate of KL(pi_old || pi) from samples of pi_old (CleanRL's ``approx_kl``)."""
    log_ratio = (log_prob - old_log_prob).float()
    return float(masked_mean(torch.exp(log_ratio) - 1 - log_ratio, mask))


def clip_fraction(ratio: torch.Tensor, mask: torch.Tensor, low: float = 0.2, high: float = 0.2) -> float:
    """Fraction of tokens whose ratio lies outside :math:`[1-low, 1+high]`."""
    return float(masked_mean(((ratio < 1 - low) | (ratio > 1 + high)).float(), mask))


# --- diversity: shared by the exploration chapters -------------------------------------------------

def mean_pass_at_k(correct: np.ndarray | torch.Tensor, ks: Sequence[int]) -> dict[int, float]:
    """Mean over prompts of the unbiased pass@k, for each ``k`` in ``ks``.

    ======== ============ =================================================
    input    shape        meaning
    ======== ============ =================================================
    correct  ``(P, n)``   1 where sample ``j`` of prompt ``p`` is correct
    ======== ============ =================================================

    Returns ``{k: mean_p pass_at_k(n, c_p, k)}``; every ``k`` must satisfy ``1 <= k <= n``."""
    correct = np.asarray(correct.detach().cpu() if isinstance(correct, torch.Tensor) else correct, dtype=float)
    if correct.ndim != 2 or correct.shape[1] == 0:
        raise ValueError(f"correct must be (prompts, samples) with at least one sample, got shape {correct.shape}")
    if not np.isin(correct, (0.0, 1.0)).all():
        raise ValueError("correct must hold 0/1 values (one per sample)")
    n = correct.shape[1]
    counts = correct.sum(1).astype(int)
    return {int(k): float(np.mean([pass_at_k(n, int(c), int(k)) for c in counts])) for k in ks}


def distinct_count(items: Sequence[Hashable]) -> int:
    """Number of distinct items (answers, strategies, completions)."""
    return len(set(items))


def distinct_correct(items: Sequence[Hashable], correct: Sequence[float]) -> int:
    """Number of distinct items among the correct ones: the diversity that counts for pass@k."""
    if len(items) != len(correct):
        raise ValueError(f"{len(items)} items but {len(correct)} correctness flags")
    return len({item for item, ok in zip(items, correct) if ok})


def empirical_entropy(items: Sequence[Hashable]) -> float:
    """Plug-in entropy (nats) of the items' empirical distribution: 0 when all agree, ``log n`` when
    ``n`` items are all distinct. It underestimates the true entropy by about (m - 1) / (2n) for m
    occupied values (Miller's correction), so compare it only at equal sample sizes."""
    if len(items) == 0:
        raise ValueError("empirical_entropy of no items")
    p = np.array(list(Counter(items).values()), dtype=float) / len(items)
    return float(-(p * np.log(p)).sum())


def modes_above(items: Sequence[Hashable], threshold: float = 0.01) -> int:
    """Number of distinct items whose empirical mass exceeds ``threshold`` (e.g. strategies kept
    with mass > 1%)."""
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold must be in [0, 1), got {threshold}")
    if len(items) == 0:
        raise ValueError("modes_above of no items")
    return sum(c / len(items) > threshold for c in Counter(items).values())


def frac_mixed_groups(scores: torch.Tensor, group_size: int) -> float:
    """Share of groups whose scores are not all equal: the groups that give GRPO a gradient.

    ======= ========= ====================================
    input   shape     meaning
    ======= ========= ====================================
    scores  ``(B,)``  groups of ``group_size`` consecutive
    ======= ========= ====================================
    """
    if scores.ndim != 1 or group_size < 1 or scores.numel() % group_size:
        raise ValueError(f"scores must be 1-D with a length divisible by group_size={group_size}, "
                         f"got shape {tuple(scores.shape)}")
    groups = scores.reshape(-1, group_size)
    return float((groups != groups[:, :1]).any(1).float().mean())
