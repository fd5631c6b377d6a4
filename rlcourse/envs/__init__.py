"""Text environments: Gymnasium environments whose observations and actions are text, for agents
that are language models (multi-turn episodes, :mod:`rlcourse.multiturn`).

Importing this package registers them with Gymnasium::

    gymnasium.make("rlcourse/TextFrozenLake-v0")
"""
from __future__ import annotations

import gymnasium as gym

from .frozenlake import MOVES, TextFrozenLake, expert_transcript, make_map, shortest_path

TEXT_ENVS = {"rlcourse/TextFrozenLake-v0": "rlcourse.envs.frozenlake:TextFrozenLake"}

for _id, _entry in TEXT_ENVS.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry)

__all__ = ["TextFrozenLake", "MOVES", "make_map", "shortest_path", "expert_transcript", "TEXT_ENVS"]
