"""A small flow-matching model shared by the generative chapters: velocity field, training, samplers.

Convention: time runs from ``t = 0`` (Gaussian noise ``x0``) to ``t = 1`` (data ``x1``) along the
linear path ``x_t = (1 - t) x0 + t x1``, whose conditional velocity is ``x1 - x0``. The deterministic
sampler integrates ``dx/dt = v(x, t)`` with Euler steps; the stochastic sampler takes Euler-Maruyama
steps of an SDE with the same marginals (the score is read off the velocity), so that each step is a
Gaussian "action" with a log-probability, as a per-step policy gradient needs.

Data: an 8-Gaussian ring in 2-D, and scikit-learn's bundled 8x8 digits as 64-dim vectors in [-1, 1].
Pre-trained models are cached under :func:`rlcourse.cache_dir` (a file named by a hash of the recipe).
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn

from ..profiles import Profile, cache_dir, one_torch_thread, profile as current_profile


# ----------------------------------------------------------------------------------------------
# checks
# ----------------------------------------------------------------------------------------------
def _check_points(x: torch.Tensor, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (B, D), got {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf")


def _check_times(t: torch.Tensor, batch: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t must be a torch.Tensor, got {type(t).__name__}")
    if t.shape != (batch,):
        raise ValueError(f"t must have shape ({batch},), one time per row, got {tuple(t.shape)}")
    if (t < 0).any() or (t > 1).any():
        raise ValueError("t must lie in [0, 1]")


# ----------------------------------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------------------------------
def time_features(t: torch.Tensor, n_freq: int = 8) -> torch.Tensor:
    """Fourier features of the time, so that a small MLP can resolve fast changes in ``t``.

    ======= ================ ==============================================
    t       ``(B,)``         times in [0, 1]
    returns ``(B, 2F + 1)``  ``[t, sin(pi 2^k t), cos(pi 2^k t)]``, k < F
    ======= ================ ==============================================
    """
    freqs = math.pi * 2.0 ** torch.arange(n_freq, dtype=t.dtype)
    ang = t[:, None] * freqs[None, :]
    return torch.cat([t[:, None], torch.sin(ang), torch.cos(ang)], dim=1)


class VelocityMLP(nn.Module):
    """An MLP velocity field ``v_theta(x, t, c)`` with optional conditioning ``c``.

    The conditioning is added to every hidden layer through its own weight matrices, initialised to zero:
    a model pre-trained without conditioning ignores ``c`` exactly until fine-tuning moves those
    weights (the "near-identity" initialisation of conditioning branches).

    ======= ============ ==========================================
    x       ``(B, D)``   points
    t       ``(B,)``     times in [0, 1]
    cond    ``(B, C)``   conditioning (``None`` means zeros)
    returns ``(B, D)``   velocity
    ======= ============ ==========================================
    """

    def __init__(self, dim: int, hidden: int = 128, layers: int = 3, cond_dim: int = 0, n_freq: int = 8):
        super().__init__()
        if dim < 1 or hidden < 1 or layers < 1 or cond_dim < 0:
            raise ValueError(f"bad sizes: dim={dim}, hidden={hidden}, layers={layers}, cond_dim={cond_dim}")
        self.dim, self.cond_dim, self.n_freq = dim, cond_dim, n_freq
        self.inp = nn.Linear(dim + 2 * n_freq + 1, hidden)
        self.hidden = nn.ModuleList([nn.Linear(hidden, hidden) for _ in range(layers - 1)])
        self.out = nn.Linear(hidden, dim)
        # one zero-initialised conditioning projection per hidden layer (additive modulation)
        self.cond = (nn.ModuleList([nn.Linear(cond_dim, hidden, bias=False) for _ in range(layers)])
                     if cond_dim else None)
        if self.cond is not None:
            for lin in self.cond:
                nn.init.zeros_(lin.weight)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must have shape (B, {self.dim}), got {tuple(x.shape)}")
        if t.shape != (x.shape[0],):
            raise ValueError(f"t must have shape ({x.shape[0]},), got {tuple(t.shape)}")
        if cond is not None:
            if self.cond is None:
                raise ValueError("this model was built with cond_dim=0 but received a conditioning tensor")
            if cond.shape != (x.shape[0], self.cond_dim):
                raise ValueError(f"cond must have shape ({x.shape[0]}, {self.cond_dim}), got {tuple(cond.shape)}")
        h = self.inp(torch.cat([x, time_features(t, self.n_freq)], dim=1))
        for i, layer in enumerate([None, *self.hidden]):
            if layer is not None:
                h = layer(torch.nn.functional.silu(h))
            if cond is not None:
                h = h + self.cond[i](cond)
        return self.out(torch.nn.functional.silu(h))


# ----------------------------------------------------------------------------------------------
# flow matching
# ----------------------------------------------------------------------------------------------
def linear_path(x0: torch.Tensor, x1: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The point on the straight path from noise to data and its (conditional) velocity.

    ======= ========== =================================================
    x0      ``(B, D)`` noise, N(0, I)
    x1      ``(B, D)`` data
    t       ``(B,)``   times in [0, 1]
    returns            ``x_t = (1 - t) x0 + t x1`` ``(B, D)``, ``u = x1 - x0`` ``(B, D)``
    ======= ========== =================================================
    """
    _check_points(x0, "x0")
    _check_points(x1, "x1")
    if x0.shape != x1.shape:
        raise ValueError(f"x0 {tuple(x0.shape)} and x1 {tuple(x1.shape)} differ")
    _check_times(t, x0.shape[0])
    tt = t[:, None]
    return (1 - tt) * x0 + tt * x1, x1 - x0


def gaussian_velocity(x: torch.Tensor, t: torch.Tensor, mu: torch.Tensor, s: float) -> torch.Tensor:
    """The exact marginal velocity ``E[x1 - x0 | x_t = x]`` when the data are ``N(mu, s^2 I)``.

    With ``x_t ~ N(t mu, ((1-t)^2 + t^2 s^2) I)`` and ``Cov(x1 - x0, x_t) = (t s^2 - (1 - t)) I``,
    ``v*(x, t) = mu + (t s^2 - (1 - t)) / ((1 - t)^2 + t^2 s^2) * (x - t mu)``.

    ======= ========== ====================================
    x       ``(B, D)`` points
    t       ``(B,)``   times
    mu      ``(D,)``   data mean
    s       scalar     data standard deviation (> 0)
    returns ``(B, D)`` optimal velocity
    ======= ========== ====================================
    """
    _check_points(x)
    _check_times(t, x.shape[0])
    if mu.shape != (x.shape[1],):
        raise ValueError(f"mu must have shape ({x.shape[1]},), got {tuple(mu.shape)}")
    if s <= 0:
        raise ValueError(f"s must be positive, got {s}")
    tt = t[:, None]
    var = (1 - tt) ** 2 + tt**2 * s**2
    return mu + (tt * s**2 - (1 - tt)) / var * (x - tt * mu)


def score_from_velocity(x: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The score ``grad log p_t(x)`` implied by the marginal velocity on the linear path.

    From ``x = E[x0|x] + t v`` and Tweedie, ``score = -E[x0|x] / (1 - t) = (t v - x) / (1 - t)``.

    ======= ========== ======================================
    x, v    ``(B, D)`` point and marginal velocity there
    t       ``(B,)``   times in [0, 1)
    returns ``(B, D)`` score
    ======= ========== ======================================
    """
    _check_times(t, x.shape[0])
    if (t >= 1).any():
        raise ValueError("the score is undefined at t = 1 (no noise left)")
    tt = t[:, None]
    return (tt * v - x) / (1 - tt)


def flow_matching_loss(model: VelocityMLP, x1: torch.Tensor, cond: torch.Tensor | None = None,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """Conditional flow-matching loss ``E ||v_theta(x_t, t) - (x1 - x0)||^2`` (mean over batch and dims).

    ======= ========== ==========================================
    x1      ``(B, D)`` data (or generated samples)
    cond    ``(B, C)`` optional conditioning
    returns scalar     loss
    ======= ========== ==========================================
    """
    x0 = torch.randn(x1.shape, generator=generator)
    t = torch.rand(x1.shape[0], generator=generator)
    xt, u = linear_path(x0, x1, t)
    return ((model(xt, t, cond) - u) ** 2).mean()


# ----------------------------------------------------------------------------------------------
# samplers
# ----------------------------------------------------------------------------------------------
def euler_integrate(field, x0: torch.Tensor, steps: int, t0: float = 0.0, t1: float = 1.0) -> torch.Tensor:
    """Euler's method for ``dx/dt = field(x, t)`` on a uniform grid of ``steps`` steps.

    ======= ========== =================================================
    field   callable   ``(x (B, D), t (B,)) -> (B, D)``
    x0      ``(B, D)`` start at time ``t0``
    returns ``(B, D)`` the Euler estimate of ``x(t1)``
    ======= ========== =================================================
    """
    _check_points(x0, "x0")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    h = (t1 - t0) / steps
    x = x0
    for k in range(steps):
        t = torch.full((x.shape[0],), t0 + k * h, dtype=x.dtype)
        x = x + h * field(x, t)
    return x


@torch.no_grad()
def sample_ode(model: VelocityMLP, x0: torch.Tensor, steps: int, cond: torch.Tensor | None = None) -> torch.Tensor:
    """Deterministic samples: Euler integration of the model's velocity from noise ``x0``.

    ======= ========== ==============================
    x0      ``(B, D)`` initial noise
    cond    ``(B, C)`` optional conditioning
    returns ``(B, D)`` samples at t = 1
    ======= ========== ==============================
    """
    return euler_integrate(lambda x, t: model(x, t, cond), x0, steps)


def sde_step_moments(v: torch.Tensor, x: torch.Tensor, t: torch.Tensor, h: float, noise: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation of one Euler-Maruyama step of the marginal-preserving SDE

    ``dx = [v + (g^2 / 2) score] dt + g dW`` with ``g(t) = a sqrt(1 - t)``, ``score = (t v - x)/(1 - t)``,
    so the drift is ``v + (a^2 / 2)(t v - x)`` (finite at every t) and the step's std is
    ``a sqrt((1 - t) h)``. With ``a = 0`` it is the Euler ODE step.

    ======= ========== ==========================================
    v, x    ``(B, D)`` velocity at x and the current point
    t       ``(B,)``   current time
    h       scalar     step size (> 0)
    noise   scalar     ``a >= 0``
    returns            mean ``(B, D)``, std ``(B, 1)``
    ======= ========== ==========================================
    """
    if noise < 0 or h <= 0:
        raise ValueError(f"need noise >= 0 and h > 0, got noise={noise}, h={h}")
    tt = t[:, None]
    mean = x + h * (v + 0.5 * noise**2 * (tt * v - x))
    std = noise * torch.sqrt((1 - tt) * h)
    return mean, std


def gaussian_step_logprob(x_next: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Log-density of one Gaussian sampler step, summed over dimensions (the per-step "action" log-prob).

    ``log N(x_next; mean, std^2 I) = -||x_next - mean||^2 / (2 std^2) - D log std - (D/2) log 2 pi``.

    ======= ========== ==========================================
    x_next  ``(B, D)`` the point the step moved to
    mean    ``(B, D)`` the step's mean
    std     ``(B, 1)`` the step's standard deviation (> 0)
    returns ``(B,)``   log-probabilities
    ======= ========== ==========================================
    """
    if x_next.shape != mean.shape:
        raise ValueError(f"x_next {tuple(x_next.shape)} and mean {tuple(mean.shape)} differ")
    if std.shape != (mean.shape[0], 1):
        raise ValueError(f"std must have shape ({mean.shape[0]}, 1), got {tuple(std.shape)}")
    if (std <= 0).any():
        raise ValueError("std must be positive for a log-density")
    D = mean.shape[1]
    return (-0.5 * ((x_next - mean) / std) ** 2).sum(1) - D * torch.log(std[:, 0]) - 0.5 * D * math.log(2 * math.pi)


class Trajectory(NamedTuple):
    """A recorded stochastic sampling run (K steps).

    ===== ============= ===========================================
    xs    ``(K+1,B,D)`` the points, ``xs[0]`` noise, ``xs[K]`` samples
    ts    ``(K,)``      the time of each step
    vs    ``(K,B,D)``   the model's velocity at each step (v_ref)
    logp  ``(K,B)``     log-prob of each step under the sampler
    ===== ============= ===========================================
    """
    xs: torch.Tensor
    ts: torch.Tensor
    vs: torch.Tensor
    logp: torch.Tensor


@torch.no_grad()
def sample_sde(model: VelocityMLP, x0: torch.Tensor, steps: int, noise: float, cond: torch.Tensor | None = None,
               generator: torch.Generator | None = None) -> Trajectory:
    """Stochastic samples from noise ``x0``, recording every step (see :func:`sde_step_moments`).

    ======= ========== ==========================================
    x0      ``(B, D)`` initial noise
    cond    ``(B, C)`` optional conditioning
    returns            a :class:`Trajectory`
    ======= ========== ==========================================
    """
    _check_points(x0, "x0")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    h = 1.0 / steps
    xs, vs, lps = [x0], [], []
    x = x0
    ts = torch.arange(steps, dtype=x0.dtype) * h
    for k in range(steps):
        t = ts[k].expand(x.shape[0])
        v = model(x, t, cond)
        mean, std = sde_step_moments(v, x, t, h, noise)
        if noise > 0:
            x = mean + std * torch.randn(x.shape, generator=generator)
            lps.append(gaussian_step_logprob(x, mean, std))
        else:
            x = mean
            lps.append(torch.zeros(x.shape[0]))
        xs.append(x)
        vs.append(v)
    return Trajectory(torch.stack(xs), ts, torch.stack(vs), torch.stack(lps))


# ----------------------------------------------------------------------------------------------
# data and pre-trained models
# ----------------------------------------------------------------------------------------------
RING_MODES = 8
RING_RADIUS = 2.0
RING_STD = 0.15


def ring_centres(modes: int = RING_MODES, radius: float = RING_RADIUS) -> torch.Tensor:
    """The centres of the ring's Gaussians, ``(modes, 2)``, the first on the positive x-axis."""
    ang = torch.arange(modes) * (2 * math.pi / modes)
    return radius * torch.stack([torch.cos(ang), torch.sin(ang)], dim=1)


def ring_data(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``n`` points from the 8-Gaussian ring (radius 2, std 0.15), ``(n, 2)``."""
    c = ring_centres()
    idx = torch.randint(len(c), (n,), generator=generator)
    return c[idx] + RING_STD * torch.randn((n, 2), generator=generator)


@functools.lru_cache(maxsize=1)
def digits_data() -> tuple[torch.Tensor, np.ndarray]:
    """scikit-learn's bundled 8x8 digits as ``(1797, 64)`` float32 in [-1, 1], and their labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.data / 8.0 - 1.0, dtype=torch.float32), d.target


class DigitsClassifier:
    """Multinomial logistic regression on 8x8 digits (inputs in [-1, 1]), fitted with L-BFGS in torch.

    ``predict_proba`` takes a ``(B, 64)`` numpy array and returns ``(B, 10)`` class probabilities, like
    scikit-learn's estimator of the same name (a torch fit avoids BLAS thread contention on busy CPUs).
    """

    def __init__(self, l2: float = 1e-3, iters: int = 100, seed: int = 0):
        X, y = digits_data()
        with one_torch_thread(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            W = torch.zeros(64, 10, dtype=torch.float64, requires_grad=True)
            b = torch.zeros(10, dtype=torch.float64, requires_grad=True)
            Xd, yt = X.double(), torch.as_tensor(y)
            opt = torch.optim.LBFGS([W, b], max_iter=iters, line_search_fn="strong_wolfe")

            def closure():
                opt.zero_grad()
                loss = nn.functional.cross_entropy(Xd @ W + b, yt) + l2 * (W**2).sum()
                loss.backward()
                return loss

            opt.step(closure)
        self.W, self.b = W.detach(), b.detach()
        self.train_accuracy = float(((Xd @ self.W + self.b).argmax(1) == yt).double().mean())

    def predict_proba(self, x) -> np.ndarray:
        x = torch.as_tensor(np.asarray(x), dtype=torch.float64)
        if x.ndim != 2 or x.shape[1] != 64:
            raise ValueError(f"expected (B, 64) digit vectors, got {tuple(x.shape)}")
        return torch.softmax(x @ self.W + self.b, dim=1).numpy()


@functools.lru_cache(maxsize=1)
def digits_classifier() -> DigitsClassifier:
    """The frozen, non-differentiable-by-contract reward model of the digits experiments: a
    :class:`DigitsClassifier` fitted once per process on all 1797 digits."""
    return DigitsClassifier()


@dataclass(frozen=True)
class FlowRecipe:
    """Everything that determines a pre-trained flow model (its cache key)."""
    data: str
    hidden: int
    layers: int
    cond_dim: int
    steps: int
    batch: int
    lr: float
    seed: int = 0
    version: int = 2  # bump when the architecture or the training code changes


def flow_recipe(data: str, prof: Profile | None = None, cond_dim: int = 1, seed: int = 0) -> FlowRecipe:
    """The profile's pre-training recipe for ``data`` in {"ring", "digits"}."""
    prof = prof or current_profile()
    if data == "ring":
        return FlowRecipe("ring", hidden=prof.pick(64, 128, 256), layers=3, cond_dim=cond_dim,
                          steps=prof.pick(300, 3000, 10000), batch=256, lr=2e-3, seed=seed)
    if data == "digits":
        return FlowRecipe("digits", hidden=prof.pick(128, 256, 512), layers=3, cond_dim=cond_dim,
                          steps=prof.pick(200, 2500, 10000), batch=128, lr=1e-3, seed=seed)
    raise ValueError(f"unknown data {data!r}; choose 'ring' or 'digits'")


def pretrain_flow(recipe: FlowRecipe) -> tuple[VelocityMLP, list[float]]:
    """Train a :class:`VelocityMLP` by flow matching on the recipe's data (Adam, cosine decay).

    Returns the model and the loss every 50 steps.
    """
    gen = torch.Generator().manual_seed(recipe.seed)
    if recipe.data == "ring":
        dim, data = 2, None
    elif recipe.data == "digits":
        data, _ = digits_data()
        dim = 64
    else:
        raise ValueError(f"unknown data {recipe.data!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed)
        model = VelocityMLP(dim, recipe.hidden, recipe.layers, recipe.cond_dim)
    opt = torch.optim.Adam(model.parameters(), lr=recipe.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, recipe.steps)
    losses = []
    for step in range(recipe.steps):
        if data is None:
            x1 = ring_data(recipe.batch, gen)
        else:
            x1 = data[torch.randint(len(data), (recipe.batch,), generator=gen)]
        loss = flow_matching_loss(model, x1, generator=gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0:
            losses.append(float(loss.detach()))
    return model.eval(), losses


def load_flow(data: str, prof: Profile | None = None, cond_dim: int = 1, seed: int = 0
              ) -> tuple[VelocityMLP, dict]:
    """The pre-trained flow model for ``data`` ("ring" or "digits"), built once and cached on disk.

    Returns the model and an info dict (recipe, pre-training seconds, loss curve, cache path).
    """
    recipe = flow_recipe(data, prof, cond_dim, seed)
    digest = hashlib.sha1(json.dumps(asdict(recipe), sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / "flows" / f"{recipe.data}-{digest}.pt"
    model = VelocityMLP(2 if data == "ring" else 64, recipe.hidden, recipe.layers, recipe.cond_dim)
    if path.exists():
        blob = torch.load(path, weights_only=True)  # tensors and plain data: nothing to unpickle
        model.load_state_dict(blob["state"])
        return model.eval(), blob["info"]
    t0 = time.perf_counter()
    with one_torch_thread():
        model, losses = pretrain_flow(recipe)
    info = {"recipe": asdict(recipe), "seconds": time.perf_counter() - t0, "losses": losses, "path": str(path)}
    path.parent.mkdir(parents=True, exist_ok=True)
    # one temporary file per process: two workers that build the same model at once (a study's cells on
    # loky) must not rename each other's file away; the last rename wins, with an identical model
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    torch.save({"state": model.state_dict(), "info": info}, tmp)
    tmp.replace(path)
    return model, info
