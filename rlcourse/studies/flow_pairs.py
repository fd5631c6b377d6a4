"""The flow-pairs chapter's study: FDFO against the per-step policy gradient, on the same reward and the
same reward-call budget, on two tasks (digits, the main one, and the 2-D ring).

Two grids on the one runner (:func:`rlcourse.studies.runner.run_study`):

1. **tuning** (``flow_pairs_tuning``): every setting of each arm (FDFO's trust region ``eps`` in {0.03 (the
   paper's), 0.3}; the policy gradient's two learning rates) on :data:`TUNING_SEEDS`, seeds no reported
   run uses. The rule, fixed before any run: each arm takes the setting with the largest evaluation
   reward averaged over its run and the tuning seeds (:func:`choose_settings`).
2. **reported** (``flow_pairs``): each arm at its chosen setting on the profile's ``toy_seeds`` seeds
   ``0 .. n-1``, paired by seed (seed ``s`` trains both arms with the same training seed); the verdicts
   (:func:`rlcourse.generative.fdfo.fdfo_verdicts`) read these runs only.

Evaluation uses deterministic (ODE) samples from fixed noise: the mean reward, and a quality and a
diversity measure per task. A cell's arm reads ``"<task>/<method>/<setting index>"``.
"""
from __future__ import annotations

import copy
import functools
import time

import numpy as np
import torch

from ..generative import fdfo as FD
from ..generative.flow import digits_classifier, digits_data, load_flow, sample_ode
from ..profiles import Profile, one_torch_thread
from ..profiles import profile as get_profile
from .runner import Study, run_study

TASKS = ("digits", "ring")
METHODS = ("fdfo", "pg")
TUNING_SEEDS = (100, 101)  # disjoint from the reported seeds 0 .. toy_seeds - 1


def sizes_for(prof: Profile) -> dict:
    """The budget of both grids in ``prof`` (JSON: it keys the cache)."""
    return {
        "profile": prof.name,
        "pairs": prof.pick(8, 32, 64),
        "steps": prof.pick(5, 20, 40),
        "iters": {"digits": prof.pick(2, 30, 100), "ring": prof.pick(2, 32, 150)},
        "eval_every": {"digits": prof.pick(1, 3, 10), "ring": prof.pick(1, 4, 10)},
        "configs": {
            "fdfo": prof.pick([{"lr": 1e-4, "churn": 1.0, "eps": 0.3}],
                              [{"lr": 1e-4, "churn": 1.0, "eps": 0.03}, {"lr": 1e-4, "churn": 1.0, "eps": 0.3}]),
            "pg": prof.pick([{"lr": 1e-4, "noise": 1.0}],
                            [{"lr": 1e-4, "noise": 1.0}, {"lr": 3e-4, "noise": 1.0}]),
        },
    }


@functools.lru_cache(maxsize=4)
def _task(task: str, profile_name: str):
    """The pre-trained model, reward, evaluator and display noise of ``task`` (built once per process)."""
    prof = get_profile(profile_name)
    steps = sizes_for(prof)["steps"]
    if task == "digits":
        base, _ = load_flow("digits", prof)
        data, _ = digits_data()
        clf = digits_classifier()
        reward = functools.partial(FD.digits_reward, clf)
        x_eval = torch.randn(prof.pick(128, 512, 2000), 64, generator=torch.Generator().manual_seed(6))
        evaluate = functools.partial(_digits_eval, x_eval=x_eval, steps=steps, reward=reward, data=data)
        x_show = torch.randn(10, 64, generator=torch.Generator().manual_seed(8))
    elif task == "ring":
        base, _ = load_flow("ring", prof)
        reward = FD.ring_reward
        x_eval = torch.randn(prof.pick(256, 2000, 5000), 2, generator=torch.Generator().manual_seed(4321))
        evaluate = functools.partial(_ring_eval, x_eval=x_eval, steps=steps)
        x_show = torch.randn(500, 2, generator=torch.Generator().manual_seed(5))
    else:
        raise ValueError(f"unknown task {task!r}; the tasks are {TASKS}")
    return base, reward, evaluate, x_show


def _digits_eval(model, *, x_eval, steps, reward, data):
    return FD._digits_metrics(model, x_eval, steps, reward, data)


def _ring_eval(model, *, x_eval, steps):
    return FD._ring_metrics(model, x_eval, steps)


def arm_name(task: str, method: str, setting: int) -> str:
    return f"{task}/{method}/{setting}"


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train one arm (``"<task>/<method>/<setting>"``) on one seed from the pre-trained model.

    ========  ==================================================================================
    returns   ``eval`` (evaluations x 3 metrics), ``calls`` (reward calls at each evaluation),
              ``show`` (samples of the trained model from the task's fixed display noise)
    ========  ==================================================================================
    """
    task, method, setting = arm.split("/")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r} in arm {arm!r}; the methods are {METHODS}")
    cfg = sizes["configs"][method][int(setting)]
    with one_torch_thread():
        base, reward, evaluate, x_show = _task(task, sizes["profile"])
        model = copy.deepcopy(base).train()
        log = FD._train_arm(method, model, reward, cfg, sizes["iters"][task], sizes["pairs"], sizes["steps"],
                            1000 + 17 * seed, evaluate, sizes["eval_every"][task])
        show = sample_ode(model.eval(), x_show, sizes["steps"])
    if task == "digits":
        show = show.clamp(-1, 1)
    return {"eval": np.asarray(log["eval"]).tolist(), "calls": np.asarray(log["calls"]).tolist(),
            "show": show.numpy().tolist()}


def tuning_study(prof: Profile) -> Study:
    """Every setting of each arm on :data:`TUNING_SEEDS` (the first ``min(2, toy_seeds)`` of them)."""
    sizes = sizes_for(prof)
    arms = tuple(arm_name(t, m, i) for t in TASKS for m in METHODS for i in range(len(sizes["configs"][m])))
    seeds = TUNING_SEEDS[:prof.pick(1, 2, 2)]
    return Study(name="flow_pairs_tuning", arms=arms, seeds=seeds, run=run_cell, sizes=sizes,
                 modules=("rlcourse.generative.fdfo", "rlcourse.generative.flow"))


def choose_settings(tuning) -> dict:
    """The rule: for each task and method, the setting whose evaluation reward, averaged over the run and
    the tuning seeds, is largest. Returns ``{(task, method): setting index}``."""
    sizes = tuning.study.sizes
    chosen = {}
    for task in TASKS:
        for method in METHODS:
            means = [np.mean([np.asarray(e)[:, 0].mean() for e in tuning.values(arm_name(task, method, i), "eval")])
                     for i in range(len(sizes["configs"][method]))]
            chosen[(task, method)] = int(np.argmax(means))
    return chosen


def reported_study(prof: Profile, chosen: dict) -> Study:
    """Each arm at its chosen setting on the seeds ``0 .. toy_seeds - 1``."""
    arms = tuple(arm_name(t, m, chosen[(t, m)]) for t in TASKS for m in METHODS)
    return Study(name="flow_pairs", arms=arms, seeds=tuple(range(prof.toy_seeds)), run=run_cell,
                 sizes=sizes_for(prof), modules=("rlcourse.generative.fdfo", "rlcourse.generative.flow"))


def _curves(results, arms_by_setting: dict, n_settings: int) -> np.ndarray:
    """``(settings, seeds, evaluations, metrics)``, NaN for a setting a grid did not run."""
    first = np.asarray(results.values(next(iter(arms_by_setting.values())), "eval")[0])
    out = np.full((n_settings, len(results.study.seeds)) + first.shape, np.nan)
    for i, arm in arms_by_setting.items():
        out[i] = np.asarray(results.values(arm, "eval"))
    return out


def run_experiment(prof: Profile | None = None, *, jobs: int | None = None) -> dict:
    """Both grids, then the chapter's summary: ``res[task][method]`` holds ``curves`` (settings x reported
    seeds x evaluations x metrics; NaN but for the chosen setting), ``tuning_curves`` (the same over the
    tuning seeds, every setting), ``best``, ``cfg``, ``all_cfgs``, ``final``, ``calls_to_level`` and ``auc``
    per seed; ``res[task]`` also ``calls``, ``base_reward``, ``level`` and the display samples."""
    prof = prof or get_profile()
    t0 = time.perf_counter()
    tuning = run_study(tuning_study(prof), jobs=jobs)
    chosen = choose_settings(tuning)
    main = run_study(reported_study(prof, chosen), jobs=jobs)
    sizes = main.study.sizes
    res: dict = {"seeds": len(main.study.seeds), "tune_seeds": len(tuning.study.seeds), "tuning_seeds":
                 list(tuning.study.seeds), "pairs": sizes["pairs"], "steps": sizes["steps"],
                 "configs": sizes["configs"], "cpu_seconds": tuning.cpu_seconds + main.cpu_seconds}
    for task in TASKS:
        out: dict = {"iters": sizes["iters"][task]}
        shows = {}
        for method in METHODS:
            cfgs, best = sizes["configs"][method], chosen[(task, method)]
            arm = arm_name(task, method, best)
            out["calls"] = np.asarray(main.values(arm, "calls")[0])
            out[method] = {"curves": _curves(main, {best: arm}, len(cfgs)),
                           "tuning_curves": _curves(tuning, {i: arm_name(task, method, i) for i in range(len(cfgs))},
                                                    len(cfgs)),
                           "best": best, "cfg": cfgs[best], "all_cfgs": cfgs}
            shows[method] = np.asarray(main.values(arm, "show")[0])  # the first reported seed's samples
        base, _, _, x_show = _task(task, sizes["profile"])
        shows["base"] = sample_ode(base, x_show, sizes["steps"]).numpy()
        if task == "digits":
            shows["base"] = np.clip(shows["base"], -1, 1)
        out["images" if task == "digits" else "samples"] = shows
        base_reward = float(out["fdfo"]["curves"][out["fdfo"]["best"], 0, 0, 0])
        finals = {m: float(out[m]["curves"][out[m]["best"], :, -1, 0].mean()) for m in METHODS}
        level = base_reward + 0.9 * (max(finals.values()) - base_reward)
        out["base_reward"], out["level"] = base_reward, float(level)
        for m in METHODS:
            c = out[m]["curves"][out[m]["best"]]
            out[m]["final"] = finals[m]
            out[m]["calls_to_level"] = np.array([FD.calls_to_reach(out["calls"], c[s, :, 0], level)
                                                 for s in range(len(c))])
            # area under the reward-vs-calls curve over the budget (evaluations are equally spaced in calls):
            # a finite per-seed measure of "reaches a higher reward sooner"
            out[m]["auc"] = c[:, :, 0].mean(axis=1)
        res[task] = out
    res["seconds"] = time.perf_counter() - t0
    return res
