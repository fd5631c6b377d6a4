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

import copy
import time
from dataclasses import dataclass, replace
from functools import lru_cache
from math import comb, lgamma

import numpy as np
import torch

from ..advantages import outcome_scores, register_estimator
from ..claims import Claim, Verdict, evaluate
from ..metrics import best_of_k
from ..ops import as_index
from ..profiles import Profile, one_torch_thread
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


# ---------------------------------------------------------------------- experiment 1: the exact contextual bandit
@dataclass(frozen=True)
class BanditConfig:
    """A contextual bandit: ``prompts`` prompts, each with ``answers`` answers of which one is correct;
    a tabular softmax policy. The correct answer's starting logit is offset by ``U(low, high)``, so
    difficulty ranges from nearly hopeless to nearly solved; wrong logits are ``N(0, 1)``."""

    prompts: int = 200
    answers: int = 6
    low: float = -3.5
    high: float = 1.5
    k: int = 8
    steps: int = 150
    budget: float = 30.0  # total path length of the logit table (steps of length budget / steps)
    every: int = 10

    @property
    def lr(self) -> float:
        """The length of one normalised step."""
        return self.budget / self.steps


BANDIT_ARMS = ("standard", "grpo", "pass@k", "maj@k")
PASS_KS = (1, 2, 4, 8, 16, 32, 64)
MAJ_KS = (1, 3, 5, 8, 9)


def make_bandit(cfg: BanditConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits (P, K) float64, correct (P,) long)`` of one random bandit."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(cfg.prompts, cfg.answers))
    correct = rng.integers(cfg.answers, size=cfg.prompts)
    logits[np.arange(cfg.prompts), correct] = logits.max(1) + rng.uniform(cfg.low, cfg.high, size=cfg.prompts)
    return torch.tensor(logits), torch.tensor(correct)


def bandit_objective(arm: str, logits: torch.Tensor, correct: torch.Tensor, k: int) -> torch.Tensor:
    """The objective whose gradient each arm follows (mean over prompts): ``standard`` p (REINFORCE's
    expected gradient), ``grpo`` a surrogate whose gradient is ``grad p / sqrt(p(1-p))``, ``pass@k``
    ``1-(1-p)^k``, ``maj@k`` maj@k of the answer distribution."""
    q = torch.softmax(logits, -1)
    p = q.gather(1, correct[:, None]).squeeze(1)
    if arm == "standard":
        return p.mean()
    if arm == "grpo":
        return (p * grpo_weight(p.detach())).mean()
    if arm == "pass@k":
        return passk_objective(p, k).mean()
    if arm == "maj@k":
        return maj_objective(q, correct, k).mean()
    raise ValueError(f"arm must be one of {BANDIT_ARMS}, got {arm!r}")


def bandit_metrics(logits: torch.Tensor, correct: torch.Tensor, pass_ks=PASS_KS, maj_ks=MAJ_KS) -> dict:
    """Exact ``pass`` ``(len(pass_ks),)`` and ``maj`` ``(len(maj_ks),)`` curves (means over prompts) and
    the per-prompt success probabilities ``p``."""
    with torch.no_grad():
        q = torch.softmax(logits, -1)
        p = q.gather(1, correct[:, None]).squeeze(1)
        return {"pass": np.array([float(passk_objective(p, k).mean()) for k in pass_ks]),
                "maj": np.array([float(maj_objective(q, correct, k).mean()) for k in maj_ks]),
                "p": p.numpy().copy()}


def train_bandit(arm: str, cfg: BanditConfig, seed: int) -> dict:
    """Normalised gradient ascent (every arm moves the table by the same length ``cfg.lr`` per step, so
    arms differ in direction only). Returns ``start``/``final`` :func:`bandit_metrics`, the curves of
    pass@1, pass@k and maj@k every ``cfg.every`` steps, and ``steps``."""
    logits, correct = make_bandit(cfg, seed)
    start = bandit_metrics(logits, correct)
    z = logits.clone().requires_grad_(True)
    curve = []
    for t in range(cfg.steps + 1):
        if t % cfg.every == 0:
            with torch.no_grad():
                q = torch.softmax(z, -1)
                p = q.gather(1, correct[:, None]).squeeze(1)
                curve.append((t, float(p.mean()), float(passk_objective(p, cfg.k).mean()),
                              float(maj_objective(q, correct, cfg.k).mean())))
        if t == cfg.steps:
            break
        J = bandit_objective(arm, z, correct, cfg.k)
        (g,) = torch.autograd.grad(J, z)
        with torch.no_grad():
            z += cfg.lr * g / g.norm().clamp_min(1e-30)
    return {"start": start, "final": bandit_metrics(z.detach(), correct), "curve": np.array(curve)}


def run_bandit_experiment(P: Profile, cfg: BanditConfig | None = None, seeds: int | None = None) -> dict:
    """Every arm of :data:`BANDIT_ARMS` on ``P.toy_seeds`` random bandits (paired: seed = bandit).
    Returns ``runs[arm]`` (lists of :func:`train_bandit` outputs), ``cfg``, ``seeds``, ``seconds``."""
    cfg = cfg or BanditConfig(steps=P.pick(smoke=30, book=150))
    n, t0 = seeds or P.toy_seeds, time.perf_counter()
    with one_torch_thread():
        runs = {arm: [train_bandit(arm, cfg, s) for s in range(n)] for arm in BANDIT_ARMS}
    return {"runs": runs, "cfg": cfg, "seeds": n, "seconds": time.perf_counter() - t0}


BUDGETS = (7.5, 15.0, 30.0, 60.0)


def run_budget_sweep(P: Profile, budgets=BUDGETS, seeds: int | None = None) -> dict:
    """:func:`run_bandit_experiment` at each training budget (total path length). Returns
    ``{budget: output}`` and ``seconds``."""
    t0 = time.perf_counter()
    steps = P.pick(smoke=30, book=150)
    out = {b: run_bandit_experiment(P, BanditConfig(steps=steps, budget=b), seeds) for b in budgets}
    return {"by_budget": out, "seconds": time.perf_counter() - t0}


def _bandit_setting(cfg: BanditConfig) -> str:
    return (f"exact contextual bandit: {cfg.prompts} prompts x {cfg.answers} answers, tabular softmax, correct "
            f"logit offset U({cfg.low}, {cfg.high}) from the best wrong one; {cfg.steps} normalised exact-gradient "
            f"steps, total path length {cfg.budget:g}; train-time k = {cfg.k}; exact pass@k and maj@k")


def bandit_claims(cfg: BanditConfig) -> dict[str, Claim]:
    common = dict(paper=PAPER, setting=_bandit_setting(cfg), margin=0.0, paper_number="not given in the abstract")
    k = cfg.k
    return {
        "pass": Claim(key="compute_aligned/bandit-passk", statement=ABSTRACT_CLAIM + f" (here: pass@{k}; a "
                      "mechanism check: the aligned arm ascends the exact pass@k it is scored on, so its win is "
                      "close to guaranteed)", source="abstract", metric=f"exact pass@{k}, mean over prompts",
                      method=f"pass@{k}-aligned", baseline="standard", kind="greater", role="course hypothesis",
                      **common),
        "maj": Claim(key="compute_aligned/bandit-majk", statement=ABSTRACT_CLAIM + f" (here: maj@{k})",
                     source="abstract", metric=f"exact maj@{k}, mean over prompts", method=f"maj@{k}-aligned",
                     baseline="standard", kind="greater", **common),
        "tradeoff": Claim(key="compute_aligned/bandit-pass1-tradeoff",
                          statement="(our expectation, not the abstract's) training for pass@k gives up some "
                                    "pass@1: the standard objective ends higher at k = 1",
                          source="ours; the abstract does not discuss k = 1",
                          metric="exact pass@1, mean over prompts", method="standard", baseline=f"pass@{k}-aligned",
                          kind="greater", **common),
        "control": Claim(key="compute_aligned/bandit-control", role="positive control",
                         statement=f"positive control: pass@{k}-aligned training raises pass@{k} above its start "
                                   "(the budget is large enough to move the metric the claim is about)",
                         source="this chapter", metric=f"exact pass@{k}, mean over prompts",
                         method=f"pass@{k}-aligned (final)", baseline="the same bandit at the start",
                         kind="greater", **common),
    }


def bandit_verdicts(out: dict) -> dict[str, Verdict]:
    cfg, runs, s = out["cfg"], out["runs"], out["seconds"]
    c = bandit_claims(cfg)
    ik, i1, jm = PASS_KS.index(cfg.k), PASS_KS.index(1), MAJ_KS.index(cfg.k)
    get = lambda arm, key, i, when="final": [r[when][key][i] for r in runs[arm]]  # noqa: E731
    return {"pass": evaluate(c["pass"], get("pass@k", "pass", ik), get("standard", "pass", ik), seconds=s),
            "maj": evaluate(c["maj"], get("maj@k", "maj", jm), get("standard", "maj", jm), seconds=s),
            "tradeoff": evaluate(c["tradeoff"], get("standard", "pass", i1), get("pass@k", "pass", i1), seconds=s),
            "control": evaluate(c["control"], get("pass@k", "pass", ik), get("pass@k", "pass", ik, "start"),
                                seconds=s)}


# ---------------------------------------------------------------------- experiment 2: the tiny LM on addition
LM_ARMS = {"standard (RLOO)": dict(advantage_estimator="best_of_n", advantage_kwargs={"subset_size": 1}),
           "pass@k-aligned": dict(advantage_estimator="best_of_n"),
           "maj@k-aligned": dict(advantage_estimator="maj_at_k")}


def lm_sizes(P: Profile) -> dict:
    """The LM experiment's sizes for a profile."""
    return P.pick(smoke=dict(steps=2, prompts_per_step=2, G=4, k=2, eval_prompts=8, n=8, seeds=1,
                             pass_ks=(1, 2, 4, 8), maj_ks=(1, 3, 8)),
                  book=dict(steps=40, prompts_per_step=8, G=8, k=4, eval_prompts=64, n=16, seeds=P.seeds,
                            pass_ks=(1, 2, 4, 8, 16), maj_ks=(1, 3, 5, 9, 16)))


def run_lm_experiment(P: Profile, lr: float = 1e-4, strength: str = "weak", arms=None, seeds: int | None = None,
                      prompts_per_step: int | None = None) -> dict:
    """RLOO (``best_of_n`` with k = 1, the standard objective) against the pass@k- and maj@k-aligned
    estimators (train-time k = ``lm_sizes(P)['k']``) on the lab's medium addition model, AdamW at
    ``lr``, one run per seed; pass@k and maj@k of each final model on held-out prompts
    (:func:`rlcourse.testtime.evaluate_samples`, unbiased curves). Returns ``curves[arm]`` (per seed,
    dicts with ``pass`` and ``maj``), ``base`` (the base model's), ``sizes``, ``seconds``. ``arms`` (names
    of :data:`LM_ARMS`), ``seeds`` and ``prompts_per_step`` override the profile's choice."""
    from ..lm import load_base_model
    from ..tasks import get_task
    from ..testtime import evaluate_samples, maj_at_k_curve, pass_at_k_curve
    from ..train import RLConfig, Trainer

    sz, t0 = lm_sizes(P), time.perf_counter()
    sz.update({k: v for k, v in (("seeds", seeds), ("prompts_per_step", prompts_per_step)) if v is not None})
    arms = list(LM_ARMS) if arms is None else list(arms)
    if not set(arms) <= set(LM_ARMS):
        raise ValueError(f"unknown arms {sorted(set(arms) - set(LM_ARMS))}; choose from {list(LM_ARMS)}")
    task = get_task("addition")
    held = task.examples(sz["eval_prompts"], seed=2000, split="test")
    refs = [int(e.answer) for e in held]

    def curves(model, seed):
        ev = evaluate_samples(model, tok, held, sz["n"], 10, torch.Generator().manual_seed(seed))
        return {"pass": pass_at_k_curve(ev["correct"], sz["pass_ks"]),
                "maj": maj_at_k_curve(ev["answers"], refs, sz["maj_ks"], max_subsets=200, seed=seed)}

    out = {"curves": {}, "reward": {}}
    with one_torch_thread():
        base, tok = load_base_model("addition", strength, prof=P, progress=False)
        out["base"] = curves(base, 0)
        for arm in arms:
            parts, cs, rew = LM_ARMS[arm], [], []
            for seed in range(sz["seeds"]):
                kw = {"subset_size": sz["k"], **parts.get("advantage_kwargs", {})}
                cfg = RLConfig(num_generations=sz["G"], prompts_per_step=sz["prompts_per_step"], steps=sz["steps"],
                               learning_rate=lr, max_completion_length=10, seed=seed, progress=False,
                               advantage_estimator=parts["advantage_estimator"], advantage_kwargs=kw)
                torch.manual_seed(seed)
                trainer = Trainer(copy.deepcopy(base), tok, task, cfg, eval_examples=held[:4])
                trainer.train()
                rew.append([h["reward"] for h in trainer.history])
                cs.append(curves(trainer.model, 1 + seed))
            out["curves"][arm], out["reward"][arm] = cs, np.array(rew)
    out.update(sizes=sz, lr=lr, seconds=time.perf_counter() - t0)
    return out


def _lm_setting(sz: dict, lr: float) -> str:
    return (f"tiny Llama on 2-digit addition (the lab's medium base), {sz['steps']} steps of {sz['prompts_per_step']} "
            f"prompts x {sz['G']} samples, AdamW lr {lr:g}, train-time k = {sz['k']}; {sz['eval_prompts']} held-out "
            f"prompts x {sz['n']} samples at T = 1, unbiased pass@k and maj@k")


def lm_claims(sz: dict, lr: float) -> dict[str, Claim]:
    common = dict(paper=PAPER, setting=_lm_setting(sz, lr), margin=0.0, paper_number="not given in the abstract",
                  source="abstract")
    K, M = max(sz["pass_ks"]), max(sz["maj_ks"])
    return {
        "pass": Claim(key="compute_aligned/lm-passk", statement=ABSTRACT_CLAIM + f" (here: pass@{K})",
                      metric=f"pass@{K} on held-out prompts", method="pass@k-aligned", baseline="standard (RLOO)",
                      kind="greater", **common),
        "maj": Claim(key="compute_aligned/lm-majk", statement=ABSTRACT_CLAIM + f" (here: maj@{M})",
                     metric=f"maj@{M} on held-out prompts", method="maj@k-aligned", baseline="standard (RLOO)",
                     kind="greater", **common),
        "control": Claim(key="compute_aligned/lm-control", role="positive control",
                         statement="control: standard training raises pass@1 above the base model (the run moves "
                                   "the policy)", metric="pass@1 on held-out prompts", method="standard (RLOO)",
                         baseline=None, reference=0.0, kind="greater",
                         **{**common, "source": "this chapter"}),
    }


def lm_verdicts(out: dict, control: Verdict | None = None) -> dict[str, Verdict]:
    """The LM claims; ``control`` (the verdict of :func:`lm_control_verdict`), when given, gates the
    pass@k claim: uninformative unless the control showed the comparison can register a difference."""
    sz, s = out["sizes"], out["seconds"]
    c = lm_claims(sz, out["lr"])
    if control is not None:
        c["pass"] = replace(c["pass"], control=LM_CONTROL_KEY)
    get = lambda arm, key, i: [cv[key][i] for cv in out["curves"][arm]]  # noqa: E731
    moved = replace(c["control"], reference=float(out["base"]["pass"][0]))
    return {"pass": evaluate(c["pass"], get("pass@k-aligned", "pass", -1), get("standard (RLOO)", "pass", -1),
                             seconds=s, control=control),
            "maj": evaluate(c["maj"], get("maj@k-aligned", "maj", -1), get("standard (RLOO)", "maj", -1), seconds=s),
            "control": evaluate(moved, get("standard (RLOO)", "pass", 0), seconds=s)}


# ---------------------------------------------------------------------- an LM control that can show a difference
def select_hard(correct, hi: float = 0.25) -> np.ndarray:
    """Indices of the prompts whose estimated pass rate ``p`` lies in ``(0, hi]``: solvable, but rarely.

    ======= ========== =============================================
    correct ``(P, n)`` 0/1 outcomes of ``n`` samples of each prompt
    return  ``(H,)``   the kept prompts' indices, in order
    ======= ========== =============================================

    On such prompts the pass@k weight ``k (1 - p)^(k - 1)`` is near its largest, ``k``, while the
    standard objective's weight is 1, so an aligned and a standard run should differ most there.
    """
    c = np.asarray(correct, dtype=float)
    if c.ndim != 2 or c.shape[1] < 1:
        raise ValueError(f"correct must be (prompts, samples), got shape {c.shape}")
    if not 0 < hi < 1:
        raise ValueError(f"hi must lie in (0, 1), got {hi}")
    p = c.mean(1)
    return np.flatnonzero((p > 0) & (p <= hi))


def run_lm_control(P: Profile, lr: float = 1e-4, strength: str = "weak", seeds: int | None = None,
                   candidates: int | None = None, hi: float = 0.25) -> dict:
    """The LM positive control for the aligned-vs-standard comparison: train and evaluate on *hard*
    prompts only (:func:`select_hard`, the base model's pass rate in ``(0, hi]`` from 16 samples), with
    train-time k equal to the evaluated k, RLOO against the pass@k-aligned estimator. Returns
    ``pass[arm]`` (per seed, pass@k at the train-time k on the hard held-out prompts), the numbers of
    hard prompts, ``sizes`` and ``seconds``."""
    from ..lm import load_base_model
    from ..tasks import get_task
    from ..testtime import evaluate_samples, pass_at_k_curve
    from ..train import RLConfig, Trainer

    sz, t0 = lm_sizes(P), time.perf_counter()
    n_seeds = sz["seeds"] if seeds is None else seeds
    cand = P.pick(smoke=16, book=256) if candidates is None else candidates
    task = get_task("addition")
    arms = ("standard (RLOO)", "pass@k-aligned")
    out = {"pass": {a: [] for a in arms}}
    with one_torch_thread():
        base, tok = load_base_model("addition", strength, prof=P, progress=False)
        pools = {}
        for split, seed in (("train", 3000), ("test", 2000)):
            ex = task.examples(cand, seed=seed, split=split)
            ev = evaluate_samples(base, tok, ex, 16, 10, torch.Generator().manual_seed(seed))
            keep = select_hard(ev["correct"], hi)
            pools[split] = [ex[int(i)] for i in keep] or ex[:2]  # (smoke: a tiny base may solve none)
        held = pools["test"]
        for arm in arms:
            parts = LM_ARMS[arm]
            for seed in range(n_seeds):
                kw = {"subset_size": sz["k"], **parts.get("advantage_kwargs", {})}
                cfg = RLConfig(num_generations=sz["G"], prompts_per_step=sz["prompts_per_step"], steps=sz["steps"],
                               learning_rate=lr, max_completion_length=10, seed=seed, progress=False,
                               advantage_estimator=parts["advantage_estimator"], advantage_kwargs=kw)
                torch.manual_seed(seed)
                trainer = Trainer(copy.deepcopy(base), tok, task, cfg, train_examples=pools["train"],
                                  eval_examples=held[:4])
                trainer.train()
                ev = evaluate_samples(trainer.model, tok, held, sz["n"], 10, torch.Generator().manual_seed(1 + seed))
                out["pass"][arm].append(float(pass_at_k_curve(ev["correct"], (sz["k"],))[0]))
    out.update(hard={s: len(v) for s, v in pools.items()}, sizes=sz, lr=lr, seconds=time.perf_counter() - t0)
    return out


LM_CONTROL_KEY = "compute_aligned/lm-control-aligned-differs"


def lm_control_claim(sz: dict, lr: float) -> Claim:
    """The positive control of :func:`run_lm_control`: the comparison can register an aligned-vs-standard
    difference where the objectives differ most."""
    return Claim(key=LM_CONTROL_KEY, role="positive control", paper=PAPER, source="this chapter",
                 statement=f"on hard prompts (base pass rate at most 0.25) with train-time k = evaluated k = "
                           f"{sz['k']}, pass@k-aligned training ends with a higher pass@{sz['k']} than RLOO: the LM "
                           "comparison can show a difference where the two objectives' weights differ most",
                 setting=_lm_setting(sz, lr) + "; training and held-out prompts restricted to the hard ones",
                 metric=f"pass@{sz['k']} on hard held-out prompts", method="pass@k-aligned",
                 baseline="standard (RLOO)", kind="greater", margin=0.0)


def lm_control_verdict(out: dict) -> Verdict:
    """:func:`lm_control_claim` evaluated on :func:`run_lm_control`'s output."""
    c = lm_control_claim(out["sizes"], out["lr"])
    return evaluate(c, out["pass"]["pass@k-aligned"], out["pass"]["standard (RLOO)"], seconds=out["seconds"])
