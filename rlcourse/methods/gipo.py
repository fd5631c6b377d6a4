"""GIPO: a Gaussian trust weight on the log-ratio in place of PPO's hard clip.

*GIPO: Gaussian Importance Sampling Policy Optimization*, Chengxuan Lu, Zhenquan Zhang, Shukuan Wang,
Qunzhi Lin, Baigui Sun and Yang Liu (2026, arXiv:2603.03955). Each token's surrogate ``-rho * A`` is
multiplied by a *detached* weight ``w = exp(-(log rho)^2 / (2 sigma^2))``, so the gradient of a
token is ``-f(rho) A grad log pi`` with the effective weight ``f(rho) = rho * w(rho)``: equal to the
policy gradient on-policy, bounded by ``e^{sigma^2 / 2}``, and never exactly zero. The authors' code
uses ``sigma_+ = 1`` for positive advantages and ``sigma_- = sigma_+ / 2`` for the others.

This module holds the weight, the registered policy losses ``"gipo"`` and ``"sapo"`` (the soft gate the
authors' code compares against), the exact bias and variance of the weighted importance-sampling
gradient on a bandit, and the stale contextual bandit; the chapter's experiments (the bias-variance
frontier on random bandit instances, the staleness study with its arms, seeds and verdicts) are
:mod:`rlcourse.studies.gipo`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..losses import agg_loss, register_policy_loss
from ..ops import check_same_shape, masked_mean
from ..snapshots import push_lagged

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


SAPO = "Soft Adaptive Policy Optimization, C. Gao et al. (2025, arXiv:2511.20347)"


def sapo_effective_weight(rho: np.ndarray | float, advantage_sign: np.ndarray | float, tau_pos: float = 1.0,
                          tau_neg: float = 2.0) -> np.ndarray:
    """SAPO's effective gradient weight ``f(rho) = 4 rho s (1 - s)``, ``s = sigmoid(tau (rho - 1))``,
    with ``tau = tau_pos`` where ``A > 0`` and ``tau_neg`` elsewhere (NumPy): 1 on-policy, never zero."""
    rho, sign = np.broadcast_arrays(np.asarray(rho, float), np.asarray(advantage_sign, float))
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"tau_pos and tau_neg must be > 0, got {tau_pos}, {tau_neg}")
    tau = np.where(sign > 0, tau_pos, tau_neg)
    x = tau * (rho - 1.0)
    return 4.0 * rho / ((1.0 + np.exp(-x)) * (1.0 + np.exp(x)))  # s (1 - s) without cancelling 1 - s


@register_policy_loss("sapo")
def compute_sapo_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                      response_mask: torch.Tensor, tau_pos: float = 1.0, tau_neg: float = 2.0,
                      loss_agg_mode: str = "token-mean", *, global_tokens: float | None = None,
                      global_seqs: float | None = None, max_len: int | None = None):
    """SAPO's soft gate in place of the clip, per token: ``-(4 / tau) sigmoid(tau (rho - 1)) A``, with
    ``tau = tau_pos`` where ``A > 0`` and ``tau_neg`` elsewhere (1 and 2, the values in the GIPO
    authors' code, which compares against it), aggregated by ``loss_agg_mode``. Its gradient is
    ``-f(rho) A grad log pi`` with :func:`sapo_effective_weight` ``f``. The ratio is clamped to
    ``[1e-6, 1e6]`` as in that code.

    ============== ========= ===============================================
    the four       ``(B,T)`` log-probs, advantages and mask, as in :func:`compute_gipo_loss`
    returns                  ``(loss, metrics)``: ``pg_clipfrac`` (share of tokens whose effective
                             weight is below 1% of the on-policy weight), ``ppo_kl``, ``ratio_mean``
    ============== ========= ===============================================
    """
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                     response_mask=response_mask)
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"tau_pos and tau_neg must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    log_ratio = (log_prob - old_log_prob.detach()).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio).clamp(1e-6, 1e6)
    adv = advantages.detach()
    tau = torch.where(adv > 0, torch.full_like(ratio, float(tau_pos)), torch.full_like(ratio, float(tau_neg)))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = agg_loss(-adv * gate * (4.0 / tau), response_mask, loss_agg_mode, global_tokens=global_tokens,
                    global_seqs=global_seqs, max_len=max_len)
    with torch.no_grad():
        f = 4.0 * ratio * gate * torch.sigmoid(-tau * (ratio - 1.0))
        metrics = {
            "pg_clipfrac": float(masked_mean((f < 0.01).float(), response_mask)),
            "ppo_kl": float(masked_mean(-log_ratio, response_mask)),
            "ratio_mean": float(masked_mean(ratio, response_mask)),
        }
    return loss, metrics


compute_sapo_loss.zero_at_zero_advantage = True


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


# ---------------------------------------------------------------------- the staleness experiment
@dataclass(frozen=True)
class BanditConfig:
    """The stale-bandit experiment's sizes and update protocol.

    The default protocol is the authors' (``metaworld_ppo_discrete_simple_complete.py`` in their public
    code): each batch is reused ``epochs = 10`` times, but the actor steps only on reuses whose index
    ``k`` is a multiple of ``actor_every = 10`` (so once per batch; the other reuses train only their
    value function, which a bandit with group-mean advantages does not have), each actor step is scaled
    by ``1/sqrt(k + 1)``, and ``kl_coef = 0.1`` times KL(behaviour || current) is added to the loss.
    ``actor_every=1, kl_coef=0, reuse_scale=False`` is the aggressive protocol: 10 unregularised
    policy steps per batch.
    """

    contexts: int = 16
    actions: int = 32
    samples: int = 8  # G samples per context per step
    steps: int = 200
    epochs: int = 10  # reuses of each batch
    lr: float = 8.0  # SGD on the logits: the magnitude of the weight matters, as in the theory
    actor_every: int = 10  # the policy steps on reuses k with k % actor_every == 0
    kl_coef: float = 0.1  # coefficient of KL(behaviour || current) added on policy steps
    reuse_scale: bool = True  # scale the policy step of reuse k by 1/sqrt(k + 1)

    def __post_init__(self):
        for name in ("contexts", "actions", "samples", "steps", "epochs", "actor_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"BanditConfig.{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not (self.lr > 0 and self.kl_coef >= 0):
            raise ValueError(f"BanditConfig: lr must be > 0 and kl_coef >= 0, got lr={self.lr}, kl_coef={self.kl_coef}")


AUTHORS = BanditConfig()
AGGRESSIVE = BanditConfig(actor_every=1, kl_coef=0.0, reuse_scale=False)
#: the two update protocols of the GIPO bandit: the authors' and the aggressive ablation
PROTOCOLS = {"authors": AUTHORS, "aggressive": AGGRESSIVE}


def make_bandit(cfg: BanditConfig, seed: int) -> np.ndarray:
    """``(C, K)`` expected rewards: one good arm per context (0.9), the others in [0, 0.5]."""
    rng = np.random.default_rng(10_000 + seed)
    means = rng.uniform(0.0, 0.5, (cfg.contexts, cfg.actions))
    means[np.arange(cfg.contexts), rng.integers(0, cfg.actions, cfg.contexts)] = 0.9
    return means


def train_stale_bandit(loss: str, staleness: int, cfg: BanditConfig, seed: int, **loss_kwargs) -> dict:
    """Train a tabular softmax policy on a contextual bandit from batches sampled by the policy of
    ``staleness`` steps ago (:func:`~rlcourse.snapshots.push_lagged`), with the registered policy loss
    ``loss`` (``"pg"``, ``"vanilla"``, ``"gipo"`` or ``"sapo"``) and ``cfg``'s update protocol (see
    :class:`BanditConfig`). Advantages are the reward minus its group (context) mean.

    Returns per-step ``reward`` (exact expected reward of the current policy), ``zero_grad`` (share
    of samples with zero or negligible gradient weight, the loss's ``pg_clipfrac``) and ``grad_norm``.
    """
    from ..losses import get_policy_loss

    fn = get_policy_loss(loss)
    means = torch.as_tensor(make_bandit(cfg, seed), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    logits = torch.zeros(cfg.contexts, cfg.actions, requires_grad=True)
    kept: list = []
    ctx = torch.arange(cfg.contexts).repeat_interleave(cfg.samples)
    out = {"reward": [], "zero_grad": [], "grad_norm": []}
    for _ in range(cfg.steps):
        behaviour = push_lagged(kept, logits, staleness)
        mu = torch.softmax(behaviour, -1)
        actions = torch.multinomial(mu[ctx], 1, generator=gen).squeeze(-1)
        r = torch.bernoulli(means[ctx, actions].clamp(0, 1), generator=gen)
        adv = (r - r.view(cfg.contexts, cfg.samples).mean(1).repeat_interleave(cfg.samples)).unsqueeze(-1)
        old = torch.log_softmax(behaviour, -1)[ctx, actions].unsqueeze(-1)
        log_mu = torch.log_softmax(behaviour, -1)
        mask = torch.ones_like(adv)
        zero, norms = [], []
        for k in range(cfg.epochs):
            if k % cfg.actor_every:
                continue
            log_pi = torch.log_softmax(logits, -1)
            logp = log_pi[ctx, actions].unsqueeze(-1)
            value, metrics = fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, **loss_kwargs)
            if cfg.kl_coef:
                value = value + cfg.kl_coef * (mu * (log_mu - log_pi)).sum(-1).mean()
            grad, = torch.autograd.grad(value, logits)
            if not torch.isfinite(grad).all():
                raise FloatingPointError(f"{loss}: non-finite gradient at staleness {staleness}")
            scale = 1.0 / np.sqrt(k + 1) if cfg.reuse_scale else 1.0
            with torch.no_grad():
                logits -= cfg.lr * scale * grad
            zero.append(metrics["pg_clipfrac"])
            norms.append(float(grad.norm()))
        with torch.no_grad():
            out["reward"].append(float((torch.softmax(logits, -1) * means).sum(-1).mean()))
        out["zero_grad"].append(float(np.mean(zero)))
        out["grad_norm"].append(float(np.mean(norms)))
    return {k: np.asarray(v) for k, v in out.items()}
