"""HeaPA: a heap-partitioned, growing prompt pool (Wang et al., 2026, arXiv:2601.22448).

The pool keeps every prompt's latest group pass rate ``p``. Unscored prompts wait in a *cold* queue
and are drawn first; scored ones sit in a *low* partition (a max-heap on ``p``, holding the hardest
``floor(low_fraction * capacity)`` prompts; its top is the *boundary*) or a *high* partition (twin
min/max heaps with lazy deletion, the easier rest). Prompts whose group pass rate lies in the medium
band ``(lo, hi)`` spawn variants (children) that enter the cold queue; past ``capacity`` the pool
evicts from the high partition. A re-scored prompt is taken out and re-inserted under its new key.
The pool itself, :class:`~rlcourse.methods.heapa_pool.HeapPool`, is in :mod:`rlcourse.methods.heapa_pool`.

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

The chapter's experiments (the exact toy, a curriculum of Bernoulli-logit prompts learnt by GRPO, which
uses the same pool as the prompt samplers, and the tiny-LM run) are in :mod:`rlcourse.studies.heapa`.
"""
from __future__ import annotations

import numpy as np
import torch

from ..rollout import get_sampler, register_sampler
from ..data import register_prompt_sampler
from ..tasks import Addition, Example, Task, register_task
from .heapa_pool import HeapPool

PAPER = "HeaPA: Difficulty-Aware Heap Sampling and On-Policy Query Augmentation, Wang et al., 2026, arXiv:2601.22448"
FEEDBACK_KEY = "prompt_feedback"
POOL_KEY = "heapa"


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
