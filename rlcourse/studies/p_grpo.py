"""P-GRPO's experiment: majority and minority preference groups on the tiny LM (GRPO with a pooled batch
normalisation, GRPO per prompt and P-GRPO from one base model), its exact evaluation (the probability of each
user's preferred answer) and the claims (the estimators, the preference tasks and the reward are in
:mod:`rlcourse.methods.pgrpo`).

The arms are :data:`ARMS`, the seeds the profile's ``seeds``. One cell (:func:`run_cell`) loads the base
model and trains it with one arm from one seed, so a cell's numbers do not depend on which cells ran
before it; the base model's own probabilities, shared by every cell, are a one-cell study
(:func:`pgrpo_base_study`). :func:`run_pgrpo_experiment` runs both on the study runner (cached per cell)
and rebuilds the dict the chapter reads.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..claims import Claim, Verdict, evaluate
from ..lm.model import response_logprobs
from ..methods.pgrpo import LOG_KEY, PrefSort, SortMix
from ..profiles import one_torch_thread
from ..tasks import Example
from .runner import Results, Study, run_study


# ---------------------------------------------------------------------- the exact evaluation
@torch.no_grad()
def preferred_probability(model, tokenizer, examples: Sequence[Example]) -> float:
    """Mean over examples of pi(preferred answer + EOS | prompt): the exact probability that one
    sample is the answer this user wants (no sampling noise)."""
    from ..lm.zoo import sft_batch

    input_ids, attention_mask, response_mask = sft_batch(tokenizer, list(examples))
    logp = response_logprobs(model, input_ids, attention_mask, response_mask.shape[1])
    return float(torch.exp((logp * response_mask).sum(-1)).mean())


@torch.no_grad()
def sorted_probability(model, tokenizer, examples: Sequence[Example]) -> float:
    """Mean over examples of pi(ascending) + pi(descending): the probability that one sample sorts the
    digits in either order, whatever the user prefers (the skill both users reward; our proxy for
    "general capability" on this task)."""
    asc = [Example(e.prompt, e.answer, "".join(sorted(e.answer)), dict(e.meta)) for e in examples]
    desc = [Example(e.prompt, e.answer, "".join(sorted(e.answer))[::-1], dict(e.meta)) for e in examples]
    return preferred_probability(model, tokenizer, asc) + preferred_probability(model, tokenizer, desc)


# ---------------------------------------------------------------------- the chapter's experiment
ARMS = {"GRPO, pooled batch": "pg2_pooled", "GRPO, per prompt": "grpo", "P-GRPO": "p_grpo_logged"}
#: prompt lengths of the experiment: 3 to 5 digits in both preference groups, a spread of difficulty
LENGTHS = (3, 4, 5)
BASE = "base model"  # the one cell of :func:`pgrpo_base_study`: the base model's probabilities
ADV_KEYS = ("adv", "reward", "mu", "sigma")  # the columns of P-GRPO's per-step log
MODULES = ("rlcourse.methods.pgrpo", "rlcourse.train", "rlcourse.advantages", "rlcourse.losses")


def pgrpo_sizes(prof) -> dict:
    """Every setting a cell reads, for profile ``prof`` (JSON-serialisable: the study's budget)."""
    return {"profile": prof.as_dict(), "steps": prof.pick(smoke=2, book=60, full=200),
            "every": prof.pick(smoke=1, book=5, full=10), "eval_prompts": prof.pick(smoke=16, book=128, full=256),
            "prompts_per_step": prof.pick(smoke=4, book=16, full=32), "lr": prof.rl_lr, "lengths": list(LENGTHS),
            "strength": 0.9}


def eval_steps(sizes: dict) -> list[int]:
    """The evaluation steps: 0 (the base model), every ``sizes["every"]`` steps, and the last step."""
    steps = list(range(0, sizes["steps"] + 1, sizes["every"]))
    if steps[-1] != sizes["steps"]:
        steps.append(sizes["steps"])
    return steps


def _base_and_held(sizes: dict, progress: bool = False):
    """The base model, its tokenizer, the task and the held-out prompts of each tag, for ``sizes``."""
    from ..lm.zoo import load_base_model
    from ..profiles import Profile

    lengths = tuple(sizes["lengths"])
    base, tok = load_base_model(SortMix(lengths=lengths), strength=sizes["strength"], prof=Profile(**sizes["profile"]),
                                progress=progress)
    task = PrefSort(lengths=lengths)
    return base, tok, task, {tag: task.examples_of(tag, sizes["eval_prompts"]) for tag in "AB"}


def run_base_cell(arm: str, seed: int, sizes: dict) -> dict:
    """The base model's P(preferred answer) on the held-out prompts of each tag (``base``: ``{tag:
    scalar}``) and its P(sorted either way) on both (``base_sorted``); ``arm`` must be :data:`BASE`."""
    if arm != BASE:
        raise ValueError(f"unknown arm {arm!r}; the arms are {(BASE,)}")
    with one_torch_thread():
        base, tok, _, held = _base_and_held(sizes)
        return {"base": {tag: preferred_probability(base, tok, held[tag]) for tag in "AB"},
                "base_sorted": sorted_probability(base, tok, held["A"] + held["B"])}


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train the base model with arm ``arm`` of :data:`ARMS` from ``seed`` (``torch.manual_seed(seed)``
    first). With ``E`` evaluation steps after step 0 and ``T`` steps:

    ================  ====================  ==========================================================
    curves[tag]       ``(E,)``              P(preferred answer) on held-out prompts of tag, per eval
    by_length[tag]    ``(len(LENGTHS),)``   final P(preferred) by prompt length
    sorted_final      scalar                final P(sorted either way), both tags
    frac_zero_std     ``(T,)``              share of prompts whose G rewards were equal
    adv_log[tag]      ``(T, 4)``            P-GRPO only: per step :data:`ADV_KEYS` of the group
                                            (``None`` where the batch held none of it)
    ================  ====================  ==========================================================
    """
    from ..train import RLConfig, Trainer

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(ARMS)}")
    with one_torch_thread():
        base, tok, task, held = _base_and_held(sizes)
        torch.manual_seed(seed)
        cfg = RLConfig(num_generations=2, prompts_per_step=sizes["prompts_per_step"], max_completion_length=6,
                       steps=sizes["steps"], learning_rate=sizes["lr"], seed=seed, reward="pg2_pref",
                       advantage_estimator=ARMS[arm], progress=False)
        tr = Trainer(base, tok, task, cfg, eval_examples=held["A"][:8])
        curves = {"A": [], "B": []}
        for s in eval_steps(sizes)[1:]:
            tr.train(steps=s)
            for tag in "AB":
                curves[tag].append(preferred_probability(tr.model, tok, held[tag]))
        out = {"curves": curves,
               "by_length": {tag: [preferred_probability(tr.model, tok, [e for e in held[tag] if len(e.answer) == n])
                                   for n in sizes["lengths"]] for tag in "AB"},
               "sorted_final": sorted_probability(tr.model, tok, held["A"] + held["B"]),
               "frac_zero_std": [h["frac_zero_std_groups"] for h in tr.history]}
        if ARMS[arm] == "p_grpo_logged":
            out["adv_log"] = {tag: [[r[tag][k] if tag in r else None for k in ADV_KEYS] for r in tr.state[LOG_KEY]]
                              for tag in "AB"}
    return out


def pgrpo_base_study(prof) -> Study:
    """The one-cell study of the base model's measurements (:func:`run_base_cell`), shared by every cell."""
    return Study(name="p_grpo-base", arms=(BASE,), seeds=(0,), run=run_base_cell, sizes=pgrpo_sizes(prof),
                 modules=MODULES)


def pgrpo_study(prof, seeds: int | None = None) -> Study:
    """Every arm of :data:`ARMS` on seeds ``0 .. n-1`` (``n`` = ``seeds`` or ``prof.seeds``)."""
    n = seeds if seeds is not None else prof.seeds
    return Study(name="p_grpo", arms=tuple(ARMS), seeds=tuple(range(n)), run=run_cell, sizes=pgrpo_sizes(prof),
                 modules=MODULES)


def pgrpo_output(results: Results, base: Results) -> dict:
    """The chapter's dict (see :func:`run_pgrpo_experiment`) from a :func:`pgrpo_study`'s results and
    the :func:`pgrpo_base_study`'s."""
    study = results.study
    steps, b = eval_steps(study.sizes), base.metrics[(BASE, 0)]
    base_p = {tag: b["base"][tag] for tag in "AB"}
    curves = {arm: {tag: np.asarray([[base_p[tag], *c[tag]] for c in results.values(arm, "curves")])
                    for tag in "AB"} for arm in study.arms}
    nan = lambda rows: [[np.nan if v is None else v for v in row] for row in rows]  # noqa: E731
    logged = [arm for arm in study.arms if ARMS[arm] == "p_grpo_logged"]
    adv_log = {tag: [nan(a[tag]) for arm in logged for a in results.values(arm, "adv_log")] for tag in "AB"}
    target = 0.8

    def first_reach(row):
        hits = [s for s, v in zip(steps, row) if v >= target]
        return hits[0] if hits else None

    return {
        "steps": steps,
        "curves": curves,
        "final": {arm: {tag: float(c[tag][:, -1].mean()) for tag in "AB"} for arm, c in curves.items()},
        "auc": {arm: {tag: float(c[tag].mean()) for tag in "AB"} for arm, c in curves.items()},
        "per_seed_auc": {arm: {tag: c[tag].mean(1) for tag in "AB"} for arm, c in curves.items()},
        "per_seed_final": {arm: {tag: c[tag][:, -1] for tag in "AB"} for arm, c in curves.items()},
        "by_length": {arm: {tag: np.asarray([d[tag] for d in results.values(arm, "by_length")]) for tag in "AB"}
                      for arm in study.arms},
        "sorted_final": {arm: np.asarray(results.values(arm, "sorted_final")) for arm in study.arms},
        "base_sorted": b["base_sorted"],
        "adv_log": {tag: np.asarray(v, dtype=float) for tag, v in adv_log.items()},
        "lengths": tuple(study.sizes["lengths"]),
        "steps_to_target": {arm: [first_reach(r) for r in c["B"]] for arm, c in curves.items()},
        "target": target,
        "frac_zero_std": {arm: np.asarray(results.values(arm, "frac_zero_std")) for arm in study.arms},
        "base": base_p,
        "seeds": len(study.seeds),
        "seconds": base.wall_seconds + results.wall_seconds,
    }


def run_pgrpo_experiment(prof=None, seeds: int | None = None, progress: bool = False, **run_kw) -> dict:
    """Majority/minority preference groups on the tiny LM: GRPO with a pooled batch normalisation,
    GRPO per prompt and P-GRPO, from the same base model, over ``prof.seeds`` paired seeds:
    :func:`pgrpo_study` and :func:`pgrpo_base_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`; ``progress`` shows a bar over the cells).

    Prompts of both preference groups have 3, 4 or 5 digits (:data:`LENGTHS`), so difficulty varies
    within each group, and a per-group history mean mixes easy and hard prompts. Every arm samples
    G = 2 answers per prompt (so a per-prompt group often has zero variance).

    ================= ==================================== =============================================
    steps             ``(E,)``                             evaluation steps (0 = base model)
    curves[arm][tag]  ``(N, E)``                           P(preferred answer) on held-out prompts of tag
    final, auc        ``[arm][tag]``                       mean over seeds at the end / over the run
    per_seed_auc      ``[arm][tag]`` ``(N,)``              area under each seed's curve (mean over evals)
    by_length         ``[arm][tag]`` ``(N, len(LENGTHS))`` final P(preferred) by prompt length
    sorted_final      ``[arm]`` ``(N,)``                   final P(sorted either way), both tags
    adv_log           ``[tag]`` ``(N, steps, 4)``          P-GRPO's per-step mean advantage, mean reward,
                                                           mu, sigma of the group
    frac_zero_std     ``[arm]`` ``(N, steps)``             share of prompts whose G rewards were equal
    ================= ==================================== =============================================
    """
    from .. import profile as current_profile

    prof = prof or current_profile()
    run_kw.setdefault("progress", progress)
    base = run_study(pgrpo_base_study(prof), **run_kw)
    return pgrpo_output(run_study(pgrpo_study(prof, seeds), **run_kw), base)


# ---------------------------------------------------------------------- claims
_PG_PAPER = ("Personalized Group Relative Policy Optimization for Heterogenous Preference Alignment, Wang et al., "
             "2026, arXiv:2603.10009")
_PG_SETTING = ("tiny LM, digit sorting with 3-5 digits; user A (80%, ascending, reward 0/10) and user B (20%, "
               "descending, reward 0/1); G = 2, 16 prompts x 60 steps; P(preferred answer) on held-out prompts")
PGRPO_CLAIMS = {
    "vs-pooled": Claim(
        key="p_grpo/minority-vs-pooled", paper=_PG_PAPER,
        statement="P-GRPO ... achieves faster convergence and higher rewards than standard GRPO on heterogeneous "
                  "preference signals [here: the minority's preference, against one normalisation pooled over the "
                  "batch]", source="abstract", setting=_PG_SETTING,
        metric="minority's P(preferred), mean over the run's evaluations (area under the curve)",
        method="P-GRPO", baseline="GRPO, pooled batch", kind="greater", margin=0.0),
    "vs-grpo": Claim(
        key="p_grpo/minority-vs-grpo", paper=_PG_PAPER,
        statement="P-GRPO ... achieves faster convergence and higher rewards than standard GRPO [here: GRPO per "
                  "prompt, which never mixes users]", source="abstract", setting=_PG_SETTING,
        metric="minority's P(preferred), mean over the run's evaluations (area under the curve)",
        method="P-GRPO", baseline="GRPO, per prompt", kind="greater", margin=0.0),
    "stale": Claim(
        key="p_grpo/stale-history-bias", paper=_PG_PAPER,
        statement="(the course's proposition, not the paper's) with a full history and an improving policy, the "
                  "group's history mean lags and its mean advantage is positive", source="course proposition",
        setting=_PG_SETTING + "; P-GRPO with Welford history", metric="minority's mean P-GRPO advantage over the run",
        method="P-GRPO minority", reference=0.0, kind="greater", margin=0.0, role="course hypothesis"),
}


def minority_mean_advantage(res: dict, tag: str = "B") -> np.ndarray:
    """Per seed, P-GRPO's mean advantage of group ``tag`` over the steps where it had rows, ``(N,)``
    (0 for a seed whose batches never held the group, as can happen in the smoke profile)."""
    adv = res["adv_log"][tag][:, :, 0]
    seen = np.isfinite(adv)
    return np.where(seen.any(1), np.nansum(adv, 1) / np.maximum(seen.sum(1), 1), 0.0)


def pgrpo_verdicts(res: dict) -> dict[str, Verdict]:
    """The claims of :data:`PGRPO_CLAIMS`, evaluated on :func:`run_pgrpo_experiment`'s output."""
    auc, s = res["per_seed_auc"], res["seconds"]
    return {
        "vs-pooled": evaluate(PGRPO_CLAIMS["vs-pooled"], auc["P-GRPO"]["B"], auc["GRPO, pooled batch"]["B"], seconds=s),
        "vs-grpo": evaluate(PGRPO_CLAIMS["vs-grpo"], auc["P-GRPO"]["B"], auc["GRPO, per prompt"]["B"], seconds=s),
        "stale": evaluate(PGRPO_CLAIMS["stale"], minority_mean_advantage(res), seconds=s),
    }
