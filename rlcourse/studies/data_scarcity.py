"""The data-scarcity chapter's comparison: the curriculum toy's arms and claims and the tiny-LM run (the map, the
arithmetic of a group and the registered samplers are in :mod:`rlcourse.methods.data_scarcity`).
"""
from __future__ import annotations

import time

from ..methods.data_scarcity import (MEMORY_KEY, PAPER, ScarcityAddition)  # noqa: F401
from ..profiles import Profile, profile as current_profile
from .curriculum_toy import ToyCurriculum
from .heapa import grid_runs, summarise_runs, toy_sizes
from .runner import Study, run_study


# ---------------------------------------------------------------------- the exact toy
TOY_ARMS = ("uniform", "pass_filter", "synth_easier", "heapa", "replay", "oracle")
# the runner is shared with the HeaPA chapter (one random stream for both): rlcourse.studies.curriculum_toy
from .curriculum_toy import REPLAY, rollouts_to_target, toy_run  # noqa: E402,F401


def toy_experiment(prof: Profile | None = None, arms: tuple = TOY_ARMS, steps: int | None = None,
                   toy: ToyCurriculum = ToyCurriculum(), **run_kw) -> dict:
    """Every arm on the same seeds at HeaPA's toy sizes (:func:`~rlcourse.studies.heapa.toy_sizes`:
    8 prompts x 8 rollouts a step, target 0.75); ``steps`` overrides the budget. The same study as
    HeaPA's (:func:`~rlcourse.studies.curriculum_toy.toy_study`), with this chapter's arms."""
    from .heapa import toy_experiment as curriculum_experiment  # the same runner, random stream and summary

    return curriculum_experiment(prof, arms=arms, toy=toy, steps=steps, **run_kw)


def toy_claims(budget: int, target: float) -> dict:
    """The toy's claims, fixed before the run. The survey gives no numbers: every claim here is the
    book's own reading of a branch of its taxonomy, margins 0 (any reduction counts)."""
    from ..claims import Claim

    setting = (f"exact toy (HeaPA's curriculum): 5 difficulty levels x 40 seed prompts with known Bernoulli-logit "
               f"pass rates, GRPO, 8 prompts x 8 rollouts a step, budget {budget} fresh rollouts, target held-out "
               f"mean pass rate {target}")
    metric = f"fresh rollouts until the held-out mean pass rate first reaches {target} (the budget if never)"
    src = "ours: the survey's data-centric branch (pruning/selection, synthesis) [secondary summary], tested here"
    common = dict(paper=PAPER, setting=setting, metric=metric, kind="less", margin=0.0, unit="{:.0f}", source=src)
    control = "data_scarcity/toy-oracle-control"
    out = {"control": Claim(key="data_scarcity/toy-oracle-control", role="positive control", statement="positive control: drawing prompts by "
                            "their true chance of an informative group needs fewer rollouts than uniform draws",
                            method="oracle", baseline="uniform", **common)}
    words = {"pass_filter": "filtering to 0 < p_hat < 1", "synth_easier": "the filter plus easier variants of failed prompts",
             "heapa": "HeaPA's growing heap pool", "replay": "replaying past groups (freshness-aware PER; the step "
             "normalised by the fresh rollouts, as for every arm)"}
    for arm, w in words.items():
        out[arm] = Claim(key=f"data_scarcity/toy-arm-{arm}", statement=f"{w} reaches the target with fewer rollouts than "
                         "uniform prompt sampling", method=arm, baseline="uniform", control=control, **common)
    out["synth_vs_filter"] = Claim(key="data_scarcity/toy-synth-beyond-filter", statement="adding easier variants of "
                                   "prompts the filter drops needs fewer rollouts than the filter alone (our reading: "
                                   "synthesis should help when the hard set is too hard)", method="synth_easier",
                                   baseline="pass_filter", role="course hypothesis", control=control, **common)
    return out


# ---------------------------------------------------------------------- the language-model run
LM_ARMS = {  # name -> RLConfig overrides; every arm: the same base model, seed pool, budget and rate
    "uniform": dict(prompt_sampler="uniform", sampler="policy"),
    "pass_filter": dict(prompt_sampler="pass_filter", sampler="heapa_feedback"),
    "synth_easier": dict(prompt_sampler="synth_easier", sampler="heapa_feedback"),
    "heapa": dict(prompt_sampler="heapa", sampler="heapa_feedback"),
    "replay": dict(prompt_sampler="uniform", sampler="replay", policy_loss="ppo_is",
                   sampler_kwargs=dict(replay_groups=4, capacity=256, tau=10.0, priority="advantage")),
}


def lm_sizes(prof: Profile) -> dict:
    """HeaPA's tiny-LM sizes (:func:`rlcourse.studies.heapa.lm_sizes`: seed pool, 8 prompts x 8
    rollouts, 36 steps in the book profile, target base accuracy + 0.10), with ``held`` halved to 32
    prompts per level so that five arms fit the chapter's time."""
    from .heapa import lm_sizes as heapa_lm_sizes

    sz = dict(heapa_lm_sizes(prof))
    sz["held"] = prof.pick(smoke=8, book=32)
    return sz


LM_MODULES = ("rlcourse.methods.data_scarcity", "rlcourse.methods.heapa", "rlcourse.methods.heapa_pool",
              "rlcourse.studies.heapa", "rlcourse.replay", "rlcourse.train", "rlcourse.lm.sampling", "rlcourse.lm.zoo")


def lm_study_sizes(prof: Profile) -> dict:
    """The sizes every LM cell reads: :func:`lm_sizes` (less the seeds) and the profile (it names the
    cached base model)."""
    return {**{k: v for k, v in lm_sizes(prof).items() if k != "seeds"}, "profile": prof.as_dict()}


def run_lm_cell(arm: str, seed: int, sizes: dict) -> dict:
    """GRPO on ``scarcity_addition`` from HeaPA's cached base model (built on ``heapa_addition``,
    the same prompts), the prompts and samples chosen by ``LM_ARMS[arm]`` through the config, at
    ``sizes`` (:func:`lm_study_sizes`). Returns the fields of
    :func:`~rlcourse.studies.heapa.run_lm_cell`: greedy accuracy per level at each check against
    fresh rollouts spent, the all-equal share per step and the final pool size."""
    from ..lm.zoo import load_base_model
    from ..profiles import one_torch_thread
    from ..train import RLConfig, Trainer
    from .heapa import _held_by_level, seed_pool, train_with_checks

    if arm not in LM_ARMS:
        raise ValueError(f"unknown LM arm {arm!r}; the arms are {tuple(LM_ARMS)}")
    sz = sizes
    task = ScarcityAddition()
    model, tok = load_base_model("heapa_addition", strength=sz["strength"], prof=Profile(**sz["profile"]),
                                 progress=False)
    held = _held_by_level(task, sz["held"])
    pool = seed_pool(task, sz["pool"], seed)
    cfg = RLConfig(num_generations=sz["G"], prompts_per_step=sz["prompts"], max_completion_length=12,
                   steps=sz["steps"], learning_rate=sz["lr"], seed=seed, progress=False, **LM_ARMS[arm])
    t0 = time.perf_counter()
    with one_torch_thread():
        trainer = Trainer(model, tok, task, cfg, train_examples=pool, eval_examples=held[1][:1])
        acc, rollouts, zero = train_with_checks(trainer, tok, task, held, sz)
    st = trainer.state
    size = len(st[MEMORY_KEY]["items"]) if MEMORY_KEY in st else len(st["heapa"]) if "heapa" in st else len(pool)
    return {"rollouts": rollouts, "by_level": acc.tolist(), "accuracy": acc.mean(1).tolist(), "zero_var": zero,
            "seconds": time.perf_counter() - t0, "pool": size}


def lm_study(prof: Profile | None = None, arms: tuple | None = None, seeds: int | None = None) -> Study:
    """Every arm of ``arms`` (default all of :data:`LM_ARMS`) on seeds ``0 .. seeds - 1`` (default
    ``prof.seeds``)."""
    prof = prof or current_profile()
    return Study(name="data_scarcity-lm", arms=tuple(arms or LM_ARMS),
                 seeds=tuple(range(prof.seeds if seeds is None else seeds)), run=run_lm_cell,
                 sizes=lm_study_sizes(prof), modules=LM_MODULES)


def lm_experiment(prof: Profile | None = None, arms: tuple | None = None, **run_kw) -> dict:
    """Every arm on ``seeds`` seeds; rollouts to the target (base accuracy + gain, censored at the
    budget), accuracy at the budget, the all-equal share; ``base`` is the untrained model's
    held-out accuracy (the same for every seed: one base model): :func:`lm_study` on the study
    runner (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`)."""
    prof = prof or current_profile()
    sz = lm_sizes(prof)
    res = run_study(lm_study(prof, arms), **run_kw)
    runs, arms = grid_runs(res), res.study.arms
    base = float(runs[arms[0]][0]["accuracy"][0])
    target, budget = base + sz["gain"], sz["steps"] * sz["prompts"] * sz["G"]
    out = {"sizes": sz, "runs": runs, "base": base, "base_by_level": runs[arms[0]][0]["by_level"][0],
           "target": target, "budget": budget, **summarise_runs(runs, target, budget)}
    out["seconds"] = res.wall_seconds
    return out


def lm_claims(budget: int, gain: float) -> dict:
    """The tiny-LM claims, fixed before the run: the same comparisons as the toy (no oracle: the
    positive control is that uniform GRPO itself moves held-out accuracy above the base model's)."""
    from ..claims import Claim

    setting = (f"tiny Llama (book profile) SFT to about 50% greedy accuracy on 1- to 4-digit addition (HeaPA's base "
               f"model); GRPO at the profile's rate, 8 prompts x 8 rollouts a step from a seed pool of 96 prompts, "
               f"budget {budget} fresh rollouts; target: the base model's held-out greedy accuracy + {gain}")
    metric = "fresh rollouts until held-out greedy accuracy (mean over the 4 levels) first reaches the target (the budget if never)"
    src = "ours: the survey's data-centric branch (pruning/selection, synthesis) [secondary summary], tested here"
    common = dict(paper=PAPER, setting=setting, source=src)
    out = {"control": Claim(key="data_scarcity/lm-uniform-learns", role="positive control", statement="at this budget "
                            "uniform GRPO raises held-out greedy accuracy above the base model's", method="uniform",
                            baseline="base", kind="greater", margin=0.0, metric="held-out greedy accuracy at the budget",
                            unit="{:.3f}", **common)}
    words = {"pass_filter": "filtering to 0 < p_hat < 1", "synth_easier": "the filter plus easier variants of failed prompts",
             "heapa": "HeaPA's growing heap pool", "replay": "replaying past groups (freshness-aware PER)"}
    for arm, w in words.items():
        out[arm] = Claim(key=f"data_scarcity/lm-arm-{arm}", statement=f"{w} reaches the target with fewer rollouts than "
                         "uniform prompt sampling", method=arm, baseline="uniform", kind="less", margin=0.0,
                         metric=metric, unit="{:.0f}", control="data_scarcity/lm-uniform-learns", **common)
    return out
