"""Rewards: verifiers, noise models, reward models and reward shaping (a registry).

A reward is ``fn(batch, examples, task, state) -> (B,) float tensor``, one score per row of the
rollout batch; ``examples[i]`` is the example row ``i`` answered. The default, ``"task"``, is the
task's own verifier. A reward may also name ``model``, ``tokenizer``, ``ref_model`` or ``step``
(keyword parameters): the loop then passes its current ones (:func:`rlcourse.parts.bind_reward`), and
``RLConfig.reward_kwargs`` reach the reward's other keyword parameters.
"""
from __future__ import annotations

import torch

from ..registry import Registry

REWARDS: Registry = Registry("reward")
register_reward = REWARDS.register
get_reward = REWARDS.get


@register_reward("task")
def task_reward(batch, examples, task, state) -> torch.Tensor:
    """The task's verifier on each decoded response."""
    return torch.as_tensor(task.rewards(batch.texts, examples), dtype=torch.float32)
