"""Control: Gymnasium agents, offline data sets in the D4RL layout, and test-time steering of frozen actors.

Importing this package registers the project's control environments with Gymnasium::

    gymnasium.make("rlcourse/Nav2D-v0")                   # goal-conditioned 2-D navigation (PoE chapter)
    gymnasium.make("rlcourse/ShutdownButtonGrid-v0")      # the shutdown-button gridworld (DReST chapter)
"""
from __future__ import annotations

import gymnasium as gym

CONTROL_ENVS = {
    "rlcourse/Nav2D-v0": "rlcourse.control.nav2d:Nav2DEnv",
    "rlcourse/ShutdownButtonGrid-v0": "rlcourse.control.gridworld:ShutdownButtonGridworld",
}

for _id, _entry in CONTROL_ENVS.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry)
