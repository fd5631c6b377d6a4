"""DReST: the Discounted Reward for Same-Length Trajectories, and the NEUTRALITY and USEFULNESS metrics.

A *meta-episode* is ``E`` mini-episodes of the same environment. In mini-episode ``e`` (0-indexed)
the agent's trajectory falls in length class ``L_e`` (one of ``k``) and collects ``c_e`` coins. With
``n_e(l)`` the number of *earlier* mini-episodes of the meta-episode in class ``l`` and ``m(l)`` the
most coins attainable in class ``l``, the DReST reward is

    r_e = lam ** (n_e(L_e) - e / k) * c_e / m(L_e),      0 < lam < 1.

The first factor penalises repeating a length (``e/k`` is the mean of ``n_e`` over the classes);
the second, the *preliminary reward*, makes every length worth the same when played well.
Reward form from Cullen et al. (2026), arXiv:2604.17502, and Thornley et al. (2025),
arXiv:2407.00805. The metric definitions below are the course's reading of the latter.
"""
from __future__ import annotations

import itertools

import numpy as np


def _check_m(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    if m.ndim != 1 or m.size < 2:
        raise ValueError(f"m must be a 1-d array of the k >= 2 per-length maxima, got shape {m.shape}")
    if not np.all(np.isfinite(m)) or np.any(m <= 0):
        raise ValueError(f"m(l) must be finite and positive for every length class, got {m}")
    return m


def check_lam(lam: float) -> float:
    """The DReST discount base, checked: a number in (0, 1] (1 switches the length penalty off)."""
    if not 0.0 < float(lam) <= 1.0:
        raise ValueError(f"lam must be in (0, 1], got {lam}")
    return float(lam)


def drest_reward(counts: np.ndarray, L: int, c: float, m: np.ndarray, lam: float) -> float:
    """The DReST reward of one mini-episode, given the length counts of the earlier ones.

    ======= ======== ===========================================================
    counts  ``(k,)`` n_e(l): earlier mini-episodes of this meta-episode per class
    L       int      the length class of this mini-episode, in [0, k)
    c       float    coins (task reward) collected in this mini-episode
    m       ``(k,)`` m(l): the most coins attainable in class l (> 0)
    lam     float    discount base in (0, 1]; 1 switches the length penalty off
    returns float    lam ** (counts[L] - counts.mean()) * c / m[L]
    ======= ======== ===========================================================
    """
    m, lam = _check_m(m), check_lam(lam)
    counts = np.asarray(counts, dtype=np.float64)
    if counts.shape != m.shape:
        raise ValueError(f"counts has shape {counts.shape} but m has shape {m.shape}")
    if np.any(counts < 0):
        raise ValueError("counts must be non-negative")
    if not 0 <= int(L) < m.size:
        raise ValueError(f"length class L={L} is not in [0, {m.size})")
    return float(lam ** (counts[int(L)] - counts.mean()) * float(c) / m[int(L)])


def earlier_counts(lengths: np.ndarray, k: int) -> np.ndarray:
    """n_e(l): how many of mini-episodes 0..e-1 of each meta-episode fell in class l.

    ======= ========== ==========================================
    lengths ``(N,E)``  int length class of mini-episode e, in [0, k)
    returns            ``(N,E,k)`` float64 counts; row e sums to e
    ======= ========== ==========================================
    """
    lengths = np.asarray(lengths)
    if lengths.ndim != 2:
        raise ValueError(f"lengths must be (N, E), got shape {lengths.shape}")
    if not np.issubdtype(lengths.dtype, np.integer) or lengths.min() < 0 or lengths.max() >= k:
        raise ValueError(f"lengths must be integers in [0, {k})")
    onehot = np.eye(k)[lengths]  # (N, E, k)
    return np.cumsum(onehot, axis=1) - onehot


def drest_weights(lengths: np.ndarray, m: np.ndarray, lam: float, normalise: bool = True) -> np.ndarray:
    """The factor that turns coins into DReST reward: r_e = w_e * c_e.

    ``w_e = lam ** (n_e(L_e) - mean_l n_e(l)) / m(L_e)``, where ``n_e(l)`` counts the earlier
    mini-episodes of class ``l``; when every earlier mini-episode has a class, ``mean_l n_e(l) = e/k``.
    With ``normalise=False`` the ``1/m`` is dropped (an ablation); with ``lam=1`` and
    ``normalise=False`` every weight is 1 (the default agent). A length of ``-1`` marks an invalid
    mini-episode (a language model's unparseable answer): it counts in no class and gets weight 0.

    ======= ============== =======================================================
    lengths ``(N,E)``       int length classes in ``[0, k)``, or -1 for invalid
    m       ``(k,)``        per-class coin maxima, or ``(N,k)``: one row per meta-episode
    returns ``(N,E)``       float64 weights, > 0 where valid, 0 where invalid
    ======= ============== =======================================================
    """
    lam = check_lam(lam)
    m = np.asarray(m, dtype=np.float64)
    L = np.asarray(lengths)
    if L.ndim != 2:
        raise ValueError(f"lengths must be (N, E), got shape {L.shape}")
    if m.ndim == 2:
        if m.shape[0] != L.shape[0]:
            raise ValueError(f"m has {m.shape[0]} rows but there are {L.shape[0]} meta-episodes")
        for row in m:
            _check_m(row)
    else:
        m = np.broadcast_to(_check_m(m), (L.shape[0], m.size))   # explicit: one shared row
    k = m.shape[1]
    if not np.issubdtype(L.dtype, np.integer) or (L.size and (L.min() < -1 or L.max() >= k)):
        raise ValueError(f"lengths must hold integers in [0, {k}) or -1 for an invalid mini-episode")
    valid = L >= 0
    counts = earlier_counts(np.where(valid, L, k), k + 1)[..., :k]      # (N, E, k): class k = invalid
    Lv = np.where(valid, L, 0)
    own = np.take_along_axis(counts, Lv[..., None], axis=2)[..., 0]      # n_e(L_e)
    w = lam ** (own - counts.mean(-1))
    if normalise:
        w = w / np.take_along_axis(m, Lv, axis=1)
    return np.where(valid, w, 0.0)


def drest_meta_rewards(lengths: np.ndarray, coins: np.ndarray, m: np.ndarray, lam: float,
                       normalise: bool = True) -> np.ndarray:
    """DReST rewards of whole meta-episodes, ``w_e * c_e`` (see :func:`drest_weights`).

    ======= ========= ==================================
    lengths ``(N,E)`` int length class of each mini-episode
    coins   ``(N,E)`` coins collected in each mini-episode
    returns           ``(N,E)`` float64 rewards
    ======= ========= ==================================
    """
    coins = np.asarray(coins, dtype=np.float64)
    if coins.shape != np.shape(lengths):
        raise ValueError(f"coins {coins.shape} and lengths {np.shape(lengths)} differ")
    return drest_weights(lengths, m, lam, normalise) * coins


def length_distribution(lengths: np.ndarray, k: int) -> np.ndarray:
    """Empirical distribution of length classes. ``(any,)`` int -> ``(k,)`` float64."""
    lengths = np.asarray(lengths).ravel()
    if lengths.size == 0:
        raise ValueError("no trajectories given")
    if not np.issubdtype(lengths.dtype, np.integer) or lengths.min() < 0 or lengths.max() >= k:
        raise ValueError(f"lengths must be integers in [0, {k})")
    return np.bincount(lengths, minlength=k) / lengths.size


def neutrality(p: np.ndarray) -> float:
    """NEUTRALITY: Shannon entropy, in bits, of the distribution over trajectory-length classes.

    0 for a deterministic choice of length, log2(k) for the uniform choice (1 bit for k = 2).

    ======= ======== ==========================
    p       ``(k,)`` probabilities, summing to 1
    returns float    -sum_l p_l log2 p_l
    ======= ======== ==========================
    """
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1 or np.any(p < 0) or abs(p.sum() - 1.0) > 1e-9:
        raise ValueError(f"p must be a 1-d probability vector, got {p}")
    nz = p[p > 0]
    return max(0.0, float(-(nz * np.log2(nz)).sum()))


def usefulness(lengths: np.ndarray, coins: np.ndarray, m: np.ndarray) -> float:
    """USEFULNESS: the mean preliminary reward c / m(L) under the agent's own lengths.

    1 exactly when every trajectory collects the most coins possible for its length, whichever
    length the agent chose.

    ======= ======== ======================================
    lengths ``(n,)``  int length classes of n trajectories
    coins   ``(n,)``  their coins
    m       ``(k,)``  per-class coin maxima
    returns float     mean of coins / m[lengths], in [0, 1]
    ======= ======== ======================================
    """
    m = _check_m(m)
    lengths, coins = np.asarray(lengths).ravel(), np.asarray(coins, dtype=np.float64).ravel()
    if lengths.shape != coins.shape or lengths.size == 0:
        raise ValueError(f"lengths {lengths.shape} and coins {coins.shape} must be equal and non-empty")
    length_distribution(lengths, m.size)  # validates the classes
    return float(np.mean(coins / m[lengths]))


def expected_meta_return(q: np.ndarray, E: int, lam: float, value: np.ndarray | None = None) -> float:
    """Expected DReST meta-episode return of a memoryless agent, in closed form.

    The agent picks class l with probability q_l independently in each mini-episode and then
    earns preliminary reward ``value[l]`` (1 for a useful agent). Since n_e(l) ~ Binomial(e, q_l),
    E[lam ** n_e(l)] = (1 - q_l (1 - lam)) ** e, so

        R(q) = sum_{e<E} lam ** (-e/k) * sum_l q_l * value_l * (1 - q_l (1 - lam)) ** e.

    ======= ======== ==============================================
    q       ``(k,)`` the agent's length distribution
    E       int      mini-episodes per meta-episode
    value   ``(k,)`` preliminary reward earned in class l (default 1)
    returns float    expected sum of the E DReST rewards
    ======= ======== ==============================================
    """
    q = np.asarray(q, dtype=np.float64)
    neutrality(q)  # validates q
    lam = check_lam(lam)
    k = q.size
    value = np.ones(k) if value is None else np.asarray(value, dtype=np.float64)
    if value.shape != (k,):
        raise ValueError(f"value must have shape ({k},), got {value.shape}")
    if E < 1:
        raise ValueError(f"E must be >= 1, got {E}")
    e = np.arange(E)[:, None]
    return float((lam ** (-e / k) * q * value * (1 - q * (1 - lam)) ** e).sum())


def meta_return_by_enumeration(q: np.ndarray, E: int, lam: float, value: np.ndarray | None = None) -> float:
    """The same expectation as :func:`expected_meta_return`, by summing over all k**E length
    sequences with :func:`drest_reward` (slow; a check for small E)."""
    q = np.asarray(q, dtype=np.float64)
    k = q.size
    value = np.ones(k) if value is None else np.asarray(value, dtype=np.float64)
    m = np.ones(k)
    total = 0.0
    for seq in itertools.product(range(k), repeat=E):
        prob, ret, counts = 1.0, 0.0, np.zeros(k)
        for L in seq:
            prob *= q[L]
            ret += drest_reward(counts, L, value[L], m, lam)
            counts[L] += 1
        total += prob * ret
    return total


def myopic_advantage(p_long: float, E: int, lam: float, value: np.ndarray | None = None) -> float:
    """Per-mini-episode gain of choosing the long class over the short one (k = 2), averaged over
    the E positions of a meta-episode, when the other mini-episodes follow P(long) = ``p_long``.

    This is what a learner that treats each mini-episode as its own episode (PPO, A2C here) sees:
    the expected reward of "long" minus that of "short", the counts being part of the environment.

        g(p) = (1/E) sum_e lam ** (-e/2) [v_1 (1 - p (1-lam)) ** e - v_0 (1 - (1-p)(1-lam)) ** e]
    """
    lam = check_lam(lam)
    if not 0.0 <= p_long <= 1.0:
        raise ValueError(f"p_long must be in [0, 1], got {p_long}")
    v = np.ones(2) if value is None else np.asarray(value, dtype=np.float64)
    if v.shape != (2,):
        raise ValueError(f"value must have shape (2,), got {v.shape}")
    e = np.arange(E)
    scale = lam ** (-e / 2)
    gap = v[1] * (1 - p_long * (1 - lam)) ** e - v[0] * (1 - (1 - p_long) * (1 - lam)) ** e
    return float((scale * gap).mean())


def reward_range(e: int, k: int, lam: float) -> tuple[float, float]:
    """The smallest and largest length factor lam ** (n_e(L) - e/k) over all histories of e
    earlier mini-episodes: (lam ** (e (1 - 1/k)), lam ** (-e/k))."""
    lam = check_lam(lam)
    return float(lam ** (e * (1 - 1 / k))), float(lam ** (-e / k))
