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
from dataclasses import replace

import numpy as np
import torch

from ..methods.retaining import (TwoModeSetting, mode_overlap, new_component, own_correct_samples, project,
                                 rl_gradient, sample_policy, sft_gradient)
from ..tasks import Addition, Example, Sort, Task


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


def toy_experiment(seeds: int, setting: TwoModeSetting = TwoModeSetting(), arms: dict = TOY_ARMS,
                   gain: float = 0.9) -> dict:
    """Every arm of ``arms`` (name -> (method, lr)) over ``seeds`` seeds.

    ============== ==================== ===================================================
    runs[arm]      list of dicts        :func:`simulate`'s output per seed
    drop[arm]      ``(seeds,)``         forgetting at the matched gain (:func:`drop_at_gain`)
    reached[arm]   ``(seeds,)`` bool    whether the arm reached ``gain``
    ============== ==================== ===================================================
    """
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    runs = {a: [simulate(setting, m, lr, seed=s) for s in range(seeds)] for a, (m, lr) in arms.items()}
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


def run_lm_experiment(prof, arms: tuple = DEFAULT_ARMS, seeds: int | None = None) -> dict:
    """Train the :class:`SortThenAdd` base model on addition alone with each arm, over ``prof.seeds``
    seeds, and evaluate greedy held-out accuracy on addition (target) and sort (prior knowledge).

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
    from ..lm.zoo import greedy_accuracy, load_base_model
    from ..profiles import one_torch_thread
    from ..train import RLConfig, Trainer

    unknown = set(arms) - set(LM_ARMS)
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}; choose from {LM_ARMS}")
    sz = lm_sizes(prof)
    if seeds is not None:
        sz["seeds"] = seeds
    t0 = time.perf_counter()
    eval_at = list(range(0, sz["steps"] + 1, sz["every"]))
    if eval_at[-1] != sz["steps"]:
        eval_at.append(sz["steps"])
    add, srt = Addition(), Sort()
    with one_torch_thread():
        base, tok = load_base_model(SortThenAdd(), strength=sz["strength"], prof=prof, progress=False)
        built = time.perf_counter() - t0
        held = {"add": add.examples(sz["n_eval"], seed=0, split="test"),
                "sort": srt.examples(sz["n_eval"], seed=0, split="test")}

        def evaluate(model):
            return {"add": greedy_accuracy(model, tok, add, held["add"], sz["max_new"]),
                    "sort": greedy_accuracy(model, tok, srt, held["sort"], sz["max_new"])}

        base_acc = evaluate(base)
        curves = {a: {"add": [], "sort": []} for a in arms}
        kl = {a: [] for a in arms}
        accept = []
        kl_prompts = [e.prompt for e in add.examples(sz["kl_prompts"], seed=1, split="test")]
        for seed in range(sz["seeds"]):
            pool = add.examples(4000, seed=seed, split="train")
            own = None
            for arm in arms:
                torch.manual_seed(seed)
                model = copy.deepcopy(base)
                if arm in SFT_ARMS + SELF_ARMS:
                    data = pool if arm == "SFT, own style" else external_labels(pool)
                    if arm in SELF_ARMS:
                        if own is None:  # drawn once per seed, shared by both learning rates
                            n = min(len(pool), sz["steps"] * sz["prompts"])  # GRPO's prompts: as many samples
                            try:
                                own, acc = own_correct_samples(base, tok, add, pool[:n], sz["G"], sz["max_new"],
                                                               torch.Generator().manual_seed(seed))
                            except ValueError:  # a base model that never adds right (smoke): no data
                                own, acc = [], 0.0
                            accept.append(acc)
                        data = own
                    lr = sz["lr_lo"] if arm.endswith("low lr") else sz["lr_hi"]
                    res = sft_run(model, tok, data, sz["steps"] if data else 0, sz["prompts"], lr, seed,
                                  eval_at, evaluate)
                    res += [res[-1]] * (len(eval_at) - len(res))  # untrained: the base model throughout
                else:
                    raft = arm == "RAFT"
                    cfg = RLConfig(num_generations=sz["G"], prompts_per_step=sz["prompts"], steps=sz["steps"],
                                   max_completion_length=sz["max_new"], seed=seed, progress=False,
                                   learning_rate=sz["lr_lo"] if raft else sz["rl_lr"],
                                   advantage_estimator="self_sft" if raft else "grpo",
                                   policy_loss="pg" if raft else "vanilla",
                                   loss_type="seq-mean-token-mean" if raft else "dapo")
                    tr = Trainer(model, tok, add, cfg, train_examples=pool, eval_examples=held["add"][:4])
                    res = [base_acc]
                    for s in eval_at[1:]:
                        tr.train(steps=s)
                        res.append(evaluate(tr.model))
                for key in ("add", "sort"):
                    curves[arm][key].append([r[key] for r in res])
                kl[arm].append(sequence_kl(model, base, tok, kl_prompts, sz["max_new"],
                                           torch.Generator().manual_seed(10_000 + seed)))
    return {"steps": np.asarray(eval_at),
            "curves": {a: {k: np.asarray(v, dtype=float) for k, v in c.items()} for a, c in curves.items()},
            "kl": {a: np.asarray(v) for a, v in kl.items()}, "base": {**base_acc, "build_seconds": built},
            "accept": np.asarray(accept), "sizes": sz, "seconds": time.perf_counter() - t0}


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
