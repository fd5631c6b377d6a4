"""SORL: turn-level importance sampling and clipping-triggered normalisation for multi-turn agents.

*Stabilizing Off-Policy Training for Long-Horizon LLM Agent via Turn-Level Importance Sampling and
Clipping-Triggered Normalization*, Chenliang Li, Adel Elmahdy, Alex Boyd, Zhongruo Wang, Siliang Zeng,
Alfredo Garcia, Parminder Bhatia, Taha Kass-Hout, Cao Xiao and Mingyi Hong (2025, arXiv:2511.20718).

Two changes to PPO's clipped surrogate for episodes made of turns (agent turns separated by
environment replies that are read but not trained on):

1. the importance ratio of every token of turn ``k`` is the turn's geometric mean of token ratios,
   ``rho_k = exp(mean_{t in k} log(pi_theta / mu))`` (its log-variance is that of one token divided by
   the turn's length);
2. a *clipping-triggered normaliser* down-weights the turns whose ratio left the clip range. The
   paper's exact equation is not reproduced here: the two forms below are a RECONSTRUCTION, ``"bias"``
   (the default: each token divided by ``1 + lambda |rho - clip(rho)| |A|``, its advantage-weighted
   distance outside the clip range, detached) and ``"mass"``
   (the loss scaled by the share of ``|A|`` that is inside the range, detached). Both are 1 when no
   ratio is out of the range. They fire whenever a ratio leaves the range, also where PPO's ``min``
   keeps the unclipped term (``A < 0`` with ``rho > 1 + eps``), so "clipping-triggered" means "triggered
   by a ratio outside the clip range", not "by an active clip".

This module holds the ratios, the registered losses ``"turn_ppo"`` (turn ratio, no normaliser) and
``"sorl"`` (turn ratio and the normaliser: SO-PPO's / SO-GRPO's policy loss) and the variance identities.
The chapter's experiment (a tabular multi-turn "code lock" trained from stale batches, and the tiny LM on
the text FrozenLake) is in :mod:`rlcourse.studies.sorl`.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import multiturn  # noqa: F401  (registers the "multiturn" sampler and the "frozenlake" task)
from ..losses import agg_loss, register_policy_loss
from ..ops import check_same_shape, masked_mean

PAPER = ("Stabilizing Off-Policy Training for Long-Horizon LLM Agent via Turn-Level Importance Sampling and "
         "Clipping-Triggered Normalization, C. Li, A. Elmahdy, A. Boyd et al. (2025, arXiv:2511.20718)")
LEVELS = ("token", "turn", "sequence")
NORMALIZERS = ("none", "bias", "mass")


# ---------------------------------------------------------------------- ratios
def turn_mean_log_ratio(log_ratio: torch.Tensor, response_mask: torch.Tensor,
                        turn_index: torch.Tensor | None = None) -> torch.Tensor:
    """Each token's turn mean of the token log-ratios over the turn's tokens in the loss.

    ============= ========= ===========================================================
    log_ratio     ``(B,T)`` ``log pi_theta(y_t) - log mu(y_t)`` (gradient flows through it)
    response_mask ``(B,T)`` 1 on the tokens in the loss (the agent's), 0 on environment tokens
                            and padding; only these enter a turn's mean
    turn_index    ``(B,T)`` long, the turn of each token (-1 or any value on padding); None: the
                            whole response is one turn (GSPO's length-normalised sequence ratio)
    returns       ``(B,T)`` ``mean_{s in turn(t), mask_s = 1} log_ratio_s`` at every token ``t``
                            (0 where the turn has no token in the loss)
    ============= ========= ===========================================================
    """
    check_same_shape(log_ratio=log_ratio, response_mask=response_mask)
    mask = response_mask.to(log_ratio.dtype)
    if turn_index is None:
        per_row = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
        return per_row.expand_as(log_ratio)
    check_same_shape(log_ratio=log_ratio, turn_index=turn_index)
    if turn_index.dtype.is_floating_point:
        raise ValueError(f"turn_index must be an integer tensor, got {turn_index.dtype}")
    turn = turn_index.long()
    if bool(((turn < 0) & (mask > 0)).any()):
        raise ValueError("a token in the loss (response_mask 1) has a negative turn_index")
    turn = turn.clamp(min=0)
    B, T = log_ratio.shape
    K = int(turn.max()) + 1 if turn.numel() else 1
    slot = (torch.arange(B, device=turn.device)[:, None] * K + turn).reshape(-1)
    sums = torch.zeros(B * K, dtype=log_ratio.dtype, device=log_ratio.device).index_add(
        0, slot, (log_ratio * mask).reshape(-1))
    counts = torch.zeros(B * K, dtype=log_ratio.dtype, device=log_ratio.device).index_add(0, slot, mask.reshape(-1))
    return (sums / counts.clamp(min=1))[slot].reshape(B, T)


def level_log_ratio(log_ratio: torch.Tensor, response_mask: torch.Tensor, turn_index: torch.Tensor | None,
                    level: str) -> torch.Tensor:
    """The log-ratio each token's clip sees: its own (``"token"``), its turn's mean (``"turn"``; the whole
    response if ``turn_index`` is None) or the response's mean (``"sequence"``), all ``(B,T)``."""
    if level == "token":
        return log_ratio
    if level == "turn":
        return turn_mean_log_ratio(log_ratio, response_mask, turn_index)
    if level == "sequence":
        return turn_mean_log_ratio(log_ratio, response_mask, None)
    raise ValueError(f"unknown ratio level {level!r}; choose one of {LEVELS}")


def clipping_normalizer(ratio: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, low: float,
                        high: float, kind: str = "bias", coef: float = 1.0) -> torch.Tensor:
    """The clipping-triggered normaliser (a RECONSTRUCTION, see the module docstring), detached.

    ============= ========= ==========================================================
    ratio         ``(B,T)`` the ratio the clip sees (token or turn level)
    advantages    ``(B,T)`` per-token advantages
    response_mask ``(B,T)`` 1 on tokens in the loss
    kind                    ``"bias"``: ``1 / (1 + coef |rho - clip(rho)| |A|)`` per token (the
                            advantage-weighted distance outside the clip range);
                            ``"mass"``: one number, ``sum |A| 1[rho in range] / sum |A|`` over
                            the tokens in the loss, broadcast to ``(B,T)``; ``"none"``: 1
    returns       ``(B,T)`` the factor multiplying each token's surrogate (1 where no ratio
                            left ``[1 - low, 1 + high]``)
    ============= ========= ==========================================================
    """
    check_same_shape(ratio=ratio, advantages=advantages, response_mask=response_mask)
    if coef < 0:
        raise ValueError(f"norm_coef must be >= 0, got {coef}")
    r, a = ratio.detach(), advantages.detach()
    if kind == "none":
        return torch.ones_like(r)
    clipped = r.clamp(1.0 - low, 1.0 + high)
    if kind == "bias":
        return 1.0 / (1.0 + coef * ((r - clipped) * a).abs())
    if kind == "mass":
        mass = a.abs() * response_mask
        total = mass.sum()
        inside = (mass * (r == clipped)).sum()
        share = inside / total if float(total) > 0 else torch.ones((), dtype=r.dtype)
        return share.expand_as(r)
    raise ValueError(f"unknown normalizer {kind!r}; choose one of {NORMALIZERS}")


def compute_turn_ppo_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                          response_mask: torch.Tensor, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                          turn_index: torch.Tensor | None = None, level: str = "turn", normalizer: str = "none",
                          norm_coef: float = 1.0, loss_agg_mode: str = "token-mean", *,
                          global_tokens: float | None = None, global_seqs: float | None = None,
                          max_len: int | None = None):
    """PPO's clipped surrogate with the ratio taken per turn, times the clipping-triggered normaliser.

    ``l_t = w_t * max(-A_t rho_k, -A_t clip(rho_k, 1 - eps_low, 1 + eps_high))`` for token ``t`` of
    turn ``k``, with ``rho_k = exp(mean_{s in k} log(pi_theta(y_s) / mu(y_s)))`` (log-ratios clamped
    to +-20; the gradient flows through every token of the turn) and ``w`` from
    :func:`clipping_normalizer` (detached). ``level="token"`` gives PPO's own token ratio (with
    ``normalizer="none"``, exactly the ``"vanilla"`` loss); ``turn_index=None`` makes the whole response
    one turn.

    ============== ===================== ====================================================
    old_log_prob   ``(B,T)``             behaviour log-probs (no gradient)
    log_prob       ``(B,T)``             current log-probs (gradient)
    advantages     ``(B,T)``             per-token advantages
    response_mask  ``(B,T)``             1 on the agent's tokens; 0 on environment replies and padding
    turn_index     ``(B,T)``             long, from the sampler's ``batch.extras["turn_index"]``
    global_tokens  float                 the whole batch's loss tokens (the loop passes it); with
                   ``normalizer="mass"`` a call that sees fewer (a micro-batch, one process of
                   several, or           the rows left after zero-advantage rows were skipped) is refused
                   with a ValueError,    since the share of ``|A|`` in range would then be the part's,
                   not the batch's       (under ``loss_type="bnpo"`` the loop passes none: that loss
                   type defines          each micro-batch as its own batch, and so does the mass)
    returns                              ``(loss, metrics)``: scalar and floats ``pg_clipfrac`` (share of tokens whose
                                         clip is active), ``ratio_out_frac`` (share whose ratio is outside the range),
                                         ``norm_mean`` (mean normaliser), ``ppo_kl``, ``ratio_mean``
    ============== ===================== ====================================================
    """
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                     response_mask=response_mask)
    if normalizer not in NORMALIZERS:
        raise ValueError(f"unknown normalizer {normalizer!r}; choose one of {NORMALIZERS}")
    if normalizer == "mass" and global_tokens is not None and abs(float(response_mask.sum()) - global_tokens) > 0.5:
        raise ValueError(
            f"the 'mass' normaliser is a statistic of the whole batch, but this call sees "
            f"{float(response_mask.sum()):.0f} of the batch's {global_tokens:.0f} loss tokens (global_tokens): "
            "RLConfig.micro_batch_size, data-parallel processes, or the loop leaving out rows whose advantages "
            "are all zero split the batch, and a per-part share would silently change the loss; train it with "
            "RLConfig(micro_batch_size=None, skip_zero_advantage_rows=False) on one process, or use "
            "normalizer='bias' (per token, exact under any split)")
    log_ratio = (log_prob - old_log_prob.detach()).clamp(-20.0, 20.0)
    lr_level = level_log_ratio(log_ratio, response_mask, turn_index, level).clamp(-20.0, 20.0)
    ratio = torch.exp(lr_level)
    adv = advantages.detach()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    w = clipping_normalizer(ratio, adv, response_mask, clip_ratio_low, clip_ratio_high, normalizer, norm_coef)
    loss = agg_loss(w * torch.maximum(unclipped, clipped), response_mask, loss_agg_mode,
                    global_tokens=global_tokens, global_seqs=global_seqs, max_len=max_len)
    with torch.no_grad():
        r = ratio.detach()
        metrics = {
            "pg_clipfrac": float(masked_mean((clipped > unclipped).float(), response_mask)),
            "ratio_out_frac": float(masked_mean(((r < 1 - clip_ratio_low) | (r > 1 + clip_ratio_high)).float(),
                                                response_mask)),
            "norm_mean": float(masked_mean(w, response_mask)),
            "ppo_kl": float(masked_mean(-log_ratio, response_mask)),
            "ratio_mean": float(masked_mean(r, response_mask)),
        }
    return loss, metrics


compute_turn_ppo_loss.zero_at_zero_advantage = True


@register_policy_loss("turn_ppo")
def turn_ppo_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low: float = 0.2,
                  clip_ratio_high: float = 0.2, turn_index: torch.Tensor | None = None, level: str = "turn",
                  normalizer: str = "none", norm_coef: float = 1.0, loss_agg_mode: str = "token-mean", *,
                  global_tokens: float | None = None, global_seqs: float | None = None, max_len: int | None = None):
    """Turn-level PPO: :func:`compute_turn_ppo_loss` with no normaliser by default."""
    return compute_turn_ppo_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high,
                                 turn_index, level, normalizer, norm_coef, loss_agg_mode,
                                 global_tokens=global_tokens, global_seqs=global_seqs, max_len=max_len)


@register_policy_loss("sorl")
def sorl_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low: float = 0.2,
              clip_ratio_high: float = 0.2, turn_index: torch.Tensor | None = None, level: str = "turn",
              normalizer: str = "bias", norm_coef: float = 1.0, loss_agg_mode: str = "token-mean", *,
              global_tokens: float | None = None, global_seqs: float | None = None, max_len: int | None = None):
    """SO-PPO / SO-GRPO's policy loss: :func:`compute_turn_ppo_loss` with the turn ratio and the
    (reconstructed) ``"bias"`` normaliser by default; ``normalizer="mass"`` is the other candidate."""
    return compute_turn_ppo_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high,
                                 turn_index, level, normalizer, norm_coef, loss_agg_mode,
                                 global_tokens=global_tokens, global_seqs=global_seqs, max_len=max_len)


turn_ppo_loss.zero_at_zero_advantage = sorl_loss.zero_at_zero_advantage = True


# ---------------------------------------------------------------------- variance identities
def log_ratio_variances(token_log_ratio: np.ndarray) -> dict:
    """Sample variances of the token, turn (mean over a turn) and sequence (sum over all turns)
    log-ratios, from ``(N, K, n)`` draws: ``N`` episodes of ``K`` turns of ``n`` tokens."""
    x = np.asarray(token_log_ratio, float)
    if x.ndim != 3:
        raise ValueError(f"token_log_ratio must be (N, K, n), got shape {x.shape}")
    return {"token": float(x.reshape(-1).var(ddof=1)), "turn": float(x.mean(-1).reshape(-1).var(ddof=1)),
            "sequence": float(x.sum((1, 2)).var(ddof=1))}


def log_ratio_variance_theory(s2: float, turn_len: int, turns: int) -> dict:
    """The closed forms for i.i.d. token log-ratios of variance ``s2``: ``s2``, ``s2 / |turn|`` and
    ``|y| s2`` with ``|y| = turns * turn_len``."""
    return {"token": s2, "turn": s2 / turn_len, "sequence": turns * turn_len * s2}


def clip_bias(rho: np.ndarray, adv: np.ndarray, eps: float = 0.2) -> np.ndarray:
    """Per-sample clipping bias ``min(rho A, clip(rho) A) - rho A`` (<= 0): what the clip removes from
    the importance-sampled surrogate."""
    rho, adv = np.broadcast_arrays(np.asarray(rho, float), np.asarray(adv, float))
    return np.minimum(rho * adv, np.clip(rho, 1 - eps, 1 + eps) * adv) - rho * adv

