"""The PPO chapter's lab: where the clipped surrogate's gradient vanishes, the exact quantities of a
tabular MDP behind the surrogate and its trust-region bound, and PPO's adaptive KL coefficient. The
chapter's Trainer experiment on the tiny addition model is a study (:mod:`rlcourse.studies.ppo`).

Nothing here is registered: the loss under test is ``rlcourse.losses.compute_policy_loss`` (the
Trainer's default, registered as ``"vanilla"``) and the critic is the Trainer's own.
"""
from __future__ import annotations

import numpy as np
import torch

NO_CLIP = 1e6  # an epsilon so large that clip(rho, 1 - eps, 1 + eps) never binds (rho > 0)


def clip_zero_grad_region(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float = 0.2,
                          eps_high: float = 0.2, clip_ratio_c: float | None = None) -> torch.Tensor:
    """Where the per-token PPO-clip loss has zero gradient with respect to the log-prob.

    The clipped branch is taken, and is constant in the ratio, when the ratio has left the trust
    region in the direction the advantage pushes it: ``A > 0`` and ``rho > 1 + eps_high``, or
    ``A < 0`` and ``rho < 1 - eps_low``. With dual clip ``c``, tokens with ``A < 0`` and
    ``rho > c`` are capped at the constant ``-A c`` too. ``A = 0`` gives zero gradient everywhere.

    ============ ========= ==========================================
    ratio        ``(...)`` pi_theta / pi_old per token (> 0)
    advantages   ``(...)`` per-token advantages
    returns      ``(...)`` bool, True where the gradient is exactly 0
    ============ ========= ==========================================
    """
    if ratio.shape != advantages.shape:
        raise ValueError(f"ratio {tuple(ratio.shape)} and advantages {tuple(advantages.shape)} differ in shape")
    if (ratio <= 0).any():
        raise ValueError("ratio must be positive")
    zero = (advantages == 0) | ((advantages > 0) & (ratio > 1 + eps_high)) | ((advantages < 0) & (ratio < 1 - eps_low))
    if clip_ratio_c is not None:
        zero = zero | ((advantages < 0) & (ratio > clip_ratio_c))
    return zero


# ---------------------------------------------------------------------- why the surrogate: a tabular MDP
def _check_mdp(P: np.ndarray, r: np.ndarray, gamma: float, rho0: np.ndarray, *pis: np.ndarray) -> None:
    S, A = r.shape
    if P.shape != (S, A, S) or rho0.shape != (S,):
        raise ValueError(f"P must be (S, A, S) = {(S, A, S)} and rho0 (S,) = {(S,)}; got {P.shape} and {rho0.shape}")
    if not 0 <= gamma < 1:
        raise ValueError(f"gamma must be in [0, 1), got {gamma}")
    if not np.allclose(P.sum(-1), 1) or (P < 0).any() or not np.isclose(rho0.sum(), 1) or (rho0 < 0).any():
        raise ValueError("P[s, a] and rho0 must be probability distributions")
    for pi in pis:
        if pi.shape != (S, A) or (pi < 0).any() or not np.allclose(pi.sum(-1), 1):
            raise ValueError(f"a policy must be (S, A) = {(S, A)} with rows that are distributions")


def mdp_quantities(P: np.ndarray, r: np.ndarray, pi: np.ndarray, gamma: float, rho0: np.ndarray) -> dict:
    """Exact values of policy ``pi`` in a finite discounted MDP.

    ========== ============ ====================================================================
    P          ``(S,A,S)``  transition probabilities P(s' | s, a)
    r          ``(S,A)``    expected reward of action a in state s
    pi         ``(S,A)``    the policy, each row a distribution
    rho0       ``(S,)``     the start-state distribution
    returns    dict         ``V (S,)``, ``Q (S,A)``, ``A (S,A)`` = Q - V, ``J`` = rho0 . V (the
                            discounted return), ``d (S,)`` the normalised discounted state
                            distribution (1 - gamma) rho0^T (I - gamma P_pi)^{-1}
    ========== ============ ====================================================================
    """
    _check_mdp(P, r, gamma, rho0, pi)
    S = r.shape[0]
    P_pi = np.einsum("sa,sat->st", pi, P)
    inv = np.linalg.inv(np.eye(S) - gamma * P_pi)
    V = inv @ (pi * r).sum(1)
    Q = r + gamma * P @ V
    return {"V": V, "Q": Q, "A": Q - V[:, None], "J": float(rho0 @ V), "d": (1 - gamma) * rho0 @ inv}


def surrogate_objective(P, r, pi_old, pi_new, gamma, rho0) -> float:
    """The surrogate
    :math:`L_{old}(\\pi') = J(\\pi_{old}) + \\frac{1}{1-\\gamma}\\sum_s d_{old}(s)\\sum_a \\pi'(a|s) A_{old}(s,a)`:
    the performance-difference identity with the new policy's state distribution replaced by the old one's
    (shapes as in :func:`mdp_quantities`)."""
    _check_mdp(P, r, gamma, rho0, pi_new)
    old = mdp_quantities(P, r, pi_old, gamma, rho0)
    return old["J"] + float(old["d"] @ (pi_new * old["A"]).sum(1)) / (1 - gamma)


def trust_region_bound(P, r, pi_old, pi_new, gamma, rho0) -> dict:
    """The lower bound of Kakade and Langford (2002) in the form of Schulman et al. (2015, TRPO, Theorem 1):
    :math:`J(\\pi') \\ge L_{old}(\\pi') - \\frac{4\\varepsilon\\gamma}{(1-\\gamma)^2}\\alpha^2`, with
    :math:`\\alpha = \\max_s \\mathrm{TV}(\\pi_{old}(\\cdot|s), \\pi'(\\cdot|s))` and
    :math:`\\varepsilon = \\max_{s,a}|A_{old}(s,a)|`.

    ========== ====== ============================================================
    returns    dict   ``J_new``, ``surrogate``, ``bound`` (the right-hand side),
                      ``alpha``, ``max_kl`` (the largest per-state KL(old || new); since
                      TV^2 <= KL the bound also holds with ``max_kl`` for ``alpha**2``)
    ========== ====== ============================================================
    """
    old = mdp_quantities(P, r, pi_old, gamma, rho0)
    L = surrogate_objective(P, r, pi_old, pi_new, gamma, rho0)
    alpha = float(0.5 * np.abs(pi_new - pi_old).sum(1).max())
    eps = float(np.abs(old["A"]).max())
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.where(pi_old > 0, pi_old * np.log(pi_old / pi_new), 0.0).sum(1)
    return {"J_new": mdp_quantities(P, r, pi_new, gamma, rho0)["J"], "surrogate": L,
            "bound": L - 4 * eps * gamma / (1 - gamma) ** 2 * alpha ** 2, "alpha": alpha, "max_kl": float(kl.max())}


def adaptive_kl_beta(beta: float, kl: float, target: float, tolerance: float = 1.5, factor: float = 2.0) -> float:
    """PPO's adaptive KL coefficient (Schulman et al. 2017, sec. 4): after an update whose measured
    KL(pi_old || pi) is ``kl``, halve ``beta`` if ``kl < target / tolerance``, double it if
    ``kl > target * tolerance``, else keep it (the paper's 1.5 and 2, which it says are not sensitive)."""
    if not (beta > 0 and target > 0 and tolerance > 1 and factor > 1) or not np.isfinite(kl) or kl < 0:
        raise ValueError(f"need beta > 0, kl >= 0 finite, target > 0, tolerance > 1, factor > 1; got "
                         f"{beta}, {kl}, {target}, {tolerance}, {factor}")
    if kl < target / tolerance:
        return beta / factor
    if kl > target * tolerance:
        return beta * factor
    return beta
