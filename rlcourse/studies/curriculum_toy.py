"""The curriculum toy shared by the HeaPA and data-scarcity chapters: prompts with known pass rates,
GRPO on per-level skills, and one runner whose arms choose the prompts.

One runner, one random stream: for a given seed every arm sees the same seed prompts, the same held-out
prompts and the same sampling stream (``numpy.random.default_rng([seed, 7])`` for the rewards and the
children's offsets, ``torch.Generator().manual_seed(seed)`` for the prompt draws), so the two chapters
report the same numbers for the arms they share. Both chapters run it as one grid,
:func:`toy_study` (cell :func:`run_toy_cell`), each with its own arms: a cell is cached once for both.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .runner import Study


@dataclass(frozen=True)
class ToyCurriculum:
    """A curriculum of prompts with known pass rates. Prompt ``i`` has a level ``d_i`` and an offset
    ``o_i``; the policy's logit on it is ``theta[d_i] + o_i`` and its pass rate the sigmoid of that.
    A GRPO step on a level also moves the next level by ``transfer`` times as much (adding ``d``
    digits is learnt on the way to ``d + 1``)."""

    start: tuple = (3.0, 1.0, -2.0, -5.0, -8.0)  # initial skill per level: easy ... near zero
    spread: float = 1.0          # sd of the prompt offsets
    per_level: int = 40          # seed prompts per level
    held_per_level: int = 200    # held-out prompts per level
    transfer: float = 0.5
    lr: float = 0.5
    child_jitter: float = 0.3    # sd of a child's offset around its parent's

    @property
    def levels(self) -> int:
        return len(self.start)


def toy_prompts(toy: ToyCurriculum, n_per_level: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``(levels, offsets)`` of ``n_per_level`` prompts per level, each ``(levels * n,)``."""
    levels = np.repeat(np.arange(toy.levels), n_per_level)
    return levels, rng.normal(0.0, toy.spread, size=levels.shape)


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def toy_accuracy(theta: np.ndarray, held: tuple[np.ndarray, np.ndarray]) -> float:
    """Mean pass rate over the held-out prompts (exact: the pass rates are known)."""
    levels, offsets = held
    return float(_sigmoid(theta[levels] + offsets).mean())


ARMS = ("uniform", "skip_extremes", "pass_filter", "synth_easier", "heapa", "heapa_fixed", "heapa_boundary",
        "replay", "oracle")
REPLAY = {"groups": 4, "capacity": 256, "alpha": 0.6, "tau": 10.0, "beta": 0.4, "clip": 0.2}


def toy_gradient(y, p_now, adv, level_ids, n_levels: int, weight=None, clip: float | None = None,
                 p_old=None) -> np.ndarray:
    """Per-level sum of ``w * A * (y - p_now)`` over the groups (the logit score of a Bernoulli);
    with ``p_old``, each sample also carries PPO's ratio ``pi_now(y) / pi_old(y)`` and is dropped
    where the clip at ``1 +- clip`` stops its gradient.

    =========  ==========  ==============================================
    y          ``(N, G)``  0/1 rewards of N groups of G samples
    p_now      ``(N,)``    the current pass rate of each group's prompt
    adv        ``(N, G)``  advantages
    level_ids  ``(N,)``    each prompt's level
    weight     ``(N,)``    per-group weights (e.g. PER's), or ``None``
    p_old      ``(N,)``    the pass rate when the group was sampled, or ``None``
    return     ``(L,)``    the summed gradient per level
    =========  ==========  ==============================================
    """
    g = adv * (y - p_now[:, None])
    if p_old is not None:
        ratio = np.where(y == 1, p_now[:, None] / p_old[:, None], (1 - p_now[:, None]) / (1 - p_old[:, None]))
        clipped = ((adv > 0) & (ratio > 1 + clip)) | ((adv < 0) & (ratio < 1 - clip))
        g = np.where(clipped, 0.0, ratio * g)
    if weight is not None:
        g = g * np.asarray(weight)[:, None]
    out = np.zeros(n_levels)
    np.add.at(out, level_ids, g.sum(1))
    return out


def toy_run(arm: str, seed: int, steps: int, prompts: int = 8, G: int = 8, toy: ToyCurriculum = ToyCurriculum(),
            eval_every: int = 5, low_fraction: float = 0.5, passes: float = 2.0) -> dict:
    """GRPO on the curriculum toy, the prompts chosen by ``arm``; returns the curve.

    ============  ======================================================================
    arm           ``uniform`` (fixed pool); ``skip_extremes`` (uniform over the prompts whose
                  last pass rate was strictly between 0 and 1, or never measured: a skipped
                  prompt is never drawn again); ``pass_filter`` (the registered sampler's
                  rule, :func:`~rlcourse.methods.data_scarcity.eligible` with ``(0, 1)``: a
                  prompt at 0 or 1 rests for a cooldown of ``passes`` passes over the seed
                  pool, then may be drawn again); ``synth_easier`` (``pass_filter``, and an
                  all-failed prompt of level d spawns up to 2 prompts of level d - 1 with its
                  offset); ``heapa``, ``heapa_fixed`` (no growth), ``heapa_boundary`` (the
                  :class:`~rlcourse.methods.heapa_pool.HeapPool`, growth in the band (0.1, 0.7));
                  ``replay`` (uniform fresh groups plus :data:`REPLAY` ``groups`` replayed from
                  a freshness-aware PER buffer, PPO's clipped ratio and PER weights on them);
                  ``oracle`` (draws without replacement, weights P(informative) of the TRUE
                  pass rates)
    returns       ``rollouts (E,)`` fresh rollouts spent at each check, ``accuracy (E,)``
                  held-out mean pass rate, ``zero_var (steps,)`` share of all-equal fresh
                  groups, ``pool (steps,)`` pool size, ``theta`` the final skills
    ============  ======================================================================

    Every arm's step is the summed gradient divided by the number of *fresh* rollouts
    (``prompts * G``): replayed groups add to the step; they do not shrink the fresh groups' share
    of it, so the replay arm is not handicapped by a smaller effective learning rate.
    """
    from ..methods.data_scarcity import cooldown_steps, eligible, filtered_draw
    from ..methods.heapa import informative_probability
    from ..methods.heapa_pool import HeapPool
    from ..replay import ReplayBuffer, group_priority

    if arm not in ARMS:
        raise ValueError(f"unknown toy arm {arm!r}; the arms are {ARMS}")
    rng, gen = np.random.default_rng([seed, 7]), torch.Generator().manual_seed(seed)
    levels, offsets = toy_prompts(toy, toy.per_level, np.random.default_rng([seed, 1]))
    held = toy_prompts(toy, toy.held_per_level, np.random.default_rng([seed, 2]))
    lv, off = list(levels), list(offsets)  # grow with children
    rates, at, kids = [math.nan] * len(lv), [0] * len(lv), [0] * len(lv)
    cooldown = cooldown_steps(len(lv), prompts, passes)
    theta = np.array(toy.start, dtype=float)
    hp = None
    if arm.startswith("heapa"):
        hp = HeapPool(len(lv), low_fraction)
        for i in range(len(lv)):
            hp.add(i)
    buf = ReplayBuffer(REPLAY["capacity"], REPLAY["alpha"], REPLAY["tau"]) if arm == "replay" else None
    curve_r, curve_a, zero_var, sizes = [0], [toy_accuracy(theta, held)], [], []
    for step in range(1, steps + 1):
        if arm in ("uniform", "replay"):
            ids = torch.randperm(len(lv), generator=gen)[:prompts].tolist()
        elif arm == "skip_extremes":
            r = np.array(rates)
            ok = np.flatnonzero(~((r == 0) | (r == 1)))
            ok = ok if len(ok) >= prompts else np.arange(len(lv))
            ids = ok[torch.randperm(len(ok), generator=gen)[:prompts].numpy()].tolist()
        elif arm in ("pass_filter", "synth_easier"):
            ids = filtered_draw(eligible(rates, at, step, 0.0, 1.0, cooldown), prompts, gen)
        elif arm == "oracle":
            w = torch.as_tensor(informative_probability(_sigmoid(theta[np.array(lv)] + np.array(off)), G) + 1e-12)
            ids = torch.multinomial(w, prompts, replacement=False, generator=gen).tolist()
        else:
            rids = hp.draw(prompts, gen, "boundary" if arm == "heapa_boundary" else "medium")
            ids = [hp.records[r].item for r in rids]
        L, O = np.array(lv)[ids], np.array(off)[ids]
        p = _sigmoid(theta[L] + O)
        y = (rng.random((len(ids), G)) < p[:, None]).astype(float)
        std = y.std(1, ddof=1, keepdims=True)
        adv = (y - y.mean(1, keepdims=True)) / (std + 1e-6)  # GRPO, group-normalised
        grad = toy_gradient(y, p, adv, L, toy.levels)
        if buf is not None:
            buf.refresh(step)
            if len(buf) >= REPLAY["groups"]:
                slots, wts = buf.sample(REPLAY["groups"], torch.rand(REPLAY["groups"], generator=gen,
                                                                     dtype=torch.float64).numpy(), REPLAY["beta"])
                old = [buf.items[s] for s in slots.tolist()]
                Lr = np.array([o[0] for o in old])
                pn = _sigmoid(theta[Lr] + np.array([o[1] for o in old]))
                grad = grad + toy_gradient(np.stack([o[2] for o in old]), pn, np.stack([o[3] for o in old]), Lr,
                                           toy.levels, weight=wts, clip=REPLAY["clip"],
                                           p_old=np.array([o[4] for o in old]))
            for j in range(len(ids)):
                buf.add((L[j], O[j], y[j], adv[j], p[j]), group_priority(torch.as_tensor(y[j]), "advantage"), step)
        step_theta = grad / (len(ids) * G)
        theta = theta + toy.lr * step_theta
        theta[1:] += toy.lr * toy.transfer * step_theta[:-1]
        zero_var.append(float((std[:, 0] == 0).mean()))
        for j, i in enumerate(ids):
            rates[i], at[i] = float(y[j].mean()), step
        if arm == "synth_easier":
            for i in ids:
                if rates[i] == 0.0 and kids[i] < 2 and lv[i] > 0:
                    kids[i] += 1
                    lv.append(lv[i] - 1)
                    off.append(off[i])
                    rates.append(math.nan), at.append(0), kids.append(0)
        if hp is not None:
            for r, i in zip(rids, ids):
                hp.score(r, rates[i] * G, G)
                rec = hp.records[r]
                if arm != "heapa_fixed" and 0.1 < rec.rate < 0.7 and len(rec.children) < 2:
                    lv.append(lv[i])
                    off.append(off[i] + rng.normal(0.0, toy.child_jitter))
                    rates.append(math.nan), at.append(0), kids.append(0)
                    hp.add(len(lv) - 1, parent=r)
        sizes.append(len(hp) if hp is not None else len(lv))
        if step % eval_every == 0 or step == steps:
            curve_r.append(step * prompts * G)
            curve_a.append(toy_accuracy(theta, held))
    return {"rollouts": np.array(curve_r), "accuracy": np.array(curve_a), "zero_var": np.array(zero_var),
            "pool": np.array(sizes), "theta": theta}


TOY_MODULES = ("rlcourse.methods.data_scarcity", "rlcourse.methods.heapa", "rlcourse.methods.heapa_pool",
               "rlcourse.replay")


def run_toy_cell(arm: str, seed: int, sizes: dict) -> dict:
    """:func:`toy_run` for arm ``arm`` of :data:`ARMS` from ``seed``, every other argument read from
    ``sizes`` (``steps``, ``prompts``, ``G``, ``eval_every``, ``low_fraction``, ``passes``, and ``toy``:
    the :class:`ToyCurriculum` fields); its output as lists."""
    toy = ToyCurriculum(**{**sizes["toy"], "start": tuple(sizes["toy"]["start"])})
    out = toy_run(arm, seed, sizes["steps"], sizes["prompts"], sizes["G"], toy=toy, eval_every=sizes["eval_every"],
                  low_fraction=sizes["low_fraction"], passes=sizes["passes"])
    return {k: v.tolist() for k, v in out.items()}


def toy_study(arms: tuple, seeds: int, steps: int, prompts: int = 8, G: int = 8, toy: ToyCurriculum = ToyCurriculum(),
              eval_every: int = 5, low_fraction: float = 0.5, passes: float = 2.0) -> Study:
    """Every arm of ``arms`` on seeds ``0 .. seeds - 1`` with :func:`toy_run`'s other arguments: one
    study for both chapters (a cell is the same whichever chapter asks for it)."""
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise ValueError(f"unknown toy arms {sorted(unknown)}; the arms are {ARMS}")
    sizes = {"steps": steps, "prompts": prompts, "G": G, "eval_every": eval_every, "low_fraction": low_fraction,
             "passes": passes, "toy": {**asdict(toy), "start": list(toy.start)}}
    return Study(name="curriculum-toy", arms=tuple(arms), seeds=tuple(range(seeds)), run=run_toy_cell, sizes=sizes,
                 modules=TOY_MODULES)


def rollouts_to_target(rollouts: np.ndarray, accuracy: np.ndarray, target: float, budget: int) -> tuple[float, bool]:
    """First rollout count at which ``accuracy >= target``; ``(budget, True)`` if never (censored:
    the true count is at least the budget).

    ======== ====== =======================================
    rollouts (E,)   rollouts spent at each check
    accuracy (E,)   held-out accuracy at each check
    returns         float, bool   rollouts to target, censored?
    ======== ====== =======================================
    """
    rollouts, accuracy = np.asarray(rollouts), np.asarray(accuracy)
    if rollouts.shape != accuracy.shape or rollouts.ndim != 1:
        raise ValueError(f"rollouts {rollouts.shape} and accuracy {accuracy.shape} must be equal 1-D shapes")
    hit = np.flatnonzero((accuracy >= target) & (rollouts <= budget))
    return (float(rollouts[hit[0]]), False) if len(hit) else (float(budget), True)
