"""The advantages chapter's studies: the accuracy race of REINFORCE, RLOO and GRPO on the addition
model, and the length-bias run of GRPO's two loss aggregations on the countdown model; then their
claims and verdicts.

In both grids the arms are names (advantage estimators, or loss types) that travel in the study's
sizes with the profile, and the seeds are the profile's ``seeds``. One cell loads its base model,
trains it with one arm from one seed (the seed draws the prompts, so the arms of one seed share
prompts until their policies differ) on one torch thread, and measures it, so a cell's numbers do
not depend on which cells ran before it or in which process. :func:`run_advantage_race` and
:func:`run_length_bias` run the grids on the study runner (cached per cell) and rebuild the dicts
the chapter reads.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from ..claims import Claim, evaluate
from ..experiments import PAPERS
from ..profiles import Profile, one_torch_thread, profile as current_profile
from ..lm import load_base_model
from ..train import RLConfig, Trainer
from .runner import Results, Study, run_study

RACE_ESTIMATORS = ("reinforce", "rloo", "grpo")
RACE_STEPS = 200  # the race's steps in the book profile (300 in an earlier version; see the chapter's note)
LOSS_TYPES = ("grpo", "dapo")
MODULES = ("rlcourse.train", "rlcourse.advantages", "rlcourse.losses", "rlcourse.experiments")


def _check_arm(arm: str, sizes: dict) -> None:
    if arm not in sizes["arms"]:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(sizes['arms'])}")


def _study(name: str, prof: Profile, arms, seeds, run, verdicts) -> Study:
    """A grid of ``arms`` (their names also in the sizes, with the profile) on ``seeds`` (default
    ``range(prof.seeds)``)."""
    seeds = tuple(range(prof.seeds)) if seeds is None else tuple(int(s) for s in seeds)
    return Study(name=name, arms=tuple(arms), seeds=seeds, run=run, verdicts=verdicts, modules=MODULES,
                 sizes={"profile": prof.as_dict(), "arms": list(arms)})


def _nan_to_none(values: list) -> list:
    """NaN as ``None`` (the runner stores finite numbers only)."""
    return [None if v != v else v for v in values]


# ---------------------------------------------------------------------- the accuracy race
def advantage_comparison_config(prof: Profile, estimator: str, seed: int = 0) -> RLConfig:
    """The shared configuration of the estimator comparison: only ``advantage_estimator`` varies.
    (32 prompts x 8 samples and a learning rate of 2e-4 decayed linearly to 0 came out of a short sweep
    on the book-profile addition model; the book profile runs :data:`RACE_STEPS` steps, fixed by two
    pilots before the reported run; see the chapter.)"""
    steps = prof.pick(smoke=prof.rl_steps, book=RACE_STEPS, full=400)
    return RLConfig(
        advantage_estimator=estimator, num_generations=prof.num_generations,
        prompts_per_step=prof.pick(smoke=prof.rl_prompts, book=32, full=64),
        learning_rate=prof.pick(smoke=prof.rl_lr, book=2e-4, full=2e-4), lr_scheduler="linear",
        steps=steps, max_completion_length=10,
        loss_type="dapo", eval_every=max(1, steps // 8), eval_prompts=prof.eval_prompts, seed=seed, progress=False,
        lam=0.95, vf_coef=0.5, critic_learning_rate=prof.rl_lr * 10,
    )


def run_race_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train the addition 'medium' base model with advantage estimator ``arm`` from ``seed``
    (:func:`advantage_comparison_config`). With ``T`` steps:

    ==============  ========  =============================================================
    history         ``(T,)``  the Trainer's per-step dicts (``None`` where a value was NaN)
    base_accuracy   scalar    the base model's greedy accuracy on the seed's held-out prompts
    final_accuracy  scalar    that of the trained model
    best_accuracy   scalar    the best of the evaluations during training
    ==============  ========  =============================================================
    """
    _check_arm(arm, sizes)
    prof = Profile(**sizes["profile"])
    with one_torch_thread():
        model, tok = load_base_model("addition", "medium", prof=prof, progress=False)
        trainer = Trainer(model, tok, "addition", advantage_comparison_config(prof, arm, seed))
        base_acc = trainer.evaluate()
        history = trainer.train()
    return {"history": [dict(zip(h, _nan_to_none(list(h.values())))) for h in history], "base_accuracy": base_acc,
            "final_accuracy": history[-1]["eval_greedy_accuracy"],
            "best_accuracy": max(h.get("eval_greedy_accuracy", 0.0) for h in history)}


def race_study(prof: Profile, estimators=RACE_ESTIMATORS, seeds=None) -> Study:
    """Every estimator of ``estimators`` on ``seeds`` (default ``range(prof.seeds)``) paired seeds."""
    return _study("advantages-race", prof, estimators, seeds, run_race_cell, race_grid_verdicts)


def race_output(results: Results) -> dict:
    """The chapter's dict from a :func:`race_study`'s results: ``{"runs": {seed: {est: result}},
    "seconds"}``, a result being a cell's metrics (NaN back where it stored ``None``) with its wall
    ``seconds``; ``seconds`` is the grid's."""
    runs = {}
    for seed in results.study.seeds:
        runs[seed] = {}
        for est in results.study.arms:
            m = dict(results.metrics[(est, seed)])
            m["history"] = [{k: float("nan") if v is None else v for k, v in h.items()} for h in m["history"]]
            runs[seed][est] = {**m, "seconds": results.seconds[(est, seed)]}
    return {"runs": runs, "seconds": results.wall_seconds}


def run_advantage_race(prof: Profile | None = None, estimators=RACE_ESTIMATORS, seeds=None,
                       workers: int | None = None, **run_kw) -> dict:
    """:func:`race_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`), as :func:`race_output`'s dict.

    The (estimator, seed) cells are independent, so they run in ``workers`` processes (default:
    ``$RLCOURSE_JOBS`` where it is set, else 2 where the machine has 2 cores in the book profile and 1
    in the smoke profile), each on one torch thread; a cell's numbers do not depend on which process
    ran it."""
    prof = prof or current_profile()
    if workers is None and "RLCOURSE_JOBS" not in os.environ:
        workers = prof.pick(smoke=1, book=min(2, os.cpu_count() or 1), full=os.cpu_count() or 1)
    return race_output(run_study(race_study(prof, estimators, seeds), jobs=workers, **run_kw))


_RACE_SETTING = ("tiny Llama (book profile) pre-trained on reversed-digit addition ('medium' base), "
                 f"32 prompts x 8 samples per step, {RACE_STEPS} steps, AdamW 2e-4 decayed linearly, token-mean loss, "
                 "greedy accuracy on 256 held-out prompts")


def race_claims() -> dict:
    """The accuracy race's claims: each estimator lifts held-out greedy accuracy over the base model by
    more than 20 points. They are positive controls: the set-up can move the model."""
    out = {}
    for est in RACE_ESTIMATORS:
        out[f"{est}-lifts"] = Claim(
            key=f"advantages/{est}-lifts-accuracy", paper=PAPERS[est],
            statement="policy-gradient RL with this advantage estimator improves a base model's accuracy on a "
                      "verifiable task (the premise of each paper; no number is given for our setting)",
            source="the papers' experiments (paraphrase)", setting=_RACE_SETTING,
            metric="final greedy accuracy minus the base model's, per seed", method=est, baseline="base model",
            kind="greater", margin=0.2, role="positive control")  # the budget was tuned so that RL learns
    return out


def race_verdicts(race: dict) -> dict:
    """The verdicts of :func:`race_claims` on the output of :func:`run_advantage_race`."""
    runs, claims = race["runs"], race_claims()
    seeds = sorted(runs)
    out = {}
    for est in RACE_ESTIMATORS:
        if all(est in runs[s] for s in seeds):
            out[f"{est}-lifts"] = evaluate(claims[f"{est}-lifts"], [runs[s][est]["final_accuracy"] for s in seeds],
                                           [runs[s][est]["base_accuracy"] for s in seeds], seconds=race["seconds"])
    return out


def race_grid_verdicts(results: Results) -> dict:
    """:func:`race_verdicts` on a :func:`race_study`'s results."""
    return race_verdicts(race_output(results))


# ---------------------------------------------------------------------- the length bias
LENGTH_BIAS_MARGIN = 0.5  # tokens; fixed before the 3-seed run (see length_bias_claim)


def length_bias_claim():
    """Dr. GRPO's claim: the per-sequence token mean (GRPO's original loss) lengthens wrong answers.

    The margin, :data:`LENGTH_BIAS_MARGIN` = 0.5 token, is fixed before the 3-seed run: the wrong answers
    of this task are about 6 tokens long, so half a token is about 8%, the smallest lengthening that the
    paper's "artificially increases response length" could mean at this scale; a margin of 0 would let a
    difference of a tenth of a token (the one-seed pilot's +0.11) count as the paper's effect."""
    return Claim(
        key="advantages/grpo-loss-lengthens-wrong-answers", paper=PAPERS["dr_grpo"],
        statement="GRPO's optimisation bias artificially increases response length, especially for incorrect "
                  "outputs, during training",
        source="abstract, arXiv:2503.20783, paraphrase of the abstract; not a quotation",
        setting="tiny Llama on countdown ('weak' base), GRPO advantages, loss_type 'grpo' (seq-mean-token-mean) "
                "vs 'dapo' (token-mean), same seeds and prompts; the sizes are those of length_bias_config",
        metric="mean length (tokens) of the wrong answers over the last quarter of the steps, per seed",
        method="seq-mean-token-mean", baseline="token-mean", kind="greater", margin=LENGTH_BIAS_MARGIN,
        unit="{:.2f}")


def length_bias_config(prof: Profile, loss_type: str, seed: int = 0) -> RLConfig:
    """The length-bias run: only ``loss_type`` varies between the arms."""
    return RLConfig(
        advantage_estimator="grpo", loss_type=loss_type, num_generations=prof.num_generations,
        prompts_per_step=prof.pick(smoke=prof.rl_prompts, book=16), steps=prof.pick(smoke=prof.rl_steps, book=60),
        learning_rate=prof.pick(smoke=prof.rl_lr, book=3e-4), max_completion_length=12, seed=seed,
        eval_every=0, progress=False)


def _reward_logging_lengths(batch, examples, task, state) -> torch.Tensor:
    """The task reward, and a log of the mean length of this step's right and wrong answers in
    ``state["lengths"]`` (a list of ``(wrong_len, right_len)``, NaN when a class is empty)."""
    scores = torch.as_tensor(task.rewards(batch.texts, examples), dtype=torch.float32)
    lengths = batch.lengths.float()
    wrong, right = scores <= 0, scores > 0
    mean = lambda sel: float(lengths[sel].mean()) if sel.any() else float("nan")  # noqa: E731
    state.setdefault("lengths", []).append((mean(wrong), mean(right)))
    return scores


def run_length_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train the countdown 'weak' base model with loss type ``arm`` from ``seed``
    (:func:`length_bias_config`) and return ``lengths``, ``(T, 2)``: the mean length of the wrong and
    the right answers at each of the ``T`` steps (``None`` where a step had none of a class)."""
    _check_arm(arm, sizes)
    prof = Profile(**sizes["profile"])
    cfg = length_bias_config(prof, arm, seed)
    cfg.reward = _reward_logging_lengths
    with one_torch_thread():
        model, tok = load_base_model("countdown", "weak", prof=prof, progress=False)
        trainer = Trainer(model, tok, "countdown", cfg)
        trainer.train()
    return {"lengths": [_nan_to_none(list(pair)) for pair in trainer.state["lengths"]]}


def length_bias_study(prof: Profile, loss_types=LOSS_TYPES, seeds=None) -> Study:
    """Every loss type of ``loss_types`` on ``seeds`` (default ``range(prof.seeds)``) paired seeds."""
    return _study("advantages-length-bias", prof, loss_types, seeds, run_length_cell, length_bias_grid_verdict)


def length_bias_output(results: Results) -> dict:
    """The chapter's dict from a :func:`length_bias_study`'s results: ``{"runs": {seed: {loss_type:
    (T, 2) array}}, "seconds"}`` (NaN where a step had no answer of a class)."""
    runs = {seed: {lt: np.array(results.metrics[(lt, seed)]["lengths"], dtype=float) for lt in results.study.arms}
            for seed in results.study.seeds}
    return {"runs": runs, "seconds": results.wall_seconds}


def run_length_bias(prof: Profile | None = None, loss_types=LOSS_TYPES, seeds=None, **run_kw) -> dict:
    """Train the countdown 'weak' base model with each ``loss_type`` over ``prof.seeds`` seeds and log the
    lengths of wrong and right answers at every step: :func:`length_bias_study` on the study runner
    (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`), as :func:`length_bias_output`'s dict."""
    prof = prof or current_profile()
    return length_bias_output(run_study(length_bias_study(prof, loss_types, seeds), **run_kw))


def length_bias_verdict(res: dict):
    """The verdict of :func:`length_bias_claim` on :func:`run_length_bias`'s output."""
    def late_wrong(arr):
        tail = arr[-max(1, len(arr) // 4):, 0]
        return float(np.nanmean(tail)) if np.isfinite(tail).any() else 0.0

    seeds = sorted(res["runs"])
    return evaluate(length_bias_claim(), [late_wrong(res["runs"][s]["grpo"]) for s in seeds],
                    [late_wrong(res["runs"][s]["dapo"]) for s in seeds], seconds=res["seconds"])


def length_bias_grid_verdict(results: Results) -> dict:
    """``{"length-bias": verdict}`` of :func:`length_bias_verdict` on a :func:`length_bias_study`'s results."""
    return {"length-bias": length_bias_verdict(length_bias_output(results))}
