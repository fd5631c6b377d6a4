"""Noisy verifiers: a reward that corrupts the task's verdict at chosen error rates, and the exact
expected group-relative advantage of a correct and an incorrect sample under that noise.

Course material for *An Imperfect Verifier is Good Enough: Learning with Noisy Rewards*, Plesner,
Guzman and Athalye (2026), arXiv:2604.07666. The noise model and the conditional-advantage analysis
here are the course's reconstruction, not the paper's own equations.

The noise model. A sample's true reward is :math:`r^* \\in \\{0, 1\\}`; the verifier reports
:math:`\\tilde r` with false-positive rate :math:`\\rho_0 = P(\\tilde r = 1 \\mid r^* = 0)` and
false-negative rate :math:`\\rho_1 = P(\\tilde r = 0 \\mid r^* = 1)`. Both modes draw a uniform
:math:`u` and set :math:`\\tilde r = 1[u \\ge \\rho_1]` if :math:`r^* = 1`, :math:`\\tilde r = 1[u < \\rho_0]`
if :math:`r^* = 0`:

=========== ==================================================================================
``sample``  one ``u`` per sample: errors are independent across the samples of a prompt
``group``   one ``u`` per group (prompt): the same corruption event hits every sample of the
            group (a wrong reference answer, a broken test suite); same per-sample rates
=========== ==================================================================================

``make_noisy_reward(rho0, rho1, mode, seed)`` returns a reward usable as ``RLConfig(reward=...)``;
its noise comes from a generator seeded by ``(seed, call number)``, and the call number is kept in
the trainer's ``state``, so runs are reproducible and resume exactly from a checkpoint.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..rewards import get_reward, register_reward

NOISE_MODES = ("sample", "group")
_NV_TAG = 17_2604  # separates the noise streams from every other use of the run's seed


# ---------------------------------------------------------------------------------------- noise
def _check_rates(rho0: float, rho1: float) -> tuple[float, float]:
    for name, v in (("rho0", rho0), ("rho1", rho1)):
        if not isinstance(v, (int, float, np.floating, np.integer)) or not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"{name} (a verifier error rate) must be a number in [0, 1], got {v!r}")
    return float(rho0), float(rho1)


def _check_mode(mode: str) -> str:
    if mode not in NOISE_MODES:
        raise ValueError(f"unknown noise mode {mode!r}; choose one of {NOISE_MODES}")
    return mode


def youden_j(rho0: float, rho1: float) -> float:
    """Youden's J of a verifier, :math:`J = 1 - \\rho_0 - \\rho_1` (its sensitivity + specificity - 1)."""
    rho0, rho1 = _check_rates(rho0, rho1)
    return 1.0 - rho0 - rho1


def noise_generator(seed: int, step: int) -> np.random.Generator:
    """The generator of the noise at a given step: a pure function of ``(seed, step)``."""
    if int(seed) != seed or seed < 0 or int(step) != step or step < 0:
        raise ValueError(f"seed and step must be non-negative integers, got seed={seed!r}, step={step!r}")
    return np.random.default_rng(np.random.SeedSequence([_NV_TAG, int(seed), int(step)]))


def corrupt_rewards(r_true: np.ndarray, index: np.ndarray, rho0: float, rho1: float, mode: str,
                    rng: np.random.Generator) -> np.ndarray:
    """What a verifier with error rates ``(rho0, rho1)`` reports for true binary rewards.

    ====== ========= ==============================================================
    r_true ``(B,)``  true rewards, each exactly 0 or 1
    index  ``(B,)``  group (prompt) id of each row; ``group`` mode shares one draw
    rho0   float     false-positive rate P(report 1 | true 0)
    rho1   float     false-negative rate P(report 0 | true 1)
    mode   str       ``"sample"`` (independent errors) or ``"group"`` (one draw per group)
    rng    Generator the source of the uniform draws
    return ``(B,)``  float64 observed rewards in {0, 1}
    ====== ========= ==============================================================
    """
    rho0, rho1 = _check_rates(rho0, rho1)
    mode = _check_mode(mode)
    r = np.asarray(r_true, dtype=np.float64)
    idx = np.asarray(index)
    if r.ndim != 1 or idx.shape != r.shape:
        raise ValueError(f"r_true and index must both be (B,), got {r.shape} and {idx.shape}")
    if not np.all((r == 0.0) | (r == 1.0)):
        raise ValueError("a noisy verifier corrupts binary rewards; r_true has values other than 0 and 1")
    if mode == "sample":
        u = rng.random(r.shape[0])
    else:
        groups, inverse = np.unique(idx, return_inverse=True)
        u = rng.random(groups.shape[0])[inverse]
    return np.where(r == 1.0, u >= rho1, u < rho0).astype(np.float64)


@dataclass(frozen=True)
class NoisyVerifier:
    """A reward (``fn(batch, examples, task, state) -> (B,)``) that corrupts another reward.

    It keeps, in ``state["noisy_verifier"]``, the number of calls so far (the noise at call ``n`` is
    drawn from :func:`noise_generator` ``(seed, n)``) and per-call logs of the true and observed mean
    reward, so a resumed run draws the same noise as an uninterrupted one.
    """

    rho0: float
    rho1: float
    mode: str = "sample"
    seed: int = 0
    base: str | Callable = "task"

    def __post_init__(self):
        _check_rates(self.rho0, self.rho1)
        _check_mode(self.mode)
        if int(self.seed) != self.seed or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")

    def __call__(self, batch, examples, task, state) -> torch.Tensor:
        log = state.setdefault("noisy_verifier", {"calls": 0, "true_reward": [], "observed_reward": [],
                                                  "error_rate": []})
        call = log["calls"] + 1
        r_true = torch.as_tensor(get_reward(self.base)(batch, examples, task, state), dtype=torch.float64)
        r_obs = corrupt_rewards(r_true.numpy(), batch.index.numpy(), self.rho0, self.rho1, self.mode,
                                noise_generator(self.seed, call))
        log["calls"] = call
        log["true_reward"].append(float(r_true.mean()))
        log["observed_reward"].append(float(r_obs.mean()))
        log["error_rate"].append(float((r_obs != r_true.numpy()).mean()))
        return torch.as_tensor(r_obs, dtype=torch.float32)


def make_noisy_reward(rho0: float, rho1: float, mode: str = "sample", seed: int = 0, base: str | Callable = "task",
                      name: str | None = None) -> NoisyVerifier:
    """A noisy verifier over the reward ``base``; pass it as ``RLConfig(reward=...)``, or give a
    ``name`` to also register it so that ``RLConfig(reward=name)`` finds it."""
    verifier = NoisyVerifier(rho0=rho0, rho1=rho1, mode=mode, seed=seed, base=base)
    if name is not None:
        register_reward(name)(verifier)
    return verifier


# ------------------------------------------------------------------- advantages under noise
def group_advantages(r: np.ndarray, scale: bool = True, eps: float = 1e-6) -> np.ndarray:
    """GRPO (``scale=True``) or Dr. GRPO (``scale=False``) advantages of groups of rewards.

    ====== ============ =====================================================
    r      ``(..., G)`` rewards of the G samples of each group, G >= 2
    return              ``(..., G)`` (r - mean) / (std + eps), std with Bessel's correction
    ====== ============ =====================================================
    """
    r = np.asarray(r, dtype=np.float64)
    if r.ndim < 1 or r.shape[-1] < 2:
        raise ValueError(f"rewards must have a last axis of G >= 2 samples, got shape {r.shape}")
    adv = r - r.mean(-1, keepdims=True)
    return adv / (r.std(-1, ddof=1, keepdims=True) + eps) if scale else adv


def binary_group_std(c: np.ndarray | int, G: int) -> np.ndarray:
    """Bessel standard deviation of a 0/1 group of size ``G`` with ``c`` ones: sqrt(c(G-c)/(G(G-1)))."""
    c = np.asarray(c, dtype=np.float64)
    if G < 2 or np.any(c < 0) or np.any(c > G):
        raise ValueError(f"need G >= 2 and 0 <= c <= G, got G={G}, c={c}")
    return np.sqrt(c * (G - c) / (G * (G - 1.0)))


def _binom_pmf(n: int, p: float) -> np.ndarray:
    k = np.arange(n + 1)
    coef = np.array([math.comb(n, int(i)) for i in k], dtype=np.float64)
    return coef * p ** k * (1.0 - p) ** (n - k)


def _check_group(G: int, k: int) -> None:
    if int(G) != G or G < 2:
        raise ValueError(f"group size G must be an integer >= 2, got {G!r}")
    if int(k) != k or not 0 <= k <= G:
        raise ValueError(f"k (true successes in the group) must be an integer in [0, G], got {k!r}")


def expected_advantage(G: int, k: int, rho0: float, rho1: float, correct: bool, mode: str = "sample",
                       scale: bool = True, eps: float = 1e-6) -> float:
    """Closed form of E[A_i | sample i truly correct (or not), k true successes among G].

    With :math:`J = 1 - \\rho_0 - \\rho_1` and :math:`s(c)` the Bessel std of a 0/1 group with
    :math:`c` ones (``scale=False``: :math:`s \\equiv 1`, :math:`\\epsilon = 0`):

    * ``sample`` mode: :math:`D = J\\, E_M[1/(s(M+1)+\\epsilon)]` with
      :math:`M \\sim \\mathrm{Bin}(k-1, 1-\\rho_1) + \\mathrm{Bin}(G-k-1, \\rho_0)`, and
      :math:`E[A \\mid \\text{correct}] = \\tfrac{G-k}{G} D`, :math:`E[A \\mid \\text{incorrect}] = -\\tfrac{k}{G} D`;
    * ``group`` mode: :math:`J` times the clean advantage.

    Both are 0 when the sample's class is the whole group (k = G for a correct sample, k = 0 for an
    incorrect one); asking for a class with no member (a correct sample when k = 0) raises.

    ======= ===== ================================================
    G, k    int   group size; true successes in the group
    rho0/1  float false-positive / false-negative rates
    correct bool  the true label of the sample whose advantage is averaged
    return  float the expected advantage
    ======= ===== ================================================
    """
    _check_group(G, k)
    rho0, rho1 = _check_rates(rho0, rho1)
    mode = _check_mode(mode)
    J = 1.0 - rho0 - rho1
    if (correct and k == 0) or (not correct and k == G):
        raise ValueError(f"no {'correct' if correct else 'incorrect'} sample exists when k={k} of G={G}")
    if (correct and k == G) or (not correct and k == 0):
        return 0.0
    if mode == "group":
        c = float(k)
        clean = ((1.0 if correct else 0.0) - c / G)
        if scale:
            clean = clean / (float(binary_group_std(k, G)) + eps)
        return J * clean
    if scale:
        pm = np.convolve(_binom_pmf(k - 1, 1.0 - rho1), _binom_pmf(G - k - 1, rho0))  # M = 0 .. G-2
        inv = 1.0 / (binary_group_std(np.arange(1, G), G) + eps)
        D = J * float(pm @ inv)
    else:
        D = J
    return (G - k) / G * D if correct else -k / G * D


def advantage_pmf(G: int, k: int, rho0: float, rho1: float, correct: bool, mode: str = "sample",
                  scale: bool = True, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """The exact distribution of the advantage of one truly correct (or incorrect) sample, given k.

    Enumerates every outcome of the noise: in ``sample`` mode the sample's own report and the number
    of true successes and true failures among the others that are reported as 1; in ``group`` mode
    the three intervals of the shared uniform draw.

    ====== ======== ==================================================
    return          ``(V,)``, ``(V,)`` distinct advantage values and their probabilities
    ====== ======== ==================================================
    """
    _check_group(G, k)
    rho0, rho1 = _check_rates(rho0, rho1)
    mode = _check_mode(mode)
    if (correct and k == 0) or (not correct and k == G):
        raise ValueError(f"no {'correct' if correct else 'incorrect'} sample exists when k={k} of G={G}")

    def adv(own: int, ones: int) -> float:  # advantage of a sample reporting `own`, `ones` ones in all
        r = np.zeros(G)
        r[0], r[1:ones - own + 1] = own, 1.0
        return float(group_advantages(r, scale, eps)[0])

    values: dict[float, float] = {}

    def add(v: float, p: float) -> None:
        if p > 0:
            key = round(v, 12)
            values[key] = values.get(key, 0.0) + p

    if mode == "sample":
        n1, n0 = (k - 1, G - k) if correct else (k, G - k - 1)  # the others' true successes / failures
        p_own = (1.0 - rho1) if correct else rho0  # P(the sample itself is reported as 1)
        p1, p0 = _binom_pmf(n1, 1.0 - rho1), _binom_pmf(n0, rho0)
        for own, po in ((1, p_own), (0, 1.0 - p_own)):
            for b1 in range(n1 + 1):
                for b0 in range(n0 + 1):
                    add(adv(own, own + b1 + b0), po * p1[b1] * p0[b0])
    else:
        lo, hi = min(rho0, rho1), max(rho0, rho1)
        own_clean = 1 if correct else 0
        add(adv(own_clean, k), 1.0 - hi)  # u >= max: no error
        add(adv(1 - own_clean, G - k), lo)  # u < min: every report inverted
        # min <= u < max: only the larger error type fires, making the group constant
        add(0.0, hi - lo)
    v = np.array(sorted(values))
    return v, np.array([values[x] for x in sorted(values)])


def monte_carlo_advantage(G: int, k: int, rho0: float, rho1: float, mode: str = "sample", n: int = 100_000,
                          seed: int = 0, scale: bool = True, eps: float = 1e-6) -> dict:
    """Monte Carlo of the advantages of truly correct and incorrect samples, with :func:`corrupt_rewards`.

    Simulates ``n`` groups of G samples with k true successes each.

    ====== ====== ===============================================================
    return dict   ``correct``/``incorrect``: mean advantage, ``*_se``: standard errors
    ====== ====== ===============================================================
    """
    _check_group(G, k)
    if n < 2:
        raise ValueError(f"n must be at least 2, got {n}")
    r_true = np.tile(np.r_[np.ones(k), np.zeros(G - k)], n)
    index = np.repeat(np.arange(n), G)
    r_obs = corrupt_rewards(r_true, index, rho0, rho1, mode, noise_generator(seed, 0)).reshape(n, G)
    adv = group_advantages(r_obs, scale, eps)
    out = {}
    for name, cols in (("correct", slice(0, k)), ("incorrect", slice(k, G))):
        a = adv[:, cols].mean(1) if cols.stop > cols.start else None  # one value per group: independent
        out[name] = float(a.mean()) if a is not None else float("nan")
        out[name + "_se"] = float(a.std(ddof=1) / math.sqrt(n)) if a is not None else float("nan")
    return out


# ------------------------------------------------------------------------------- experiment
def mean_ci(x: np.ndarray, axis: int = -1, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Mean and half-width of the Student-t confidence interval along ``axis`` (nan for n < 2)."""
    from scipy import stats

    x = np.asarray(x, dtype=np.float64)
    n = x.shape[axis]
    mean = x.mean(axis)
    if n < 2:
        return mean, np.full_like(mean, np.nan)
    half = stats.t.ppf(0.5 + level / 2, n - 1) * x.std(axis, ddof=1) / math.sqrt(n)
    return mean, half


# The chapter's experiments (the bandit's trainer, the tiny LM) and their claims live in
# rlcourse/studies/noisy_verifiers.py.
