"""Math tasks for real models: chat-formatted prompts, reasoning-gym, GSM8K-format JSONL, math-verify.

Each is a :class:`rlcourse.tasks.Task`, so the book's :class:`~rlcourse.train.Trainer` runs them
unchanged: ``examples(n, seed, split)`` gives prompts with reference answers, ``score`` a reward in
[0, 1] with its reason.

================  ===================================================================================
ReasoningGymMath  a reasoning-gym procedural generator (offline: it draws problems from a seed), with
                  its configuration in the task's name and answers checked by math-verify
JsonlMathTask     GSM8K-format JSONL (``{"question": ..., "answer": "... #### 42"}``) read through
                  ``datasets``
ChatTask          any task's questions rendered with the tokenizer's chat template
================  ===================================================================================
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..tasks import Example, ReasoningGym, Score, Task, _in_test_split


def math_verify_score(completion: str, gold: str) -> Score:
    """Reward 1 when ``math-verify`` finds the completion's answer equal to ``gold``.

    math-verify (Hugging Face, 2025) extracts the answer from free text (a ``\\boxed{}`` first, else
    the last expression) and compares it with the reference symbolically, so ``\\boxed{0.5}``,
    ``1/2`` and ``The answer is 1/2.`` all match ``0.5``. Text it cannot parse scores 0 with a reason.
    """
    from math_verify import parse, verify

    try:
        target = parse(gold)
        found = parse(completion)
    except Exception as err:  # the parser may raise on odd text (or time out)
        return Score(0.0, f"malformed: math-verify raised {type(err).__name__}")
    if not target:
        raise ValueError(f"math-verify cannot parse the reference answer {gold!r}")
    if not found:
        return Score(0.0, "malformed: no answer math-verify could parse")
    try:
        ok = bool(verify(target, found))
    except Exception as err:
        return Score(0.0, f"malformed: math-verify raised {type(err).__name__}")
    return Score(float(ok), "correct" if ok else f"wrong: {found[-1]} != {gold}")


class ReasoningGymMath(ReasoningGym):
    """A reasoning-gym generator whose answers are checked with :func:`math_verify_score`
    (``checker="math_verify"``) or the generator's own ``score_answer`` (``checker="reasoning_gym"``).

    The name carries the configuration (``rg:basic_arithmetic[max_digits=2,...]``), so base models
    cached by name never mix configurations. reasoning-gym draws every problem from a seed: no
    download, offline by construction.
    """

    def __init__(self, dataset: str, checker: str = "math_verify", **config):
        if checker not in ("math_verify", "reasoning_gym"):
            raise ValueError(f"checker must be 'math_verify' or 'reasoning_gym', got {checker!r}")
        super().__init__(dataset, **config)
        self.checker = checker
        if config:
            self.name += "[" + ",".join(f"{k}={v}" for k, v in sorted(config.items())) + "]"

    def score(self, completion, example):
        if self.checker == "reasoning_gym":
            return super().score(completion, example)
        return math_verify_score(completion, example.answer)


def gsm8k_final_answer(answer: str) -> str:
    """The number after GSM8K's ``####`` marker, without thousands separators (``"... #### 1,234"``
    -> ``"1234"``); a ValueError if there is no marker."""
    if "####" not in answer:
        raise ValueError(f"a GSM8K answer ends with '#### <number>'; got {answer[-80:]!r}")
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


class JsonlMathTask(Task):
    """Math word problems in GSM8K's JSONL format, read with ``datasets.load_dataset("json", ...)``.

    Each line is ``{"question": str, "answer": str}``, the answer a worked solution ending in
    ``#### <number>``. With one file, a hash of the question splits it into train and test (like
    every task of the book); with ``test_path`` too, the files are the splits. The demonstration
    (``solution``) is the worked solution with its last line rewritten as ``\\boxed{<number>}``;
    answers are checked with :func:`math_verify_score`.
    """

    def __init__(self, path: str | Path, test_path: str | Path | None = None, name: str | None = None):
        self.path, self.test_path = Path(path), Path(test_path) if test_path else None
        for p in (self.path, self.test_path):
            if p is not None and not p.exists():
                raise FileNotFoundError(f"no GSM8K-format JSONL file at {p}")
        self.name = name or f"jsonl:{self.path.stem}"
        self._rows = {"train": None, "test": None}

    @staticmethod
    def _read(path: Path) -> list[Example]:
        from datasets import load_dataset

        ds = load_dataset("json", data_files=str(path), split="train")
        missing = {"question", "answer"} - set(ds.column_names)
        if missing:
            raise ValueError(f"{path}: GSM8K-format rows need the fields question and answer; missing {sorted(missing)}")
        out = []
        for row in ds:
            final = gsm8k_final_answer(row["answer"])
            steps = row["answer"].rsplit("####", 1)[0].strip()
            solution = (steps + "\n" if steps else "") + f"The answer is \\boxed{{{final}}}."
            out.append(Example(prompt=row["question"], answer=final, solution=solution))
        return out

    def rows(self, split: str) -> list[Example]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if self._rows[split] is None:
            if self.test_path is not None:
                self._rows[split] = self._read(self.path if split == "train" else self.test_path)
            else:
                every = self._read(self.path)
                self._rows[split] = [e for e in every if _in_test_split(e.prompt, self.test_fraction) == (split == "test")]
        return self._rows[split]

    def examples(self, n, seed=0, split="train", distinct=None):
        rows = self.rows(split)
        if not rows:
            raise ValueError(f"{self.name}: the {split} split is empty")
        distinct = (split == "test") if distinct is None else distinct
        rng = np.random.default_rng([seed, 0 if split == "train" else 1])
        if distinct:
            if n > len(rows):
                raise ValueError(f"{self.name}: asked for {n} distinct {split} prompts, but only {len(rows)} exist")
            return [rows[i] for i in rng.permutation(len(rows))[:n]]
        return [rows[i] for i in rng.integers(0, len(rows), size=n)]

    def score(self, completion, example):
        return math_verify_score(completion, example.answer)


class ChatTask(Task):
    """``task`` with each question rendered by ``tokenizer.apply_chat_template``: a user turn (the
    question and an optional ``instruction``), an optional system turn, and the generation prompt.

    Scoring is the inner task's. ``example.meta["question"]`` keeps the raw question. Instruct
    models answer their own template (Qwen2.5: ``<|im_start|>user ... <|im_end|>``), not raw text.
    """

    def __init__(self, task: Task, tokenizer, system: str | None = None, instruction: str = ""):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; set tokenizer.chat_template or use the raw task")
        self.task, self.tokenizer, self.system, self.instruction = task, tokenizer, system, instruction
        digest = hashlib.sha256(json.dumps([tokenizer.chat_template, system, instruction]).encode()).hexdigest()[:8]
        self.name = f"{task.name}+chat{digest}"
        self.test_fraction = task.test_fraction

    def render(self, question: str) -> str:
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + \
            [{"role": "user", "content": question + self.instruction}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def examples(self, n, seed=0, split="train", distinct=None):
        inner = self.task.examples(n, seed=seed, split=split, distinct=distinct)
        return [replace(e, prompt=self.render(e.prompt), meta={**e.meta, "question": e.prompt}) for e in inner]

    def score(self, completion, example):
        return self.task.score(completion, example)


def write_jsonl(path: str | Path, rows: list[dict]) -> Path:
    """Write ``rows`` as JSON lines (a helper for tests and for readers' own small files)."""
    path = Path(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


