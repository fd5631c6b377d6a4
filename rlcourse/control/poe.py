"""Steering a frozen offline actor with a goal-conditioned prior: the navigation experiment.

Companion code of the chapter on *When Policies Cannot Be Retrained: A Unified Closed-Form View of
Post-Training Steering in Offline RL* (Hossain, Basher, Garibay, Garibay, Yousefi, 2026,
arXiv:2604.22873). The closed forms live in :mod:`rlcourse.control.gaussians`, behaviour cloning in
:mod:`rlcourse.control.bc`, the MuJoCo cells in :mod:`rlcourse.control.mujoco_cells`; they are
re-exported here so that ``from rlcourse.control.poe import ...`` keeps working.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ..claims import Claim, Verdict, evaluate
from ..profiles import Profile, one_torch_thread, profile as current_profile
from . import nav2d
from .bc import GaussianMLP, RandomPrior, gaussian_nll, train_bc  # noqa: F401
from .gaussians import (COMPOSITION_RULES, additive_compose, alpha_to_beta, compose, gaussian_kl,  # noqa: F401
                        kl_budget_alpha, kl_reg_compose, poe_compose)
from .offline import build_dataset, load_d4rl_hdf5, save_d4rl_hdf5


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
    the selected ``alpha_kl``, lists ``poe`` / ``additive`` over ``alphas``, and ``per_seed[rule]``,
    the mean success of each seed, for the claims), ``labels`` and
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
        "episodes": prof.pick(smoke=100, book=240, full=1000),
        "kl_states": prof.pick(smoke=500, book=2000, full=5000),
        "paths": 6,
    }
    seeds = list(range(prof.toy_seeds))
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
            # per seed: mean success of every rule, the claims' paired unit
            cells[cell]["per_seed"] = {k: [float(r["success"][cell][k].mean()) for r in per_seed]
                                       for k in per_seed[0]["success"][cell]}
            cells[cell]["alpha_kl_per_seed"] = [float(r["alpha_kl"][cell]) for r in per_seed]
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
        from .mujoco_cells import run_mujoco_cells
        result["mujoco"] = {env_id: run_mujoco_cells(env_id, prof) for env_id in ("Hopper-v5", "HalfCheetah-v5")}
    result["seconds"] = time.perf_counter() - t0
    return result


# --------------------------------------------------------------------------------------------
# The paper's claims, and their verdicts on our runs
# --------------------------------------------------------------------------------------------

PAPER = ("When Policies Cannot Be Retrained: A Unified Closed-Form View of Post-Training Steering in "
         "Offline RL, Hossain et al., 2026, arXiv:2604.22873")
SOURCE = "abstract (arXiv:2604.22873)"
ANCHOR = ("under degraded or random priors, precision-weighted composition remains anchored to the frozen "
          "actor, while additive and prior-only adaptation collapse")
COMPETENT = ("expert", "medium", "mixed")

CLAIMS = {
    "anchored": Claim(
        key="poe_steering/anchored-random-prior", paper=PAPER, source=SOURCE, statement=ANCHOR,
        setting="2-D goal navigation, BC actor from expert data, random prior (uniform mean, unit variance), "
                "PoE alpha = 0.5, deterministic composed mean",
        metric="success rate over the seed's episodes", method="PoE (alpha 0.5)", baseline="frozen actor",
        kind="equivalent", margin=0.05),
    "additive_collapses": Claim(
        key="poe_steering/additive-collapses-random-prior", paper=PAPER, source=SOURCE, statement=ANCHOR,
        setting="2-D goal navigation, BC actors from expert, medium and mixed data (mean of the three), "
                "random prior, alpha = 0.5",
        metric="success rate, mean over the three competent actors", method="PoE (alpha 0.5)",
        baseline="additive (alpha 0.5)", kind="greater", margin=0.10),
    "prior_collapses": Claim(
        key="poe_steering/prior-only-collapses-random-prior", paper=PAPER, source=SOURCE, statement=ANCHOR,
        setting="2-D goal navigation, BC actors from expert, medium and mixed data (mean of the three), "
                "random prior",
        metric="success rate, mean over the three competent actors", method="PoE (alpha 0.5)",
        baseline="prior only", kind="greater", margin=0.10),
    "kl_near_oracle": Claim(
        key="poe_steering/kl-budget-near-oracle", paper=PAPER, source=SOURCE,
        statement="a KL-budget selector often recovers a near-oracle operating point",
        setting="2-D goal navigation, 12 actor-prior cells, KL budget 0.5 nats per state, oracle = best "
                "alpha of the grid (0.1, 0.3, 0.5, 0.7, 0.9) per seed and cell",
        metric="success rate, mean over the 12 cells", method="PoE with the KL budget",
        baseline="PoE at the oracle alpha", kind="equivalent", margin=0.05),
    "expert_hurt": Claim(
        key="poe_steering/competent-actor-hurt", paper=PAPER, source=SOURCE,
        statement="medium-expert remains HURT in all 9 cells at every tested alpha",
        paper_number="HURT in 9/9 cells",
        setting="2-D goal navigation, BC actor from expert data (our most competent actor), "
                "good, degraded and random priors (mean of the three), alpha = 0.5",
        metric="success rate, mean over the three priors", method="PoE (alpha 0.5)", baseline="frozen actor",
        kind="less", margin=0.0),
    "idp_anchored": Claim(
        key="poe_steering/idp-anchored-random-prior", paper=PAPER, source=SOURCE, statement=ANCHOR,
        setting="MuJoCo InvertedDoublePendulum-v5, BC actor from LQR-expert data (D4RL layout), random prior, "
                "alpha = 0.5, episodes cut at the profile's horizon",
        metric="D4RL normalised score (0 = uniform random policy, 100 = LQR expert)",
        method="PoE (alpha 0.5)", baseline="frozen actor", kind="equivalent", margin=10.0, unit="{:.1f}"),
    "idp_additive_collapses": Claim(
        key="poe_steering/idp-additive-collapses-random-prior", paper=PAPER, source=SOURCE, statement=ANCHOR,
        setting="MuJoCo InvertedDoublePendulum-v5, BC actors from expert and medium data (mean of the two), "
                "random prior, alpha = 0.5",
        metric="D4RL normalised score (0 = uniform random policy, 100 = LQR expert)",
        method="PoE (alpha 0.5)", baseline="additive (alpha 0.5)", kind="greater", margin=10.0, unit="{:.1f}"),
}


def poe_verdicts(res: dict, balance: dict | None = None) -> dict[str, Verdict]:
    """The verdicts of :data:`CLAIMS` on a :func:`run_poe_experiment` result (and, for the ``idp_*``
    claims, a :func:`rlcourse.control.mujoco_cells.run_balance_cells` result), paired by seed."""
    c = res["cells"]
    ps = lambda cell, rule: np.asarray(c[cell]["per_seed"][rule])  # noqa: E731
    mean_of = lambda cells, rule: np.mean([ps(x, rule) for x in cells], axis=0)  # noqa: E731
    rand = [f"{a}|random" for a in COMPETENT]
    sec = res["seconds"]
    out = {
        "anchored": evaluate(CLAIMS["anchored"], ps("expert|random", "poe@0.5"), ps("expert|random", "frozen"),
                             seconds=sec),
        "additive_collapses": evaluate(CLAIMS["additive_collapses"], mean_of(rand, "poe@0.5"),
                                       mean_of(rand, "additive@0.5"), seconds=sec),
        "prior_collapses": evaluate(CLAIMS["prior_collapses"], mean_of(rand, "poe@0.5"), mean_of(rand, "prior"),
                                    seconds=sec),
        "expert_hurt": evaluate(CLAIMS["expert_hurt"], mean_of([f"expert|{p}" for p in res["priors"]], "poe@0.5"),
                                mean_of([f"expert|{p}" for p in res["priors"]], "frozen"), seconds=sec),
    }
    grid = [f"poe@{al}" for al in res["alphas"]]
    oracle = np.mean([np.max([ps(cell, g) for g in grid], axis=0) for cell in c], axis=0)
    out["kl_near_oracle"] = evaluate(CLAIMS["kl_near_oracle"], mean_of(list(c), "poe_kl"), oracle, seconds=sec)
    if balance is not None:
        sc = balance["score"]
        out["idp_anchored"] = evaluate(CLAIMS["idp_anchored"], sc["expert|random"]["poe"],
                                       sc["expert|random"]["frozen"], seconds=balance["seconds"])
        two = ("expert|random", "medium|random")
        out["idp_additive_collapses"] = evaluate(
            CLAIMS["idp_additive_collapses"], np.mean([sc[x]["poe"] for x in two], axis=0),
            np.mean([sc[x]["additive"] for x in two], axis=0), seconds=balance["seconds"])
    return out


def selector_prefers_random_prior(res: dict) -> list[str]:
    """The actors for which the KL budget picks a *larger* alpha for the random prior than for the
    good prior (mean over seeds): the selector measures how far the composition moves, not whether
    the prior is any good, and a broad random prior moves the composition little per unit alpha."""
    c = res["cells"]
    return [a for a in res["actors"] if c[f"{a}|random"]["alpha_kl"] > c[f"{a}|good"]["alpha_kl"]]


def __getattr__(name):
    if name in ("run_mujoco_cells", "reward_weighted_prior"):
        from . import mujoco_cells
        return getattr(mujoco_cells, name)
    raise AttributeError(name)
