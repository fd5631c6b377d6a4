"""The sharpening chapter's language-model experiment and the claims of both experiments (the exact pieces, the
toy and the registered self-rewards are in :mod:`rlcourse.methods.sharpening`). The language-model grid is a
study on the one runner (:func:`lm_study`, one cell per reward and seed; the base model's measures are the
one-cell :func:`lm_base_study`).
"""
from __future__ import annotations

import numpy as np
import torch

from ..claims import Claim, evaluate
from ..methods.sharpening import (  # noqa: F401
    ABSTRACT_CLAIM, DropCarryAddition, PAPER, answer_of, base_model, seed_disagreement,
)
from ..profiles import Profile, one_torch_thread, profile as current_profile
from .runner import Study, run_study


# ---------------------------------------------------------------------- the language-model experiment
LM_ARMS = ("task", "base_loglik", "self_loglik")


def lm_sizes(P: Profile) -> dict:
    return dict(steps=P.pick(smoke=2, book=20), prompts=P.pick(smoke=4, book=16), G=P.pick(smoke=4, book=8),
                lr=3e-4, beta=0.04, eval_prompts=P.pick(smoke=16, book=128), eval_samples=P.pick(smoke=4, book=8),
                eval_every=P.pick(smoke=1, book=5), seeds=P.seeds)


def lm_measure(model, tok, task, examples, n: int, seed: int, max_new_tokens: int = 8) -> dict:
    """Sampled (temperature 1, ``n`` per prompt) and greedy behaviour of ``model`` on ``examples``:
    accuracy, share of dropped-carry answers on carry prompts, malformed share, mean length (tokens,
    EOS included), mean per-token entropy of the sampled responses, and the greedy answers."""
    from ..lm.sampling import sample
    b = sample(model, tok, [e.prompt for e in examples], num_generations=n, max_new_tokens=max_new_tokens,
               generator=torch.Generator().manual_seed(seed))
    rows = [e for e in examples for _ in range(n)]
    answers = [answer_of(t) for t in b.texts]
    carry = [i for i, e in enumerate(rows) if e.meta["carry"]]
    g = sample(model, tok, [e.prompt for e in examples], temperature=0.0, max_new_tokens=max_new_tokens)
    greedy = [answer_of(t) for t in g.texts]
    mask = b.response_mask
    return {"accuracy": float(task.rewards(b.texts, rows).mean()),
            "greedy_accuracy": float(task.rewards(g.texts, examples).mean()),
            "dropped": float(np.mean([answers[i] == rows[i].meta["dropped"] for i in carry])) if carry else 0.0,
            "malformed": float(np.mean([a is None for a in answers])),
            "length": float(b.lengths.float().mean()),
            "entropy": float((b.entropy * mask).sum() / mask.sum()),
            "greedy_answers": [a if a is not None else "" for a in greedy]}


MODULES = ("rlcourse.methods.sharpening", "rlcourse.train", "rlcourse.lm.sampling", "rlcourse.rewards")
BASE = "base model"


def _held(sizes: dict) -> list:
    """The held-out prompts every measurement uses."""
    return DropCarryAddition().examples(sizes["eval_prompts"], seed=0, split="test")


def run_base_cell(arm: str, seed: int, sizes: dict) -> dict:
    """:func:`lm_measure` of the base model on the held-out prompts (its only arm is ``"base model"``;
    the sampling seed is fixed, so ``seed`` only names the cell)."""
    if arm != BASE:
        raise ValueError(f"unknown arm {arm!r}; the arms are ({BASE!r},)")
    with one_torch_thread():
        model, tok = base_model(Profile(**sizes["profile"]))
        return lm_measure(model, tok, DropCarryAddition(), _held(sizes), sizes["eval_samples"], seed=10_000)


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """GRPO from the base model with ``RLConfig.reward = arm`` (one of :data:`LM_ARMS`) from ``seed``;
    ``curve`` lists ``[step, measures]`` (:func:`lm_measure`) every ``eval_every`` steps and at the last
    (the base's own point, step 0, is :func:`run_base_cell`'s)."""
    from ..train import RLConfig, Trainer

    if arm not in LM_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {LM_ARMS}")
    task, held = DropCarryAddition(), _held(sizes)
    with one_torch_thread():
        model, tok = base_model(Profile(**sizes["profile"]))
        cfg = RLConfig(num_generations=sizes["G"], prompts_per_step=sizes["prompts"], steps=sizes["steps"],
                       learning_rate=sizes["lr"], beta=sizes["beta"], max_completion_length=8, reward=arm, seed=seed,
                       progress=False)
        tr = Trainer(model, tok, task, cfg, eval_examples=held[:1])
        curve = []
        for k in range(1, sizes["steps"] + 1):
            tr.step()
            if k % sizes["eval_every"] == 0 or k == sizes["steps"]:
                curve.append([k, lm_measure(tr.model, tok, task, held, sizes["eval_samples"], seed=10_000 + k)])
    return {"curve": curve}


def _study_sizes(P: Profile, overrides: dict) -> dict:
    sz = {**lm_sizes(P), **overrides}
    return {"profile": P.as_dict(), **{k: v for k, v in sz.items() if k != "seeds"}}


def lm_base_study(P: Profile | None = None, **overrides) -> Study:
    """The base model's measures: one cell."""
    sizes = {k: v for k, v in _study_sizes(P or current_profile(), overrides).items()
             if k in ("profile", "eval_prompts", "eval_samples")}
    return Study(name="sharpening-lm-base", arms=(BASE,), seeds=(0,), run=run_base_cell, sizes=sizes, modules=MODULES)


def lm_study(P: Profile | None = None, seeds: int | None = None, arms=LM_ARMS, **overrides) -> Study:
    """The regimes ``arms`` (rewards of :data:`LM_ARMS`) on ``seeds`` seeds (default the profile's), with
    ``overrides`` of :func:`lm_sizes`."""
    P = P or current_profile()
    n = seeds or {**lm_sizes(P), **overrides}["seeds"]
    return Study(name="sharpening-lm", arms=tuple(arms), seeds=tuple(range(n)), run=run_cell,
                 sizes=_study_sizes(P, overrides), modules=MODULES)


def lm_experiment(P: Profile | None = None, seeds: int | None = None, arms=LM_ARMS, run_kw: dict | None = None,
                  **overrides) -> dict:
    """The three regimes on the tiny addition model with a dropped-carry error mode (:func:`base_model`):
    the same GRPO loop (``RLConfig``: ``beta`` KL to the base, ``k3+``), the same prompts and the same
    decoding; only ``RLConfig.reward`` changes. Every ``eval_every`` steps the policy is measured on
    held-out prompts (:func:`lm_measure`). :func:`lm_study` and :func:`lm_base_study` run on the study
    runner (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`). Returns ``base`` (the base's
    measures), ``curves[arm]`` (per seed, a list of ``(step, measures)``), ``final[arm]`` (per seed, the
    last measures), ``sizes``, ``seeds``, ``seconds``."""
    P = P or current_profile()
    study = lm_study(P, seeds, arms, **overrides)
    base = run_study(lm_base_study(P, **overrides), **(run_kw or {}))
    res = run_study(study, **(run_kw or {}))
    b = base.metrics[(BASE, 0)]
    curves = {arm: [[(0, b)] + [tuple(point) for point in res.metrics[(arm, s)]["curve"]] for s in study.seeds]
              for arm in study.arms}
    return {"base": b, "curves": curves, "final": {arm: [c[-1][1] for c in cs] for arm, cs in curves.items()},
            "sizes": {**lm_sizes(P), **overrides}, "seeds": len(study.seeds),
            "seconds": base.wall_seconds + res.wall_seconds}


# ---------------------------------------------------------------------- claims
def toy_claims() -> dict[str, Claim]:
    common = dict(paper=PAPER, source="abstract; the softmax toy and the metric are ours",
                  setting="exact per-prompt softmax over 20 candidate answers, 64 carry prompts, base about 41% "
                          "correct (the dropped-carry answer modal on most prompts), 8 samples a prompt and step, "
                          "advantage r - mean(r), beta 0.1, lr 0.5, 400 steps")
    return {
        "task_vs_sharpening": Claim(key="sharpening/toy-task-beats-sharpening", statement=ABSTRACT_CLAIM,
                                    metric="final expected accuracy (mean over prompts)", method="task reward",
                                    baseline="base log-likelihood (sharpening)", kind="greater", margin=0.0,
                                    **common),
        "self_unstable": Claim(key="sharpening/toy-self-reward-seed-dependent",
                               statement="our variant, not the paper's object: a self-referential likelihood reward "
                               "(the current policy's own log-probability) ends in seed-dependent modes (the "
                               "abstract calls sharpening 'fundamentally unstable'; frozen-base sharpening with a "
                               "KL term has a unique optimum, so it is not tested here)", source="abstract (about "
                               "sharpening); the self-referential variant and the metric are ours",
                               role="course hypothesis",
                               paper=PAPER, setting=common["setting"],
                               metric="share of prompts whose final mode differs from the majority of the seeds",
                               method="self log-likelihood", baseline="task reward", kind="greater", margin=0.0),
    }


def toy_verdicts(out: dict) -> dict:
    c, runs = toy_claims(), out["runs"]
    acc = {rw: [r["accuracy"][-1] for r in rs] for rw, rs in runs.items()}
    dis = {rw: seed_disagreement(np.array([r["pi"].argmax(1) for r in rs])) for rw, rs in runs.items()}
    return {"task_vs_sharpening": evaluate(c["task_vs_sharpening"], acc["task"], acc["base_loglik"],
                                           seconds=out["seconds"]),
            "self_unstable": evaluate(c["self_unstable"], dis["self_loglik"], dis["task"], seconds=out["seconds"])}


LM_SETTING = ("tiny Llama (book profile: 3 layers, hidden 128) pre-trained 800 SFT steps on two-digit addition "
              "whose demonstrations drop every carry on half of the carry prompts; GRPO, 16 prompts x 8 samples, "
              "lr 3e-4, beta 0.04 (k3+), 20 steps; 128 held-out prompts x 8 samples at temperature 1")


def lm_claims() -> dict[str, Claim]:
    common = dict(paper=PAPER, source="abstract", setting=LM_SETTING,
                  paper_number="Llama-3.2-3B, Qwen2.5-3B, Qwen3-4B on math data (no number in the abstract)")
    return {
        "control": Claim(key="sharpening/lm-task-reward-improves", statement="incorporating task-based reward "
                         "signal can greatly help achieve robust performance improvements",
                         metric="sampled accuracy (temperature 1) on held-out prompts after training",
                         method="task reward", baseline="base model", kind="greater", margin=0.05, **common),
        "task_vs_sharpening": Claim(key="sharpening/lm-task-beats-sharpening", statement=ABSTRACT_CLAIM,
                                    metric="sampled accuracy (temperature 1) on held-out prompts after training",
                                    method="task reward", baseline="base log-likelihood (sharpening)",
                                    kind="greater", margin=0.0, **common),
        "self_unstable": Claim(key="sharpening/lm-self-reward-seed-dependent",
                               statement="our variant, not the paper's object: a self-referential likelihood reward "
                               "(the current policy's own log-probability) ends in seed-dependent answers (the "
                               "abstract calls sharpening 'fundamentally unstable'; frozen-base sharpening with a "
                               "KL term has a unique optimum, so it is not tested here)", role="course hypothesis",
                               source="abstract (about sharpening); the self-referential variant and the metric "
                                      "are ours", paper=PAPER, setting=LM_SETTING,
                               metric="share of held-out prompts whose greedy answer differs from the majority "
                                      "answer of the arm's seeds",
                               method="self log-likelihood", baseline="task reward", kind="greater", margin=0.0),
    }


def lm_verdicts(out: dict) -> dict:
    c, f, n, sec = lm_claims(), out["final"], out["seeds"], out["seconds"]
    acc = {arm: [m["accuracy"] for m in ms] for arm, ms in f.items()}
    ids = {}

    def modes(arm):
        return np.array([[ids.setdefault(a, len(ids)) for a in m["greedy_answers"]] for m in f[arm]])

    dis = {arm: seed_disagreement(modes(arm)) for arm in f}
    return {"control": evaluate(c["control"], acc["task"], [out["base"]["accuracy"]] * n, seconds=sec),
            "task_vs_sharpening": evaluate(c["task_vs_sharpening"], acc["task"], acc["base_loglik"], seconds=sec),
            "self_unstable": evaluate(c["self_unstable"], dis["self_loglik"], dis["task"], seconds=sec),
            "disagreement": {arm: d.tolist() for arm, d in dis.items()}}
