"""Verifiable tasks: prompts with reference answers, demonstrations for pre-training, and a verifier.

Every task draws its examples from a seed, splits them into ``train`` and ``test`` by a hash of the
prompt (so a held-out prompt never appears in pre-training), and scores a completion with
:meth:`Task.score`, which returns a :class:`Score`: a reward in ``[0, 1]`` and the reason for it. A
malformed completion scores 0 with a reason; the verifier never raises on model output.

=============  ======================================  ==================================
task           prompt -> demonstration                  difficulty for the tiny model
=============  ======================================  ==================================
``sort``       ``sort 4179:`` -> ``1479``               easy: copy and reorder
``addition``   ``47+85=`` -> ``231|132``                medium: scratchpad of reversed digits
``countdown``  ``3 5 7>22:`` -> ``3*5+7``               hard: search over expressions
``rg:<name>``  reasoning-gym's procedural generators    depends on the generator
=============  ======================================  ==================================
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class Example:
    """One prompt. ``solution`` is a demonstration completion (without EOS) used for SFT."""

    prompt: str
    answer: str
    solution: str
    meta: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Score:
    """A verifier's verdict: ``reward`` in [0, 1] and a short ``reason``."""

    reward: float
    reason: str


def _in_test_split(prompt: str, test_fraction: float) -> bool:
    digest = hashlib.sha256(prompt.encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32 < test_fraction


class Task:
    """Base class. Subclasses implement :meth:`_draw` (one random example) and :meth:`score`."""

    name: str = "task"
    test_fraction: float = 0.1

    def _draw(self, rng: np.random.Generator) -> Example:  # pragma: no cover - abstract
        raise NotImplementedError

    def score(self, completion: str, example: Example) -> Score:  # pragma: no cover - abstract
        raise NotImplementedError

    def examples(self, n: int, seed: int = 0, split: str = "train", distinct: bool | None = None) -> list[Example]:
        """``n`` examples of ``split`` (``"train"`` or ``"test"``), deterministic for ``seed``.

        The two splits are disjoint (a hash of the prompt decides its split). A held-out set is a set:
        ``test`` examples are distinct prompts by default (``distinct=None``), so an accuracy on them
        counts each prompt once; ``train`` examples are drawn with replacement (a training stream).
        Asking for more distinct prompts than the split holds is a ValueError.
        """
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        distinct = (split == "test") if distinct is None else distinct
        rng = np.random.default_rng([seed, 0 if split == "train" else 1])
        out: list[Example] = []
        seen: set[str] = set()
        tries = stale = 0
        while len(out) < n:
            tries += 1
            if tries > 1000 * (n + 10):
                raise RuntimeError(f"{self.name}: could not draw {n} {split} examples")
            ex = self._draw(rng)
            if _in_test_split(ex.prompt, self.test_fraction) != (split == "test"):
                continue
            if distinct:
                if ex.prompt in seen:
                    stale += 1
                    # 10 * found + 1000 draws of the split in a row without a new prompt: exhausted
                    # (were one prompt in N ~ found left, missing it that long has probability ~e^-10)
                    if stale > 10 * len(seen) + 1000:
                        raise ValueError(f"{self.name}: asked for {n} distinct {split} prompts, but only "
                                         f"{len(out)} exist (or are reachable) in that split")
                    continue
                seen.add(ex.prompt)
                stale = 0
            out.append(ex)
        return out

    def rewards(self, completions: Sequence[str], examples: Sequence[Example]) -> np.ndarray:
        """Scores of many completions, shape ``(len(completions),)``; one example per completion."""
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions but {len(examples)} examples")
        return np.array([self.score(c, e).reward for c, e in zip(completions, examples)], dtype=np.float32)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def _parse_int(text: str) -> int | None:
    text = text.strip()
    return int(text) if re.fullmatch(r"-?\d+", text) else None


class Addition(Task):
    """``a+b=`` with ``digits``-digit operands. The demonstration first writes the sum with its digits
    reversed (least significant first, the order in which carries flow), then ``|`` and the sum.
    Only the part after ``|`` is graded."""

    def __init__(self, digits: int = 2):
        if not 1 <= digits <= 6:
            raise ValueError(f"digits must be between 1 and 6, got {digits}")
        self.digits = digits
        self.name = f"addition{digits}" if digits != 2 else "addition"

    def _draw(self, rng):
        hi = 10**self.digits
        a, b = (int(x) for x in rng.integers(0, hi, size=2))
        s = str(a + b)
        return Example(prompt=f"{a}+{b}=", answer=s, solution=f"{s[::-1]}|{s}", meta={"a": a, "b": b})

    def score(self, completion, example):
        if "|" not in completion:
            return Score(0.0, "malformed: no '|' before the final answer")
        value = _parse_int(completion.rsplit("|", 1)[1])
        if value is None:
            return Score(0.0, "malformed: the final answer is not an integer")
        ok = value == int(example.answer)
        return Score(float(ok), "correct" if ok else f"wrong: {value} != {example.answer}")


class Sort(Task):
    """``sort 4179:`` -> ``1479``: sort ``length`` digits in ascending order."""

    name = "sort"

    def __init__(self, length: int = 4):
        if not 2 <= length <= 12:
            raise ValueError(f"length must be between 2 and 12, got {length}")
        self.length = length
        self.name = "sort" if length == 4 else f"sort{length}"

    def _draw(self, rng):
        digits = "".join(str(d) for d in rng.integers(0, 10, size=self.length))
        s = "".join(sorted(digits))
        return Example(prompt=f"sort {digits}:", answer=s, solution=s)

    def score(self, completion, example):
        got = completion.strip()
        if not re.fullmatch(r"\d+", got):
            return Score(0.0, "malformed: not a string of digits")
        if len(got) != len(example.answer):
            return Score(0.0, f"wrong: length {len(got)} != {len(example.answer)}")
        ok = got == example.answer
        return Score(float(ok), "correct" if ok else "wrong: not the sorted digits")


class Countdown(Task):
    """Countdown-style arithmetic: reach the target with ``+ - *`` using each given number at most
    once, e.g. ``3 5 7>22:`` -> ``3*5+7``. Any correct expression scores 1, not only the reference."""

    def __init__(self, n_numbers: int = 3, max_number: int = 9):
        if not 2 <= n_numbers <= 5:
            raise ValueError(f"n_numbers must be between 2 and 5, got {n_numbers}")
        self.n_numbers, self.max_number = n_numbers, max_number
        self.name = "countdown" if (n_numbers, max_number) == (3, 9) else f"countdown{n_numbers}x{max_number}"

    def _draw(self, rng):
        while True:  # redraw until the target is non-negative
            nums = [int(x) for x in rng.integers(1, self.max_number + 1, size=self.n_numbers)]
            order = [int(i) for i in rng.permutation(self.n_numbers)]
            ops = [str(o) for o in rng.choice(["+", "-", "*"], size=self.n_numbers - 1)]
            expr = str(nums[order[0]]) + "".join(o + str(nums[i]) for o, i in zip(ops, order[1:]))
            target = _safe_eval(expr)
            if target >= 0:
                break
        return Example(prompt=f"{' '.join(map(str, nums))}>{target}:", answer=str(target), solution=expr,
                       meta={"numbers": nums})

    def score(self, completion, example):
        expr = completion.strip()
        if not re.fullmatch(r"\d+([+\-*]\d+)*", expr):
            return Score(0.0, "malformed: not an expression of integers and + - *")
        used = sorted(int(x) for x in re.findall(r"\d+", expr))
        pool = sorted(int(x) for x in example.prompt.split(">")[0].split())
        remaining = list(pool)
        for u in used:
            if u not in remaining:
                return Score(0.0, f"wrong: uses {u}, which is not available")
            remaining.remove(u)
        value = _safe_eval(expr)
        ok = value == int(example.answer)
        return Score(float(ok), "correct" if ok else f"wrong: evaluates to {value}, not {example.answer}")


def _safe_eval(expr: str) -> int:
    """Evaluate an expression of non-negative integers with ``+ - *`` (usual precedence)."""
    total = 0
    for term_sign, term in re.findall(r"([+-]?)([^+-]+)", expr):
        value = 1
        for factor in term.split("*"):
            value *= int(factor)
        total += -value if term_sign == "-" else value
    return total


class ReasoningGym(Task):
    """An adapter over one of reasoning-gym's procedural generators (``rg:<dataset name>``).

    Scoring uses the generator's own ``score_answer``; any failure in it scores 0 with its reason.
    The generators write natural-language prompts, longer than the tiny model's context; use them
    with a larger model or keep the configuration small (e.g. ``rg:chain_sum``)."""

    def __init__(self, dataset: str, **config):
        try:
            import reasoning_gym  # noqa: F401
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError("the reasoning-gym adapter needs `pip install rlcourse[tasks]`") from err
        self.dataset, self.config = dataset, config
        self.name = f"rg:{dataset}"
        self._cache: dict[int, object] = {}

    def _generator(self, seed: int, size: int):
        import reasoning_gym

        key = (seed, size)
        if key not in self._cache:
            try:
                self._cache[key] = reasoning_gym.create_dataset(self.dataset, size=size, seed=seed, **self.config)
            except Exception as err:
                raise ValueError(f"reasoning-gym could not create {self.dataset!r}: {err}") from err
        return self._cache[key]

    def examples(self, n, seed=0, split="train", distinct=None):
        """As :meth:`Task.examples`: ``test`` examples are distinct prompts by default. A small
        configuration repeats its problems (1-digit arithmetic has a few hundred), so a request for
        more distinct prompts than the generator yields in ``10 n`` draws is a ValueError."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        distinct = (split == "test") if distinct is None else distinct
        share = self.test_fraction if split == "test" else 1 - self.test_fraction
        size = int((10 if distinct else 3) * n / share) + 32  # enough draws for n examples of this split
        ds = self._generator(2 * seed + (split == "test"), size)
        out, seen = [], set()
        for i in range(size):
            entry = ds[i]
            prompt = entry["question"]
            if _in_test_split(prompt, self.test_fraction) != (split == "test") or (distinct and prompt in seen):
                continue
            seen.add(prompt)
            out.append(Example(prompt=prompt, answer=str(entry["answer"]), solution=str(entry["answer"]),
                               meta={"entry": entry, "scorer": ds}))
            if len(out) == n:
                return out
        if distinct:
            raise ValueError(f"{self.name}: asked for {n} distinct {split} prompts, but {size} draws of the "
                             f"generator gave only {len(out)}; ask for fewer or widen the configuration")
        raise RuntimeError(f"{self.name}: could not draw {n} {split} examples")

    def score(self, completion, example):
        entry, ds = example.meta.get("entry"), example.meta.get("scorer")
        if entry is None:
            return Score(float(completion.strip() == example.answer), "exact match (no reasoning-gym entry)")
        try:
            value = float(ds.score_answer(completion.strip(), entry))
        except Exception as err:  # the generator's scorer may raise on odd text
            return Score(0.0, f"malformed: reasoning-gym's scorer raised {type(err).__name__}")
        return Score(value, "reasoning-gym score_answer")


_TASKS: dict[str, Callable[[], Task]] = {
    "sort": Sort,
    "addition": Addition,
    "addition3": lambda: Addition(digits=3),
    "countdown": Countdown,
}


def register_task(name: str) -> Callable:
    """Decorator: register a task factory under ``name`` (used by :func:`get_task`)."""

    def deco(factory):
        if name in _TASKS:
            raise ValueError(f"task {name!r} is already registered")
        _TASKS[name] = factory
        return factory

    return deco


def get_task(name: str | Task) -> Task:
    """A task by name: one of :func:`task_names`, or ``rg:<reasoning-gym dataset>``."""
    if isinstance(name, Task):
        return name
    if not isinstance(name, str):
        raise TypeError(f"task must be a name or a Task, got {type(name).__name__}")
    if name.startswith("rg:"):
        return ReasoningGym(name[3:])
    if name not in _TASKS:  # the chapters' tasks register when rlcourse.methods is imported
        from .registry import load_methods
        load_methods()
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {sorted(_TASKS)} or 'rg:<reasoning-gym name>'")
    return _TASKS[name]()


def task_names() -> list[str]:
    """Every registered task name, the chapters' tasks included."""
    from .registry import load_methods
    load_methods()
    return sorted(_TASKS)


def held_out_splits(task: Task, n_report: int, n_choose: int, seed: int = 0) -> tuple[list[Example], list[Example]]:
    """Two disjoint sets of held-out (``"test"``) prompts: ``n_report`` to report verdicts on, and
    ``n_choose`` others to choose settings on (a budget, a learning rate) without touching them.

    The reported set is exactly ``task.examples(n_report, seed, split="test")`` (the draw is
    prefix-stable), so adding a choosing set leaves earlier reported prompts unchanged.

    =========  =========  ==============================================
    returns    tuple      ``(report, choose)``, lists of distinct prompts
    =========  =========  ==============================================
    """
    if n_report < 1 or n_choose < 1:
        raise ValueError(f"need n_report >= 1 and n_choose >= 1, got {n_report} and {n_choose}")
    both = task.examples(n_report + n_choose, seed=seed, split="test")
    return both[:n_report], both[n_report:]
