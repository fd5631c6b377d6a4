"""One off-policy loss for rollouts drawn from a behaviour distribution other than the policy.

Two chapters draw their training rollouts from a distribution ``mu`` that is not the policy ``pi``
and correct for it with the same weight ``w = pi_old / mu``: CUTS (arXiv:2604.18493; ``mu`` is
uniform over a candidate set on the exploratory rows) and R2PO (arXiv:2601.11960; ``mu`` is the
policy plus its residual rollout head). Both read ``log mu(y_t)`` from the sampler's
``extras["behaviour_logprob"]``. The loss is registered once, as ``"behaviour_is"``; the names the
chapters use stay as aliases with their chapter's defaults: ``"cuts_is"`` (``is_cap=2``) and
``"r2po"`` (no cap).
"""
from __future__ import annotations

import inspect
import math

import torch

from ..losses import compute_policy_loss, register_policy_loss
from ..ops import check_same_shape, masked_mean

IS_LEVELS = ("token", "sequence")


def behaviour_weights(old_log_prob: torch.Tensor, behaviour_logprob: torch.Tensor, response_mask: torch.Tensor,
                      is_level: str = "token", is_cap: float | None = None) -> torch.Tensor:
    """The importance weights ``w = pi_old / mu`` of drawn tokens, without gradient.

    ``is_level="token"``: ``w_t = exp(old_t - behaviour_t)``, each token's own ratio; ``"sequence"``:
    one weight per row, ``exp(sum_t (old_t - behaviour_t))`` over the response (unbiased for the
    sequence, higher variance). ``is_cap`` truncates ``w`` (None: no cap). Masked positions get weight 1.

    ==================  =========  ==================================================
    old_log_prob        ``(B,T)``  ``log pi_old(y_t)``, the policy at sampling
    behaviour_logprob   ``(B,T)``  ``log mu(y_t)``, the distribution that drew the token
    response_mask       ``(B,T)``  1 on response tokens
    returns             ``(B,T)``  ``w``, finite and > 0
    ==================  =========  ==================================================
    """
    if is_level not in IS_LEVELS:
        raise ValueError(f"is_level must be one of {IS_LEVELS}, got {is_level!r}")
    if is_cap is not None and not is_cap > 0:
        raise ValueError(f"is_cap must be positive or None, got {is_cap}")
    check_same_shape(behaviour_logprob=behaviour_logprob, old_log_prob=old_log_prob, response_mask=response_mask)
    log_w = ((old_log_prob - behaviour_logprob) * response_mask).detach()
    if is_level == "sequence":
        log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)
    top = 20.0 if is_cap is None or not math.isfinite(is_cap) else min(20.0, math.log(is_cap))
    return torch.exp(log_w.clamp(max=top))


@register_policy_loss("behaviour_is")
def compute_behaviour_is_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                              response_mask: torch.Tensor, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                              clip_ratio_c: float | None = None, loss_agg_mode: str = "token-mean", *,
                              behaviour_logprob: torch.Tensor | None = None, is_level: str = "token",
                              is_cap: float | None = None, global_tokens: float | None = None,
                              global_seqs: float | None = None, max_len: int | None = None):
    """PPO-clip on rollouts drawn from a behaviour distribution ``mu``, corrected by ``w = pi_old / mu``
    (:func:`behaviour_weights`): the ``"vanilla"`` loss with advantages ``w * A`` (for ``w >= 0``
    weighting the advantage and weighting the clipped surrogate are the same). Without
    ``behaviour_logprob`` (a sampler that draws from the policy) ``w = 1``: the vanilla loss.

    ==================  =========  =================================================
    old_log_prob        ``(B,T)``  ``log pi_old(y_t)``, the policy at sampling
    log_prob            ``(B,T)``  ``log pi_theta(y_t)`` (gradient)
    advantages          ``(B,T)``
    response_mask       ``(B,T)``
    behaviour_logprob   ``(B,T)``  ``log mu(y_t)`` of the drawn tokens, or None
    is_level, is_cap               see :func:`behaviour_weights`
    global_tokens, ...             the aggregation's global denominators, as in ``"vanilla"``
    returns                        ``(loss, metrics)``: the vanilla metrics plus
                                   ``behaviour_is_weight`` (mean w) and ``behaviour_is_weight_max``
    ==================  =========  =================================================
    """
    w = torch.ones_like(advantages)
    if behaviour_logprob is not None:
        check_same_shape(behaviour_logprob=behaviour_logprob, advantages=advantages)
        w = behaviour_weights(old_log_prob, behaviour_logprob, response_mask, is_level, is_cap)
    elif is_level not in IS_LEVELS or (is_cap is not None and not is_cap > 0):
        behaviour_weights(old_log_prob, old_log_prob, response_mask, is_level, is_cap)  # the same errors
    loss, metrics = compute_policy_loss(old_log_prob, log_prob, advantages * w, response_mask,
                                        clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high,
                                        clip_ratio_c=clip_ratio_c, loss_agg_mode=loss_agg_mode,
                                        global_tokens=global_tokens, global_seqs=global_seqs, max_len=max_len)
    metrics = dict(metrics)
    metrics["behaviour_is_weight"] = float(masked_mean(w, response_mask))
    metrics["behaviour_is_weight_max"] = float((w * response_mask).max())
    return loss, metrics


compute_behaviour_is_loss.zero_at_zero_advantage = True


def behaviour_is_alias(name: str, **defaults):
    """Register ``"behaviour_is"`` under another ``name`` with other defaults (e.g. ``is_cap=2.0``) and
    return it: the same implementation, so two chapters' names cannot drift apart. The alias's
    signature shows the new defaults (the trainer passes arguments by the signature)."""
    sig = inspect.signature(compute_behaviour_is_loss)
    unknown = set(defaults) - set(sig.parameters)
    if unknown:
        raise ValueError(f"behaviour_is has no parameter(s) {sorted(unknown)}")

    def loss(*args, **kwargs):
        return compute_behaviour_is_loss(*args, **{**defaults, **kwargs})

    loss.__signature__ = sig.replace(parameters=[p.replace(default=defaults.get(p.name, p.default))
                                                 for p in sig.parameters.values()])
    loss.__name__ = loss.__qualname__ = f"compute_{name}_loss"
    loss.__doc__ = (f"The ``\"behaviour_is\"`` loss (:func:`compute_behaviour_is_loss`) registered as ``{name!r}`` "
                    f"with defaults {defaults}.")
    loss.zero_at_zero_advantage = True
    return register_policy_loss(name)(loss)
