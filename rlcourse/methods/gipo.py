"""GIPO: a Gaussian trust weight on the log-ratio in place of PPO's hard clip.

*GIPO: Gaussian Importance Sampling Policy Optimization*, Chengxuan Lu, Zhenquan Zhang, Shukuan Wang,
Qunzhi Lin, Baigui Sun and Yang Liu (2026, arXiv:2603.03955). Each token's surrogate ``-rho * A`` is
multiplied by a *detached* weight ``w = exp(-(log rho)^2 / (2 sigma^2))``, so the gradient of a
token is ``-f(rho) A grad log pi`` with the effective weight ``f(rho) = rho * w(rho)``: equal to the
policy gradient on-policy, bounded by ``e^{sigma^2 / 2}``, and never exactly zero. The authors' code
uses ``sigma_+ = 1`` for positive advantages and ``sigma_- = sigma_+ / 2`` for the others.

This module holds the weight, the registered policy loss ``"gipo"``, the exact bias and variance of
the weighted importance-sampling gradient on a bandit (the bias-variance frontier), and the
staleness experiment of the chapter (a tabular contextual bandit trained from stale batches).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ..claims import Claim, Verdict, evaluate
from ..losses import agg_loss, register_policy_loss
from ..ops import check_same_shape, masked_mean
from ..profiles import Profile, one_torch_thread

PAPER = ("GIPO: Gaussian Importance Sampling Policy Optimization, C. Lu, Z. Zhang, S. Wang, Q. Lin, B. Sun, "
         "Y. Liu (2026, arXiv:2603.03955)")


def gaussian_trust_weight(log_ratio: torch.Tensor, sigma: float | torch.Tensor) -> torch.Tensor:
    """``w = exp(-(log rho)^2 / (2 sigma^2))``, elementwise; ``sigma`` a positive float or a tensor
    of ``log_ratio``'s shape."""
    sigma = torch.as_tensor(sigma, dtype=log_ratio.dtype)
    if (sigma <= 0).any():
        raise ValueError(f"sigma must be > 0, got {sigma}")
    return torch.exp(-0.5 * (log_ratio / sigma) ** 2)


def effective_weight(rho: np.ndarray | float, sigma: float) -> np.ndarray:
    """GIPO's effective gradient weight ``f(rho) = rho exp(-(ln rho)^2 / (2 sigma^2))`` (NumPy)."""
    rho = np.asarray(rho, dtype=float)
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    if (rho <= 0).any():
        raise ValueError("importance ratios must be > 0")
    return rho * np.exp(-np.log(rho) ** 2 / (2 * sigma**2))


def ppo_effective_weight(rho: np.ndarray | float, advantage_sign: np.ndarray | float, epsilon: float) -> np.ndarray:
    """PPO-clip's effective gradient weight: ``rho`` where the clip is inactive, 0 where it is active
    (``rho > 1 + eps`` with ``A > 0``, or ``rho < 1 - eps`` with ``A < 0``)."""
    rho, s = np.broadcast_arrays(np.asarray(rho, float), np.asarray(advantage_sign, float))
    clipped = ((s > 0) & (rho > 1 + epsilon)) | ((s < 0) & (rho < 1 - epsilon))
    return np.where(clipped, 0.0, rho)


@register_policy_loss("gipo")
def compute_gipo_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                      response_mask: torch.Tensor, sigma: float = 1.0, sigma_neg: float | None = 0.5,
                      loss_agg_mode: str = "token-mean", *,
                      global_tokens: float | None = None, global_seqs: float | None = None,
                      max_len: int | None = None):
    """GIPO's policy loss per token, ``-w(rho) rho A`` with ``w`` detached, aggregated by
    ``loss_agg_mode``.

    ``sigma`` is the width for tokens with ``A > 0``; ``sigma_neg`` the width for ``A <= 0`` given as a
    multiple of ``sigma`` (the authors' ``--sigma-neg-ratio``, default 0.5); ``sigma_neg=None`` uses
    ``sigma`` for both. The log-ratio is clamped to +-20 as in :func:`~rlcourse.losses.compute_policy_loss`.

    ============== ========= ===============================================
    old_log_prob   ``(B,T)`` behaviour log-probs (no gradient)
    log_prob       ``(B,T)`` current log-probs (gradient)
    advantages     ``(B,T)`` per-token advantages
    response_mask  ``(B,T)`` 1 on tokens that count
    returns                  ``(loss, metrics)``: scalar and a dict of floats: ``pg_clipfrac`` (share of
                             tokens whose effective weight is below 1% of the on-policy weight, the
                             counterpart of PPO's zero-gradient share), ``gipo_weight_mean``,
                             ``ppo_kl``, ``ratio_mean``
    ============== ========= ===============================================
    """
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                     response_mask=response_mask)
    if sigma <= 0 or (sigma_neg is not None and sigma_neg <= 0):
        raise ValueError(f"sigma and sigma_neg must be > 0, got sigma={sigma}, sigma_neg={sigma_neg}")
    log_ratio = (log_prob - old_log_prob.detach()).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    adv = advantages.detach()
    width = torch.full_like(log_ratio, float(sigma)) if sigma_neg is None else \
        torch.where(adv > 0, torch.full_like(log_ratio, float(sigma)), torch.full_like(log_ratio, sigma * sigma_neg))
    w = gaussian_trust_weight(log_ratio.detach(), width)
    loss = agg_loss(-adv * w * ratio, response_mask, loss_agg_mode, global_tokens=global_tokens,
                    global_seqs=global_seqs, max_len=max_len)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": float(masked_mean((w * ratio < 0.01).float(), response_mask)),
            "gipo_weight_mean": float(masked_mean(w, response_mask)),
            "ppo_kl": float(masked_mean(-log_ratio, response_mask)),
            "ratio_mean": float(masked_mean(ratio, response_mask)),
        }
    return loss, metrics


compute_gipo_loss.zero_at_zero_advantage = True


# ---------------------------------------------------------------------- exact bias and variance
def is_gradient_moments(pi: np.ndarray, mu: np.ndarray, reward: np.ndarray, weight) -> tuple[float, float]:
    """Exact squared bias and variance (trace) of the one-sample importance-weighted policy gradient
    on a ``K``-armed bandit with a softmax policy.

    The target is ``g = E_pi[A(a) grad log pi(a)]`` with ``A = r - E_pi[r]``; the estimator draws
    ``a ~ mu`` and returns ``weight(rho(a), sign A(a)) A(a) grad log pi(a)``, ``rho = pi / mu``, and
    ``grad log pi(a) = e_a - pi`` (gradient with respect to the logits).

    ======  =====  ================================================
    pi      (K,)   current policy
    mu      (K,)   behaviour policy (all entries > 0)
    reward  (K,)   expected reward of each arm
    weight  fn     ``(rho, sign) -> f`` effective weight, elementwise
    return  2      ``(||E[g_hat] - g||^2, E||g_hat - E g_hat||^2)``
    ======  =====  ================================================
    """
    pi, mu, reward = (np.asarray(x, float) for x in (pi, mu, reward))
    if not (pi.shape == mu.shape == reward.shape) or pi.ndim != 1:
        raise ValueError(f"pi, mu and reward must be (K,) arrays of one shape, got {pi.shape}, {mu.shape}, {reward.shape}")
    if (mu <= 0).any():
        raise ValueError("the behaviour policy mu must give every arm positive probability")
    K = len(pi)
    adv = reward - pi @ reward
    score = np.eye(K) - pi[None, :]  # row a: grad log pi(a)
    target = (pi * adv) @ score
    rho = pi / mu
    per_arm = (weight(rho, np.sign(adv)) * adv)[:, None] * score  # (K, K): estimate when arm a is drawn
    mean = mu @ per_arm
    var = float(mu @ ((per_arm - mean) ** 2).sum(1))
    return float(((mean - target) ** 2).sum()), var


def frontier(pi, mu, reward, sigmas, epsilons) -> dict:
    """Bias-variance points of GIPO over ``sigmas`` (symmetric width), PPO-clip over ``epsilons`` and
    the unclipped estimator (unbiased), on one bandit instance."""
    gipo = [is_gradient_moments(pi, mu, reward, lambda r, s, sg=sg: effective_weight(r, sg)) for sg in sigmas]
    ppo = [is_gradient_moments(pi, mu, reward, lambda r, s, e=e: ppo_effective_weight(r, s, e)) for e in epsilons]
    none = is_gradient_moments(pi, mu, reward, lambda r, s: r)
    return {"gipo": np.array(gipo), "ppo": np.array(ppo), "no_clip": np.array(none)}


def dominated_share(points: dict, tol: float = 1e-12) -> float:
    """Share of PPO's points for which some GIPO point has no larger bias and no larger variance."""
    g, p = points["gipo"], points["ppo"]
    hits = [np.any((g[:, 0] <= b + tol) & (g[:, 1] <= v + tol)) for b, v in p]
    return float(np.mean(hits))


def random_instance(rng: np.random.Generator, K: int = 6, shift: float = 1.0):
    """A bandit instance: rewards in [0, 1], a behaviour policy, and a current policy whose logits
    moved away from it by Gaussian noise of scale ``shift`` (the staleness)."""
    reward = rng.uniform(0, 1, K)
    logits_mu = rng.normal(0, 1, K)
    logits_pi = logits_mu + rng.normal(0, shift, K)
    soft = lambda z: np.exp(z - z.max()) / np.exp(z - z.max()).sum()  # noqa: E731
    return soft(logits_pi), soft(logits_mu), reward


# ---------------------------------------------------------------------- the staleness experiment
@dataclass(frozen=True)
class BanditConfig:
    contexts: int = 16
    actions: int = 32
    samples: int = 8  # G samples per context per step
    steps: int = 200
    epochs: int = 10  # gradient steps on each batch (reuse; the authors' code reuses a batch 10 times)
    lr: float = 8.0  # SGD on the logits: the magnitude of the weight matters, as in the theory


def make_bandit(cfg: BanditConfig, seed: int) -> np.ndarray:
    """``(C, K)`` expected rewards: one good arm per context (0.9), the others in [0, 0.5]."""
    rng = np.random.default_rng(10_000 + seed)
    means = rng.uniform(0.0, 0.5, (cfg.contexts, cfg.actions))
    means[np.arange(cfg.contexts), rng.integers(0, cfg.actions, cfg.contexts)] = 0.9
    return means


def train_stale_bandit(loss: str, staleness: int, cfg: BanditConfig, seed: int, **loss_kwargs) -> dict:
    """Train a tabular softmax policy on a contextual bandit from batches sampled by the policy of
    ``staleness`` steps ago, with the registered policy loss ``loss`` (``"pg"``, ``"vanilla"`` or
    ``"gipo"``). Advantages are the reward minus its group (context) mean.

    Returns per-step ``reward`` (exact expected reward of the current policy), ``zero_grad`` (share
    of samples with zero or negligible gradient weight, the loss's ``pg_clipfrac``) and ``grad_norm``.
    """
    from ..losses import get_policy_loss

    fn = get_policy_loss(loss)
    means = torch.as_tensor(make_bandit(cfg, seed), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    logits = torch.zeros(cfg.contexts, cfg.actions, requires_grad=True)
    snapshots = [logits.detach().clone()]
    ctx = torch.arange(cfg.contexts).repeat_interleave(cfg.samples)
    out = {"reward": [], "zero_grad": [], "grad_norm": []}
    for _ in range(cfg.steps):
        behaviour = snapshots[max(0, len(snapshots) - 1 - staleness)]
        mu = torch.softmax(behaviour, -1)
        actions = torch.multinomial(mu[ctx], 1, generator=gen).squeeze(-1)
        r = torch.bernoulli(means[ctx, actions].clamp(0, 1), generator=gen)
        adv = (r - r.view(cfg.contexts, cfg.samples).mean(1).repeat_interleave(cfg.samples)).unsqueeze(-1)
        old = torch.log_softmax(behaviour, -1)[ctx, actions].unsqueeze(-1)
        mask = torch.ones_like(adv)
        zero, norms = [], []
        for _ in range(cfg.epochs):
            logp = torch.log_softmax(logits, -1)[ctx, actions].unsqueeze(-1)
            value, metrics = fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, **loss_kwargs)
            grad, = torch.autograd.grad(value, logits)
            if not torch.isfinite(grad).all():
                raise FloatingPointError(f"{loss}: non-finite gradient at staleness {staleness}")
            with torch.no_grad():
                logits -= cfg.lr * grad
            zero.append(metrics["pg_clipfrac"])
            norms.append(float(grad.norm()))
        snapshots.append(logits.detach().clone())
        snapshots = snapshots[-(staleness + 1):]
        with torch.no_grad():
            out["reward"].append(float((torch.softmax(logits, -1) * means).sum(-1).mean()))
        out["zero_grad"].append(float(np.mean(zero)))
        out["grad_norm"].append(float(np.mean(norms)))
    return {k: np.asarray(v) for k, v in out.items()}


METHODS = {  # name -> (registered loss, its keyword arguments)
    "no clip": ("pg", {}),
    "PPO-clip": ("vanilla", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}),
    "GIPO": ("gipo", {"sigma": 1.0, "sigma_neg": 0.5}),
}


def run_learning_rate_sweep(P: Profile, lrs=(2.0, 8.0, 32.0), staleness: int | None = None) -> dict:
    """Final reward of each method at staleness 0 and ``staleness`` for several SGD learning rates
    (``P.toy_seeds`` seeds, fewer steps): where does staleness hurt at all?"""
    L = staleness if staleness is not None else P.pick(smoke=8, book=32)
    steps = P.pick(smoke=20, book=120)
    out = {}
    with one_torch_thread():
        for lr in lrs:
            cfg = BanditConfig(steps=steps, lr=lr)
            for name, (loss, kw) in METHODS.items():
                for lag in (0, L):
                    rewards = [train_stale_bandit(loss, lag, cfg, seed, **kw)["reward"] for seed in range(P.toy_seeds)]
                    out[(lr, name, lag)] = float(np.mean([r[-max(1, steps // 5):].mean() for r in rewards]))
    return {"lrs": tuple(lrs), "staleness": L, "final": out}


def run_staleness_experiment(P: Profile, stalenesses=None, seeds: int | None = None) -> dict:
    """Every method of :data:`METHODS` at every staleness, over ``P.toy_seeds`` seeds.

    Returns ``curves[(method, L)]`` ``(seeds, steps)`` arrays of reward, and ``final[(method, L)]``
    ``(seeds,)`` the mean expected reward over the last fifth of training, ``zero_grad[(method, L)]``
    ``(seeds,)`` the mean share of zero-gradient samples, ``seconds``.
    """
    cfg = BanditConfig(steps=P.pick(smoke=30, book=200))
    stalenesses = tuple(stalenesses or P.pick(smoke=(0, 8), book=(0, 2, 8, 32)))
    n = seeds or P.toy_seeds
    start = time.perf_counter()
    curves, final, zero = {}, {}, {}
    with one_torch_thread():
        for name, (loss, kw) in METHODS.items():
            for L in stalenesses:
                runs = [train_stale_bandit(loss, L, cfg, seed, **kw) for seed in range(n)]
                curves[(name, L)] = np.stack([r["reward"] for r in runs])
                final[(name, L)] = curves[(name, L)][:, -max(1, cfg.steps // 5):].mean(1)
                zero[(name, L)] = np.array([r["zero_grad"].mean() for r in runs])
    return {"config": cfg, "stalenesses": stalenesses, "seeds": n, "curves": curves, "final": final,
            "zero_grad": zero, "seconds": time.perf_counter() - start}


def run_frontier_experiment(P: Profile, instances: int | None = None) -> dict:
    """Exact bias-variance frontiers on random bandit instances; the share of PPO's points that a
    GIPO point dominates, per instance."""
    rng = np.random.default_rng(0)
    sigmas = np.geomspace(0.05, 5.0, 60)
    epsilons = np.array([0.05, 0.1, 0.2, 0.3, 0.5])
    n = instances or P.pick(smoke=20, book=200)
    start = time.perf_counter()
    shares, example = [], None
    for i in range(n):
        pts = frontier(*random_instance(rng), sigmas, epsilons)
        shares.append(dominated_share(pts))
        if i == 0:
            example = pts
    return {"sigmas": sigmas, "epsilons": epsilons, "shares": np.array(shares), "example": example,
            "seconds": time.perf_counter() - start}


# ---------------------------------------------------------------------- the claims
SETTING = ("tabular softmax policy on a 16-context, 32-arm Bernoulli bandit; batches of 8 samples per context "
           "drawn by the policy of L steps ago; 10 SGD steps per batch (lr 8); GIPO with sigma+ = 1, "
           "sigma- = 0.5 (the authors' defaults); PPO epsilon = 0.2")


def claims(stalenesses) -> dict[str, Claim]:
    """The claims the chapter tests, keyed by short name."""
    lo, hi = min(stalenesses), max(stalenesses)
    stated = ("GIPO achieves state-of-the-art performance among clipping-based baselines across a wide range of "
              "replay buffer sizes, from near on-policy to highly stale data")
    common = dict(paper=PAPER, source="abstract", setting=SETTING, paper_number="MetaWorld/LIBERO success rates "
                  "(not reproduced)")
    return {
        "near-on-policy": Claim(key="gipo/near-on-policy", statement=stated + " [near on-policy end]",
                                metric=f"expected reward over the last fifth of training, staleness L = {lo}",
                                method="GIPO", baseline="PPO-clip", kind="greater", **common),
        "stale": Claim(key="gipo/stale", statement=stated + " [highly stale end]",
                       metric=f"expected reward over the last fifth of training, staleness L = {hi}",
                       method="GIPO", baseline="PPO-clip", kind="greater", **common),
        "no-clip-unstable": Claim(key="gipo/no-clip-unstable",
                                  statement="replacing hard clipping with a Gaussian trust weight keeps training "
                                            "stable where unclipped importance sampling is not (high training "
                                            "stability)",
                                  metric=f"expected reward over the last fifth of training, staleness L = {hi}",
                                  method="GIPO", baseline="no clip", kind="greater", **common),
        "ppo-zero-gradients": Claim(key="gipo/ppo-zero-gradients",
                                    statement="hard clipping zeroes the gradient of samples whose ratio left the "
                                              "trust region; GIPO maintains non-zero gradients",
                                    metric=f"share of samples with zero gradient weight, L = {hi}",
                                    method="PPO-clip", baseline="GIPO", kind="greater", **common),
    }


def staleness_verdicts(out: dict) -> dict[str, Verdict]:
    """Evaluate :func:`claims` on the output of :func:`run_staleness_experiment`."""
    ls = out["stalenesses"]
    lo, hi = min(ls), max(ls)
    c = claims(ls)
    f, z, s = out["final"], out["zero_grad"], out["seconds"]
    return {
        "near-on-policy": evaluate(c["near-on-policy"], f[("GIPO", lo)], f[("PPO-clip", lo)], seconds=s),
        "stale": evaluate(c["stale"], f[("GIPO", hi)], f[("PPO-clip", hi)], seconds=s),
        "no-clip-unstable": evaluate(c["no-clip-unstable"], f[("GIPO", hi)], f[("no clip", hi)], seconds=s),
        "ppo-zero-gradients": evaluate(c["ppo-zero-gradients"], z[("PPO-clip", hi)], z[("GIPO", hi)], seconds=s),
    }


FRONTIER_CLAIM = Claim(
    key="gipo/frontier", paper=PAPER, source="abstract (\"superior bias-variance trade-off\"); the 2x2 GridWorld "
    "analysis is known to us only from secondary summaries",
    statement="GIPO exhibits a superior bias-variance trade-off",
    setting="exact one-sample bias and variance of the importance-weighted gradient on random 6-arm bandits "
            "(current policy = behaviour logits + N(0, 1) noise); GIPO's sigma on a grid of 60 values, PPO's "
            "epsilon in {0.05, 0.1, 0.2, 0.3, 0.5}",
    metric="share of PPO's (bias, variance) points weakly dominated by a GIPO point, per instance",
    method="GIPO dominates", baseline=None, reference=0.5, kind="greater", unit="{:.2f}", replicate="instance")


def frontier_verdict(out: dict) -> Verdict:
    return evaluate(FRONTIER_CLAIM, out["shares"], seconds=out["seconds"])
