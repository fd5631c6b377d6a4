"""The simulator proper: one pipeline set scheduled with one of :data:`SCHEDULERS`, and Amdahl's view
of a stage-level schedule. NumPy only (no torch). The chapter's sweep over the tail weight is
:mod:`rlcourse.studies.jigsawrl`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .costs import StageCosts
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
