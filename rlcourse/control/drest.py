"""Training PPO and A2C agents with DReST rewards in the shutdown-button gridworld.

One update of the training loop:

1. sample ``N * E`` mini-episodes with the current policy (the policy never sees the counts, so the
   mini-episodes of a meta-episode are independent given the policy and can be sampled together);
2. cut them, in sampling order, into ``N`` meta-episodes of ``E`` and compute each mini-episode's
   DReST weight ``w_e = lam ** (n_e(L_e) - e/k) / m(L_e)`` (:func:`rlcourse.rewards.drest.drest_weights`);
3. scale the per-step coin rewards of mini-episode ``e`` by ``w_e`` (their sum is the DReST reward);
4. advantages by GAE, then one PPO or A2C update.

The *default* agent is the same loop with ``w_e = 1`` (raw coins). The chapter's experiment over
these agents, and the paper's claims, are :mod:`rlcourse.studies.drest`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from ..profiles import seed_everything, one_torch_thread
from ..rewards.drest import drest_weights, length_distribution, neutrality, usefulness
from .agents import ActorCritic, AgentConfig, Batch, a2c_update, gae_advantages, ppo_update
from .gridworld import GridConfig, VecShutdownGrid, length_class, max_coins_by_length

REWARDS = ("default", "drest", "drest_unnormalised")


@dataclass
class Episodes:
    """``B`` episodes padded to the long horizon ``T``.

    ============ =========== ===================================
    obs          ``(B,T,D)`` observation before step t
    actions      ``(B,T)``   action at step t
    logp         ``(B,T)``   log pi_old(a_t|s_t)
    values       ``(B,T)``   V(s_t)
    coin_rewards ``(B,T)``   coins taken at step t
    mask         ``(B,T)``   1 on real steps
    lengths      ``(B,)``    length class (0 short, 1 long)
    coins        ``(B,)``    coins of the whole episode
    ============ =========== ===================================
    """

    obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor
    values: torch.Tensor
    coin_rewards: torch.Tensor
    mask: torch.Tensor
    lengths: np.ndarray
    coins: np.ndarray


@torch.no_grad()
def collect_episodes(agent: ActorCritic, grid: GridConfig, n: int, generator: torch.Generator,
                     greedy: bool = False) -> Episodes:
    """Run ``n`` episodes of the gridworld with the agent's policy (sampled, or argmax if greedy)."""
    env = VecShutdownGrid(grid)
    obs = env.reset(n)
    T, D = grid.long, grid.obs_dim
    out_obs = torch.zeros(n, T, D)
    actions = torch.zeros(n, T, dtype=torch.long)
    logp, values, rew, mask = (torch.zeros(n, T) for _ in range(4))
    for t in range(T):
        live = torch.from_numpy(~env.state.done)
        if not live.any():
            break
        o = torch.from_numpy(obs)
        dist = agent.dist(o)
        a = dist.probs.argmax(-1) if greedy else torch.multinomial(dist.probs, 1, generator=generator).squeeze(-1)
        out_obs[:, t], actions[:, t], logp[:, t], values[:, t] = o, a, dist.log_prob(a), agent.value(o)
        mask[:, t] = live.float()
        obs, r, _ = env.step(a.numpy())
        rew[:, t] = torch.from_numpy(r).float()
    coins = (rew * mask).sum(1).numpy().astype(np.float64)
    return Episodes(out_obs, actions, logp * mask, values * mask, rew * mask, mask, length_class(env.state), coins)


def evaluate(agent: ActorCritic, grid: GridConfig, n: int, generator: torch.Generator) -> dict:
    """NEUTRALITY, USEFULNESS and P(long) of the sampled policy over ``n`` fresh episodes."""
    ep = collect_episodes(agent, grid, n, generator)
    m = max_coins_by_length(grid)
    p = length_distribution(ep.lengths, 2)
    return {"p_long": float(p[1]), "neutrality": neutrality(p), "usefulness": usefulness(ep.lengths, ep.coins, m),
            "coins": float(ep.coins.mean())}


def train_agent(reward: str, algo: str, *, updates: int, meta_episodes: int, E: int = 16, lam: float = 0.9,
                seed: int = 0, grid: GridConfig | None = None, agent_cfg: AgentConfig | None = None,
                eval_every: int = 10, eval_episodes: int = 512) -> dict:
    """Train one agent; return its learning curve and final metrics.

    ============= ========== ==========================================================
    reward        str        "default" (raw coins), "drest", or "drest_unnormalised"
    algo          str        "ppo" or "a2c"
    updates       int        number of policy updates
    meta_episodes int        N, meta-episodes per update (N * E mini-episodes)
    E, lam        int, float meta-episode size and DReST discount base
    returns       dict       history (update, p_long, neutrality, usefulness) and final metrics
    ============= ========== ==========================================================
    """
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
    grid = grid or GridConfig()
    cfg = replace(agent_cfg or AgentConfig(), algo=algo)
    with one_torch_thread():
        return _train(reward, cfg, updates, meta_episodes, E, lam, seed, grid, eval_every, eval_episodes)


def _train(reward, cfg, updates, meta_episodes, E, lam, seed, grid, eval_every, eval_episodes) -> dict:
    """The loop of :func:`train_agent` (same arguments; ``cfg`` is the :class:`AgentConfig`)."""
    algo = cfg.algo
    gen = seed_everything(seed)
    agent = ActorCritic(grid.obs_dim, 4, cfg.hidden)
    opt = torch.optim.Adam(agent.parameters(), lr=cfg.lr, eps=1e-5)
    m = max_coins_by_length(grid)
    update_fn = ppo_update if algo == "ppo" else a2c_update
    history = []
    for u in range(updates + 1):
        if u % eval_every == 0 or u == updates:
            history.append({"update": u, **evaluate(agent, grid, eval_episodes, gen)})
        if u == updates:
            break
        ep = collect_episodes(agent, grid, meta_episodes * E, gen)
        L = ep.lengths.reshape(meta_episodes, E)
        if reward == "default":
            w = np.ones_like(L, dtype=np.float64)
        else:
            w = drest_weights(L, m, lam, normalise=(reward == "drest"))
        rewards = ep.coin_rewards * torch.from_numpy(w.reshape(-1, 1)).float()
        adv, ret = gae_advantages(rewards, ep.values, ep.mask, cfg.gamma, cfg.gae_lambda)
        keep = ep.mask.bool()
        batch = Batch(ep.obs[keep], ep.actions[keep], ep.logp[keep], adv[keep], ret[keep])
        update_fn(agent, opt, batch, cfg, gen)
    final = evaluate(agent, grid, 4 * eval_episodes, gen)
    return {"reward": reward, "algo": algo, "seed": seed, "history": history, **final}


PPO_CONFIG = AgentConfig(algo="ppo", lr=2.5e-3, gae_lambda=0.95, epochs=4, minibatches=2)
A2C_CONFIG = AgentConfig(algo="a2c", lr=7e-4, gae_lambda=1.0, minibatches=4)
