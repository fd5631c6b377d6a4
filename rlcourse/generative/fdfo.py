"""Paired-trajectory online RL for flow models (finite-difference flow optimisation, FDFO).

Paper: *Finite Difference Flow Optimization for RL Post-Training of Text-to-Image Models*, McAllister,
Aittala, Karras, Hellsten, Kanazawa, Aila, Laine (2026), arXiv:2603.12893. The whole sampling run is one
action: two runs from the same initial noise with independent small stochasticity give two endpoints
and two rewards; their reward difference times their endpoint difference is a finite-difference
estimate of the reward's gradient in sample space, which is copied into the velocity target at every
step of the stored trajectory. The update is an SPO-style soft trust region on a pseudo-ratio.

The baseline is the denoising-MDP policy gradient (DDPO / Flow-GRPO style): every sampler step is a
Gaussian action with a log-probability, and a clipped importance-ratio loss with group-normalised
advantages trains the velocity field.

Convention: time runs from noise (t = 0) to data (t = 1) and the sampler adds ``h v`` with ``h > 0``,
so the velocity target is ``v_ref + u`` (the paper's code, integrating from sigma = 1 to 0 with a
negative step, writes ``v_ref - u``).
"""
from __future__ import annotations

import numpy as np
import torch

from ..claims import Claim, evaluate
from ..losses import compute_policy_loss
from ..profiles import Profile, profile as current_profile
from .flow import (RING_STD, Trajectory, VelocityMLP, gaussian_step_logprob, ring_centres, sample_ode, sample_sde,
                   sde_step_moments)


# ----------------------------------------------------------------------------------------------
# the finite-difference target and the SPO surrogate
# ----------------------------------------------------------------------------------------------
def fd_flow_targets(x1: torch.Tensor, x2: torch.Tensor, R1: torch.Tensor, R2: torch.Tensor,
                    eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Finite-difference targets of a batch of pairs, for both branches.

    Branch 1: ``dR = (R1 - R2)/2``, ``dx = (x1 - x2)/2``, ``u = dx / (mean_d(dx^2) + eps)``; branch 2:
    every sign flipped. Rows ``[0, P)`` are branch 1, rows ``[P, 2P)`` branch 2.

    ======= ============ ===============================================
    x1, x2  ``(P, D)``   endpoints of the two runs of each pair
    R1, R2  ``(P,)``     their rewards
    returns              ``dR`` ``(2P,)``, ``u`` ``(2P, D)``
    ======= ============ ===============================================
    """
    if x1.ndim != 2 or x1.shape != x2.shape:
        raise ValueError(f"x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} must both be (P, D)")
    if R1.shape != (x1.shape[0],) or R2.shape != R1.shape:
        raise ValueError(f"R1 {tuple(R1.shape)} and R2 {tuple(R2.shape)} must both be ({x1.shape[0]},)")
    if not (torch.isfinite(R1).all() and torch.isfinite(R2).all()):
        raise ValueError("rewards contain NaN or inf")
    dR = (R1 - R2) / 2
    dx = (x1 - x2) / 2
    u = dx / ((dx**2).mean(1, keepdim=True) + eps)
    return torch.cat([dR, -dR]), torch.cat([u, -u])


def spo_surrogate(dR: torch.Tensor, rho: torch.Tensor, eps: float) -> torch.Tensor:
    """The SPO-style soft trust region, per element: ``-dR rho + |dR| / (2 eps) (rho - 1)^2``.

    Minimised over ``rho`` at ``rho* = 1 + eps sign(dR)``.

    ======= ========= =======================================
    dR      ``(N,)``  reward half-differences
    rho     ``(N,)``  pseudo-ratios (1 at the reference)
    returns ``(N,)``  surrogate values (to be averaged)
    ======= ========= =======================================
    """
    if dR.shape != rho.shape:
        raise ValueError(f"dR {tuple(dR.shape)} and rho {tuple(rho.shape)} differ")
    if eps <= 0:
        raise ValueError(f"eps must be positive, got {eps}")
    return -dR * rho + dR.abs() / (2 * eps) * (rho - 1) ** 2


def fdfo_loss(model: VelocityMLP, x: torch.Tensor, t: torch.Tensor, v_ref: torch.Tensor, u: torch.Tensor,
              dR: torch.Tensor, eps: float = 0.03, cond: torch.Tensor | None = None) -> torch.Tensor:
    """FDFO's loss on a minibatch of (pair, branch, step) rows.

    ``v_tgt = v_ref + u``; ``l = -mean_d (v_theta - v_tgt)^2``; ``l_ref = -mean_d u^2`` (the value at
    ``v_theta = v_ref``); ``rho = exp(l - l_ref)``; loss ``= mean spo_surrogate(dR, rho, eps)``. The
    exponent is computed in the equal, cancellation-free form
    ``l - l_ref = mean_d[2 (v_theta - v_ref) u - (v_theta - v_ref)^2]``.

    ======= ========== ====================================================
    x       ``(N, D)`` the stored points x_k of the runs
    t       ``(N,)``   their times t_k
    v_ref   ``(N, D)`` the velocity the sampler used there
    u       ``(N, D)`` the normalised endpoint difference of the row's pair
    dR      ``(N,)``   the row's reward half-difference
    returns scalar     loss
    ======= ========== ====================================================
    """
    if not (x.shape == v_ref.shape == u.shape) or t.shape != (x.shape[0],) or dR.shape != (x.shape[0],):
        raise ValueError(f"shapes x {tuple(x.shape)}, t {tuple(t.shape)}, v_ref {tuple(v_ref.shape)}, "
                         f"u {tuple(u.shape)}, dR {tuple(dR.shape)} disagree")
    d = model(x, t, cond) - v_ref
    log_rho = (2 * d * u - d**2).mean(1)
    return spo_surrogate(dR, torch.exp(log_rho), eps).mean()


# ----------------------------------------------------------------------------------------------
# the per-step policy-gradient baseline
# ----------------------------------------------------------------------------------------------
def step_logprob(model: VelocityMLP, x: torch.Tensor, t: torch.Tensor, x_next: torch.Tensor, h: float,
                 noise: float, cond: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probability of the sampler step ``x -> x_next`` under the current model (differentiable).

    ======= ========== ==================================
    x       ``(N, D)`` points before the step
    t       ``(N,)``   their times
    x_next  ``(N, D)`` points after the step
    returns ``(N,)``   log N(x_next; mean_theta(x), std^2 I)
    ======= ========== ==================================
    """
    mean, std = sde_step_moments(model(x, t, cond), x, t, h, noise)
    return gaussian_step_logprob(x_next, mean, std)


def ddpo_loss(model: VelocityMLP, x: torch.Tensor, t: torch.Tensor, x_next: torch.Tensor, old_logp: torch.Tensor,
              adv: torch.Tensor, h: float, noise: float, clip: float = 0.2) -> torch.Tensor:
    """Clipped per-step policy-gradient loss of the denoising MDP (DDPO / Flow-GRPO style).

    Each (sample, step) row is one action, scored by PPO's clipped surrogate: the loss is
    :func:`rlcourse.losses.compute_policy_loss` (the language-model loop's, log-ratio clamp
    included) on a ``(N, 1)`` batch of one-"token" rows with ``token-mean`` aggregation, i.e.
    ``-mean min(ratio A, clip(ratio) A)`` with ``ratio = exp(log pi_theta(x_next | x) - old_logp)``.
    Each step of a run carries the run's advantage.

    ======== ========== ==================================
    x        ``(N, D)`` points before each step
    t        ``(N,)``   their times
    x_next   ``(N, D)`` points after each step
    old_logp ``(N,)``   log-probs recorded when sampling
    adv      ``(N,)``   the run's advantage, per row
    returns  scalar     loss
    ======== ========== ==================================
    """
    if old_logp.shape != (x.shape[0],) or adv.shape != (x.shape[0],):
        raise ValueError(f"old_logp {tuple(old_logp.shape)} and adv {tuple(adv.shape)} must be ({x.shape[0]},)")
    logp = step_logprob(model, x, t, x_next, h, noise)
    loss, _ = compute_policy_loss(old_logp[:, None], logp[:, None], adv[:, None], torch.ones_like(logp)[:, None],
                                  clip_ratio_low=clip, clip_ratio_high=clip, loss_agg_mode="token-mean")
    return loss


# ----------------------------------------------------------------------------------------------
# training loops
# ----------------------------------------------------------------------------------------------
def _rows(traj: Trajectory) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flatten a trajectory to (step, run) rows: x_k, t_k, v_k, x_{k+1}, logp_k."""
    K, B, D = traj.vs.shape
    return (traj.xs[:-1].reshape(K * B, D), traj.ts.repeat_interleave(B), traj.vs.reshape(K * B, D),
            traj.xs[1:].reshape(K * B, D), traj.logp.reshape(K * B))


def _adam_epochs(opt, n: int, minibatch: int, epochs: int, gen: torch.Generator, loss_of) -> None:
    """``epochs`` passes over ``n`` rows in shuffled minibatches; ``loss_of(rows)`` is the loss of
    the rows (a long index tensor), and each minibatch takes one optimiser step on it."""
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for s in range(0, n, minibatch):
            loss = loss_of(perm[s:s + minibatch])
            opt.zero_grad()
            loss.backward()
            opt.step()


def train_fdfo(model: VelocityMLP, reward_fn, iters: int, pairs: int, lr: float, steps: int = 20,
               churn: float = 0.3, eps: float = 0.03, minibatch: int = 256, epochs: int = 1,
               seed: int = 0, eval_fn=None, eval_every: int = 5) -> dict:
    """FDFO: each iteration samples ``pairs`` pairs (same initial noise, independent sampler noise of
    strength ``churn``), scores the ``2 pairs`` endpoints, builds :func:`fd_flow_targets`, and takes
    Adam steps on :func:`fdfo_loss` over shuffled (pair, branch, step) rows. Trains ``model`` in place.

    Returns ``{"calls": [...], "eval": [...]}``: reward calls so far and ``eval_fn(model)`` every
    ``eval_every`` iterations (and at 0).
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    log = {"calls": [0], "eval": [eval_fn(model)] if eval_fn else []}
    calls = 0
    for it in range(iters):
        z = torch.randn(pairs, model.dim, generator=gen)
        traj = sample_sde(model, torch.cat([z, z]), steps, churn, generator=gen)
        R = reward_fn(traj.xs[-1])
        calls += 2 * pairs
        dR, u = fd_flow_targets(traj.xs[-1][:pairs], traj.xs[-1][pairs:], R[:pairs], R[pairs:])
        x, t, v, _, _ = _rows(traj)
        uu, dd = u.repeat(steps, 1), dR.repeat(steps)  # row k*B + b belongs to run b
        _adam_epochs(opt, len(x), minibatch, epochs, gen,
                     lambda i: fdfo_loss(model, x[i], t[i], v[i], uu[i], dd[i], eps))
        if eval_fn and ((it + 1) % eval_every == 0 or it + 1 == iters):
            log["calls"].append(calls)
            log["eval"].append(eval_fn(model))
    return log


def train_ddpo(model: VelocityMLP, reward_fn, iters: int, batch: int, lr: float, steps: int = 20,
               noise: float = 1.0, clip: float = 0.2, minibatch: int = 256, epochs: int = 1,
               seed: int = 0, eval_fn=None, eval_every: int = 5) -> dict:
    """The per-step policy-gradient baseline: ``batch`` independent stochastic runs per iteration,
    advantages ``(R - mean R) / (std R + 1e-4)`` over the batch, Adam steps on :func:`ddpo_loss` over
    shuffled (run, step) rows. Same log as :func:`train_fdfo`.
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    log = {"calls": [0], "eval": [eval_fn(model)] if eval_fn else []}
    calls = 0
    h = 1.0 / steps
    for it in range(iters):
        traj = sample_sde(model, torch.randn(batch, model.dim, generator=gen), steps, noise, generator=gen)
        R = reward_fn(traj.xs[-1])
        calls += batch
        A = (R - R.mean()) / (R.std(unbiased=False) + 1e-4)
        x, t, _, x_next, old_logp = _rows(traj)
        adv = A.repeat(steps)
        _adam_epochs(opt, len(x), minibatch, epochs, gen,
                     lambda i: ddpo_loss(model, x[i], t[i], x_next[i], old_logp[i], adv[i], h, noise, clip))
        if eval_fn and ((it + 1) % eval_every == 0 or it + 1 == iters):
            log["calls"].append(calls)
            log["eval"].append(eval_fn(model))
    return log


# ----------------------------------------------------------------------------------------------
# the experiment
# ----------------------------------------------------------------------------------------------
TARGET_MODE = 1  # the ring mode at 45 degrees


def ring_reward(x: torch.Tensor) -> torch.Tensor:
    """Reward of 2-D samples: minus the distance to the ring's mode at 45 degrees, ``(B,)``."""
    return -(x - ring_centres()[TARGET_MODE]).norm(dim=1)


def digits_reward(clf, x: torch.Tensor, target: int = 7) -> torch.Tensor:
    """Reward of digit samples: the classifier's probability of ``target`` (a non-differentiable
    reward model), ``(B,)``."""
    p = clf.predict_proba(x.detach().clamp(-1, 1).numpy())[:, target]
    return torch.tensor(p, dtype=torch.float32)


def calls_to_reach(calls: np.ndarray, curve: np.ndarray, level: float) -> float:
    """The first reward-call count at which ``curve`` reaches ``level`` (``inf`` if never)."""
    hit = np.nonzero(np.asarray(curve) >= level)[0]
    return float(np.asarray(calls)[hit[0]]) if len(hit) else float("inf")


def run_fdfo_experiment(prof: Profile | None = None, *, jobs: int | None = None) -> dict:
    """FDFO against the per-step policy gradient, on the same reward and the same reward-call budget: the
    chapter's study (:mod:`rlcourse.studies.flow_pairs`), whose settings are chosen on tuning seeds that
    no reported run uses, then compared paired by seed on the profile's ``toy_seeds`` seeds
    (:func:`fdfo_verdicts`)."""
    from ..studies.flow_pairs import run_experiment

    return run_experiment(prof or current_profile(), jobs=jobs)


def _ring_metrics(model: VelocityMLP, x0: torch.Tensor, steps: int) -> list[float]:
    """Mean reward, fraction within 3 std of a ring mode, number of modes holding >= 2% of samples."""
    x = sample_ode(model, x0, steps)
    d = torch.cdist(x, ring_centres())
    near = d.min(1).values < 3 * RING_STD
    counts = torch.bincount(d.argmin(1)[near], minlength=len(ring_centres())).float() / len(x)
    return [float(ring_reward(x).mean()), float(near.float().mean()), float((counts >= 0.02).sum())]


def _digits_metrics(model: VelocityMLP, x0: torch.Tensor, steps: int, reward_fn, data: torch.Tensor) -> list[float]:
    """Mean reward, mean distance to the nearest real digit (per pixel, RMS), mean pairwise RMS distance."""
    x = sample_ode(model, x0, steps).clamp(-1, 1)
    D = x.shape[1]
    nn_dist = torch.cdist(x, data).min(1).values / D**0.5
    pair = torch.pdist(x) / D**0.5
    return [float(reward_fn(x).mean()), float(nn_dist.mean()), float(pair.mean())]


def _train_arm(arm: str, model: VelocityMLP, reward_fn, cfg: dict, iters: int, pairs: int, steps: int, seed: int,
               eval_fn, eval_every: int) -> dict:
    if arm == "fdfo":
        return train_fdfo(model, reward_fn, iters, pairs, cfg["lr"], steps, churn=cfg["churn"], eps=cfg["eps"],
                          seed=seed, eval_fn=eval_fn, eval_every=eval_every)
    return train_ddpo(model, reward_fn, iters, 2 * pairs, cfg["lr"], steps, noise=cfg["noise"], seed=seed,
                      eval_fn=eval_fn, eval_every=eval_every)


# ----------------------------------------------------------------------------------------------
# the chapter's claims
# ----------------------------------------------------------------------------------------------
PAPER = ("Finite Difference Flow Optimization for RL Post-Training of Text-to-Image Models (McAllister et al., "
         "2026, arXiv:2603.12893)")
_FASTER = ("faster convergence and higher reward than Flow-GRPO on all three rewards (SD3.5-Medium, LoRA; "
           "PickScore, VLM alignment)")
_METRIC = ("area under the evaluation-reward curve over the reward-call budget (mean of the evaluations, "
           "equally spaced in calls), per seed; each arm at its best setting")

CLAIMS = {
    "digits": Claim(
        key="flow_pairs/digits-faster", paper=PAPER, statement=_FASTER, source="the authors' blog (FDFO page)",
        setting="64-dim digits flow model (MLP velocity field), reward P('7') from a logistic-regression "
        "classifier, equal reward calls per iteration", metric=_METRIC, method="FDFO",
        baseline="per-step clipped policy gradient (DDPO/Flow-GRPO style)", kind="greater", margin=0.0),
    "ring": Claim(
        key="flow_pairs/ring-faster", paper=PAPER, statement=_FASTER, source="the authors' blog (FDFO page)",
        setting="2-D ring flow model (MLP velocity field), reward minus the distance to one mode, equal reward "
        "calls per iteration", metric=_METRIC, method="FDFO",
        baseline="per-step clipped policy gradient (DDPO/Flow-GRPO style)", kind="greater", margin=0.0),
}


def fdfo_verdicts(res: dict) -> dict:
    """Evaluate :data:`CLAIMS` on :func:`run_fdfo_experiment`'s output, FDFO against the policy
    gradient paired by seed.

    ========  ======  =====================================================================
    res       dict    ``res[task][arm]["auc"]`` ``(seeds,)`` for task digits / ring
    returns   dict    ``"digits"``, ``"ring"`` -> :class:`rlcourse.claims.Verdict`
    ========  ======  =====================================================================
    """
    return {task: evaluate(CLAIMS[task], res[task]["fdfo"]["auc"], res[task]["pg"]["auc"],
                           seconds=res.get("seconds"))
            for task in ("digits", "ring")}
