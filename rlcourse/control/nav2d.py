"""A fast goal-conditioned 2-D point-mass navigation task, as a Gymnasium environment.

The agent is a point in the square ``[-1, 1]^2`` that moves by ``step_size * clip(a, -1, 1)`` per
step, plus a little Gaussian process noise. The goal is drawn at reset; the observation is
``[x, y, goal_x, goal_y]``. Reaching within ``goal_radius`` of the goal ends the episode with reward
1 (``terminated``); otherwise the episode is cut at ``max_steps`` (``truncated``), with reward 0 on
every step. So the return of an episode is its success (0 or 1), as in D4RL's sparse maze tasks.

The dynamics are the pure function :func:`nav2d_step`, which the environment calls and which
:func:`rollout_batch` also calls to evaluate many episodes at once with the same physics.
"""
from __future__ import annotations

from typing import Callable

import gymnasium as gym
import numpy as np

STEP_SIZE = 0.1
GOAL_RADIUS = 0.1
MAX_STEPS = 30
PROCESS_NOISE = 0.01
MIN_START_GOAL_DIST = 0.5


def nav2d_step(pos: np.ndarray, action: np.ndarray, noise: np.ndarray, step_size: float = STEP_SIZE) -> np.ndarray:
    """One step of the point-mass dynamics for a batch of agents.

    ========= ========== ====================================================
    pos       ``(B, 2)``  positions in ``[-1, 1]^2``
    action    ``(B, 2)``  raw actions; clipped to ``[-1, 1]`` per coordinate
    noise     ``(B, 2)``  process noise already scaled (added to the move)
    returns   ``(B, 2)``  next positions, clipped to the arena
    ========= ========== ====================================================
    """
    pos, action, noise = (np.asarray(v, dtype=np.float64) for v in (pos, action, noise))
    if pos.ndim != 2 or pos.shape[1] != 2:
        raise ValueError(f"pos must have shape (B, 2), got {pos.shape}")
    if action.shape != pos.shape or noise.shape != pos.shape:
        raise ValueError(f"action {action.shape} and noise {noise.shape} must both match pos {pos.shape}")
    if not np.all(np.isfinite(action)):
        raise ValueError("action contains NaN or inf")
    return np.clip(pos + step_size * np.clip(action, -1.0, 1.0) + noise, -1.0, 1.0)


def sample_start_goal(rng: np.random.Generator, n: int, min_dist: float = MIN_START_GOAL_DIST) -> tuple[np.ndarray, np.ndarray]:
    """``n`` start positions and goals, uniform in the square and at least ``min_dist`` apart.

    ======= ========== ==================
    returns ``(n, 2)``  starts
            ``(n, 2)``  goals
    ======= ========== ==================
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    starts = np.empty((n, 2))
    goals = np.empty((n, 2))
    filled = 0
    while filled < n:
        s = rng.uniform(-1, 1, size=(2 * n, 2))
        g = rng.uniform(-1, 1, size=(2 * n, 2))
        ok = np.linalg.norm(s - g, axis=1) >= min_dist
        k = min(int(ok.sum()), n - filled)
        starts[filled:filled + k] = s[ok][:k]
        goals[filled:filled + k] = g[ok][:k]
        filled += k
    return starts, goals


class Nav2DEnv(gym.Env):
    """Goal-conditioned 2-D navigation. ``reset(options={"goal": g, "start": s})`` fixes either.

    ============ ======== ============================================
    observation  ``(4,)`` float32 ``[x, y, goal_x, goal_y]``
    action       ``(2,)`` float32 velocity command in ``[-1, 1]^2``
    reward       scalar   1.0 on reaching the goal, else 0.0
    ============ ======== ============================================
    """

    metadata = {"render_modes": []}

    def __init__(self, max_steps: int = MAX_STEPS, goal_radius: float = GOAL_RADIUS,
                 process_noise: float = PROCESS_NOISE, step_size: float = STEP_SIZE):
        if max_steps < 1 or goal_radius <= 0 or process_noise < 0 or step_size <= 0:
            raise ValueError("max_steps >= 1, goal_radius > 0, process_noise >= 0 and step_size > 0 are required")
        self.max_steps, self.goal_radius = int(max_steps), float(goal_radius)
        self.process_noise, self.step_size = float(process_noise), float(step_size)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self._pos = np.zeros(2)
        self._goal = np.zeros(2)
        self._t = 0

    def _obs(self) -> np.ndarray:
        return np.concatenate([self._pos, self._goal]).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        start, goal = sample_start_goal(self.np_random, 1)
        options = options or {}
        self._pos = np.asarray(options.get("start", start[0]), dtype=np.float64).reshape(2)
        self._goal = np.asarray(options.get("goal", goal[0]), dtype=np.float64).reshape(2)
        self._t = 0
        return self._obs(), {"goal": self._goal.copy()}

    def step(self, action):
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (2,):
            raise ValueError(f"action must have shape (2,), got {action.shape}")
        noise = self.process_noise * self.np_random.normal(size=(1, 2))
        self._pos = nav2d_step(self._pos[None], action[None], noise, self.step_size)[0]
        self._t += 1
        reached = bool(np.linalg.norm(self._pos - self._goal) < self.goal_radius)
        truncated = (not reached) and self._t >= self.max_steps
        return self._obs(), float(reached), reached, truncated, {"goal": self._goal.copy()}


def expert_action(obs: np.ndarray, gain: float = 5.0) -> np.ndarray:
    """A proportional controller towards the goal: ``clip(gain * (goal - pos), -1, 1)``.

    ======= ========== =============================
    obs     ``(B, 4)``  ``[x, y, goal_x, goal_y]``
    returns ``(B, 2)``  actions in ``[-1, 1]^2``
    ======= ========== =============================
    """
    obs = np.asarray(obs, dtype=np.float64)
    if obs.ndim != 2 or obs.shape[1] != 4:
        raise ValueError(f"obs must have shape (B, 4), got {obs.shape}")
    return np.clip(gain * (obs[:, 2:] - obs[:, :2]), -1.0, 1.0)


def rollout_batch(policy: Callable[[np.ndarray, int], np.ndarray], starts: np.ndarray, goals: np.ndarray,
                  noise: np.ndarray, goal_radius: float = GOAL_RADIUS, step_size: float = STEP_SIZE) -> dict:
    """Run ``B`` episodes at once with :func:`nav2d_step` (the environment's own dynamics).

    ``policy(obs, t)`` maps the ``(B, 4)`` observations at step ``t`` to ``(B, 2)`` actions. The
    process noise is passed in, so that several policies can be compared on the same draws
    (common random numbers); its length sets the time limit.

    ========= ============= ===============================================
    starts    ``(B, 2)``     start positions
    goals     ``(B, 2)``     goals
    noise     ``(T, B, 2)``  scaled process noise for each step
    returns   dict           ``success (B,)`` bool, ``steps (B,)`` int,
                             ``path (T+1, B, 2)`` positions (frozen once done)
    ========= ============= ===============================================
    """
    starts, goals, noise = (np.asarray(v, dtype=np.float64) for v in (starts, goals, noise))
    if starts.ndim != 2 or starts.shape[1] != 2 or goals.shape != starts.shape:
        raise ValueError(f"starts {starts.shape} and goals {goals.shape} must both be (B, 2)")
    if noise.ndim != 3 or noise.shape[1:] != starts.shape:
        raise ValueError(f"noise must be (T, B, 2) with B={starts.shape[0]}, got {noise.shape}")
    T, B = noise.shape[0], starts.shape[0]
    pos = starts.copy()
    done = np.linalg.norm(pos - goals, axis=1) < goal_radius
    steps = np.where(done, 0, T)
    path = np.empty((T + 1, B, 2))
    path[0] = pos
    for t in range(T):
        obs = np.concatenate([pos, goals], axis=1)
        act = np.asarray(policy(obs, t), dtype=np.float64)
        if act.shape != (B, 2):
            raise ValueError(f"policy returned shape {act.shape}, expected {(B, 2)}")
        new = nav2d_step(pos, act, noise[t], step_size)
        pos = np.where(done[:, None], pos, new)
        reached = (~done) & (np.linalg.norm(pos - goals, axis=1) < goal_radius)
        steps = np.where(reached, t + 1, steps)
        done = done | reached
        path[t + 1] = pos
    return {"success": done, "steps": steps, "path": path}
