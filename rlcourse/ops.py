"""Masked reductions and group statistics over response-aligned ``(B, T)`` tensors."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def check_same_shape(**tensors: torch.Tensor) -> None:
    """Raise a ValueError naming the tensors whose shapes differ (nothing is broadcast)."""
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError("shape mismatch: " + ", ".join(f"{k} {s}" for k, s in shapes.items()))


def check_finite(name: str, x: torch.Tensor) -> None:
    if not torch.isfinite(x).all():
        bad = (~torch.isfinite(x)).nonzero()[:5].tolist()
        raise FloatingPointError(f"{name} contains NaN or inf (first positions {bad})")


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (0 where the mask is empty)."""
    return masked_sum(x, mask, dim) / mask.sum(dim).clamp(min=1) if dim is not None else \
        masked_sum(x, mask) / mask.sum().clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    mean = masked_mean(x, mask)
    n = mask.sum()
    var = masked_sum((x - mean) ** 2, mask) / n.clamp(min=1)
    if unbiased:
        if n < 2:
            raise ValueError("unbiased variance needs at least 2 unmasked values")
        var = var * n / (n - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise ``x`` to unit variance over the mask (and zero mean if ``shift_mean``)."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    return out if shift_mean else out + mean


def as_index(index: torch.Tensor | np.ndarray | Sequence | None, batch_size: int) -> torch.Tensor:
    """Group ids as a ``(B,)`` long tensor. Accepts a tensor, a NumPy array or a list, of integers or of
    string uids (as verl's ``index``). Raises if it is missing or its length is not ``batch_size``."""
    if index is None:
        raise ValueError("index (the group id of each row) is required")
    if isinstance(index, torch.Tensor):
        idx = index.detach().cpu()
    else:
        arr = np.asarray(index)
        if arr.dtype.kind not in "iu":  # e.g. string uids as in verl: map to integers
            _, arr = np.unique(arr, return_inverse=True)
        idx = torch.as_tensor(arr)
    idx = idx.long().reshape(-1)
    if idx.numel() != batch_size:
        raise ValueError(f"index has {idx.numel()} entries but the batch has {batch_size} rows")
    return idx


def group_stats(scores: torch.Tensor, index: torch.Tensor, min_size: int = 1, unbiased: bool = True):
    """Per-row group size, mean and standard deviation of ``scores`` within the row's group: the one
    implementation of group statistics in the package.

    The standard deviation is the unbiased (Bessel, divide by n-1) one by default, because that is
    what GRPO's group normalisation uses in TRL and verl (``torch.std``), so the advantages here
    equal theirs; with G = 2 the two differ by a factor sqrt(2), which is not a detail.
    ``unbiased=False`` gives the population std (divide by n), for methods defined with it.
    A group of one has std 0 either way.

    ======== ========== ===========================================
    scores   ``(B,)``   one scalar per row, or ``(B, R)``: R columns, each normalised on its own
    index    ``(B,)``   long group id of each row
    returns             ``(count, mean, std)``, each ``(B,)`` (count) and shaped like ``scores``
    ======== ========== ===========================================
    """
    if scores.ndim not in (1, 2) or index.shape != scores.shape[:1]:
        raise ValueError(f"scores must be (B,) or (B, R) and index (B,); got {tuple(scores.shape)} and "
                         f"{tuple(index.shape)}")
    _, inverse = torch.unique(index, return_inverse=True)
    n_groups = int(inverse.max()) + 1
    s = scores.double()
    cols = s.shape[1:]
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inverse, torch.ones(len(s), dtype=torch.float64))
    if min_size > 1 and (count < min_size).any():
        g = int(index[(count[inverse] < min_size).nonzero()[0, 0]])
        raise ValueError(f"group {g} has {int(count[inverse][(index == g).nonzero()[0, 0]])} sample(s); "
                         f"this estimator needs at least {min_size} per group (G >= {min_size})")
    c = count.reshape(-1, *([1] * len(cols)))
    total = torch.zeros(n_groups, *cols, dtype=torch.float64).index_add_(0, inverse, s)
    mean = total / c
    sq = torch.zeros(n_groups, *cols, dtype=torch.float64).index_add_(0, inverse, (s - mean[inverse]) ** 2)
    std = torch.sqrt(sq / ((c - 1).clamp(min=1) if unbiased else c))
    return count[inverse].to(scores.dtype), mean[inverse].to(scores.dtype), std[inverse].to(scores.dtype)
