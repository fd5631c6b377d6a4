"""The OTB chapter's experiments (the estimator, its proxy and the testbeds are in :mod:`rlcourse.methods.otb`
and :mod:`rlcourse.methods.otb_longwrong`).

* :func:`run_otb_experiment`: the exact gradient variance on the tabular policy, the proxy on the tiny
  model, and learning curves on the tiny model, whose three runs are the grid of :func:`lm_study`.
* :func:`run_longwrong_experiment`: OTB against the group mean on
  :class:`~rlcourse.methods.otb_longwrong.LongWrongTask`, the grid of :func:`longwrong_study` (Adam at the
  rate :func:`choose_longwrong_lr` fixes on other seeds, and the earlier plain-SGD protocol), whose
  claims :data:`CLAIMS` are judged by :func:`otb_verdicts`.

Every (arm, seed) cell seeds its own random generator, so its numbers do not depend on which other
cells ran before it or where; the grids run on the study runner, cached per cell.
"""
from __future__ import annotations

import copy
import time
from dataclasses import replace

import numpy as np
import torch

from ..claims import Claim, evaluate
from ..methods.otb import TabularAR, per_token_param_grad_sq, tabular_gradient_variance, tabular_oracle_nsr
from ..methods.otb_longwrong import LongWrongTask, longwrong_nsr, run_longwrong
from ..profiles import Profile, one_torch_thread
from ..profiles import profile as get_profile
from .runner import Results, Study, run_study


# ---------------------------------------------------------------------- the tabular policy and the tiny model
LM_ARMS = {"grpo-4": ("dr_grpo", 4), "otb-4": ("otb", 4), "grpo-16": ("dr_grpo", 16)}  # arm -> (estimator, G)


def run_lm_cell(arm: str, seed: int, sizes: dict) -> dict:
    """RL on the tiny addition model with one arm of :data:`LM_ARMS` (no gradient clipping: spikes are
    what we look at): per-step ``reward``, cumulative ``tokens`` and ``grad_norm``, the final greedy
    accuracy ``eval`` and the training ``seconds``."""
    from ..lm import load_base_model
    from ..train import RLConfig, Trainer

    if arm not in LM_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(LM_ARMS)}")
    estimator, G = LM_ARMS[arm]
    prompts, steps = sizes["prompts_per_step"], sizes["steps"]
    cfg = RLConfig(num_generations=G, prompts_per_step=prompts, max_completion_length=10, steps=steps,
                   learning_rate=sizes["lr"], advantage_estimator=estimator, seed=seed, progress=False,
                   sampler="otb_policy" if estimator == "otb" else "policy", eval_every=steps,
                   eval_prompts=sizes["eval_prompts"], max_grad_norm=None)
    with one_torch_thread():
        base, tok = load_base_model("addition", "medium", prof=get_profile(sizes["profile"]), progress=False)
        hist = Trainer(copy.deepcopy(base), tok, "addition", cfg).train()
    tokens = np.cumsum([h["response_length"] * prompts * G for h in hist])
    return {"reward": [h["reward"] for h in hist], "tokens": tokens.tolist(),
            "grad_norm": [h["grad_norm"] for h in hist], "eval": hist[-1]["eval_greedy_accuracy"],
            "seconds": float(sum(h["step_seconds"] for h in hist))}


def lm_study(prof: Profile) -> Study:
    """The tiny-model learning curves: the group mean (``dr_grpo``) at G = 4 and 16 and OTB at G = 4,
    same prompts per step, seed 0."""
    sizes = {"profile": prof.name, "steps": prof.pick(smoke=2, book=40, full=150),
             "prompts_per_step": prof.pick(smoke=2, book=16, full=32), "lr": 1e-4,
             "eval_prompts": prof.pick(smoke=8, book=256, full=512)}
    return Study(name="otb-lm", arms=tuple(LM_ARMS), seeds=(0,), run=run_lm_cell, sizes=sizes,
                 modules=("rlcourse.methods.otb",))


def run_otb_experiment(prof: Profile, **run_kw) -> dict:
    """The chapter's claims, measured.

    1. ``variance``: on the tabular policy (exact gradients), the noise-to-signal ratio, total
       variance and cosine to the true gradient of the one-group gradient, for the group mean at
       N = 4, 16, 32 and OTB at N = 4 (with and without the zero-tail rule) and 16.
    2. ``proxy``: on the tiny addition model, true per-token parameter-gradient norms against the
       logit-gradient proxy (Pearson and Spearman correlations).
    3. ``curves``: :func:`lm_study` on the study runner (``run_kw`` go to
       :func:`~rlcourse.studies.runner.run_study`): reward per step, tokens generated, final greedy accuracy.
    """
    from ..lm import load_base_model, sample
    from ..tasks import get_task

    with one_torch_thread():
        env = TabularAR(max_len=5, seed=0)
        n_groups = prof.pick(smoke=400, book=4000, full=20000)
        variance = {}
        for name, base, N, tail in [("mean-4", "mean", 4, True), ("otb-4", "otb", 4, True),
                                    ("otb-4 (no tail rule)", "otb", 4, False), ("mean-16", "mean", 16, True),
                                    ("otb-16", "otb", 16, True), ("mean-32", "mean", 32, True)]:
            v = tabular_gradient_variance(env, N, base, n_groups=n_groups, seed=1, handle_zero_tail=tail)
            variance[name] = {k: v[k] for k in ("total_var", "nsr", "cos")}
        oracle = {N: tabular_oracle_nsr(env, N) for N in (4, 16, 32)}

        base_model, tok = load_base_model("addition", "medium", progress=False)
        gen = torch.Generator().manual_seed(0)
        n_prompts = prof.pick(smoke=2, book=8, full=16)
        prompts = [e.prompt for e in get_task("addition").examples(n_prompts, seed=0, split="test")]
        batch = sample(base_model, tok, prompts, num_generations=2, max_new_tokens=10, generator=gen)
        true, proxy = per_token_param_grad_sq(base_model, batch, range(len(batch)))
        rank = lambda x: np.argsort(np.argsort(x))  # noqa: E731
        proxy_stats = {"true": true, "proxy": proxy, "pearson": float(np.corrcoef(true, proxy)[0, 1]),
                       "spearman": float(np.corrcoef(rank(true), rank(proxy))[0, 1]),
                       "ratio_cv": float(np.std(true / np.maximum(proxy, 1e-12)) /
                                         np.mean(true / np.maximum(proxy, 1e-12)))}

    results = run_study(lm_study(prof), **run_kw)
    curves = {arm: {k: v if k in ("eval", "seconds") else np.asarray(v) for k, v in results.metrics[(arm, 0)].items()}
              for arm in results.study.arms}
    sz = results.study.sizes
    return {"variance": variance, "oracle": oracle, "proxy": proxy_stats, "curves": curves, "results": results,
            "config": {"n_groups": n_groups, "steps": sz["steps"], "prompts_per_step": sz["prompts_per_step"],
                       "tabular_params": env.score.shape[-1], "tabular_responses": len(env.seqs)}}


# ---------------------------------------------------------------------- LongWrongTask: choosing Adam's rate
LR_GRID = (0.03, 0.05, 0.07, 0.1, 0.15, 0.2)  # Adam learning rates the rule below chooses from
SELECTION_SEEDS = 100  # the learning rate is chosen on seeds 100, 101, ...; the reported runs use 0, 1, ...


def choose_longwrong_lr(task: LongWrongTask, steps: int, n_seeds: int, grid=LR_GRID, margin: float = 0.02,
                        first_seed: int = SELECTION_SEEDS) -> dict:
    """The rule that fixes the Adam learning rate before the reported runs, on seeds disjoint from them.

    The smallest rate of ``grid`` at which the positive control can work: the oracle baseline with
    N = 4 ends ``steps`` steps within ``margin`` of the group mean with N = 32, on average over the
    ``n_seeds`` selection seeds ``first_seed, first_seed + 1, ...`` (the largest rate if none does). A larger
    rate saturates every arm near reward 1, where no baseline can be told from another, so the
    smallest qualifying rate is the one that leaves the most room to see a difference.

    ======== ==================== ============================================
    key      shape                meaning
    ======== ==================== ============================================
    lr       float                the chosen rate
    gaps     ``(len(grid),)``     oracle-4 minus mean-32 at ``steps``, per rate
    seeds    list                 the selection seeds
    grid     tuple                the rates tried
    ======== ==================== ============================================
    """
    if n_seeds < 1 or steps < 1:
        raise ValueError(f"need n_seeds >= 1 and steps >= 1, got {n_seeds}, {steps}")
    seeds = list(range(first_seed, first_seed + n_seeds))
    gaps = []
    for lr in grid:
        at = {b: np.mean([run_longwrong(task, b, N, steps, lr, sd)["reward"][steps] for sd in seeds])
              for b, N in (("oracle", 4), ("mean", 32))}
        gaps.append(float(at["oracle"] - at["mean"]))
    ok = [lr for lr, gap in zip(grid, gaps) if abs(gap) <= margin]
    return {"lr": float(ok[0] if ok else grid[-1]), "gaps": np.array(gaps), "seeds": seeds, "grid": tuple(grid)}


# ---------------------------------------------------------------------- LongWrongTask: the grid
ADAM_ARMS = ("mean-32", "mean-4", "otb-4", "oracle-4")
SGD_ARMS = ("mean-32", "mean-4", "otb-4", "oracle-4", "mean-4 rescaled")  # each the study's arm "sgd <name>"
ARMS = ADAM_ARMS + tuple(f"sgd {n}" for n in SGD_ARMS)
_BASELINE = {"mean-32": ("mean", 32), "mean-4": ("mean", 4), "otb-4": ("otb", 4), "oracle-4": ("oracle", 4),
             "mean-4 rescaled": ("mean", 4)}


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """One arm of :data:`ARMS` on one seed: :func:`~rlcourse.methods.otb_longwrong.run_longwrong`'s
    ``reward``, ``tokens`` and ``grad_norm`` as lists.

    An Adam arm (``"otb-4"``) runs at ``sizes["lr"]``, ``8 * steps`` steps at N = 4 (about the tokens of
    N = 32) and ``steps`` at N = 32; an SGD arm (``"sgd otb-4"``) runs ``steps`` steps at
    ``sizes["sgd_lr"]``, and ``"sgd mean-4 rescaled"`` at that rate times (31/32) / (3/4), which equalises
    the group mean's expected step at N = 4 with N = 32's."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {ARMS}")
    sgd = arm.startswith("sgd ")
    name = arm[4:] if sgd else arm
    baseline, N = _BASELINE[name]
    steps = sizes["steps"]
    if sgd:
        lr = sizes["sgd_lr"] * (31 / 32) / (3 / 4) if name == "mean-4 rescaled" else sizes["sgd_lr"]
        out = run_longwrong(LongWrongTask(), baseline, N, steps, lr, seed, optimizer="sgd")
    else:
        out = run_longwrong(LongWrongTask(), baseline, N, steps if N == 32 else 8 * steps, sizes["lr"], seed)
    return {k: v.tolist() for k, v in out.items()}


def longwrong_study(prof: Profile, lr: float | None = None, sgd_lr: float = 3.0) -> Study:
    """Every arm of :data:`ARMS` on ``prof.toy_seeds`` seeds (0, 1, ...); Adam at ``lr`` (default: the rate
    :func:`choose_longwrong_lr` chooses on as many selection seeds), plain SGD at ``sgd_lr``."""
    steps = prof.pick(smoke=5, book=40, full=80)
    if lr is None:
        lr = choose_longwrong_lr(LongWrongTask(), steps, prof.toy_seeds)["lr"]
    return Study(name="otb-longwrong", arms=ARMS, seeds=tuple(range(prof.toy_seeds)), run=run_cell,
                 sizes={"steps": steps, "lr": float(lr), "sgd_lr": float(sgd_lr)}, verdicts=otb_verdicts,
                 modules=("rlcourse.methods.otb_longwrong", "rlcourse.methods.otb"))


def stacked(results: Results, arm: str, key: str) -> np.ndarray:
    """``(seeds, ...)`` array of ``key`` of ``arm``."""
    return np.asarray(results.values(arm, key), dtype=float)


def longwrong_per_seed(results: Results) -> tuple[dict, np.ndarray]:
    """The claims' metrics from a :func:`longwrong_study`'s grid, and the token budget.

    ========= ==================== =================================================================
    name      shape                meaning
    ========= ==================== =================================================================
    at_steps  ``{arm: (seeds,)}``  exact expected reward after ``steps`` steps, each Adam arm
    auc       ``{arm: (seeds,)}``  reward averaged over a common token budget, the N = 4 arms
    budget    ``(seeds,)``         that budget: the fewer tokens of mean-4 and otb-4
    ========= ==================== =================================================================
    """
    steps = results.study.sizes["steps"]
    reward = {n: stacked(results, n, "reward") for n in ADAM_ARMS}
    tokens = {n: stacked(results, n, "tokens") for n in ADAM_ARMS}
    per_seed = {"at_steps": {n: reward[n][:, steps] for n in ADAM_ARMS}, "auc": {}}
    budget = np.minimum(tokens["mean-4"][:, -1], tokens["otb-4"][:, -1])
    grid = np.linspace(0, 1, 201)
    for n in ("mean-4", "otb-4", "oracle-4"):
        per_seed["auc"][n] = np.array([np.interp(grid * budget[i], tokens[n][i], reward[n][i]).mean()
                                       for i in range(len(budget))])
    return per_seed, budget


def run_longwrong_experiment(prof: Profile, sgd_lr: float = 3.0, **run_kw) -> dict:
    """OTB against the group mean on :class:`~rlcourse.methods.otb_longwrong.LongWrongTask`, over
    ``prof.toy_seeds`` seeds (0, 1, ...).

    1. ``nsr``: noise-to-signal ratio and cosine of one step's gradient at the initial policy for the
       group mean (N = 4, 32), OTB (N = 4, with and without the zero-tail rule), the exact
       variance-optimal per-context baseline (``oracle``, N = 4) and no baseline.
    2. ``choice``: :func:`choose_longwrong_lr` on seeds 100, 101, ... (as many as the reported ones).
    3. ``runs``: Adam on the logits at the chosen rate, no gradient clipping: the group mean with
       N = 32 for ``steps`` steps; the group mean, OTB and the oracle with N = 4 for ``8 * steps``
       steps (about the same tokens as N = 32). Per arm ``(seeds, ...)`` arrays of
       :func:`~rlcourse.methods.otb_longwrong.run_longwrong`'s keys.
    4. ``sgd``: the earlier protocol, plain SGD at ``sgd_lr`` for ``steps`` steps (mean-32, mean-4,
       OTB-4, oracle-4), kept to show what a fixed SGD step does to the comparison, and
       ``"mean-4 rescaled"``: the group mean at N = 4 with the rate multiplied by (31/32) / (3/4), which
       equalises its expected step with N = 32's; per arm the ``(seeds,)`` reward after ``steps`` steps.
    5. ``per_seed``: the claims' metrics (:func:`longwrong_per_seed`); ``results``: the grid of
       :func:`longwrong_study` (runs 3 and 4, on the study runner; ``run_kw`` go to
       :func:`~rlcourse.studies.runner.run_study`), whose :func:`otb_verdicts` are the chapter's.
    """
    task = LongWrongTask()
    seeds = prof.toy_seeds
    steps = prof.pick(smoke=5, book=40, full=80)
    t0, c0 = time.perf_counter(), time.process_time()
    n_draws = prof.pick(smoke=50, book=500, full=4000)
    nsr = {f"{b}-{N}": longwrong_nsr(task, N, b, n_draws=n_draws, seed=1)
           for b, N in [("mean", 4), ("otb", 4), ("otb_tail", 4), ("oracle", 4), ("none", 4), ("mean", 32)]}
    choice = choose_longwrong_lr(task, steps, seeds)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    results = run_study(longwrong_study(prof, choice["lr"], sgd_lr), **run_kw)
    runs = {n: {k: stacked(results, n, k) for k in ("reward", "tokens", "grad_norm")} for n in ADAM_ARMS}
    sgd = {n: stacked(results, f"sgd {n}", "reward")[:, steps] for n in SGD_ARMS}
    per_seed, budget = longwrong_per_seed(results)
    return {"nsr": nsr, "runs": runs, "sgd": sgd, "choice": choice, "per_seed": per_seed, "results": results,
            "seconds": wall + results.wall_seconds, "cpu_seconds": cpu + results.cpu_seconds,
            "config": {"steps": steps, "lr": choice["lr"], "sgd_lr": sgd_lr, "seeds": seeds, "n_draws": n_draws,
                       "K": task.K, "L": task.L, "V": task.V, "budget": budget}}


# ---------------------------------------------------------------------- LongWrongTask: the claims
PAPER = "OTB (Li et al., 2026, arXiv:2602.07078)"
_SETTING = ("LongWrongTask: 8 prompts, tabular logits per (prompt, position), up to 16 tokens; right answers short "
            "and confident, wrong ones long and high-entropy; Adam on the logits at a learning rate chosen on seeds "
            "100+ by a rule fixed in advance, no gradient clipping; the logit-gradient proxy is exact here")
_MATCH = ("Our method achieves training stability and matches the performance of large group sizes (N=32) with only "
          "N=4, reducing token consumption by over 65%")
_AT_STEPS = "exact expected reward after the same number of steps (8 prompts per step)"
_AUC = "expected reward averaged over a common token budget (area under reward vs tokens / budget)"


# what the two controls of the headline share: a baseline with N = 4 within 0.02 of the group mean with N = 32
_VS_N32 = dict(paper=PAPER, setting=_SETTING, metric=_AT_STEPS, baseline="group mean, N=32", kind="equivalent",
               margin=0.02, paper_number="-")
CLAIMS = {
    "match": Claim(key="otb/n4-matches-n32", paper=PAPER, source="abstract (arXiv v1)", statement=_MATCH,
                   setting=_SETTING, metric=_AT_STEPS, method="OTB, N=4", baseline="group mean, N=32",
                   kind="equivalent", margin=0.02, control="otb/control-oracle-n4-matches-n32",
                   paper_number="matches N=32 (single-turn and tool-integrated reasoning)"),
    "control": Claim(key="otb/control-oracle-n4-matches-n32", role="positive control", method="oracle baseline, N=4",
                     source="positive control for the abstract's claim (not a claim of the paper)",
                     statement="an unbiased baseline with N=4 can match N=32 on this testbed (the exact "
                               "variance-optimal per-context baseline, an oracle)", **_VS_N32),
    "negative": Claim(key="otb/negative-control-mean-n4-matches-n32", role="negative control", method="group mean, N=4",
                      source="negative control for the abstract's claim (not a claim of the paper)",
                      statement="the plain group mean with N=4 matches N=32 (it must not: otherwise any N=4 baseline "
                                "matches and a 'matches' says nothing about OTB)", **_VS_N32),
    "tokens-control": Claim(key="otb/control-oracle-beats-mean-equal-tokens", role="positive control", paper=PAPER,
                            source="positive control for the token claim (not a claim of the paper)",
                            statement="a better baseline learns faster than the group mean at equal N and equal tokens "
                                      "on this testbed (the oracle)",
                            setting=_SETTING, metric=_AUC, method="oracle baseline, N=4", baseline="group mean, N=4",
                            kind="greater", margin=0.0, paper_number="-"),
    "tokens": Claim(key="otb/equal-tokens", paper=PAPER, source="abstract (arXiv v1)",
                    statement="reducing token consumption by over 65% (at equal tokens, OTB should learn faster "
                              "than the group mean with the same N)",
                    setting=_SETTING, metric=_AUC, method="OTB, N=4", baseline="group mean, N=4", kind="greater",
                    margin=0.0, control="otb/control-oracle-beats-mean-equal-tokens",
                    paper_number="> 65% fewer tokens"),
}


def negative_control_sentence(v) -> str:
    """What the negative control's verdict ``v`` (of ``CLAIMS["negative"]``, an equivalence claim) leaves
    the headline able to say: one sentence, with its difference and interval, for the chapter's prose."""
    m, f = v.claim.margin, v.claim.unit.format
    head = f"The negative control's difference, {f(v.effect)},"
    if v.verdict == "does not hold":
        return (f"{head} lies outside the margin of \u00b1{m:g} by more than its spread allows, so the testbed tells "
                "a plain baseline of 4 samples from one of 32, and a match for OTB would mean something.")
    if v.verdict == "holds":
        return (f"{head} lies within \u00b1{m:g} with its whole {v.interval_name()} {v.interval()}: here a plain "
                "baseline of 4 samples already matches 32, so a match for OTB would say nothing.")
    if v.reason:
        return f"{head} decides nothing: {v.reason}."
    if f(abs(v.effect)) == f(m):
        where = "on"  # to the digits shown
    else:
        where = "inside" if abs(v.effect) < m else "outside"
    return (f"{head} sits {where} the margin of \u00b1{m:g}, and its {v.interval_name()} {v.interval()} reaches "
            "across the margin, so no test at this seed count can call it either way.")


def otb_verdicts(results: Results) -> dict:
    """Evaluate :data:`CLAIMS` on a :func:`longwrong_study`'s grid.

    ``match`` rests on both controls: on the oracle's (``control`` must hold) through ``evaluate``, and on
    the negative control (``negative`` must *not* hold: the plain mean at N = 4 must be shown not to match
    N = 32); when the negative control's verdict is anything but "does not hold", ``match`` is
    "uninformative" too, with the reason.
    """
    ps, _ = longwrong_per_seed(results)
    s = results.wall_seconds
    a, auc = ps["at_steps"], ps["auc"]
    v = {"control": evaluate(CLAIMS["control"], a["oracle-4"], a["mean-32"], seconds=s),
         "negative": evaluate(CLAIMS["negative"], a["mean-4"], a["mean-32"], seconds=s),
         "tokens-control": evaluate(CLAIMS["tokens-control"], auc["oracle-4"], auc["mean-4"], seconds=s)}
    v["match"] = evaluate(CLAIMS["match"], a["otb-4"], a["mean-32"], seconds=s, control=v["control"])
    if v["match"].verdict != "uninformative" and v["negative"].verdict != "does not hold":
        v["match"] = replace(v["match"], verdict="uninformative", reason=(
            f"its negative control {CLAIMS['negative'].key} came out {v['negative'].verdict!r}, not 'does not hold', "
            f"so a plain N=4 baseline was not shown to fall short; the interval alone would say "
            f"{v['match'].verdict!r}"))
    v["tokens"] = evaluate(CLAIMS["tokens"], auc["otb-4"], auc["mean-4"], seconds=s, control=v["tokens-control"])
    return v
