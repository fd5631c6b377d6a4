"""A stale behaviour policy for single-turn sampling: the registered ``"lagged"`` sampler.

Off-policy losses (GIPO's Gaussian weight, SAPO's gate, PPO's clip with ``num_iterations = 1``) only
differ from the policy gradient when the ratio ``pi_theta / mu`` is not 1 on the first pass, that is
when the batch was sampled by a policy ``mu`` other than the one being trained. The ``"lagged"``
sampler makes that happen in the language-model loop without a replay buffer or a multi-turn
environment: it samples each step's groups with the policy as it was ``lag`` steps ago, the way an
asynchronous trainer's inference engine runs a few updates behind the learner, and records that
policy's log-probs as the batch's ``logprobs`` (the loss's ``old_log_prob``).

================================ ==============================================================
:func:`trainable_weights`        the weights a snapshot keeps: the parameters that train
:func:`behaviour_policy`         a scratch copy of the model holding a snapshot's weights
``"lagged"`` sampler             a base sampler run by the policy of ``lag`` steps ago
================================ ==============================================================

The snapshots are detached CPU copies (:func:`~rlcourse.snapshots.push_lagged`) kept in the
sampler's ``state``, which the trainer checkpoints, so a resumed run samples with the same behaviour
policy as an uninterrupted one.
"""
from __future__ import annotations

import copy
import numbers
import weakref
from dataclasses import replace

import torch

from .lm.sampling import RolloutBatch
from .parts import call_base_sampler
from .rollout import register_sampler
from .snapshots import push_lagged

STATE_KEY = "lagged"
_SCRATCH: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> a copy to load old weights into


def trainable_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters of ``model`` that train (``requires_grad``), by their ``state_dict`` names.

    These are the only weights an optimiser changes, so they are all a snapshot of a past policy
    needs: for a full fine-tune every parameter, for a LoRA (``peft``) model the adapter's ``lora_A``
    and ``lora_B`` matrices alone (the frozen base weights are those of the current model).

    ======  =======================================================
    model   ``nn.Module``
    return  ``{name: tensor}``, the live parameters (not copies)
    ======  =======================================================
    """
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def behaviour_policy(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A scratch copy of ``model`` (made once per model, in eval mode, without gradients) holding
    ``weights`` (a :func:`trainable_weights` snapshot) and the current values of every other weight.

    ========  ==========================================================================
    model     the policy being trained
    weights   ``{name: tensor}`` on any device; every name must be a parameter of ``model``
    return    the scratch model (the same object on every call for the same ``model``)
    ========  ==========================================================================

    The frozen weights of the scratch copy are those of ``model`` when the copy was first made; the
    loop never changes frozen weights, so they stay equal.
    """
    scratch = _SCRATCH.get(model)
    if scratch is None:
        scratch = _SCRATCH[model] = copy.deepcopy(model).eval().requires_grad_(False)
    missing, unexpected = scratch.load_state_dict(weights, strict=False)
    if unexpected:
        raise ValueError(f"the snapshot holds weights the model does not have: {sorted(unexpected)[:5]}")
    return scratch


def check_lag(lag) -> int:
    """``lag`` as an ``int`` if it is an integer ``>= 0`` (a ``bool`` is refused), else a ValueError."""
    if isinstance(lag, bool) or not isinstance(lag, numbers.Integral) or lag < 0:
        raise ValueError(f"the lagged sampler's lag must be an integer >= 0 (steps behind the learner), got {lag!r}")
    return int(lag)


@register_sampler("lagged")
def lagged_sampler(model, tokenizer, prompts, config, generator, state, examples, pool, task, reward, step,
                   lag: int = 1, base: str = "policy", base_kwargs: dict | None = None) -> RolloutBatch:
    """The ``base`` sampler's batch, sampled by the policy of ``lag`` steps ago (the behaviour policy
    ``mu``), with ``mu``'s log-probs as the batch's ``logprobs``. ``lag = 0`` returns the base
    sampler's batch unchanged.

    ============ ========= ==============================================================
    lag          int       steps the behaviour policy is behind, ``>= 0``; with
                           ``config.num_iterations = mu`` that is ``lag * mu`` optimiser
                           updates (exactly ``lag`` updates at the default ``mu = 1``)
    base         str       the sampler that draws the rows (registry name; not ``"lagged"``)
    base_kwargs  dict      its own keywords (a keyword it does not take is a ValueError)
    returns      batch     the base's rows; ``logprobs`` ``(B,T)`` are ``log mu``; ``entropy``
                           None when ``lag > 0`` (it would be ``mu``'s, so the trainer
                           computes the current policy's); ``metrics["behaviour_lag"]``: the
                           steps the behaviour policy is actually behind
    ============ ========= ==============================================================

    Each call stores a snapshot of the current policy's :func:`trainable_weights` (detached, on the
    CPU) in ``state["lagged"]`` and keeps the newest ``lag + 1``; the oldest of them samples. Before
    ``lag`` steps have been made the oldest snapshot there is serves (the first steps are less stale:
    ``behaviour_lag`` grows ``0, 1, ..., lag``). With a LoRA model a snapshot is the adapter alone.
    The base sees the behaviour policy as its ``model``, so whatever it records from the model (log-
    probs, extras) is ``mu``'s. ``old_logprobs="training"`` would replace ``mu``'s log-probs by the
    learner's and is refused when ``lag > 0``, as is a different ``lag`` on a state built with another.
    """
    lag = check_lag(lag)
    if lag == 0:
        return call_base_sampler("lagged", lagged_sampler, base, base_kwargs, locals())
    if config.old_logprobs != "sampler":
        raise ValueError(f"the lagged sampler records the behaviour policy's log-probs, which old_logprobs="
                         f"{config.old_logprobs!r} replaces by the learner's: use old_logprobs='sampler'")
    memo = state.setdefault(STATE_KEY, {"lag": lag, "weights": [], "steps": []})
    if memo["lag"] != lag:
        raise ValueError(f"state['{STATE_KEY}'] holds snapshots for lag {memo['lag']}, not {lag}")
    oldest = push_lagged(memo["weights"], trainable_weights(model), lag)
    memo["steps"] = (memo["steps"] + [step])[-(lag + 1):]
    behaviour = behaviour_policy(model, oldest)
    batch = call_base_sampler("lagged", lagged_sampler, base, base_kwargs, {**locals(), "model": behaviour})
    if "behaviour_lag" in batch.metrics:
        raise ValueError("the base sampler already records the metric 'behaviour_lag'; the lagged sampler sets it")
    return replace(batch, entropy=None, metrics={**batch.metrics, "behaviour_lag": float(step - memo["steps"][0])})
