"""Product-of-experts steering on Gymnasium's MuJoCo tasks: the same pipeline as the navigation
experiment (D4RL-layout data, behaviour-cloned frozen actors, priors, composition rules).

Two paths:

* the balance cells (book profile; :func:`rlcourse.studies.poe_steering.run_balance_cells`):
  InvertedDoublePendulum-v5 with a *competent* behaviour policy, a linear-quadratic regulator (LQR) computed from the simulator by finite differences
  (:func:`lqr_gain`). Its data sets come in D4RL's grades (expert: LQR plus N(0, 0.1^2) noise;
  medium: LQR plus N(0, 0.3^2), which topples within tens of steps; random: uniform actions), each
  clones a frozen actor, and each actor is steered by a good prior (cloned from LQR plus
  N(0, 0.3^2) data) and by a random prior. Returns are reported as D4RL normalised scores,
  ``100 (R - R_random) / (R_expert - R_random)``, against the random policy and the LQR expert on the
  same episodes.
* :func:`run_mujoco_cells` (full profile): Hopper / HalfCheetah from random-policy data, where the
  actor is incompetent and every rule inherits its failure.
"""
from __future__ import annotations

import numpy as np

from ..profiles import Profile, one_torch_thread, profile as current_profile
from .bc import GaussianMLP, RandomPrior, train_bc
from .gaussians import compose
from .offline import build_dataset

BALANCE_ENV = "InvertedDoublePendulum-v5"
BALANCE_GRADES = {"expert": 0.1, "medium": 0.3, "prior_good": 0.3}   # std of the noise added to the LQR
BALANCE_ACTORS = ("expert", "medium", "random")
BALANCE_PRIORS = ("good", "random")
BALANCE_RULES = ("frozen", "poe", "additive", "prior", "poe_kl")
BALANCE_ALPHA = 0.5                                                  # the paper's middle alpha
BALANCE_KL_BUDGET = 0.5                                              # nats per state, as on the navigation task


def lqr_gain(env_id: str = BALANCE_ENV, q: float = 1.0, r: float = 1.0) -> np.ndarray:
    """The discrete-time LQR gain ``K`` of a MuJoCo balance task around its upright rest state.

    The dynamics of one environment step (``frame_skip`` simulator steps) are linearised by central
    finite differences, ``x' = A x + B u`` with ``x = (qpos, qvel)``, and the Riccati equation is
    solved with costs ``q I`` on the state and ``r I`` on the action. The regulator is ``u = -K x``.

    ======= ============== ==========================================
    returns                ``(n_u, 2 n_v)`` the gain ``K``
    ======= ============== ==========================================
    """
    import gymnasium as gym
    import mujoco
    from scipy.linalg import solve_discrete_are

    if q <= 0 or r <= 0:
        raise ValueError(f"the LQR costs q and r must be > 0, got {q}, {r}")
    env = gym.make(env_id)
    model, k = env.unwrapped.model, env.unwrapped.frame_skip
    data = mujoco.MjData(model)
    nv, nu = model.nv, model.nu

    def step(x, u):
        mujoco.mj_resetData(model, data)
        data.qpos[:], data.qvel[:], data.ctrl[:] = x[:nv], x[nv:], u
        for _ in range(k):
            mujoco.mj_step(model, data)
        return np.r_[data.qpos, data.qvel]

    x0, u0, h = np.zeros(2 * nv), np.zeros(nu), 1e-5
    A = np.stack([(step(x0 + h * e, u0) - step(x0 - h * e, u0)) / (2 * h) for e in np.eye(2 * nv)], 1)
    B = np.stack([(step(x0, u0 + h * e) - step(x0, u0 - h * e)) / (2 * h) for e in np.eye(nu)], 1)
    Q, R = q * np.eye(2 * nv), r * np.eye(nu)
    P = solve_discrete_are(A, B, Q, R)
    env.close()
    return np.linalg.solve(R + B.T @ P @ B, B.T @ P @ A)


def idp_state(obs: np.ndarray) -> np.ndarray:
    """``(qpos, qvel)`` of InvertedDoublePendulum-v5 from its observation.

    The observation is ``[x, sin t1, sin t2, cos t1, cos t2, v, w1, w2, f]``; the angles are
    recovered with ``arctan2``.

    ======= ========== =============================
    obs     ``(B, 9)``  observations
    returns ``(B, 6)``  ``[x, t1, t2, v, w1, w2]``
    ======= ========== =============================
    """
    obs = np.asarray(obs, dtype=np.float64)
    if obs.ndim != 2 or obs.shape[1] != 9:
        raise ValueError(f"obs must have shape (B, 9), got {obs.shape}")
    ang = np.arctan2(obs[:, 1:3], obs[:, 3:5])
    return np.concatenate([obs[:, :1], ang, obs[:, 5:8]], axis=1)


def lqr_policy(K: np.ndarray, noise: float):
    """``policy(obs (9,), rng) -> action (1,)``: the LQR on the observed state, plus N(0, noise^2), clipped."""
    def policy(obs, rng):
        u = -K @ idp_state(np.asarray(obs)[None])[0]
        return np.clip(u + noise * rng.normal(size=u.shape), -1.0, 1.0).astype(np.float32)
    return policy


def make_envs(env_id: str, episodes: int, max_steps: int) -> list:
    """``episodes`` instances of ``env_id`` with time limit ``max_steps``, for :func:`evaluate_policy`."""
    import gymnasium as gym

    if episodes < 1 or max_steps < 1:
        raise ValueError(f"episodes and max_steps must be >= 1, got {episodes}, {max_steps}")
    return [gym.make(env_id, max_episode_steps=max_steps) for _ in range(episodes)]


def evaluate_policy(envs: list, policy, seed: int = 0) -> np.ndarray:
    """Undiscounted returns of a batched deterministic policy, one environment (of :func:`make_envs`)
    per episode.

    ``policy(obs (B, d_s)) -> actions (B, d_a)`` is called on the observations of the episodes still
    running; episode ``i`` resets with seed ``seed + i`` (so that rules compared on the same seed see
    the same start states) and stops at termination or at the environments' time limit.

    ======= ============= ======================
    returns               ``(episodes,)`` float64 returns
    ======= ============= ======================
    """
    episodes = len(envs)
    if episodes < 1:
        raise ValueError("need at least one environment")
    obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)])
    low, high = envs[0].action_space.low, envs[0].action_space.high
    returns, alive = np.zeros(episodes), np.ones(episodes, dtype=bool)
    while alive.any():
        idx = np.flatnonzero(alive)
        act = np.clip(policy(obs[idx]), low, high).astype(np.float32)
        for j, i in enumerate(idx):
            o, r, term, trunc, _ = envs[i].step(act[j])
            returns[i] += float(r)
            obs[i] = o
            alive[i] = not (term or trunc)
    return returns


def _composed(actor: GaussianMLP, prior, rule: str, alpha: float, prior_seed: int):
    if hasattr(prior, "reset"):
        prior.reset(prior_seed)

    def policy(obs):
        mu_a, var_a = actor.predict(obs)
        mu_g, var_g = prior.predict(obs)
        return compose(rule, mu_a, var_a, mu_g, var_g, alpha)[0]
    return policy


# --------------------------------------------------------------------------------------------
# Locomotion from random-policy data (full profile)
# --------------------------------------------------------------------------------------------


def reward_weighted_prior(data: dict, steps: int, temperature: float = 1.0, seed: int = 0, **kw) -> GaussianMLP:
    """A prior for locomotion, where there is no goal position: behaviour cloning on the data set's
    transitions resampled with weights ``exp((r - max r) / temperature)``, i.e. the actions that
    moved the body forward ("goal: high reward").

    ======= ===== =========================================
    data    dict  D4RL layout with ``N`` transitions
    returns model a :class:`GaussianMLP` prior
    ======= ===== =========================================
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    r = data["rewards"].astype(np.float64)
    w = np.exp((r - r.max()) / temperature)
    idx = np.random.default_rng(seed).choice(len(r), size=len(r), p=w / w.sum())
    return train_bc(data["observations"][idx], data["actions"][idx], steps, seed=seed, **kw)


class NoisyPrior:
    """A prior made worse: the base prior's mean plus N(0, std^2) noise drawn on every call, and its
    variance inflated by ``std^2``. Same ``predict`` shapes as :class:`RandomPrior`."""

    def __init__(self, base, std: float, seed: int = 0):
        if std <= 0:
            raise ValueError(f"std must be > 0, got {std}")
        self.base, self.std = base, float(std)
        self.reset(seed)

    def reset(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def predict(self, obs):
        mu, var = self.base.predict(obs)
        return mu + self.std * self.rng.normal(size=mu.shape), var + self.std ** 2


def run_mujoco_cells(env_id: str = "Hopper-v5", prof: Profile | None = None, n_steps: int | None = None,
                     episodes: int | None = None, bc_steps: int | None = None, seed: int = 0,
                     max_episode_steps: int | None = None) -> dict:
    """Frozen BC actor on a random-policy D4RL-layout data set of a MuJoCo task, steered by a
    reward-weighted prior (good), the same prior with inflated noise (degraded) and a random prior.

    Returns ``{prior: {rule: mean return}}`` for rules ``frozen``, ``poe`` (alpha 0.5),
    ``additive`` (alpha 0.5) and ``prior``, plus ``n_transitions``. With a D4RL "random" data set
    the actor is incompetent, which is the regime where the paper finds every rule inherits
    the actor's failure. ``max_episode_steps`` overrides the environment's time limit (default 1000).
    """
    prof = prof or current_profile()
    n_steps = n_steps or prof.pick(smoke=500, book=5000, full=100000)
    episodes = episodes or prof.pick(smoke=2, book=5, full=20)
    bc_steps = bc_steps or prof.pick(smoke=50, book=500, full=5000)
    with one_torch_thread():
        return _mujoco_cells(env_id, n_steps, episodes, bc_steps, seed, max_episode_steps)


def _mujoco_cells(env_id: str, n_steps: int, episodes: int, bc_steps: int, seed: int,
                  max_episode_steps: int | None) -> dict:
    import gymnasium as gym

    env = gym.make(env_id)
    low, high = env.action_space.low, env.action_space.high
    data = build_dataset(env, lambda o, r: r.uniform(low, high).astype(np.float32), n_steps, seed=seed)
    env.close()
    actor = train_bc(data["observations"], data["actions"], bc_steps, seed=seed)
    good = reward_weighted_prior(data, bc_steps, seed=seed)
    priors = {"good": good, "degraded": NoisyPrior(good, 0.5, seed),
              "random": RandomPrior(act_dim=len(low), seed=seed)}
    envs = make_envs(env_id, episodes, max_episode_steps or 1000)
    out: dict = {"n_transitions": int(len(data["rewards"]))}
    for name, prior in priors.items():
        out[name] = {}
        for rule, alpha in (("frozen", 0.0), ("poe", 0.5), ("additive", 0.5), ("prior", 1.0)):
            returns = evaluate_policy(envs, _composed(actor, prior, rule, alpha, seed), 10_000)
            out[name][rule] = float(np.mean(returns))
    for e in envs:
        e.close()
    return out
