"""Diagonal-Gaussian policies fitted by behaviour cloning (the frozen actors and the priors of the
steering chapter), and an uninformative random prior."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ..profiles import one_torch_thread



class GaussianMLP(nn.Module):
    """A diagonal-Gaussian policy head: ``obs -> (mean, log_std)``, with ``std`` kept in
    ``[min_std, max_std]`` (a variance floor, so that no expert can claim infinite precision).

    ========= ============= ===============================
    obs       ``(B, d_s)``   observations
    returns   ``(B, d_a)``   mean, and ``(B, d_a)`` log-std
    ========= ============= ===============================
    """

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...] = (64, 64),
                 min_std: float = 0.05, max_std: float = 2.0):
        super().__init__()
        if obs_dim < 1 or act_dim < 1 or not 0 < min_std < max_std:
            raise ValueError("obs_dim, act_dim >= 1 and 0 < min_std < max_std are required")
        layers, width = [], obs_dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.Tanh()]
            width = h
        self.body = nn.Sequential(*layers)
        self.mean = nn.Linear(width, act_dim)
        self.log_std = nn.Linear(width, act_dim)
        nn.init.zeros_(self.log_std.weight)   # start from a state-independent std
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.log_min, self.log_max = math.log(min_std), math.log(max_std)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if obs.ndim != 2 or obs.shape[1] != self.obs_dim:
            raise ValueError(f"obs must have shape (B, {self.obs_dim}), got {tuple(obs.shape)}")
        h = self.body(obs)
        log_std = self.log_min + (self.log_max - self.log_min) * torch.sigmoid(self.log_std(h))
        return self.mean(h), log_std

    @torch.no_grad()
    def predict(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """NumPy in, NumPy out: mean ``(B, d_a)`` and variance ``(B, d_a)`` in float64."""
        mu, log_std = self(torch.as_tensor(np.asarray(obs), dtype=torch.float32))
        return mu.double().numpy(), torch.exp(2 * log_std).double().numpy()


def gaussian_nll(mu: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of ``actions`` under ``N(mu, exp(log_std)^2)`` (summed over ``d_a``).

    ========= ============= ==============================
    mu        ``(B, d_a)``   means
    log_std   ``(B, d_a)``   log standard deviations
    actions   ``(B, d_a)``   targets
    returns   ``()``         scalar loss
    ========= ============= ==============================
    """
    if not (mu.shape == log_std.shape == actions.shape):
        raise ValueError(f"mu {tuple(mu.shape)}, log_std {tuple(log_std.shape)} and actions "
                         f"{tuple(actions.shape)} must have the same shape")
    z = (actions - mu) * torch.exp(-log_std)
    return (0.5 * z ** 2 + log_std + 0.5 * math.log(2 * math.pi)).sum(-1).mean()


def train_bc(observations: np.ndarray, actions: np.ndarray, steps: int, batch_size: int = 256, lr: float = 3e-3,
             hidden: tuple[int, ...] = (64, 64), seed: int = 0, min_std: float = 0.05) -> GaussianMLP:
    """Behaviour cloning: fit a :class:`GaussianMLP` to ``(observation, action)`` pairs by maximum
    likelihood with Adam. Returns the model in eval mode (the *frozen* actor or the prior).

    ============= ============= ==========================
    observations  ``(N, d_s)``   states of the data set
    actions       ``(N, d_a)``   actions of the data set
    ============= ============= ==========================
    """
    obs = torch.as_tensor(np.asarray(observations), dtype=torch.float32)
    act = torch.as_tensor(np.asarray(actions), dtype=torch.float32)
    if obs.ndim != 2 or act.ndim != 2 or len(obs) != len(act):
        raise ValueError(f"observations {tuple(obs.shape)} and actions {tuple(act.shape)} must be (N, d_s) and (N, d_a)")
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps}, {batch_size}")
    gen = torch.Generator().manual_seed(int(seed))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = GaussianMLP(obs.shape[1], act.shape[1], hidden, min_std=min_std)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    with one_torch_thread():
        for _ in range(steps):
            idx = torch.randint(len(obs), (min(batch_size, len(obs)),), generator=gen)
            loss = gaussian_nll(*model(obs[idx]), act[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return model.eval()


class RandomPrior:
    """An uninformative "prior": mean uniform in ``[-1, 1]^d`` drawn afresh on every call, variance
    ``std^2`` everywhere. :meth:`reset` re-seeds it so that rivals see the same draws.

    ======= ============= ==============================
    obs     ``(B, d_s)``   observations (only B is used)
    returns ``(B, d)``     mean, and ``(B, d)`` variance
    ======= ============= ==============================
    """

    def __init__(self, act_dim: int = 2, std: float = 1.0, seed: int = 0):
        if act_dim < 1 or std <= 0:
            raise ValueError("act_dim >= 1 and std > 0 are required")
        self.act_dim, self.std = act_dim, float(std)
        self.reset(seed)

    def reset(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def predict(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        b = np.asarray(obs).shape[0]
        return self.rng.uniform(-1, 1, size=(b, self.act_dim)), np.full((b, self.act_dim), self.std ** 2)
