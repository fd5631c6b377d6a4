"""Small actor-critic agents for discrete actions: PPO and A2C, in the style of CleanRL.

Episodes are stored padded to a common length ``T`` with a ``mask`` that is 1 on real steps, so a
batch of ``B`` episodes is a set of ``(B, T)`` tensors; an episode ends at its last masked-in step
and nothing is bootstrapped after it (finite-horizon episodes with the time in the observation).

* :func:`gae_advantages` computes generalised advantage estimates and returns on that layout;
* :func:`ppo_loss` is the clipped surrogate; :func:`ppo_update` runs epochs of minibatches;
* :func:`a2c_update` is the plain advantage actor-critic step (one pass, no ratio, no clipping).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical

from ..losses import compute_policy_loss


def _layer(n_in: int, n_out: int, std: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, std)
    nn.init.zeros_(layer.bias)
    return layer


class ActorCritic(nn.Module):
    """Separate two-layer tanh MLPs for the policy (logits) and the value.

    ======= ========== ===========================
    obs     ``(N,D)``   float observations
    logits  ``(N,A)``   action scores of the policy
    value   ``(N,)``    state-value estimate
    ======= ========== ===========================
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64):
        super().__init__()
        g = float(np.sqrt(2))
        self.actor = nn.Sequential(_layer(obs_dim, hidden, g), nn.Tanh(), _layer(hidden, hidden, g), nn.Tanh(),
                                   _layer(hidden, n_actions, 0.01))
        self.critic = nn.Sequential(_layer(obs_dim, hidden, g), nn.Tanh(), _layer(hidden, hidden, g), nn.Tanh(),
                                    _layer(hidden, 1, 1.0))

    def dist(self, obs: torch.Tensor) -> Categorical:
        return Categorical(logits=self.actor(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                   gamma: float = 1.0, lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation on padded episodes that end without bootstrapping.

    delta_t = r_t + gamma * V_{t+1} * mask_{t+1} - V_t,   A_t = delta_t + gamma * lam * mask_{t+1} * A_{t+1},
    and the return target is A_t + V_t. With ``lam = 1`` A_t is the Monte Carlo return minus V_t;
    with ``lam = 0`` it is the one-step TD error.

    ======= ========= ================================================
    rewards ``(B,T)`` reward of step t (0 on padding)
    values  ``(B,T)`` V(s_t) from the critic (ignored on padding)
    mask    ``(B,T)`` 1 on real steps; each row is ones then zeros
    returns           ``(B,T)``, ``(B,T)`` advantages and returns, 0 on padding
    ======= ========= ================================================
    """
    if not (rewards.shape == values.shape == mask.shape) or rewards.dim() != 2:
        raise ValueError(f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and mask "
                         f"{tuple(mask.shape)} must be equal (B, T) tensors")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must be in [0, 1], got {gamma}, {lam}")
    m = mask.float()
    if torch.any(m[:, 1:] > m[:, :-1]):
        raise ValueError("mask rows must be ones followed by zeros (no gaps)")
    B, T = rewards.shape
    adv = torch.zeros_like(rewards, dtype=torch.float32)
    next_adv = torch.zeros(B)
    next_value = torch.zeros(B)
    next_mask = torch.zeros(B)
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value * next_mask - values[:, t]
        next_adv = (delta + gamma * lam * next_mask * next_adv) * m[:, t]
        adv[:, t] = next_adv
        next_value, next_mask = values[:, t], m[:, t]
    return adv, (adv + values) * m


def ppo_loss(new_logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip: float) -> torch.Tensor:
    """The clipped surrogate, to minimise: -mean(min(rho A, clip(rho, 1-eps, 1+eps) A)).

    One row per step, so this is :func:`rlcourse.losses.compute_policy_loss` (the package's one PPO
    loss, log-ratio clamped to +-20) on ``(N, 1)`` tensors with every step counted (``token-mean``).

    ======== ======== ==================================
    new_logp ``(N,)`` log pi_theta(a|s), with gradient
    old_logp ``(N,)`` log pi_old(a|s) from the rollout
    adv      ``(N,)`` advantages
    returns  scalar   the policy loss
    ======== ======== ==================================
    """
    if not (new_logp.shape == old_logp.shape == adv.shape) or new_logp.dim() != 1:
        raise ValueError("new_logp, old_logp and adv must be equal 1-d tensors")
    loss, _ = compute_policy_loss(old_logp[:, None], new_logp[:, None], adv[:, None],
                                  torch.ones_like(adv)[:, None], clip_ratio_low=clip, clip_ratio_high=clip,
                                  loss_agg_mode="token-mean")
    return loss


@dataclass
class Batch:
    """Flattened real steps of a rollout (padding removed).

    ======= ========= ==========================
    obs     ``(N,D)`` observations
    actions ``(N,)``  actions taken
    logp    ``(N,)``  log pi_old(a|s) at sampling
    adv     ``(N,)``  advantages
    returns ``(N,)``  value targets
    ======= ========= ==========================
    """

    obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor
    adv: torch.Tensor
    returns: torch.Tensor


@dataclass(frozen=True)
class AgentConfig:
    """Hyper-parameters shared by PPO and A2C (CleanRL-like defaults for a tiny problem)."""

    algo: str = "ppo"          # "ppo" or "a2c"
    lr: float = 2.5e-3
    gamma: float = 1.0
    gae_lambda: float = 0.95   # A2C uses 1.0 (Monte Carlo return minus value)
    clip: float = 0.2
    epochs: int = 4
    minibatches: int = 4
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    hidden: int = 64

    def __post_init__(self):
        if self.algo not in ("ppo", "a2c"):
            raise ValueError(f"algo must be 'ppo' or 'a2c', got {self.algo!r}")


def _step(agent: ActorCritic, opt: torch.optim.Optimizer, mb: Batch, cfg: AgentConfig, normalise: bool) -> dict:
    dist = agent.dist(mb.obs)
    new_logp = dist.log_prob(mb.actions)
    adv = mb.adv
    if normalise and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    if cfg.algo == "ppo":
        pg = ppo_loss(new_logp, mb.logp, adv, cfg.clip)
    else:
        pg = -(new_logp * adv).mean()
    v_loss = 0.5 * ((agent.value(mb.obs) - mb.returns) ** 2).mean()
    entropy = dist.entropy().mean()
    loss = pg + cfg.vf_coef * v_loss - cfg.ent_coef * entropy
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
    opt.step()
    return {"pg_loss": pg.item(), "v_loss": v_loss.item(), "entropy": entropy.item()}


def ppo_update(agent: ActorCritic, opt: torch.optim.Optimizer, batch: Batch, cfg: AgentConfig,
               generator: torch.Generator | None = None) -> dict:
    """PPO: ``epochs`` passes over the batch in ``minibatches`` shuffled minibatches, clipped
    surrogate, per-minibatch advantage normalisation, value loss and entropy bonus."""
    n = batch.obs.shape[0]
    size = max(1, n // cfg.minibatches)
    stats = {}
    for _ in range(cfg.epochs):
        perm = torch.randperm(n, generator=generator)
        for start in range(0, n, size):
            idx = perm[start:start + size]
            stats = _step(agent, opt, Batch(*(x[idx] for x in (batch.obs, batch.actions, batch.logp, batch.adv,
                                                              batch.returns))), cfg, normalise=True)
    return stats


def a2c_update(agent: ActorCritic, opt: torch.optim.Optimizer, batch: Batch, cfg: AgentConfig,
               generator: torch.Generator | None = None) -> dict:
    """A2C: one pass over the batch in ``minibatches`` minibatches of the loss
    -log pi(a|s) A + vf_coef (V - G)^2 / 2 - ent_coef H; on-policy, no ratio, no clipping."""
    n = batch.obs.shape[0]
    size = max(1, n // cfg.minibatches)
    perm = torch.randperm(n, generator=generator)
    stats = {}
    for start in range(0, n, size):
        idx = perm[start:start + size]
        stats = _step(agent, opt, Batch(*(x[idx] for x in (batch.obs, batch.actions, batch.logp, batch.adv,
                                                          batch.returns))), cfg, normalise=True)
    return stats
