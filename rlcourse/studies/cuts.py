"""The CUTS chapter's study: GRPO, Mixed-CUTS (with and without the ``cuts_is`` weight) and two
positive controls, trained from one near-saturated tiny model on two-digit addition; then the
paper's claims and their verdicts on the grid.

The arms are the names of an arm table (default :data:`ARMS`), whose entries (training task and
:class:`~rlcourse.train.RLConfig` parts) travel in the study's sizes with the budget and the
profile; the seeds are the profile's ``seeds``. One cell (:func:`run_cell`) loads the profile's base
model, trains it with one arm from one seed and measures it, so a cell's numbers do not depend on which
cells ran before it. The base model's own measurements are a one-cell study (:func:`base_study`).
:func:`run_lm_experiment` runs both on the study runner (cached per cell) and rebuilds the dict the
chapter reads; :func:`lm_verdicts` evaluates :func:`lm_claims` on it.
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from ..claims import Claim, Verdict, evaluate
from ..methods.cuts import PAPER
from ..metrics import distinct_count, empirical_entropy, frac_mixed_groups
from ..ops import masked_mean
from ..profiles import Profile, one_torch_thread
from ..lm.sampling import sample
from .runner import Results, Study, run_study

EXPLORER = "Mixed-CUTS, top-2 explorer (control)"
ARMS = {  # name -> (training task, RLConfig parts)
    "GRPO": ("addition", dict()),
    "Mixed-CUTS": ("addition", dict(sampler="mixed_cuts")),
    "Mixed-CUTS + IS": ("addition", dict(sampler="mixed_cuts", policy_loss="cuts_is")),
    "GRPO on short-operand sums (control)": ("addition_short", dict()),
    # an explorer that explores by construction: uniform over the two most probable tokens at every step
    # (the package's top_k rule), so its rows leave the greedy path even where the typical set is one token
    EXPLORER: ("addition", dict(sampler="mixed_cuts", sampler_kwargs={"rule": "top_k", "top_k": 2})),
}
HARD = "addition_short"
G = 8  # rows per group (Mixed-CUTS: 4 + 4)
MEASURES = ("acc", "hard", "entropy", "distinct", "mixed_probe", "sampled")  # what measure() returns
MODULES = ("rlcourse.methods.cuts", "rlcourse.methods.behaviour_is", "rlcourse.train", "rlcourse.lm.sampling")


@torch.no_grad()
def probe(model, tokenizer, task, examples, G: int, max_new_tokens: int, seed: int = 0) -> dict:
    """Sample ``G`` responses per held-out prompt from the policy (temperature 1, no CUTS) and measure:
    ``accuracy`` (sampled), ``mixed_groups`` (:func:`rlcourse.metrics.frac_mixed_groups`), ``entropy``
    (mean policy entropy per response token), ``distinct`` (mean distinct responses per prompt,
    :func:`rlcourse.metrics.distinct_count`) and ``text_entropy`` (mean plug-in entropy of a prompt's
    responses, :func:`rlcourse.metrics.empirical_entropy`)."""
    batch = sample(model, tokenizer, [e.prompt for e in examples], num_generations=G, max_new_tokens=max_new_tokens,
                   generator=torch.Generator().manual_seed(seed))
    per_row = [examples[int(i)] for i in batch.index]
    scores = torch.as_tensor(task.rewards(batch.texts, per_row))
    groups = [batch.texts[i * G:(i + 1) * G] for i in range(len(examples))]
    return {"accuracy": float(scores.mean()), "mixed_groups": frac_mixed_groups(scores, G),
            "entropy": float(masked_mean(batch.entropy, batch.response_mask)),
            "distinct": float(np.mean([distinct_count(g) for g in groups])),
            "text_entropy": float(np.mean([empirical_entropy(g) for g in groups]))}


def testbed(sizes: dict) -> dict:
    """The profile's base model (book: greedy accuracy about 0.95 on two-digit addition) and the held-out
    sets of ``sizes["eval"]``, with ``measure(model)``: the :data:`MEASURES` of a model."""
    from ..lm import load_base_model
    from ..lm.zoo import greedy_accuracy, max_new_tokens_for
    from ..tasks import get_task

    prof, ev_sizes = Profile(**sizes["profile"]), sizes["eval"]
    model, tok = load_base_model("addition", prof.pick(smoke="medium", book=0.95), prof=prof, progress=False)
    task, hard = get_task("addition"), get_task(HARD)
    ev = task.examples(ev_sizes["eval_prompts"], seed=4321, split="test")
    ev_hard = hard.examples(ev_sizes["hard_prompts"], seed=4321, split="test")
    probe_ex = ev[:ev_sizes["probe_prompts"]]
    T = max_new_tokens_for(task, ev_hard)

    def measure(m) -> dict:
        pr = probe(m, tok, task, probe_ex, G, T)
        return {"acc": greedy_accuracy(m, tok, task, ev, T), "hard": greedy_accuracy(m, tok, hard, ev_hard, T),
                "entropy": pr["entropy"], "distinct": pr["distinct"], "mixed_probe": pr["mixed_groups"],
                "sampled": pr["accuracy"]}

    return {"model": model, "tokenizer": tok, "ev": ev, "T": T, "measure": measure}


def run_base_cell(arm: str, seed: int, sizes: dict) -> dict:
    """The base model's :data:`MEASURES` (its only arm is ``"base model"``; greedy and probe sampling
    seeds are fixed, so ``seed`` only names the cell)."""
    if arm != "base model":
        raise ValueError(f"unknown arm {arm!r}; the arms are ('base model',)")
    with one_torch_thread():
        bed = testbed(sizes)
        return bed["measure"](bed["model"])


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train the base model with arm ``arm`` of ``sizes["arms"]`` from ``seed`` and measure it
    (``T`` training steps).

    =============================  ========  ===============================================
    acc, hard, entropy, ...        scalar    the final :data:`MEASURES`
    mixed_train                    scalar    mean share of training groups whose rewards differ
    curve_mixed                    ``(T,)``  that share at each step
    curve_entropy                  ``(T,)``  policy entropy per token (policy rows only)
    exploit, explore               ``(T,)``  ``mixed_cuts`` arms only: each sub-group's reward
    greedy_share                   ``(T,)``  ``mixed_cuts`` arms only: CUTS tokens with ``|C_t| = 1``
    =============================  ========  ===============================================
    """
    from ..train import RLConfig, Trainer

    if arm not in sizes["arms"]:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(sizes['arms'])}")
    train_task, parts = sizes["arms"][arm][0], copy.deepcopy(sizes["arms"][arm][1])
    with one_torch_thread():
        bed = testbed(sizes)
        cfg = RLConfig(num_generations=G, prompts_per_step=sizes["prompts_per_step"], steps=sizes["steps"],
                       learning_rate=sizes["lr"], max_completion_length=bed["T"], seed=seed, progress=False, **parts)
        trainer = Trainer(bed["model"], bed["tokenizer"], train_task, cfg, eval_examples=bed["ev"][:8])
        hist = trainer.train()
        out = bed["measure"](trainer.model)
    out["curve_mixed"] = [1.0 - h["frac_zero_std_groups"] for h in hist]
    out["curve_entropy"] = [h.get("cuts_exploit_entropy", h["entropy"]) for h in hist]
    out["mixed_train"] = float(np.mean(out["curve_mixed"]))
    if parts.get("sampler") == "mixed_cuts":
        out.update(exploit=[h["cuts_exploit_reward"] for h in hist], explore=[h["cuts_explore_reward"] for h in hist],
                   greedy_share=[h["cuts_greedy_share"] for h in hist])
    return out


def lm_sizes(P: Profile) -> dict:
    """The profile and its held-out sets, shared by :func:`base_study` and :func:`lm_study`."""
    return {"profile": P.as_dict(), "eval": {"eval_prompts": P.pick(smoke=16, book=256),
                                             "hard_prompts": P.pick(smoke=16, book=150),
                                             "probe_prompts": P.pick(smoke=4, book=64)}}


def base_study(P: Profile) -> Study:
    """The base model's measurements: one cell."""
    return Study(name="cuts-base", arms=("base model",), seeds=(0,), run=run_base_cell, sizes=lm_sizes(P),
                 modules=MODULES)


def lm_study(P: Profile, seeds: int | None = None, steps: int | None = None, lr: float = 1e-4,
             arms: dict | None = None) -> Study:
    """Every arm of ``arms`` (default :data:`ARMS`) on ``seeds`` (default ``P.seeds``) paired seeds,
    ``steps`` (default: the profile's) steps at learning rate ``lr``."""
    arms = arms or ARMS
    sizes = {**lm_sizes(P), "steps": steps or P.pick(smoke=2, book=20), "lr": lr,
             "prompts_per_step": P.pick(smoke=2, book=8), "arms": {k: list(v) for k, v in arms.items()}}
    return Study(name="cuts-lm", arms=tuple(arms), seeds=tuple(range(seeds or P.seeds)), run=run_cell, sizes=sizes,
                 verdicts=verdicts, modules=MODULES)


def lm_output(results: Results) -> dict:
    """The chapter's dict from an :func:`lm_study`'s results (``n`` seeds, ``T`` steps), without ``base``.

    ==================  ===========  ==================================================================
    acc, hard, ...      ``(n,)``     per arm: each of :data:`MEASURES` and ``mixed_train``
    curves              ``(n, T)``   ``curves["mixed"][arm]`` and ``curves["entropy"][arm]``
    sub_rewards_by_arm  ``(n, T)``   per ``mixed_cuts`` arm: ``exploit``, ``explore``, ``greedy_share``
    sub_rewards         ``(n, T)``   that of ``"Mixed-CUTS"`` (empty if the arm did not run)
    arms, seeds, ...    ...          the arms, seeds, ``steps``, ``G``, ``lr``
    seconds             float        wall seconds of the grid's cells
    ==================  ===========  ==================================================================
    """
    study, sz = results.study, results.study.sizes
    out = {k: {arm: np.array(results.values(arm, k)) for arm in study.arms} for k in (*MEASURES, "mixed_train")}
    curves = {key: {arm: np.array(results.values(arm, f"curve_{key}")) for arm in study.arms}
              for key in ("mixed", "entropy")}
    subs = {arm: {k: np.array(results.values(arm, k)) for k in ("exploit", "explore", "greedy_share")}
            for arm in study.arms if sz["arms"][arm][1].get("sampler") == "mixed_cuts"}
    return {**out, "curves": curves, "sub_rewards_by_arm": subs, "sub_rewards": subs.get("Mixed-CUTS", {}),
            "arms": list(study.arms), "seeds": len(study.seeds), "steps": sz["steps"], "G": G, "lr": sz["lr"],
            "seconds": results.wall_seconds}


def run_lm_experiment(P: Profile, seeds: int | None = None, steps: int | None = None, lr: float = 1e-4,
                      arms: dict | None = None, **run_kw) -> dict:
    """Every arm of :data:`ARMS` from one near-saturated base model, ``P.seeds`` paired seeds, ``G = 8``
    (Mixed-CUTS: 4 + 4): :func:`lm_study` and :func:`base_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`), as :func:`lm_output`'s dict plus ``base``, the base
    model's :data:`MEASURES` (its seconds count in ``seconds``).

    ``acc`` is the held-out greedy accuracy on the training distribution, ``hard`` that on
    ``addition_short``, ``mixed_train`` the mean share of training groups whose rewards differ, and
    ``entropy``, ``distinct``, ``mixed_probe``, ``sampled`` the final :func:`probe` values."""
    base = run_study(base_study(P), **run_kw)
    out = lm_output(run_study(lm_study(P, seeds, steps, lr, arms), **run_kw))
    out.update(base=base.metrics[("base model", 0)], seconds=out["seconds"] + base.wall_seconds)
    return out


def setting(steps: int, lr: float) -> str:
    """The claims' setting sentence, with the run's budget."""
    return ("tiny Llama (book profile) pre-trained on two-digit addition (reversed-digit scratchpad) to about 95% "
            f"held-out greedy accuracy; 8 prompts x G = 8 per step, {steps} steps, AdamW lr {lr:g}; Mixed-CUTS = 4 "
            "policy + 4 CUTS rows (typical-set rule) per group; control explorer: 4 + 4 rows with the top-2 rule; "
            "harder held-out variant: sums with one single-digit operand")


def lm_claims(steps: int = 20, lr: float = 1e-4) -> dict[str, Claim]:
    """The chapter's claims, for a run of ``steps`` steps at learning rate ``lr``. Two are gated on a
    positive control: the mixed-groups claim on the top-2 explorer (an explorer that leaves the greedy
    path does raise the share of mixed groups here), the harder-variant claim on GRPO trained on the
    harder variant (the budget can move its accuracy)."""
    common = dict(paper=PAPER, setting=setting(steps, lr), baseline="GRPO", kind="greater")
    return {
        "mixed": Claim(key="cuts/mixed-groups", source="abstract", statement="Mixed-CUTS mixes exploitative and "
                       "exploratory rollouts 'to amplify intra-group advantage variance'", paper_number="",
                       metric="mean share of training groups whose rewards are not all equal", method="Mixed-CUTS",
                       control="cuts/explorer-control", **common),
        "entropy": Claim(key="cuts/entropy", source="abstract", statement="the approach 'prevents policy "
                         "degeneration' (GRPO's groups are all correct and it mode-collapses)", paper_number="",
                         metric="policy entropy per token at the end, sampled on 64 held-out prompts",
                         method="Mixed-CUTS", **common),
        "hard": Claim(key="cuts/harder-variant", source="abstract", statement="Mixed-CUTS 'significantly boosts "
                      "out-of-domain generalization'", paper_number="AIME25 Pass@1 up to +15.1% over GRPO (Qwen3)",
                      metric="held-out greedy accuracy on short-operand sums at the end", method="Mixed-CUTS",
                      control="cuts/short-operand-control", **common),
        "control": Claim(key="cuts/short-operand-control", role="positive control", source="positive control (ours)",
                         statement="positive control: the harder variant can be learned at this scale and budget "
                         "(GRPO trained on it beats GRPO trained on ordinary sums)", paper_number="",
                         metric="held-out greedy accuracy on short-operand sums at the end",
                         method="GRPO on short-operand sums (control)", **common),
        "explorer": Claim(key="cuts/explorer-control", role="positive control", source="positive control (ours)",
                          statement="positive control: an explorer that leaves the greedy path (4 of 8 rows uniform "
                          "over the two most probable tokens) raises the share of training groups with differing "
                          "rewards above GRPO's at this scale", paper_number="",
                          metric="mean share of training groups whose rewards are not all equal", method=EXPLORER,
                          **common),
    }


def lm_verdicts(out: dict) -> dict[str, Verdict]:
    """The claims of :func:`lm_claims` on a run of :func:`run_lm_experiment`; the controls are decided
    first and handed to the claims that rest on them (an arm the run left out skips its claims)."""
    c, s = lm_claims(out["steps"], out["lr"]), out["seconds"]
    m = {"mixed": "mixed_train", "entropy": "entropy", "hard": "hard", "control": "hard", "explorer": "mixed_train"}
    v = {}
    for k in ("control", "explorer", "mixed", "entropy", "hard"):
        claim = c[k]
        if claim.method not in out[m[k]]:
            continue
        ctrl = next((v[j] for j in v if c[j].key == claim.control), None)
        if claim.control is not None and ctrl is None:
            continue
        v[k] = evaluate(claim, out[m[k]][claim.method], out[m[k]]["GRPO"], seconds=s, control=ctrl)
    return v


def verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`lm_verdicts` on an :func:`lm_study`'s results (the grid's seconds only)."""
    return lm_verdicts(lm_output(results))
