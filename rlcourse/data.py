"""Prompt samplers: which prompts the loop trains on at each step (a registry).

A prompt sampler is ``fn(pool, n, generator, state) -> list[Example]``: ``pool`` is the list of
training examples, ``n`` the number of prompts this step, ``generator`` the trainer's torch generator
(so a resumed run draws the same prompts), and ``state`` a dict kept between steps for samplers
with memory (curricula, replay). The trainer passes these by keyword, and also ``task`` and ``step``
to a sampler whose signature names them.
"""
from __future__ import annotations

import torch

from .registry import Registry
from .tasks import Example

PROMPT_SAMPLERS: Registry = Registry("prompt sampler")
register_prompt_sampler = PROMPT_SAMPLERS.register
get_prompt_sampler = PROMPT_SAMPLERS.get


@register_prompt_sampler("uniform")
def uniform_prompts(pool: list[Example], n: int, generator: torch.Generator, state: dict) -> list[Example]:
    """``n`` distinct prompts drawn uniformly from the pool."""
    if n > len(pool):
        raise ValueError(f"asked for {n} prompts from a pool of {len(pool)}")
    rows = torch.randperm(len(pool), generator=generator)[:n].tolist()
    return [pool[i] for i in rows]
