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
part needs go in ``batch.extras`` (see :class:`~rlcourse.lm.sampling.RolloutBatch`). The default,
``"policy"``, samples ``num_generations`` responses per prompt from the current policy.
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
