"""A discrete-event simulator of multiplexed RL pipelines, and the schedulers of the JigsawRL chapter.

An RL iteration of one pipeline (one fine-tuning job) is four stages: **rollout** (decode the
responses), **reward** (score them), **reference** (log-probs under the frozen reference) and
**training** (the update). The simulator cuts every stage into *sub-stages*, one per worker (a GPU
group), so that a stage on ``M`` workers is ``M`` tasks. A schedule assigns each task a worker and
a start time, respecting the task graph (precedence) and one task at a time per worker.

Four schedulers share the same inputs (the rollout lengths) and the same cost model:

==========  ==================================================================================
stage       verl-like: one stage at a time on all workers, pipelines take turns (a barrier
            after every stage); the makespan is the sum over stages of the slowest sub-stage.
multiplex   the sub-stage graph of all pipelines, greedy list scheduling with critical-path
            priority: an idle worker takes any ready sub-stage of any pipeline.
migrate     multiplex, plus long-tail migration: when a rollout shard has fewer than ``tau``
            sequences left, its tail is moved (re-prefilled) onto one worker with the other
            shards' tails, when that saves more worker-time than it costs.
lookahead   a fortified rollout (look-ahead) over the ``migrate`` graph with exact durations,
            and the stage-level plan as a fallback; never worse than either (see the chapter).
==========  ==================================================================================

The costs are :class:`StageCosts`: synthetic by default, or measured on rlcourse's own RL loop by
:func:`measure_stage_costs` (decode steps of :func:`rlcourse.lm.sample`, the per-token stage times
that :class:`rlcourse.train.Trainer` logs, a prefill for migration), in units of one decode step.

The model is a teaching reconstruction, not JigsawRL's own formulation (see the chapter).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .profiles import Profile, profile as current_profile

SCHEDULERS = ("stage", "multiplex", "migrate", "lookahead")
STAGES = ("rollout", "reward", "ref", "train")


# ----------------------------------------------------------------------------------------------
# Cost model
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StageCosts:
    """Durations of the simulated stages, in abstract time units.

    A decode step with ``n`` active sequences on one worker takes ``decode_step + decode_per_seq * n``
    (memory-bound weight reads plus a per-sequence term, a roofline-style model). Reward, reference
    and training cost a fixed time per token of the iteration, split evenly over the workers.
    Migrating a tail costs ``mig_fixed`` plus ``mig_per_token`` per prefix token re-prefilled on the
    destination worker.
    """

    decode_step: float = 1.0
    decode_per_seq: float = 1.0 / 32
    reward_per_token: float = 0.002
    ref_per_token: float = 0.004
    train_per_token: float = 0.012
    mig_fixed: float = 5.0
    mig_per_token: float = 0.002
    tau: int = 4

    def __post_init__(self):
        for name in ("decode_step", "decode_per_seq", "reward_per_token", "ref_per_token",
                     "train_per_token", "mig_fixed", "mig_per_token"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"StageCosts.{name} must be finite and >= 0, got {value!r}")
        if not isinstance(self.tau, (int, np.integer)) or self.tau < 1:
            raise ValueError(f"StageCosts.tau must be an integer >= 1, got {self.tau!r}")

    def scaled(self, factor: float) -> "StageCosts":
        """Every duration multiplied by ``factor > 0`` (a change of time unit); ``tau`` is kept."""
        if not (np.isfinite(factor) and factor > 0):
            raise ValueError(f"factor must be finite and > 0, got {factor!r}")
        return StageCosts(*(v * factor for v in (self.decode_step, self.decode_per_seq, self.reward_per_token,
                                                 self.ref_per_token, self.train_per_token, self.mig_fixed,
                                                 self.mig_per_token)), tau=self.tau)


def _as_lengths(lengths, name: str = "lengths", ndim: int = 1) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise TypeError(f"{name} must hold whole token counts, got dtype {arr.dtype}")
        arr = arr.astype(np.int64)
    if np.any(arr < 1):
        raise ValueError(f"{name} must be >= 1 token each, got min {arr.min()}")
    return arr.astype(np.int64)


def sample_lengths(z: np.ndarray, mean: float, sigma: float, max_len: int) -> np.ndarray:
    """Log-normal response lengths with a fixed mean: ``L = clip(round(mean * exp(sigma z - sigma^2/2)))``.

    ``sigma`` is the tail weight: 0 gives constant lengths ``mean``; larger values a heavier tail
    with the same (unclipped) mean. Passing the same standard-normal draws ``z`` for every ``sigma``
    gives common random numbers across a sweep.

    ======= ======== ==========================================
    z       ``(...)`` standard-normal draws
    returns ``(...)`` int64 lengths in ``[1, max_len]``
    ======= ======== ==========================================
    """
    z = np.asarray(z, dtype=float)
    if not np.all(np.isfinite(z)):
        raise ValueError("z must be finite")
    if not (mean >= 1 and np.isfinite(mean)):
        raise ValueError(f"mean must be a finite number >= 1, got {mean!r}")
    if not (sigma >= 0 and np.isfinite(sigma)):
        raise ValueError(f"sigma (tail weight) must be finite and >= 0, got {sigma!r}")
    if int(max_len) < mean:
        raise ValueError(f"max_len={max_len} is below the mean length {mean}")
    raw = mean * np.exp(sigma * z - 0.5 * sigma**2)
    return np.clip(np.round(raw), 1, int(max_len)).astype(np.int64)


def decode_time(lengths, decode_step: float, decode_per_seq: float) -> float:
    """Time to decode a batch of sequences on one worker: ``a * max(L) + b * sum(L)``.

    At step ``t`` the ``n_t = #{i : L_i >= t}`` unfinished sequences each emit one token, and the
    step takes ``a + b n_t``; summing over ``t = 1..max L`` gives the closed form.

    ============== ====== =============================================
    lengths        ``(n,)`` response lengths in tokens
    decode_step    ``a``    fixed cost of one decode step
    decode_per_seq ``b``    extra cost per active sequence per step
    returns        scalar   decode time of the batch
    ============== ====== =============================================
    """
    L = _as_lengths(lengths)
    return float(decode_step * L.max() + decode_per_seq * L.sum())


def fit_decode_cost(n_active, step_seconds) -> tuple[float, float]:
    """Least-squares fit of ``t_step(n) = a + b n`` to measured decode-step times.

    Use it to put a real engine's costs (for instance timings of :func:`rlcourse.lm.sample`) into
    :class:`StageCosts` (``decode_step=a, decode_per_seq=b``), in the same time unit as the other costs.

    ============ ======== ==========================================
    n_active     ``(S,)``  active sequences during each measured step
    step_seconds ``(S,)``  the measured time of each step
    returns      (a, b)    intercept and slope
    ============ ======== ==========================================
    """
    n = np.asarray(n_active, dtype=float)
    t = np.asarray(step_seconds, dtype=float)
    if n.ndim != 1 or n.shape != t.shape:
        raise ValueError(f"n_active {n.shape} and step_seconds {t.shape} must be 1-D of the same length")
    if not (np.all(np.isfinite(n)) and np.all(np.isfinite(t))):
        raise ValueError("n_active and step_seconds must be finite")
    if np.unique(n).size < 2:
        raise ValueError("need steps with at least two different batch sizes to fit a and b")
    b, a = np.polyfit(n, t, 1)
    return float(a), float(b)


def sync_idle_fraction(lengths) -> float:
    """Fraction of decode slots left idle when batches of sequences wait for their longest one.

    For ``N`` batches of ``B`` sequences, slots are ``B * max_i L_i`` per batch and used slots
    ``sum_i L_i``; the idle fraction is ``1 - sum L / (B * sum max L)``.

    ======= ========== ============================
    lengths ``(N, B)`` lengths, one batch per row
    returns scalar     idle fraction in ``[0, 1)``
    ======= ========== ============================
    """
    L = np.asarray(lengths, dtype=float)
    if L.ndim != 2 or L.size == 0:
        raise ValueError(f"lengths must be a non-empty (N, B) array, got shape {L.shape}")
    if np.any(~np.isfinite(L)) or np.any(L <= 0):
        raise ValueError("lengths must be finite and positive")
    return float(1.0 - L.sum() / (L.shape[1] * L.max(axis=1).sum()))


def exponential_idle_fraction(batch: int) -> float:
    """Closed form of :func:`sync_idle_fraction` for i.i.d. exponential lengths: ``1 - 1/H_B``,
    with ``H_B = 1 + 1/2 + ... + 1/B`` (since ``E[max] = H_B E[L]``)."""
    if not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    return float(1.0 - 1.0 / np.sum(1.0 / np.arange(1, batch + 1)))


def split_tail(lengths, tau: int) -> tuple[int, np.ndarray]:
    """Cut a rollout shard where fewer than ``tau`` sequences remain active.

    The cut step ``c`` is the ``tau``-th largest length (0 if the shard has fewer than ``tau``
    sequences); after step ``c`` at most ``tau - 1`` sequences are unfinished, with
    ``R_i = max(L_i - c, 0)`` tokens left.

    ======= ====== =========================================
    lengths ``(n,)`` response lengths of one shard
    returns (c, R)  cut step; ``R`` is ``(n,)`` remaining tokens
    ======= ====== =========================================
    """
    L = _as_lengths(lengths)
    if not isinstance(tau, (int, np.integer)) or tau < 1:
        raise ValueError(f"tau must be an integer >= 1, got {tau!r}")
    cut = int(np.sort(L)[::-1][tau - 1]) if L.size >= tau else 0
    return cut, np.maximum(L - cut, 0)


def migration_saving(shards: Sequence, costs: StageCosts) -> dict:
    """Worker-time saved by merging the tails of a stage's rollout shards onto one worker.

    Left alone, the tail of shard ``j`` occupies its worker for ``a max_i R_ij + b sum_i R_ij``.
    Merged, one worker decodes all tails in ``c_mig + a max_ij R_ij + b sum_ij R_ij``. The busy
    worker-time saved is ``a (sum_j max_i R_ij - max_ij R_ij) - c_mig``.

    ======= ================ ====================================================
    shards  ``M x (n_j,)``   the lengths of each shard of one rollout stage
    returns dict             cuts ``(M,)``, remaining list, c_mig, saving, head/tail durations
    ======= ================ ====================================================
    """
    if len(shards) < 1:
        raise ValueError("need at least one shard")
    a, b = costs.decode_step, costs.decode_per_seq
    cuts, rem, heads = [], [], []
    for shard in shards:
        L = _as_lengths(shard, "shard")
        c, R = split_tail(L, costs.tau)
        cuts.append(c)
        rem.append(R)
        heads.append(a * c + b * float(np.minimum(L, c).sum()))
    moved_prefix = sum(c * int(np.count_nonzero(R)) for c, R in zip(cuts, rem))
    c_mig = costs.mig_fixed + costs.mig_per_token * moved_prefix
    max_r = np.array([int(R.max()) for R in rem])
    sum_r = float(sum(int(R.sum()) for R in rem))
    tail = c_mig + a * float(max_r.max()) + b * sum_r
    saving = a * float(max_r.sum() - max_r.max()) - c_mig
    return {"cuts": np.array(cuts), "remaining": rem, "c_mig": float(c_mig), "saving": float(saving),
            "head": np.array(heads), "tail": float(tail), "any_tail": bool(max_r.max() > 0)}


# ----------------------------------------------------------------------------------------------
# Task graphs
# ----------------------------------------------------------------------------------------------

@dataclass
class TaskGraph:
    """Sub-stages (tasks) with durations and predecessors; ``pipeline``, ``iteration`` and
    ``kind`` label each task for plots and tests."""

    durations: list = field(default_factory=list)
    preds: list = field(default_factory=list)
    pipeline: list = field(default_factory=list)
    iteration: list = field(default_factory=list)
    kind: list = field(default_factory=list)
    tokens: int = 0
    migrations: int = 0

    def add(self, duration: float, preds: Sequence[int], pipeline: int, iteration: int, kind: str) -> int:
        self.durations.append(float(duration))
        self.preds.append(tuple(int(p) for p in preds))
        self.pipeline.append(pipeline)
        self.iteration.append(iteration)
        self.kind.append(kind)
        return len(self.durations) - 1

    @property
    def work(self) -> float:
        """Total busy worker-time ``W = sum_v d_v``."""
        return float(np.sum(self.durations))


def build_graph(lengths, n_workers: int, costs: StageCosts, mode: str) -> TaskGraph:
    """The task graph of ``P`` pipelines running ``K`` synchronous iterations on ``M`` workers.

    Each iteration's ``B`` sequences are dealt into ``M`` rollout shards of ``B/M``; reward,
    reference and training are ``M`` equal chunks each (cost per token times the iteration's tokens
    over ``M``). ``mode`` is ``"stage"`` (a barrier after every stage, pipelines interleaved
    round-robin), ``"multiplex"`` (per-pipeline dependencies only) or ``"migrate"`` (multiplex, with
    each rollout stage split into heads and one merged tail when :func:`migration_saving` is > 0).

    ========= ============= ===============================================
    lengths   ``(P, K, B)``  response lengths of pipeline p, iteration k
    n_workers ``M``          workers; ``B`` must be a multiple of ``M``
    returns   TaskGraph      tasks in a topological order
    ========= ============= ===============================================
    """
    L = _as_lengths(lengths, "lengths", ndim=3)
    if not isinstance(n_workers, (int, np.integer)) or n_workers < 1:
        raise ValueError(f"n_workers must be an integer >= 1, got {n_workers!r}")
    if mode not in ("stage", "multiplex", "migrate"):
        raise ValueError(f"unknown graph mode {mode!r}; choose stage, multiplex or migrate")
    P, K, B = L.shape
    M = int(n_workers)
    if B % M:
        raise ValueError(f"batch B={B} is not a multiple of the number of workers M={M}")
    a, b = costs.decode_step, costs.decode_per_seq
    g = TaskGraph(tokens=int(L.sum()))
    last_train: dict[int, list[int]] = {p: [] for p in range(P)}
    barrier: list[int] = []  # the previous stage's tasks, for mode "stage"
    for k in range(K):
        for p in range(P):
            shards = L[p, k].reshape(M, B // M)
            tok = float(L[p, k].sum())
            dep = barrier if mode == "stage" else last_train[p]
            rollout = []
            mig = migration_saving(list(shards), costs) if mode == "migrate" else None
            if mig is not None and mig["any_tail"] and mig["saving"] > 0:
                heads = [g.add(h, dep, p, k, "rollout") for h in mig["head"]]
                rollout = heads + [g.add(mig["tail"], heads, p, k, "tail")]
                g.migrations += 1
            else:
                rollout = [g.add(decode_time(s, a, b), dep, p, k, "rollout") for s in shards]
            if mode == "stage":
                reward = [g.add(costs.reward_per_token * tok / M, rollout, p, k, "reward") for _ in range(M)]
                ref = [g.add(costs.ref_per_token * tok / M, reward, p, k, "ref") for _ in range(M)]
                train = [g.add(costs.train_per_token * tok / M, ref, p, k, "train") for _ in range(M)]
                barrier = train
            else:
                reward = [g.add(costs.reward_per_token * tok / M, rollout, p, k, "reward") for _ in range(M)]
                ref = [g.add(costs.ref_per_token * tok / M, rollout, p, k, "ref") for _ in range(M)]
                train = [g.add(costs.train_per_token * tok / M, reward + ref, p, k, "train") for _ in range(M)]
            last_train[p] = train
    return g


# ----------------------------------------------------------------------------------------------
# Scheduling
# ----------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------
# Simulation and the chapter's experiment
# ----------------------------------------------------------------------------------------------

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
    workers ``M``, batch ``B``, mean and maximum length, seeds, look-ahead width, ``sigma_p``)."""
    return dict(
        pipelines=prof.pick(smoke=2, book=3), iterations=prof.pick(smoke=2, book=3),
        workers=4, batch=prof.pick(smoke=32, book=128), mean_len=256, max_len=4096,
        seeds=prof.pick(smoke=1, book=5), width=2, sigma_p=1.0,
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
    import time

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


# ----------------------------------------------------------------------------------------------
# Measured costs: the stage times of rlcourse's own RL loop
# ----------------------------------------------------------------------------------------------

MEASURED_STAGES = ("reward", "ref", "train")


def _finite_pair(pair, name: str) -> tuple[float, float]:
    values = tuple(float(v) for v in np.asarray(pair, dtype=float).reshape(-1))
    if len(values) != 2 or not all(np.isfinite(values)):
        raise ValueError(f"{name} must be two finite numbers (intercept, slope), got {pair!r}")
    return values


def stage_costs_from_seconds(decode_fit, per_token_seconds: dict, prefill_fit, tau: int = 4) -> StageCosts:
    """Measured seconds to :class:`StageCosts` in the simulator's unit, the fixed cost ``a`` of one decode step.

    Every duration is divided by ``a``, so ``decode_step = 1``. Scaling all durations by one factor
    changes no scheduling decision (see the chapter), so the choice of unit loses nothing.

    ================= ============ ===========================================================
    decode_fit        ``(a, b)``    seconds: a decode step with ``n`` active rows takes ``a + b n``
    per_token_seconds dict         seconds per token of ``"reward"``, ``"ref"`` and ``"train"``
    prefill_fit       ``(f, g)``    seconds: re-prefilling ``N`` tokens (a migration) takes ``f + g N``
    tau               int          migration threshold, kept as is
    returns           StageCosts   ``decode_step=1, decode_per_seq=b/a, *_per_token=s/a,``
                                   ``mig_fixed=f/a, mig_per_token=g/a``
    ================= ============ ===========================================================
    """
    a, b = _finite_pair(decode_fit, "decode_fit")
    f, g = _finite_pair(prefill_fit, "prefill_fit")
    if a <= 0:
        raise ValueError(f"the fixed cost of a decode step must be > 0 seconds to serve as the unit, got a={a!r}")
    if b < 0 or f < 0 or g < 0:
        raise ValueError(f"decode slope b={b!r} and prefill fit f={f!r}, g={g!r} must be >= 0 seconds")
    if not isinstance(per_token_seconds, dict) or set(per_token_seconds) != set(MEASURED_STAGES):
        got = sorted(per_token_seconds) if isinstance(per_token_seconds, dict) else type(per_token_seconds).__name__
        raise ValueError(f"per_token_seconds must have exactly the keys {MEASURED_STAGES}, got {got}")
    per = {k: float(v) for k, v in per_token_seconds.items()}
    for k, v in per.items():
        if not (np.isfinite(v) and v >= 0):
            raise ValueError(f"per_token_seconds[{k!r}] must be finite and >= 0, got {v!r}")
    return StageCosts(decode_step=1.0, decode_per_seq=b / a, reward_per_token=per["reward"] / a,
                      ref_per_token=per["ref"] / a, train_per_token=per["train"] / a,
                      mig_fixed=f / a, mig_per_token=g / a, tau=tau)


class _NeverEOS:
    """A tokenizer proxy whose EOS id matches no token, so that ``sample`` decodes every step."""

    eos_token_id = -1

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)


def _check_sizes(values, name: str) -> list[int]:
    out = [int(v) for v in values]
    if len(out) == 0 or any(v < 1 for v in out) or any(v != u for v, u in zip(out, values)):
        raise ValueError(f"{name} must be a non-empty list of integers >= 1, got {values!r}")
    return out


def time_decode_steps(model, tokenizer, prompts, batch_sizes, steps=(8, 40), repeats: int = 5):
    """Seconds per decode step of :func:`rlcourse.lm.sample` (the loop's synchronous engine).

    For each batch size, each repeat times one ``sample`` call of ``steps[0]`` and one of ``steps[1]``
    new tokens with EOS disabled (every row decodes to the end). The difference cancels the prefill
    and the bookkeeping; the median over repeats of ``(t_long - t_short) / (steps[1] - steps[0])``
    is the time of one decode step with ``n`` active rows.

    =========== ======== ==========================================================
    prompts     list     prompt strings, reused cyclically to fill a batch
    batch_sizes ``(S,)``  rows per call, the active sequences ``n`` of every step
    steps       (s, l)   new tokens of the short and the long call, ``s < l``
    returns     (n, t)   ``(S,)`` batch sizes and ``(S,)`` median seconds per step
    =========== ======== ==========================================================
    """
    import time

    import torch

    from .lm.sampling import sample

    sizes = _check_sizes(batch_sizes, "batch_sizes")
    short, long_ = (int(s) for s in steps)
    if not 1 <= short < long_:
        raise ValueError(f"steps must be (short, long) with 1 <= short < long, got {steps!r}")
    if not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    if len(prompts) == 0:
        raise ValueError("prompts is empty")
    never = _NeverEOS(tokenizer)
    gen = torch.Generator().manual_seed(0)
    per_step = []
    for n in sizes:
        rows = [prompts[i % len(prompts)] for i in range(n)]
        sample(model, never, rows, max_new_tokens=short, generator=gen)  # warm-up
        diffs = []
        for _ in range(int(repeats)):
            t = []
            for new in (short, long_):
                t0 = time.perf_counter()
                batch = sample(model, never, rows, max_new_tokens=new, generator=gen)
                t.append(time.perf_counter() - t0)
                if batch.response_ids.shape[1] != new:
                    raise RuntimeError(f"sample stopped after {batch.response_ids.shape[1]} of {new} steps")
            diffs.append((t[1] - t[0]) / (long_ - short))
        per_step.append(float(np.median(diffs)))
    return np.array(sizes, dtype=float), np.array(per_step)


def time_prefill(model, tokenizer, prompt: str, rows, lengths, repeats: int = 5):
    """Seconds of a one-token ``sample`` call on ``rows`` prompts of ``lengths`` characters: a prefill.

    A migrated sequence is re-prefilled on its new worker (prompt and the response so far), so this
    is the cost a migration pays. Fit ``f + g N`` to the result with :func:`fit_decode_cost`.

    ======= ======== ===================================================
    prompt  str      text repeated to build prompts of a given length
    rows    ``(R,)``  batch sizes
    lengths ``(Q,)``  prompt lengths in characters
    returns (N, t)   ``(R*Q,)`` prompt tokens per call, median seconds
    ======= ======== ===================================================
    """
    import time

    import torch

    from .lm.sampling import encode_prompts, sample

    rows, lengths = _check_sizes(rows, "rows"), _check_sizes(lengths, "lengths")
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be a non-empty string")
    gen = torch.Generator().manual_seed(0)
    tokens, seconds = [], []
    for n in rows:
        for ell in lengths:
            text = (prompt * (ell // len(prompt) + 1))[:ell]
            batch = [text] * n
            tokens.append(int(encode_prompts(tokenizer, batch)[1].sum()))
            sample(model, tokenizer, batch, max_new_tokens=1, generator=gen)  # warm-up
            t = []
            for _ in range(int(repeats)):
                t0 = time.perf_counter()
                sample(model, tokenizer, batch, max_new_tokens=1, generator=gen)
                t.append(time.perf_counter() - t0)
            seconds.append(float(np.median(t)))
    return np.array(tokens, dtype=float), np.array(seconds)


def time_trainer_stages(model, tokenizer, task, prof: Profile, steps: int = 3, beta: float = 0.04,
                        seed: int = 0) -> dict:
    """Per-step stage seconds and token counts of a short :class:`rlcourse.train.Trainer` run.

    The run trains a copy of ``model`` (the caller's weights are untouched) with ``beta > 0``, so a
    frozen reference exists and ``time_reference`` is measured. One warm-up step is run and dropped.

    ======= ======== ===========================================================
    steps   int      timed steps ``K`` (after the warm-up)
    returns dict     ``(K,)`` arrays: time_rollout, time_reward, time_reference,
                     time_update, prompt_tokens, response_tokens
    ======= ======== ===========================================================
    """
    import copy

    from .lm.zoo import max_new_tokens_for
    from .tasks import get_task
    from .train import RLConfig, Trainer

    if not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0 so that the reference stage runs, got {beta!r}")
    task = get_task(task)
    cfg = RLConfig(beta=beta, steps=steps + 1, prompts_per_step=prof.rl_prompts, num_generations=prof.num_generations,
                   max_completion_length=max_new_tokens_for(task), learning_rate=prof.rl_lr, seed=seed,
                   train_pool_size=256, eval_prompts=1, progress=False)
    trainer = Trainer(copy.deepcopy(model), tokenizer, task, cfg)
    history = [trainer.step() for _ in range(steps + 1)][1:]
    keys = ("time_rollout", "time_reward", "time_reference", "time_update", "prompt_tokens", "response_tokens")
    return {k: np.array([h[k] for h in history], dtype=float) for k in keys}


def measure_stage_costs(model, tokenizer, task, prof: Profile | None = None, tau: int = 4, beta: float = 0.04,
                        seed: int = 0) -> tuple[StageCosts, dict]:
    """The stage costs of rlcourse's own loop on this machine, as :class:`StageCosts` (unit: ``a``).

    * decode: :func:`time_decode_steps` at several batch sizes, fitted to ``a + b n``;
    * reward, reference, training: seconds per token (prompt and response) of a short
      :func:`time_trainer_stages` run, median over its steps;
    * migration: :func:`time_prefill` fitted to ``f + g N`` (fixed cost ``f``, ``g`` per token);
    * response lengths: ``RolloutBatch.lengths`` of the model on the task's prompts, as the loop samples.

    ========= ============ ==============================================================
    model     LM           the tiny policy (weights are not changed)
    task      str/Task     prompts for timing and for the lengths
    returns   (costs, d)   :class:`StageCosts`; ``d`` holds the raw seconds, fits and lengths
    ========= ============ ==============================================================
    """
    import time

    import torch

    from .lm.sampling import sample
    from .lm.zoo import max_new_tokens_for
    from .tasks import get_task

    prof = prof or current_profile()
    task = get_task(task)
    t0 = time.perf_counter()
    prompts = [e.prompt for e in task.examples(prof.pick(smoke=16, book=64), seed=seed)]
    reps = prof.pick(smoke=3, book=9)
    n, step_s = time_decode_steps(model, tokenizer, prompts, prof.pick(smoke=[1, 4, 16], book=[1, 2, 4, 8, 16, 32, 64]),
                                  steps=prof.pick(smoke=(4, 12), book=(8, 40)), repeats=reps)
    a, b = fit_decode_cost(n, step_s)
    pre_tok, pre_s = time_prefill(model, tokenizer, prompts[0], prof.pick(smoke=[1, 8], book=[1, 4, 16]),
                                  prof.pick(smoke=[8, 32], book=[8, 24, 48]), repeats=reps)
    f, g = fit_decode_cost(pre_tok, pre_s)
    stages = time_trainer_stages(model, tokenizer, task, prof, steps=prof.pick(smoke=1, book=4), beta=beta, seed=seed)
    tokens = stages["prompt_tokens"] + stages["response_tokens"]
    per_token = {stage: float(np.median(stages[key] / tokens)) for stage, key in
                 (("reward", "time_reward"), ("ref", "time_reference"), ("train", "time_update"))}
    clipped = [name for name, v in (("b", b), ("f", f), ("g", g)) if v < 0]  # noise can push a fit below 0
    costs = stage_costs_from_seconds((a, max(b, 0.0)), per_token, (max(f, 0.0), max(g, 0.0)), tau=tau)
    gen = torch.Generator().manual_seed(seed)
    rollout = sample(model, tokenizer, prompts, num_generations=prof.num_generations,
                     max_new_tokens=max_new_tokens_for(task), temperature=1.0, generator=gen)
    details = {"n": n, "step_seconds": step_s, "decode_fit": (a, b), "prefill_tokens": pre_tok,
               "prefill_seconds": pre_s, "prefill_fit": (f, g), "stages": stages, "per_token_seconds": per_token,
               "lengths": rollout.lengths.numpy().astype(np.int64), "truncated": float(rollout.truncated.float().mean()),
               "clipped": clipped, "seconds": time.perf_counter() - t0}
    return costs, details


def tail_weight(lengths) -> float:
    """The tail weight of a length sample: the standard deviation of ``log L``.

    For ``L = m exp(sigma z - sigma^2 / 2)`` (:func:`sample_lengths` before rounding) it is ``sigma``
    exactly in expectation of the sample variance, whatever ``m``: this places any length sample on
    the sweep's axis.

    ======= ======== =======================
    lengths ``(N,)``  lengths, ``N >= 2``
    returns scalar   ``std(log L)`` (ddof 0)
    ======= ======== =======================
    """
    L = _as_lengths(lengths)
    if L.size < 2:
        raise ValueError("need at least two lengths to measure a spread")
    return float(np.std(np.log(L)))


def resample_lengths(measured, shape, mean_len: float, max_len: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap draws from measured lengths, rescaled to a target mean: ``round(L* mean_len / mean(L))``.

    Rescaling keeps every ratio ``L_i / L_j`` (up to rounding), so the tail weight of
    :func:`tail_weight` and the idle fraction of :func:`sync_idle_fraction` are kept; only the
    time scale of a rollout changes.

    ======== ========== ==================================================
    measured ``(N,)``    measured response lengths
    shape    tuple       output shape, e.g. ``(P, K, B)``
    returns  ``shape``   int64 lengths in ``[1, max_len]``
    ======== ========== ==================================================
    """
    L = _as_lengths(measured, "measured")
    if not (np.isfinite(mean_len) and mean_len >= 1):
        raise ValueError(f"mean_len must be a finite number >= 1, got {mean_len!r}")
    if int(max_len) < mean_len:
        raise ValueError(f"max_len={max_len} is below mean_len={mean_len}")
    draws = rng.choice(L, size=tuple(shape), replace=True).astype(float)
    return np.clip(np.round(draws * mean_len / L.mean()), 1, int(max_len)).astype(np.int64)


def run_measured_jigsaw_experiment(prof: Profile | None = None, seed: int = 0, task: str = "addition",
                                   strength: str = "medium") -> dict:
    """The chapter's sweep with stage costs measured on rlcourse's loop, and one run on its own lengths.

    Loads the zoo's base model for ``task``, measures its :class:`StageCosts` under one torch thread
    (:func:`measure_stage_costs`), reruns :func:`run_jigsaw_experiment` with them, and simulates the
    four schedulers on bootstrap draws of the model's own response lengths rescaled to the sweep's
    mean length (:func:`resample_lengths`).

    ============== ============ ============================================================
    costs          StageCosts   measured; ``synthetic`` holds the default ones for comparison
    details        dict         raw timings, fits and lengths (:func:`measure_stage_costs`)
    sweep          dict         :func:`run_jigsaw_experiment` with the measured costs
    own_sigma      scalar       :func:`tail_weight` of the measured lengths
    own_gain[s]    ``(R,)``      gain over ``stage`` on the rescaled measured lengths, per seed
    ============== ============ ============================================================
    """
    import time

    from .lm.zoo import load_base_model
    from .profiles import one_torch_thread

    prof = prof or current_profile()
    t0 = time.perf_counter()
    model, tokenizer = load_base_model(task, strength, prof=prof, progress=False)
    with one_torch_thread():
        costs, details = measure_stage_costs(model, tokenizer, task, prof, seed=seed)
    sweep = run_jigsaw_experiment(prof, seed, costs=costs)
    sz = experiment_sizes(prof)
    shape = (sz["pipelines"], sz["iterations"], sz["batch"])
    own_thr = {s: np.zeros(sz["seeds"]) for s in SCHEDULERS}
    for r in range(sz["seeds"]):
        lengths = resample_lengths(details["lengths"], shape, sz["mean_len"], sz["max_len"],
                                   np.random.default_rng([seed, r, 1]))
        for s in SCHEDULERS:
            own_thr[s][r] = simulate(lengths, sz["workers"], costs, s, width=sz["width"]).throughput
    return {"costs": costs, "synthetic": StageCosts(), "details": details, "sweep": sweep,
            "own_sigma": tail_weight(details["lengths"]), "own_mean_len": float(np.mean(details["lengths"])),
            "own_throughput": own_thr, "own_gain": {s: own_thr[s] / own_thr["stage"] for s in SCHEDULERS},
            "seconds": time.perf_counter() - t0}
