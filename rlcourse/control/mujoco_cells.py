"""Product-of-experts steering on Gymnasium's MuJoCo tasks: the same pipeline as the navigation
experiment (D4RL-layout data, behaviour-cloned frozen actor, priors, composition rules)."""
from __future__ import annotations

import numpy as np

from ..profiles import Profile, one_torch_thread, profile as current_profile
from .bc import GaussianMLP, RandomPrior, train_bc
from .gaussians import compose
from .offline import build_dataset



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

    env = gym.make(env_id) if max_episode_steps is None else gym.make(env_id, max_episode_steps=max_episode_steps)
    low, high = env.action_space.low, env.action_space.high
    data = build_dataset(env, lambda o, r: r.uniform(low, high).astype(np.float32), n_steps, seed=seed)
    actor = train_bc(data["observations"], data["actions"], bc_steps, seed=seed)
    good = reward_weighted_prior(data, bc_steps, seed=seed)

    class _Noisy:
        def __init__(self, base, std, rng):
            self.base, self.std, self.rng = base, std, rng

        def reset(self, s):
            self.rng = np.random.default_rng(s)

        def predict(self, obs):
            mu, var = self.base.predict(obs)
            return mu + self.std * self.rng.normal(size=mu.shape), var + self.std ** 2

    priors = {"good": good, "degraded": _Noisy(good, 0.5, np.random.default_rng(seed)),
              "random": RandomPrior(act_dim=env.action_space.shape[0], seed=seed)}
    out: dict = {"n_transitions": int(len(data["rewards"]))}
    for name, prior in priors.items():
        out[name] = {}
        for rule, alpha in (("frozen", 0.0), ("poe", 0.5), ("additive", 0.5), ("prior", 1.0)):
            if hasattr(prior, "reset"):
                prior.reset(seed)
            returns = []
            for ep in range(episodes):
                obs, _ = env.reset(seed=10_000 + ep)
                total, done = 0.0, False
                while not done:
                    mu_a, var_a = actor.predict(obs[None])
                    mu_g, var_g = prior.predict(obs[None])
                    act = np.clip(compose(rule, mu_a, var_a, mu_g, var_g, alpha)[0][0], low, high)
                    obs, r, term, trunc, _ = env.step(act.astype(np.float32))
                    total += float(r)
                    done = term or trunc
                returns.append(total)
            out[name][rule] = float(np.mean(returns))
    env.close()
    return out
