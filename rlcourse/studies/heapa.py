"""HeaPA's experiments: the curriculum toy's arms and claims, and the tiny-LM run (the registered samplers and
task are in :mod:`rlcourse.methods.heapa`, the pool in :mod:`rlcourse.methods.heapa_pool`; the toy's runner in
:mod:`rlcourse.studies.curriculum_toy`).
"""
from __future__ import annotations

import time

import numpy as np

from ..methods.heapa import (CurriculumAddition, PAPER)  # noqa: F401
from ..profiles import Profile, profile as current_profile
# The toy and its one runner live in rlcourse.studies.curriculum_toy (shared with the data-scarcity chapter).
from .curriculum_toy import (ToyCurriculum, rollouts_to_target, toy_accuracy, toy_prompts, toy_run,  # noqa: F401
                             toy_study)
from .runner import Study, run_study


# ---------------------------------------------------------------------- the exact toy

TOY_ARMS = ("uniform", "skip_extremes", "heapa", "heapa_fixed", "heapa_boundary", "oracle")


def toy_sizes(prof: Profile) -> dict:
    """The toy's sizes: the budget in steps (8 prompts x 8 samples each) and the target, fixed before
    any run: the held-out mean pass rate 0.75, up from about 0.36 at the start."""
    return {"steps": prof.pick(smoke=60, book=400), "prompts": 8, "G": 8, "target": 0.75,
            "seeds": prof.toy_seeds, "eval_every": 5}


def summarise_runs(runs: dict, target: float, budget: int) -> dict:
    """Per arm over seeds: rollouts to ``target`` (censored at ``budget``), how many runs were censored,
    the mean accuracy over the checks (``auc``), the all-equal share of the groups and the accuracy at
    the budget (``final``)."""
    out = {"to_target": {}, "censored": {}, "auc": {}, "zero_var": {}, "final": {}}
    for a, rs in runs.items():
        hits = [rollouts_to_target(r["rollouts"], r["accuracy"], target, budget) for r in rs]
        out["to_target"][a] = np.array([h[0] for h in hits])
        out["censored"][a] = int(sum(h[1] for h in hits))
        out["auc"][a] = np.array([r["accuracy"].mean() for r in rs])
        out["zero_var"][a] = np.array([r["zero_var"].mean() for r in rs])
        out["final"][a] = np.array([r["accuracy"][-1] for r in rs])
    return out


def grid_runs(res) -> dict:
    """A grid's :class:`~rlcourse.studies.runner.Results` as ``{arm: [metrics per seed]}``, lists as arrays."""
    return {a: [{k: np.asarray(v) if isinstance(v, list) else v for k, v in res.metrics[(a, s)].items()}
                for s in res.study.seeds] for a in res.study.arms}


def train_with_checks(trainer, tok, task, held: dict, sz: dict) -> tuple[np.ndarray, list, list]:
    """Run ``trainer`` for ``sz["steps"]`` steps, checking greedy accuracy per level of ``held`` before and
    every ``sz["eval_every"]`` steps. Returns ``(accuracy (checks, levels), rollouts per check, all-equal
    share per step)``."""
    from ..lm.zoo import greedy_accuracy

    def check():
        return [greedy_accuracy(trainer.model, tok, task, held[d], max_new_tokens=12) for d in sorted(held)]

    curve, rollouts, zero = [check()], [0], []
    while trainer.step_count < sz["steps"]:
        m = trainer.step()
        zero.append(m["frac_zero_std_groups"])
        if trainer.step_count % sz["eval_every"] == 0 or trainer.step_count == sz["steps"]:
            curve.append(check())
            rollouts.append(trainer.step_count * sz["prompts"] * sz["G"])
    return np.array(curve), rollouts, zero


def toy_experiment(prof: Profile | None = None, arms: tuple = TOY_ARMS, toy: ToyCurriculum = ToyCurriculum(),
                   low_fraction: float = 0.5, steps: int | None = None, **run_kw) -> dict:
    """Every arm on the same seeds: curves, rollouts to target (with censoring), zero-variance shares,
    area under the accuracy curve (mean accuracy over the checks, a censoring-free summary), and the
    accuracy at the budget (``final``): :func:`~rlcourse.studies.curriculum_toy.toy_study` on the
    study runner (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`).
    ``steps`` overrides the profile's budget (in steps of 8 x 8 rollouts)."""
    prof = prof or current_profile()
    sz = dict(toy_sizes(prof))
    if steps is not None:
        sz["steps"] = steps
    budget = sz["steps"] * sz["prompts"] * sz["G"]
    res = run_study(toy_study(arms, sz["seeds"], sz["steps"], sz["prompts"], sz["G"], toy=toy,
                              eval_every=sz["eval_every"], low_fraction=low_fraction), **run_kw)
    runs = grid_runs(res)
    out = {"sizes": sz, "budget": budget, "runs": runs, **summarise_runs(runs, sz["target"], budget)}
    out["seconds"] = res.wall_seconds
    return out


def toy_claims(budget: int, target: float) -> dict:
    """The toy's claims, with rules fixed before the run (margins 0: the abstract gives no number
    that fits this toy; the authors' page reports 12-16% less compute on math benchmarks)."""
    from ..claims import Claim

    setting = (f"exact toy: 5 difficulty levels (40 seed prompts each, the hardest starting near p = 0), "
               f"GRPO on known Bernoulli-logit pass rates, 8 prompts x 8 rollouts a step, budget {budget} rollouts, "
               f"target held-out mean pass rate {target}")
    metric = f"rollouts until the held-out mean pass rate first reaches {target} (the budget if never: a lower bound)"
    common = dict(paper=PAPER, setting=setting, unit="{:.0f}")
    return {
        "fewer": Claim(key="heapa/toy-fewer-rollouts", statement="HeaPA \"reaches target performance with fewer "
                       "computations\" than the baseline sampler", source="abstract", metric=metric,
                       method="heapa", baseline="uniform", kind="less", margin=0.0,
                       paper_number="up to 12-16% less compute (authors' page)", **common),
        "control": Claim(key="heapa/toy-oracle-control", role="positive control", statement="positive control (ours): drawing prompts by "
                         "their true chance of an informative group needs fewer rollouts than uniform draws",
                         source="ours: the mechanism the abstract names (rollouts wasted on solved or "
                                "unreachable prompts)", metric=metric, method="oracle", baseline="uniform",
                         kind="less", margin=0.0, **common),
        "growth": Claim(key="heapa/toy-growth-helps", statement="\"Analyses attribute the gains to frontier-focused "
                        "sampling and on-policy pool growth\": the pool with growth needs fewer rollouts than "
                        "the same pool without it", source="abstract", metric=metric, method="heapa",
                        baseline="heapa_fixed", kind="less", margin=0.0, **common),
        "filter": Claim(key="heapa/toy-fewer-rollouts-than-filter", statement="HeaPA reaches the target with fewer "
                        "rollouts than a simple filter (the abstract sets it against \"filtering, curricula\"): the "
                        "pool against uniform draws among prompts whose last group was neither all correct nor all "
                        "wrong", source="abstract", metric=metric, method="heapa", baseline="skip_extremes",
                        kind="less", margin=0.0, control="heapa/toy-oracle-control", **common),
        "waste": Claim(key="heapa/toy-fewer-wasted-groups", statement="uniform sampling \"wastes rollouts on "
                       "regions that are already solved or still unreachable\"; HeaPA's draws waste fewer",
                       source="abstract", metric="share of groups whose 8 rewards are all equal, mean over steps",
                       method="heapa", baseline="uniform", kind="less", margin=0.0, paper="" + PAPER,
                       setting=setting, unit="{:.3f}"),
    }


# ---------------------------------------------------------------------- the language-model run
LM_ARMS = ("uniform", "heapa")


def lm_sizes(prof: Profile) -> dict:
    """Sizes of the tiny-LM run, fixed before it: a seed pool of ``pool`` prompts of 1 to 3 digits,
    ``prompts`` x ``G`` rollouts a step, greedy accuracy on ``held`` held-out prompts per level every
    ``eval_every`` steps; the target is the base model's held-out accuracy plus ``gain``."""
    return {"steps": prof.pick(smoke=3, book=36), "pool": prof.pick(smoke=16, book=96), "prompts": prof.pick(smoke=4, book=8),
            "G": prof.pick(smoke=4, book=8), "held": prof.pick(smoke=8, book=64), "eval_every": prof.pick(smoke=3, book=4),
            "gain": 0.10, "seeds": prof.seeds, "strength": 0.5, "lr": prof.rl_lr}


def seed_pool(task, n: int, seed: int) -> list:
    """``n`` distinct training prompts of ``task`` for the LM run of ``seed`` (drawn with seed ``1000 + seed``)."""
    seen, pool = set(), []
    for e in task.examples(10 * n, seed=1000 + seed, split="train"):
        if e.prompt not in seen and len(pool) < n:
            seen.add(e.prompt)
            pool.append(e)
    return pool


def _held_by_level(task: CurriculumAddition, n: int) -> dict:
    ex = task.examples(40 * n, seed=123, split="test")
    return {d: [e for e in ex if e.meta["digits"] == d][:n] for d in range(1, task.max_digits + 1)}


LM_MODULES = ("rlcourse.methods.heapa", "rlcourse.methods.heapa_pool", "rlcourse.train", "rlcourse.lm.sampling",
              "rlcourse.lm.zoo")


def lm_study_sizes(prof: Profile) -> dict:
    """The sizes every LM cell reads: :func:`lm_sizes` (less the seeds) and the profile (it names the
    cached base model)."""
    return {**{k: v for k, v in lm_sizes(prof).items() if k != "seeds"}, "profile": prof.as_dict()}


def run_lm_cell(arm: str, seed: int, sizes: dict) -> dict:
    """GRPO on ``heapa_addition`` from the cached base model, prompts chosen by ``arm`` (``uniform``
    over the fixed seed pool, or ``heapa`` with growth), at ``sizes`` (:func:`lm_study_sizes`).

    ========  ============  ========================================================
    rollouts  ``(E,)``      rollouts spent at each check (0 first)
    by_level  ``(E, L)``    greedy held-out accuracy per level at each check
    accuracy  ``(E,)``      its mean over the levels
    zero_var  ``(steps,)``  share of all-equal groups per step
    seconds   scalar        wall seconds of the training
    pool      scalar        the prompt pool's final size
    ========  ============  ========================================================
    """
    from ..lm.zoo import load_base_model
    from ..profiles import one_torch_thread
    from ..tasks import get_task
    from ..train import RLConfig, Trainer

    if arm not in LM_ARMS:
        raise ValueError(f"unknown LM arm {arm!r}; the arms are {LM_ARMS}")
    sz = sizes
    task = get_task("heapa_addition")
    model, tok = load_base_model(task, strength=sz["strength"], prof=Profile(**sz["profile"]), progress=False)
    held = _held_by_level(task, sz["held"])
    pool = seed_pool(task, sz["pool"], seed)
    cfg = RLConfig(num_generations=sz["G"], prompts_per_step=sz["prompts"], max_completion_length=12,
                   steps=sz["steps"], learning_rate=sz["lr"], seed=seed, progress=False,
                   prompt_sampler="uniform" if arm == "uniform" else "heapa",
                   sampler="policy" if arm == "uniform" else "heapa_feedback")
    t0 = time.perf_counter()
    with one_torch_thread():
        trainer = Trainer(model, tok, task, cfg, train_examples=pool, eval_examples=held[1][:1])
        acc, rollouts, zero = train_with_checks(trainer, tok, task, held, sz)
    return {"rollouts": rollouts, "by_level": acc.tolist(), "accuracy": acc.mean(1).tolist(), "zero_var": zero,
            "seconds": time.perf_counter() - t0,
            "pool": len(trainer.state["heapa"]) if "heapa" in trainer.state else len(pool)}


def lm_study(prof: Profile | None = None, arms: tuple = LM_ARMS, seeds: int | None = None) -> Study:
    """Every arm of ``arms`` on seeds ``0 .. seeds - 1`` (default ``prof.seeds``)."""
    prof = prof or current_profile()
    return Study(name="heapa-lm", arms=tuple(arms), seeds=tuple(range(prof.seeds if seeds is None else seeds)),
                 run=run_lm_cell, sizes=lm_study_sizes(prof), modules=LM_MODULES)


def lm_experiment(prof: Profile | None = None, **run_kw) -> dict:
    """Both arms on ``seeds`` seeds; rollouts to the target (base accuracy + gain, censored at the
    budget), the mean accuracy over the checks, and the all-equal share: :func:`lm_study` on the
    study runner (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`)."""
    prof = prof or current_profile()
    sz = lm_sizes(prof)
    res = run_study(lm_study(prof), **run_kw)
    runs = grid_runs(res)
    base = float(runs["uniform"][0]["accuracy"][0])
    target = base + sz["gain"]
    budget = sz["steps"] * sz["prompts"] * sz["G"]
    out = {"sizes": sz, "runs": runs, "base": base, "base_by_level": runs["uniform"][0]["by_level"][0],
           "target": target, "budget": budget, **summarise_runs(runs, target, budget)}
    out["seconds"] = res.wall_seconds
    return out


def completion_forms(prof: Profile | None = None, seed: int = 0) -> dict:
    """What the base model of the LM experiment (pre-training seed ``seed``) writes on the held-out prompts
    of each level, greedily: is a wrong answer a wrong format or a wrong sum?

    ============  ========  =====================================================================
    accuracy      ``(L,)``  share of correct answers per level
    well_formed   ``(L,)``  share written as ``digits|digits``, the first half the second reversed
    right_length  ``(L,)``  share of the well-formed ones whose sum has the true number of digits
    examples      dict      level -> up to 4 ``(prompt, completion, solution)`` of wrong answers
    ============  ========  =====================================================================
    """
    import re

    from ..lm.sampling import sample
    from ..lm.zoo import load_base_model
    from ..tasks import get_task

    prof = prof or current_profile()
    sz = lm_sizes(prof)
    task = get_task("heapa_addition")
    model, tok = load_base_model(task, strength=sz["strength"], seed=seed, prof=prof, progress=False)
    out = {"accuracy": [], "well_formed": [], "right_length": [], "examples": {}}
    for d, held in _held_by_level(task, sz["held"]).items():
        texts = sample(model, tok, [e.prompt for e in held], temperature=0.0, max_new_tokens=12).texts
        forms = [re.fullmatch(r"(\d+)\|(\d+)", t.strip()) for t in texts]
        ok = [m is not None and m.group(1) == m.group(2)[::-1] for m in forms]
        length = [len(m.group(2)) == len(e.answer) for m, good, e in zip(forms, ok, held) if good]
        right = task.rewards(texts, held)
        out["accuracy"].append(float(np.mean(right)))
        out["well_formed"].append(float(np.mean(ok)))
        out["right_length"].append(float(np.mean(length)) if length else float("nan"))
        out["examples"][d] = [(e.prompt, t, e.solution) for e, t, r in zip(held, texts, right) if r < 1][:4]
    return out


def lm_claims(budget: int, gain: float) -> dict:
    """The tiny-LM claims, fixed before the run."""
    from ..claims import Claim

    setting = (f"tiny Llama (book profile) SFT to about 50% greedy accuracy on 1- to 4-digit addition; GRPO, 8 prompts "
               f"x 8 rollouts a step from a seed pool of 96 prompts, budget {budget} rollouts; target: the base "
               f"model's held-out greedy accuracy + {gain}")
    metric = "rollouts until held-out greedy accuracy (mean over the 4 levels) first reaches the target (the budget if never)"
    return {
        "fewer": Claim(key="heapa/lm-fewer-rollouts", paper=PAPER, statement="HeaPA \"reaches target performance with "
                       "fewer computations\" than the baseline sampler", source="abstract", setting=setting, metric=metric,
                       method="heapa", baseline="uniform", kind="less", margin=0.0, unit="{:.0f}",
                       paper_number="up to 12-16% less compute (authors' page)"),
        "waste": Claim(key="heapa/lm-fewer-wasted-groups", paper=PAPER, statement="uniform sampling \"wastes rollouts "
                       "on regions that are already solved or still unreachable\"; HeaPA's draws waste fewer",
                       source="abstract", setting=setting, metric="share of groups whose 8 rewards are all equal, mean "
                       "over steps", method="heapa", baseline="uniform", kind="less", margin=0.0, unit="{:.3f}"),
    }
