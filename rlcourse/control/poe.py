"""Steering a frozen offline actor with a goal-conditioned prior: product of experts and its rivals.

Companion code of the chapter on *When Policies Cannot Be Retrained: A Unified Closed-Form View of
Post-Training Steering in Offline RL* (Hossain, Basher, Garibay, Garibay, Yousefi, 2026,
arXiv:2604.22873). The Gaussian closed forms and the KL-budget selector are the course's
reconstruction from the paper's abstract, not the paper's own equations.

Every Gaussian here is diagonal and given by its mean and per-dimension *variance*; the last axis
is the action dimension ``d`` and any leading axes (a batch of states) are kept. Shapes must match
exactly: nothing is broadcast silently.
"""
from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np
import torch
from torch import nn

from ..profiles import Profile, one_torch_thread, profile as current_profile
from . import nav2d
from .offline import build_dataset, load_d4rl_hdf5, save_d4rl_hdf5

# --------------------------------------------------------------------------------------------
# Closed forms
# --------------------------------------------------------------------------------------------


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

    ========= =========== ==========================================
    mu_a      ``(..., d)`` frozen actor's mean
    var_a     ``(..., d)`` frozen actor's variance
    mu_g      ``(..., d)`` prior's mean
    var_g     ``(..., d)`` prior's variance
    alpha     scalar      weight of the prior, in ``[0, 1]``
    returns   ``(..., d)`` composed mean, and ``(..., d)`` variance
    ========= =========== ==========================================
    """
    mu_a, var_a, mu_g, var_g = _check_pair(mu_a, var_a, mu_g, var_g)
    alpha = _check_alpha(alpha)
    lam_a, lam_g = 1.0 / var_a, 1.0 / var_g
    lam = (1.0 - alpha) * lam_a + alpha * lam_g
    mu = ((1.0 - alpha) * lam_a * mu_a + alpha * lam_g * mu_g) / lam
    return mu, 1.0 / lam


def kl_reg_compose(mu_a, var_a, mu_g, var_g, beta: float) -> tuple[np.ndarray, np.ndarray]:
    """The KL-regularised update ``argmin_pi KL(pi || pi_a) - beta E_pi[log pi_g]`` = ``pi_a * pi_g^beta``.

    ========= =========== ==========================================
    mu_a      ``(..., d)`` frozen actor's mean
    var_a     ``(..., d)`` frozen actor's variance
    mu_g      ``(..., d)`` prior's mean
    var_g     ``(..., d)`` prior's variance
    beta      scalar      strength of the prior, ``>= 0``
    returns   ``(..., d)`` mean, and ``(..., d)`` variance
    ========= =========== ==========================================
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

    ========= =========== ===========================
    mu_p      ``(..., d)`` mean of p
    var_p     ``(..., d)`` variance of p
    mu_q      ``(..., d)`` mean of q
    var_q     ``(..., d)`` variance of q
    returns   ``(...)``    KL in nats, >= 0
    ========= =========== ===========================
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


# --------------------------------------------------------------------------------------------
# Gaussian policies and behaviour cloning
# --------------------------------------------------------------------------------------------


class GaussianMLP(nn.Module):
    """A diagonal-Gaussian policy head: ``obs -> (mean, log_std)``, with ``std`` kept in
    ``[min_std, max_std]`` (a variance floor, so that no expert can claim infinite precision).

    ========= ============= ===============================
    obs       ``(B, d_s)``   observations
    returns   ``(B, d_a)``   mean, and ``(B, d_a)`` log-std
    ========= ============= ===============================
    """

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...] = (64, 64),
                 min_std: float = 0.05, max_std: float = 2.0):
        super().__init__()
        if obs_dim < 1 or act_dim < 1 or not 0 < min_std < max_std:
            raise ValueError("obs_dim, act_dim >= 1 and 0 < min_std < max_std are required")
        layers, width = [], obs_dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.Tanh()]
            width = h
        self.body = nn.Sequential(*layers)
        self.mean = nn.Linear(width, act_dim)
        self.log_std = nn.Linear(width, act_dim)
        nn.init.zeros_(self.log_std.weight)   # start from a state-independent std
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.log_min, self.log_max = math.log(min_std), math.log(max_std)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if obs.ndim != 2 or obs.shape[1] != self.obs_dim:
            raise ValueError(f"obs must have shape (B, {self.obs_dim}), got {tuple(obs.shape)}")
        h = self.body(obs)
        log_std = self.log_min + (self.log_max - self.log_min) * torch.sigmoid(self.log_std(h))
        return self.mean(h), log_std

    @torch.no_grad()
    def predict(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """NumPy in, NumPy out: mean ``(B, d_a)`` and variance ``(B, d_a)`` in float64."""
        mu, log_std = self(torch.as_tensor(np.asarray(obs), dtype=torch.float32))
        return mu.double().numpy(), torch.exp(2 * log_std).double().numpy()


def gaussian_nll(mu: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of ``actions`` under ``N(mu, exp(log_std)^2)`` (summed over ``d_a``).

    ========= ============= ==============================
    mu        ``(B, d_a)``   means
    log_std   ``(B, d_a)``   log standard deviations
    actions   ``(B, d_a)``   targets
    returns   ``()``         scalar loss
    ========= ============= ==============================
    """
    if not (mu.shape == log_std.shape == actions.shape):
        raise ValueError(f"mu {tuple(mu.shape)}, log_std {tuple(log_std.shape)} and actions "
                         f"{tuple(actions.shape)} must have the same shape")
    z = (actions - mu) * torch.exp(-log_std)
    return (0.5 * z ** 2 + log_std + 0.5 * math.log(2 * math.pi)).sum(-1).mean()


def train_bc(observations: np.ndarray, actions: np.ndarray, steps: int, batch_size: int = 256, lr: float = 3e-3,
             hidden: tuple[int, ...] = (64, 64), seed: int = 0, min_std: float = 0.05) -> GaussianMLP:
    """Behaviour cloning: fit a :class:`GaussianMLP` to ``(observation, action)`` pairs by maximum
    likelihood with Adam. Returns the model in eval mode (the *frozen* actor or the prior).

    ============= ============= ==========================
    observations  ``(N, d_s)``   states of the data set
    actions       ``(N, d_a)``   actions of the data set
    ============= ============= ==========================
    """
    obs = torch.as_tensor(np.asarray(observations), dtype=torch.float32)
    act = torch.as_tensor(np.asarray(actions), dtype=torch.float32)
    if obs.ndim != 2 or act.ndim != 2 or len(obs) != len(act):
        raise ValueError(f"observations {tuple(obs.shape)} and actions {tuple(act.shape)} must be (N, d_s) and (N, d_a)")
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps}, {batch_size}")
    gen = torch.Generator().manual_seed(int(seed))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = GaussianMLP(obs.shape[1], act.shape[1], hidden, min_std=min_std)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    with one_torch_thread():
        for _ in range(steps):
            idx = torch.randint(len(obs), (min(batch_size, len(obs)),), generator=gen)
            loss = gaussian_nll(*model(obs[idx]), act[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return model.eval()


class RandomPrior:
    """An uninformative "prior": mean uniform in ``[-1, 1]^d`` drawn afresh on every call, variance
    ``std^2`` everywhere. :meth:`reset` re-seeds it so that rivals see the same draws.

    ======= ============= ==============================
    obs     ``(B, d_s)``   observations (only B is used)
    returns ``(B, d)``     mean, and ``(B, d)`` variance
    ======= ============= ==============================
    """

    def __init__(self, act_dim: int = 2, std: float = 1.0, seed: int = 0):
        if act_dim < 1 or std <= 0:
            raise ValueError("act_dim >= 1 and std > 0 are required")
        self.act_dim, self.std = act_dim, float(std)
        self.reset(seed)

    def reset(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def predict(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        b = np.asarray(obs).shape[0]
        return self.rng.uniform(-1, 1, size=(b, self.act_dim)), np.full((b, self.act_dim), self.std ** 2)


# --------------------------------------------------------------------------------------------
# The navigation experiment
# --------------------------------------------------------------------------------------------

ALPHAS = (0.1, 0.3, 0.5, 0.7, 0.9)           # the paper's alpha sweep
KL_BUDGET = 0.5                                # nats per state, fixed before any run
DEGRADED_GOAL_SHIFT = np.array([0.6, -0.6])    # the degraded prior was trained towards goal + this
TALLY_METHODS = ("poe", "additive", "prior", "poe_kl")


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


def _nav2d_seed(seed: int, actors: tuple, priors: tuple, sizes: dict, workdir) -> dict:
    """One seed: build the data sets (through HDF5), train actors and priors, evaluate every rule."""
    env = nav2d.Nav2DEnv()
    data = {}
    for j, kind in enumerate(dict.fromkeys([f"{a}" for a in actors] + [f"prior_{p}" for p in priors if p != "random"])):
        d = build_dataset(env, nav2d_behaviour(kind), sizes["n_steps"], seed=1000 * seed + j)
        path = save_d4rl_hdf5(d, f"{workdir}/poe_{kind}_s{seed}.hdf5")
        data[kind] = load_d4rl_hdf5(path)          # train from what the loader reads back
    models = {kind: train_bc(d["observations"], d["actions"], sizes["bc_steps"], sizes["batch"],
                             hidden=sizes["hidden"], seed=seed)
              for kind, d in data.items()}
    rng = np.random.default_rng(10_000 + seed)
    starts, goals = nav2d.sample_start_goal(rng, sizes["episodes"])
    noise = nav2d.PROCESS_NOISE * rng.normal(size=(nav2d.MAX_STEPS, sizes["episodes"], 2))
    out = {"success": {}, "alpha_kl": {}, "sigma": {}, "paths": {}}
    for a in actors:
        actor = models[a]
        kl_states = data[a]["observations"][rng.choice(len(data[a]["observations"]), sizes["kl_states"], replace=False)]
        out["sigma"][a] = float(np.sqrt(actor.predict(kl_states)[1]).mean())
        for p in priors:
            prior = RandomPrior(seed=seed) if p == "random" else models[f"prior_{p}"]
            if p != "random":
                out["sigma"][f"prior_{p}"] = float(np.sqrt(prior.predict(kl_states)[1]).mean())
            cell = f"{a}|{p}"
            ps = 77 + seed
            mu_a, var_a = actor.predict(kl_states)
            if hasattr(prior, "reset"):
                prior.reset(ps)
            mu_g, var_g = prior.predict(kl_states)
            alpha_kl = kl_budget_alpha(mu_a, var_a, mu_g, var_g, KL_BUDGET)
            out["alpha_kl"][cell] = alpha_kl
            runs = {"frozen": rollout_rule(actor, prior, "frozen", 0.0, starts, goals, noise, ps),
                    "prior": rollout_rule(actor, prior, "prior", 1.0, starts, goals, noise, ps),
                    "poe_kl": rollout_rule(actor, prior, "poe", alpha_kl, starts, goals, noise, ps)}
            for alpha in ALPHAS:
                runs[f"poe@{alpha}"] = rollout_rule(actor, prior, "poe", alpha, starts, goals, noise, ps)
                runs[f"additive@{alpha}"] = rollout_rule(actor, prior, "additive", alpha, starts, goals, noise, ps)
            out["success"][cell] = {k: v["success"].astype(np.float64) for k, v in runs.items()}
            if seed == 0:
                k = sizes["paths"]
                out["paths"][cell] = {m: runs[m]["path"][:, :k] for m in ("frozen", "poe@0.5", "additive@0.5", "prior")}
                out["paths"][cell]["goals"] = goals[:k]
    return out


def run_poe_experiment(prof: Profile | None = None, workdir: str | None = None, mujoco: bool | None = None) -> dict:
    """The chapter's claim, measured: compose frozen BC actors of three qualities with good, degraded
    and random goal-conditioned priors on the 2-D navigation task, for every rule, over several seeds.

    Returns a dict with ``cells[actor|prior]`` (mean success of ``frozen``, ``prior``, ``poe_kl``,
    the selected ``alpha_kl``, and lists ``poe`` / ``additive`` over ``alphas``), ``labels`` and
    ``ci`` (HELP/FROZEN/HURT of each rule in :data:`TALLY_METHODS` against the frozen actor, from a
    paired bootstrap over all episodes of all seeds), ``tally[rule] = {HELP, FROZEN, HURT}``,
    ``sigma`` (mean learned standard deviations), ``paths`` (a few trajectories of seed 0) and
    ``seconds``. With ``mujoco`` (default: the full profile only) it also runs
    :func:`run_mujoco_cells` on Hopper-v5 and HalfCheetah-v5.
    """
    import tempfile

    prof = prof or current_profile()
    t0 = time.perf_counter()
    sizes = {
        "n_steps": prof.pick(smoke=2000, book=10000, full=100000),
        "bc_steps": prof.pick(smoke=200, book=1000, full=5000),
        "batch": 256,
        "hidden": (64, 64),
        "episodes": prof.pick(smoke=100, book=400, full=1000),
        "kl_states": prof.pick(smoke=500, book=2000, full=5000),
        "paths": 6,
    }
    seeds = list(range(prof.pick(smoke=1, book=3, full=5)))
    actors, priors = ("expert", "medium", "mixed", "random"), ("good", "degraded", "random")
    with tempfile.TemporaryDirectory(prefix="poe-") as tmp, one_torch_thread():
        per_seed = [_nav2d_seed(s, actors, priors, sizes, workdir or tmp) for s in seeds]
    cells, labels, cis = {}, {m: {} for m in TALLY_METHODS}, {m: {} for m in TALLY_METHODS}
    for a in actors:
        for p in priors:
            cell = f"{a}|{p}"
            succ = {k: np.concatenate([r["success"][cell][k] for r in per_seed]) for k in per_seed[0]["success"][cell]}
            cells[cell] = {
                "frozen": float(succ["frozen"].mean()),
                "prior": float(succ["prior"].mean()),
                "poe_kl": float(succ["poe_kl"].mean()),
                "alpha_kl": float(np.mean([r["alpha_kl"][cell] for r in per_seed])),
                "poe": [float(succ[f"poe@{al}"].mean()) for al in ALPHAS],
                "additive": [float(succ[f"additive@{al}"].mean()) for al in ALPHAS],
            }
            cells[cell]["oracle_alpha"] = float(ALPHAS[int(np.argmax(cells[cell]["poe"]))])
            rival = {"poe": succ["poe@0.5"], "additive": succ["additive@0.5"], "prior": succ["prior"],
                     "poe_kl": succ["poe_kl"]}
            for m in TALLY_METHODS:
                ci = paired_bootstrap(rival[m] - succ["frozen"], seed=len(cells))
                cis[m][cell], labels[m][cell] = ci, classify(ci)
    tally = {m: {lab: sum(v == lab for v in labels[m].values()) for lab in ("HELP", "FROZEN", "HURT")}
             for m in TALLY_METHODS}
    sigma = {k: float(np.mean([r["sigma"][k] for r in per_seed])) for k in per_seed[0]["sigma"]}
    result = {"profile": prof.name, "seeds": seeds, "alphas": list(ALPHAS), "kl_budget": KL_BUDGET,
              "actors": list(actors), "priors": list(priors), "sizes": sizes, "cells": cells, "labels": labels,
              "ci": cis, "tally": tally, "sigma": sigma, "paths": per_seed[0]["paths"],
              "episodes_total": len(seeds) * sizes["episodes"]}
    if mujoco if mujoco is not None else prof.name == "full":
        result["mujoco"] = {env_id: run_mujoco_cells(env_id, prof) for env_id in ("Hopper-v5", "HalfCheetah-v5")}
    result["seconds"] = time.perf_counter() - t0
    return result


# --------------------------------------------------------------------------------------------
# The MuJoCo path (full profile): same pipeline on Gymnasium's locomotion tasks
# --------------------------------------------------------------------------------------------


def reward_weighted_prior(data: dict, steps: int, temperature: float = 1.0, seed: int = 0, **kw) -> GaussianMLP:
    """A prior for locomotion, where there is no goal position: behaviour cloning on the data set's
    transitions resampled with weights ``exp((r - max r) / temperature)``, i.e. the actions that
    moved the body forward ("goal: high reward").

    ======= ===== =========================================
    data    dict  D4RL layout with ``N`` transitions
    returns model a :class:`GaussianMLP` prior
    ======= ===== =========================================
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    r = data["rewards"].astype(np.float64)
    w = np.exp((r - r.max()) / temperature)
    idx = np.random.default_rng(seed).choice(len(r), size=len(r), p=w / w.sum())
    return train_bc(data["observations"][idx], data["actions"][idx], steps, seed=seed, **kw)


def run_mujoco_cells(env_id: str = "Hopper-v5", prof: Profile | None = None, n_steps: int | None = None,
                     episodes: int | None = None, bc_steps: int | None = None, seed: int = 0,
                     max_episode_steps: int | None = None) -> dict:
    """Frozen BC actor on a random-policy D4RL-layout data set of a MuJoCo task, steered by a
    reward-weighted prior (good), the same prior with inflated noise (degraded) and a random prior.

    Returns ``{prior: {rule: mean return}}`` for rules ``frozen``, ``poe`` (alpha 0.5),
    ``additive`` (alpha 0.5) and ``prior``, plus ``n_transitions``. With a D4RL "random" data set
    the actor is incompetent, which is the regime where the paper finds every rule inherits
    the actor's failure. ``max_episode_steps`` overrides the environment's time limit (default 1000).
    """
    prof = prof or current_profile()
    n_steps = n_steps or prof.pick(smoke=500, book=5000, full=100000)
    episodes = episodes or prof.pick(smoke=2, book=5, full=20)
    bc_steps = bc_steps or prof.pick(smoke=50, book=500, full=5000)
    with one_torch_thread():
        return _mujoco_cells(env_id, n_steps, episodes, bc_steps, seed, max_episode_steps)


def _mujoco_cells(env_id: str, n_steps: int, episodes: int, bc_steps: int, seed: int,
                  max_episode_steps: int | None) -> dict:
    import gymnasium as gym

    env = gym.make(env_id) if max_episode_steps is None else gym.make(env_id, max_episode_steps=max_episode_steps)
    low, high = env.action_space.low, env.action_space.high
    data = build_dataset(env, lambda o, r: r.uniform(low, high).astype(np.float32), n_steps, seed=seed)
    actor = train_bc(data["observations"], data["actions"], bc_steps, seed=seed)
    good = reward_weighted_prior(data, bc_steps, seed=seed)

    class _Noisy:
        def __init__(self, base, std, rng):
            self.base, self.std, self.rng = base, std, rng

        def reset(self, s):
            self.rng = np.random.default_rng(s)

        def predict(self, obs):
            mu, var = self.base.predict(obs)
            return mu + self.std * self.rng.normal(size=mu.shape), var + self.std ** 2

    priors = {"good": good, "degraded": _Noisy(good, 0.5, np.random.default_rng(seed)),
              "random": RandomPrior(act_dim=env.action_space.shape[0], seed=seed)}
    out: dict = {"n_transitions": int(len(data["rewards"]))}
    for name, prior in priors.items():
        out[name] = {}
        for rule, alpha in (("frozen", 0.0), ("poe", 0.5), ("additive", 0.5), ("prior", 1.0)):
            if hasattr(prior, "reset"):
                prior.reset(seed)
            returns = []
            for ep in range(episodes):
                obs, _ = env.reset(seed=10_000 + ep)
                total, done = 0.0, False
                while not done:
                    mu_a, var_a = actor.predict(obs[None])
                    mu_g, var_g = prior.predict(obs[None])
                    act = np.clip(compose(rule, mu_a, var_a, mu_g, var_g, alpha)[0][0], low, high)
                    obs, r, term, trunc, _ = env.step(act.astype(np.float32))
                    total += float(r)
                    done = term or trunc
                returns.append(total)
            out[name][rule] = float(np.mean(returns))
    env.close()
    return out
