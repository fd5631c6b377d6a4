"""Steering a frozen offline actor with a goal-conditioned prior on the navigation task: the behaviour
policies, the composed policy's rollouts and the HELP/FROZEN/HURT reading of a paired bootstrap.

Companion code of the chapter on *When Policies Cannot Be Retrained: A Unified Closed-Form View of
Post-Training Steering in Offline RL* (Hossain, Basher, Garibay, Garibay, Yousefi, 2026,
arXiv:2604.22873). The closed forms live in :mod:`rlcourse.control.gaussians`, behaviour cloning in
:mod:`rlcourse.control.bc`, the MuJoCo cells in :mod:`rlcourse.control.mujoco_cells`; they are
re-exported here so that ``from rlcourse.control.poe import ...`` keeps working. The chapter's
experiments and claims are :mod:`rlcourse.studies.poe_steering`.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from . import nav2d
from .bc import GaussianMLP, RandomPrior, gaussian_nll, train_bc  # noqa: F401
from .gaussians import (COMPOSITION_RULES, additive_compose, alpha_to_beta, compose, gaussian_kl,  # noqa: F401
                        kl_budget_alpha, kl_reg_compose, poe_compose)


ALPHAS = (0.1, 0.3, 0.5, 0.7, 0.9)           # the paper's alpha sweep
KL_BUDGET = 0.5                                # nats per state, fixed before any run
DEGRADED_GOAL_SHIFT = np.array([0.6, -0.6])    # the degraded prior was trained towards goal + this


def nav2d_behaviour(kind: str) -> Callable[[np.ndarray, np.random.Generator], np.ndarray]:
    """Behaviour policies that generate the offline data sets of the navigation task.

    ``expert``: the proportional controller plus N(0, 0.1^2) noise. ``medium``: a slow controller,
    0.4 times the expert's action plus N(0, 0.3^2). ``mixed``: the expert (noise 0.3) half of the
    time, a uniform random action otherwise. ``random``: uniform actions.
    ``prior_good``: the expert plus N(0, 0.3^2). ``prior_degraded``: the expert steering to a
    *shifted* goal (``goal + DEGRADED_GOAL_SHIFT``) plus N(0, 0.6^2): bias plus noise.
    Each returns ``policy(obs (4,), rng) -> action (2,)``.
    """
    def expert(obs):
        return nav2d.expert_action(obs[None])[0]

    def shifted(obs):
        o = np.array(obs, dtype=np.float64)
        o[2:] += DEGRADED_GOAL_SHIFT
        return nav2d.expert_action(o[None])[0]

    table = {
        "expert": lambda o, r: expert(o) + 0.1 * r.normal(size=2),
        "medium": lambda o, r: 0.4 * expert(o) + 0.3 * r.normal(size=2),
        "mixed": lambda o, r: expert(o) + 0.3 * r.normal(size=2) if r.random() < 0.5 else r.uniform(-1, 1, 2),
        "random": lambda o, r: r.uniform(-1, 1, 2),
        "prior_good": lambda o, r: expert(o) + 0.3 * r.normal(size=2),
        "prior_degraded": lambda o, r: shifted(o) + 0.6 * r.normal(size=2),
    }
    if kind not in table:
        raise ValueError(f"unknown behaviour {kind!r}; choose one of {sorted(table)}")
    return table[kind]


def rollout_rule(actor: GaussianMLP, prior, rule: str, alpha: float, starts: np.ndarray, goals: np.ndarray,
                 noise: np.ndarray, prior_seed: int = 0) -> dict:
    """Evaluate the deterministic composed policy (the composed *mean*) on a batch of episodes.

    ======= ============= ====================================================
    starts  ``(B, 2)``     start positions (shared by every rule: paired)
    goals   ``(B, 2)``     goals
    noise   ``(T, B, 2)``  process noise (shared by every rule)
    returns dict           see :func:`rlcourse.control.nav2d.rollout_batch`
    ======= ============= ====================================================
    """
    if hasattr(prior, "reset"):
        prior.reset(prior_seed)

    def policy(obs, t):
        mu_a, var_a = actor.predict(obs)
        mu_g, var_g = prior.predict(obs)
        return compose(rule, mu_a, var_a, mu_g, var_g, alpha)[0]

    return nav2d.rollout_batch(policy, starts, goals, noise)


def paired_bootstrap(diff: np.ndarray, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap confidence interval for the mean of paired differences.

    ======= ======== ======================================================
    diff    ``(n,)``  per-episode success of a rule minus the frozen actor's
    returns 2 floats  lower and upper end of the ``level`` interval
    ======= ======== ======================================================
    """
    diff = np.asarray(diff, dtype=np.float64)
    if diff.ndim != 1 or len(diff) < 2:
        raise ValueError(f"diff must be 1-D with at least 2 entries, got shape {diff.shape}")
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(n_boot, len(diff)))].mean(1)
    q = (1 - level) / 2
    return float(np.quantile(means, q)), float(np.quantile(means, 1 - q))


def classify(ci: tuple[float, float]) -> str:
    """HELP if the whole interval is above 0, HURT if below, else FROZEN (no detectable change)."""
    lo, hi = ci
    return "HELP" if lo > 0 else ("HURT" if hi < 0 else "FROZEN")


def __getattr__(name):
    if name in ("run_mujoco_cells", "reward_weighted_prior"):
        from . import mujoco_cells
        return getattr(mujoco_cells, name)
    raise AttributeError(name)
