"""Retaining by doing's experiments, in two tiers (the two-Gaussian model's math and the ``self_sft`` estimator are
in :mod:`rlcourse.methods.retaining`):

1. the two-Gaussian model trained by SFT or RL (:func:`simulate`), its forgetting at a matched gain
   (:func:`drop_at_gain`) and the arms compared (:func:`toy_experiment`);
2. a tiny LM that sorts and adds a little (:class:`SortThenAdd`), trained on addition by SFT at two learning
   rates, by GRPO, and by SFT on its own correct samples; :func:`run_lm_experiment` measures addition (gain)
   and sort (forgetting) along the way, and :func:`matched_gain_table` reads the forgetting at GRPO's gain.
"""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, replace

import numpy as np
import torch

from ..methods.retaining import (TwoModeSetting, mode_overlap, new_component, own_correct_samples, project,
                                 rl_gradient, sample_policy, sft_gradient)
from ..claims import Claim, Verdict, evaluate
from ..methods.retaining import PAPER
from ..profiles import Profile
from ..tasks import Addition, Example, Sort, Task
from .runner import Study, run_study


# ---------------------------------------------------------------------- the two-Gaussian model
SINGLE_MODE = TwoModeSetting(family="single", init=(-3.0, 1.0), iters=1000)


def simulate(setting: TwoModeSetting, method: str, lr: float, seed: int = 0) -> dict:
    """Train the policy by ``method`` (``"sft"``: data from the new mode; ``"rl"``: the policy's own
    samples from its new-task component; ``"rl_policy"``: the same reward with samples from the whole
    policy, old mode included) with plain gradient ascent at ``lr`` (times ``setting.speed``).

    ========= ================ ===========================================
    theta     ``(iters+1, d)`` parameters after each iteration (row 0: init)
    old, new  ``(iters+1,)``   :func:`mode_overlap` after each iteration
    ========= ================ ===========================================
    """
    if method not in ("sft", "rl", "rl_policy"):
        raise ValueError(f"method must be 'sft', 'rl' or 'rl_policy', got {method!r}")
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr}")
    rng = np.random.default_rng(seed)
    theta = np.asarray(setting.init, dtype=float)
    thetas, overlaps = [theta], [mode_overlap(theta, setting)]
    for _ in range(setting.iters):
        if method == "sft":
            x = rng.normal(setting.new_mu, setting.new_sigma, setting.n_samples)
            g = sft_gradient(x, theta, setting)
        elif method == "rl":
            mu2, s2 = new_component(theta, setting)
            x = rng.normal(mu2, s2, setting.n_samples)
            g = rl_gradient(x, theta, setting)
        else:
            x = sample_policy(theta, setting, setting.n_samples, rng)
            g = rl_gradient(x, theta, setting, from_policy=True)
        theta = project(theta + lr * setting.speed * g, setting)
        thetas.append(theta)
        overlaps.append(mode_overlap(theta, setting))
    ov = np.asarray(overlaps)
    return {"theta": np.asarray(thetas), "old": ov[:, 0], "new": ov[:, 1]}


def drop_at_gain(run: dict, gain: float) -> tuple[float, bool]:
    """Forgetting (old-mode overlap lost since the start) at the first iteration whose new-mode overlap
    reaches ``gain``, and whether it was reached (if not: the forgetting at the largest new overlap)."""
    new, old = np.asarray(run["new"]), np.asarray(run["old"])
    hit = np.nonzero(new >= gain)[0]
    t = int(hit[0]) if len(hit) else int(np.argmax(new))
    return float(old[0] - old[t]), bool(len(hit))


TOY_ARMS = {"SFT, lr 0.15": ("sft", 0.15), "SFT, lr 0.01": ("sft", 0.01), "RL, lr 0.01": ("rl", 0.01)}
SINGLE_ARMS = {"SFT, lr 0.05": ("sft", 0.05), "RL, lr 0.005": ("rl", 0.005)}


TOY_MODULES = ("rlcourse.methods.retaining",)
LM_MODULES = ("rlcourse.methods.retaining", "rlcourse.train", "rlcourse.supervised", "rlcourse.lm.sampling",
              "rlcourse.lm.zoo")


def run_toy_cell(arm: str, seed: int, sizes: dict) -> dict:
    """:func:`simulate` for arm ``arm`` of ``sizes["arms"]`` (``{name: [method, lr]}``) from ``seed`` in
    the setting ``sizes["setting"]``: ``theta`` ``(iters+1, d)``, ``old`` and ``new`` ``(iters+1,)``."""
    if arm not in sizes["arms"]:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(sizes['arms'])}")
    setting = TwoModeSetting(**{**sizes["setting"], "init": tuple(sizes["setting"]["init"])})
    method, lr = sizes["arms"][arm]
    return {k: v.tolist() for k, v in simulate(setting, method, lr, seed=seed).items()}


def toy_study(seeds: int, setting: TwoModeSetting = TwoModeSetting(), arms: dict = TOY_ARMS) -> Study:
    """Every arm of ``arms`` (name -> (method, lr)) in ``setting`` on seeds ``0 .. seeds - 1``."""
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    sizes = {"setting": asdict(setting), "arms": {a: [m, lr] for a, (m, lr) in arms.items()}}
    return Study(name="retaining-toy", arms=tuple(arms), seeds=tuple(range(seeds)), run=run_toy_cell, sizes=sizes,
                 modules=TOY_MODULES)


def toy_experiment(seeds: int, setting: TwoModeSetting = TwoModeSetting(), arms: dict = TOY_ARMS,
                   gain: float = 0.9, **run_kw) -> dict:
    """Every arm of ``arms`` (name -> (method, lr)) over ``seeds`` seeds: :func:`toy_study` on the study
    runner (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`).

    ============== ==================== ===================================================
    runs[arm]      list of dicts        :func:`simulate`'s output per seed
    drop[arm]      ``(seeds,)``         forgetting at the matched gain (:func:`drop_at_gain`)
    reached[arm]   ``(seeds,)`` bool    whether the arm reached ``gain``
    ============== ==================== ===================================================
    """
    res = run_study(toy_study(seeds, setting, arms), **run_kw)
    runs = {a: [{k: np.asarray(v) for k, v in res.metrics[(a, s)].items()} for s in res.study.seeds] for a in arms}
    drop, reached = {}, {}
    for a, rs in runs.items():
        pairs = [drop_at_gain(r, gain) for r in rs]
        drop[a] = np.array([d for d, _ in pairs])
        reached[a] = np.array([ok for _, ok in pairs])
    return {"runs": runs, "drop": drop, "reached": reached, "gain": gain, "setting": setting}


# ---------------------------------------------------------------------- the LM tier
class SortThenAdd(Task):
    """The base model's pre-training mixture: ``sort`` (4 digits; the prior knowledge) and 2-digit
    ``addition`` (the target task), half of the draws each, each scored by its own verifier. Stopped at
    a mixture accuracy of 0.6, a base model sorts well and adds right about one time in four."""

    name = "retain_sortadd"

    def __init__(self):
        self.sort, self.add = Sort(), Addition()

    def _draw(self, rng: np.random.Generator) -> Example:
        return (self.sort if rng.random() < 0.5 else self.add)._draw(rng)

    def score(self, completion, example):
        return (self.add if "+" in example.prompt else self.sort).score(completion, example)


def sequence_kl(model, ref_model, tokenizer, prompts: list[str], max_new_tokens: int,
                generator: torch.Generator | None = None) -> float:
    """Monte Carlo ``KL(pi || pi_0)`` per response on ``prompts``: the mean over one sample of ``model``
    per prompt of ``sum_t log pi(y_t) - log pi_0(y_t)`` (the sampled sequence's log-ratio)."""
    from ..lm.model import response_logprobs
    from ..lm.sampling import sample

    batch = sample(model, tokenizer, prompts, max_new_tokens=max_new_tokens, generator=generator)
    with torch.no_grad():
        ref = response_logprobs(ref_model, batch.input_ids, batch.attention_mask, batch.response_len)
    m = batch.response_mask
    return float(((batch.logprobs - ref) * m).sum(-1).mean())


def sft_run(model, tokenizer, examples: list[Example], steps: int, batch_size: int, lr: float, seed: int,
            eval_at: list[int], evaluate) -> list[dict]:
    """:func:`rlcourse.supervised.sft` for ``steps`` steps, split at ``eval_at`` with one AdamW carried
    through (so the pieces are one run), calling ``evaluate(model)`` at each step in ``eval_at``
    (0 = before training). Each piece draws its batches with seed ``1000 * seed + k`` (k = the piece).
    Returns those results."""
    from ..supervised import sft

    out = [evaluate(model)] if 0 in eval_at else []
    if steps <= 0 or not examples:
        return out
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    done = 0
    for k, stop in enumerate(sorted({t for t in eval_at if 0 < t <= steps} | {steps})):
        sft(model, tokenizer, examples, stop - done, batch_size, seed=1000 * seed + k, optimizer=opt)
        done = stop
        if stop in eval_at:
            out.append(evaluate(model))
    return out


def external_labels(examples: list[Example]) -> list[Example]:
    """Addition demonstrations in another writer's style: the reversed-digit scratchpad with its digits
    spaced (``47+85=`` -> ``2 3 1|132`` instead of the base model's ``231|132``). The same computation
    and the same graded answer, in a form the base model never writes: off-policy SFT data."""
    out = []
    for e in examples:
        if "|" not in e.solution:
            raise ValueError(f"external_labels needs addition demonstrations ('reversed|sum'), got {e.solution!r}")
        pad, answer = e.solution.rsplit("|", 1)
        out.append(replace(e, solution=" ".join(pad) + "|" + answer))
    return out


def lm_sizes(prof) -> dict:
    """The LM experiment's sizes for a profile."""
    return dict(steps=prof.pick(smoke=2, book=80, full=200), every=prof.pick(smoke=1, book=10, full=20),
                n_eval=prof.pick(smoke=16, book=128, full=512), prompts=prof.pick(smoke=4, book=16, full=32),
                G=prof.pick(smoke=2, book=8, full=8), lr_hi=3e-4, lr_lo=1e-4, rl_lr=prof.rl_lr,
                strength=0.6, max_new=12, seeds=prof.seeds, kl_prompts=prof.pick(smoke=8, book=64, full=256))


LM_ARMS = ("SFT, low lr", "SFT, high lr", "SFT, own style", "Self-SFT, low lr", "Self-SFT, high lr", "GRPO", "RAFT")
DEFAULT_ARMS = LM_ARMS[:6]
SFT_ARMS = LM_ARMS[:3]  # labelled data (the SFT frontier)
SELF_ARMS = LM_ARMS[3:5]  # own correct samples


LM_BASE = "base model"  # the one arm of the base model's study


def lm_testbed(sizes: dict) -> dict:
    """The :class:`SortThenAdd` base model of ``sizes["profile"]``, its tokenizer, the held-out
    addition and sort prompts, ``evaluate(model)`` (greedy accuracy on each), the KL prompts, and
    ``build_seconds`` (the seconds it took to load or build the base model)."""
    from ..lm.zoo import greedy_accuracy, load_base_model

    t0 = time.perf_counter()
    add, srt = Addition(), Sort()
    base, tok = load_base_model(SortThenAdd(), strength=sizes["strength"], prof=Profile(**sizes["profile"]),
                                progress=False)
    built = time.perf_counter() - t0
    held = {"add": add.examples(sizes["n_eval"], seed=0, split="test"),
            "sort": srt.examples(sizes["n_eval"], seed=0, split="test")}

    def evaluate(model):
        return {"add": greedy_accuracy(model, tok, add, held["add"], sizes["max_new"]),
                "sort": greedy_accuracy(model, tok, srt, held["sort"], sizes["max_new"])}

    kl_prompts = [e.prompt for e in add.examples(sizes["kl_prompts"], seed=1, split="test")]
    return {"base": base, "tokenizer": tok, "held": held, "evaluate": evaluate, "kl_prompts": kl_prompts,
            "build_seconds": built}


def run_lm_base_cell(arm: str, seed: int, sizes: dict) -> dict:
    """The base model's greedy ``add`` and ``sort`` accuracies and its ``build_seconds`` (its only arm
    is :data:`LM_BASE`; greedy decoding needs no seed, so ``seed`` only names the cell)."""
    from ..profiles import one_torch_thread

    if arm != LM_BASE:
        raise ValueError(f"unknown arm {arm!r}; the arms are {(LM_BASE,)}")
    with one_torch_thread():
        bed = lm_testbed(sizes)
        return {**bed["evaluate"](bed["base"]), "build_seconds": bed["build_seconds"]}


def run_lm_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train the :class:`SortThenAdd` base model on addition with arm ``arm`` of :data:`LM_ARMS` from
    ``seed`` (see :func:`run_lm_experiment`), evaluating at ``sizes["eval_at"]`` (``E`` steps).

    ========  ========  ====================================================================
    add       ``(E,)``  greedy held-out addition accuracy at each evaluation (0: the base)
    sort      ``(E,)``  the same for sort
    kl        scalar    :func:`sequence_kl` on addition prompts at the end
    accept    scalar    self-SFT arms only: the acceptance rate of the seed's own samples
    ========  ========  ====================================================================
    """
    from ..profiles import one_torch_thread
    from ..train import RLConfig, Trainer

    if arm not in LM_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {LM_ARMS}")
    sz, eval_at, out = sizes, sizes["eval_at"], {}
    add = Addition()
    with one_torch_thread():
        bed = lm_testbed(sz)
        base, tok, evaluate = bed["base"], bed["tokenizer"], bed["evaluate"]
        pool = add.examples(4000, seed=seed, split="train")
        torch.manual_seed(seed)
        model = copy.deepcopy(base)
        if arm in SFT_ARMS + SELF_ARMS:
            data = pool if arm == "SFT, own style" else external_labels(pool)
            if arm in SELF_ARMS:  # the same draw for both learning rates of a seed
                n = min(len(pool), sz["steps"] * sz["prompts"])  # GRPO's prompts: as many samples
                try:
                    data, out["accept"] = own_correct_samples(base, tok, add, pool[:n], sz["G"], sz["max_new"],
                                                              torch.Generator().manual_seed(seed))
                except ValueError:  # a base model that never adds right (smoke): no data
                    data, out["accept"] = [], 0.0
            lr = sz["lr_lo"] if arm.endswith("low lr") else sz["lr_hi"]
            res = sft_run(model, tok, data, sz["steps"] if data else 0, sz["prompts"], lr, seed, eval_at, evaluate)
            res += [res[-1]] * (len(eval_at) - len(res))  # untrained: the base model throughout
        else:
            raft = arm == "RAFT"
            cfg = RLConfig(num_generations=sz["G"], prompts_per_step=sz["prompts"], steps=sz["steps"],
                           max_completion_length=sz["max_new"], seed=seed, progress=False,
                           learning_rate=sz["lr_lo"] if raft else sz["rl_lr"],
                           advantage_estimator="self_sft" if raft else "grpo",
                           policy_loss="pg" if raft else "vanilla",
                           loss_type="seq-mean-token-mean" if raft else "dapo")
            tr = Trainer(model, tok, add, cfg, train_examples=pool, eval_examples=bed["held"]["add"][:4])
            res = [evaluate(base)]
            for s in eval_at[1:]:
                tr.train(steps=s)
                res.append(evaluate(tr.model))
        kl = sequence_kl(model, base, tok, bed["kl_prompts"], sz["max_new"],
                         torch.Generator().manual_seed(10_000 + seed))
    return {"add": [r["add"] for r in res], "sort": [r["sort"] for r in res], "kl": kl, **out}


def lm_study_sizes(prof) -> dict:
    """The sizes every LM cell reads: :func:`lm_sizes` (less the seeds), the profile and the
    evaluation steps ``eval_at`` (every ``every`` steps, and the last)."""
    sz = {k: v for k, v in lm_sizes(prof).items() if k != "seeds"}
    eval_at = list(range(0, sz["steps"] + 1, sz["every"]))
    if eval_at[-1] != sz["steps"]:
        eval_at.append(sz["steps"])
    return {**sz, "eval_at": eval_at, "profile": prof.as_dict()}


def lm_base_study(prof) -> Study:
    """The base model's accuracies: one cell."""
    return Study(name="retaining-lm-base", arms=(LM_BASE,), seeds=(0,), run=run_lm_base_cell,
                 sizes=lm_study_sizes(prof), modules=LM_MODULES)


def lm_study(prof, arms: tuple = DEFAULT_ARMS, seeds: int | None = None) -> Study:
    """Every arm of ``arms`` on seeds ``0 .. seeds - 1`` (default ``prof.seeds``)."""
    unknown = set(arms) - set(LM_ARMS)
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}; choose from {LM_ARMS}")
    return Study(name="retaining-lm", arms=tuple(arms), seeds=tuple(range(prof.seeds if seeds is None else seeds)),
                 run=run_lm_cell, sizes=lm_study_sizes(prof), modules=LM_MODULES)


def run_lm_experiment(prof, arms: tuple = DEFAULT_ARMS, seeds: int | None = None, **run_kw) -> dict:
    """Train the :class:`SortThenAdd` base model on addition alone with each arm, over ``prof.seeds``
    seeds, and evaluate greedy held-out accuracy on addition (target) and sort (prior knowledge):
    :func:`lm_study` and :func:`lm_base_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`).

    Arms (equal budgets: the same steps and prompts per step; SFT and self-SFT also share the
    optimiser and learning rate): ``SFT, high lr`` / ``SFT, low lr`` on demonstrations written in
    another style (:func:`external_labels`: off-policy data); ``GRPO`` (the loop's defaults, G samples per prompt); ``Self-SFT, low lr`` / ``Self-SFT, high lr``: SFT
    on the base model's own correct samples, drawn once before training (approximately on-policy, from
    a policy that lags by the whole run); ``RAFT``: the loop with the ``self_sft`` estimator and the
    ``pg`` loss at the low learning rate (SFT on fresh correct samples each step, fully on-policy;
    not in the default arms); ``SFT, own style``: SFT at the high learning rate on the task's own
    demonstrations, which are written exactly as the base model writes (data close to on-policy in
    form, though not drawn from the model). The self-SFT data come from as many prompts as GRPO sees in its run,
    with G samples each: the same number of sampled responses.

    ============== ============================= ===========================================
    steps          ``(E,)``                      evaluation steps (0 = the base model)
    curves[arm]    dict ``add``, ``sort``        ``(N, E)`` greedy accuracies per seed
    kl[arm]        ``(N,)``                      :func:`sequence_kl` on addition prompts at the end
    base           dict                          the base model's accuracies, build seconds
    accept         ``(N,)``                      self-SFT data's acceptance rate per seed
    ============== ============================= ===========================================
    """
    study = lm_study(prof, arms, seeds)
    base = run_study(lm_base_study(prof), **run_kw)
    res = run_study(study, **run_kw)
    sz = {**lm_sizes(prof), "seeds": len(study.seeds)}
    self_arms = [a for a in study.arms if a in SELF_ARMS]  # each holds its seed's acceptance rate
    return {"steps": np.asarray(study.sizes["eval_at"]),
            "curves": {a: {k: np.asarray(res.values(a, k), dtype=float) for k in ("add", "sort")} for a in study.arms},
            "kl": {a: np.asarray(res.values(a, "kl")) for a in study.arms}, "base": base.metrics[(LM_BASE, 0)],
            "accept": np.asarray(res.values(self_arms[0], "accept") if self_arms else []), "sizes": sz,
            "seconds": base.wall_seconds + res.wall_seconds}


def gain_and_drop(res: dict) -> dict:
    """Per arm and seed: the final gain on addition and the drop on sort, both against the base model.

    ============ ========= ===============================
    gain[arm]    ``(N,)``  final addition - base addition
    drop[arm]    ``(N,)``  base sort - final sort
    ============ ========= ===============================
    """
    b = res["base"]
    return {"gain": {a: c["add"][:, -1] - b["add"] for a, c in res["curves"].items()},
            "drop": {a: b["sort"] - c["sort"][:, -1] for a, c in res["curves"].items()}}


def drop_at_matched_gain(gain: float, curves: list[dict], base: dict) -> tuple[float, bool]:
    """Forgetting of a family of runs (one seed, several learning rates or data) at a given gain: along
    each run's (gain, drop) path, the drop where the gain first reaches ``gain`` (linear interpolation
    between evaluations), the smallest over the runs that reach it, and True. If none reaches it: the
    drop at the largest gain any run had, and False (a lower gain, so not a matched comparison).

    ======= ================================ ===========================================
    curves  list of dicts ``add``, ``sort``  ``(E,)`` accuracies of each run (row 0 = base)
    base    dict ``add``, ``sort``           the base model's accuracies
    ======= ================================ ===========================================
    """
    if not curves:
        raise ValueError("drop_at_matched_gain needs at least one run")
    found, best = [], (-np.inf, np.nan)
    for c in curves:
        g, d = np.asarray(c["add"]) - base["add"], base["sort"] - np.asarray(c["sort"])
        if g.shape != d.shape or g.ndim != 1:
            raise ValueError(f"each run needs add and sort curves of one shape, got {g.shape} and {d.shape}")
        i = int(np.argmax(g))
        if g[i] > best[0]:
            best = (float(g[i]), float(d[i]))
        for i in range(len(g)):
            if g[i] >= gain:
                if i == 0 or g[i - 1] >= gain:
                    found.append(float(d[i]))
                else:
                    w = (gain - g[i - 1]) / (g[i] - g[i - 1])
                    found.append(float(d[i - 1] + w * (d[i] - d[i - 1])))
                break
    return (min(found), True) if found else (best[1], False)


def matched_gain_table(res: dict) -> dict:
    """Per seed, at GRPO's final gain: GRPO's final drop, the SFT runs' drop (:data:`SFT_ARMS`) and the
    self-SFT runs' drop (:data:`SELF_ARMS`) read off their paths (:func:`drop_at_matched_gain`).

    ============ ========= ==============================================
    gain         ``(N,)``  GRPO's final gain on addition
    grpo         ``(N,)``  GRPO's final drop on sort
    sft, self    ``(N,)``  the families' drops at that gain
    sft_ok, ...  ``(N,)``  whether some run of the family reached it
    ============ ========= ==============================================
    """
    gd = gain_and_drop(res)
    out = {"gain": gd["gain"]["GRPO"], "grpo": gd["drop"]["GRPO"]}
    for name, family in (("sft", SFT_ARMS), ("self", SELF_ARMS)):
        vals = [drop_at_matched_gain(float(g), [{k: res["curves"][a][k][n] for k in ("add", "sort")}
                                                for a in family if a in res["curves"]], res["base"])
                for n, g in enumerate(out["gain"])]
        out[name] = np.array([v for v, _ in vals])
        out[name + "_ok"] = np.array([ok for _, ok in vals])
    return out


# ---------------------------------------------------------------------- claims and verdicts
TOY_CLAIM = ("the mode-seeking nature of RL, which stems from its use of on-policy data, enables keeping prior "
             "knowledge intact when learning the target task")


def toy_verdicts(toy: dict) -> dict[str, Verdict]:
    """The toy's claims on a :func:`toy_experiment` of the default arms: RL at 0.01 forgets less than SFT
    at each learning rate, at matched gain (margin 0, fixed before the run). Keys ``lo`` and ``hi``."""
    out = {}
    for key, base_arm in (("lo", "SFT, lr 0.01"), ("hi", "SFT, lr 0.15")):
        c = Claim(key=f"retaining/toy-rl-vs-sft-{key}", paper=PAPER, statement=TOY_CLAIM,
                  source="abstract (the claim); the simulation follows a description of the authors' code",
                  setting="two-Gaussian target and policy, old component 200x slower, 1,000 iterations of 1,000 samples",
                  metric="old-mode overlap lost when the new-mode overlap first reaches 0.9",
                  method="RL, lr 0.01", baseline=base_arm, kind="less", margin=0.0, unit="{:.3f}")
        out[key] = evaluate(c, toy["drop"]["RL, lr 0.01"], toy["drop"][base_arm])
    return out


def lm_verdicts(res: dict) -> dict[str, Verdict]:
    """The language-model claims on a :func:`run_lm_experiment`: the positive control (SFT at the high
    learning rate forgets sort by more than 0.05), and at GRPO's final gain (:func:`matched_gain_table`)
    GRPO, then self-SFT, forgets less than SFT (margin 0). Keys ``control``, ``rl``, ``self``."""
    sz = res["sizes"]
    gd, mt = gain_and_drop(res), matched_gain_table(res)
    common = dict(paper=PAPER, source="abstract", unit="{:.3f}",
                  setting=f"tiny Llama sorting (prior) and adding (target), {sz['steps']} steps x {sz['prompts']} "
                          f"prompts, greedy accuracy on {sz['n_eval']} held-out prompts per task")
    control = Claim(key="retaining/lm-control", statement="(positive control, ours) SFT at a high learning rate "
                    "forgets the old task", metric="drop in sort accuracy after training", method="SFT, high lr",
                    reference=0.0, kind="greater", margin=0.05, role="positive control",
                    **{**common, "source": "this chapter"})
    v_control = evaluate(control, gd["drop"]["SFT, high lr"])
    sft = "SFT (least drop among the SFT runs at that gain)"
    metric = "drop in sort accuracy at GRPO's final addition gain"
    rl = Claim(key="retaining/lm-rl-vs-sft", statement="RL leads to less forgetting than SFT while achieving "
               "comparable or higher target task performance", metric=metric, method="GRPO", baseline=sft,
               kind="less", margin=0.0, control=control.key, **common)
    self_c = Claim(key="retaining/lm-self-sft", statement="the potential of mitigating forgetting using "
                   "approximately on-policy data", metric=metric, method="Self-SFT (least drop of its two learning rates)",
                   baseline=sft, kind="less", margin=0.0, control=control.key, **common)
    return {"control": v_control, "rl": evaluate(rl, mt["grpo"], mt["sft"], control=v_control),
            "self": evaluate(self_c, mt["self"], mt["sft"], control=v_control)}
