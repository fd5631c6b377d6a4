"""Samplers: how the loop turns prompts into a rollout batch (a registry).

A sampler is ``fn(model, tokenizer, prompts, config, generator, state) -> RolloutBatch`` where
``prompts`` is a list of strings, ``config`` the trainer's :class:`~rlcourse.train.RLConfig` and
``state`` a dict the sampler may keep between steps. The default, ``"policy"``, samples
``num_generations`` responses per prompt from the current policy.
"""
from __future__ import annotations

from .lm.sampling import RolloutBatch, sample
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
