"""Compute-aligned training: losses for pass@k, best-of-N and majority vote as operators on the policy.

*Compute Aligned Training: Optimizing for Test Time Inference*, Adam Ousherovitch and Ambuj Tewari
(2026, arXiv:2604.24957). A test-time strategy that draws ``N`` samples and returns one (oracle
pass@k, best-of-N by a scorer, majority vote) is an operator ``T_N`` on the policy: ``T_N[pi]`` is
the distribution of what it returns. Training for ``E_{y ~ T_N[pi]} r(y)`` instead of
``E_{y ~ pi} r(y)`` changes the per-prompt and per-sample weights of the policy gradient. The loss
forms here are a reconstruction consistent with the abstract (no code is public).

============================================= ==========================================================
:func:`passk_objective`, :func:`passk_weight` ``1-(1-p)^k`` and its derivative ``k(1-p)^(k-1)``
:func:`grpo_weight`                           GRPO's implicit per-prompt weight ``1/sqrt(p(1-p))``
:func:`bon_operator`                          the best-of-N output distribution (ties allowed)
:func:`compositions`                          every count vector of ``N`` votes over ``K`` answers
:func:`majority_operator`                     the distribution of the plurality answer (uniform ties)
:func:`maj_objective`, :func:`maj_partials`   maj@N and its partials ``N E f(N' + e_a)``
:func:`bon_marginals`                         unbiased per-sample weights of best-of-k (closed form)
:func:`majority_marginals`                    the same for majority vote (enumerated subsets)
estimators ``best_of_n``, ``maj_at_k``        registered; combine with every sampler, reward and loss
:func:`run_bandit_experiment`                 the exact contextual bandit (standard, GRPO, aligned)
:func:`run_lm_experiment`                     the tiny LM on addition: RLOO vs pass@k- and maj@k-aligned
============================================= ==========================================================

The pass@k weights of PKPO (Walder and Karkhanis, 2025) are
:func:`rlcourse.methods.poly_epo.pkpo_effective_rewards`, and set RL with ``f = max`` is the estimator ``set_max`` of the Poly-EPO
chapter; ``best_of_n`` is their closed form for real-valued rewards and any selector.
"""
from __future__ import annotations

import time
from functools import lru_cache
from math import comb, lgamma

import numpy as np
import torch

from ..advantages import outcome_scores, register_estimator
from ..metrics import best_of_k
from ..ops import as_index
from .poly_epo import marginal_advantage, normalise_groups, subsets

PAPER = ("Compute Aligned Training: Optimizing for Test Time Inference, A. Ousherovitch, A. Tewari "
         "(2026, arXiv:2604.24957)")
ABSTRACT_CLAIM = "this training method substantially improves test time scaling over standard training"
SELECTORS = ("reward", "confidence")
BASELINES = ("loo", "all", "none")


# ---------------------------------------------------------------------- operators for one prompt, exact
def passk_objective(p, k: int):
    """pass@k of ``k`` independent samples each right with probability ``p``: ``1 - (1 - p)^k``
    (numpy or torch, any shape)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return 1 - (1 - p) ** k


def passk_weight(p, k: int):
    """``d/dp [1 - (1-p)^k] = k (1-p)^(k-1)``: the weight pass@k training puts on ``grad p``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return k * (1 - p) ** (k - 1)


def grpo_weight(p):
    """GRPO's implicit weight on ``grad p``: with ``A = (r - p) / sqrt(p(1-p))`` the expected gradient
    is ``grad p / sqrt(p(1-p))`` (population standard deviation; ``p`` strictly inside (0, 1))."""
    return 1 / (p * (1 - p)) ** 0.5


def bon_operator(probs, scores, N: int) -> np.ndarray:
    """Best-of-N as an operator: the probability that ``y`` is returned when ``N`` iid draws are made
    and the highest-scoring one is kept (ties between outcomes of equal score: each in proportion to
    its probability), ``T_N[pi](y) = pi(y) (F(s)^N - F^-(s)^N) / (F(s) - F^-(s))``.

    ======= ======== ======================================================
    probs   ``(M,)`` the policy on a finite support (sums to 1)
    scores  ``(M,)`` the scorer's value of each outcome (ties allowed)
    returns          ``(M,)`` ``T_N[pi]``, a distribution
    ======= ======== ======================================================
    """
    probs, scores = np.asarray(probs, float), np.asarray(scores, float)
    if probs.shape != scores.shape or probs.ndim != 1:
        raise ValueError(f"probs {probs.shape} and scores {scores.shape} must be 1-D of the same length")
    if (probs < 0).any() or abs(probs.sum() - 1) > 1e-9:
        raise ValueError("probs must be non-negative and sum to 1")
    if N < 1:
        raise ValueError(f"N must be >= 1, got {N}")
    F = np.array([probs[scores <= s].sum() for s in scores])   # P(score <= s(y))
    Fm = np.array([probs[scores < s].sum() for s in scores])   # P(score <  s(y))
    level = F - Fm                                              # mass of y's score level
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(level > 0, probs * (F**N - Fm**N) / level, 0.0)
    return out


@lru_cache(maxsize=32)
def _compositions(N: int, K: int) -> np.ndarray:
    if K == 1:
        return np.array([[N]])
    rows = [np.concatenate([np.full((len(rest), 1), first), rest], 1)
            for first in range(N, -1, -1) for rest in [_compositions(N - first, K - 1)]]
    return np.concatenate(rows, 0)


def compositions(N: int, K: int) -> np.ndarray:
    """Every vector of ``K`` non-negative counts summing to ``N`` (``binom(N+K-1, K-1)`` rows).

    ======= ========== ==============================
    returns ``(C, K)`` int, one count vector per row
    ======= ========== ==============================
    """
    if N < 0 or K < 1 or comb(N + K - 1, K - 1) > 2_000_000:
        raise ValueError(f"need N >= 0, K >= 1 and at most 2e6 compositions, got N={N}, K={K}")
    return _compositions(N, K)


@lru_cache(maxsize=32)
def _vote_tables(N: int, K: int):
    n = compositions(N, K)
    log_coef = lgamma(N + 1) - np.array([sum(lgamma(c + 1) for c in row) for row in n])
    top = n.max(1, keepdims=True)
    win = (n == top).astype(float)
    credit = win / win.sum(1, keepdims=True)  # (C, K): share of the vote answer a wins (uniform ties)
    return (torch.tensor(n, dtype=torch.float64), torch.tensor(log_coef, dtype=torch.float64),
            torch.tensor(credit, dtype=torch.float64))


def _check_q(q: torch.Tensor) -> torch.Tensor:
    q = torch.as_tensor(q, dtype=torch.float64)
    if q.ndim not in (1, 2) or q.shape[-1] < 1:
        raise ValueError(f"q must be (K,) or (P, K) answer probabilities, got shape {tuple(q.shape)}")
    if (q < 0).any() or not torch.allclose(q.sum(-1), torch.ones((), dtype=q.dtype), atol=1e-8):
        raise ValueError("q must be non-negative and sum to 1 over the answers")
    return q


def _vote_probs(q: torch.Tensor, N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P, C)`` multinomial probabilities of every composition, and the ``(C, K)`` credit table."""
    n, log_coef, credit = _vote_tables(N, q.shape[-1])
    logq = torch.log(q.clamp_min(1e-300))
    return torch.exp(log_coef + logq @ n.T), credit


def majority_operator(q, N: int) -> torch.Tensor:
    """Majority vote as an operator: the distribution of the plurality answer of ``N`` iid draws from
    the answer distribution ``q`` (a tie is broken uniformly among the tied answers).

    ======= ========================= ===================================
    q       ``(K,)`` or ``(P, K)``     answer probabilities (rows sum to 1)
    returns same shape                 ``T_N[q](a)``, a distribution over answers
    ======= ========================= ===================================
    """
    q = _check_q(q)
    w, credit = _vote_probs(q.reshape(-1, q.shape[-1]), N)
    return (w @ credit).reshape(q.shape)


def maj_objective(q, correct, N: int) -> torch.Tensor:
    """maj@N: the probability that the correct answer wins the vote of ``N`` draws, differentiable in
    ``q`` (float64).

    ======= ============ =======================================
    q       ``(P, K)``    answer probabilities of ``P`` prompts
    correct ``(P,)``      index of each prompt's correct answer
    returns ``(P,)``      ``T_N[q](a*)``
    ======= ============ =======================================
    """
    q = torch.as_tensor(q, dtype=torch.float64)
    if q.ndim != 2:
        raise ValueError(f"q must be (P, K), got shape {tuple(q.shape)}")
    correct = torch.as_tensor(correct, dtype=torch.long).reshape(-1)
    if correct.shape[0] != q.shape[0] or (correct < 0).any() or (correct >= q.shape[1]).any():
        raise ValueError(f"correct must be (P,) = ({q.shape[0]},) indices into {q.shape[1]} answers")
    w, credit = _vote_probs(q, N)
    return (w * credit.T[correct]).sum(1)


def maj_partials(q, correct: int, N: int) -> np.ndarray:
    """The partials of maj@N in the answer probabilities (``q`` as free coordinates),
    ``dJ/dq_a = N E[f(N' + e_a)]`` with ``N' ~ Mult(N - 1, q)`` and ``f`` the correct answer's share
    of the vote. ``q`` ``(K,)``; returns ``(K,)``."""
    q = _check_q(q)
    if q.ndim != 1 or not 0 <= correct < q.shape[0]:
        raise ValueError(f"q must be (K,) and 0 <= correct < K, got {tuple(q.shape)}, {correct}")
    K = q.shape[0]
    if N == 1:
        return (np.arange(K) == correct).astype(float)
    w, _ = _vote_probs(q[None], N - 1)                     # (1, C') probabilities of N'
    n_prev = _vote_tables(N - 1, K)[0]
    out = np.zeros(K)
    for a in range(K):
        n = n_prev.clone()
        n[:, a] += 1
        top = n.max(1, keepdim=True).values
        win = (n == top).double()
        out[a] = N * float((w[0] * win[:, correct] / win.sum(1)).sum())
    return out


# ---------------------------------------------------------------------- unbiased per-sample weights from a group
def bon_marginals(rewards: torch.Tensor, selector: torch.Tensor, k: int) -> torch.Tensor:
    """Per-sample weight of best-of-k: for each sample ``i``, the mean over the ``k``-subsets of its
    group that contain ``i`` of the reward of the subset's highest-``selector`` member (ties by
    position, as :func:`rlcourse.metrics.best_of_k`). In closed form, with the group sorted by
    selector (position ``t`` of ``N``),
    ``m_t = [C(N-1-t, k-1) r_t + sum_{u<t} C(N-2-u, k-2) r_u] / C(N-1, k-1)``.
    With ``selector = rewards`` and 0/1 rewards this is pass@k (``k/N`` times PKPO's weights).

    ======== ========== ===================================
    rewards  ``(G, N)`` reward of each sample
    selector ``(G, N)`` the scorer the strategy ranks by
    returns  ``(G, N)`` ``m_i`` (float64)
    ======== ========== ===================================
    """
    if rewards.ndim != 2 or selector.shape != rewards.shape:
        raise ValueError(f"rewards and selector must be the same (G, N) shape, got {tuple(rewards.shape)}, "
                         f"{tuple(selector.shape)}")
    G, N = rewards.shape
    if not 1 <= k <= N:
        raise ValueError(f"need 1 <= k <= N = {N} (the group size), got k={k}")
    own = torch.tensor([comb(N - 1 - t, k - 1) for t in range(N)], dtype=torch.float64)
    above = torch.tensor([comb(N - 2 - u, k - 2) if k >= 2 and N - 2 - u >= 0 else 0 for u in range(N)],
                         dtype=torch.float64)
    out = torch.zeros(G, N, dtype=torch.float64)
    for g in range(G):
        order = np.argsort(-selector[g].double().numpy(), kind="stable")
        r = rewards[g].double()[torch.as_tensor(order)]
        prior = torch.cumsum(above * r, 0) - above * r          # sum over u < t
        out[g, torch.as_tensor(order)] = (own * r + prior) / comb(N - 1, k - 1)
    return out


def bon_loo_baseline(rewards: torch.Tensor, selector: torch.Tensor, k: int) -> torch.Tensor:
    """The best-of-k estimate from the *other* ``N - 1`` samples (:func:`rlcourse.metrics.best_of_k`):
    a baseline that does not depend on ``y_i``. ``(G, N) -> (G, N)``; needs ``k <= N - 1``."""
    G, N = rewards.shape
    if not 1 <= k <= N - 1:
        raise ValueError(f"the leave-one-out baseline needs k <= N - 1 = {N - 1}, got k={k}")
    out = torch.zeros(G, N, dtype=torch.float64)
    for g in range(G):
        r, s = rewards[g].double().numpy(), selector[g].double().numpy()
        for i in range(N):
            keep = np.arange(N) != i
            out[g, i] = best_of_k(s[keep], r[keep], k)
    return out


def final_answer(text: str) -> str:
    """The answer a vote counts: the text after the last ``|`` (the lab's scratchpad format), else the
    whole completion, with surrounding whitespace stripped (so ``" 42"`` and ``"42"`` vote together)."""
    if not isinstance(text, str):
        raise TypeError(f"a completion must be a string, got {type(text).__name__}")
    return text.rsplit("|", 1)[-1].strip()


def vote_values(rewards: torch.Tensor, codes: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    """The value of majority vote on each subset: the reward of the plurality answer (the mean reward
    of the subset's rows that give it; a tie averages over the tied answers).

    ======= ========== ==========================================
    rewards ``(G, N)`` reward of each sample
    codes   ``(G, N)`` long answer code of each sample (equal = same answer)
    members ``(C, k)`` the subsets
    returns ``(G, C)`` ``f(S)``
    ======= ========== ==========================================
    """
    if codes.shape != rewards.shape or rewards.ndim != 2:
        raise ValueError(f"rewards and codes must be the same (G, N) shape, got {tuple(rewards.shape)}, "
                         f"{tuple(codes.shape)}")
    A = int(codes.max()) + 1
    onehot = torch.nn.functional.one_hot(codes.long(), A).double()        # (G, N, A)
    counts = onehot[:, members].sum(2)                                    # (G, C, A)
    rsum = (onehot * rewards.double()[..., None])[:, members].sum(2)      # (G, C, A)
    win = (counts == counts.max(-1, keepdim=True).values) & (counts > 0)
    value = torch.where(win, rsum / counts.clamp_min(1), torch.zeros_like(rsum))
    return value.sum(-1) / win.sum(-1)


def majority_marginals(rewards: torch.Tensor, codes: torch.Tensor, k: int, baseline: str = "loo",
                       max_subsets: int = 20_000) -> torch.Tensor:
    """Set-RL advantages of majority vote over ``k`` samples (the objective ``f`` = :func:`vote_values`),
    exact over all ``binom(N, k)`` subsets through :func:`rlcourse.methods.poly_epo.marginal_advantage`.
    ``baseline="none"`` returns the marginals ``m_i`` themselves. ``(G, N) -> (G, N)`` float64."""
    G, N = rewards.shape
    if not 1 <= k <= N or (baseline == "loo" and k >= N):
        raise ValueError(f"majority vote over k={k} of a group of N={N} needs 1 <= k <= N (k < N for the "
                         "'loo' baseline)")
    if comb(N, k) > max_subsets:
        raise ValueError(f"maj_at_k enumerates binom({N}, {k}) = {comb(N, k)} subsets, more than max_subsets="
                         f"{max_subsets}; use a smaller subset_size or raise max_subsets")
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    members = subsets(N, k)
    values = vote_values(rewards, codes, members)
    if baseline == "none":
        inside = torch.zeros(len(members), N, dtype=torch.float64).scatter_(1, members, 1.0)
        return values @ inside / comb(N - 1, k - 1)
    return marginal_advantage(values, members, N, baseline)


# ---------------------------------------------------------------------- the registered estimators
def _groups(index: torch.Tensor) -> list[torch.Tensor]:
    return [(index == g).nonzero().squeeze(-1) for g in torch.unique(index)]


def _group_size_k(rows: torch.Tensor, subset_size, index, baseline) -> int:
    N = len(rows)
    k = subset_size if subset_size is not None else max(1, N // 2)
    if N < 2 or not 1 <= k <= N or (baseline == "loo" and k >= N):
        raise ValueError(f"group {int(index[rows[0]])} has {N} samples; the aligned estimators need "
                         f"num_generations >= 2 and 1 <= subset_size < num_generations (the leave-one-out "
                         f"baseline), got subset_size={k}")
    return k


@register_estimator("best_of_n")
def compute_best_of_n_advantage(token_level_rewards, response_mask, index, batch=None, subset_size=None,
                                selector: str = "reward", baseline: str = "loo", normalize: bool = False,
                                epsilon: float = 1e-6):
    """Best-of-k-aligned advantage (pass@k when the selector is the 0/1 reward): ``A_i = m_i - b_i`` with
    :func:`bon_marginals` and the leave-one-out best-of-k of the others (:func:`bon_loo_baseline`).

    =================== ========= ===============================================
    token_level_rewards ``(B,T)`` reward on the last valid token
    response_mask       ``(B,T)`` 1 up to and including EOS
    index               ``(B,)``  group id; each group holds one prompt's N samples
    batch                         the rollout (its ``logprobs`` for ``selector="confidence"``)
    returns                       ``(adv, ret)``, both ``(B,T)``
    =================== ========= ===============================================

    ``subset_size`` k defaults to ``N // 2``; k = 1 gives RLOO exactly. ``selector``: ``"reward"`` (an
    oracle verifier: pass@k / max of k rewards) or ``"confidence"`` (the mean token log-probability:
    best-of-N by the model's own confidence). ``baseline``: ``"loo"`` (unbiased), ``"all"`` (the
    group's own best-of-k estimate) or ``"none"``. ``normalize`` divides by the group's std: with 0/1
    rewards that turns every pass@k advantage into GRPO's (see the chapter), so it is off by default.
    """
    if selector not in SELECTORS or baseline not in BASELINES:
        raise ValueError(f"selector must be one of {SELECTORS} and baseline one of {BASELINES}, got "
                         f"{selector!r}, {baseline!r}")
    scores = outcome_scores(token_level_rewards, response_mask)
    index = as_index(index, len(scores))
    if selector == "confidence":
        if batch is None or getattr(batch, "logprobs", None) is None:
            raise ValueError("selector='confidence' ranks by the rollout's log-probabilities: pass batch")
        sel_all = (batch.logprobs * response_mask).sum(-1) / response_mask.sum(-1).clamp(min=1)
    else:
        sel_all = scores
    adv = torch.zeros(len(scores), dtype=torch.float64)
    for rows in _groups(index):
        k = _group_size_k(rows, subset_size, index, baseline)
        r, s = scores[rows][None], sel_all[rows].detach()[None]
        m = bon_marginals(r, s, k)
        if baseline == "loo":
            m = m - bon_loo_baseline(r, s, k)
        elif baseline == "all":
            m = m - m.mean(1, keepdim=True)
        adv[rows] = normalise_groups(m, epsilon)[0] if normalize else m[0]
    return adv.float()[:, None] * response_mask, scores.float()[:, None] * response_mask


@register_estimator("maj_at_k")
def compute_maj_at_k_advantage(token_level_rewards, response_mask, index, batch, subset_size=None,
                               baseline: str = "loo", normalize: bool = False, epsilon: float = 1e-6,
                               max_subsets: int = 20_000):
    """Majority-vote-aligned advantage: set RL with ``f(S)`` = the reward of the plurality answer of
    ``S`` (:func:`vote_values`), answers read by :func:`final_answer` from ``batch.texts``.

    =================== ========= ===============================================
    token_level_rewards ``(B,T)`` reward on the last valid token
    response_mask       ``(B,T)`` 1 up to and including EOS
    index               ``(B,)``  group id; each group holds one prompt's N samples
    batch                         the rollout (its ``texts``)
    returns                       ``(adv, ret)``, both ``(B,T)``
    =================== ========= ===============================================

    ``subset_size`` k defaults to ``N // 2``; ``baseline`` ``"loo"`` (unbiased) or ``"all"``
    (:func:`rlcourse.methods.poly_epo.marginal_advantage`), or ``"none"``.
    """
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    texts = getattr(batch, "texts", None)
    scores = outcome_scores(token_level_rewards, response_mask)
    if texts is None or len(texts) != len(scores):
        raise ValueError(f"maj_at_k votes over batch.texts: need {len(scores)} texts, got "
                         f"{None if texts is None else len(texts)}")
    index = as_index(index, len(scores))
    adv = torch.zeros(len(scores), dtype=torch.float64)
    for rows in _groups(index):
        k = _group_size_k(rows, subset_size, index, baseline)
        answers = [final_answer(texts[i]) for i in rows.tolist()]
        lookup = {a: j for j, a in enumerate(dict.fromkeys(answers))}
        codes = torch.tensor([[lookup[a] for a in answers]])
        m = majority_marginals(scores[rows][None], codes, k, baseline, max_subsets)
        adv[rows] = normalise_groups(m, epsilon)[0] if normalize else m[0]
    return adv.float()[:, None] * response_mask, scores.float()[:, None] * response_mask


# ---------------------------------------------------------------------- the experiment, in rlcourse.studies.compute_aligned
_STUDY_NAMES = frozenset((
    'BANDIT_ARMS', 'BUDGETS', 'BanditConfig', 'LM_ARMS', 'LM_CONTROL_KEY', 'MAJ_KS', 'PASS_KS',
    '_bandit_setting', '_lm_setting', 'bandit_claims', 'bandit_metrics', 'bandit_objective',
    'bandit_verdicts', 'lm_claims', 'lm_control_claim', 'lm_control_verdict', 'lm_sizes', 'lm_verdicts',
    'make_bandit', 'run_bandit_experiment', 'run_budget_sweep', 'run_lm_control', 'run_lm_experiment',
    'select_hard', 'train_bandit',
))


def __getattr__(name):
    """The chapter's experiment lives in :mod:`rlcourse.studies.compute_aligned`; its names stay importable here."""
    if name in _STUDY_NAMES:
        from ..studies import compute_aligned as study

        return getattr(study, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
