"""Task graphs of the JigsawRL simulator: the sub-stages of P pipelines' K iterations on M workers.
NumPy only (no torch)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .costs import StageCosts, _as_lengths, decode_time, migration_saving, split_tail


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
