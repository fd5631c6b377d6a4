"""The noisy-verifier chapter's bandit study: GRPO on a contextual bandit
(:func:`rlcourse.methods.noisy_runs.train_noisy_bandit`) under verifiers with per-sample and
group-rollout noise, with Adam and SGD, each run to a plateau.

Two grids on the runner. First the learning-rate rule (:func:`choose_bandit_lrs`): the *clean*
verifier at each rate of :data:`LR_GRIDS`, on selection seeds disjoint from the reported ones
(:data:`SELECTION_SEEDS` upward). Then the reported grid (:func:`noisy_bandit_study`): every verifier of
:data:`ARMS` on the seeds 0, 1, ... at the chosen rates. A cell is one verifier on one seed; a seed
fixes the initial logits, the prompts, the sampling uniforms and the noise draws, so the cells of one
seed differ only in the verifier (common random numbers). The score is the mean of two fixed late
evaluations (:func:`late_window`), compared with the clean run of the same seed.

The tiny language-model run and the claims stay in :mod:`rlcourse.methods.noisy_runs`.
"""
from __future__ import annotations

import time

import numpy as np

from ..claims import Verdict, evaluate
from ..methods.noisy_runs import CLAIMS, _softmax, bandit_init, train_noisy_bandit
from ..profiles import Profile
from .runner import Results, Study, run_study

RATES = (0.0, 0.1, 0.2, 0.3, 0.4)
LR_GRIDS = {"adam": (0.02, 0.05, 0.1), "sgd": (1.0, 3.0, 10.0)}  # the rates the rule chooses from
SELECTION_SEEDS = 100  # the rule runs on seeds 100, 101, ...; the reported runs use 0, 1, ...
MODULES = ("rlcourse.methods.noisy_runs", "rlcourse.methods.noisy")


def _arms() -> dict[str, tuple[str, str, float, float, float]]:
    verifiers = [("adam", mode, rho, rho, rho) for mode in ("sample", "group") for rho in RATES
                 if not (mode == "group" and rho == 0.0)]  # the clean run is shared by both modes
    verifiers += [("adam", "strict", 0.4, 0.0, 0.4), ("adam", "lenient", 0.4, 0.4, 0.0)]
    verifiers += [("sgd", "sample", rho, rho, rho) for rho in (0.0, 0.2, 0.4)]
    return {f"{opt} {structure} {rho}": (opt, structure, rho, r0, r1) for opt, structure, rho, r0, r1 in verifiers}


ARMS = _arms()
"""The bandit's arms, ``"<optimizer> <structure> <rho>"`` -> ``(optimizer, structure, rho, rho0, rho1)``:
Adam under symmetric per-sample and group noise at every rate of :data:`RATES`, strict (false negatives
only) and lenient (false positives only) verifiers at 0.4, and SGD under per-sample noise at 0, 0.2 and
0.4 (for the Adam question)."""


def late_window(curve: np.ndarray, eval_steps: np.ndarray, late: tuple[int, int]) -> np.ndarray:
    """Mean of the two fixed late evaluations ``late`` (steps) of each seed's curve, ``(N,)``."""
    cols = [int(np.flatnonzero(eval_steps == s)[0]) if np.any(eval_steps == s) else None for s in late]
    if None in cols:
        raise ValueError(f"late evaluation steps {late} are not among the evaluation steps {eval_steps.tolist()}")
    return curve[:, cols].mean(1)


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """One verifier of :data:`ARMS` on one seed at its optimiser's rate ``sizes["lrs"][optimizer]``.

    ========== ======== =======================================================
    curve      ``(E,)`` expected accuracy at ``eval_steps``
    eval_steps ``(E,)`` the evaluation steps (0 included)
    late       float    mean of the two late evaluations ``sizes["late"]``
    greedy     float    final greedy accuracy
    ========== ======== =======================================================
    """
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(ARMS)}")
    opt, structure, _, rho0, rho1 = ARMS[arm]
    mode = "group" if structure == "group" else "sample"
    out = train_noisy_bandit(rho0, rho1, mode, opt, sizes["lrs"][opt], sizes["steps"], [seed],
                             eval_every=sizes["every"])
    return {"curve": out["curve"][0].tolist(), "eval_steps": out["eval_steps"].tolist(),
            "late": float(late_window(out["curve"], out["eval_steps"], tuple(sizes["late"]))[0]),
            "greedy": float(out["greedy"][0])}


def _schedule(P: Profile) -> dict:
    """Steps, evaluation interval and the two late evaluations of the profile."""
    steps = P.pick(smoke=100, book=2000)
    return {"steps": steps, "every": P.pick(smoke=25, book=100), "late": [P.pick(smoke=75, book=1500), steps]}


def noisy_bandit_study(P: Profile, lrs: dict) -> Study:
    """Every verifier of :data:`ARMS` on the profile's seeds (at least 20 in the book), at the rates
    ``lrs`` (optimizer -> learning rate, from :func:`choose_bandit_lrs`)."""
    missing = {opt for opt, *_ in ARMS.values()} - set(lrs)
    if missing:
        raise ValueError(f"lrs has no learning rate for {sorted(missing)}; got {lrs!r}")
    seeds = tuple(range(P.pick(smoke=P.toy_seeds, book=max(20, P.toy_seeds))))
    sizes = {**_schedule(P), "lrs": {k: float(v) for k, v in lrs.items()}}
    return Study(name="noisy_verifiers", arms=tuple(ARMS), seeds=seeds, run=run_cell, sizes=sizes,
                 verdicts=study_verdicts, modules=MODULES)


# ---------------------------------------------------------------------------- the learning-rate rule
def lr_arm(opt: str, lr: float) -> str:
    """The learning-rate study's arm for optimiser ``opt`` at rate ``lr``, e.g. ``"adam lr=0.1"``."""
    return f"{opt} lr={float(lr)!r}"


def run_lr_cell(arm: str, seed: int, sizes: dict) -> dict:
    """The clean verifier with one optimiser at one rate on one selection seed: ``quarter``, the
    expected accuracy after a quarter of the steps."""
    arms = tuple(lr_arm(o, x) for o, grid in sizes["grids"].items() for x in grid)
    if arm not in arms:
        raise ValueError(f"unknown arm {arm!r}; the arms are {arms}")
    opt, _, lr = arm.partition(" lr=")
    steps = sizes["steps"]
    out = train_noisy_bandit(0.0, 0.0, "sample", opt, float(lr), steps, [seed], eval_every=sizes["every"])
    return {"quarter": float(out["curve"][0, np.searchsorted(out["eval_steps"], steps // 4)])}


def choose_bandit_lrs(prof: Profile, grids=None) -> dict:
    """The rule that fixes each optimiser's learning rate before the reported bandit runs.

    On selection seeds ``100, 101, ...`` (10 in the book profile, disjoint from the reported seeds
    0-19), run the *clean* verifier only (no noisy arm is looked at) at each rate of the optimiser's grid
    for the experiment's number of steps, and take the rate whose seed-mean expected accuracy after a
    quarter of the steps is highest: the one that reaches its plateau soonest.

    ======== ============================ ============================================
    key      shape                        meaning
    ======== ============================ ============================================
    lrs      dict                         optimiser -> chosen rate
    quarter  dict                         optimiser -> ``(len(grid),)`` accuracy after a quarter
    seeds    list                         the selection seeds
    grids    dict                         optimiser -> the rates tried
    ======== ============================ ============================================
    """
    grids = {k: tuple(v) for k, v in (LR_GRIDS if grids is None else grids).items()}
    for opt, grid in grids.items():
        if not grid:
            raise ValueError(f"the grid of {opt!r} is empty")
    seeds = list(range(SELECTION_SEEDS, SELECTION_SEEDS + prof.pick(smoke=1, book=10)))
    sched = _schedule(prof)
    study = Study(name="noisy_verifiers-lr", arms=tuple(lr_arm(o, lr) for o, grid in grids.items() for lr in grid),
                  seeds=tuple(seeds), run=run_lr_cell, modules=MODULES,
                  sizes={"steps": sched["steps"], "every": sched["every"], "grids": grids})
    res = run_study(study)
    lrs, quarter = {}, {}
    for opt, grid in grids.items():
        q = [float(np.mean(res.values(lr_arm(opt, lr), "quarter"))) for lr in grid]
        quarter[opt], lrs[opt] = np.array(q), float(grid[int(np.argmax(q))])
    return {"lrs": lrs, "quarter": quarter, "seeds": seeds, "grids": grids}


# ---------------------------------------------------------------------------- the experiment
def summarise(results: Results) -> dict:
    """``late_acc``, ``curves`` and ``greedy`` keyed by ``(optimizer, structure, rho)`` (per-seed
    ``(N,)`` and ``(N, E)`` arrays; the clean run also under ``"group"``), ``eval_steps`` and ``seconds``
    (the grid's wall seconds), from a :func:`noisy_bandit_study`'s results."""
    late_acc, curves, greedy = {}, {}, {}
    for arm, (opt, structure, rho, _, _) in ARMS.items():
        late_acc[(opt, structure, rho)] = np.asarray(results.values(arm, "late"))
        curves[(opt, structure, rho)] = np.asarray(results.values(arm, "curve"))
        greedy[(opt, structure, rho)] = np.asarray(results.values(arm, "greedy"))
    for opt in {opt for opt, *_ in ARMS.values()}:
        for d in (late_acc, curves, greedy):
            d[(opt, "group", 0.0)] = d[(opt, "sample", 0.0)]
    first = (results.study.arms[0], results.study.seeds[0])
    return {"late_acc": late_acc, "curves": curves, "greedy": greedy,
            "eval_steps": np.asarray(results.metrics[first]["eval_steps"]), "seconds": results.wall_seconds}


def run_noisy_bandit(prof: Profile) -> dict:
    """The bandit sweep of :data:`ARMS` over ``seeds`` paired seeds, each run to a plateau, on the study
    runner (cached per cell); the score is the mean of two fixed late evaluations. The clean run
    (rho = 0) is shared by both modes.

    ============ ============================== ==============================================
    late_acc     dict[(opt, structure, rho)]    ``(N,)`` late-window expected accuracy per seed
    curves       dict[(opt, structure, rho)]    ``(N, E)`` expected-accuracy curves
    eval_steps   ``(E,)``                       the evaluation steps
    ============ ============================== ==============================================
    """
    t0 = time.perf_counter()
    choice = choose_bandit_lrs(prof)
    study = noisy_bandit_study(prof, choice["lrs"])
    out = summarise(run_study(study))
    seeds = list(study.seeds)
    return {"seeds": seeds, "steps": study.sizes["steps"], "late": tuple(study.sizes["late"]), "rates": list(RATES),
            "lrs": choice["lrs"], "lr_choice": choice, **out,
            "base": float(np.mean([_softmax(bandit_init(50, 10, s))[:, 0].mean() for s in seeds])),
            "seconds": time.perf_counter() - t0}


def bandit_verdicts(b: dict) -> dict[str, Verdict]:
    """The bandit claims of ``rlcourse.methods.noisy_runs.CLAIMS``, evaluated on
    :func:`run_noisy_bandit`'s output (or :func:`summarise`'s)."""
    L, s = b["late_acc"], b["seconds"]
    clean = L[("adam", "sample", 0.0)]
    drop = {o: L[(o, "sample", 0.0)] - L[(o, "sample", 0.4)] for o in ("adam", "sgd")}
    ctl = evaluate(CLAIMS["bandit-control"], clean, L[("adam", "sample", 0.4)], seconds=s)

    def near_clean(name, key):
        return evaluate(CLAIMS[name], L[key], clean, seconds=s, control=ctl)

    return {
        "bandit-group-20": near_clean("bandit-group-20", ("adam", "group", 0.2)),
        "bandit-sample-20": near_clean("bandit-sample-20", ("adam", "sample", 0.2)),
        "bandit-group-30": near_clean("bandit-group-30", ("adam", "group", 0.3)),
        "bandit-sample-30": near_clean("bandit-sample-30", ("adam", "sample", 0.3)),
        "bandit-control": ctl,
        "bandit-precision": evaluate(CLAIMS["bandit-precision"], L[("adam", "strict", 0.4)],
                                     L[("adam", "lenient", 0.4)], seconds=s, control=ctl),
        "adam": evaluate(CLAIMS["adam"], drop["adam"], drop["sgd"], seconds=s),
    }


def study_verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`bandit_verdicts` on a :func:`noisy_bandit_study`'s results."""
    return bandit_verdicts(summarise(results))
