"""The Test-time scaling chapter's study: pass@k, maj@k and best-of-k of the ``addition`` base model
against the same model after a short GRPO run (:mod:`rlcourse.testtime`), then Yue et al.'s claims
and their verdicts.

The arms are :data:`ARMS`: ``"GRPO"`` trains the profile's base model from the seed and evaluates it,
``"base, fresh samples"`` evaluates the base model again with fresh samples (the positive control of
the "comparable at large k" claim). The seeds are the profile's (one in smoke). One cell loads the base
model, seeds torch's global generator and its own numpy generator with its seed (:func:`run_cell`), so
a cell's numbers do not depend on which cells ran before it. The base model's own curves, evaluated
once on fixed samples and shared by every seed, are one computation outside the grid
(:func:`base_reference`). :func:`run_test_time_experiment` runs the grid on the study runner (cached
per cell) and rebuilds the dict the chapter reads; :func:`tts_verdicts` evaluates :data:`TTS_CLAIMS`
on it.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..claims import Claim, Verdict, evaluate
from ..profiles import Profile, one_torch_thread, profile as current_profile
from .runner import Results, Study, run_study

ARMS = ("base, fresh samples", "GRPO")
MODULES = ("rlcourse.testtime", "rlcourse.train", "rlcourse.preferences")
CURVES = ("pass", "maj", "bok_noisy", "bok_conf")  # the (K,) curves of a GRPO cell


def experiment_sizes(prof: Profile) -> dict:
    """The experiment's sizes for a profile."""
    return prof.pick(
        smoke=dict(eval_prompts=8, n=8, ks=[1, 2, 4, 8], maj_ks=[1, 3, 8], steps=2, prompts_per_step=4,
                   num_generations=4, seeds=[0], max_new_tokens=10, noise_sigma=0.5, max_subsets=50),
        book=dict(eval_prompts=128, n=32, ks=list(range(1, 33)), maj_ks=[1, 3, 5, 9, 17, 32], steps=80,
                  prompts_per_step=16, num_generations=8, seeds=list(range(prof.seeds)), max_new_tokens=10,
                  noise_sigma=0.5, max_subsets=200),
    )


def _base_and_test(sizes: dict):
    """The profile's ``addition`` base model, its tokenizer, the task and the held-out prompts."""
    from ..lm.zoo import load_base_model
    from ..tasks import get_task

    base, tok = load_base_model("addition", "medium", prof=Profile(**sizes["profile"]), progress=False)
    task = get_task("addition")
    return base, tok, task, task.examples(sizes["eval_prompts"], seed=2000, split="test")


def _curves(ev: dict, test, sizes: dict, rng: np.random.Generator) -> dict:
    """:func:`rlcourse.testtime.curves_from_samples` of ``ev`` on the held-out prompts ``test``."""
    from ..testtime import curves_from_samples

    refs = [int(e.answer) for e in test]
    return curves_from_samples(ev, refs, sizes["ks"], sizes["maj_ks"], sizes["noise_sigma"], rng,
                               sizes["max_subsets"])


def base_reference(sizes: dict) -> dict:
    """The base model's curves (``n`` samples per held-out prompt from generator seed 0, noise from
    numpy seed 0), its greedy accuracy and its ``(P, n)`` correctness: shared by every seed."""
    from ..lm.zoo import greedy_accuracy
    from ..testtime import evaluate_samples

    with one_torch_thread():
        base, tok, task, test = _base_and_test(sizes)
        ev = evaluate_samples(base, tok, test, sizes["n"], sizes["max_new_tokens"], torch.Generator().manual_seed(0))
        return {"base": _curves(ev, test, sizes, np.random.default_rng(0)),
                "base_greedy": greedy_accuracy(base, tok, task, test, sizes["max_new_tokens"]),
                "base_correct": ev["correct"]}


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """One arm of :data:`ARMS` on one seed (``K`` values of k, ``P`` held-out prompts, ``n`` samples each).

    ``"base, fresh samples"``: the base model's ``pass`` ``(K,)`` from fresh samples (generator seed
    ``100 + seed``). ``"GRPO"``: the base model after ``steps`` GRPO steps (lr 1e-4) from ``seed``,
    sampled from generator seed ``1 + seed``, noise from numpy seed ``1 + seed``:

    =============  ============  ===============================================================
    pass, ...      ``(K,)``      the curves of :data:`CURVES`
    mean_correct   scalar        mean correctness of the samples
    frac_unsolved  scalar        share of prompts with no right sample
    greedy         scalar        greedy accuracy on the held-out prompts
    reward         ``(steps,)``  mean training reward at each step
    correct        ``(P, n)``    0/1 correctness of each sample
    =============  ============  ===============================================================
    """
    from ..testtime import evaluate_samples, pass_at_k_curve
    from ..train import RLConfig, Trainer

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {ARMS}")
    z = sizes
    with one_torch_thread():
        base, tok, task, test = _base_and_test(z)
        if arm == "base, fresh samples":
            ev = evaluate_samples(base, tok, test, z["n"], z["max_new_tokens"], torch.Generator().manual_seed(100 + seed))
            return {"pass": pass_at_k_curve(ev["correct"], z["ks"]).tolist()}
        cfg = RLConfig(advantage_estimator="grpo", learning_rate=1e-4, steps=z["steps"],
                       prompts_per_step=z["prompts_per_step"], num_generations=z["num_generations"],
                       max_completion_length=z["max_new_tokens"], seed=seed, progress=False)
        torch.manual_seed(seed)
        trainer = Trainer(base, tok, task, cfg, eval_examples=test)
        trainer.train()
        ev = evaluate_samples(trainer.model, tok, test, z["n"], z["max_new_tokens"], torch.Generator().manual_seed(1 + seed))
        curves = _curves(ev, test, z, np.random.default_rng(1 + seed))
        return {**{k: v.tolist() if k in CURVES else v for k, v in curves.items()},
                "greedy": float(trainer.evaluate()), "reward": [h["reward"] for h in trainer.history],
                "correct": ev["correct"].tolist()}


def tts_study(P: Profile) -> Study:
    """The chapter's grid: both arms of :data:`ARMS` on the seeds of :func:`experiment_sizes`."""
    z = experiment_sizes(P)
    return Study(name="test_time_scaling", arms=ARMS, seeds=tuple(z["seeds"]), run=run_cell,
                 sizes={**z, "profile": P.as_dict()}, verdicts=verdicts, modules=MODULES)


def experiment_output(results: Results, base: dict | None = None) -> dict:
    """The chapter's dict from a :func:`tts_study`'s results (``N`` seeds, ``K`` values of k, ``P``
    prompts, ``n`` samples), with the base model's :func:`base_reference` ``base`` (default: run here).

    ===============  ================  ====================================================
    ks, maj_ks       ``(K,)``          the values of k for pass/best-of-k and for maj@k
    base             dict              the base model's curves (:data:`CURVES` and more)
    rl               ``N`` dicts       the same after GRPO, one per seed
    base_greedy      scalar            the base model's greedy accuracy
    rl_greedy        ``N``             greedy accuracy after GRPO, per seed
    rl_reward        ``N x (steps,)``  the GRPO runs' mean training reward
    base_correct     ``(P, n)``        0/1 correctness of the base model's samples
    rl_correct       ``N x (P, n)``    the same after GRPO
    base_rerun_pass  ``N x (K,)``      the base model's pass@k from fresh samples, per seed
    config, profile  dict, str         :func:`experiment_sizes` and the profile's name
    seconds          float             wall seconds of the grid's cells (and of the base's, if run)
    ===============  ================  ====================================================
    """
    study = results.study
    z = {k: v for k, v in study.sizes.items() if k != "profile"}
    t0 = time.perf_counter()
    base = base_reference(study.sizes) if base is None else base
    seconds = results.wall_seconds + time.perf_counter() - t0
    cells = [results.metrics[("GRPO", s)] for s in study.seeds]
    rl = [{k: np.asarray(c[k]) if k in CURVES else c[k] for k in (*CURVES, "mean_correct", "frac_unsolved")}
          for c in cells]
    return {"ks": np.array(z["ks"]), "maj_ks": np.array(z["maj_ks"]), "config": z,
            "profile": study.sizes["profile"]["name"], **base, "rl": rl,
            "rl_greedy": [c["greedy"] for c in cells], "rl_reward": [np.array(c["reward"]) for c in cells],
            "rl_correct": [np.array(c["correct"]) for c in cells],
            "base_rerun_pass": [np.array(p) for p in results.values("base, fresh samples", "pass")],
            "seconds": seconds}


def run_test_time_experiment(prof: Profile | None = None, **run_kw) -> dict:
    """pass@k, maj@k and best-of-k for k = 1..n of the addition base model and of the same model after
    a short GRPO run (lr 1e-4), one GRPO run per seed, all on the same held-out prompts:
    :func:`tts_study` on the study runner (``prof`` by default the current one; ``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`), as
    :func:`experiment_output`'s dict (with the base model's :func:`base_reference`)."""
    return experiment_output(run_study(tts_study(prof or current_profile()), **run_kw))


_TTS_SETTING = ("tiny Llama addition model (the lab's medium base) vs the same after 80 GRPO steps (16 prompts x 8, "
                "lr 1e-4), one run per seed; 128 held-out prompts, n = 32 samples each at T = 1, unbiased estimators; "
                "the base model is evaluated once, so its value is the same in every pair")
_YUE = ("Yue et al., Does Reinforcement Learning Really Incentivize Reasoning Capacity in LLMs Beyond the Base "
        "Model?, 2025, arXiv:2504.13837")
TTS_CLAIMS = {
    "pass1": Claim(
        key="test_time_scaling/rl-raises-pass1", paper=_YUE,
        statement="RL-trained models outperform their base models at small values of k (e.g., k = 1)",
        source="abstract (arXiv v1, 2025)", setting=_TTS_SETTING, metric="pass@1 on the held-out prompts",
        method="after GRPO", baseline="base model", kind="greater", margin=0.0),
    "gain_shrinks": Claim(
        key="test_time_scaling/gain-shrinks-with-k", paper=_YUE,
        statement="RL's advantage over the base model is at small k; at large k the base model catches up",
        source="abstract (arXiv v1, 2025)", setting=_TTS_SETTING + "; largest k = n = 32",
        metric="RL's pass@k gain over the base model", method="gain at k = 32", baseline="gain at k = 1",
        kind="less", margin=0.0),
    "large_k": Claim(
        key="test_time_scaling/base-comparable-at-large-k", paper=_YUE,
        statement="base models can achieve a comparable or even higher pass@k score compared to their RL "
                  "counterparts at large k values (tested here: comparable, within 2 points)",
        source="abstract (arXiv v1, 2025); the margin 0.02 is ours, fixed before the run",
        setting=_TTS_SETTING + "; k = n = 32 (the paper's large k is hundreds)",
        metric="pass@32 on the held-out prompts", method="after GRPO", baseline="base model",
        kind="equivalent", margin=0.02),
    "control": Claim(
        key="test_time_scaling/control-same-model-comparable", role="positive control",
        paper="(positive control for the claim 'comparable at large k')",
        statement="the same model, evaluated twice with fresh samples, is comparable within 2 points at k = n: "
                  "shows that the equivalence test can conclude at this number of prompts and samples",
        source="this chapter", setting=_TTS_SETTING + "; k = n = 32", metric="pass@32 on the held-out prompts",
        method="base model, fresh samples", baseline="base model", kind="equivalent", margin=0.02),
    "bok": Claim(
        key="test_time_scaling/base-best-of-k-recovers-most", paper=_YUE,
        statement="(this chapter's extension of the paper's reading to an imperfect verifier) with best-of-k by "
                  "a noisy reward, sampling more from the base model recovers most of what RL bought: RL's lead "
                  "at k = n is less than half its lead at k = 1",
        source="this chapter; the paper's reading of pass@k", setting=_TTS_SETTING + "; scorer = graded true "
        "reward + N(0, 0.5^2) noise", metric="RL's lead in best-of-k", method="lead at k = 32",
        baseline="half the lead at k = 1", kind="less", margin=0.0, role="course hypothesis"),
}


def tts_verdicts(res: dict) -> dict[str, Verdict]:
    """The verdicts of :data:`TTS_CLAIMS` on :func:`run_test_time_experiment`'s output (one value per seed)."""
    base, rl, s = res["base"], res["rl"], res["seconds"]
    n = len(rl)
    gain = np.array([r["pass"] - base["pass"] for r in rl])  # (seeds, len(ks))
    lead = np.array([r["bok_noisy"] - base["bok_noisy"] for r in rl])
    return {
        "pass1": evaluate(TTS_CLAIMS["pass1"], [r["pass"][0] for r in rl], [base["pass"][0]] * n, seconds=s),
        "gain_shrinks": evaluate(TTS_CLAIMS["gain_shrinks"], gain[:, -1], gain[:, 0], seconds=s),
        "large_k": evaluate(TTS_CLAIMS["large_k"], [r["pass"][-1] for r in rl], [base["pass"][-1]] * n, seconds=s),
        "bok": evaluate(TTS_CLAIMS["bok"], lead[:, -1], 0.5 * lead[:, 0], seconds=s),
        "control": evaluate(TTS_CLAIMS["control"], [c[-1] for c in res["base_rerun_pass"]], [base["pass"][-1]] * n,
                            seconds=s),
    }


def verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`tts_verdicts` on a :func:`tts_study`'s results."""
    return tts_verdicts(experiment_output(results))
