"""Losses of the loop: KL estimators, loss aggregation, policy losses (a registry), value and
Bradley-Terry losses. Every loss is minimised: the policy-gradient term is ``-A * ratio``, a KL
penalty is *added* and an entropy bonus *subtracted*.

Aggregation modes use verl's names; TRL's ``loss_type`` names map onto them:

============================ ============================================ ======================
mode (verl)                  loss                                          TRL ``loss_type``
============================ ============================================ ======================
``token-mean``               sum of token losses / number of tokens        ``dapo`` (global), ``bnpo`` (local)
``seq-mean-token-mean``      mean over sequences of their token mean       ``grpo``
``seq-mean-token-sum``       mean over sequences of their token sum        -
``seq-mean-token-sum-norm``  sum of token losses / (B x T_max)             ``dr_grpo``
============================ ============================================ ======================

The names are verl's, but one denominator is not: verl's own ``agg_loss`` (``verl/trainer/ppo/
core_algos.py``, e.g. at commit 012be9d9) computes ``seq-mean-token-sum-norm`` as the *sum* over
sequences of their token sums divided by ``loss_mask.shape[-1]`` (T_max) alone, while ours divides by
B x T_max, as TRL's ``loss_type="dr_grpo"`` does. The two differ by the factor B (the number of
sequences in the batch): same direction, a B-times larger gradient in verl, which its learning rate
(or gradient clipping) absorbs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .ops import check_same_shape, masked_mean
from .registry import Registry

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LOSS_TYPE_TO_AGG = {"dapo": "token-mean", "bnpo": "token-mean", "grpo": "seq-mean-token-mean",
                    "dr_grpo": "seq-mean-token-sum-norm"}
KL_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3", "low_var_kl+": "k3+"}


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimators of KL(pi || pi_ref) from samples of pi, with
    :math:`\\Delta = \\log\\pi(y_t) - \\log\\pi_{\\text{ref}}(y_t)`:

    ======== =========================================== ====================================
    kind     value                                       note
    ======== =========================================== ====================================
    ``k1``   :math:`\\Delta`                              unbiased value; can be negative
    ``k2``   :math:`\\tfrac12\\Delta^2`           biased   value; its gradient is the KL's
    ``k3``   :math:`e^{-\\Delta} + \\Delta - 1`   unbiased value, always >= 0 (clamped to 10)
    ``k3+``  k3's value, k2's gradient                   straight-through (verl)
    ======== =========================================== ====================================

    ============ ========= =====================================
    logprob      ``(B,T)`` log pi(y_t), with gradient
    ref_logprob  ``(B,T)`` log pi_ref(y_t), no gradient needed
    returns      ``(B,T)`` per-token estimate (unmasked)
    ============ ========= =====================================
    """
    check_same_shape(logprob=logprob, ref_logprob=ref_logprob)
    kind = KL_ALIASES.get(kind, kind)
    delta = logprob.float() - ref_logprob.float()
    if kind == "k1":
        return delta
    if kind == "k2":
        return 0.5 * delta**2
    if kind in ("k3", "k3+"):
        k3 = (torch.exp(-delta.clamp(-20, 20)) + delta - 1).clamp(-10, 10)
        if kind == "k3":
            return k3
        k2 = 0.5 * delta**2
        return k2 + (k3 - k2).detach()
    raise ValueError(f"unknown KL estimator {kind!r}; choose k1, k2, k3, k3+ (or kl, mse, low_var_kl)")


def agg_denominators(response_mask: torch.Tensor) -> dict:
    """Denominators over the *whole* optimisation batch, to pass to :func:`agg_loss` for each
    micro-batch so that the summed micro-batch losses equal the full-batch loss."""
    return {"global_tokens": float(response_mask.sum()),
            "global_seqs": float((response_mask.sum(-1) > 0).sum())}


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, mode: str = "token-mean", *,
             global_tokens: float | None = None, global_seqs: float | None = None,
             max_len: int | None = None) -> torch.Tensor:
    """Aggregate a ``(B, T)`` matrix of per-token losses into a scalar.

    Without the ``global_*`` arguments the denominators are those of this batch. With them (from
    :func:`agg_denominators` on the full batch), a micro-batch's result is its share of the
    full-batch loss: summing over micro-batches gives exactly the full-batch loss and gradient.
    Sequences with an empty mask are excluded from the sequence count.

    ========== ========= ===============================================
    loss_mat   ``(B,T)`` per-token loss
    loss_mask  ``(B,T)`` 1 where the token counts
    max_len    int       T_max for ``seq-mean-token-sum-norm`` (TRL: max_completion_length);
                         default: this batch's T
    returns    scalar
    ========== ========= ===============================================
    """
    check_same_shape(loss_mat=loss_mat, loss_mask=loss_mask)
    mask = loss_mask.to(loss_mat.dtype)
    masked = loss_mat * mask
    n_seqs = global_seqs if global_seqs is not None else (mask.sum(-1) > 0).sum().clamp(min=1)
    if mode == "token-mean":
        return masked.sum() / (global_tokens if global_tokens is not None else mask.sum().clamp(min=1))
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1)
        return per_seq.sum() / n_seqs
    if mode == "seq-mean-token-sum":
        return masked.sum() / n_seqs
    if mode == "seq-mean-token-sum-norm":
        T = max_len if max_len is not None else loss_mat.shape[-1]
        B = global_seqs if global_seqs is not None else loss_mat.shape[0]
        return masked.sum() / (B * T)
    raise ValueError(f"unknown loss aggregation mode {mode!r}; choose one of {AGG_MODES} "
                     f"(TRL names: {sorted(LOSS_TYPE_TO_AGG)})")


POLICY_LOSSES: Registry = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register
get_policy_loss = POLICY_LOSSES.get


@register_policy_loss("vanilla")
def compute_policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                        response_mask: torch.Tensor, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                        clip_ratio_c: float | None = None, loss_agg_mode: str = "token-mean", *,
                        global_tokens: float | None = None, global_seqs: float | None = None,
                        max_len: int | None = None):
    """PPO's clipped surrogate, per token, aggregated by ``loss_agg_mode``.

    :math:`\\ell_t = \\max(-A_t\\rho_t,\\; -A_t\\,\\mathrm{clip}(\\rho_t, 1-\\epsilon_{low}, 1+\\epsilon_{high}))`
    with :math:`\\rho_t = \\exp(\\log\\pi_\\theta - \\log\\pi_{old})` (log-ratio clamped to +-20). With
    ``clip_ratio_c`` (dual clip, > 1), tokens with :math:`A_t < 0` are further capped at
    :math:`-A_t c`.

    ============== ========= ===============================================
    old_log_prob   ``(B,T)`` log-probs at sampling time (no gradient)
    log_prob       ``(B,T)`` log-probs of the current policy (gradient)
    advantages     ``(B,T)`` per-token advantages
    response_mask  ``(B,T)`` 1 on tokens that count
    returns                  ``(loss, metrics)``: scalar, dict of floats
                             (pg_clipfrac, pg_clipfrac_lower, ppo_kl, ratio_mean)
    ============== ========= ===============================================
    """
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                     response_mask=response_mask)
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual clip, got {clip_ratio_c}")
    log_ratio = (log_prob - old_log_prob.detach()).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    adv = advantages.detach()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_mat = torch.maximum(unclipped, clipped)
    lower = torch.zeros_like(loss_mat, dtype=torch.bool)
    if clip_ratio_c is not None:
        capped = torch.minimum(loss_mat, -adv * clip_ratio_c)
        lower = (adv < 0) & (capped < loss_mat)
        loss_mat = torch.where(adv < 0, capped, loss_mat)
    loss = agg_loss(loss_mat, response_mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs,
                    max_len=max_len)
    mask = response_mask
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": float(masked_mean((clipped > unclipped).float(), mask)),
            "pg_clipfrac_lower": float(masked_mean(lower.float(), mask)),
            "ppo_kl": float(masked_mean(-log_ratio, mask)),
            "ratio_mean": float(masked_mean(ratio, mask)),
        }
    return loss, metrics


# a row whose advantages are all zero gets exactly zero gradient from this loss (the trainer may skip it)
compute_policy_loss.zero_at_zero_advantage = True


@register_policy_loss("pg")
def compute_pg_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode: str = "token-mean", *,
                    global_tokens: float | None = None, global_seqs: float | None = None,
                    max_len: int | None = None):
    """The plain policy-gradient surrogate :math:`-A_t\\rho_t` (no clipping). On-policy, its gradient
    is REINFORCE's :math:`-A_t\\nabla\\log\\pi_\\theta(y_t)`. It takes no clip range: the trainer
    passes a loss only the arguments its signature names (a loss with ``**kwargs`` gets them all)."""
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                     response_mask=response_mask)
    log_ratio = (log_prob - old_log_prob.detach()).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss = agg_loss(-advantages.detach() * ratio, response_mask, loss_agg_mode, global_tokens=global_tokens,
                    global_seqs=global_seqs, max_len=max_len)
    with torch.no_grad():
        metrics = {"pg_clipfrac": 0.0, "pg_clipfrac_lower": 0.0, "ppo_kl": float(masked_mean(-log_ratio, response_mask)),
                   "ratio_mean": float(masked_mean(ratio, response_mask))}
    return loss, metrics


compute_pg_loss.zero_at_zero_advantage = True


def compute_value_loss(vpreds: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor,
                       response_mask: torch.Tensor, cliprange_value: float | None = 0.2,
                       loss_agg_mode: str = "token-mean", **agg_kwargs):
    """PPO's clipped value loss: :math:`\\tfrac12\\max((V-R)^2, (V_{old} + \\mathrm{clip}(V - V_{old},
    \\pm c) - R)^2)` per token, aggregated like the policy loss.

    ============== ========= =====================================
    vpreds         ``(B,T)`` current critic values (gradient)
    returns        ``(B,T)`` targets (no gradient)
    old_values     ``(B,T)`` critic values at sampling time
    response_mask  ``(B,T)`` 1 on tokens that count
    returns                  ``(loss, clipfrac)``
    ============== ========= =====================================
    """
    check_same_shape(vpreds=vpreds, returns=returns, old_values=old_values, response_mask=response_mask)
    target = returns.detach()
    unclipped = (vpreds - target) ** 2
    if cliprange_value is None:
        return 0.5 * agg_loss(unclipped, response_mask, loss_agg_mode, **agg_kwargs), 0.0
    clipped_v = old_values.detach() + (vpreds - old_values.detach()).clamp(-cliprange_value, cliprange_value)
    clipped = (clipped_v - target) ** 2
    loss = 0.5 * agg_loss(torch.maximum(unclipped, clipped), response_mask, loss_agg_mode, **agg_kwargs)
    clipfrac = float(masked_mean((clipped > unclipped).float(), response_mask))
    return loss, clipfrac


def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor, margin: torch.Tensor | None = None):
    """Negative log-likelihood of the Bradley-Terry model,
    :math:`-\\log\\sigma(r_{chosen} - r_{rejected} - m)`, averaged over pairs.

    ========== ======== ==============================
    r_chosen   ``(N,)`` reward of the preferred answer
    r_rejected ``(N,)`` reward of the other answer
    margin     ``(N,)`` optional required margin
    ========== ======== ==============================
    """
    check_same_shape(r_chosen=r_chosen, r_rejected=r_rejected)
    diff = r_chosen - r_rejected
    if margin is not None:
        check_same_shape(r_chosen=r_chosen, margin=margin)
        diff = diff - margin
    return -F.logsigmoid(diff).mean()
