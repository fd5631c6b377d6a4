"""The PoE-steering chapter's studies and claims: frozen behaviour-cloned actors steered by priors of
several qualities, with every composition rule, on the 2-D navigation task and on MuJoCo's
InvertedDoublePendulum-v5; then the paper's claims and their verdicts.

Course material for *When Policies Cannot Be Retrained: A Unified Closed-Form View of Post-Training
Steering in Offline RL* (Hossain, Basher, Garibay, Garibay, Yousefi, 2026, arXiv:2604.22873); the
method lives in :mod:`rlcourse.control.poe`, :mod:`rlcourse.control.gaussians` and
:mod:`rlcourse.control.mujoco_cells`.

Each study has one arm (the task) over the seeds: one cell (:func:`run_nav2d_cell`,
:func:`run_balance_cell`) builds one seed's data sets (written to HDF5 and read back, under its own
folder or files named by the seed), clones every actor and prior from them and evaluates every rule, so
the actors and priors of a seed share their data and a cell's numbers do not depend on the other
seeds. :func:`run_poe_experiment` and :func:`run_balance_cells` run them on the study runner (cached
per cell) and rebuild the dicts the chapter reads; :func:`poe_verdicts` evaluates :data:`CLAIMS`.
"""
from __future__ import annotations

import contextlib
import tempfile
import time

import numpy as np

from ..claims import Claim, Verdict, evaluate
from ..control import nav2d
from ..control.bc import RandomPrior, train_bc
from ..control.gaussians import kl_budget_alpha
from ..control.mujoco_cells import (BALANCE_ACTORS, BALANCE_ALPHA, BALANCE_ENV, BALANCE_GRADES, BALANCE_KL_BUDGET,
                                    BALANCE_PRIORS, BALANCE_RULES, _composed, evaluate_policy, idp_state, lqr_gain,
                                    lqr_policy, make_envs)
from ..control.offline import build_dataset, load_d4rl_hdf5, save_d4rl_hdf5
from ..control.poe import ALPHAS, KL_BUDGET, classify, nav2d_behaviour, paired_bootstrap, rollout_rule
from ..profiles import Profile, one_torch_thread, profile as current_profile
from .runner import Results, Study, run_study

NAV2D = "nav2d"
ACTORS = ("expert", "medium", "mixed", "random")
PRIORS = ("good", "degraded", "random")
TALLY_METHODS = ("poe", "additive", "prior", "poe_kl")
# every rule a navigation cell evaluates, in the order the chapter's dicts list them
RULES = ("frozen", "prior", "poe_kl", *(f"{r}@{a}" for a in ALPHAS for r in ("poe", "additive")))
PATH_RULES = ("frozen", "poe@0.5", "additive@0.5", "prior")
MODULES = ("rlcourse.control.poe", "rlcourse.control.gaussians", "rlcourse.control.bc", "rlcourse.control.nav2d",
           "rlcourse.control.offline", "rlcourse.control.mujoco_cells")


def _workdir(sizes: dict, prefix: str):
    """The folder the cell writes its HDF5 files to: ``sizes["workdir"]`` when given, else its own."""
    if sizes.get("workdir"):
        return contextlib.nullcontext(sizes["workdir"])
    return tempfile.TemporaryDirectory(prefix=prefix)


def run_nav2d_cell(arm: str, seed: int, sizes: dict) -> dict:
    """One seed of the navigation experiment: build the data sets (through HDF5), train every actor and
    prior of :data:`ACTORS` and :data:`PRIORS`, and evaluate every rule of :data:`RULES` on the same
    episodes.

    ==========================  =============  ==============================================
    success[actor|prior][rule]  ``(B,)``       1.0 where an episode reached its goal
    alpha_kl[actor|prior]       scalar         alpha picked by the KL budget
    sigma[actor or prior_<p>]   scalar         mean learned standard deviation
    paths[actor|prior][rule]    ``(T, k, 2)``  seed 0 only: a few trajectories, and ``goals``
    ==========================  =============  ==============================================
    """
    if arm != NAV2D:
        raise ValueError(f"unknown arm {arm!r}; the arms are ({NAV2D!r},)")
    with _workdir(sizes, "poe-") as workdir, one_torch_thread():
        return _nav2d_seed(seed, sizes, workdir)


def _nav2d_seed(seed: int, sizes: dict, workdir: str) -> dict:
    env = nav2d.Nav2DEnv()
    data = {}
    for j, kind in enumerate(dict.fromkeys([*ACTORS, *(f"prior_{p}" for p in PRIORS if p != "random")])):
        d = build_dataset(env, nav2d_behaviour(kind), sizes["n_steps"], seed=1000 * seed + j)
        data[kind] = load_d4rl_hdf5(save_d4rl_hdf5(d, f"{workdir}/poe_{kind}_s{seed}.hdf5"))
    models = {kind: train_bc(d["observations"], d["actions"], sizes["bc_steps"], sizes["batch"],
                             hidden=tuple(sizes["hidden"]), seed=seed) for kind, d in data.items()}
    rng = np.random.default_rng(10_000 + seed)
    starts, goals = nav2d.sample_start_goal(rng, sizes["episodes"])
    noise = nav2d.PROCESS_NOISE * rng.normal(size=(nav2d.MAX_STEPS, sizes["episodes"], 2))
    out = {"success": {}, "alpha_kl": {}, "sigma": {}, "paths": {}}
    for a in ACTORS:
        actor = models[a]
        kl_states = data[a]["observations"][rng.choice(len(data[a]["observations"]), sizes["kl_states"], replace=False)]
        out["sigma"][a] = float(np.sqrt(actor.predict(kl_states)[1]).mean())
        for p in PRIORS:
            prior = RandomPrior(seed=seed) if p == "random" else models[f"prior_{p}"]
            if p != "random":
                out["sigma"][f"prior_{p}"] = float(np.sqrt(prior.predict(kl_states)[1]).mean())
            cell, ps = f"{a}|{p}", 77 + seed
            mu_a, var_a = actor.predict(kl_states)
            if hasattr(prior, "reset"):
                prior.reset(ps)
            mu_g, var_g = prior.predict(kl_states)
            alpha_kl = kl_budget_alpha(mu_a, var_a, mu_g, var_g, KL_BUDGET)
            out["alpha_kl"][cell] = float(alpha_kl)
            runs = {"frozen": rollout_rule(actor, prior, "frozen", 0.0, starts, goals, noise, ps),
                    "prior": rollout_rule(actor, prior, "prior", 1.0, starts, goals, noise, ps),
                    "poe_kl": rollout_rule(actor, prior, "poe", alpha_kl, starts, goals, noise, ps)}
            for alpha in ALPHAS:
                runs[f"poe@{alpha}"] = rollout_rule(actor, prior, "poe", alpha, starts, goals, noise, ps)
                runs[f"additive@{alpha}"] = rollout_rule(actor, prior, "additive", alpha, starts, goals, noise, ps)
            out["success"][cell] = {k: v["success"].astype(np.float64).tolist() for k, v in runs.items()}
            if seed == 0:
                k = sizes["paths"]
                out["paths"][cell] = {m: runs[m]["path"][:, :k].tolist() for m in PATH_RULES}
                out["paths"][cell]["goals"] = goals[:k].tolist()
    return out


def nav2d_sizes(P: Profile, workdir: str | None = None) -> dict:
    """The navigation experiment's budget for a profile (``workdir``, when given, holds the HDF5 files)."""
    sizes = {"n_steps": P.pick(smoke=2000, book=10000, full=100000), "bc_steps": P.pick(smoke=200, book=1000, full=5000),
             "batch": 256, "hidden": [64, 64], "episodes": P.pick(smoke=100, book=240, full=1000),
             "kl_states": P.pick(smoke=500, book=2000, full=5000), "paths": 6}
    return {**sizes, "workdir": str(workdir)} if workdir else sizes


def nav2d_study(P: Profile, workdir: str | None = None) -> Study:
    """The navigation experiment over the profile's ``toy_seeds`` seeds."""
    return Study(name="poe_steering-nav2d", arms=(NAV2D,), seeds=tuple(range(P.toy_seeds)), run=run_nav2d_cell,
                 sizes=nav2d_sizes(P, workdir), verdicts=verdicts, modules=MODULES)


def nav2d_output(results: Results, profile_name: str) -> dict:
    """The chapter's dict from a :func:`nav2d_study`'s results (see :func:`run_poe_experiment`)."""
    seeds = list(results.study.seeds)
    per_seed = [results.metrics[(NAV2D, s)] for s in seeds]
    sizes = {k: v for k, v in results.study.sizes.items() if k != "workdir"}
    sizes["hidden"] = tuple(sizes["hidden"])
    cells, labels, cis = {}, {m: {} for m in TALLY_METHODS}, {m: {} for m in TALLY_METHODS}
    for a in ACTORS:
        for p in PRIORS:
            cell = f"{a}|{p}"
            runs = [{k: np.asarray(r["success"][cell][k], dtype=np.float64) for k in RULES} for r in per_seed]
            succ = {k: np.concatenate([r[k] for r in runs]) for k in RULES}
            cells[cell] = {
                "frozen": float(succ["frozen"].mean()), "prior": float(succ["prior"].mean()),
                "poe_kl": float(succ["poe_kl"].mean()),
                "alpha_kl": float(np.mean([r["alpha_kl"][cell] for r in per_seed])),
                "poe": [float(succ[f"poe@{al}"].mean()) for al in ALPHAS],
                "additive": [float(succ[f"additive@{al}"].mean()) for al in ALPHAS],
            }
            cells[cell]["oracle_alpha"] = float(ALPHAS[int(np.argmax(cells[cell]["poe"]))])
            # per seed: mean success of every rule, the claims' paired unit
            cells[cell]["per_seed"] = {k: [float(r[k].mean()) for r in runs] for k in RULES}
            cells[cell]["alpha_kl_per_seed"] = [float(r["alpha_kl"][cell]) for r in per_seed]
            rival = {"poe": succ["poe@0.5"], "additive": succ["additive@0.5"], "prior": succ["prior"],
                     "poe_kl": succ["poe_kl"]}
            for m in TALLY_METHODS:
                ci = paired_bootstrap(rival[m] - succ["frozen"], seed=len(cells))
                cis[m][cell], labels[m][cell] = ci, classify(ci)
    tally = {m: {lab: sum(v == lab for v in labels[m].values()) for lab in ("HELP", "FROZEN", "HURT")}
             for m in TALLY_METHODS}
    sigma_keys = (ACTORS[0], *(f"prior_{p}" for p in PRIORS if p != "random"), *ACTORS[1:])
    sigma = {k: float(np.mean([r["sigma"][k] for r in per_seed])) for k in sigma_keys}
    first = per_seed[0]["paths"]
    paths = {cell: {m: np.asarray(first[cell][m], dtype=np.float64) for m in (*PATH_RULES, "goals")} for cell in first}
    return {"profile": profile_name, "seeds": seeds, "alphas": list(ALPHAS), "kl_budget": KL_BUDGET,
            "actors": list(ACTORS), "priors": list(PRIORS), "sizes": sizes, "cells": cells, "labels": labels,
            "ci": cis, "tally": tally, "sigma": sigma, "paths": paths, "episodes_total": len(seeds) * sizes["episodes"],
            "seconds": results.wall_seconds}


def run_poe_experiment(prof: Profile | None = None, workdir: str | None = None, mujoco: bool | None = None,
                       **run_kw) -> dict:
    """The chapter's claim, measured: compose frozen BC actors of three qualities with good, degraded
    and random goal-conditioned priors on the 2-D navigation task, for every rule, over several seeds
    (:func:`nav2d_study` on the study runner; ``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`).

    Returns a dict with ``cells[actor|prior]`` (mean success of ``frozen``, ``prior``, ``poe_kl``,
    the selected ``alpha_kl``, lists ``poe`` / ``additive`` over ``alphas``, and ``per_seed[rule]``,
    the mean success of each seed, for the claims), ``labels`` and
    ``ci`` (HELP/FROZEN/HURT of each rule in :data:`TALLY_METHODS` against the frozen actor, from a
    paired bootstrap over all episodes of all seeds), ``tally[rule] = {HELP, FROZEN, HURT}``,
    ``sigma`` (mean learned standard deviations), ``paths`` (a few trajectories of seed 0) and
    ``seconds``. With ``mujoco`` (default: the full profile only) it also runs
    :func:`~rlcourse.control.mujoco_cells.run_mujoco_cells` on Hopper-v5 and HalfCheetah-v5.
    """
    prof = prof or current_profile()
    result = nav2d_output(run_study(nav2d_study(prof, workdir), **run_kw), prof.name)
    if mujoco if mujoco is not None else prof.name == "full":
        from ..control.mujoco_cells import run_mujoco_cells

        t0 = time.perf_counter()
        result["mujoco"] = {env_id: run_mujoco_cells(env_id, prof) for env_id in ("Hopper-v5", "HalfCheetah-v5")}
        result["seconds"] += time.perf_counter() - t0
    return result


def run_balance_cell(arm: str, seed: int, sizes: dict) -> dict:
    """One seed of the balance experiment on ``rlcourse.control.mujoco_cells.BALANCE_ENV`` (its
    only arm): build the expert, medium and random data sets and the good prior's (D4RL layout,
    written to HDF5 and read back), clone an actor from each, and evaluate, on the same start states,
    every rule for every actor and prior, plus the LQR expert and the random policy that normalise the
    scores.

    =========================  ============  ===========================================
    score[actor|prior][rule]   scalar        mean normalised score of the seed's episodes
    alpha_kl[actor|prior]      scalar        alpha picked by the KL budget
    reference                  dict          mean raw return of the LQR expert and random
    data_return[grade]         scalar        mean return of the data set's episodes
    lqr_gain                   ``(1, 6)``    the LQR gain
    =========================  ============  ===========================================
    """
    import gymnasium as gym

    if arm != BALANCE_ENV:
        raise ValueError(f"unknown arm {arm!r}; the arms are ({BALANCE_ENV!r},)")
    K = lqr_gain(BALANCE_ENV)
    env = gym.make(BALANCE_ENV)
    envs = make_envs(BALANCE_ENV, sizes["episodes"], sizes["max_steps"])
    with _workdir(sizes, "poe-idp-") as workdir, one_torch_thread():
        out = _balance_seed(seed, sizes, workdir, K, env, envs)
    for e in [env, *envs]:
        e.close()
    return {**out, "lqr_gain": K.tolist()}


def _balance_seed(seed: int, sizes: dict, workdir: str, K: np.ndarray, env, envs: list) -> dict:
    behaviours = {"expert": lqr_policy(K, BALANCE_GRADES["expert"]), "medium": lqr_policy(K, BALANCE_GRADES["medium"]),
                  "random": lambda o, r: r.uniform(-1.0, 1.0, size=1).astype(np.float32),
                  "prior_good": lqr_policy(K, BALANCE_GRADES["prior_good"])}
    models, data, data_return = {}, {}, {}
    for j, (kind, beh) in enumerate(behaviours.items()):
        d = build_dataset(env, beh, sizes["n_steps"], seed=1000 * seed + j)
        data[kind] = load_d4rl_hdf5(save_d4rl_hdf5(d, f"{workdir}/idp_{kind}_s{seed}.hdf5"))
        models[kind] = train_bc(data[kind]["observations"], data[kind]["actions"], sizes["bc_steps"], seed=seed)
        ends = np.flatnonzero(d["terminals"] | d["timeouts"])
        data_return[kind] = float(d["rewards"].sum() / max(len(ends), 1))
    ev_seed = 50_000 + 100 * seed
    run = lambda pol: float(evaluate_policy(envs, pol, ev_seed).mean())  # noqa: E731
    r_exp = run(lambda o: -(idp_state(o) @ K.T))
    rand_rng = np.random.default_rng(ev_seed)
    r_rand = run(lambda o: rand_rng.uniform(-1, 1, size=(len(o), 1)))
    norm = lambda R: 100.0 * (R - r_rand) / (r_exp - r_rand)  # noqa: E731
    priors = {"good": models["prior_good"], "random": RandomPrior(act_dim=1, seed=seed)}
    ps = 77 + seed
    prior_only = {p: norm(run(_composed(models["expert"], pr, "prior", 1.0, ps))) for p, pr in priors.items()}
    score, alpha_kl = {}, {}
    for a in BALANCE_ACTORS:
        actor = models[a]
        frozen = norm(run(_composed(actor, priors["good"], "frozen", 0.0, ps)))
        obs = data[a]["observations"]
        kl_states = obs[np.random.default_rng(seed).choice(len(obs), sizes["kl_states"], replace=False)]
        for p, prior in priors.items():
            cell = f"{a}|{p}"
            mu_a, var_a = actor.predict(kl_states)
            if hasattr(prior, "reset"):
                prior.reset(ps)
            mu_g, var_g = prior.predict(kl_states)
            al = kl_budget_alpha(mu_a, var_a, mu_g, var_g, BALANCE_KL_BUDGET)
            alpha_kl[cell] = float(al)
            score[cell] = {"frozen": frozen, "prior": prior_only[p],
                           "poe": norm(run(_composed(actor, prior, "poe", BALANCE_ALPHA, ps))),
                           "additive": norm(run(_composed(actor, prior, "additive", BALANCE_ALPHA, ps))),
                           "poe_kl": norm(run(_composed(actor, prior, "poe", al, ps)))}
    return {"score": score, "alpha_kl": alpha_kl, "reference": {"expert": r_exp, "random": r_rand},
            "data_return": data_return}


def balance_sizes(prof: Profile) -> dict:
    """The sizes of :func:`run_balance_cells` for a profile."""
    return {"n_steps": prof.pick(smoke=300, book=5000, full=50000),
            "bc_steps": prof.pick(smoke=30, book=600, full=3000),
            "episodes": prof.pick(smoke=2, book=5, full=20),
            "max_steps": prof.pick(smoke=30, book=300, full=1000),
            "kl_states": prof.pick(smoke=100, book=1000, full=5000),
            # the profile's toy seeds (a cell takes about 7 s in the book profile); fewer could not
            # reach the profile's minimum for a verdict
            "seeds": prof.toy_seeds}


def balance_study(prof: Profile, workdir: str | None = None, **overrides) -> Study:
    """The balance experiment over ``sizes["seeds"]`` seeds; ``overrides`` replace entries of
    :func:`balance_sizes`."""
    sizes = dict(balance_sizes(prof), **overrides)
    if workdir:
        sizes["workdir"] = str(workdir)
    return Study(name="poe_steering-balance", arms=(BALANCE_ENV,), seeds=tuple(range(sizes["seeds"])),
                 run=run_balance_cell, sizes=sizes, modules=MODULES)


def run_balance_cells(prof: Profile | None = None, workdir: str | None = None, run_kw: dict | None = None,
                      **overrides) -> dict:
    """PoE steering of frozen BC actors of three grades on InvertedDoublePendulum-v5, over seeds:
    :func:`balance_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`). ``overrides`` replace entries of :func:`balance_sizes`.

    ============== =========================================================================
    score          ``score[actor|prior][rule]``: ``(seeds,)`` mean normalised score per seed
    alpha_kl       ``alpha_kl[actor|prior]``: ``(seeds,)`` alpha picked by the KL budget
    reference      per seed, mean raw return of the LQR expert and of the random policy
    data_return    per grade, mean return of the data set's complete episodes (seed 0)
    sizes, seconds
    ============== =========================================================================
    """
    res = run_study(balance_study(prof or current_profile(), workdir, **overrides), **(run_kw or {}))
    per_seed = [res.metrics[(BALANCE_ENV, s)] for s in res.study.seeds]
    cells = [f"{a}|{p}" for a in BALANCE_ACTORS for p in BALANCE_PRIORS]
    return {"env_id": BALANCE_ENV, "sizes": {k: v for k, v in res.study.sizes.items() if k != "workdir"},
            "alpha": BALANCE_ALPHA, "kl_budget": BALANCE_KL_BUDGET, "grades": dict(BALANCE_GRADES),
            "actors": list(BALANCE_ACTORS), "priors": list(BALANCE_PRIORS),
            "score": {c: {r: [m["score"][c][r] for m in per_seed] for r in BALANCE_RULES} for c in cells},
            "alpha_kl": {c: [m["alpha_kl"][c] for m in per_seed] for c in cells},
            "reference": {k: [m["reference"][k] for m in per_seed] for k in ("expert", "random")},
            "data_return": {k: per_seed[0]["data_return"][k] for k in ("expert", "medium", "random", "prior_good")},
            "lqr_gain": per_seed[0]["lqr_gain"], "seconds": res.wall_seconds}


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
    claims, a :func:`run_balance_cells` result), paired by seed."""
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


def verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`poe_verdicts` on a :func:`nav2d_study`'s results (the navigation claims only)."""
    return poe_verdicts(nav2d_output(results, "study"))
