"""How the loop calls its parts: each gets the arguments its signature names.

The trainer (:class:`~rlcourse.train.Trainer`) offers every part the same set of arguments for its
kind and passes each part only those its signature names (all of them to a part with ``**kwargs``),
so a part is an ordinary function whose parameters say what it uses. A configured keyword a part does
not take is an error (:func:`check_accepts`), never dropped in silence. Wrapper samplers (``replay``,
``pipo``, ``repexp``) call the sampler they wrap through :func:`call_sampler`, the way the loop does.

=========================== ===================================================================
:func:`call_with_supported` samplers, prompt samplers, advantage estimators
:func:`call_sampler`        a sampler with configured keywords (checked)
:func:`bind_reward`         a reward, with the loop's context it names
:func:`call_policy_loss`    a policy loss, with the aggregation keywords
=========================== ===================================================================
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable

# the arguments the loop passes to every policy loss (an extra of the same name would shadow one)
LOSS_ARGUMENTS = {"old_log_prob", "log_prob", "advantages", "response_mask", "clip_ratio_low", "clip_ratio_high",
                  "clip_ratio_c", "loss_agg_mode", "global_tokens", "global_seqs", "max_len"}


def call_with_supported(fn: Callable, **available):
    """Call ``fn`` with the keyword arguments its signature accepts (all of them if it takes ``**kw``)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**available)
    return fn(**{k: v for k, v in available.items() if k in params})


REWARD_CONTEXT = ("model", "tokenizer", "ref_model", "step")


def bind_reward(fn: Callable, reward_kwargs: dict, **context) -> Callable:
    """The loop's reward as ``fn(batch, examples, task, state)``, with the context the reward names.

    A reward that declares a parameter called ``model``, ``tokenizer``, ``ref_model`` (None when the
    KL term is off) or ``step`` receives the loop's current one (a self-reward scores with the policy,
    a scheduled bonus reads the step); ``reward_kwargs`` from the config reach it too. A reward that
    names none of them is returned unchanged, so samplers that call the reward themselves see the same
    function the loop scores with."""
    params = inspect.signature(fn).parameters
    extra = {key: v for key, v in context.items() if key in params}
    extra.update(reward_kwargs)
    return functools.partial(fn, **extra) if extra else fn


# the arguments the loop passes to every sampler (a sampler takes those it names)
SAMPLER_ARGUMENTS = ("model", "tokenizer", "prompts", "config", "generator", "state", "examples", "pool", "task",
                     "reward", "step")


def call_sampler(fn: Callable, loop: dict, kwargs: dict, what: str = "sampler_kwargs"):
    """Call a sampler as the loop does: the loop's arguments ``loop`` that ``fn`` names, plus the
    configured ``kwargs``. A key of ``kwargs`` that the loop gives, or one that ``fn`` does not take,
    is a ValueError naming ``what`` (a wrapper sampler passes its ``base_kwargs`` through here)."""
    given = sorted(set(kwargs) & set(SAMPLER_ARGUMENTS))
    if given:
        raise ValueError(f"{what} {given} are given by the loop")
    check_accepts(fn, kwargs, what)
    return call_with_supported(fn, **loop, **kwargs)


def call_base_sampler(wrapper: str, wrapper_fn: Callable, base: str, base_kwargs: dict | None, scope: dict):
    """The sampler that a wrapper sampler (``replay``, ``pipo``, ``repexp``) wraps, called as the loop calls
    a sampler: the loop's arguments are read from ``scope`` (the wrapper's own parameters, which carry
    the same names: pass ``locals()``), and ``base_kwargs`` configure the base. A wrapper cannot wrap
    itself."""
    from .rollout import get_sampler

    base_fn = get_sampler(base)
    if base_fn is wrapper_fn:
        raise ValueError(f"the {wrapper} sampler's base cannot be {wrapper!r} itself")
    loop = {name: scope[name] for name in SAMPLER_ARGUMENTS}
    return call_sampler(base_fn, loop, base_kwargs or {}, f"the {wrapper} sampler's base_kwargs")


def call_policy_loss(loss: Callable, agg: dict, **named):
    """Call a policy loss with the arguments its signature names. The aggregation keywords in ``agg``
    (``loss_agg_mode``, ``global_tokens``, ``global_seqs``, ``max_len``) also reach a ``**kwargs``
    parameter, which is how a loss forwards them to :func:`~rlcourse.losses.agg_loss`; the clip
    arguments reach only a loss that names them (``pg`` has no clip range)."""
    params = inspect.signature(loss).parameters
    kwargs = {key: v for key, v in {**named, **agg}.items() if key in params}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs.update(agg)
    return loss(**kwargs)


def check_accepts(fn: Callable, kwargs: dict, what: str) -> None:
    """Raise a ValueError naming the keywords of ``kwargs`` that ``fn`` does not take (a misspelt
    knob in a config must not be dropped in silence)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        name = getattr(fn, "__name__", repr(fn))
        raise ValueError(f"{what} {unknown} are not parameters of {name}; it takes {sorted(params)}")


def needs_values(estimator: Callable) -> bool:
    return "values" in inspect.signature(estimator).parameters
