"""The DReST chapter's language-model study: the ``drest_choice`` base model trained with RLOO under the
default reward and under DReST (the task, the rewards and their math are in
:mod:`rlcourse.methods.drest_lm`), measured on held-out prompts; then the paper's LLM claim and its
verdicts.

The arms are ``"default"`` and ``"drest"`` (:data:`ARMS`), the seeds the profile's ``seeds``; one cell
trains one copy of the base model from its own seed (:func:`run_lm_cell`), so a cell's numbers do not
depend on which cells ran before it. The base model's held-out metrics are one cell of their own
(:func:`lm_base_study`). :func:`run_drest_lm_experiment` runs both on the study runner (cached per cell)
and rebuilds the dict the chapter reads; :func:`drest_lm_verdicts` evaluates :data:`CLAIMS` on it.
"""
from __future__ import annotations

import copy
from typing import Sequence

import numpy as np

from ..claims import Claim, Verdict, evaluate
from ..methods.drest_lm import MODES, STATE_KEY, TASK_NAME, evaluate_choices, make_drest_lm_reward
from ..profiles import Profile, one_torch_thread
from ..tasks import get_task
from .drest import PAPER, SOURCE
from .runner import Results, Study, run_study

ARMS = MODES
LM_BASE = "base model"  # the one arm of the base model's study
METRICS = ("p_long", "neutrality", "usefulness", "valid")  # held-out, from evaluate_choices
TRAIN_KEYS = ("p_long", "usefulness", "valid", "reward")  # per training step, from the reward's log
MODULES = ("rlcourse.methods.drest_lm", "rlcourse.rewards.drest", "rlcourse.train", "rlcourse.lm.model",
           "rlcourse.lm.sampling", "rlcourse.lm.zoo")


def drest_lm_config(prof: Profile) -> dict:
    """The experiment's sizes for a profile."""
    return {"steps": prof.pick(smoke=3, book=50, full=200), "prompts": prof.pick(smoke=4, book=16, full=32),
            "G": prof.pick(smoke=4, book=8, full=8), "lr": prof.pick(smoke=1e-3, book=5e-4, full=5e-4),
            "lam": 0.9, "eval_every": prof.pick(smoke=3, book=5, full=10),
            "eval_prompts": prof.pick(smoke=16, book=128, full=512), "seeds": prof.seeds,
            "strength": 1.0}


def lm_sizes(prof: Profile) -> dict:
    """The sizes every cell reads: :func:`drest_lm_config` less the seeds, and the profile."""
    return {**{k: v for k, v in drest_lm_config(prof).items() if k != "seeds"}, "profile": prof.as_dict()}


def lm_testbed(sizes: dict) -> tuple:
    """The ``drest_choice`` base model of ``sizes["profile"]``, its tokenizer and the held-out prompts."""
    from ..lm import load_base_model

    base, tok = load_base_model(TASK_NAME, sizes["strength"], prof=Profile(**sizes["profile"]), progress=False)
    return base, tok, get_task(TASK_NAME).examples(sizes["eval_prompts"], seed=4321, split="test")


def run_lm_base_cell(arm: str, seed: int, sizes: dict) -> dict:
    """The base model's held-out ``p_long``, ``neutrality``, ``usefulness`` and ``valid``
    (:func:`rlcourse.methods.drest_lm.evaluate_choices`). Its only arm is :data:`LM_BASE`; exact answer
    probabilities need no seed, so ``seed`` only names the cell."""
    if arm != LM_BASE:
        raise ValueError(f"unknown arm {arm!r}; the arms are {(LM_BASE,)}")
    with one_torch_thread():
        base, tok, held_out = lm_testbed(sizes)
        return evaluate_choices(base, tok, held_out)


def run_lm_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train a copy of the base model with RLOO under the reward of ``arm`` (:data:`ARMS`) from
    ``seed``, evaluating on the held-out prompts every ``eval_every`` steps and at the end (``E`` times).

    ================ ======== ===================================================================
    step             ``(E,)``  the training step of each evaluation
    p_long, ...      ``(E,)``  held-out ``p_long``, ``neutrality``, ``usefulness``, ``valid`` there
    train_<key>      ``(S,)``  the reward's log of each of the ``S`` steps (``p_long``,
                               ``usefulness``, ``valid``, ``reward``); ``None`` where a batch had no
                               valid answer (NaN in the log)
    ================ ======== ===================================================================
    """
    from ..train import RLConfig, Trainer

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {ARMS}")
    if sizes["steps"] < 1:
        raise ValueError(f"need at least one training step, got {sizes['steps']}")
    with one_torch_thread():
        base, tok, held_out = lm_testbed(sizes)
        rl = RLConfig(num_generations=sizes["G"], prompts_per_step=sizes["prompts"], steps=sizes["steps"],
                      learning_rate=sizes["lr"], max_completion_length=3, seed=seed,
                      reward=make_drest_lm_reward(arm, sizes["lam"] if arm == "drest" else 1.0, sizes["G"]),
                      advantage_estimator="rloo", train_pool_size=2000, progress=False)
        trainer = Trainer(copy.deepcopy(base), tok, get_task(TASK_NAME), rl, eval_examples=held_out[:1])
        curve = []
        while trainer.step_count < sizes["steps"]:
            trainer.step()
            if trainer.step_count % sizes["eval_every"] == 0 or trainer.step_count == sizes["steps"]:
                curve.append(dict(step=trainer.step_count, **evaluate_choices(trainer.model, tok, held_out)))
    log = trainer.state[STATE_KEY]
    return {**{k: [c[k] for c in curve] for k in ("step",) + METRICS},
            **{f"train_{k}": [None if np.isnan(x) else x for x in log[k]] for k in TRAIN_KEYS}}


def lm_base_study(prof: Profile) -> Study:
    """The base model's held-out metrics: one cell."""
    return Study(name="drest-lm-base", arms=(LM_BASE,), seeds=(0,), run=run_lm_base_cell, sizes=lm_sizes(prof),
                 modules=MODULES)


def lm_study(prof: Profile, seeds: Sequence[int] | None = None) -> Study:
    """Both arms of :data:`ARMS` on ``seeds`` (default ``range(prof.seeds)``)."""
    seeds = tuple(range(prof.seeds)) if seeds is None else tuple(seeds)
    if not seeds:
        raise ValueError("need at least one seed")
    return Study(name="drest-lm", arms=ARMS, seeds=seeds, run=run_lm_cell, sizes=lm_sizes(prof),
                 verdicts=lm_verdicts, modules=MODULES)


def lm_runs(results: Results, base: dict) -> dict:
    """Per arm, a list over seeds of {seed, final, curve, train, seconds} from :func:`lm_study`'s results;
    each curve starts with ``base`` (step 0)."""
    runs = {}
    for arm in results.study.arms:
        runs[arm] = []
        for s in results.study.seeds:
            m = results.metrics[(arm, s)]
            curve = [dict(step=0, **base)] + [dict(step=t, **{k: m[k][i] for k in METRICS})
                                              for i, t in enumerate(m["step"])]
            train = {k: [float("nan") if x is None else x for x in m[f"train_{k}"]] for k in TRAIN_KEYS}
            runs[arm].append({"seed": s, "final": curve[-1], "curve": curve, "train": train,
                              "seconds": results.seconds[(arm, s)]})
    return runs


def run_drest_lm_experiment(prof: Profile | None = None, seeds: Sequence[int] | None = None, **run_kw) -> dict:
    """Train one tiny-LM base with RLOO under the default reward and under DReST, and measure
    P(long), NEUTRALITY and USEFULNESS on held-out prompts (exact answer probabilities):
    :func:`lm_base_study` and :func:`lm_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`).

    ============ ============================================================================
    config       the sizes used (:func:`drest_lm_config`)
    base         held-out metrics of the base model (dict of p_long, neutrality, usefulness, valid)
    runs         per arm (``default``, ``drest``): a list over seeds of {final, curve, train, seconds}
    summary      per arm and metric: (mean, std) over seeds of the final held-out value
    seconds      wall-clock seconds of the cells
    ============ ============================================================================
    """
    from ..lm import load_base_model
    from ..profiles import profile as current_profile

    prof = prof or current_profile()
    cfg = drest_lm_config(prof)
    study = lm_study(prof, seeds)
    with one_torch_thread():  # built once here, before any cell loads it
        base_model, _ = load_base_model(TASK_NAME, cfg["strength"], prof=prof, progress=False)
    base = run_study(lm_base_study(prof), **run_kw)
    res = run_study(study, **run_kw)
    base_metrics = base.metrics[(LM_BASE, 0)]
    runs = lm_runs(res, base_metrics)
    summary = {arm: {k: (float(np.mean([r["final"][k] for r in rs])), float(np.std([r["final"][k] for r in rs])))
                     for k in METRICS} for arm, rs in runs.items()}
    return {"config": dict(cfg, seeds=list(study.seeds)), "base": base_metrics, "runs": runs, "summary": summary,
            "base_pretrain": getattr(base_model.config, "rlcourse_pretrain", None),
            "seconds": base.wall_seconds + res.wall_seconds}


# --------------------------------------------------------------------------------------------
# The paper's LLM claim, and its verdicts on our runs
# --------------------------------------------------------------------------------------------

LM_SETTING = ("tiny causal LM (the course's drest_choice base), 4-option prompts with two length classes, "
              "RLOO, G samples of a prompt = one meta-episode, lambda = 0.9, held-out prompts, exact answer "
              "probabilities")
CLAIMS = {
    "lm_neutral": Claim(
        key="drest/lm-neutral", paper=PAPER, source=SOURCE,
        statement="DReST LLMs achieve high NEUTRALITY while remaining near-maximally USEFUL",
        setting=LM_SETTING, metric="NEUTRALITY (bits, mean over held-out prompts)", method="DReST RLOO",
        baseline="default RLOO", kind="greater", margin=0.5),
    "lm_useful": Claim(
        key="drest/lm-useful", paper=PAPER, source=SOURCE,
        statement="DReST LLMs achieve high NEUTRALITY while remaining near-maximally USEFUL",
        setting=LM_SETTING, metric="USEFULNESS (E[coins / m(length)] over valid answers, held-out prompts)",
        method="DReST RLOO", baseline=None, reference=0.9, kind="greater", margin=0.0),
}


def drest_lm_verdicts(out: dict) -> dict[str, Verdict]:
    """Verdicts of :data:`CLAIMS` on a :func:`run_drest_lm_experiment` result, paired by seed."""
    fin = {arm: [r["final"] for r in sorted(rs, key=lambda r: r["seed"])] for arm, rs in out["runs"].items()}
    return {"lm_neutral": evaluate(CLAIMS["lm_neutral"], [f["neutrality"] for f in fin["drest"]],
                                   [f["neutrality"] for f in fin["default"]], seconds=out["seconds"]),
            "lm_useful": evaluate(CLAIMS["lm_useful"], [f["usefulness"] for f in fin["drest"]],
                                  seconds=out["seconds"])}


def lm_verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`drest_lm_verdicts` on a :func:`lm_study`'s results (each cell's last evaluation)."""
    runs = {arm: [{"seed": s, "final": {k: results.metrics[(arm, s)][k][-1] for k in METRICS}}
                  for s in results.study.seeds] for arm in results.study.arms}
    return drest_lm_verdicts({"runs": runs, "seconds": results.wall_seconds})
