"""Offline data sets in the D4RL layout: build them from a Gymnasium environment, save and load HDF5.

The layout is the one D4RL's ``get_dataset()`` returns and its HDF5 files hold, one flat array per
key with the ``N`` transitions of all episodes concatenated:

============== ============== ========== ================================================
key            shape          dtype      meaning
============== ============== ========== ================================================
observations   ``(N, d_s)``   float32    state before the action
actions        ``(N, d_a)``   float32    action taken
rewards        ``(N,)``       float32    reward received
terminals      ``(N,)``       bool       the episode ended in a terminal state here
timeouts       ``(N,)``       bool       the episode was cut here (time limit or end of data)
============== ============== ========== ================================================

:func:`load_d4rl_hdf5` accepts what D4RL's own ``get_dataset`` accepts: only ``observations``,
``actions``, ``rewards`` and ``terminals`` are required; ``rewards`` and ``terminals`` stored as
``(N, 1)`` are squeezed to ``(N,)``; a file without ``timeouts`` gets all-False timeouts except on
its last transition (the data ends there). :func:`validate_d4rl` checks the strict in-memory layout
that the loader returns.

Optional keys are kept as they are: ``next_observations`` ``(N, d_s)`` and anything under ``infos/``
(for example ``infos/goal``, as in D4RL's maze tasks). The ``d4rl`` package itself is unmaintained
and is not needed: this module reads the *format*. :func:`load_d4rl_hdf5` also reads a Minari
``main_data.hdf5`` file (one group ``episode_<i>`` per episode, with ``T + 1`` observations and
``terminations`` / ``truncations``) and converts it to the flat layout.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import h5py
import numpy as np

D4RL_KEYS = ("observations", "actions", "rewards", "terminals", "timeouts")
D4RL_REQUIRED = ("observations", "actions", "rewards", "terminals")  # what D4RL's get_dataset requires
D4RL_DTYPES = {"observations": np.float32, "actions": np.float32, "rewards": np.float32,
               "terminals": np.bool_, "timeouts": np.bool_}


def validate_d4rl(data: dict) -> int:
    """Check that ``data`` has the D4RL keys, dtypes and matching lengths; return ``N``.

    Raises ``ValueError`` naming the first missing key, a wrong dtype or a length mismatch.
    """
    if not isinstance(data, dict):
        raise TypeError(f"a D4RL data set is a dict of arrays, got {type(data).__name__}")
    missing = [k for k in D4RL_KEYS if k not in data]
    if missing:
        raise ValueError(f"D4RL data set is missing key(s) {missing}; it has {sorted(data)}")
    n = len(data["observations"])
    for key in D4RL_KEYS:
        arr = data[key]
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"data[{key!r}] must be a numpy array, got {type(arr).__name__}")
        if arr.dtype != D4RL_DTYPES[key]:
            raise ValueError(f"data[{key!r}] has dtype {arr.dtype}, expected {np.dtype(D4RL_DTYPES[key])}")
        if len(arr) != n:
            raise ValueError(f"data[{key!r}] has {len(arr)} rows but observations has {n}")
        want_ndim = 2 if key in ("observations", "actions") else 1
        if arr.ndim != want_ndim:
            raise ValueError(f"data[{key!r}] must be {want_ndim}-D, got shape {arr.shape}")
    if "next_observations" in data and data["next_observations"].shape != data["observations"].shape:
        raise ValueError(f"next_observations {data['next_observations'].shape} does not match "
                         f"observations {data['observations'].shape}")
    return n


def build_dataset(env: gym.Env, policy: Callable[[np.ndarray, np.random.Generator], Any], n_steps: int,
                  seed: int = 0) -> dict:
    """Roll out ``policy`` in ``env`` for ``n_steps`` transitions and return a D4RL-layout dict.

    ``policy(obs, rng)`` gets one observation ``(d_s,)`` and a numpy generator and returns one
    action. Episodes are reset when the environment terminates or truncates; the last transition
    of the data is marked as a timeout, so every episode in the data ends in a terminal or a timeout.
    Info entries named ``goal`` are stored under ``infos/goal``.

    ================= ============== ==============================================
    returns keys      shape          meaning
    ================= ============== ==============================================
    observations      ``(N, d_s)``   float32
    next_observations ``(N, d_s)``   float32 observation after the action
    actions           ``(N, d_a)``   float32
    rewards           ``(N,)``       float32
    terminals         ``(N,)``       bool
    timeouts          ``(N,)``       bool
    infos/goal        ``(N, d_g)``   float32, only if the env reports ``info["goal"]``
    ================= ============== ==============================================
    """
    if not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
        raise ValueError(f"n_steps must be a positive integer, got {n_steps!r}")
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=int(seed))
    env.action_space.seed(int(seed))
    cols: dict[str, list] = {k: [] for k in ("observations", "next_observations", "actions", "rewards",
                                             "terminals", "timeouts")}
    goals: list = []
    for i in range(int(n_steps)):
        action = np.asarray(policy(np.asarray(obs), rng), dtype=np.float32)
        if action.shape != env.action_space.shape:
            raise ValueError(f"policy returned an action of shape {action.shape}, the env expects "
                             f"{env.action_space.shape}")
        next_obs, reward, terminated, truncated, next_info = env.step(action)
        cols["observations"].append(np.asarray(obs, dtype=np.float32))
        cols["next_observations"].append(np.asarray(next_obs, dtype=np.float32))
        cols["actions"].append(action)
        cols["rewards"].append(float(reward))
        cols["terminals"].append(bool(terminated))
        cols["timeouts"].append(bool(truncated) or (i == n_steps - 1 and not terminated))
        if "goal" in info:
            goals.append(np.asarray(info["goal"], dtype=np.float32))
        if terminated or truncated:
            obs, info = env.reset()
        else:
            obs, info = next_obs, next_info
    data = {
        "observations": np.stack(cols["observations"]),
        "next_observations": np.stack(cols["next_observations"]),
        "actions": np.stack(cols["actions"]).astype(np.float32),
        "rewards": np.asarray(cols["rewards"], dtype=np.float32),
        "terminals": np.asarray(cols["terminals"], dtype=np.bool_),
        "timeouts": np.asarray(cols["timeouts"], dtype=np.bool_),
    }
    if len(goals) == n_steps:
        data["infos/goal"] = np.stack(goals)
    validate_d4rl(data)
    return data


def save_d4rl_hdf5(data: dict, path: str | Path) -> Path:
    """Write a D4RL-layout dict to an HDF5 file (keys with ``/`` become groups, as in D4RL)."""
    validate_d4rl(data)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for key, arr in data.items():
            f.create_dataset(key, data=np.asarray(arr), compression="gzip", compression_opts=1)
    return path


def _load_minari(f: h5py.File, obs_keys: tuple[str, ...] | None) -> dict:
    """Flatten Minari's per-episode groups into the D4RL layout."""
    names = sorted((k for k in f.keys() if k.startswith("episode_")), key=lambda k: int(k.split("_")[1]))
    cols: dict[str, list] = {k: [] for k in ("observations", "next_observations", "actions", "rewards",
                                             "terminals", "timeouts")}
    for name in names:
        ep = f[name]
        for key in ("observations", "actions", "rewards", "terminations", "truncations"):
            if key not in ep:
                raise ValueError(f"Minari episode {name!r} is missing key {key!r}; it has {sorted(ep.keys())}")
        o = ep["observations"]
        if isinstance(o, h5py.Group):  # dict observations (e.g. goal-conditioned tasks): concatenate
            keys = obs_keys or tuple(sorted(o.keys()))
            for k in keys:
                if k not in o:
                    raise ValueError(f"Minari episode {name!r} has no observation key {k!r}; it has {sorted(o.keys())}")
            o = np.concatenate([np.asarray(o[k], dtype=np.float32).reshape(len(o[k]), -1) for k in keys], axis=1)
        else:
            o = np.asarray(o, dtype=np.float32).reshape(len(o), -1)
        T = len(ep["actions"])
        if len(o) != T + 1:
            raise ValueError(f"Minari episode {name!r} has {len(o)} observations for {T} actions (expected T+1)")
        cols["observations"].append(o[:-1])
        cols["next_observations"].append(o[1:])
        cols["actions"].append(np.asarray(ep["actions"], dtype=np.float32).reshape(T, -1))
        cols["rewards"].append(np.asarray(ep["rewards"], dtype=np.float32).reshape(T))
        cols["terminals"].append(np.asarray(ep["terminations"], dtype=np.bool_).reshape(T))
        cols["timeouts"].append(np.asarray(ep["truncations"], dtype=np.bool_).reshape(T))
    if not names:
        raise ValueError("the file has neither the D4RL keys nor Minari 'episode_<i>' groups")
    return {k: np.concatenate(v) for k, v in cols.items()}


def _as_d4rl_layout(data: dict, where: str) -> dict:
    """What D4RL's ``get_dataset`` tolerates, made strict: squeeze ``(N, 1)`` rewards and terminals
    (and timeouts), and add ``timeouts`` when the file has none (False everywhere, True on the last
    transition unless it is terminal, so that the last episode still ends)."""
    n = len(data["observations"])
    for key in ("rewards", "terminals", "timeouts"):
        if key in data:
            arr = np.asarray(data[key])
            if arr.ndim == 2 and arr.shape[1] == 1:
                arr = arr[:, 0]
            if arr.shape != (n,):
                raise ValueError(f"{where}: {key} has shape {arr.shape}; expected ({n},) or ({n}, 1)")
            data[key] = arr
    if "timeouts" not in data:
        timeouts = np.zeros(n, dtype=np.bool_)
        if n and not bool(data["terminals"][-1]):
            timeouts[-1] = True
        data["timeouts"] = timeouts
    return data


def load_d4rl_hdf5(path: str | Path, obs_keys: tuple[str, ...] | None = None) -> dict:
    """Load a D4RL-layout HDF5 file (ours, or a real D4RL file) or a Minari ``main_data.hdf5``.

    Every dataset in the file is read (groups are walked, so ``infos/goal`` stays ``infos/goal``);
    the five D4RL keys are cast to the D4RL dtypes and validated. ``obs_keys`` picks and orders the
    parts of a Minari dict observation (default: all, sorted by name).

    ======= ==== ====================================================================
    returns dict the D4RL layout (see the module docstring), validated
    ======= ==== ====================================================================
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no HDF5 file at {path}")
    with h5py.File(path, "r") as f:
        if "observations" not in f and any(k.startswith("episode_") for k in f.keys()):
            data = _load_minari(f, obs_keys)
        else:
            data = {}
            f.visititems(lambda name, obj: data.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
            missing = [k for k in D4RL_REQUIRED if k not in data]
            if missing:
                raise ValueError(f"{path} is missing D4RL key(s) {missing}; it has {sorted(data)}")
            data = _as_d4rl_layout(data, str(path))
    for key in D4RL_KEYS:
        data[key] = np.asarray(data[key]).astype(D4RL_DTYPES[key], copy=False)
    if "next_observations" in data:
        data["next_observations"] = np.asarray(data["next_observations"], dtype=np.float32)
    validate_d4rl(data)
    return data


def episode_slices(data: dict) -> list[slice]:
    """The episodes of a D4RL-layout data set: an episode ends at a terminal or a timeout."""
    n = validate_d4rl(data)
    ends = np.flatnonzero(data["terminals"] | data["timeouts"])
    out, start = [], 0
    for e in ends:
        out.append(slice(start, int(e) + 1))
        start = int(e) + 1
    if start < n:
        out.append(slice(start, n))
    return out
