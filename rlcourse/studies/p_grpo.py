"""P-GRPO's experiment: majority and minority preference groups on the tiny LM (GRPO with a pooled batch
normalisation, GRPO per prompt and P-GRPO from one base model), its exact evaluation (the probability of each
user's preferred answer) and the claims (the estimators, the preference tasks and the reward are in
:mod:`rlcourse.methods.pgrpo`).
"""
from __future__ import annotations

import copy
import time
from typing import Sequence

import numpy as np
import torch

from ..claims import Claim, Verdict, evaluate
from ..lm.model import response_logprobs
from ..methods.pgrpo import LOG_KEY, PrefSort, SortMix
from ..profiles import one_torch_thread
from ..tasks import Example


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


def run_pgrpo_experiment(prof=None, seeds: int | None = None, progress: bool = False) -> dict:
    """Majority/minority preference groups on the tiny LM: GRPO with a pooled batch normalisation,
    GRPO per prompt and P-GRPO, from the same base model, over ``prof.seeds`` paired seeds.

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
    from ..lm.zoo import load_base_model
    from ..train import RLConfig, Trainer

    prof = prof or current_profile()
    n_seeds = seeds if seeds is not None else prof.seeds
    steps = prof.pick(smoke=2, book=60, full=200)
    every = prof.pick(smoke=1, book=5, full=10)
    n_eval = prof.pick(smoke=16, book=128, full=256)
    target = 0.8
    t0 = time.perf_counter()
    with one_torch_thread():
        base, tok = load_base_model(SortMix(lengths=LENGTHS), strength=0.9, prof=prof, progress=progress)
        task = PrefSort(lengths=LENGTHS)
        held = {tag: task.examples_of(tag, n_eval) for tag in "AB"}
        both = held["A"] + held["B"]
        base_p = {tag: preferred_probability(base, tok, held[tag]) for tag in "AB"}
        base_sorted = sorted_probability(base, tok, both)
        eval_steps = list(range(0, steps + 1, every))
        if eval_steps[-1] != steps:
            eval_steps.append(steps)
        curves = {arm: {"A": [], "B": []} for arm in ARMS}
        by_length = {arm: {"A": [], "B": []} for arm in ARMS}
        sorted_final = {arm: [] for arm in ARMS}
        zero_std = {arm: [] for arm in ARMS}
        adv_log = {"A": [], "B": []}
        for arm, estimator in ARMS.items():
            for seed in range(n_seeds):
                torch.manual_seed(seed)
                cfg = RLConfig(num_generations=2,
                               prompts_per_step=prof.pick(smoke=4, book=16, full=32), max_completion_length=6,
                               steps=steps, learning_rate=prof.rl_lr, seed=seed, reward="pg2_pref",
                               advantage_estimator=estimator, progress=progress)
                tr = Trainer(copy.deepcopy(base), tok, task, cfg, eval_examples=held["A"][:8])
                row = {tag: [base_p[tag]] for tag in "AB"}
                for s in eval_steps[1:]:
                    tr.train(steps=s)
                    for tag in "AB":
                        row[tag].append(preferred_probability(tr.model, tok, held[tag]))
                for tag in "AB":
                    curves[arm][tag].append(row[tag])
                    by_length[arm][tag].append([preferred_probability(tr.model, tok, [e for e in held[tag]
                                                                                    if len(e.answer) == n])
                                                for n in LENGTHS])
                sorted_final[arm].append(sorted_probability(tr.model, tok, both))
                zero_std[arm].append([h["frac_zero_std_groups"] for h in tr.history])
                if estimator == "p_grpo_logged":
                    for tag in "AB":
                        adv_log[tag].append([[r[tag][k] if tag in r else np.nan for k in ("adv", "reward", "mu", "sigma")]
                                             for r in tr.state[LOG_KEY]])
    curves = {arm: {tag: np.asarray(v) for tag, v in c.items()} for arm, c in curves.items()}

    def first_reach(row):
        hits = [s for s, v in zip(eval_steps, row) if v >= target]
        return hits[0] if hits else None

    return {
        "steps": eval_steps,
        "curves": curves,
        "final": {arm: {tag: float(c[tag][:, -1].mean()) for tag in "AB"} for arm, c in curves.items()},
        "auc": {arm: {tag: float(c[tag].mean()) for tag in "AB"} for arm, c in curves.items()},
        "per_seed_auc": {arm: {tag: c[tag].mean(1) for tag in "AB"} for arm, c in curves.items()},
        "per_seed_final": {arm: {tag: c[tag][:, -1] for tag in "AB"} for arm, c in curves.items()},
        "by_length": {arm: {tag: np.asarray(v) for tag, v in d.items()} for arm, d in by_length.items()},
        "sorted_final": {arm: np.asarray(v) for arm, v in sorted_final.items()},
        "base_sorted": base_sorted,
        "adv_log": {tag: np.asarray(v, dtype=float) for tag, v in adv_log.items()},
        "lengths": LENGTHS,
        "steps_to_target": {arm: [first_reach(r) for r in c["B"]] for arm, c in curves.items()},
        "target": target,
        "frac_zero_std": {arm: np.asarray(v) for arm, v in zero_std.items()},
        "base": base_p,
        "seeds": n_seeds,
        "seconds": time.perf_counter() - t0,
    }


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
