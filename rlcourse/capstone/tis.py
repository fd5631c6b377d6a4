"""Truncated importance sampling (TIS): training on tokens that another engine sampled.

A rollout engine (vLLM, SGLang, or the book's KV-cached sampler in bfloat16) computes the tokens'
log-probs :math:`\\log\\pi_{\\text{rollout}}` with other kernels than the training forward's
:math:`\\log\\pi_{\\text{old}}`, for the same weights. The tokens were drawn from
:math:`\\pi_{\\text{rollout}}`, so a policy gradient that takes them as samples of
:math:`\\pi_{\\text{old}}` is off-policy by that gap. Yao et al. (2025) weight each token's
policy-gradient term by

.. math:: w_t = \\min\\Big(\\frac{\\pi_{\\text{old}}(y_t)}{\\pi_{\\text{rollout}}(y_t)},\\; C\\Big)
   \\quad\\text{(detached)},

which makes the estimate unbiased for :math:`\\pi_{\\text{old}}`'s gradient when no weight reaches
the cap :math:`C`, and bounds the variance one token can add when some do (verl's rollout
correction and TRL's ``vllm_importance_sampling_cap`` are the same idea).

==================================  ==============================================================
:func:`tis_weights`                 the weights, per token
``"tis"`` (policy-loss registry)    PPO's clipped loss with each token's advantage times its weight
:func:`recording_rollout_logprobs`  a sampler that also hands its log-probs to the loss, as
                                    ``batch.extras["rollout_log_prob"]``
``"policy_recording"`` (samplers)   ``"policy"`` so wrapped
==================================  ==============================================================

With ``RLConfig(old_logprobs="sampler")`` the old log-probs *are* the rollout's and every weight is
1; the correction acts with ``old_logprobs="training"``, where the ratio's denominator is the
training forward's (the capstone's ``tis_cap`` sets all three).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch

from ..losses import compute_policy_loss, register_policy_loss
from ..ops import masked_mean
from ..rollout import policy_sampler, register_sampler


def tis_weights(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, cap: float) -> torch.Tensor:
    """``min(exp(old_log_prob - rollout_log_prob), cap)``, detached: a weight, not a path for the gradient.

    ================ ========= ==============================================
    old_log_prob     ``(B,T)`` the training forward's log-probs (before the update)
    rollout_log_prob ``(B,T)`` the sampler's log-probs of the same tokens
    cap              scalar    ``C > 0``, the largest weight
    returns          ``(B,T)`` the weights, in ``(0, C]``
    ================ ========= ==============================================
    """
    if not cap > 0:
        raise ValueError(f"the TIS cap must be positive, got {cap}")
    if old_log_prob.shape != rollout_log_prob.shape:
        raise ValueError(f"old_log_prob {tuple(old_log_prob.shape)} and rollout_log_prob "
                         f"{tuple(rollout_log_prob.shape)} differ")
    return torch.exp(old_log_prob.detach() - rollout_log_prob.detach()).clamp(max=cap)


@register_policy_loss("tis")
def tis_policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                    response_mask: torch.Tensor, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                    clip_ratio_c: float | None = None, loss_agg_mode: str = "token-mean", *,
                    rollout_log_prob: torch.Tensor | None = None, tis_cap: float = 2.0,
                    global_tokens: float | None = None, global_seqs: float | None = None, max_len: int | None = None):
    """The ``vanilla`` PPO loss (:func:`~rlcourse.losses.compute_policy_loss`) with each token's term
    weighted by :func:`tis_weights`. A weight is positive, so scaling the advantage scales the
    clipped term alike: ``max(-wA r, -wA clip(r)) = w max(-A r, -A clip(r))``. Equal log-probs give
    weights of exactly 1 and the vanilla loss unchanged. Adds the metrics ``tis_weight_mean`` and
    ``tis_capped_frac`` (the share of tokens whose weight the cap cut).

    ================ ========= =====================================
    rollout_log_prob ``(B,T)`` the sampler's log-probs (``batch.extras``; required)
    tis_cap          scalar    ``C``, from ``loss_kwargs``
    (the rest)                 as :func:`~rlcourse.losses.compute_policy_loss`
    ================ ========= =====================================
    """
    if rollout_log_prob is None:  # without them every weight would silently be 1
        raise ValueError("the 'tis' loss needs the sampler's log-probs as batch.extras['rollout_log_prob']: use "
                         "sampler='policy_recording', or wrap a sampler with recording_rollout_logprobs")
    weights = tis_weights(old_log_prob, rollout_log_prob, tis_cap)
    loss, metrics = compute_policy_loss(old_log_prob, log_prob, advantages * weights, response_mask, clip_ratio_low,
                                        clip_ratio_high, clip_ratio_c, loss_agg_mode, global_tokens=global_tokens,
                                        global_seqs=global_seqs, max_len=max_len)
    metrics["tis_weight_mean"] = float(masked_mean(weights, response_mask))
    capped = (old_log_prob - rollout_log_prob).detach() > math.log(tis_cap)
    metrics["tis_capped_frac"] = float(masked_mean(capped.float(), response_mask))
    return loss, metrics


tis_policy_loss.zero_at_zero_advantage = True  # a zero advantage stays zero when weighted


def recording_rollout_logprobs(sampler):
    """``sampler`` whose batches also carry their own log-probs as ``extras["rollout_log_prob"]``,
    which is how they reach the ``"tis"`` loss (the trainer passes a loss the extras it names)."""
    @functools.wraps(sampler)
    def recording(*args, **kwargs):
        batch = sampler(*args, **kwargs)
        return dataclasses.replace(batch, extras={**batch.extras, "rollout_log_prob": batch.logprobs})
    return recording


register_sampler("policy_recording")(recording_rollout_logprobs(policy_sampler))
