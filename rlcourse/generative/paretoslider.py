"""ParetoSlider: one preference-conditioned flow model for a whole Pareto front.

Paper: *ParetoSlider: Diffusion Models Post-Training for Continuous Reward Control*, Golan,
Finkelson, Bereslavsky, Nitzan, Patashnik (2026), arXiv:2604.20816. The model is conditioned on a
preference vector ``omega`` on the simplex, drawn afresh for every group during RL; the rewards are
normalised per objective inside the group and only then combined with ``omega`` ("late
scalarisation"); the policy loss is DiffusionNFT's forward-process loss.

Here are the method's parts, the two tasks' rewards and the evaluation of a front; the chapter's
experiment, which fine-tunes the cached flow models of :mod:`rlcourse.generative.flow` on two conflicting
rewards in 2-D and on 8x8 digits, is :mod:`rlcourse.studies.paretoslider`.
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from ..ops import group_stats
from .flow import VelocityMLP, linear_path, sample_ode


# ----------------------------------------------------------------------------------------------
# preferences and advantages
# ----------------------------------------------------------------------------------------------
def sample_preferences(n: int, num_objectives: int, generator: torch.Generator | None = None,
                       min_weight: float = 0.0) -> torch.Tensor:
    """Preference vectors on the simplex, as the authors' sampler draws them.

    Two objectives: ``omega_1 ~ U(0, 1)`` (that is Dir(1, 1)), clipped to ``[m, 1 - m]``. Three or
    more: 50% vertices (one-hot), 35% edges (a random pair with Dir(1, 1) weights), 15% interior
    (Dir(1, ..., 1)).

    ========== ========== ========================================
    n          int        number of vectors
    returns    ``(n, R)`` non-negative rows that sum to 1
    ========== ========== ========================================
    """
    if n < 1 or num_objectives < 2:
        raise ValueError(f"need n >= 1 and at least 2 objectives, got n={n}, R={num_objectives}")
    if not 0 <= min_weight < 0.5:
        raise ValueError(f"min_weight must be in [0, 0.5), got {min_weight}")
    R = num_objectives
    if R == 2:
        w1 = torch.rand(n, generator=generator).clamp(min_weight, 1 - min_weight)
        return torch.stack([w1, 1 - w1], dim=1)
    kind = torch.rand(n, generator=generator)
    out = torch.zeros(n, R)
    # Dir(1,...,1) = normalised Exp(1) draws
    e = -torch.log(torch.rand(n, R, generator=generator).clamp_min(1e-12))
    interior = e / e.sum(1, keepdim=True)
    first = torch.randint(R, (n,), generator=generator)
    second = (first + torch.randint(1, R, (n,), generator=generator)) % R
    u = torch.rand(n, generator=generator)
    rows = torch.arange(n)
    vertex = kind < 0.5
    edge = (kind >= 0.5) & (kind < 0.85)
    out[rows[vertex], first[vertex]] = 1.0
    out[rows[edge], first[edge]] = u[edge]
    out[rows[edge], second[edge]] = 1 - u[edge]
    inner = kind >= 0.85
    out[inner] = interior[inner]
    return out


def preference_features(weights: torch.Tensor) -> torch.Tensor:
    """The conditioning the model sees for two objectives: ``2 omega_1 - 1`` in [-1, 1], centred so
    that the slider's input carries no common offset.

    ======= ========== ===================================
    weights ``(B, 2)`` preference vectors (rows sum to 1)
    returns ``(B, 1)`` conditioning
    ======= ========== ===================================
    """
    if weights.ndim != 2 or weights.shape[1] != 2:
        raise ValueError(f"weights must have shape (B, 2), got {tuple(weights.shape)}")
    return 2 * weights[:, :1] - 1


def _group_stats(x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row mean and population std of the row's group, for each column of ``x`` ``(B, R)``
    (:func:`rlcourse.ops.group_stats` with ``unbiased=False``: ParetoSlider normalises with the
    population std)."""
    _, mean, std = group_stats(x, index, min_size=2, unbiased=False)
    return mean, std


def _check_rewards(rewards: torch.Tensor, weights: torch.Tensor, index: torch.Tensor) -> None:
    if rewards.ndim != 2:
        raise ValueError(f"rewards must have shape (B, R), got {tuple(rewards.shape)}")
    if weights.shape != rewards.shape:
        raise ValueError(f"weights {tuple(weights.shape)} must match rewards {tuple(rewards.shape)}")
    if index.shape != (rewards.shape[0],):
        raise ValueError(f"index must have shape ({rewards.shape[0]},), got {tuple(index.shape)}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf")
    if (weights < 0).any() or not torch.allclose(weights.sum(1), torch.ones(len(weights), dtype=weights.dtype),
                                                  atol=1e-5):
        raise ValueError("each row of weights must be non-negative and sum to 1")
    for g in torch.unique(index):
        w = weights[index == g]
        if not torch.allclose(w, w[:1].expand_as(w)):
            raise ValueError(f"group {int(g)} mixes preference vectors; a group must share omega")


def late_scalarised_advantages(rewards: torch.Tensor, weights: torch.Tensor, index: torch.Tensor,
                               objective_scale: torch.Tensor | None = None, eps: float = 1e-4,
                               batch_norm: bool = True) -> torch.Tensor:
    """Per-objective group normalisation, then the preference-weighted sum ("late scalarisation").

    ``A~_ij = (r_ij - mean_g r_.j) / (std_g r_.j + eps)``, ``A_i = sum_j omega_ij c_j A~_ij``, then
    (optionally) ``A^ = (A - mean_batch A) / (std_batch A + eps)``. Standard deviations are population ones.

    =============== ========== ===========================================
    rewards         ``(B, R)`` reward j of sample i
    weights         ``(B, R)`` omega of sample i's group (rows sum to 1)
    index           ``(B,)``   group id (samples that share a prompt and omega)
    objective_scale ``(R,)``   global objective weights c_j (default ones)
    returns         ``(B,)``   advantages
    =============== ========== ===========================================
    """
    _check_rewards(rewards, weights, index)
    c = torch.ones(rewards.shape[1]) if objective_scale is None else objective_scale
    if c.shape != (rewards.shape[1],):
        raise ValueError(f"objective_scale must have shape ({rewards.shape[1]},), got {tuple(c.shape)}")
    mean, std = _group_stats(rewards, index)
    a = ((rewards - mean) / (std + eps) * weights * c).sum(1)
    if batch_norm:
        a = (a - a.mean()) / (a.std(unbiased=False) + eps)
    return a


def early_scalarised_advantages(rewards: torch.Tensor, weights: torch.Tensor, index: torch.Tensor,
                                eps: float = 1e-4, batch_norm: bool = True) -> torch.Tensor:
    """The baseline: combine the raw rewards first, ``r_i = sum_j omega_ij r_ij``, then group z-score.

    Shapes as in :func:`late_scalarised_advantages`.
    """
    _check_rewards(rewards, weights, index)
    r = (rewards * weights).sum(1, keepdim=True)
    mean, std = _group_stats(r, index)
    a = ((r - mean) / (std + eps))[:, 0]
    if batch_norm:
        a = (a - a.mean()) / (a.std(unbiased=False) + eps)
    return a


# ----------------------------------------------------------------------------------------------
# the DiffusionNFT policy loss
# ----------------------------------------------------------------------------------------------
def nft_loss(model: VelocityMLP, old_model: VelocityMLP, x1: torch.Tensor, adv: torch.Tensor,
             cond: torch.Tensor | None = None, beta: float = 1.0, adv_clip: float = 2.0,
             generator: torch.Generator | None = None, ref_model: VelocityMLP | None = None,
             kl: float = 0.0) -> torch.Tensor:
    """DiffusionNFT's forward-process loss on generated samples, written for velocities.

    ``r = 1/2 + 1/2 clip(A / A_max, -1, 1)``, ``v+ = (1 - beta) v_old + beta v_theta``,
    ``v- = (1 + beta) v_old - beta v_theta``, and
    ``L = mean[ r ||v+ - u||^2 + (1 - r) ||v- - u||^2 ] / beta`` on fresh points ``x_t`` of the
    straight path from new noise to each sample (``u = x1 - x0``). Its minimiser is
    ``v_theta = v_old + E[(2r - 1)(u - v_old) | x_t] / beta``. With ``kl > 0`` the velocity-space
    KL surrogate ``kl * mean ||v_theta - v_ref||^2`` to a frozen ``ref_model`` is added.

    ========== ========== ================================================
    x1         ``(B, D)`` samples generated by the old model
    adv        ``(B,)``   their advantages
    cond       ``(B, C)`` the conditioning they were generated with
    returns    scalar     loss
    ========== ========== ================================================
    """
    if adv.shape != (x1.shape[0],):
        raise ValueError(f"adv must have shape ({x1.shape[0]},), got {tuple(adv.shape)}")
    if beta <= 0 or adv_clip <= 0:
        raise ValueError(f"beta and adv_clip must be positive, got {beta}, {adv_clip}")
    x0 = torch.randn(x1.shape, generator=generator)
    t = torch.rand(x1.shape[0], generator=generator)
    xt, u = linear_path(x0, x1, t)
    r = (0.5 + 0.5 * (adv / adv_clip).clamp(-1, 1))[:, None]
    v = model(xt, t, cond)
    with torch.no_grad():
        v_old = old_model(xt, t, cond)
    v_pos = (1 - beta) * v_old + beta * v
    v_neg = (1 + beta) * v_old - beta * v
    per = r * (v_pos - u) ** 2 + (1 - r) * (v_neg - u) ** 2
    loss = per.mean() / beta
    if kl > 0:
        if ref_model is None:
            raise ValueError("kl > 0 needs a ref_model")
        with torch.no_grad():
            v_ref = ref_model(xt, t, cond)
        loss = loss + kl * ((v - v_ref) ** 2).mean()
    return loss


def nft_optimum(u: torch.Tensor, v_old: torch.Tensor, r: torch.Tensor, beta: float) -> torch.Tensor:
    """The velocity that minimises the NFT loss at one point ``x_t`` given samples through it.

    ======= ========== ===============================================
    u       ``(N, D)`` conditional velocities of N samples through x_t
    v_old   ``(D,)``   the old model's velocity at x_t
    r       ``(N,)``   their optimality probabilities in [0, 1]
    returns ``(D,)``   ``v_old + mean_i[(2 r_i - 1)(u_i - v_old)] / beta``
    ======= ========== ===============================================
    """
    if u.ndim != 2 or v_old.shape != (u.shape[1],) or r.shape != (u.shape[0],):
        raise ValueError(f"shapes u {tuple(u.shape)}, v_old {tuple(v_old.shape)}, r {tuple(r.shape)} disagree")
    return v_old + ((2 * r - 1)[:, None] * (u - v_old)).mean(0) / beta


# ----------------------------------------------------------------------------------------------
# fronts
# ----------------------------------------------------------------------------------------------
def hypervolume_2d(points: np.ndarray, ref: tuple[float, float]) -> float:
    """Area dominated by ``points`` (maximisation) and bounded below by ``ref``.

    ======= ========== =====================================
    points  ``(N, 2)`` objective values (J1, J2)
    ref     ``(2,)``   reference point, worse in both
    returns float      the hypervolume
    ======= ========== =====================================
    """
    p = np.asarray(points, dtype=float)
    if p.ndim != 2 or p.shape[1] != 2:
        raise ValueError(f"points must have shape (N, 2), got {p.shape}")
    p = p[(p[:, 0] > ref[0]) & (p[:, 1] > ref[1])]
    if len(p) == 0:
        return 0.0
    p = p[np.argsort(-p[:, 0])]
    area, best_y = 0.0, ref[1]
    for x, y in p:  # sweep from the largest J1; each point adds the strip above the best J2 so far
        if y > best_y:
            area += (x - ref[0]) * (y - best_y)
            best_y = y
    return float(area)


# ----------------------------------------------------------------------------------------------
# the experiment's rewards, training loop and evaluation
# ----------------------------------------------------------------------------------------------
REWARD2_SCALE = 4.0  # the 2-D task's second reward model reports in different units


def ring_objectives(x: torch.Tensor) -> torch.Tensor:
    """The 2-D task's objectives in natural units: ``(cos theta, sin theta)`` of each point's angle, ``(B, 2)``.

    Both are bounded and ignore the radius, so they ask "which direction", never "how far out".
    """
    theta = torch.atan2(x[:, 1], x[:, 0])
    return torch.stack([torch.cos(theta), torch.sin(theta)], dim=1)


def ring_rewards(x: torch.Tensor) -> torch.Tensor:
    """The two conflicting rewards the RL sees: ``r1 = cos theta`` (point right) and
    ``r2 = 4 sin theta`` (point up, from a reward model on another scale), ``(B, 2)``."""
    return ring_objectives(x) * torch.tensor([1.0, REWARD2_SCALE])


def digits_rewards(clf, x: torch.Tensor, classes: tuple[int, int] = (0, 1)) -> torch.Tensor:
    """Two conflicting rewards for digits: the classifier's probabilities of two classes, ``(B, 2)``."""
    p = clf.predict_proba(x.detach().clamp(-1, 1).numpy())
    return torch.tensor(p[:, list(classes)], dtype=torch.float32)


def train_slider(model: VelocityMLP, reward_fn, iters: int, groups: int, group_size: int, lr: float,
                 fixed_omega: float | None = None, scalarisation: str = "late", inner_steps: int = 2,
                 beta: float = 1.0, ode_steps: int = 10, seed: int = 0, min_weight: float = 0.0,
                 kl: float = 1.0, reps: int = 4) -> dict:
    """RL fine-tuning with the NFT loss: a preference-conditioned model (``fixed_omega=None``, omega
    drawn per group) or a fixed-trade-off model (every group uses ``(fixed_omega, 1 - fixed_omega)``).

    Each iteration: draw omega per group, sample ``group_size`` points per group with the ODE sampler,
    score both rewards, compute advantages (``scalarisation`` "late" or "early"), and take
    ``inner_steps`` Adam steps on :func:`nft_loss` against a snapshot of the model, each on ``reps``
    noisy copies of every sample (more points ``x_t`` per reward call). Trains ``model`` in place;
    returns a log with the reward calls.
    """
    if scalarisation not in ("late", "early"):
        raise ValueError(f"scalarisation must be 'late' or 'early', got {scalarisation!r}")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    adv_fn = late_scalarised_advantages if scalarisation == "late" else early_scalarised_advantages
    index = torch.arange(groups).repeat_interleave(group_size)
    calls = 0
    ref = copy.deepcopy(model).eval() if kl > 0 else None
    for _ in range(iters):
        if fixed_omega is None:
            w = sample_preferences(groups, 2, gen, min_weight)
        else:
            w = torch.tensor([[fixed_omega, 1 - fixed_omega]]).expand(groups, 2)
        w = w.repeat_interleave(group_size, dim=0)
        cond = preference_features(w)
        old = copy.deepcopy(model).eval()
        x1 = sample_ode(old, torch.randn(len(w), model.dim, generator=gen), ode_steps, cond)
        rewards = reward_fn(x1)
        calls += len(x1)
        adv = adv_fn(rewards, w, index)
        x1r, advr, condr = x1.repeat(reps, 1), adv.repeat(reps), cond.repeat(reps, 1)
        for _ in range(inner_steps):
            loss = nft_loss(model, old, x1r, advr, condr, beta=beta, generator=gen, ref_model=ref, kl=kl)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return {"reward_calls": calls}


@torch.no_grad()
def evaluate_front(model: VelocityMLP, omegas, objective_fn, n: int, ode_steps: int, seed: int = 1234
                   ) -> np.ndarray:
    """Objective values ``(len(omegas), R)`` of ``model`` conditioned on each omega_1, on shared noise."""
    x0 = torch.randn(n, model.dim, generator=torch.Generator().manual_seed(seed))
    out = []
    for w1 in omegas:
        w = torch.tensor([[float(w1), 1 - float(w1)]]).expand(n, 2)
        x = sample_ode(model, x0, ode_steps, preference_features(w))
        out.append(objective_fn(x).mean(0).numpy())
    return np.array(out)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two 1-D arrays (no ties expected)."""
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])
