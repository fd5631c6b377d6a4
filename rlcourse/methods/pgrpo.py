"""P-GRPO: personalised advantages from the reward history of each preference group.

Paper: *Personalized Group Relative Policy Optimization for Heterogenous Preference Alignment*,
Wang, Peters, Butt, Hashemi, Hashemi, Ghari, Hoover, Rae, Dehghani (2026), arXiv:2603.10009.

GRPO normalises a reward against the rewards sampled beside it. When that pool mixes users whose
rewards have different means and scales, the majority sets the mean and the scale, and a minority's
within-group contrast shrinks. P-GRPO keeps running statistics of the rewards of each *preference
group* (a user type) and normalises each reward against its own group's history:

    A_i = (r_i - mu_{g(i)}) / (sigma_{g(i)} + eps)

The statistics, their update rule and the order of update and normalisation are a reconstruction:
the paper's abstract (arXiv:2603.10009) states the idea, normalising "against preference-group-specific
reward histories rather than the concurrent generation group", not these equations (the chapter's
"Reconstruction" box lists our choices). Here they are Welford's running mean and variance (or an
exponential moving average), kept in the trainer's ``state`` dict so that they survive checkpoints.

Registered parts
================ ========================= ===================================================
``p_grpo``       advantage estimator       per-preference-group history normalisation
``pg2_pooled``   advantage estimator       the failure mode: one mean and std over the whole batch
``pg2_pref``     reward                    the task's verdict times the preference group's scale
``pg2_sortmix``  task (pre-training)       sort either way, tag ignored: the base model's data
``pg2_prefsort`` task (RL)                 tag A (majority) wants ascending, tag B descending
================ ========================= ===================================================

``p_grpo_logged`` is ``p_grpo`` that also logs each step's per-group advantage, reward and statistics. The
chapter's experiment (majority and minority users on the tiny LM, three arms) and its claims are in
:mod:`rlcourse.studies.p_grpo`.
"""
from __future__ import annotations

import copy
import math
from typing import Sequence

import numpy as np
import torch

from ..advantages import outcome_scores, register_estimator
from ..ops import as_index
from ..rewards import register_reward
from ..tasks import Example, Score, Task, register_task

STATE_KEY = "p_grpo"


# ---------------------------------------------------------------------- running statistics
def new_stats() -> dict:
    """Empty running statistics: ``{"n": 0, "mean": 0, "m2": 0}`` (``m2`` = sum of squared deviations;
    for the EMA form ``m2`` holds the variance itself). Plain floats, so they pickle into checkpoints."""
    return {"n": 0.0, "mean": 0.0, "m2": 0.0}


def _as_float_array(values, name: str) -> np.ndarray:
    arr = np.asarray(values.detach().cpu() if isinstance(values, torch.Tensor) else values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def welford_update(stats: dict, values) -> dict:
    """Welford's update of running statistics with each value in turn; returns new statistics.

    For each value r: n <- n+1, delta = r - mean, mean <- mean + delta/n, m2 <- m2 + delta*(r - mean).
    After n values, ``mean`` is their mean and ``m2 / (n-1)`` their unbiased variance.

    ======= ========= ============================================
    stats   dict      ``{"n", "mean", "m2"}`` before the update
    values  ``(N,)``  new rewards of one preference group
    returns dict      the statistics after the N values
    ======= ========= ============================================
    """
    if set(stats) != {"n", "mean", "m2"}:
        raise ValueError(f"stats must have keys n, mean, m2; got {sorted(stats)}")
    n, mean, m2 = float(stats["n"]), float(stats["mean"]), float(stats["m2"])
    for r in _as_float_array(values, "values").tolist():
        n += 1.0
        delta = r - mean
        mean += delta / n
        m2 += delta * (r - mean)
    return {"n": n, "mean": mean, "m2": m2}


def ema_update(stats: dict, values, decay: float) -> dict:
    """Exponential moving average of mean and variance with weight ``alpha = 1 - decay`` per value.

    For each value r: d = r - mean, mean <- mean + alpha d, var <- (1 - alpha)(var + alpha d^2). The
    first value initialises ``mean = r, var = 0``. ``m2`` holds the variance (not a sum).

    ======= ========= ============================================
    stats   dict      ``{"n", "mean", "m2"}`` (``m2`` = variance)
    values  ``(N,)``  new rewards of one preference group
    decay   float     lambda in (0, 1); the memory is about 1/(1-lambda) values
    returns dict      the statistics after the N values
    ======= ========= ============================================
    """
    if not 0.0 < decay < 1.0:
        raise ValueError(f"decay must be in (0, 1), got {decay}")
    alpha = 1.0 - decay
    n, mean, var = float(stats["n"]), float(stats["mean"]), float(stats["m2"])
    for r in _as_float_array(values, "values").tolist():
        if n == 0:
            n, mean, var = 1.0, r, 0.0
            continue
        n += 1.0
        d = r - mean
        mean += alpha * d
        var = (1.0 - alpha) * (var + alpha * d * d)
    return {"n": n, "mean": mean, "m2": var}


def stats_mean_std(stats: dict, ema: bool = False) -> tuple[float, float]:
    """``(mean, std)`` of running statistics: Welford's unbiased std, or the EMA's std."""
    if stats["n"] < 1:
        raise ValueError("no values seen yet: the statistics have n = 0")
    if ema:
        return stats["mean"], math.sqrt(max(stats["m2"], 0.0))
    var = stats["m2"] / (stats["n"] - 1.0) if stats["n"] > 1 else 0.0
    return stats["mean"], math.sqrt(max(var, 0.0))


def reward_range(stats: dict, values) -> tuple[float, float]:
    """The smallest and largest reward a preference group has had: ``stats``' own ``lo``/``hi`` (kept by
    :func:`p_grpo_advantages`), its mean (when ``n > 0``; statistics built without a range still have
    one), and ``values``, the new batch's rewards. Returns ``(lo, hi)``; ``hi - lo`` is the scale of the
    group's rewards, which the std floor is measured in.
    """
    seen = [float(v) for v in _as_float_array(values, "values").tolist()]
    if stats["n"] > 0:
        seen.append(float(stats["mean"]))
    seen += [float(stats[k]) for k in ("lo", "hi") if k in stats]
    if not seen:
        raise ValueError("reward_range: no rewards, in the statistics or the batch")
    return min(seen), max(seen)


# ---------------------------------------------------------------------- the advantage
def p_grpo_advantages(scores: torch.Tensor, pref_groups: Sequence, history: dict, epsilon: float = 1e-6,
                      include_batch: bool = True, decay: float | None = None, min_history: int = 2,
                      min_std: float = 0.1):
    """P-GRPO advantages of one batch, and the updated per-preference-group history.

    :math:`A_i = (r_i - \\mu_{g(i)}) / (\\sigma_{g(i)} + \\epsilon)` with :math:`\\mu_g, \\sigma_g` the
    running statistics of preference group g. With ``include_batch`` (default) the batch's rewards
    are added to the history first ("post-update"); otherwise the history before this batch is used
    and updated afterwards ("pre-update"). A group with fewer than ``min_history`` rewards in the
    statistics used falls back to the batch's own mean and std of that group (cold start). The std is
    floored at ``min_std`` times the group's reward range :math:`R_g` (the largest minus the smallest
    reward the group has had, this batch and the history's mean included): a history of equal rewards
    has :math:`\\sigma_g = 0`, and a new reward that differs (possible without ``include_batch``) would get
    an advantage of :math:`1/\\epsilon`; the floor caps :math:`|A|` at ``1 / min_std`` (10 at the
    default) whatever the reward's scale. Because the floor scales with the rewards, multiplying a
    group's rewards by a constant :math:`c > 0` (or shifting them) leaves its advantages unchanged, at
    the floor too; an absolute floor would cap a 0/1 reward at 10 but a 0/10 one at 100. (A row whose
    reward equals the mean keeps advantage 0 either way.)

    =========== ========= =========================================================
    scores      ``(B,)``  outcome reward of each row
    pref_groups ``B``     the preference-group label (hashable) of each row
    history     dict      label -> running statistics (``new_stats()``); not mutated
    decay       float     None: full history (Welford); else EMA with this lambda
    returns               ``(adv (B,), new_history)``
    =========== ========= =========================================================
    """
    if scores.ndim != 1:
        raise ValueError(f"scores must be (B,), got shape {tuple(scores.shape)}")
    if len(pref_groups) != scores.shape[0]:
        raise ValueError(f"{len(pref_groups)} preference-group labels for {scores.shape[0]} scores")
    if not torch.isfinite(scores).all():
        raise ValueError("scores contain NaN or inf")
    if min_std < 0:
        raise ValueError(f"min_std must be >= 0, got {min_std}")
    ema = decay is not None
    update = (lambda s, v: ema_update(s, v, decay)) if ema else welford_update
    new_history = copy.deepcopy(history)
    labels = list(pref_groups)
    adv = torch.zeros_like(scores, dtype=torch.float32)
    for g in dict.fromkeys(labels):  # in order of first appearance
        rows = torch.tensor([i for i, lab in enumerate(labels) if lab == g])
        r = scores[rows].double()
        before = new_history.get(g, new_stats())
        after = dict(update({k: before[k] for k in ("n", "mean", "m2")}, r))
        after["lo"], after["hi"] = reward_range(before, r)
        used = after if include_batch else before
        if used["n"] >= min_history:
            mu, sigma = stats_mean_std(used, ema)
        else:  # cold start: the batch's own statistics of this group
            mu = float(r.mean())
            sigma = float(r.std()) if len(r) > 1 else 0.0
        floor = min_std * (after["hi"] - after["lo"])  # relative to the group's reward scale
        adv[rows] = ((r - mu) / (max(sigma, floor) + epsilon)).float()
        new_history[g] = after
    return adv, new_history


def pref_group_of(example: Example, key: str = "pref_group"):
    """The preference-group label of an example (``example.meta[key]``); raises if it has none."""
    if key not in example.meta:
        raise ValueError(f"example {example.prompt!r} has no meta[{key!r}]: P-GRPO needs each prompt's "
                         f"preference group")
    return example.meta[key]


@register_estimator("p_grpo")
def compute_p_grpo_advantage(token_level_rewards, response_mask, index, examples, state, epsilon: float = 1e-6,
                             include_batch: bool = True, decay: float | None = None, min_history: int = 2,
                             group_key: str = "pref_group", min_std: float = 0.1):
    """Registry entry ``p_grpo``: :func:`p_grpo_advantages` with the history in ``state["p_grpo"]``.

    =================== ========= ==============================================
    token_level_rewards ``(B,T)`` reward on the last valid token
    response_mask       ``(B,T)`` 1 up to and including EOS
    index               ``(B,)``  prompt id of each row (checked, not used)
    examples            ``B``     the Example of each row (``meta[group_key]``)
    state               dict      the trainer's state; holds the history
    returns                       ``(adv, ret)``, both ``(B,T)``; ``ret`` is the reward
    =================== ========= ==============================================
    """
    scores = outcome_scores(token_level_rewards, response_mask)
    as_index(index, len(scores))
    if examples is None or len(examples) != len(scores):
        raise ValueError(f"p_grpo needs one Example per row ({len(scores)} rows)")
    labels = [pref_group_of(e, group_key) for e in examples]
    adv, state[STATE_KEY] = p_grpo_advantages(scores, labels, state.get(STATE_KEY, {}), epsilon, include_batch,
                                              decay, min_history, min_std)
    return adv.unsqueeze(-1) * response_mask, scores.unsqueeze(-1) * response_mask


@register_estimator("pg2_pooled")
def compute_pooled_advantage(token_level_rewards, response_mask, index=None, epsilon: float = 1e-6):
    """The failure mode P-GRPO addresses: one mean and one std over the whole batch, whatever the
    preference group, :math:`A_i = (r_i - \\bar r_{\\text{batch}}) / (\\mathrm{std}_{\\text{batch}} + \\epsilon)`.
    Returns ``(adv, ret)``, both ``(B,T)``."""
    scores = outcome_scores(token_level_rewards, response_mask)
    if len(scores) < 2:
        raise ValueError("pooled normalisation needs at least 2 rows")
    adv = (scores - scores.mean()) / (scores.std() + epsilon)
    return adv.unsqueeze(-1) * response_mask, scores.unsqueeze(-1) * response_mask


def pooled_moments(p: Sequence[float], mu: Sequence[float], s: Sequence[float]) -> tuple[float, float]:
    """Mean and std of a mixture of preference groups (law of total variance).

    ======= ======== ==============================================
    p       ``(K,)`` share of each group in the pool (sums to 1)
    mu, s   ``(K,)`` mean and std of each group's reward
    returns          ``(mu_mix, sigma_mix)``
    ======= ======== ==============================================
    """
    p, mu, s = (np.asarray(a, dtype=np.float64) for a in (p, mu, s))
    if not (p.shape == mu.shape == s.shape) or p.ndim != 1:
        raise ValueError(f"p, mu, s must be (K,) of one length, got {p.shape}, {mu.shape}, {s.shape}")
    if (p < 0).any() or abs(p.sum() - 1) > 1e-9:
        raise ValueError(f"p must be a probability vector, got {p}")
    m = float(p @ mu)
    return m, float(np.sqrt(p @ s**2 + p @ (mu - m) ** 2))


# ---------------------------------------------------------------------- the preference task
def _sort_prompt(rng, tag: str, length: int) -> tuple[str, str, str]:
    digits = "".join(str(d) for d in rng.integers(0, 10, size=length))
    while len(set(digits)) == 1:  # both directions must differ
        digits = "".join(str(d) for d in rng.integers(0, 10, size=length))
    asc = "".join(sorted(digits))
    return f"{tag}:{digits}=", asc, asc[::-1]


def _check_lengths(lengths: Sequence[int] | None, length: int) -> tuple[int, ...]:
    out = (int(length),) if lengths is None else tuple(int(n) for n in lengths)
    if not out or any(n < 2 for n in out):
        raise ValueError(f"every prompt length must be >= 2 digits, got {out}")
    return out


def _draw_length(rng, lengths: tuple[int, ...]) -> int:
    """One prompt length; a single length draws nothing, so single-length tasks keep their old streams."""
    return lengths[0] if len(lengths) == 1 else int(lengths[int(rng.integers(len(lengths)))])


class SortMix(Task):
    """Pre-training data for the preference chapter: ``A:4179=`` or ``B:4179=`` -> the digits sorted
    ascending *or* descending at random. With probability ``lean`` the order is the tag's own (A
    ascending, B descending), otherwise the other one. Either order scores 1, so a base model built on
    it sorts well and leans only mildly towards each tag's order."""

    name = "pg2_sortmix"

    def __init__(self, length: int = 4, lean: float = 0.7, lengths: Sequence[int] | None = None):
        if not 0.0 <= lean <= 1.0:
            raise ValueError(f"lean must be a probability, got {lean}")
        self.length, self.lean = length, lean
        self.lengths = _check_lengths(lengths, length)
        self.name = f"pg2_sortmix-lean{lean:.2f}"  # names the cached base model
        if self.lengths != (length,):
            self.name += "-len" + "".join(str(n) for n in self.lengths)

    def _draw(self, rng):
        tag = "AB"[int(rng.integers(2))]
        prompt, asc, desc = _sort_prompt(rng, tag, _draw_length(rng, self.lengths))
        own, other = (asc, desc) if tag == "A" else (desc, asc)
        sol = own if rng.random() < self.lean else other
        return Example(prompt=prompt, answer=asc, solution=sol, meta={"pref_group": tag})

    def score(self, completion, example):
        got = completion.strip()
        ok = got in (example.answer, example.answer[::-1])
        return Score(float(ok), "correct (either order)" if ok else "wrong: not sorted either way")


class PrefSort(Task):
    """The preference task: tag ``A`` (a share ``majority`` of prompts) prefers the digits ascending,
    tag ``B`` (the minority) descending. ``score`` is 1 for the preferred order only; the reward
    ``pg2_pref`` scales it per group (A on 0-10, B on 0-1)."""

    name = "pg2_prefsort"

    def __init__(self, length: int = 4, majority: float = 0.8, lengths: Sequence[int] | None = None):
        if not 0.5 <= majority < 1.0:
            raise ValueError(f"majority must be in [0.5, 1), got {majority}")
        self.length, self.majority = length, majority
        self.lengths = _check_lengths(lengths, length)

    def _draw(self, rng):
        tag = "A" if rng.random() < self.majority else "B"
        prompt, asc, desc = _sort_prompt(rng, tag, _draw_length(rng, self.lengths))
        want = asc if tag == "A" else desc
        return Example(prompt=prompt, answer=want, solution=want, meta={"pref_group": tag})

    def examples_of(self, tag: str, n: int, seed: int = 0, split: str = "test") -> list[Example]:
        """``n`` examples of one preference group (held-out by default)."""
        if tag not in ("A", "B"):
            raise ValueError(f"tag must be 'A' or 'B', got {tag!r}")
        out: list[Example] = []
        k = 4 * n + 16
        while len(out) < n:
            out = [e for e in self.examples(k, seed=seed, split=split) if e.meta["pref_group"] == tag][:n]
            k *= 2
        return out

    def score(self, completion, example):
        ok = completion.strip() == example.answer
        return Score(float(ok), "the preferred order" if ok else "not the preferred order")


register_task("pg2_sortmix")(SortMix)
register_task("pg2_prefsort")(PrefSort)

#: reward scale of each preference group: different means *and* scales
PREF_SCALES = {"A": 10.0, "B": 1.0}


@register_reward("pg2_pref")
def preference_reward(batch, examples, task, state) -> torch.Tensor:
    """The task's verdict (1 for the group's preferred answer) times the group's scale ``PREF_SCALES``."""
    base = torch.as_tensor(task.rewards(batch.texts, examples), dtype=torch.float32)
    scale = torch.tensor([PREF_SCALES[pref_group_of(e)] for e in examples], dtype=torch.float32)
    return base * scale


LOG_KEY = "p_grpo_log"


@register_estimator("p_grpo_logged")
def compute_p_grpo_logged_advantage(token_level_rewards, response_mask, index, examples, state, epsilon: float = 1e-6,
                                    include_batch: bool = True, decay: float | None = None, min_history: int = 2,
                                    group_key: str = "pref_group", min_std: float = 0.1):
    """``p_grpo`` (identical advantages, for the same keywords), and a log in ``state["p_grpo_log"]``
    of each step's mean advantage, mean reward and the statistics (mu, sigma) used, per preference
    group: the data that tests the stale-history bias of the chapter's proposition directly.

    Returns ``(adv, ret)``, both ``(B,T)``, as ``p_grpo``.
    """
    adv, ret = compute_p_grpo_advantage(token_level_rewards, response_mask, index, examples, state, epsilon=epsilon,
                                        include_batch=include_batch, decay=decay, min_history=min_history,
                                        group_key=group_key, min_std=min_std)
    a = (adv * response_mask).sum(-1) / response_mask.sum(-1).clamp(min=1)  # each row's (constant) advantage
    r = outcome_scores(token_level_rewards, response_mask)
    labels = [pref_group_of(e, group_key) for e in examples]
    row = {}
    for g in sorted(set(labels)):
        sel = torch.tensor([lab == g for lab in labels])
        stats = state[STATE_KEY][g]
        mu, sigma = stats_mean_std(stats, decay is not None) if stats["n"] >= 1 else (float("nan"),) * 2
        row[g] = {"adv": float(a[sel].mean()), "reward": float(r[sel].mean()), "mu": mu, "sigma": sigma,
                  "n": int(sel.sum())}
    state.setdefault(LOG_KEY, []).append(row)
    return adv, ret
