"""Profiles: one chapter text, three sizes.

A chapter never hard-codes a size; it asks :func:`profile`, which reads the environment
variable ``RLCOURSE_PROFILE``:

========  ==========================================================================
smoke     seconds per chapter; what the tests execute. It proves the code runs, not the claim.
book      (default) what the HTML book executes on a 2-core CPU, about 3 minutes a chapter.
full      GPU scale: capstones, and chapters that can scale up.
========  ==========================================================================
"""
from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

# torch is imported where it is used, so that torch-free modules (the systems simulator) can
# import the profile without loading it.

PROFILE_NAMES = ("smoke", "book", "full")


@dataclass(frozen=True)
class Profile:
    """The sizes of one profile. Fields shared by many chapters live here; a chapter's own
    sizes come from :meth:`pick`."""

    name: str
    # the tiny language model
    lm_hidden: int
    lm_intermediate: int
    lm_layers: int
    lm_heads: int
    lm_max_positions: int
    # pre-training (SFT) of base models
    pretrain_max_steps: int
    pretrain_batch: int
    pretrain_lr: float
    eval_every: int
    eval_prompts: int
    # the RL loop
    rl_steps: int
    rl_prompts: int
    num_generations: int
    rl_lr: float
    seeds: int  # seeds behind a verdict of a language-model experiment (>= 5 in the book profile)
    toy_seeds: int  # seeds behind a verdict of a bandit, gridworld or other toy (>= 10 in the book profile)
    min_seeds: int  # the fewest seeds any verdict may rest on (rlcourse.claims.evaluate refuses fewer)

    def pick(self, smoke: Any, book: Any, full: Any = None) -> Any:
        """Return the value for this profile (``full`` defaults to ``book``)."""
        return {"smoke": smoke, "book": book, "full": book if full is None else full}[self.name]

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_PROFILES = {
    "smoke": Profile(
        name="smoke", lm_hidden=32, lm_intermediate=64, lm_layers=1, lm_heads=2, lm_max_positions=64,
        pretrain_max_steps=30, pretrain_batch=32, pretrain_lr=3e-3, eval_every=10, eval_prompts=64,
        rl_steps=3, rl_prompts=4, num_generations=4, rl_lr=1e-4, seeds=1, toy_seeds=1, min_seeds=1,
    ),
    "book": Profile(
        name="book", lm_hidden=128, lm_intermediate=384, lm_layers=3, lm_heads=4, lm_max_positions=64,
        pretrain_max_steps=1500, pretrain_batch=64, pretrain_lr=1e-3, eval_every=25, eval_prompts=256,
        rl_steps=120, rl_prompts=16, num_generations=8, rl_lr=1e-4, seeds=5, toy_seeds=10, min_seeds=5,
    ),
    "full": Profile(
        name="full", lm_hidden=256, lm_intermediate=768, lm_layers=4, lm_heads=8, lm_max_positions=128,
        pretrain_max_steps=6000, pretrain_batch=128, pretrain_lr=1e-3, eval_every=100, eval_prompts=1024,
        rl_steps=500, rl_prompts=64, num_generations=8, rl_lr=1e-4, seeds=8, toy_seeds=20, min_seeds=5,
    ),
}


def profile(name: str | None = None) -> Profile:
    """The sizes for ``name``, or for ``$RLCOURSE_PROFILE`` (default ``"book"``)."""
    name = name if name is not None else os.environ.get("RLCOURSE_PROFILE", "book")
    key = name.strip().lower()
    if key not in _PROFILES:
        raise ValueError(f"unknown profile {name!r} (from RLCOURSE_PROFILE?); choose one of {PROFILE_NAMES}")
    return _PROFILES[key]


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch, and return a torch generator seeded the same way."""
    import torch

    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    random.seed(int(seed))
    np.random.seed(int(seed) % 2**32)
    torch.manual_seed(int(seed))
    return torch.Generator().manual_seed(int(seed))


def cache_dir() -> Path:
    """The folder where built models are cached: ``$RLCOURSE_CACHE`` or ``~/.cache/rlcourse``."""
    path = Path(os.environ.get("RLCOURSE_CACHE", Path.home() / ".cache" / "rlcourse")).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def count_from_env(name: str, default: int | None, what: str) -> int | None:
    """The whole number ``>= 1`` that the environment variable ``name`` holds (``default`` where it
    is unset); a clear error naming the variable otherwise. ``what`` names its unit in that error."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number of {what}, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def torch_threads(cap: int = 2) -> int:
    """The torch threads a chapter runs on: ``$OMP_NUM_THREADS`` where it is set (``make book`` sets it
    to the cores divided by the chapters it executes at once), else the cores this process may use;
    at most ``cap`` either way. The book's networks are tiny: more threads than two buy nothing, and
    threads that spin against another process's on a shared CPU slow small matrix products many
    times over (:func:`one_torch_thread`)."""
    threads = count_from_env("OMP_NUM_THREADS", None, "threads")
    return max(1, min(cap, threads if threads is not None else usable_cores()))


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one, else all of them)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextlib.contextmanager
def one_torch_thread():
    """Run a block with one torch thread, then restore the previous setting. Tiny networks run
    faster on one thread, and on a shared, loaded CPU two threads spinning against each other were
    measured to slow small matrix products by more than 100x."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
