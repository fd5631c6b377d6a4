"""The simulator proper: one pipeline set scheduled with one of :data:`SCHEDULERS`, the chapter's
sweep over the tail weight, and Amdahl's view of a stage-level schedule. NumPy only (no torch)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..profiles import Profile, profile as current_profile
from .costs import StageCosts, sample_lengths
from .graph import TaskGraph, build_graph
from .scheduler import Schedule, bottom_levels, list_schedule, lookahead_schedule

SCHEDULERS = ("stage", "multiplex", "migrate", "lookahead")



@dataclass
class SimResult:
    """What one simulated run measured."""

    scheduler: str
    makespan: float
    tokens: int
    work: float
    critical_path: float
    migrations: int
    schedule: Schedule
    graph: TaskGraph

    @property
    def throughput(self) -> float:
        """Generated tokens per unit time."""
        return self.tokens / self.makespan

    def idle_fraction(self, n_workers: int) -> float:
        """``1 - W / (M * makespan)``: the share of worker-time with no task."""
        return 1.0 - self.work / (n_workers * self.makespan)


def simulate(lengths, n_workers: int, costs: StageCosts, scheduler: str, width: int = 2) -> SimResult:
    """Schedule ``P`` pipelines' ``K`` iterations with one of :data:`SCHEDULERS`.

    ========= ============= ======================================
    lengths   ``(P, K, B)``  rollout lengths (the only randomness)
    n_workers ``M``          workers
    scheduler str            stage, multiplex, migrate or lookahead
    width     int            look-ahead candidates per dispatch
    returns   SimResult      makespan, throughput, work, ...
    ========= ============= ======================================
    """
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; choose one of {SCHEDULERS}")
    mode = "migrate" if scheduler == "lookahead" else scheduler
    g = build_graph(lengths, n_workers, costs, mode)
    if scheduler == "lookahead":
        sched = lookahead_schedule(g.durations, g.preds, n_workers, width=width)
        fallback = simulate(lengths, n_workers, costs, "stage")
        if fallback.makespan < sched.makespan:  # exact predictions: run the better plan
            return SimResult("lookahead", fallback.makespan, g.tokens, fallback.work, fallback.critical_path,
                             0, fallback.schedule, fallback.graph)
    else:
        sched = list_schedule(g.durations, g.preds, n_workers)
    cp = float(bottom_levels(g.durations, g.preds).max())
    return SimResult(scheduler, sched.makespan, g.tokens, g.work, cp, g.migrations, sched, g)


def experiment_sizes(prof: Profile) -> dict:
    """The sizes of the chapter's simulated runs for a profile (pipelines ``P``, iterations ``K``,
    workers ``M``, batch ``B``, mean and maximum length, seeds (the profile's ``toy_seeds``), look-ahead
    width, ``sigma_p``)."""
    return dict(
        pipelines=prof.pick(smoke=2, book=3), iterations=prof.pick(smoke=2, book=3),
        workers=4, batch=prof.pick(smoke=32, book=128), mean_len=256, max_len=4096,
        seeds=prof.toy_seeds, width=2, sigma_p=1.0,
    )


def stage_rollout_share(result: SimResult, n_workers: int) -> dict:
    """Amdahl's view of a ``stage`` schedule: how much of it is rollout, and how full the rollout is.

    In the stage-level plan every stage runs alone between barriers. Rollout stages last ``R`` in
    total (from their common start to their slowest shard) and hold ``W_roll`` worker-time; the other
    stages are ``M`` equal chunks, so they are perfectly packed.

    ========= ========= =========================================================
    result    SimResult  a ``simulate(..., "stage")`` result
    n_workers ``M``      its workers
    returns   dict       ``s = R / C`` (rollout share of the makespan),
                         ``u = W_roll / (M R)`` (rollout utilisation),
                         ``amdahl = 1 / (1 - s (1 - u))`` and ``area = C M / W``
    ========= ========= =========================================================
    """
    if not isinstance(result, SimResult) or result.scheduler != "stage":
        raise ValueError("stage_rollout_share needs a SimResult of the 'stage' scheduler")
    g, sch = result.graph, result.schedule
    spans: dict = {}
    w_roll = 0.0
    for v, kind in enumerate(g.kind):
        if kind != "rollout":
            continue
        key = (g.pipeline[v], g.iteration[v])
        lo, hi = spans.get(key, (np.inf, -np.inf))
        spans[key] = (min(lo, sch.start[v]), max(hi, sch.finish[v]))
        w_roll += g.durations[v]
    R = float(sum(hi - lo for lo, hi in spans.values()))
    C, M = result.makespan, int(n_workers)
    s, u = R / C, w_roll / (M * R)
    return {"s": s, "u": u, "amdahl": 1.0 / (1.0 - s * (1.0 - u)), "area": C * M / result.work}


def run_jigsaw_experiment(prof: Profile | None = None, seed: int = 0, costs: StageCosts | None = None) -> dict:
    """Throughput of the four schedulers against the tail weight ``sigma`` of rollout lengths.

    For every seed, one set of standard-normal draws ``z`` of shape ``(P, K, B)`` is shared by all
    ``sigma`` (common random numbers), so only the tail changes along the sweep. A second sweep
    varies the number of pipelines ``P`` at ``sigma = sigma_p``. ``costs`` defaults to the
    synthetic :class:`StageCosts`; pass the result of :func:`measure_stage_costs` to use measured ones.

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
    ================== ============== ========================================================
    """

    prof = prof or current_profile()
    sizes = experiment_sizes(prof)
    sigmas = np.array(prof.pick(smoke=[0.0, 1.0], book=[0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5]))
    pipelines = np.array(prof.pick(smoke=[1, 2], book=[1, 2, 3, 4]))
    if costs is None:
        costs = StageCosts()
    if not isinstance(costs, StageCosts):
        raise TypeError(f"costs must be a StageCosts, got {type(costs).__name__}")
    P, K, M, B = sizes["pipelines"], sizes["iterations"], sizes["workers"], sizes["batch"]
    S, R = len(sigmas), sizes["seeds"]
    thr = {s: np.zeros((R, S)) for s in SCHEDULERS}
    idle = {s: np.zeros((R, S)) for s in SCHEDULERS}
    work = {s: np.zeros((R, S)) for s in SCHEDULERS}
    migrations = np.zeros((R, S))
    bound = np.zeros((R, S))
    by_p = {s: np.zeros((R, len(pipelines))) for s in SCHEDULERS}
    t0 = time.perf_counter()
    for r in range(R):
        z = np.random.default_rng([seed, r]).standard_normal((int(pipelines.max()) + P, K, B))
        for i, sigma in enumerate(sigmas):
            lengths = sample_lengths(z[:P], sizes["mean_len"], float(sigma), sizes["max_len"])
            res = {s: simulate(lengths, M, costs, s, width=sizes["width"]) for s in SCHEDULERS}
            for s in SCHEDULERS:
                thr[s][r, i] = res[s].throughput
                idle[s][r, i] = res[s].idle_fraction(M)
                work[s][r, i] = res[s].work
            migrations[r, i] = res["migrate"].migrations
            mux = res["multiplex"]
            bound[r, i] = res["stage"].makespan / max(mux.work / M, mux.critical_path)
        for j, n_pipe in enumerate(pipelines):
            lengths = sample_lengths(z[P:P + n_pipe], sizes["mean_len"], sizes["sigma_p"], sizes["max_len"])
            res = {s: simulate(lengths, M, costs, s, width=sizes["width"]) for s in SCHEDULERS}
            for s in SCHEDULERS:
                by_p[s][r, j] = res[s].throughput / res["stage"].throughput
    gain = {s: thr[s] / thr["stage"] for s in SCHEDULERS}
    return {"sigmas": sigmas, "throughput": thr, "gain": gain, "idle": idle, "work": work,
            "migrations": migrations, "bound_gain": bound, "pipelines": pipelines, "gain_by_pipelines": by_p,
            "sizes": sizes, "costs": costs, "seconds": time.perf_counter() - t0}
