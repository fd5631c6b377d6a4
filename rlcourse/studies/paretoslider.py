"""The ParetoSlider chapter's study: one preference-conditioned flow model against separately trained
fixed-trade-off models, in 2-D and on 8x8 digits (the method is in :mod:`rlcourse.generative.paretoslider`).

Two grids on the one runner (:func:`rlcourse.studies.runner.run_study`), one cell function
(:func:`run_cell`):

1. **2-D** (``paretoslider``, :func:`ring_study`): on the profile's ``toy_seeds`` seeds, the pre-trained
   ring model (``"pre-trained"``), a fixed model per omega_1 in :data:`FIXED` (``"fixed 0.25"``), the same
   with a fifth of the iterations (``"fixed 0.25 equal calls"``), and the conditioned model with late and
   with early scalarisation (``"conditioned late"``, ``"conditioned early"``).
2. **digits** (``paretoslider-digits``, :func:`digits_study`): on one seed, the pre-trained digits model
   (``"digits pre-trained"``), fixed models at omega_1 in :data:`DIGITS_FIXED` (``"digits fixed 0.5"``) and
   one conditioned model (``"digits conditioned"``).

:func:`run_paretoslider_experiment` runs both and computes the fronts' hypervolumes and rank correlations
from the cells' objectives; :func:`paretoslider_verdicts` evaluates :data:`CLAIMS` on its output.
"""
from __future__ import annotations

import copy
import functools

import numpy as np
import torch

from ..claims import Claim, evaluate
from ..generative import paretoslider as PS
from ..generative.flow import digits_classifier, load_flow, ring_centres, sample_ode
from ..profiles import Profile, one_torch_thread
from ..profiles import profile as get_profile
from .runner import Study, run_study

FIXED = (0.0, 0.25, 0.5, 0.75, 1.0)  # the fixed models' omega_1 (2-D)
DIGITS_FIXED = (0.0, 0.5, 1.0)  # the fixed models' omega_1 (digits)
REF = (-1.0, -1.0)  # the 2-D hypervolume's reference point
DIGITS_REF = (0.0, 0.0)
SHOWN = (0.0, 0.5, 1.0)  # omega_1 of the conditioned model's displayed 2-D samples

RING_ARMS = (("pre-trained",) + tuple(f"fixed {w}" for w in FIXED) + tuple(f"fixed {w} equal calls" for w in FIXED)
             + ("conditioned late", "conditioned early"))
DIGITS_ARMS = ("digits pre-trained",) + tuple(f"digits fixed {w}" for w in DIGITS_FIXED) + ("digits conditioned",)
ARMS = RING_ARMS + DIGITS_ARMS
MODULES = ("rlcourse.generative.paretoslider", "rlcourse.generative.flow")


def sizes_for(prof: Profile) -> dict:
    """The budget of both grids in ``prof`` (JSON: it keys the cache)."""
    iters = prof.pick(6, 150, 400)
    return {"profile": prof.name, "iters": iters, "eq_iters": max(1, iters // len(FIXED)),
            "groups": prof.pick(4, 8, 16), "group_size": prof.pick(8, 16, 16), "lr": 1e-3,
            "n_eval": prof.pick(256, 2000, 5000), "ode_steps": prof.pick(6, 10, 20), "grid": 11,
            "digits_iters": prof.pick(4, 100, 400), "digits_grid": 5}


def _train(base, reward_fn, iters: int, sizes: dict, seed: int, **kw):
    """A copy of ``base`` fine-tuned by :func:`~rlcourse.generative.paretoslider.train_slider`, and its log."""
    model = copy.deepcopy(base).train()
    log = PS.train_slider(model, reward_fn, iters, sizes["groups"], sizes["group_size"], sizes["lr"], seed=seed,
                          ode_steps=sizes["ode_steps"], **kw)
    return model, log


def _ring_cell(arm: str, seed: int, sizes: dict) -> dict:
    base, info = load_flow("ring", get_profile(sizes["profile"]))
    steps, n_eval, objective = sizes["ode_steps"], sizes["n_eval"], PS.ring_objectives
    x0 = torch.randn(600, 2, generator=torch.Generator().manual_seed(7))  # the displayed samples' noise
    if arm == "pre-trained":
        with torch.no_grad():
            shown = sample_ode(base, x0, steps)
        return {"J": PS.evaluate_front(base, [0.5], objective, n_eval, steps)[0].tolist(),
                "samples": shown.numpy().tolist(), "pretrain_seconds": info["seconds"]}
    if arm.startswith("fixed"):
        w1 = float(arm.split()[1])
        iters = sizes["eq_iters"] if arm.endswith("equal calls") else sizes["iters"]
        model, log = _train(base, PS.ring_rewards, iters, sizes, 100 * seed + FIXED.index(w1), fixed_omega=w1)
        return {"J": PS.evaluate_front(model, [w1], objective, n_eval, steps)[0].tolist(),
                "reward_calls": log["reward_calls"]}
    kind = arm.split()[1]
    model, log = _train(base, PS.ring_rewards, sizes["iters"], sizes, 100 * seed + 50, scalarisation=kind)
    out = {"J": PS.evaluate_front(model, np.linspace(0, 1, sizes["grid"]), objective, n_eval, steps).tolist(),
           "reward_calls": log["reward_calls"]}
    if kind == "late":
        with torch.no_grad():
            out["samples"] = {str(w1): sample_ode(model, x0, steps, torch.full((600, 1), 2 * w1 - 1)).numpy().tolist()
                              for w1 in SHOWN}
    return out


def _digits_cell(arm: str, seed: int, sizes: dict) -> dict:
    base, info = load_flow("digits", get_profile(sizes["profile"]))
    reward = functools.partial(PS.digits_rewards, digits_classifier())
    steps, n_eval = sizes["ode_steps"], sizes["n_eval"] // 2
    x0 = torch.randn(8, 64, generator=torch.Generator().manual_seed(3))  # the displayed images' noise
    if arm == "digits pre-trained":
        with torch.no_grad():
            images = sample_ode(base, x0, steps).clamp(-1, 1)
        return {"J": PS.evaluate_front(base, [0.5], reward, n_eval, steps)[0].tolist(),
                "images": images.numpy().tolist(), "pretrain_seconds": info["seconds"]}
    if arm.startswith("digits fixed"):
        w1 = float(arm.split()[2])
        model, _ = _train(base, reward, sizes["digits_iters"], sizes, 900 + 100 * seed + DIGITS_FIXED.index(w1),
                          fixed_omega=w1)
        return {"J": PS.evaluate_front(model, [w1], reward, n_eval, steps)[0].tolist()}
    model, _ = _train(base, reward, sizes["digits_iters"], sizes, 950 + 100 * seed)
    grid = np.linspace(0, 1, sizes["digits_grid"])
    with torch.no_grad():
        images = np.stack([sample_ode(model, x0, steps, torch.full((8, 1), 2 * float(w) - 1)).clamp(-1, 1).numpy()
                           for w in grid])
    return {"J": PS.evaluate_front(model, grid, reward, n_eval, steps).tolist(), "images": images.tolist()}


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """One arm of :data:`ARMS` on one seed, from the cached pre-trained flow model (``sizes``:
    :func:`sizes_for`). Objectives ``J`` are in natural units: ``(E cos theta, E sin theta)`` in 2-D,
    ``(P("0"), P("1"))`` on digits; a conditioned model's are evaluated at ``sizes["grid"]`` (digits:
    ``sizes["digits_grid"]``) equally spaced omega_1 in [0, 1] (``K`` of them).

    ================  ================  ===============================================================
    J                 ``(2,)``          objectives of a fixed or pre-trained model
    J                 ``(K, 2)``        objectives of a conditioned model, one row per omega_1
    reward_calls      int               2-D trained arms: the run's reward calls
    samples           ``(600, 2)``      ``"pre-trained"``: samples from fixed noise; ``"conditioned
                                        late"``: a dict ``{"0.0", "0.5", "1.0"}`` of them at those omega_1
    images            ``(8, 64)``       ``"digits pre-trained"``: images from fixed noise
    images            ``(K, 8, 64)``    ``"digits conditioned"``: the same, one block per omega_1
    pretrain_seconds  float             pre-trained arms: the flow model's pre-training seconds
    ================  ================  ===============================================================
    """
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {ARMS}")
    with one_torch_thread():
        return _digits_cell(arm, seed, sizes) if arm in DIGITS_ARMS else _ring_cell(arm, seed, sizes)


def ring_study(prof: Profile) -> Study:
    """The 2-D arms (:data:`RING_ARMS`) on the seeds ``0 .. toy_seeds - 1``."""
    return Study(name="paretoslider", arms=RING_ARMS, seeds=tuple(range(prof.toy_seeds)), run=run_cell,
                 sizes=sizes_for(prof), modules=MODULES)


def digits_study(prof: Profile) -> Study:
    """The digits arms (:data:`DIGITS_ARMS`) on seed 0: the digits part shows the slider, the 2-D part
    carries the statistics."""
    return Study(name="paretoslider-digits", arms=DIGITS_ARMS, seeds=(0,), run=run_cell, sizes=sizes_for(prof),
                 modules=MODULES)


def _monotone(J: np.ndarray, sign: int) -> float:
    return float(np.all(sign * np.diff(J) > 0))


def run_paretoslider_experiment(prof: Profile | None = None, **run_kw) -> dict:
    """One omega-conditioned model against separate fixed-omega models, in 2-D and on digits:
    :func:`ring_study` and :func:`digits_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`).

    2-D (ring; rewards :func:`~rlcourse.generative.paretoslider.ring_rewards`, ``r1 = cos theta`` and
    ``r2 = 4 sin theta`` of each sample's angle): for each of the profile's ``toy_seeds`` seeds, (a) one
    fixed model per omega_1 in :data:`FIXED`, (b) one conditioned model with late scalarisation, (c) one
    with early scalarisation, (d) the fixed models again with a fifth of the iterations each, so that the
    five together use as many reward calls as the one conditioned model. The hypervolume uses the
    reference point :data:`REF`; the conditioned models' uses their points at :data:`FIXED`.
    Digits (rewards P(0), P(1) from a logistic-regression classifier): a conditioned model and fixed
    models at omega_1 in :data:`DIGITS_FIXED`, on one seed.

    =============================== =============== ==================================================
    fixed_J, fixed_eq_J             ``(S, 5, 2)``   the fixed models' objectives per seed
    cond_J, early_J                 ``(S, 11, 2)``  the conditioned models' objectives on ``grid``
    hv_fixed, hv_fixed_eq, hv_cond  ``(S,)``        hypervolumes per seed (``hv_cond_grid``: on the
    hv_early                                        whole grid)
    spearman_J1, spearman_J2        ``(S,)``        rank correlation of omega_1 with each objective
    monotone_J1, monotone_J2        ``(S,)``        1 where the objective moves strictly monotonically
    digits_fixed_J, digits_cond_J   ``(3, 2)``,     the digits models' objectives
                                    ``(5, 2)``
    seconds                         float           the grids' wall seconds on one core, as first run
    =============================== =============== ==================================================
    """
    prof = prof or get_profile()
    ring = run_study(ring_study(prof), **run_kw)
    digits = run_study(digits_study(prof), **run_kw)
    sizes, seeds = ring.study.sizes, len(ring.study.seeds)
    grid = np.linspace(0, 1, sizes["grid"])

    def J(results, arm):
        return np.asarray(results.values(arm, "J"), dtype=float)

    def first(results, arm, metric, dtype=np.float32):
        return np.asarray(results.values(arm, metric)[0], dtype=dtype)

    fixed_J = np.stack([J(ring, f"fixed {w}") for w in FIXED], axis=1)
    fixed_eq_J = np.stack([J(ring, f"fixed {w} equal calls") for w in FIXED], axis=1)
    cond_J, early_J = J(ring, "conditioned late"), J(ring, "conditioned early")
    on_fixed = [int(np.argmin(np.abs(grid - w))) for w in FIXED]
    shown = ring.values("conditioned late", "samples")[0]  # the first seed's samples
    samples = {w: np.asarray(shown[str(w)], dtype=np.float32) for w in SHOWN}
    samples["base"] = first(ring, "pre-trained", "samples")
    calls = {a: ring.values(a, "reward_calls")[0] for a in ring.study.arms if a != "pre-trained"}
    res: dict = {"fixed_omegas": np.array(FIXED), "grid": grid, "seeds": seeds, "iters": sizes["iters"],
                 "batch": sizes["groups"] * sizes["group_size"],
                 "ring_pretrain_s": ring.values("pre-trained", "pretrain_seconds")[0], "ref": np.array(REF),
                 "base_J": first(ring, "pre-trained", "J"), "cond_reward_calls": calls["conditioned late"],
                 "fixed_reward_calls": sum(calls[f"fixed {w}"] for w in FIXED), "eq_iters": sizes["eq_iters"],
                 "fixed_eq_reward_calls": sum(calls[f"fixed {w} equal calls"] for w in FIXED),
                 "fixed_eq_J": fixed_eq_J}
    res["hv_fixed_eq"] = np.array([PS.hypervolume_2d(fixed_eq_J[s], REF) for s in range(seeds)])
    res["fixed_J"], res["cond_J"], res["early_J"] = fixed_J, cond_J, early_J
    res["hv_fixed"] = np.array([PS.hypervolume_2d(fixed_J[s], REF) for s in range(seeds)])
    res["hv_cond"] = np.array([PS.hypervolume_2d(cond_J[s, on_fixed], REF) for s in range(seeds)])
    res["hv_cond_grid"] = np.array([PS.hypervolume_2d(cond_J[s], REF) for s in range(seeds)])
    res["hv_early"] = np.array([PS.hypervolume_2d(early_J[s, on_fixed], REF) for s in range(seeds)])
    res["spearman_J1"] = np.array([PS.spearman(grid, cond_J[s, :, 0]) for s in range(seeds)])
    res["spearman_J2"] = np.array([PS.spearman(grid, cond_J[s, :, 1]) for s in range(seeds)])
    res["monotone_J1"] = np.array([_monotone(cond_J[s, :, 0], 1) for s in range(seeds)])
    res["monotone_J2"] = np.array([_monotone(cond_J[s, :, 1], -1) for s in range(seeds)])
    res["ring_samples"] = samples
    res["centres"] = ring_centres().numpy()

    d_grid = np.linspace(0, 1, sizes["digits_grid"])
    res["digits_pretrain_s"] = digits.values("digits pre-trained", "pretrain_seconds")[0]
    res["digits_fixed_omegas"], res["digits_grid"] = np.array(DIGITS_FIXED), d_grid
    res["digits_iters"] = sizes["digits_iters"]
    res["digits_base_J"] = first(digits, "digits pre-trained", "J")
    res["digits_fixed_J"] = np.stack([first(digits, f"digits fixed {w}", "J") for w in DIGITS_FIXED])
    res["digits_cond_J"] = first(digits, "digits conditioned", "J")
    res["digits_hv_fixed"] = PS.hypervolume_2d(res["digits_fixed_J"], DIGITS_REF)
    res["digits_hv_cond"] = PS.hypervolume_2d(res["digits_cond_J"][[0, 2, 4]], DIGITS_REF)
    res["digits_images"] = first(digits, "digits conditioned", "images")
    res["digits_base_images"] = first(digits, "digits pre-trained", "images")
    res["seconds"] = ring.wall_seconds + digits.wall_seconds
    return res


# ----------------------------------------------------------------------------------------------
# the chapter's claims
# ----------------------------------------------------------------------------------------------
PAPER = ("ParetoSlider: Diffusion Models Post-Training for Continuous Reward Control (Golan et al., 2026, "
         "arXiv:2604.20816)")
_MATCHES = ("Our single preference-conditioned model matches or exceeds the performance of baselines trained "
            "separately for fixed reward trade-offs, while uniquely providing fine-grained control over "
            "competing generative goals.")
_SETTING = ("8-mode 2-D ring flow model (MLP velocity field), NFT loss, rewards cos(theta) and 4 sin(theta); "
            "hypervolume of the objectives (E cos, E sin) at omega_1 in {0, .25, .5, .75, 1}, reference (-1, -1)")
MATCH_TOLERANCE = 0.97  # "matches": at least 97% of the fixed models' hypervolume, fixed before the runs

CLAIMS = {
    "matches": Claim(
        key="paretoslider/matches-fixed", paper=PAPER, statement=_MATCHES, source="abstract",
        setting=_SETTING + "; each fixed model trained as long as the conditioned one (the paper's comparison)",
        metric="hypervolume of the conditioned model / hypervolume of the five fixed models, per seed",
        method="one conditioned model", baseline=None, reference=MATCH_TOLERANCE, kind="greater", margin=0.0,
        paper_number="matches or exceeds (qualitative)"),
    "equal-calls": Claim(
        key="paretoslider/equal-calls", paper=PAPER, statement=_MATCHES, source="abstract",
        setting=_SETTING + "; the five fixed models share the conditioned model's total reward calls "
        "(a fifth of its iterations each)",
        metric="hypervolume of the conditioned model / hypervolume of the five fixed models, per seed",
        method="one conditioned model", baseline=None, reference=MATCH_TOLERANCE, kind="greater", margin=0.0,
        paper_number="not reported (the paper compares per model)"),
    "late-vs-early": Claim(
        key="paretoslider/late-vs-early", paper=PAPER, source="the authors' code (per-objective group "
        "normalisation before the weighted sum), and the abstract's case against early scalarisation",
        statement="rewards are normalised per objective within each group before they are weighted (late "
        "scalarisation), rather than weighted into one scalar first",
        setting=_SETTING + "; the second reward is on a 4x larger scale",
        metric="hypervolume of the conditioned model's front, per seed", method="late scalarisation",
        baseline="early scalarisation", kind="greater", margin=0.0),
}


def paretoslider_verdicts(res: dict) -> dict:
    """Evaluate :data:`CLAIMS` on :func:`run_paretoslider_experiment`'s output (paired by seed).

    ========  ======  ==========================================================================
    res       dict    ``hv_cond``, ``hv_fixed``, ``hv_fixed_eq``, ``hv_early``: ``(seeds,)`` each
    returns   dict    claim name -> :class:`rlcourse.claims.Verdict`
    ========  ======  ==========================================================================
    """
    sec = res.get("seconds")
    return {
        "matches": evaluate(CLAIMS["matches"], res["hv_cond"] / res["hv_fixed"], seconds=sec),
        "equal-calls": evaluate(CLAIMS["equal-calls"], res["hv_cond"] / res["hv_fixed_eq"], seconds=sec),
        "late-vs-early": evaluate(CLAIMS["late-vs-early"], res["hv_cond"], res["hv_early"], seconds=sec),
    }
