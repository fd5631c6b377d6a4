"""FrozenLake as a text environment: Gymnasium's lake, played one move per turn in a few characters.

The agent sees the lake once, in the prompt, and its own position after every move::

    prompt              SFFFHHFFFHHFHFFG 0>          (the 4x4 map row by row, the start cell, '>')
    agent turn          R<eos>                       (one move: L, D, R or U, then end of turn)
    environment turn    1>                           (the new cell and '>'; nothing once the episode ends)

An episode ends at the goal (reward 1), in a hole (reward 0), after ``max_turns`` moves (reward 0),
or at a turn that is not a move (reward 0, ``info["reason"]`` says why). The dynamics are
Gymnasium's own ``FrozenLake-v1`` (deterministic, ``is_slippery=False``), which this class wraps, so
the transitions are exactly those of the Gymnasium environment. Maps come from a seed, are solvable,
and their shortest path fits in ``max_turns`` moves.
"""
from __future__ import annotations

from collections import deque

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv, generate_random_map

MOVES = "LDRU"  # Gymnasium's action order: 0 left, 1 down, 2 right, 3 up
CHARSET = frozenset("SFHG0123456789>LDRU ")


def shortest_path(desc: list[str]) -> str | None:
    """The moves of a shortest path from S to G avoiding holes (breadth-first search), or None."""
    n, m = len(desc), len(desc[0])
    cells = "".join(desc)
    start, goal = cells.index("S"), cells.index("G")
    prev = {start: None}
    queue = deque([start])
    while queue:
        s = queue.popleft()
        if s == goal:
            moves = []
            while prev[s] is not None:
                s, a = prev[s]
                moves.append(MOVES[a])
            return "".join(reversed(moves))
        r, c = divmod(s, m)
        for a, (dr, dc) in enumerate(((0, -1), (1, 0), (0, 1), (-1, 0))):
            rr, cc = r + dr, c + dc
            if 0 <= rr < n and 0 <= cc < m:
                t = rr * m + cc
                if t not in prev and cells[t] != "H":
                    prev[t] = (s, a)
                    queue.append(t)
    return None


def make_map(seed: int, size: int = 4, p_frozen: float = 0.75, max_turns: int = 8) -> list[str]:
    """A solvable ``size x size`` map from ``seed`` whose shortest path takes at most ``max_turns`` moves."""
    if max_turns < 2 * (size - 1):
        raise ValueError(f"no {size}x{size} map can be solved in {max_turns} moves: the goal is "
                         f"{2 * (size - 1)} moves from the start")
    rng = np.random.default_rng(seed)
    while True:
        desc = generate_random_map(size=size, p=p_frozen, seed=int(rng.integers(2**31)))
        path = shortest_path(desc)
        if path is not None and len(path) <= max_turns:
            return desc


class TextFrozenLake(gym.Env):
    """A text interface to Gymnasium's deterministic FrozenLake (see the module docstring).

    ``reset(seed=..., options={"map_seed": k})`` draws map ``k`` (default: a map from the reset seed);
    ``step(text)`` takes the agent's turn as text (one move letter; surrounding spaces and a trailing
    ``<eos>`` are ignored) and returns the environment's reply as text.
    """

    metadata = {"render_modes": []}

    def __init__(self, size: int = 4, max_turns: int = 8, p_frozen: float = 0.75):
        if size < 2 or max_turns < 2 * (size - 1):
            raise ValueError(f"need size >= 2 and max_turns >= {2 * (size - 1)} (the goal's distance from the start), "
                             f"got size={size}, max_turns={max_turns}")
        self.size, self.max_turns, self.p_frozen = size, max_turns, p_frozen
        self.observation_space = spaces.Text(max_length=size * size + 8, min_length=0, charset="".join(sorted(CHARSET)))
        self.action_space = spaces.Text(max_length=8, min_length=0, charset=MOVES + " ")
        self.desc: list[str] | None = None
        self._lake: FrozenLakeEnv | None = None
        self.turns = 0
        self.done = True

    def prompt(self) -> str:
        return f"{''.join(self.desc)} {self._state}>"

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        map_seed = (options or {}).get("map_seed")
        if map_seed is None:
            map_seed = int(self.np_random.integers(2**31))
        self.desc = make_map(int(map_seed), self.size, self.p_frozen, self.max_turns)
        self._lake = FrozenLakeEnv(desc=self.desc, is_slippery=False)
        self._state, _ = self._lake.reset(seed=seed)
        self.turns, self.done = 0, False
        return self.prompt(), {"map_seed": int(map_seed), "optimal": shortest_path(self.desc)}

    def step(self, action: str):
        if self.done:
            raise RuntimeError("step() after the episode ended: call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"a turn is text, got {type(action).__name__}")
        move = action.replace("<eos>", "").strip()
        self.turns += 1
        if len(move) != 1 or move not in MOVES:
            self.done = True
            return "", 0.0, True, False, {"reason": f"not a move: {action!r} (expected one of {list(MOVES)})"}
        self._state, reward, terminated, _, _ = self._lake.step(MOVES.index(move))
        truncated = not terminated and self.turns >= self.max_turns
        self.done = terminated or truncated
        reason = "goal" if reward > 0 else "hole" if terminated else "out of turns" if truncated else ""
        reply = "" if self.done else f"{self._state}>"
        return reply, float(reward), bool(terminated), bool(truncated), {"reason": reason, "state": int(self._state)}


def expert_transcript(desc: list[str], start_prompt: str, eos: str = "<eos>") -> tuple[list[str], list[str]]:
    """The agent's and the environment's turns along a shortest path: ``(agent_turns, env_turns)``
    with ``env_turns[k]`` the reply after ``agent_turns[k]`` (empty after the last move)."""
    path = shortest_path(desc)
    if path is None:
        raise ValueError(f"map {desc} has no path from S to G")
    env = FrozenLakeEnv(desc=desc, is_slippery=False)
    env.reset()
    agent, replies = [], []
    for k, move in enumerate(path):
        state, *_ = env.step(MOVES.index(move))
        agent.append(move + eos)
        replies.append("" if k == len(path) - 1 else f"{state}>")
    return agent, replies
