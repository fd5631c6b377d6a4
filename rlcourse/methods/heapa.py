"""HeaPA: a heap-partitioned, growing prompt pool (Wang et al., 2026, arXiv:2601.22448).

The pool keeps every prompt's latest group pass rate ``p``. Unscored prompts wait in a *cold* queue
and are drawn first; scored ones sit in a *low* partition (a max-heap on ``p``, holding the hardest
``floor(low_fraction * capacity)`` prompts; its top is the *boundary*) or a *high* partition (twin
min/max heaps with lazy deletion, the easier rest). Prompts whose group pass rate lies in the medium
band ``(lo, hi)`` spawn variants (children) that enter the cold queue; past ``capacity`` the pool
evicts from the high partition. A re-scored prompt is taken out and re-inserted under its new key.

Parts registered here:

====================  ==============  ==========================================================
``"heapa"``           prompt sampler  the pool with growth; draws cold prompts first, then uniformly
                                      from the low partition (the authors' ``medium_only`` mode)
``"heapa_boundary"``  prompt sampler  the same pool, but draws the top of the low heap (the prompts
                                      just below the boundary) instead of a uniform draw
``"heapa_fixed"``     prompt sampler  ``medium_only`` without growth (no children)
``"heapa_feedback"``  sampler         wraps another sampler (``inner``), scores its rows with the
                                      loop's reward and reports each prompt's pass rate in
                                      ``state["prompt_feedback"]``, which the pool reads next step
``"heapa_addition"``  task            addition with 1 to 4 digit operands; ``variant`` perturbs the
                                      operands of a prompt and keeps its digit count
====================  ==============  ==========================================================

The exact toy (a curriculum of Bernoulli-logit prompts learnt by GRPO) is :func:`toy_run`; it uses
the same :class:`HeapPool` as the prompt samplers.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from ..rollout import get_sampler, register_sampler
from ..data import register_prompt_sampler
from ..tasks import Addition, Example, Task, register_task

PAPER = "HeaPA: Difficulty-Aware Heap Sampling and On-Policy Query Augmentation, Wang et al., 2026, arXiv:2601.22448"
FEEDBACK_KEY = "prompt_feedback"
POOL_KEY = "heapa"
SAMPLING_MODES = ("medium", "boundary")


# ---------------------------------------------------------------------- the signal of a group
def informative_probability(p, G: int):
    """Probability that a group of ``G`` Bernoulli(``p``) rewards is not all equal.

    ======  =========  =======================================
    p       any shape  pass rates in [0, 1]
    return  same       ``1 - p**G - (1 - p)**G``
    ======  =========  =======================================
    """
    if G < 2:
        raise ValueError(f"a group needs G >= 2 samples to vary, got G={G}")
    p = np.asarray(p, dtype=float)
    if ((p < 0) | (p > 1)).any():
        raise ValueError("pass rates must lie in [0, 1]")
    return 1.0 - p**G - (1.0 - p) ** G


def expected_logit_step(p, G: int):
    """Expected GRPO step (mean baseline, no std scaling) on the logit of a Bernoulli(``p``) policy:
    ``E[sum_j (y_j - mean(y)) (y_j - p)] = (G - 1) p (1 - p)``.

    ======  =========  =====================================
    p       any shape  pass rates in [0, 1]
    return  same       ``(G - 1) * p * (1 - p)``
    ======  =========  =====================================
    """
    if G < 2:
        raise ValueError(f"a group needs G >= 2 samples, got G={G}")
    p = np.asarray(p, dtype=float)
    return (G - 1) * p * (1 - p)


def shrunk_pass_rate(k, n, parent_rate, alpha: float):
    """Posterior mean of a child's pass rate under a Beta(``alpha * q``, ``alpha * (1 - q)``) prior
    centred on its parent's rate ``q``, after ``k`` successes in ``n`` rollouts.

    ============  =========  =====================================================
    k, n          any shape  successes and rollouts of the child (``0 <= k <= n``)
    parent_rate   same       the parent's pass rate ``q`` in (0, 1)
    return        same       ``(k + alpha * q) / (n + alpha)``
    ============  =========  =====================================================
    """
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    k, n, q = (np.asarray(x, dtype=float) for x in (k, n, parent_rate))
    if (k < 0).any() or (k > n).any():
        raise ValueError("need 0 <= k <= n")
    return (k + alpha * q) / (n + alpha)


# ---------------------------------------------------------------------- the pool
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


# ---------------------------------------------------------------------- the registered parts
def _pool_for(state: dict, pool: list[Example], capacity: int | None, low_fraction: float) -> HeapPool:
    hp = state.get(POOL_KEY)
    if hp is None:
        seen, seeds = set(), []
        for e in pool:  # the training stream repeats prompts; the pool holds each once
            if e.prompt not in seen:
                seen.add(e.prompt)
                seeds.append(e)
        cap = capacity if capacity is not None else len(seeds)
        if cap < len(seeds):
            raise ValueError(f"capacity {cap} is below the {len(seeds)} distinct seed prompts")
        hp = HeapPool(cap, low_fraction)
        for e in seeds:
            hp.add(e)
        hp.by_prompt = {e.prompt: rid for rid, e in enumerate(seeds)}
        hp.pending, hp.children_made, hp.settings = [], 0, {"capacity": capacity, "low_fraction": low_fraction}
        state[POOL_KEY] = hp
    elif hp.settings != {"capacity": capacity, "low_fraction": low_fraction}:
        raise ValueError(f"state['heapa'] was built with {hp.settings}, not capacity={capacity}, "
                         f"low_fraction={low_fraction}")
    return hp


def heapa_prompts(pool: list[Example], n: int, generator: torch.Generator, state: dict, task: Task, step: int, *,
                  mode: str = "medium", grow: bool = True, capacity: int | None = None, low_fraction: float = 0.5,
                  lo: float = 0.1, hi: float = 0.7, max_children: int = 2) -> list[Example]:
    """The HeaPA prompt sampler: read last step's pass rates, re-insert, grow, and draw ``n`` prompts.

    ==============  ==========================================================================
    pool            the trainer's training examples (the seed prompts; duplicates merged)
    state           holds the :class:`HeapPool` under ``state["heapa"]`` (checkpointed with it)
    mode            ``medium`` (uniform over the low partition) or ``boundary`` (its top keys)
    grow            spawn ``task.variant(example, rng)`` children of prompts with ``lo < p < hi``
    capacity        pool bound (default: the number of distinct seed prompts)
    max_children    children one record may have
    returns         ``n`` distinct examples
    ==============  ==========================================================================

    Step k > 1 needs the pass rates of the prompts drawn at step k - 1 in ``state["prompt_feedback"]``,
    which the ``heapa_feedback`` sampler writes (the loop gives prompt samplers no rewards).
    """
    if grow and not callable(getattr(task, "variant", None)):
        raise ValueError(f"the growing HeaPA pool needs a task with a variant() method, such as heapa_addition; "
                         f"{task.name!r} has none (use 'heapa_fixed' for a pool without growth)")
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"the medium band needs 0 <= lo < hi <= 1, got ({lo}, {hi})")
    hp = _pool_for(state, pool, capacity, low_fraction)
    metrics = {"heapa_scored": 0, "heapa_children": 0}
    if hp.pending:
        fb = state.get(FEEDBACK_KEY)
        if fb is None or fb.get("step") != step - 1:
            raise ValueError(f"prompt sampler 'heapa' drew prompts at step {step - 1} but found no pass rates for "
                             f"them in state[{FEEDBACK_KEY!r}]: run it with sampler='heapa_feedback', which "
                             "scores the rollouts and reports them there")
        rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))
        for rid in hp.pending:
            prompt = hp.records[rid].item.prompt
            if prompt not in fb["rates"]:
                hp.release(rid)
                continue
            k, m = fb["rates"][prompt]
            hp.score(rid, k, m)
            metrics["heapa_scored"] += 1
            rec = hp.records[rid]
            if grow and lo < rec.rate < hi and len(rec.children) < max_children:
                child = task.variant(rec.item, rng)
                if child is not None and child.prompt not in hp.by_prompt:
                    hp.by_prompt[child.prompt] = hp.add(child, parent=rid)
                    hp.children_made += 1
                    metrics["heapa_children"] += 1
        hp.pending = []
    rids = hp.draw(n, generator, mode)
    hp.pending = rids
    sizes = hp.sizes()
    b = hp.boundary()
    # the boundary is logged once the low partition holds a scored prompt (a metric is never NaN)
    state["heapa_metrics"] = {**metrics, "heapa_pool": len(hp), "heapa_low": sizes["low"], "heapa_cold": sizes["cold"],
                              **({} if b is None else {"heapa_boundary": b})}
    return [hp.records[r].item for r in rids]


@register_prompt_sampler("heapa")
def heapa_medium(pool, n, generator, state, task, step):
    """HeaPA with growth, drawing uniformly from the low partition (the authors' default)."""
    return heapa_prompts(pool, n, generator, state, task, step, mode="medium", grow=True)


@register_prompt_sampler("heapa_boundary")
def heapa_boundary(pool, n, generator, state, task, step):
    """HeaPA with growth, drawing the largest keys of the low partition (just below the boundary)."""
    return heapa_prompts(pool, n, generator, state, task, step, mode="boundary", grow=True)


@register_prompt_sampler("heapa_fixed")
def heapa_fixed(pool, n, generator, state, task, step):
    """HeaPA's partitions and draws without growth: any task."""
    return heapa_prompts(pool, n, generator, state, task, step, mode="medium", grow=False)


def group_pass_rates(scores, examples: list[Example]) -> dict:
    """``{prompt: (sum of rewards, rollouts)}`` over the rows of a batch.

    ========  ======  ======================================
    scores    (B,)    the rows' rewards
    examples  B       the example each row answered
    ========  ======  ======================================
    """
    scores = torch.as_tensor(scores, dtype=torch.float64).reshape(-1)
    if scores.shape[0] != len(examples):
        raise ValueError(f"{scores.shape[0]} scores for {len(examples)} rows")
    out: dict = {}
    for s, e in zip(scores.tolist(), examples):
        k, m = out.get(e.prompt, (0.0, 0))
        out[e.prompt] = (k + s, m + 1)
    return out


@register_sampler("heapa_feedback")
def feedback_sampler(model, tokenizer, prompts, config, generator, state, examples, pool, task, reward, step,
                     inner: str = "policy", **inner_kwargs):
    """Run the sampler ``inner`` (any registered one), score its rows with the loop's reward (unless
    it did), and write ``{"step", "rates": {prompt: (reward sum, rollouts)}}`` to
    ``state["prompt_feedback"]`` for a prompt sampler with memory. The batch reaches the loop with
    its scores, so nothing is scored twice; the pool's sizes join the step's metrics."""
    from ..train import call_with_supported, check_accepts

    if inner == "heapa_feedback":
        raise ValueError("heapa_feedback cannot wrap itself")
    fn = get_sampler(inner)
    check_accepts(fn, inner_kwargs, "heapa_feedback's inner sampler keywords")
    batch = call_with_supported(fn, model=model, tokenizer=tokenizer, prompts=prompts, config=config,
                                generator=generator, state=state, examples=examples, pool=pool, task=task,
                                reward=reward, step=step, **inner_kwargs)
    per_row = batch.examples if batch.examples is not None else [examples[int(i)] for i in batch.index]
    scores = batch.scores if batch.scores is not None else reward(batch, per_row, task, state)
    batch.scores = torch.as_tensor(scores, dtype=torch.float32).reshape(-1)
    state[FEEDBACK_KEY] = {"step": step, "rates": group_pass_rates(batch.scores, per_row)}
    extra = state.pop("heapa_metrics", {})
    batch.metrics = {**batch.metrics, **{k: v for k, v in extra.items() if k not in batch.metrics}}
    return batch


# ---------------------------------------------------------------------- the curriculum task
class CurriculumAddition(Task):
    """``a+b=`` where both operands have ``d`` digits, ``d`` uniform in ``1..max_digits`` (the
    book's reversed-scratchpad format). ``meta["digits"]`` is the level. :meth:`variant` is the
    augmentation: new operands with the same digit count, answered exactly (Python is the teacher)."""

    name = "heapa_addition"

    def __init__(self, max_digits: int = 4):
        if not 1 <= max_digits <= 6:
            raise ValueError(f"max_digits must be between 1 and 6, got {max_digits}")
        self.max_digits = max_digits
        self.adders = {d: Addition(digits=d) for d in range(1, max_digits + 1)}

    @staticmethod
    def _make(a: int, b: int, d: int) -> Example:
        s = str(a + b)
        return Example(prompt=f"{a}+{b}=", answer=s, solution=f"{s[::-1]}|{s}", meta={"a": a, "b": b, "digits": d})

    def _draw(self, rng):
        d = int(rng.integers(1, self.max_digits + 1))
        lo = 0 if d == 1 else 10 ** (d - 1)
        a, b = (int(x) for x in rng.integers(lo, 10**d, size=2))
        return self._make(a, b, d)

    def score(self, completion, example):
        return self.adders[1].score(completion, example)  # the verifier reads only the final answer

    def variant(self, example: Example, rng: np.random.Generator) -> Example | None:
        """A child of ``example``: one operand redrawn with the same digit count. None if the
        example is not one of this task's prompts (no ``meta['digits']``)."""
        d = example.meta.get("digits")
        if d is None:
            return None
        a, b = example.meta["a"], example.meta["b"]
        lo = 0 if d == 1 else 10 ** (d - 1)
        new = int(rng.integers(lo, 10**d))
        a, b = (new, b) if rng.random() < 0.5 else (a, new)
        return self._make(a, b, d)


register_task("heapa_addition")(CurriculumAddition)


# ---------------------------------------------------------------------- the experiment, in rlcourse.studies.heapa
_STUDY_NAMES = frozenset((
    'ToyCurriculum', 'rollouts_to_target', 'toy_accuracy', 'toy_prompts', 'toy_run',
    'LM_ARMS', 'TOY_ARMS', '_held_by_level', 'lm_claims', 'lm_experiment', 'lm_run', 'lm_sizes', 'toy_claims',
    'toy_experiment', 'toy_sizes',
))


def __getattr__(name):
    """The chapter's experiment lives in :mod:`rlcourse.studies.heapa`; its names stay importable here."""
    if name in _STUDY_NAMES:
        from ..studies import heapa as study

        return getattr(study, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
