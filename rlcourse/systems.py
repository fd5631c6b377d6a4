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


def run_jigsaw_experiment(prof: Profile | None = None, seed: int = 0) -> dict:
    """Throughput of the four schedulers against the tail weight ``sigma`` of rollout lengths.

    For every seed, one set of standard-normal draws ``z`` of shape ``(P, K, B)`` is shared by all
    ``sigma`` (common random numbers), so only the tail changes along the sweep. A second sweep
    varies the number of pipelines ``P`` at ``sigma = sigma_p``.

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
    sizes = dict(
        pipelines=prof.pick(smoke=2, book=3), iterations=prof.pick(smoke=2, book=3),
        workers=4, batch=prof.pick(smoke=32, book=128), mean_len=256, max_len=4096,
        seeds=prof.pick(smoke=1, book=5), width=2, sigma_p=1.0,
    )
    sigmas = np.array(prof.pick(smoke=[0.0, 1.0], book=[0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5]))
    pipelines = np.array(prof.pick(smoke=[1, 2], book=[1, 2, 3, 4]))
    costs = StageCosts()
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
