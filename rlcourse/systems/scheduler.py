"""Schedulers of the JigsawRL simulator: bottom levels, greedy list scheduling and the look-ahead
rollout over a task graph. NumPy only (no torch)."""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np



def _check_graph(durations, preds) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    d = np.asarray(durations, dtype=float)
    if d.ndim != 1 or d.size == 0:
        raise ValueError(f"durations must be a non-empty 1-D array, got shape {d.shape}")
    if not np.all(np.isfinite(d)) or np.any(d < 0):
        raise ValueError("durations must be finite and >= 0")
    if len(preds) != d.size:
        raise ValueError(f"preds has {len(preds)} entries for {d.size} tasks")
    out = []
    for v, ps in enumerate(preds):
        ps = tuple(int(u) for u in ps)
        for u in ps:
            if not 0 <= u < d.size or u == v:
                raise ValueError(f"task {v} has an invalid predecessor {u}")
        out.append(ps)
    return d, out


def _topological_order(n: int, preds: list[tuple[int, ...]]) -> list[int]:
    succ = [[] for _ in range(n)]
    indeg = [len(ps) for ps in preds]
    for v, ps in enumerate(preds):
        for u in ps:
            succ[u].append(v)
    stack = [v for v in range(n) if indeg[v] == 0]
    order = []
    while stack:
        u = stack.pop()
        order.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                stack.append(v)
    if len(order) != n:
        raise ValueError("the task graph has a cycle")
    return order


def bottom_levels(durations, preds) -> np.ndarray:
    """Critical-path priority: the longest path from each task to the end, its own duration included.

    ========= ======== ==========================================
    durations ``(N,)``  task durations
    preds     N tuples  predecessor indices of each task
    returns   ``(N,)``  bottom level; its max is the critical path
    ========= ======== ==========================================
    """
    d, preds = _check_graph(durations, preds)
    order = _topological_order(d.size, preds)
    bl = d.copy()
    succ_best = np.zeros(d.size)
    for v in reversed(order):
        bl[v] = d[v] + succ_best[v]
        for u in preds[v]:
            succ_best[u] = max(succ_best[u], bl[v])
    return bl


@dataclass
class Schedule:
    """A schedule: start and finish times and worker of each task, and the dispatch order."""

    start: np.ndarray
    finish: np.ndarray
    worker: np.ndarray
    order: list
    makespan: float
    ready_sets: list = field(default_factory=list)


def list_schedule(durations, preds, n_workers: int, priority=None, choices: Sequence[int] = (),
                  record_ready: bool = False) -> Schedule:
    """Greedy list scheduling (Graham), simulated event by event.

    Whenever a worker is idle and a task is ready (all predecessors finished), the idle worker with
    the lowest id takes the ready task of highest ``priority`` (ties: lowest index). The first
    ``len(choices)`` dispatches take ``choices[d]`` instead, which must be ready at that moment;
    this is how :func:`lookahead_schedule` explores alternatives (it also asks for
    ``record_ready``: the ready tasks at every dispatch, in ``Schedule.ready_sets``).

    ========= ======== =====================================================
    durations ``(N,)``  task durations
    preds     N tuples  predecessor indices of each task
    n_workers ``M``     identical workers
    priority  ``(N,)``  larger runs first; default :func:`bottom_levels`
    choices   ``(D,)``  forced task for each of the first D dispatches
    returns   Schedule  start, finish, worker ``(N,)``; order; makespan
    ========= ======== =====================================================
    """
    d, preds = _check_graph(durations, preds)
    if not isinstance(n_workers, (int, np.integer)) or n_workers < 1:
        raise ValueError(f"n_workers must be an integer >= 1, got {n_workers!r}")
    n = d.size
    prio = bottom_levels(d, preds) if priority is None else np.asarray(priority, dtype=float)
    if prio.shape != (n,):
        raise ValueError(f"priority must have shape ({n},), got {prio.shape}")
    succ = [[] for _ in range(n)]
    indeg = [len(ps) for ps in preds]
    for v, ps in enumerate(preds):
        for u in ps:
            succ[u].append(v)
    is_ready = [False] * n
    ready: list = []
    for v in range(n):
        if indeg[v] == 0:
            is_ready[v] = True
            heapq.heappush(ready, (-prio[v], v))
    idle = list(range(int(n_workers)))
    heapq.heapify(idle)
    running: list = []  # (finish, worker, task)
    start = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    worker = np.full(n, -1, dtype=np.int64)
    order: list[int] = []
    ready_sets: list[list[int]] = []
    t, done = 0.0, 0
    while done < n:
        while idle:
            while ready and not is_ready[ready[0][1]]:
                heapq.heappop(ready)  # drop entries already dispatched by a forced choice
            if not ready:
                break
            k = len(order)
            if record_ready:
                ready_sets.append(sorted({u for _, u in ready if is_ready[u]}, key=lambda u: (-prio[u], u)))
            if k < len(choices):
                v = int(choices[k])
                if not (0 <= v < n and is_ready[v]):
                    raise ValueError(f"forced choice {v} at dispatch {k} is not a ready task")
            else:
                v = heapq.heappop(ready)[1]
            is_ready[v] = False
            w = heapq.heappop(idle)
            start[v], finish[v], worker[v] = t, t + d[v], w
            order.append(v)
            heapq.heappush(running, (t + d[v], w, v))
        if not running:
            raise ValueError("deadlock: no task can run (is the graph acyclic?)")
        t = running[0][0]
        while running and running[0][0] == t:
            _, w, u = heapq.heappop(running)
            heapq.heappush(idle, w)
            done += 1
            for v in succ[u]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    is_ready[v] = True
                    heapq.heappush(ready, (-prio[v], v))
    return Schedule(start, finish, worker, order, float(finish.max()), ready_sets)


def lookahead_schedule(durations, preds, n_workers: int, width: int = 2, priority=None) -> Schedule:
    """Fortified look-ahead (a rollout algorithm) over greedy list scheduling, with exact durations.

    The incumbent starts as the greedy schedule. At dispatch ``d`` the scheduler tries the ``width``
    highest-priority ready tasks; for each it simulates the rest of the schedule greedily, and it
    adopts a candidate only if the predicted makespan beats the incumbent. It then commits the
    incumbent's ``d``-th choice. ``width = 1`` is the greedy scheduler exactly.

    ========= ======== ===============================================
    durations ``(N,)``  task durations (assumed known: exact prediction)
    preds     N tuples  predecessor indices
    n_workers ``M``     identical workers
    width     int       candidates tried per dispatch (>= 1)
    returns   Schedule  never longer than ``list_schedule``'s
    ========= ======== ===============================================
    """
    if not isinstance(width, (int, np.integer)) or width < 1:
        raise ValueError(f"width must be an integer >= 1, got {width!r}")
    d, preds = _check_graph(durations, preds)
    prio = bottom_levels(d, preds) if priority is None else np.asarray(priority, dtype=float)
    best = list_schedule(d, preds, n_workers, prio, record_ready=width > 1)
    if width == 1:
        return best
    prefix: list[int] = []
    for k in range(d.size):
        for c in best.ready_sets[k][:width]:  # the ready set at dispatch k, best first
            if c == best.order[k]:
                continue
            trial = list_schedule(d, preds, n_workers, prio, prefix + [c], record_ready=True)
            if trial.makespan < best.makespan - 1e-9:
                best = trial
        prefix.append(best.order[k])
    return best
