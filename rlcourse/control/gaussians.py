"""Gaussian closed forms of post-training steering: product of experts, the KL-regularised update,
additive steering, the Gaussian KL and the KL-budget selector of alpha.

The course's reconstruction, from its abstract, of *When Policies Cannot Be Retrained: A Unified
Closed-Form View of Post-Training Steering in Offline RL* (Hossain, Basher, Garibay, Garibay,
Yousefi, 2026, arXiv:2604.22873), not the paper's own equations.

Every Gaussian here is diagonal and given by its mean and per-dimension *variance*; the last axis
is the action dimension ``d`` and any leading axes (a batch of states) are kept. Shapes must match
exactly: nothing is broadcast silently.
"""
from __future__ import annotations

import math

import numpy as np



def _check_pair(mu_a, var_a, mu_g, var_g) -> tuple[np.ndarray, ...]:
    arrs = tuple(np.asarray(v, dtype=np.float64) for v in (mu_a, var_a, mu_g, var_g))
    names = ("mu_a", "var_a", "mu_g", "var_g")
    for name, arr in zip(names, arrs):
        if arr.shape != arrs[0].shape:
            raise ValueError(f"{name} has shape {arr.shape} but mu_a has {arrs[0].shape}; shapes must match exactly")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} contains NaN or inf")
    for name, arr in zip(names[1::2], arrs[1::2]):
        if np.any(arr <= 0):
            raise ValueError(f"{name} must be strictly positive (a variance), min is {arr.min()}")
    return arrs


def _check_alpha(alpha: float) -> float:
    if not isinstance(alpha, (int, float, np.floating, np.integer)) or not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    return float(alpha)


def poe_compose(mu_a, var_a, mu_g, var_g, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Product of experts ``pi_a^(1-alpha) * pi_g^alpha`` of two diagonal Gaussians.

    Precisions add with weights: ``lam = (1-alpha)/var_a + alpha/var_g`` and the mean is the
    precision-weighted average of the two means.

    ========= ============ ==========================================
    mu_a      ``(..., d)`` frozen actor's mean
    var_a     ``(..., d)`` frozen actor's variance
    mu_g      ``(..., d)`` prior's mean
    var_g     ``(..., d)`` prior's variance
    alpha     scalar       weight of the prior, in ``[0, 1]``
    returns                ``(..., d)`` composed mean, and ``(..., d)`` variance
    ========= ============ ==========================================
    """
    mu_a, var_a, mu_g, var_g = _check_pair(mu_a, var_a, mu_g, var_g)
    alpha = _check_alpha(alpha)
    lam_a, lam_g = 1.0 / var_a, 1.0 / var_g
    lam = (1.0 - alpha) * lam_a + alpha * lam_g
    mu = ((1.0 - alpha) * lam_a * mu_a + alpha * lam_g * mu_g) / lam
    return mu, 1.0 / lam


def kl_reg_compose(mu_a, var_a, mu_g, var_g, beta: float) -> tuple[np.ndarray, np.ndarray]:
    """The KL-regularised update ``argmin_pi KL(pi || pi_a) - beta E_pi[log pi_g]`` = ``pi_a * pi_g^beta``.

    ========= ============ ==========================================
    mu_a      ``(..., d)`` frozen actor's mean
    var_a     ``(..., d)`` frozen actor's variance
    mu_g      ``(..., d)`` prior's mean
    var_g     ``(..., d)`` prior's variance
    beta      scalar       strength of the prior, ``>= 0``
    returns                ``(..., d)`` mean, and ``(..., d)`` variance
    ========= ============ ==========================================
    """
    mu_a, var_a, mu_g, var_g = _check_pair(mu_a, var_a, mu_g, var_g)
    if not isinstance(beta, (int, float, np.floating, np.integer)) or not (0.0 <= float(beta) < math.inf):
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    lam_a, lam_g = 1.0 / var_a, 1.0 / var_g
    lam = lam_a + beta * lam_g
    mu = (lam_a * mu_a + beta * lam_g * mu_g) / lam
    return mu, 1.0 / lam


def alpha_to_beta(alpha: float) -> float:
    """``beta = alpha / (1 - alpha)``: the KL strength whose mean action equals PoE with ``alpha``."""
    alpha = _check_alpha(alpha)
    if alpha == 1.0:
        raise ValueError("alpha = 1 (prior only) has no finite beta")
    return alpha / (1.0 - alpha)


def additive_compose(mu_a, var_a, mu_g, var_g, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Precision-blind steering: move the actor's mean a fixed fraction towards the prior's mean.

    ``mu = mu_a + alpha (mu_g - mu_a)``; the variance is the actor's. Same shape table as
    :func:`poe_compose`.
    """
    mu_a, var_a, mu_g, var_g = _check_pair(mu_a, var_a, mu_g, var_g)
    alpha = _check_alpha(alpha)
    return mu_a + alpha * (mu_g - mu_a), var_a.copy()


def gaussian_kl(mu_p, var_p, mu_q, var_q) -> np.ndarray:
    """``KL(N(mu_p, var_p) || N(mu_q, var_q))`` for diagonal Gaussians, summed over the last axis.

    ========= ============ ===========================
    mu_p      ``(..., d)`` mean of p
    var_p     ``(..., d)`` variance of p
    mu_q      ``(..., d)`` mean of q
    var_q     ``(..., d)`` variance of q
    returns   ``(...)``    KL in nats, >= 0
    ========= ============ ===========================
    """
    mu_p, var_p, mu_q, var_q = _check_pair(mu_p, var_p, mu_q, var_q)
    r = var_p / var_q
    return 0.5 * np.sum(r + (mu_p - mu_q) ** 2 / var_q - 1.0 - np.log(r), axis=-1)


def kl_budget_alpha(mu_a, var_a, mu_g, var_g, eps: float, tol: float = 1e-4) -> float:
    """The largest ``alpha`` in ``[0, 1]`` with ``mean_s KL(pi_PoE,alpha(.|s) || pi_a(.|s)) <= eps``.

    The mean KL is non-decreasing in ``alpha`` and 0 at ``alpha = 0``, so the feasible set is an
    interval ``[0, alpha*]`` and bisection finds its end to within ``tol``.

    ========= =========== ============================================
    mu_a      ``(N, d)``   actor means on ``N`` states of the data set
    var_a     ``(N, d)``   actor variances
    mu_g      ``(N, d)``   prior means on the same states
    var_g     ``(N, d)``   prior variances
    eps       scalar      KL budget in nats per state, ``> 0``
    returns   scalar      selected ``alpha``
    ========= =========== ============================================
    """
    mu_a, var_a, mu_g, var_g = _check_pair(mu_a, var_a, mu_g, var_g)
    if not eps > 0:
        raise ValueError(f"the KL budget eps must be > 0, got {eps!r}")

    def mean_kl(alpha: float) -> float:
        mu, var = poe_compose(mu_a, var_a, mu_g, var_g, alpha)
        return float(np.mean(gaussian_kl(mu, var, mu_a, var_a)))

    if mean_kl(1.0) <= eps:
        return 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mean_kl(mid) <= eps else (lo, mid)
    return lo


COMPOSITION_RULES = {
    "poe": poe_compose,
    "additive": additive_compose,
    "prior": lambda mu_a, var_a, mu_g, var_g, alpha: _check_pair(mu_a, var_a, mu_g, var_g)[2:],
    "frozen": lambda mu_a, var_a, mu_g, var_g, alpha: _check_pair(mu_a, var_a, mu_g, var_g)[:2],
}


def compose(rule: str, mu_a, var_a, mu_g, var_g, alpha: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Dispatch to a composition rule by name: ``poe``, ``additive``, ``prior`` (prior only) or
    ``frozen`` (actor only). Same shapes as :func:`poe_compose`."""
    if rule not in COMPOSITION_RULES:
        raise ValueError(f"unknown composition rule {rule!r}; choose one of {sorted(COMPOSITION_RULES)}")
    return COMPOSITION_RULES[rule](mu_a, var_a, mu_g, var_g, alpha)
