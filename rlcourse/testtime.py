"""Test-time scaling: pass@k, majority vote and best-of-k curves, exact values to check their
estimators against, and the sampled evaluation of a model that the chapter *Test-time scaling*'s
study (:mod:`rlcourse.studies.test_time_scaling`) runs on the base model and after GRPO.

=================================  ===========================================================
:func:`pass_at_k_curve`            mean over prompts of the unbiased pass@k estimator
:func:`maj_at_k_curve`             mean over prompts of maj@k (exact or Monte Carlo subsets)
:func:`best_of_k_curve`            mean over prompts of the unbiased best-of-k estimator
:func:`naive_pass_at_k`            the plug-in ``1 - (1 - c/n)^k`` (biased low)
:func:`exact_best_of_k`            best-of-k for k iid draws from a finite distribution
:func:`expected_estimator`         exact expectation of an estimator over all ``M^n`` samples
:func:`evaluate_samples`           ``n`` scored samples per prompt of a model
:func:`curves_from_samples`        pass@k, maj@k and best-of-k from :func:`evaluate_samples`
=================================  ===========================================================
"""
from __future__ import annotations

import itertools
from typing import Callable, Hashable, Sequence

import numpy as np
import torch

from .lm.sampling import sample
from .metrics import best_of_k, maj_at_k, pass_at_k
from .preferences import parse_final_answer, true_reward
from .tasks import Example, get_task


def _check_ks(ks: Sequence[int], n: int) -> list[int]:
    ks = [int(k) for k in ks]
    if not ks or not all(1 <= k <= n for k in ks):
        raise ValueError(f"every k must be in [1, n={n}], got {ks}")
    return ks


def pass_at_k_curve(correct: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    """Mean over prompts of :func:`rlcourse.metrics.pass_at_k`.

    ======= ========== ==========================================
    correct ``(P, n)`` 1 where sample ``j`` of prompt ``i`` is right
    ks      ``K``      the k values, each in ``[1, n]``
    returns ``(K,)``   estimated pass@k, averaged over the prompts
    ======= ========== ==========================================
    """
    correct = np.asarray(correct)
    if correct.ndim != 2:
        raise ValueError(f"correct must be (P, n), got shape {correct.shape}")
    if not np.isin(correct, (0, 1)).all():
        raise ValueError("correct must hold only 0 and 1")
    n = correct.shape[1]
    c = correct.sum(1).astype(int)
    return np.array([np.mean([pass_at_k(n, int(ci), k) for ci in c]) for k in _check_ks(ks, n)])


def naive_pass_at_k(correct: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    """The plug-in estimate :math:`1 - (1 - c/n)^k`, averaged over prompts; biased low for k > 1
    (Jensen: :math:`(1-x)^k` is convex). ``correct``: ``(P, n)`` of 0/1; returns ``(K,)``."""
    correct = np.asarray(correct, dtype=float)
    if correct.ndim != 2:
        raise ValueError(f"correct must be (P, n), got shape {correct.shape}")
    p_hat = correct.mean(1)
    return np.array([np.mean(1 - (1 - p_hat) ** k) for k in _check_ks(ks, correct.shape[1])])


def best_of_k_curve(scores: np.ndarray, correct: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    """Mean over prompts of :func:`rlcourse.metrics.best_of_k`: the expected correctness of the
    highest-scoring of ``k`` samples.

    ======= ========== ==========================================
    scores  ``(P, n)`` the selector's score of each sample
    correct ``(P, n)`` correctness (or any value) of each sample
    returns ``(K,)``   estimated best-of-k, averaged over the prompts
    ======= ========== ==========================================
    """
    scores, correct = np.asarray(scores, dtype=float), np.asarray(correct, dtype=float)
    if scores.shape != correct.shape or scores.ndim != 2:
        raise ValueError(f"scores {scores.shape} and correct {correct.shape} must be the same (P, n) shape")
    n = scores.shape[1]
    return np.array([np.mean([best_of_k(s, c, k) for s, c in zip(scores, correct)]) for k in _check_ks(ks, n)])


def maj_at_k_curve(answers: Sequence[Sequence[Hashable]], references: Sequence[Hashable], ks: Sequence[int],
                   max_subsets: int = 200, seed: int = 0) -> np.ndarray:
    """Mean over prompts of :func:`rlcourse.metrics.maj_at_k` (exact when a prompt has at most
    ``max_subsets`` subsets of size k, else a seeded Monte Carlo over ``max_subsets`` random subsets).

    ========== ========== ================================================
    answers    ``P x n``  parsed final answers (``None``: unparseable)
    references ``P``      the right answer of each prompt
    returns    ``(K,)``   estimated maj@k, averaged over the prompts
    ========== ========== ================================================
    """
    if len(answers) != len(references) or len(answers) == 0:
        raise ValueError(f"{len(answers)} answer lists but {len(references)} references (need >= 1)")
    n = len(answers[0])
    if any(len(a) != n for a in answers):
        raise ValueError("every prompt needs the same number n of answers")
    ks = _check_ks(ks, n)
    rng = np.random.default_rng(seed)
    return np.array([np.mean([maj_at_k(list(a), r, k, max_subsets=max_subsets, rng=rng)
                              for a, r in zip(answers, references)]) for k in ks])


# ---------------------------------------------------------------------- exact values for the checks
def exact_pass_at_k(p: float, k: int) -> float:
    """pass@k of ``k`` independent samples, each right with probability ``p``: :math:`1 - (1-p)^k`."""
    if not 0.0 <= p <= 1.0 or k < 1:
        raise ValueError(f"need 0 <= p <= 1 and k >= 1, got p={p}, k={k}")
    return 1.0 - (1.0 - p) ** k


def exact_best_of_k(scores: Sequence[float], values: Sequence[float], probs: Sequence[float], k: int) -> float:
    """Expected value of the highest-scoring of ``k`` iid draws from a finite distribution.

    With the ``M`` outcomes sorted by score (distinct), and :math:`T_j` the probability of an outcome
    scoring at most the ``j``-th, the best of ``k`` draws is outcome ``j`` with probability
    :math:`T_j^k - T_{j}'^k`, where :math:`T_j'` is the probability of scoring strictly less.

    ====== ======== =====================================
    scores ``(M,)`` distinct scores of the outcomes
    values ``(M,)`` the value (e.g. correctness) of each
    probs  ``(M,)`` their probabilities (sum to 1)
    ====== ======== =====================================
    """
    scores, values, probs = (np.asarray(a, dtype=float) for a in (scores, values, probs))
    if not scores.shape == values.shape == probs.shape or scores.ndim != 1:
        raise ValueError("scores, values and probs must be 1-D of the same length")
    if len(np.unique(scores)) != len(scores):
        raise ValueError("scores must be distinct")
    if np.any(probs < 0) or abs(probs.sum() - 1) > 1e-9:
        raise ValueError("probs must be non-negative and sum to 1")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    order = np.argsort(scores)  # ascending
    cdf = np.cumsum(probs[order])
    below = cdf - probs[order]
    return float(((cdf**k - below**k) * values[order]).sum())


def expected_estimator(estimator: Callable[[np.ndarray], float], probs: Sequence[float], n: int) -> float:
    """Exact expectation of ``estimator(outcomes)`` over ``n`` iid draws from ``probs``, by
    enumerating all ``M**n`` sequences of outcome indices (keep ``M**n`` small)."""
    probs = np.asarray(probs, dtype=float)
    M = len(probs)
    if M**n > 200_000:
        raise ValueError(f"M**n = {M**n} sequences is too many to enumerate")
    total = 0.0
    for seq in itertools.product(range(M), repeat=n):
        seq = np.array(seq)
        total += float(np.prod(probs[seq])) * estimator(seq)
    return total


# ---------------------------------------------------------------------- sampled evaluation
def evaluate_samples(model, tokenizer, examples: Sequence[Example], n: int, max_new_tokens: int,
                     generator: torch.Generator, temperature: float = 1.0, chunk: int = 32) -> dict:
    """Sample ``n`` completions per example and score them.

    Returns ``(P, n)`` arrays ``correct`` (0/1), ``graded`` (the graded true reward of
    :func:`rlcourse.preferences.true_reward`) and ``logprob`` (mean token log-probability, the
    model's own confidence), and ``answers`` (``P x n`` parsed final answers)."""
    task = get_task("addition")
    correct, graded, logprob, answers = [], [], [], []
    for s in range(0, len(examples), chunk):
        part = list(examples[s:s + chunk])
        b = sample(model, tokenizer, [e.prompt for e in part], num_generations=n, max_new_tokens=max_new_tokens,
                   temperature=temperature, generator=generator)
        rows = [e for e in part for _ in range(n)]
        correct.append(task.rewards(b.texts, rows).reshape(len(part), n))
        graded.append(np.array([true_reward(t, e) for t, e in zip(b.texts, rows)]).reshape(len(part), n))
        lp = (b.logprobs.sum(1) / b.response_mask.sum(1).clamp(min=1)).double().numpy()
        logprob.append(lp.reshape(len(part), n))
        parsed = [parse_final_answer(t) for t in b.texts]
        answers += [parsed[i * n:(i + 1) * n] for i in range(len(part))]
    return {"correct": np.concatenate(correct).astype(float), "graded": np.concatenate(graded),
            "logprob": np.concatenate(logprob), "answers": answers}


def curves_from_samples(ev: dict, references: Sequence[Hashable], ks: Sequence[int], maj_ks: Sequence[int],
                     noise_sigma: float, rng: np.random.Generator, max_subsets: int = 200) -> dict:
    """pass@k, maj@k and best-of-k (by a noisy reward and by the model's confidence) from
    :func:`evaluate_samples` output."""
    noisy = ev["graded"] + noise_sigma * rng.standard_normal(ev["graded"].shape)
    return {
        "pass": pass_at_k_curve(ev["correct"], ks),
        "maj": maj_at_k_curve(ev["answers"], references, maj_ks, max_subsets=max_subsets,
                              seed=int(rng.integers(2**31))),
        "bok_noisy": best_of_k_curve(noisy, ev["correct"], ks),
        "bok_conf": best_of_k_curve(ev["logprob"], ev["correct"], ks),
        "mean_correct": float(ev["correct"].mean()),
        "frac_unsolved": float((ev["correct"].sum(1) == 0).mean()),
    }
