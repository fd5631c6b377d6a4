"""HeaPA's prompt pool: a cold queue, a low partition (a max-heap on the pass rate whose top is the boundary) and a
high partition (twin min/max heaps with lazy deletion), bounded in size (Wang et al., 2026, arXiv:2601.22448).

The pool is a data structure with no registry entry of its own: the prompt samplers of
:mod:`rlcourse.methods.heapa` keep one in the trainer's state, and the exact toy of
:mod:`rlcourse.studies.curriculum_toy` drives the same class.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

import torch

SAMPLING_MODES = ("medium", "boundary")


@dataclass
class Record:
    """One prompt of the pool. ``rate`` is the latest group's pass rate (None while unscored),
    ``k``/``n`` that group's reward sum and size, ``key`` the rate the heaps order by (the rate
    pooled with the children's, see :meth:`HeapPool.path_key`), ``where`` one of ``cold``,
    ``low``, ``high``, ``out`` (drawn, waiting for its score) or ``gone`` (evicted)."""

    rid: int
    item: object
    rate: float | None = None
    k: float = 0.0
    n: int = 0
    key: float | None = None
    parent: int | None = None
    children: list = field(default_factory=list)
    where: str = "cold"
    seq: int = -1


class HeapPool:
    """The HeaPA pool: cold queue, low max-heap (boundary on top), high twin heaps, bounded size.

    ===============  ========================================================================
    capacity         most records kept (cold + low + high; drawn records count too)
    low_fraction     the low partition holds ``floor(low_fraction * capacity)`` records at most
    records          ``rid -> Record`` for every record ever added (evicted ones stay, ``gone``)
    ===============  ========================================================================

    Costs: :meth:`boundary` reads a heap top, O(1) amortised; inserting or removing a record is a few
    heap pushes and pops, O(log M); lazy deletion leaves stale heap entries that are skipped when
    they reach a top.
    """

    def __init__(self, capacity: int, low_fraction: float = 0.5):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if not 0.0 < low_fraction < 1.0:
            raise ValueError(f"low_fraction must lie in (0, 1), got {low_fraction}")
        self.capacity, self.low_fraction = int(capacity), float(low_fraction)
        self.low_cap = max(1, int(self.capacity * self.low_fraction))
        self.records: dict[int, Record] = {}
        self.cold: deque = deque()
        self.low: list = []        # (-key, seq, rid): a max-heap on key
        self.low_ids: list = []    # the low rids, for uniform draws
        self.low_pos: dict = {}
        self.high_min: list = []   # (key, seq, rid)
        self.high_max: list = []   # (-key, seq, rid)
        self.n_high = 0
        self.n_out = 0
        self._seq = 0
        self.added = self.evicted = 0

    # -------------------------------------------------------------- sizes and views
    def __len__(self) -> int:
        return len(self.cold) + len(self.low_ids) + self.n_high + self.n_out

    def sizes(self) -> dict:
        return {"cold": len(self.cold), "low": len(self.low_ids), "high": self.n_high, "out": self.n_out}

    def _valid(self, entry, where: str) -> bool:
        rec = self.records[entry[2]]
        return rec.where == where and rec.seq == entry[1]

    def _top(self, heap: list, where: str):
        while heap and not self._valid(heap[0], where):
            heapq.heappop(heap)
        return heap[0] if heap else None

    def boundary(self) -> float | None:
        """The largest key in the low partition (the easiest of the hard prompts), or None."""
        top = self._top(self.low, "low")
        return None if top is None else -top[0]

    def partition(self, where: str) -> list[int]:
        return [r.rid for r in self.records.values() if r.where == where]

    # -------------------------------------------------------------- insertion and removal
    def add(self, item, parent: int | None = None) -> int:
        """Add an unscored record (to the cold queue) and evict past capacity; returns its id."""
        rid = len(self.records)
        self.records[rid] = Record(rid=rid, item=item, parent=parent)
        if parent is not None:
            self.records[parent].children.append(rid)
        self.cold.append(rid)
        self.added += 1
        self._evict()
        return rid

    def _push(self, rec: Record, where: str) -> None:
        self._seq += 1
        rec.seq, rec.where = self._seq, where
        if where == "low":
            heapq.heappush(self.low, (-rec.key, rec.seq, rec.rid))
            self.low_pos[rec.rid] = len(self.low_ids)
            self.low_ids.append(rec.rid)
        else:
            heapq.heappush(self.high_min, (rec.key, rec.seq, rec.rid))
            heapq.heappush(self.high_max, (-rec.key, rec.seq, rec.rid))
            self.n_high += 1

    def _detach(self, rec: Record) -> None:
        """Take ``rec`` out of its partition (heap entries die lazily)."""
        if rec.where == "low":
            i = self.low_pos.pop(rec.rid)
            last = self.low_ids.pop()
            if last != rec.rid:
                self.low_ids[i] = last
                self.low_pos[last] = i
        elif rec.where == "high":
            self.n_high -= 1
        elif rec.where == "cold":
            self.cold.remove(rec.rid)
        elif rec.where == "out":
            self.n_out -= 1
        rec.where, rec.seq = "detached", -1

    def _insert_scored(self, rec: Record) -> None:
        """Insert a scored record: into the low partition, then :meth:`_rebalance`."""
        self._push(rec, "low")
        self._rebalance()

    def _move(self, rid: int, where: str) -> None:
        rec = self.records[rid]
        self._detach(rec)
        self._push(rec, where)

    def _rebalance(self) -> None:
        """Keep the low partition exactly the ``low_cap`` lowest keys of the scored records present:
        overflow moves the boundary record up to high; room is filled with high's lowest key; and
        while high's lowest key is below the boundary, the two swap. Each move is O(log M)."""
        while len(self.low_ids) > self.low_cap:
            self._move(self._top(self.low, "low")[2], "high")
        while len(self.low_ids) < self.low_cap and self.n_high:
            self._move(self._top(self.high_min, "high")[2], "low")
        while self.n_high and self.low_ids:
            lo_top, hi_bottom = self._top(self.low, "low"), self._top(self.high_min, "high")
            if hi_bottom[0] >= -lo_top[0]:
                break
            self._move(lo_top[2], "high")
            self._move(hi_bottom[2], "low")

    def _evict(self) -> None:
        """Past capacity, remove the lowest key of the high partition (as the authors' pool does),
        then, with an empty high partition, the lowest key of the low one, then the oldest cold."""
        while len(self) > self.capacity:
            top = self._top(self.high_min, "high")
            if top is not None:
                victim = self.records[top[2]]
            elif self.low_ids:
                victim = self.records[min(self.low_ids, key=lambda r: (self.records[r].key, r))]
            elif self.cold:
                victim = self.records[self.cold[0]]
            else:
                raise RuntimeError(f"pool over capacity {self.capacity} with only drawn records left")
            self._detach(victim)
            victim.where = "gone"
            self.evicted += 1
        self._rebalance()

    # -------------------------------------------------------------- scores
    def path_key(self, rid: int) -> float:
        """The pass rate pooled over a record's scored subtree (itself, children, grandchildren...),
        each weighted by its rollouts: ``sum k / sum n`` (the chapter's reading of PathAgg)."""
        k, n, stack = 0.0, 0, [rid]
        while stack:
            rec = self.records[stack.pop()]
            if rec.rate is not None and rec.where != "gone":
                k, n = k + rec.k, n + rec.n
            stack.extend(rec.children)
        return k / n if n else self.records[rid].rate

    def score(self, rid: int, k: float, n: int) -> None:
        """Record a group's reward sum ``k`` over ``n`` rollouts for ``rid``, re-insert it under its
        new key, and re-key its ancestors (each taken out and re-inserted)."""
        if n < 1 or not 0 <= k <= n:
            raise ValueError(f"a group needs n >= 1 and 0 <= k <= n, got k={k}, n={n}")
        rec = self.records[rid]
        if rec.where == "gone":
            return
        rec.k, rec.n, rec.rate = float(k), int(n), float(k) / n
        chain, a = [], rid
        while a is not None:
            chain.append(a)
            a = self.records[a].parent
        for a in chain:
            r = self.records[a]
            if r.rate is None or r.where == "gone":
                continue
            r.key = self.path_key(a)
            if r.where in ("low", "high") or a == rid:  # a drawn ancestor keeps its new key until scored
                self._detach(r)
                self._push(r, "low")
        self._rebalance()

    # -------------------------------------------------------------- draws
    def draw(self, n: int, generator: torch.Generator, mode: str = "medium") -> list[int]:
        """``n`` distinct records to roll out: the cold queue first (FIFO), then the low partition
        (``medium``: uniformly; ``boundary``: the largest keys first), then, if still short, the high
        partition from its lowest key up. Drawn records are ``out`` until :meth:`score`."""
        if mode not in SAMPLING_MODES:
            raise ValueError(f"unknown sampling mode {mode!r}; choose one of {SAMPLING_MODES}")
        free = len(self.cold) + len(self.low_ids) + self.n_high
        if n > free:
            raise ValueError(f"asked for {n} prompts from a pool with {free} prompts not already drawn")
        chosen = []
        while self.cold and len(chosen) < n:
            chosen.append(self.cold[0])
            self._take(self.cold[0])
        need = n - len(chosen)
        if need and self.low_ids:
            if mode == "medium":
                rows = torch.randperm(len(self.low_ids), generator=generator)[:need].tolist()
                picks = [self.low_ids[i] for i in rows]
                for rid in picks:
                    self._take(rid)
            else:  # pop the boundary, then the next largest key, ...
                picks = []
                while len(picks) < need and self.low_ids:
                    picks.append(self._top(self.low, "low")[2])
                    self._take(picks[-1])
            chosen += picks
        while len(chosen) < n:
            top = self._top(self.high_min, "high")
            chosen.append(top[2])
            self._take(top[2])
        self._rebalance()
        return chosen

    def _take(self, rid: int) -> None:
        rec = self.records[rid]
        self._detach(rec)
        rec.where = "out"
        self.n_out += 1

    def release(self, rid: int) -> None:
        """Put back a drawn record that got no score (to the cold queue if never scored)."""
        rec = self.records[rid]
        if rec.where != "out":
            raise ValueError(f"record {rid} is {rec.where}, not drawn")
        self._detach(rec)
        if rec.rate is None:
            rec.where = "cold"
            self.cold.appendleft(rid)
        else:
            self._insert_scored(rec)

    def check(self) -> None:
        """Assert the invariants (tests call it): sizes add up, at most ``capacity`` records, the low
        partition within ``low_cap`` once full, every high key >= every low key."""
        where = [r.where for r in self.records.values()]
        assert where.count("low") == len(self.low_ids) and where.count("high") == self.n_high
        assert where.count("cold") == len(self.cold) and where.count("out") == self.n_out
        assert len(self) <= self.capacity
        assert len(self.low_ids) <= self.low_cap
        assert self.n_high == 0 or len(self.low_ids) == self.low_cap
        lows = [self.records[r].key for r in self.low_ids]
        highs = [r.key for r in self.records.values() if r.where == "high"]
        if lows and highs:
            assert min(highs) >= max(lows) - 1e-12, (min(highs), max(lows))
