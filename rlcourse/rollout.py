"""Samplers: how the loop turns prompts into a rollout batch (a registry).

A sampler returns a :class:`~rlcourse.lm.sampling.RolloutBatch` and receives, by keyword, the
arguments its signature names among those the loop offers (a sampler with ``**kwargs`` gets them all):

============ ===============================================================================
model        the policy being trained
tokenizer    its tokenizer
prompts      ``list[str]``, the prompts of this step
config       the trainer's :class:`~rlcourse.train.RLConfig`
generator    the trainer's torch generator (a resumed run draws the same samples)
state        a dict the sampler may keep between steps
examples     ``list[Example]``, the examples of this step (``prompts[i]`` is ``examples[i].prompt``)
pool         the training pool the prompts were drawn from
task         the :class:`~rlcourse.tasks.Task`
reward       the loop's reward, ``fn(batch, examples, task, state) -> (B,)``
step         the step number (1-based)
============ ===============================================================================

A sampler that scores its own rows with ``reward`` (to act on them) puts the scores in
``batch.scores``; the trainer then uses them instead of scoring again. Per-token quantities a later
part needs go in ``batch.extras`` (see :class:`~rlcourse.lm.sampling.RolloutBatch`); a policy loss
receives those its signature names. A sampler that adds rows beyond the step's prompts (replayed
groups, a cached batch) gives every row's example in ``batch.examples``, and scalars it measured in
``batch.metrics`` (logged with the step's metrics). The default,
``"policy"``, samples ``num_generations`` responses per prompt from the current policy;
``"policy_per_prompt"`` does the same with a generator per prompt, so that the samples do not depend
on how the prompts are split across processes.
"""
from __future__ import annotations

import hashlib

import torch

from .lm.sampling import RolloutBatch, cat_batches, sample
from .registry import Registry

SAMPLERS: Registry = Registry("sampler")
register_sampler = SAMPLERS.register
get_sampler = SAMPLERS.get


@register_sampler("policy")
def policy_sampler(model, tokenizer, prompts, config, generator, state) -> RolloutBatch:
    """``G = config.num_generations`` samples per prompt from the current policy."""
    return sample(model, tokenizer, prompts, num_generations=config.num_generations,
                  max_new_tokens=config.max_completion_length, temperature=config.temperature,
                  top_k=config.top_k, top_p=config.top_p, generator=generator)


def prompt_seed(seed: int, step: int, prompt: str) -> int:
    """A 63-bit seed from ``(seed, step, prompt)`` (SHA-256, so the same on every machine and process)."""
    digest = hashlib.sha256(f"{seed}\x00{step}\x00{prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@register_sampler("policy_per_prompt")
def per_prompt_sampler(model, tokenizer, prompts, config, step) -> RolloutBatch:
    """Like ``"policy"``, but each prompt's ``G`` samples come from a generator seeded by
    ``(config.seed, step, prompt)``: a prompt's rollouts do not depend on which other prompts share
    its batch, so a run split over several processes (:mod:`rlcourse.distributed`) samples exactly
    what one process would. It costs one sampling call per prompt (slower than ``"policy"``), and a
    prompt drawn twice in one step gets the same samples twice."""
    batches = [sample(model, tokenizer, [p], num_generations=config.num_generations,
                      max_new_tokens=config.max_completion_length, temperature=config.temperature,
                      top_k=config.top_k, top_p=config.top_p,
                      generator=torch.Generator().manual_seed(prompt_seed(config.seed, step, p)))
               for p in prompts]
    return cat_batches(batches, tokenizer.pad_token_id)
