"""The cost model of the JigsawRL simulator: stage durations, rollout lengths, decode time, idle
fractions, and the arithmetic of long-tail migration. NumPy only (no torch)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

STAGES = ("rollout", "reward", "ref", "train")


@dataclass(frozen=True)
class StageCosts:
    """Durations of the simulated stages, in abstract time units.

    A decode step with ``n`` active sequences on one worker takes ``decode_step + decode_per_seq * n``
    (memory-bound weight reads plus a per-sequence term, a roofline-style model). Reward, reference
    and training cost a fixed time per token of the iteration, split evenly over the workers.
    Migrating a tail costs ``mig_fixed`` plus ``mig_per_token`` per prefix token re-prefilled on the
    destination worker.
    """

    decode_step: float = 1.0
    decode_per_seq: float = 1.0 / 32
    reward_per_token: float = 0.002
    ref_per_token: float = 0.004
    train_per_token: float = 0.012
    mig_fixed: float = 5.0
    mig_per_token: float = 0.002
    tau: int = 4

    def __post_init__(self):
        for name in ("decode_step", "decode_per_seq", "reward_per_token", "ref_per_token",
                     "train_per_token", "mig_fixed", "mig_per_token"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"StageCosts.{name} must be finite and >= 0, got {value!r}")
        if not isinstance(self.tau, (int, np.integer)) or self.tau < 1:
            raise ValueError(f"StageCosts.tau must be an integer >= 1, got {self.tau!r}")

    def scaled(self, factor: float) -> "StageCosts":
        """Every duration multiplied by ``factor > 0`` (a change of time unit); ``tau`` is kept."""
        if not (np.isfinite(factor) and factor > 0):
            raise ValueError(f"factor must be finite and > 0, got {factor!r}")
        return StageCosts(*(v * factor for v in (self.decode_step, self.decode_per_seq, self.reward_per_token,
                                                 self.ref_per_token, self.train_per_token, self.mig_fixed,
                                                 self.mig_per_token)), tau=self.tau)


def _as_lengths(lengths, name: str = "lengths", ndim: int = 1) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise TypeError(f"{name} must hold whole token counts, got dtype {arr.dtype}")
        arr = arr.astype(np.int64)
    if np.any(arr < 1):
        raise ValueError(f"{name} must be >= 1 token each, got min {arr.min()}")
    return arr.astype(np.int64)


def sample_lengths(z: np.ndarray, mean: float, sigma: float, max_len: int) -> np.ndarray:
    """Log-normal response lengths with a fixed mean: ``L = clip(round(mean * exp(sigma z - sigma^2/2)))``.

    ``sigma`` is the tail weight: 0 gives constant lengths ``mean``; larger values a heavier tail
    with the same (unclipped) mean. Passing the same standard-normal draws ``z`` for every ``sigma``
    gives common random numbers across a sweep.

    ======= ========= ==========================================
    z       ``(...)`` standard-normal draws
    returns           ``(...)`` int64 lengths in ``[1, max_len]``
    ======= ========= ==========================================
    """
    z = np.asarray(z, dtype=float)
    if not np.all(np.isfinite(z)):
        raise ValueError("z must be finite")
    if not (mean >= 1 and np.isfinite(mean)):
        raise ValueError(f"mean must be a finite number >= 1, got {mean!r}")
    if not (sigma >= 0 and np.isfinite(sigma)):
        raise ValueError(f"sigma (tail weight) must be finite and >= 0, got {sigma!r}")
    if int(max_len) < mean:
        raise ValueError(f"max_len={max_len} is below the mean length {mean}")
    raw = mean * np.exp(sigma * z - 0.5 * sigma**2)
    return np.clip(np.round(raw), 1, int(max_len)).astype(np.int64)


def decode_time(lengths, decode_step: float, decode_per_seq: float) -> float:
    """Time to decode a batch of sequences on one worker: ``a * max(L) + b * sum(L)``.

    At step ``t`` the ``n_t = #{i : L_i >= t}`` unfinished sequences each emit one token, and the
    step takes ``a + b n_t``; summing over ``t = 1..max L`` gives the closed form.

    ============== ======== =============================================
    lengths        ``(n,)`` response lengths in tokens
    decode_step    ``a``    fixed cost of one decode step
    decode_per_seq ``b``    extra cost per active sequence per step
    returns        scalar   decode time of the batch
    ============== ======== =============================================
    """
    L = _as_lengths(lengths)
    return float(decode_step * L.max() + decode_per_seq * L.sum())


def fit_decode_cost(n_active, step_seconds) -> tuple[float, float]:
    """Least-squares fit of ``t_step(n) = a + b n`` to measured decode-step times.

    Use it to put a real engine's costs (for instance timings of :func:`rlcourse.lm.sample`) into
    :class:`StageCosts` (``decode_step=a, decode_per_seq=b``), in the same time unit as the other costs.

    ============ ======== ==========================================
    n_active     ``(S,)``  active sequences during each measured step
    step_seconds ``(S,)``  the measured time of each step
    returns      (a, b)    intercept and slope
    ============ ======== ==========================================
    """
    n = np.asarray(n_active, dtype=float)
    t = np.asarray(step_seconds, dtype=float)
    if n.ndim != 1 or n.shape != t.shape:
        raise ValueError(f"n_active {n.shape} and step_seconds {t.shape} must be 1-D of the same length")
    if not (np.all(np.isfinite(n)) and np.all(np.isfinite(t))):
        raise ValueError("n_active and step_seconds must be finite")
    if np.unique(n).size < 2:
        raise ValueError("need steps with at least two different batch sizes to fit a and b")
    b, a = np.polyfit(n, t, 1)
    return float(a), float(b)


def sync_idle_fraction(lengths) -> float:
    """Fraction of decode slots left idle when batches of sequences wait for their longest one.

    For ``N`` batches of ``B`` sequences, slots are ``B * max_i L_i`` per batch and used slots
    ``sum_i L_i``; the idle fraction is ``1 - sum L / (B * sum max L)``.

    ======= ========== ============================
    lengths ``(N, B)`` lengths, one batch per row
    returns scalar     idle fraction in ``[0, 1)``
    ======= ========== ============================
    """
    L = np.asarray(lengths, dtype=float)
    if L.ndim != 2 or L.size == 0:
        raise ValueError(f"lengths must be a non-empty (N, B) array, got shape {L.shape}")
    if np.any(~np.isfinite(L)) or np.any(L <= 0):
        raise ValueError("lengths must be finite and positive")
    return float(1.0 - L.sum() / (L.shape[1] * L.max(axis=1).sum()))


def exponential_idle_fraction(batch: int) -> float:
    """Closed form of :func:`sync_idle_fraction` for i.i.d. exponential lengths: ``1 - 1/H_B``,
    with ``H_B = 1 + 1/2 + ... + 1/B`` (since ``E[max] = H_B E[L]``)."""
    if not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    return float(1.0 - 1.0 / np.sum(1.0 / np.arange(1, batch + 1)))


def split_tail(lengths, tau: int) -> tuple[int, np.ndarray]:
    """Cut a rollout shard where fewer than ``tau`` sequences remain active.

    The cut step ``c`` is the ``tau``-th largest length (0 if the shard has fewer than ``tau``
    sequences); after step ``c`` at most ``tau - 1`` sequences are unfinished, with
    ``R_i = max(L_i - c, 0)`` tokens left.

    ======= ======== =========================================
    lengths ``(n,)`` response lengths of one shard
    returns (c, R)   cut step; ``R`` is ``(n,)`` remaining tokens
    ======= ======== =========================================
    """
    L = _as_lengths(lengths)
    if not isinstance(tau, (int, np.integer)) or tau < 1:
        raise ValueError(f"tau must be an integer >= 1, got {tau!r}")
    cut = int(np.sort(L)[::-1][tau - 1]) if L.size >= tau else 0
    return cut, np.maximum(L - cut, 0)


def migration_saving(shards: Sequence, costs: StageCosts) -> dict:
    """Worker-time saved by merging the tails of a stage's rollout shards onto one worker.

    Left alone, the tail of shard ``j`` occupies its worker for ``a max_i R_ij + b sum_i R_ij``.
    Merged, one worker decodes all tails in ``c_mig + a max_ij R_ij + b sum_ij R_ij``. The busy
    worker-time saved is ``a (sum_j max_i R_ij - max_ij R_ij) - c_mig``.

    ======= ================ ====================================================
    shards  ``M x (n_j,)``   the lengths of each shard of one rollout stage
    returns dict             cuts ``(M,)``, remaining list, c_mig, saving, head/tail durations
    ======= ================ ====================================================
    """
    if len(shards) < 1:
        raise ValueError("need at least one shard")
    a, b = costs.decode_step, costs.decode_per_seq
    cuts, rem, heads = [], [], []
    for shard in shards:
        L = _as_lengths(shard, "shard")
        c, R = split_tail(L, costs.tau)
        cuts.append(c)
        rem.append(R)
        heads.append(a * c + b * float(np.minimum(L, c).sum()))
    moved_prefix = sum(c * int(np.count_nonzero(R)) for c, R in zip(cuts, rem))
    c_mig = costs.mig_fixed + costs.mig_per_token * moved_prefix
    max_r = np.array([int(R.max()) for R in rem])
    sum_r = float(sum(int(R.sum()) for R in rem))
    tail = c_mig + a * float(max_r.max()) + b * sum_r
    saving = a * float(max_r.sum() - max_r.max()) - c_mig
    return {"cuts": np.array(cuts), "remaining": rem, "c_mig": float(c_mig), "saving": float(saving),
            "head": np.array(heads), "tail": float(tail), "any_tail": bool(max_r.max() > 0)}


def tail_weight(lengths) -> float:
    """The tail weight of a length sample: the standard deviation of ``log L``.

    For ``L = m exp(sigma z - sigma^2 / 2)`` (:func:`sample_lengths` before rounding) it is ``sigma``
    exactly in expectation of the sample variance, whatever ``m``: this places any length sample on
    the sweep's axis.

    ======= ======== =======================
    lengths ``(N,)``  lengths, ``N >= 2``
    returns scalar   ``std(log L)`` (ddof 0)
    ======= ======== =======================
    """
    L = _as_lengths(lengths)
    if L.size < 2:
        raise ValueError("need at least two lengths to measure a spread")
    return float(np.std(np.log(L)))


def resample_lengths(measured, shape, mean_len: float, max_len: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap draws from measured lengths, rescaled to a target mean: ``round(L* mean_len / mean(L))``.

    Rescaling keeps every ratio ``L_i / L_j`` (up to rounding), so the tail weight of
    :func:`tail_weight` and the idle fraction of :func:`sync_idle_fraction` are kept; only the
    time scale of a rollout changes.

    ======== ========== ==================================================
    measured ``(N,)``    measured response lengths
    shape    tuple       output shape, e.g. ``(P, K, B)``
    returns  ``shape``   int64 lengths in ``[1, max_len]``
    ======== ========== ==================================================
    """
    L = _as_lengths(measured, "measured")
    if not (np.isfinite(mean_len) and mean_len >= 1):
        raise ValueError(f"mean_len must be a finite number >= 1, got {mean_len!r}")
    if int(max_len) < mean_len:
        raise ValueError(f"max_len={max_len} is below mean_len={mean_len}")
    draws = rng.choice(L, size=tuple(shape), replace=True).astype(float)
    return np.clip(np.round(draws * mean_len / L.mean()), 1, int(max_len)).astype(np.int64)
