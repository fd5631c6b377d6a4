"""Poly-EPO: set-level RL, in which a response's advantage is its marginal value to the sets it joins.

*Training Exploratory Reasoning Models* (Polychromic Exploratory Policy Optimization, Poly-EPO),
Ifdita Hasan Orney, Jubayer Ibn Hamid, Shreya S Ramanujam, Shirley Wu, Hengyuan Hu, Noah Goodman,
Dorsa Sadigh, Chelsea Finn (2026, arXiv:2604.17654); predecessor *Polychromic Objectives for
Reinforcement Learning* (arXiv:2509.25424). Set RL scores *sets* of ``n`` responses with an objective
``f(S)``; from ``N > n`` samples of a prompt, the advantage of sample ``i`` is the mean of ``f`` over
the subsets that contain it minus a baseline (the mean over all subsets, or over those without it).
Only the advantage changes, so any policy loss of the loop takes it as it takes GRPO's.

The polychromic objective used here, ``f(S) = mean_{y in S} r(y) * d(S)`` with ``d`` the share of
distinct strategies in ``S``, is a reconstruction consistent with the abstracts, not the paper's
equation (no code is public).

==================================== ===========================================================
:func:`subsets`                      every ``n``-subset of ``range(N)``, ``(C, n)``
:func:`set_objective`                ``f`` on each subset of each group: mean, max, poly, additive
:func:`marginal_advantage`           ``mean_{S ni i} f - baseline`` from the subsets' values
:func:`sampled_marginal_advantage`   the same from random subsets (unbiased, for large ``N``)
:func:`set_advantage`                rewards + strategies -> ``(G, N)`` set advantages
:func:`pkpo_effective_rewards`       the pass@k weights of PKPO, closed form
:func:`countdown_strategy`           the strategy of a countdown response: its operator sequence
estimators ``poly_epo``, ``set_max`` registered; combine with every sampler and loss
==================================== ===========================================================

The chapter's experiments (a multi-strategy bandit and the tiny LM on countdown) are in
:mod:`rlcourse.studies.poly_epo`.
"""
from __future__ import annotations

import itertools
import re
from functools import lru_cache
from math import comb

import torch

from ..advantages import outcome_scores, register_estimator
from ..metrics import pass_at_k
from ..ops import as_index

PAPER = ("Training Exploratory Reasoning Models (Poly-EPO), I. H. Orney, J. I. Hamid, S. S. Ramanujam, S. Wu, "
         "H. Hu, N. Goodman, D. Sadigh, C. Finn (2026, arXiv:2604.17654)")
OBJECTIVES = ("mean", "max", "poly", "additive")
BASELINES = ("all", "loo")


# ---------------------------------------------------------------------- set objectives and advantages
@lru_cache(maxsize=64)
def _subsets(N: int, n: int) -> torch.Tensor:
    return torch.tensor(list(itertools.combinations(range(N), n)), dtype=torch.long).reshape(-1, n)


@lru_cache(maxsize=64)
def _membership(N: int, n: int) -> torch.Tensor:
    """``(C, N)`` float64: 1 where subset ``c`` (of :func:`subsets`) contains ``i``."""
    return torch.zeros(comb(N, n), N, dtype=torch.float64).scatter_(1, _subsets(N, n), 1.0)


def subsets(N: int, n: int) -> torch.Tensor:
    """Every ``n``-subset of ``range(N)``, in lexicographic order.

    ======= ========== ====================================
    returns ``(C, n)`` ``C = binom(N, n)`` rows of indices
    ======= ========== ====================================
    """
    if not (isinstance(N, int) and isinstance(n, int) and 1 <= n <= N):
        raise ValueError(f"need integers 1 <= n <= N, got N={N!r}, n={n!r}")
    return _subsets(N, n)


def distinct_share(codes: torch.Tensor) -> torch.Tensor:
    """Share of distinct values along the last axis: ``#distinct / n``, in ``[1/n, 1]``.

    ======= ============ =======================================
    codes   ``(..., n)`` integer strategy codes of a set's members
    returns ``(...)``    distinct count divided by ``n``
    ======= ============ =======================================
    """
    s = codes.sort(-1).values
    distinct = 1 + (s[..., 1:] != s[..., :-1]).sum(-1)
    return distinct.double() / codes.shape[-1]


def set_objective(rewards: torch.Tensor, strategies: torch.Tensor | None, members: torch.Tensor,
                  objective: str = "poly", lam: float = 0.5) -> torch.Tensor:
    """The set objective ``f`` of each subset of each group.

    =========== ========== ======================================================
    rewards     ``(G, N)`` reward of each sample (G groups of N samples)
    strategies  ``(G, N)`` integer strategy code of each sample (for poly/additive)
    members     ``(C, n)`` the subsets (rows of :func:`subsets`, or random ones)
    returns     ``(G, C)`` ``f(S)`` for each group and subset
    =========== ========== ======================================================

    ``mean``: ``mean r`` (standard RL); ``max``: ``max r`` (pass@n); ``poly``: ``mean r * d(S)``
    (polychromic, multiplicative); ``additive``: ``mean r + lam * d(S)`` (a diversity bonus), with
    ``d`` the :func:`distinct_share` of the members' strategies.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if rewards.ndim != 2 or members.ndim != 2:
        raise ValueError(f"rewards must be (G, N) and members (C, n), got {tuple(rewards.shape)}, {tuple(members.shape)}")
    r = rewards.double()[:, members]  # (G, C, n)
    if objective == "mean":
        return r.mean(-1)
    if objective == "max":
        return r.max(-1).values
    if strategies is None or strategies.shape != rewards.shape:
        raise ValueError(f"objective {objective!r} needs strategies shaped like rewards {tuple(rewards.shape)}, "
                         f"got {None if strategies is None else tuple(strategies.shape)}")
    d = distinct_share(strategies[:, members])
    return r.mean(-1) * d if objective == "poly" else r.mean(-1) + lam * d


def marginal_advantage(values: torch.Tensor, members: torch.Tensor, N: int, baseline: str = "all") -> torch.Tensor:
    """Set-RL advantage from the values of *all* ``binom(N, n)`` subsets.

    ======== ========== ===========================================
    values   ``(G, C)`` ``f(S)`` on every subset (:func:`subsets` order)
    members  ``(C, n)`` those subsets
    returns  ``(G, N)`` ``A_i = mean_{S ni i} f(S) - b_i``
    ======== ========== ===========================================

    ``baseline="all"``: ``b_i = mean_S f(S)`` (the authors' verbal definition); ``"loo"``:
    ``b_i = mean_{S not ni i} f(S)``, which does not depend on ``y_i`` (unbiased). The two are
    proportional: ``A_all = (N - n) / N * A_loo``.
    """
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    C, n = members.shape
    if values.ndim != 2 or values.shape[1] != C or C != comb(N, n):
        raise ValueError(f"values {tuple(values.shape)} must be (G, binom({N}, {n}) = {comb(N, n)}) over all subsets")
    if baseline == "loo" and n >= N:
        raise ValueError(f"the leave-one-out baseline needs subsets without i: n = {n} must be < N = {N}")
    inside = _membership(N, n) if members is _subsets(N, n) else \
        torch.zeros(C, N, dtype=torch.float64).scatter_(1, members, 1.0)  # (C, N) membership
    v = values.double()
    with_i = v @ inside / comb(N - 1, n - 1)
    if baseline == "all":
        return with_i - v.mean(1, keepdim=True)
    return with_i - v @ (1 - inside) / comb(N - 1, n)


def sampled_marginal_advantage(rewards: torch.Tensor, strategies: torch.Tensor | None, n: int, num_subsets: int,
                               objective: str = "poly", lam: float = 0.5, baseline: str = "all",
                               generator: torch.Generator | None = None) -> torch.Tensor:
    """Monte Carlo set advantage: for each ``i``, ``num_subsets`` random subsets containing ``i``
    (``i`` and ``n - 1`` others drawn without replacement) and as many for the baseline (uniform
    subsets for ``"all"``, subsets of the others for ``"loo"``). Each mean is unbiased for its exact
    counterpart in :func:`marginal_advantage`, so the estimate is too.

    ============ ========== ======================================
    rewards      ``(G, N)`` rewards
    strategies   ``(G, N)`` strategy codes (or ``None`` for mean/max)
    returns      ``(G, N)`` sampled advantages
    ============ ========== ======================================
    """
    G, N = rewards.shape
    if not 1 <= n < N or num_subsets < 1:
        raise ValueError(f"need 1 <= n < N = {N} and num_subsets >= 1, got n={n}, num_subsets={num_subsets}")
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")

    def draw(pool: list[int], k: int) -> torch.Tensor:  # (M, k) random k-subsets of pool
        keys = torch.rand(num_subsets, len(pool), generator=generator)
        return torch.tensor(pool)[keys.argsort(1)[:, :k]]

    out = torch.zeros(G, N, dtype=torch.float64)
    for i in range(N):
        others = [j for j in range(N) if j != i]
        with_i = torch.cat([torch.full((num_subsets, 1), i), draw(others, n - 1)], 1)
        base = draw(list(range(N)), n) if baseline == "all" else draw(others, n)
        out[:, i] = (set_objective(rewards, strategies, with_i, objective, lam).mean(1)
                     - set_objective(rewards, strategies, base, objective, lam).mean(1))
    return out


def set_advantage(rewards: torch.Tensor, strategies: torch.Tensor | None, n: int, objective: str = "poly",
                  lam: float = 0.5, baseline: str = "all", max_subsets: int = 20_000, num_subsets: int = 256,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Set-RL advantages of ``G`` groups of ``N`` samples: exact over all ``binom(N, n)`` subsets when
    there are at most ``max_subsets`` of them, else :func:`sampled_marginal_advantage`.

    ========== ========== =====================================
    rewards    ``(G, N)`` rewards
    strategies ``(G, N)`` long strategy codes (``None``: mean/max)
    returns    ``(G, N)`` advantages (float64), not normalised
    ========== ========== =====================================
    """
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be (G, N), got {tuple(rewards.shape)}")
    G, N = rewards.shape
    if not 1 <= n < N:
        raise ValueError(f"the subset size n must satisfy 1 <= n < N (the group size {N}), got n={n}")
    if comb(N, n) > max_subsets:
        return sampled_marginal_advantage(rewards, strategies, n, num_subsets, objective, lam, baseline, generator)
    members = subsets(N, n)
    return marginal_advantage(set_objective(rewards, strategies, members, objective, lam), members, N, baseline)


def mean_objective_advantage(rewards: torch.Tensor, n: int, baseline: str = "all") -> torch.Tensor:
    """Closed form for ``f = mean r``: ``(N-n)/(n(N-1)) (r_i - rbar)`` with ``baseline="all"``,
    ``N/(n(N-1)) (r_i - rbar)`` (RLOO / n) with ``"loo"``. ``rewards`` ``(G, N)`` -> ``(G, N)``."""
    N = rewards.shape[1]
    centred = rewards.double() - rewards.double().mean(1, keepdim=True)
    return centred * ((N - n) if baseline == "all" else N) / (n * (N - 1))


def pkpo_effective_rewards(correct: torch.Tensor, k: int) -> torch.Tensor:
    """PKPO's unbiased pass@k gradient weights for binary rewards (Walder and Karkhanis, 2025,
    arXiv:2505.15201): ``k/N`` for a correct sample, ``k/N * rho(N-1, c, k-1)`` for a wrong one, with
    ``rho(m, c, j) = 1 - binom(m-c, j)/binom(m, j)`` the unbiased pass@j of ``c`` correct of ``m``.

    ======== ========== ============================
    correct  ``(G, N)`` 0/1 rewards
    returns  ``(G, N)`` weights ``s_i`` (float64)
    ======== ========== ============================
    """
    N = correct.shape[1]
    if not 1 <= k <= N or not torch.isin(correct, torch.tensor([0.0, 1.0], dtype=correct.dtype)).all():
        raise ValueError(f"need 0/1 rewards and 1 <= k <= N = {N}, got k={k}")
    out = torch.zeros(correct.shape, dtype=torch.float64)
    for g, row in enumerate(correct):
        c = int(row.sum())
        wrong = pass_at_k(N - 1, c, k - 1) if k > 1 and c < N else 0.0  # pass@0 is 0; c = N: no wrong row
        out[g] = torch.where(row > 0, k / N, k / N * wrong).double()
    return out


# ---------------------------------------------------------------------- strategies of the tiny LM's responses
_EXPRESSION = re.compile(r"\d+([+\-*]\d+)*")


def countdown_strategy(text: str) -> str:
    """The strategy of a countdown response: its sequence of operators, in order (``"3*5+7"`` ->
    ``"*+"``, ``"7+3*5"`` -> ``"+*"``, a lone number -> ``""``). Anything that is not an expression of
    integers and ``+ - *`` is ``"malformed"``: one cluster, so garbage cannot add diversity."""
    t = text.strip()
    return re.sub(r"\d+", "", t) if _EXPRESSION.fullmatch(t) else "malformed"


def strategy_codes(texts: list[str], examples, rows: torch.Tensor) -> torch.Tensor:
    """``(len(rows),)`` long codes of the strategies of ``texts[rows]`` (codes are local to the call).
    Raises a ValueError unless every example is a countdown prompt (``meta['numbers']``)."""
    labels = []
    for i in rows.tolist():
        ex = examples[i]
        if "numbers" not in getattr(ex, "meta", {}):
            raise ValueError(f"poly_epo clusters countdown responses by their operator sequence; the prompt "
                             f"{getattr(ex, 'prompt', ex)!r} is not a countdown prompt (no meta['numbers'])")
        labels.append(countdown_strategy(texts[i]))
    lookup = {s: j for j, s in enumerate(sorted(set(labels)))}
    return torch.tensor([lookup[s] for s in labels], dtype=torch.long)


# ---------------------------------------------------------------------- the registered estimators
def _groups(index: torch.Tensor) -> list[torch.Tensor]:
    return [(index == g).nonzero().squeeze(-1) for g in torch.unique(index)]


def normalise_groups(adv: torch.Tensor, epsilon: float = 1e-6) -> torch.Tensor:
    """Divide each group's advantages by their (Bessel) standard deviation, as GRPO divides rewards:
    ``(G, N) -> (G, N)``; a group of equal advantages (all zero) stays zero."""
    if adv.ndim != 2 or adv.shape[1] < 2:
        raise ValueError(f"advantages must be (G, N) with N >= 2, got {tuple(adv.shape)}")
    return adv / (adv.std(1, keepdim=True) + epsilon)


def _set_estimator(token_level_rewards, response_mask, index, objective, subset_size, lam, baseline, normalize,
                   epsilon, max_subsets, num_subsets, texts=None, examples=None):
    scores = outcome_scores(token_level_rewards, response_mask)
    index = as_index(index, len(scores))
    adv = torch.zeros(len(scores), dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    for rows in _groups(index):
        N = len(rows)
        n = subset_size if subset_size is not None else N // 2
        if N < 2 or not 1 <= n < N:
            raise ValueError(f"group {int(index[rows[0]])} has {N} samples; set RL needs a subset size "
                             f"1 <= n < N, got n={n} (num_generations >= 2, subset_size < num_generations)")
        codes = None if objective in ("mean", "max") else strategy_codes(texts, examples, rows)[None]
        a = set_advantage(scores[rows][None], codes, n, objective, lam, baseline, max_subsets, num_subsets, gen)[0]
        adv[rows] = normalise_groups(a[None], epsilon)[0] if normalize else a
    return adv.float()[:, None] * response_mask, scores.float()[:, None] * response_mask


@register_estimator("poly_epo")
def compute_poly_epo_advantage(token_level_rewards, response_mask, index, batch, examples, subset_size=None,
                               objective: str = "poly", lam: float = 0.5, baseline: str = "all",
                               normalize: bool = True, epsilon: float = 1e-6, max_subsets: int = 20_000,
                               num_subsets: int = 256):
    """Set-RL advantage with the polychromic objective ``f(S) = mean r * d(S)`` (a reconstruction),
    ``d`` the share of distinct strategies (:func:`countdown_strategy`: countdown tasks only).

    =================== ========= ===============================================
    token_level_rewards ``(B,T)`` reward on the last valid token
    response_mask       ``(B,T)`` 1 up to and including EOS
    index               ``(B,)``  group id; each group of N samples is one prompt's
    batch, examples               the rollout (its ``texts``) and per-row examples
    returns                       ``(adv, ret)``, both ``(B,T)``
    =================== ========= ===============================================

    ``subset_size`` n defaults to ``N // 2`` (4 for N = 8); ``objective="additive"`` gives
    ``mean r + lam * d`` (reward plus a diversity bonus), ``baseline`` ``"all"``/``"loo"``
    (:func:`marginal_advantage`); ``normalize`` divides each group's advantages by their std.
    """
    if objective not in ("poly", "additive"):
        raise ValueError(f"poly_epo's objective is 'poly' or 'additive' (use set_max, grpo for max, mean), "
                         f"got {objective!r}")
    return _set_estimator(token_level_rewards, response_mask, index, objective, subset_size, lam, baseline,
                          normalize, epsilon, max_subsets, num_subsets, batch.texts, examples)


@register_estimator("set_max")
def compute_set_max_advantage(token_level_rewards, response_mask, index, subset_size=None, baseline: str = "all",
                              normalize: bool = True, epsilon: float = 1e-6, max_subsets: int = 20_000,
                              num_subsets: int = 256):
    """Set-RL advantage of ``f(S) = max r`` (pass@n): with binary rewards, PKPO's pass@k weights
    minus a baseline. Same arguments and shapes as ``poly_epo``, any task."""
    return _set_estimator(token_level_rewards, response_mask, index, "max", subset_size, 0.0, baseline,
                          normalize, epsilon, max_subsets, num_subsets)
