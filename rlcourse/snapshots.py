"""Past policies kept for stale (off-policy) sampling: one helper for every chapter that samples with
an old policy.

Four places sample with a policy that is behind the one being trained: the GIPO bandit and the SORL
lock (tabular logits, ``L`` steps behind), the ``multiturn`` sampler (a language model ``lag`` calls
behind) and the checkpoint bank (:mod:`rlcourse.bank`, snapshots every ``K`` versions). All of them
keep *detached CPU copies* of weights (so a checkpoint of the sampler's state holds them and a resumed
run samples with the same behaviour policy) in a list that drops its oldest entries.

================================ ==============================================================
:func:`detached_copy`            a detached CPU copy of a tensor, a state dict, or a module's weights
:func:`push_lagged`              keep the newest ``lag + 1`` copies; return the one ``lag`` pushes old
================================ ==============================================================
"""
from __future__ import annotations

from typing import Any

import torch


def detached_copy(x: Any) -> Any:
    """A detached CPU copy of ``x``: a tensor, a ``{name: tensor}`` state dict, or a module (whose
    ``state_dict()`` is copied). Anything else is a TypeError naming its type.

    ======  =======================================================
    x       ``torch.Tensor``, ``dict[str, Tensor]`` or ``nn.Module``
    return  the same kind (a module gives a state dict), on the CPU
    ======  =======================================================
    """
    if isinstance(x, torch.nn.Module):
        x = x.state_dict()
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, dict) and all(isinstance(v, torch.Tensor) for v in x.values()):
        return {k: v.detach().to("cpu", copy=True) for k, v in x.items()}
    raise TypeError(f"detached_copy takes a tensor, a state dict of tensors or a module, got {type(x).__name__}")


def push_lagged(kept: list, x: Any, lag: int) -> Any:
    """Append a :func:`detached_copy` of ``x`` (the current policy) to ``kept``, keep only the newest
    ``lag + 1`` entries, and return the oldest kept: the policy of ``lag`` pushes ago, or the oldest
    there is before ``lag`` pushes have been made.

    ======  ======  ===========================================================
    kept    list    the history, oldest first (modified in place)
    x               the current weights (see :func:`detached_copy`)
    lag     int     how many pushes behind the returned policy is, ``>= 0``
    return          ``kept[0]`` after the push
    ======  ======  ===========================================================
    """
    if not isinstance(lag, int) or isinstance(lag, bool) or lag < 0:
        raise ValueError(f"lag must be an integer >= 0, got {lag!r}")
    if not isinstance(kept, list):
        raise TypeError(f"kept must be a list (the history, oldest first), got {type(kept).__name__}")
    kept.append(detached_copy(x))
    del kept[:-(lag + 1)]
    return kept[0]
