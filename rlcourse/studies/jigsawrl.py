"""The JigsawRL chapter's study: the four schedulers of :mod:`rlcourse.systems` against the tail weight
of rollout lengths, and the paper's claims.

The arms are the schedulers (``rlcourse.systems.SCHEDULERS``), the seeds the profile's
``toy_seeds``. A cell simulates one scheduler on one seed's draws of rollout lengths at every tail
weight ``sigma`` and for every number of pipelines (:func:`run_cell`); its standard-normal draws come
from ``default_rng([base_seed, seed])``, so every scheduler of a seed sees the same lengths (common
random numbers) and no cell depends on another. :func:`run_jigsaw_experiment` runs the grid on the
study runner (cached per cell) and rebuilds the chapter's arrays; :func:`run_measured_jigsaw_experiment`
does the same with stage costs measured on rlcourse's own loop, plus a second grid on the loop's own
response lengths (:func:`own_lengths_study`).

**The claims.** JigsawRL's abstract (Pipeline Multiplexing for RL post-training, arXiv abstract in the
course's seed file) reports "up to 1.85x throughput over Verl on synchronous RL" on 4-64 GPUs, from
multiplexing pipelines over a sub-stage graph, "migrating long-tail rollouts across workers" and a
look-ahead scheduler. We test the direction of both parts in the simulator, paired by seed (each seed is
one set of length draws shared by all schedulers), at the sweep's tail weight ``sigma = 1``:

========================  ================================================================  =======
claim                     method vs baseline (per seed)                                     kind
========================  ================================================================  =======
``gain``                  look-ahead throughput / stage-level throughput vs 1               greater
``migration``             look-ahead gain vs multiplexing-alone gain                        greater
``gain-measured``         ``gain`` with stage costs measured on rlcourse's loop             greater
``gain-own-lengths``      ``gain`` with measured costs on the tiny LM's own lengths         greater
========================  ================================================================  =======

The margins are 0: the abstract claims a gain, and its 1.85x is a maximum over its setups ("up to"),
not a level every setup must reach, so it is reported beside our effect (``paper_number``) rather
than used as a threshold. The sweep over ``sigma`` is the control of the last claim: with the same
measured costs it shows where the gain appears, so a verdict on the model's own (light-tailed)
lengths is a statement about the lengths, not about an experiment that could not see a gain.
"""
from __future__ import annotations

import time
from dataclasses import asdict

import numpy as np

from ..claims import Claim, Verdict, evaluate
from ..profiles import Profile, profile as current_profile
from ..systems.costs import StageCosts, resample_lengths, sample_lengths, tail_weight
from ..systems.simulator import SCHEDULERS, simulate
from .runner import Results, Study, run_study

MODULES = ("rlcourse.systems.costs", "rlcourse.systems.graph", "rlcourse.systems.scheduler",
           "rlcourse.systems.simulator")
SWEEP_KEYS = ("sigmas", "pipeline_counts", "base_seed", "costs")  # the study's sizes beyond experiment_sizes


def experiment_sizes(prof: Profile) -> dict:
    """The sizes of the chapter's simulated runs for a profile (pipelines ``P``, iterations ``K``,
    workers ``M``, batch ``B``, mean and maximum length, seeds (the profile's ``toy_seeds``), look-ahead
    width, ``sigma_p``)."""
    return dict(
        pipelines=prof.pick(smoke=2, book=3), iterations=prof.pick(smoke=2, book=3),
        workers=4, batch=prof.pick(smoke=32, book=128), mean_len=256, max_len=4096,
        seeds=prof.toy_seeds, width=2, sigma_p=1.0,
    )


def _scheduler(arm: str) -> str:
    if arm not in SCHEDULERS:
        raise ValueError(f"unknown arm {arm!r}; the arms are the schedulers {SCHEDULERS}")
    return arm


def _costs(sizes: dict) -> StageCosts:
    return StageCosts(**sizes["costs"])


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Scheduler ``arm`` on seed ``seed``'s length draws, at every tail weight and number of pipelines.

    ========================  ========  ===================================================
    throughput, idle, work    ``(S,)``   tokens per time unit, idle share, busy worker-time
    makespan, critical_path   ``(S,)``   of the scheduled graph, per tail weight
    migrations                ``(S,)``   rollout stages whose tails were merged
    throughput_by_pipelines   ``(Q,)``   throughput at ``sigma_p`` for each number of pipelines
    ========================  ========  ===================================================
    """
    sched, costs = _scheduler(arm), _costs(sizes)
    P, K, M, B = sizes["pipelines"], sizes["iterations"], sizes["workers"], sizes["batch"]
    shape = (max(sizes["pipeline_counts"]) + P, K, B)
    z = np.random.default_rng([sizes["base_seed"], seed]).standard_normal(shape)  # the seed's common draws
    out = {k: [] for k in ("throughput", "idle", "work", "makespan", "critical_path", "migrations",
                           "throughput_by_pipelines")}
    for sigma in sizes["sigmas"]:
        lengths = sample_lengths(z[:P], sizes["mean_len"], float(sigma), sizes["max_len"])
        res = simulate(lengths, M, costs, sched, width=sizes["width"])
        row = {"throughput": res.throughput, "idle": res.idle_fraction(M), "work": res.work,
               "makespan": res.makespan, "critical_path": res.critical_path, "migrations": res.migrations}
        for key, value in row.items():
            out[key].append(float(value))
    for n_pipe in sizes["pipeline_counts"]:
        lengths = sample_lengths(z[P:P + n_pipe], sizes["mean_len"], sizes["sigma_p"], sizes["max_len"])
        res = simulate(lengths, M, costs, sched, width=sizes["width"])
        out["throughput_by_pipelines"].append(float(res.throughput))
    return out


def jigsaw_study(prof: Profile | None = None, seed: int = 0, costs: StageCosts | None = None) -> Study:
    """The chapter's sweep as a grid: every scheduler on the profile's ``toy_seeds`` seeds, with base
    seed ``seed`` and stage costs ``costs`` (default: the synthetic :class:`rlcourse.systems.StageCosts`)."""
    prof = prof or current_profile()
    costs = StageCosts() if costs is None else costs
    if not isinstance(costs, StageCosts):
        raise TypeError(f"costs must be a StageCosts, got {type(costs).__name__}")
    sizes = experiment_sizes(prof)
    sizes.update(sigmas=prof.pick(smoke=[0.0, 1.0], book=[0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5]),
                 pipeline_counts=prof.pick(smoke=[1, 2], book=[1, 2, 3, 4]), base_seed=int(seed),
                 costs={k: (int(v) if k == "tau" else float(v)) for k, v in asdict(costs).items()})
    return Study(name="jigsawrl", arms=SCHEDULERS, seeds=tuple(range(sizes["seeds"])), run=run_cell, sizes=sizes,
                 verdicts=sweep_verdicts, modules=MODULES)


def sweep_from_results(results: Results) -> dict:
    """The chapter's arrays from a :func:`jigsaw_study`'s results (``R`` seeds, ``S`` tail weights).

    ================== ============== ========================================================
    sigmas             ``(S,)``        tail weights swept
    throughput[sched]  ``(R, S)``      tokens per time unit, one row per seed
    gain[sched]        ``(R, S)``      throughput over the stage-level throughput
    idle[sched]        ``(R, S)``      share of worker-time with no task
    work[sched]        ``(R, S)``      busy worker-time W of the scheduled graph
    bound_gain         ``(R, S)``      ``C_stage / max(W/M, CP)`` of the multiplex graph
    migrations         ``(R, S)``      rollout stages whose tails were merged
    pipelines          ``(Q,)``        numbers of pipelines of the second sweep
    gain_by_pipelines  dict of (R, Q)  gains at ``sigma_p`` for each ``P``
    sizes, costs       dict, costs     :func:`experiment_sizes` and the :class:`StageCosts`
    ================== ============== ========================================================
    """
    sz = results.study.sizes

    def arr(sched, metric):
        return np.array(results.values(sched, metric), dtype=float)

    thr = {s: arr(s, "throughput") for s in SCHEDULERS}
    by_p = {s: arr(s, "throughput_by_pipelines") for s in SCHEDULERS}
    bound = arr("stage", "makespan") / np.maximum(arr("multiplex", "work") / sz["workers"],
                                                   arr("multiplex", "critical_path"))
    return {"sigmas": np.array(sz["sigmas"]), "throughput": thr, "gain": {s: thr[s] / thr["stage"] for s in SCHEDULERS},
            "idle": {s: arr(s, "idle") for s in SCHEDULERS}, "work": {s: arr(s, "work") for s in SCHEDULERS},
            "migrations": arr("migrate", "migrations"), "bound_gain": bound,
            "pipelines": np.array(sz["pipeline_counts"]),
            "gain_by_pipelines": {s: by_p[s] / by_p["stage"] for s in SCHEDULERS},
            "sizes": {k: v for k, v in sz.items() if k not in SWEEP_KEYS}, "costs": _costs(sz),
            "seconds": results.wall_seconds}


def run_jigsaw_experiment(prof: Profile | None = None, seed: int = 0, costs: StageCosts | None = None,
                          **run_kw) -> dict:
    """Throughput of the four schedulers against the tail weight ``sigma`` of rollout lengths:
    :func:`jigsaw_study` on the study runner (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`), as
    :func:`sweep_from_results`'s arrays. A second sweep varies the number of pipelines ``P`` at
    ``sigma = sigma_p``. Pass the costs of :func:`rlcourse.systems.measure_stage_costs` to use measured ones."""
    return sweep_from_results(run_study(jigsaw_study(prof, seed, costs), **run_kw))


def run_own_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Scheduler ``arm`` on bootstrap draws (``default_rng([base_seed, seed, 1])``) of the measured
    lengths rescaled to the sweep's mean: ``{"throughput": float}``."""
    shape = (sizes["pipelines"], sizes["iterations"], sizes["batch"])
    lengths = resample_lengths(np.array(sizes["own_lengths"], dtype=np.int64), shape, sizes["mean_len"],
                               sizes["max_len"], np.random.default_rng([sizes["base_seed"], seed, 1]))
    res = simulate(lengths, sizes["workers"], _costs(sizes), _scheduler(arm), width=sizes["width"])
    return {"throughput": float(res.throughput)}


def own_lengths_study(prof: Profile, lengths, costs: StageCosts, seed: int = 0) -> Study:
    """Every scheduler on the profile's seeds, on the loop's own response ``lengths`` (``(N,)`` ints)."""
    sweep = jigsaw_study(prof, seed, costs)
    sizes = {k: v for k, v in sweep.sizes.items() if k not in ("sigmas", "pipeline_counts")}
    sizes["own_lengths"] = [int(n) for n in np.asarray(lengths).reshape(-1)]
    return Study(name="jigsawrl-own-lengths", arms=SCHEDULERS, seeds=sweep.seeds, run=run_own_cell, sizes=sizes,
                 modules=MODULES)


def run_measured_jigsaw_experiment(prof: Profile | None = None, seed: int = 0, task: str = "addition",
                                   strength: str = "medium", **run_kw) -> dict:
    """The chapter's sweep with stage costs measured on rlcourse's loop, and one run on its own lengths.

    Loads the zoo's base model for ``task``, measures its :class:`StageCosts` under one torch thread
    (:func:`rlcourse.systems.measure_stage_costs`), reruns :func:`run_jigsaw_experiment` with them, and
    simulates the four schedulers on bootstrap draws of the model's own response lengths rescaled to
    the sweep's mean length (:func:`own_lengths_study`).

    ============== ============ ============================================================
    costs          StageCosts   measured; ``synthetic`` holds the default ones for comparison
    details        dict         raw timings, fits and lengths (``measure_stage_costs``)
    sweep          dict         :func:`run_jigsaw_experiment` with the measured costs
    own_sigma      scalar       :func:`rlcourse.systems.tail_weight` of the measured lengths
    own_gain[s]    ``(R,)``      gain over ``stage`` on the rescaled measured lengths, per seed
    ============== ============ ============================================================
    """
    from ..lm.zoo import load_base_model
    from ..profiles import one_torch_thread
    from ..systems import measure

    prof = prof or current_profile()
    t0 = time.perf_counter()
    model, tokenizer = load_base_model(task, strength, prof=prof, progress=False)
    with one_torch_thread():
        costs, details = measure.measure_stage_costs(model, tokenizer, task, prof, seed=seed)
    sweep = run_jigsaw_experiment(prof, seed, costs=costs, **run_kw)
    own = run_study(own_lengths_study(prof, details["lengths"], costs, seed), **run_kw)
    own_thr = {s: np.array(own.values(s, "throughput"), dtype=float) for s in SCHEDULERS}
    return {"costs": costs, "synthetic": StageCosts(), "details": details, "sweep": sweep,
            "own_sigma": tail_weight(details["lengths"]), "own_mean_len": float(np.mean(details["lengths"])),
            "own_throughput": own_thr, "own_gain": {s: own_thr[s] / own_thr["stage"] for s in SCHEDULERS},
            "seconds": time.perf_counter() - t0}


# --------------------------------------------------------------------------------------------
# The paper's claims, and their verdicts on the sweeps
# --------------------------------------------------------------------------------------------

PAPER = ("JigsawRL: pipeline multiplexing for RL post-training (JigsawRL authors, 2026; arXiv abstract as in "
         "the course's seed file)")
_STATEMENT = ("On 4-64 H100/A100 GPUs across different agentic RL pipelines and models, JigsawRL achieves up "
              "to 1.85x throughput over Verl on synchronous RL")
_MIGRATION = ("JigsawRL ... eliminates fragmented utilization by migrating long-tail rollouts across workers, "
              "and formulates their coordination as a graph scheduling problem solved with a look-ahead heuristic")
_SIM = ("discrete-event simulator, 3 pipelines x 3 synchronous iterations x 128 sequences on 4 workers, "
        "log-normal rollout lengths (mean 256, sigma = 1)")

CLAIMS = {
    "gain": Claim(
        key="jigsawrl/gain", paper=PAPER, statement=_STATEMENT, source="abstract", paper_number="up to 1.85x",
        setting=_SIM + ", synthetic GPU-like stage costs", metric="throughput of the look-ahead scheduler over "
        "the stage-level (verl-like) scheduler's, per seed", method="look-ahead (multiplexing + migration)",
        baseline=None, reference=1.0, kind="greater", margin=0.0, unit="{:.3f}"),
    "migration": Claim(
        key="jigsawrl/migration", paper=PAPER, statement=_MIGRATION, source="abstract", paper_number="",
        setting=_SIM + ", synthetic GPU-like stage costs", metric="throughput gain over the stage-level "
        "scheduler, per seed", method="look-ahead (multiplexing + migration)", baseline="multiplexing alone",
        kind="greater", margin=0.0, unit="{:.3f}"),
    "gain-measured": Claim(
        key="jigsawrl/gain-measured", paper=PAPER, statement=_STATEMENT, source="abstract",
        paper_number="up to 1.85x", setting=_SIM + ", stage costs measured on rlcourse's own loop (tiny LM, CPU)",
        metric="throughput of the look-ahead scheduler over the stage-level scheduler's, per seed",
        method="look-ahead (multiplexing + migration)", baseline=None, reference=1.0, kind="greater",
        margin=0.0, unit="{:.3f}"),
    "gain-own-lengths": Claim(
        key="jigsawrl/gain-own-lengths", paper=PAPER, statement=_STATEMENT, source="abstract",
        paper_number="up to 1.85x", setting="the same simulator and measured costs, on bootstrap draws of the "
        "tiny LM's own response lengths rescaled to mean 256", metric="throughput of the look-ahead scheduler "
        "over the stage-level scheduler's, per seed", method="look-ahead (multiplexing + migration)",
        baseline=None, reference=1.0, kind="greater", margin=0.0, unit="{:.3f}"),
}


def _at_sigma(sweep: dict, sigma: float) -> int:
    sigmas = np.asarray(sweep["sigmas"], dtype=float)
    i = int(np.argmin(np.abs(sigmas - sigma)))
    if abs(sigmas[i] - sigma) > 1e-9:
        raise ValueError(f"the sweep has no tail weight sigma = {sigma} (it has {sigmas.tolist()})")
    return i


def jigsaw_verdicts(sweep: dict, measured: dict | None = None, sigma: float = 1.0) -> dict[str, Verdict]:
    """Evaluate :data:`CLAIMS` on :func:`run_jigsaw_experiment`'s output (and, when given, on
    :func:`run_measured_jigsaw_experiment`'s), at tail weight ``sigma``.

    ========  ======  ==============================================================
    sweep     dict    ``gain[s]`` of shape ``(R, S)``, ``sigmas`` ``(S,)``, ``seconds``
    measured  dict    ``sweep`` (same layout, measured costs), ``own_gain[s]`` ``(R,)``
    returns   dict    claim name -> :class:`rlcourse.claims.Verdict`
    ========  ======  ==============================================================
    """
    i = _at_sigma(sweep, sigma)
    g = sweep["gain"]
    out = {
        "gain": evaluate(CLAIMS["gain"], g["lookahead"][:, i], seconds=sweep.get("seconds")),
        "migration": evaluate(CLAIMS["migration"], g["lookahead"][:, i], g["multiplex"][:, i],
                              seconds=sweep.get("seconds")),
    }
    if measured is not None:
        ms = measured["sweep"]
        j = _at_sigma(ms, sigma)
        out["gain-measured"] = evaluate(CLAIMS["gain-measured"], ms["gain"]["lookahead"][:, j],
                                        seconds=measured.get("seconds"))
        out["gain-own-lengths"] = evaluate(CLAIMS["gain-own-lengths"], measured["own_gain"]["lookahead"],
                                           seconds=measured.get("seconds"))
    return out


def sweep_verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`jigsaw_verdicts` on a :func:`jigsaw_study`'s results, at ``sigma = 1``."""
    return jigsaw_verdicts(sweep_from_results(results), sigma=1.0)
