"""PIPO's experiments: a contextual bandit with exact expected rewards under noisy rewards (GRPO against
GRPO + PIPO, the learning-rate sweep, the oracle-signal control) and the tiny-LM run under a noisy
verifier, with their claims and verdicts. The method (window, progress signal, the registered ``pipo``
sampler and loss) is :mod:`rlcourse.methods.pipo`.

Each grid is a study on the one runner (cached per cell): the learning-rate sweep (:func:`lr_study`) and
the bandit (:func:`bandit_study`) share one cell, :func:`run_bandit_cell`, whose arm table travels in the
study's sizes; the LM grid (:func:`lm_study`) loads the base model in every cell, and the base model's
accuracy is a one-cell study (:func:`lm_base_study`). The ``run_*`` functions rebuild the chapter's dicts.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..claims import Claim, Verdict, evaluate
from ..methods.pipo import PAPER, PipoController, compute_pipo_loss, layback_coefficients
from ..profiles import Profile, one_torch_thread
from .runner import Results, Study, run_study

MODULES = ("rlcourse.methods.pipo", "rlcourse.advantages", "rlcourse.losses")


# ---------------------------------------------------------------------- the bandit experiment
@dataclass(frozen=True)
class BanditConfig:
    contexts: int = 32
    actions: int = 8
    prompts: int = 4  # contexts per step (small batches)
    samples: int = 8  # G samples per context
    steps: int = 300
    lr: float = 2.0  # SGD on the logits
    flip: float = 0.2  # reward noise: each reward flipped with this probability
    init_scale: float = 1.0  # logits of the initial policy ~ N(0, init_scale^2)
    features: int = 6  # shared parameters: logits = x_c W with x_c in R^features (0: a table of logits)


def make_bandit(cfg: BanditConfig, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(C, K)`` success probability of each arm (1 for the right arm, 0 otherwise), the ``(C, F)``
    context features (the identity when ``features = 0``) and the initial ``(F, K)`` weights. The right
    arm of a context is the best arm of a random linear teacher, so a linear policy can represent it,
    and an update on one context moves the others (as a language model's does)."""
    rng = np.random.default_rng(20_000 + seed)
    F = cfg.features or cfg.contexts
    x = np.eye(cfg.contexts) if not cfg.features else rng.normal(0, 1, (cfg.contexts, F)) / np.sqrt(F)
    good = (x @ rng.normal(0, 1, (F, cfg.actions))).argmax(1)
    p = np.zeros((cfg.contexts, cfg.actions))
    p[np.arange(cfg.contexts), good] = 1.0
    return p, x, rng.normal(0, cfg.init_scale, (F, cfg.actions))


def train_bandit(method: str, cfg: BanditConfig, seed: int, window_mode: str = "strict", signal: str = "batch",
                 fold: bool = True, s_neg: float = 0.1, window: int = 8, lr_scale: float = 1.0) -> dict:
    """GRPO (``method="grpo"``) or GRPO + PIPO (``"pipo"``) on a contextual bandit with a log-linear
    softmax policy (:func:`make_bandit`), through the registered ``grpo`` estimator and ``pipo`` loss (base PPO-clip) and the
    :class:`PipoController` of the sampler.

    ``signal="batch"`` measures ``mu_t`` as the batch's mean observed (noisy) reward, as PIPO does;
    ``"oracle"`` uses the exact expected true reward of the policy (a positive control). ``fold=True``
    takes one SGD step on the sum of both terms (as the registered parts do in the loop); ``False``
    takes the paper's two steps (layback, then the exploration update). ``lr_scale`` multiplies the
    learning rate (a control: does a plain larger step do what the layback does?).

    Returns per-step ``J`` (exact expected true reward of the policy after the step), ``scale`` (the
    gate, 0 when no layback) and ``xi``.
    """
    from ..advantages import get_estimator

    if method not in ("grpo", "pipo"):
        raise ValueError(f"method must be 'grpo' or 'pipo', got {method!r}")
    if signal not in ("batch", "oracle"):
        raise ValueError(f"signal must be 'batch' or 'oracle', got {signal!r}")
    grpo = get_estimator("grpo")
    p, x, init = make_bandit(cfg, seed)
    probs, x = torch.as_tensor(p, dtype=torch.float64), torch.as_tensor(x, dtype=torch.float64)
    weights = torch.tensor(init, dtype=torch.float64, requires_grad=True)
    gen = torch.Generator().manual_seed(seed)
    ctl = PipoController(window=window, s_neg=s_neg, window_mode=window_mode)
    history, cache = [], None
    out = {"J": [], "scale": [], "xi": []}
    n = cfg.prompts * cfg.samples
    exact = lambda: float((torch.softmax(x @ weights.detach(), -1) * probs).sum(-1).mean())  # noqa: E731
    for _ in range(cfg.steps):
        ctx = torch.randint(0, cfg.contexts, (cfg.prompts,), generator=gen).repeat_interleave(cfg.samples)
        with torch.no_grad():
            logp_all = torch.log_softmax(x @ weights, -1)
        a = torch.multinomial(logp_all[ctx].exp(), 1, generator=gen).squeeze(-1)
        r_true = torch.bernoulli(probs[ctx, a], generator=gen)
        flip = torch.rand(n, generator=gen, dtype=torch.float64) < cfg.flip
        r = torch.where(flip, 1 - r_true, r_true)
        index = torch.arange(cfg.prompts).repeat_interleave(cfg.samples)
        ones = torch.ones(n, 1, dtype=torch.float64)
        adv, _ = grpo(token_level_rewards=r[:, None], response_mask=ones, index=index)
        fresh = {"ctx": ctx, "a": a, "old": logp_all[ctx, a][:, None], "adv": adv, "index": index}
        mu = exact() if signal == "oracle" else float(r.mean())
        sig, history = ctl.step(history, mu)
        rows = [fresh]
        coef = torch.zeros(n)
        if method == "pipo" and cache is not None and sig["scale"] > 0:
            coef = sig["scale"] * layback_coefficients(cache["adv"][:, 0], cache["index"], sig["xi"])
            rows.append(cache)
        if method == "pipo":
            cache = fresh
        parts = [(rows[0], torch.zeros(n), False)] + ([(rows[1], coef, True)] if len(rows) > 1 else [])
        steps = [parts] if fold else [[q] for q in reversed(parts)]  # two steps: layback first
        for group in steps:
            loss = _bandit_pipo_loss(x @ weights, group)
            grad, = torch.autograd.grad(loss, weights)
            with torch.no_grad():
                weights -= cfg.lr * lr_scale * grad
        out["J"].append(exact())
        out["scale"].append(sig["scale"] if len(rows) > 1 else 0.0)
        out["xi"].append(sig["xi"])
    return {k: np.asarray(v) for k, v in out.items()}


def _bandit_pipo_loss(logits: torch.Tensor, parts) -> torch.Tensor:
    """The registered ``pipo`` loss on bandit rows (one token per row): ``parts`` is a list of
    ``(rows, coef, cached)``, each a part with its own normalisation."""
    old = torch.cat([q["old"] for q, _, _ in parts])
    logp = torch.log_softmax(logits, -1)[torch.cat([q["ctx"] for q, _, _ in parts]),
                                         torch.cat([q["a"] for q, _, _ in parts])][:, None]
    adv = torch.cat([q["adv"] for q, _, _ in parts])
    cached = torch.cat([torch.full((len(q["a"]), 1), float(c)) for q, _, c in parts]).double()
    counts = torch.cat([torch.full((len(q["a"]), 1), float(len(q["a"]))) for q, _, _ in parts]).double()
    coef = torch.cat([cf[:, None] for _, cf, _ in parts]).double()
    ones = torch.ones_like(old)
    loss, _ = compute_pipo_loss(old, logp, adv, ones, pipo_coef=coef * cached, pipo_phi=1 - cached,
                                pipo_cached=cached, pipo_tokens=counts, pipo_seqs=counts,
                                global_tokens=float(len(old)), global_seqs=float(len(old)))
    return loss


def max_drawdown(curve: np.ndarray, smooth: int = 10) -> float:
    """Largest fall of the trailing moving average (width ``smooth``) below its running maximum."""
    c = np.asarray(curve, float)
    if c.ndim != 1 or c.size == 0:
        raise ValueError("curve must be a non-empty 1-D array")
    ma = np.array([c[max(0, i - smooth + 1):i + 1].mean() for i in range(len(c))])
    return float((np.maximum.accumulate(ma) - ma).max())


SETTINGS = {  # name -> BanditConfig overrides: noisy rewards, and noisy with a too-large learning rate
    "noisy": dict(flip=0.2, lr=2.0),
    "noisy, high lr": dict(flip=0.2, lr=96.0),
}


def lr_arm(lr: float) -> str:
    """The name of the learning-rate sweep's arm at rate ``lr``."""
    return f"lr={lr!r}"


def run_bandit_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train arm ``arm`` of ``sizes["arms"]`` (``[BanditConfig overrides, train_bandit keywords]``) on the
    bandit of ``seed`` for ``sizes["steps"]`` steps (:func:`train_bandit`, one torch thread). With ``T`` steps:

    ============  ========  ==============================================================
    J             ``(T,)``  exact expected true reward of the policy after each step
    layback_frac  scalar    share of steps with a layback term
    agreement     scalar    :func:`verdict_agreement` (``None`` where it is NaN)
    ============  ========  ==============================================================
    """
    if arm not in sizes["arms"]:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(sizes['arms'])}")
    overrides, kwargs = sizes["arms"][arm]
    with one_torch_thread():
        r = train_bandit(cfg=BanditConfig(steps=sizes["steps"], **overrides), seed=seed, **kwargs)
    agree = verdict_agreement(r)
    return {"J": r["J"].tolist(), "layback_frac": float((r["scale"] > 0).mean()),
            "agreement": None if agree != agree else agree}


def bandit_steps(P: Profile) -> int:
    """Steps of every bandit run in profile ``P``."""
    return P.pick(smoke=40, book=300)


def lr_study(P: Profile, lrs=(2.0, 8.0, 32.0, 96.0), seeds: int | None = None) -> Study:
    """GRPO alone at each rate of ``lrs`` (noisy rewards, arms :func:`lr_arm`) on ``seeds`` (default
    ``P.toy_seeds``) seeds."""
    arms = {lr_arm(lr): [dict(flip=0.2, lr=lr), dict(method="grpo")] for lr in lrs}
    return Study(name="pipo-lr", arms=tuple(arms), seeds=tuple(range(seeds or P.toy_seeds)), run=run_bandit_cell,
                 sizes={"steps": bandit_steps(P), "arms": arms}, modules=MODULES)


def run_lr_sweep(P: Profile, lrs=(2.0, 8.0, 32.0, 96.0), seeds: int | None = None, **run_kw) -> dict:
    """GRPO alone at several learning rates (noisy rewards): ``final[lr]`` and ``drawdown[lr]``
    ``(seeds,)``, to show where a larger step stops helping and starts hurting (:func:`lr_study` on
    the study runner; ``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`)."""
    results = run_study(lr_study(P, lrs, seeds), **run_kw)
    tail = max(1, results.study.sizes["steps"] // 10)
    curves = {lr: [np.asarray(j) for j in results.values(lr_arm(lr), "J")] for lr in lrs}
    return {"lrs": tuple(lrs), "final": {lr: np.array([j[-tail:].mean() for j in c]) for lr, c in curves.items()},
            "drawdown": {lr: np.array([max_drawdown(j) for j in c]) for lr, c in curves.items()}}


ARMS = {  # name -> train_bandit keywords
    "GRPO": dict(method="grpo"),
    "GRPO+PIPO": dict(method="pipo"),
    "GRPO+PIPO (released window)": dict(method="pipo", window_mode="released"),
    "GRPO+PIPO (oracle signal)": dict(method="pipo", signal="oracle"),
    "GRPO, 2x lr": dict(method="grpo", lr_scale=2.0),
}


def bandit_arm(setting: str, arm: str) -> str:
    """The name of the bandit study's arm ``arm`` of :data:`ARMS` in setting ``setting`` of :data:`SETTINGS`."""
    return f"{setting} | {arm}"


def bandit_study(P: Profile, settings=None, arms=None, seeds: int | None = None) -> Study:
    """Every arm of ``arms`` (default :data:`ARMS`) in every setting of ``settings`` (default
    :data:`SETTINGS`), named :func:`bandit_arm`, on ``seeds`` (default ``P.toy_seeds``) seeds."""
    settings, arms = settings or list(SETTINGS), arms or list(ARMS)
    table = {bandit_arm(s, a): [SETTINGS[s], ARMS[a]] for s in settings for a in arms}
    return Study(name="pipo-bandit", arms=tuple(table), seeds=tuple(range(seeds or P.toy_seeds)),
                 run=run_bandit_cell, sizes={"steps": bandit_steps(P), "settings": settings, "names": arms,
                                             "arms": table}, verdicts=bandit_study_verdicts,
                 modules=MODULES)


def bandit_output(results: Results) -> dict:
    """:func:`run_bandit_experiment`'s dict from a :func:`bandit_study`'s results."""
    sz = results.study.sizes
    steps, settings, arms = sz["steps"], sz["settings"], sz["names"]
    curves, final, drawdown, frac, agree = {}, {}, {}, {}, {}
    for s in settings:
        for a in arms:
            name = bandit_arm(s, a)
            curves[(s, a)] = np.stack([np.asarray(j) for j in results.values(name, "J")])
            final[(s, a)] = curves[(s, a)][:, -max(1, steps // 10):].mean(1)
            drawdown[(s, a)] = np.array([max_drawdown(c) for c in curves[(s, a)]])
            frac[(s, a)] = np.array(results.values(name, "layback_frac"))
            agree[(s, a)] = np.array([np.nan if x is None else x for x in results.values(name, "agreement")])
    return {"settings": settings, "arms": arms, "seeds": len(results.study.seeds), "steps": steps, "curves": curves,
            "final": final, "drawdown": drawdown, "layback_frac": frac, "agreement": agree,
            "seconds": results.wall_seconds}


def run_bandit_experiment(P: Profile, settings=None, arms=None, seeds: int | None = None, **run_kw) -> dict:
    """Every arm in every setting over ``P.toy_seeds`` seeds (paired: a seed fixes the bandit and the
    initial policy): :func:`bandit_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`). ``final[(setting, arm)]`` ``(seeds,)``: mean exact
    reward over the last tenth of training; ``drawdown``: max drawdown of its 10-step moving average;
    ``curves``: ``(seeds, steps)``; ``layback_frac``: share of steps with a layback term;
    ``agreement``: :func:`verdict_agreement`."""
    return bandit_output(run_study(bandit_study(P, settings, arms, seeds), **run_kw))


def bandit_study_verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`bandit_verdicts` on a :func:`bandit_study`'s results."""
    return bandit_verdicts(bandit_output(results))


def verdict_agreement(run: dict, warmup: int = 8) -> float:
    """Share of steps (after the warm-up) whose verdict ``sign(xi_t)`` has the sign of the true
    improvement made by the previous update, ``J(pi_t) - J(pi_{t-1})`` (exact expected rewards)."""
    J, xi = np.asarray(run["J"]), np.asarray(run["xi"])
    # at step t (0-based) the policy sampled is the one after step t-1: its improvement is J[t-1] - J[t-2]
    t = np.arange(max(2, warmup), len(J))
    true = J[t - 1] - J[t - 2]
    keep = true != 0
    return float(np.mean(np.sign(xi[t][keep]) == np.sign(true[keep]))) if keep.any() else float("nan")


SETTING = ("log-linear softmax policy (6 shared features) on a 32-context, 8-arm bandit (one right arm per "
           "context), 4 contexts x 8 samples per step, 300 steps, rewards flipped with probability 0.2, SGD "
           "(lr 2, or 96 for the high-lr setting); PIPO with K = 8, s_neg = 0.1 (the authors' math config), one "
           "step on the sum of both terms")


def bandit_claims() -> dict[str, Claim]:
    common = dict(paper=PAPER, source="abstract and the authors' project page (stability under noise-driven "
                  "regressions)", setting=SETTING, paper_number="math benchmarks (not reproduced)")
    out = {}
    for s in ("noisy", "noisy, high lr"):
        tag = s.replace(", ", "-").replace(" ", "-")
        # the high rate (96) was chosen on the reported seeds after 32 gave inconclusive verdicts: a setting
        # picked after looking tests a course hypothesis, not the paper's claim
        role, note = (("course hypothesis", "; the rate was chosen after looking at these seeds")
                      if s == "noisy, high lr" else ("paper claim", ""))
        out[f"{tag}/final"] = Claim(key=f"pipo/bandit-{tag}-final", statement="PIPO ends higher than its base "
                                    f"algorithm [{s} setting{note}]", metric=f"exact expected reward over the last "
                                    f"tenth of training, {s}", method="GRPO+PIPO", baseline="GRPO",
                                    kind="greater", role=role, **common)
        out[f"{tag}/drawdown"] = Claim(key=f"pipo/bandit-{tag}-drawdown", statement="PIPO suppresses or reverses updates "
                                       f"that follow drops: smaller drawdowns [{s} setting{note}]",
                                       metric=f"max drawdown of the 10-step moving average of the expected reward, {s}",
                                       method="GRPO+PIPO", baseline="GRPO", kind="less", role=role, **common)
    out["noisy/final-equal-step"] = Claim(key="pipo/bandit-noisy-final-equal-step", statement="PIPO ends higher "
                                          "than its base algorithm, at an equal step [noisy setting: against GRPO "
                                          "with twice the learning rate, since a layback step re-applies about a "
                                          "step's worth of signal]", metric="exact expected reward over the last "
                                          "tenth of training, noisy", method="GRPO+PIPO", baseline="GRPO, 2x lr",
                                          kind="greater", **common)
    out["control/final"] = Claim(key="pipo/oracle-control-final", role="positive control", statement="positive control: with an exact "
                                 "improvement signal the layback raises the final reward [noisy setting]",
                                 metric="exact expected reward over the last tenth of training, noisy",
                                 method="GRPO+PIPO (oracle signal)", baseline="GRPO", kind="greater", **common)
    out["control/drawdown"] = Claim(key="pipo/oracle-control-drawdown", role="positive control", statement="positive control: with an "
                                    "exact improvement signal the layback lowers the drawdowns [noisy, high lr]",
                                    metric="max drawdown of the 10-step moving average, noisy, high lr",
                                    method="GRPO+PIPO (oracle signal)", baseline="GRPO", kind="less", **common)
    return out


def bandit_verdicts(out: dict) -> dict[str, Verdict]:
    c, f, d, s = bandit_claims(), out["final"], out["drawdown"], out["seconds"]
    v = {}
    for key, claim in c.items():
        tag, what = key.split("/")
        setting = {"noisy": "noisy", "control": "noisy" if what.startswith("final") else "noisy, high lr"}.get(
            tag, "noisy, high lr")
        m = f if what.startswith("final") else d
        v[key] = evaluate(claim, m[(setting, claim.method)], m[(setting, claim.baseline)], seconds=s)
    return v


# ---------------------------------------------------------------------- the tiny language model
LM_ARMS = {"GRPO": dict(), "GRPO+PIPO": dict(sampler="pipo", policy_loss="pipo"),
           "GRPO+PIPO (oracle verdict)": dict(sampler="pipo", policy_loss="pipo",
                                              sampler_kwargs={"verdict_reward": "task"})}
BASE = "base model"  # the one cell of :func:`lm_base_study`: the base model's held-out accuracy


def lm_sizes(P: Profile, steps: int | None = None, lr: float = 1e-4) -> dict:
    """Every setting an LM cell reads, for profile ``P`` (``steps`` overrides the profile's)."""
    return {"profile": P.as_dict(), "steps": steps or P.pick(smoke=3, book=30), "lr": lr,
            "eval_prompts": P.pick(smoke=16, book=128), "num_generations": P.pick(smoke=4, book=8),
            "prompts_per_step": P.pick(smoke=2, book=8)}


def _lm_base(sizes: dict):
    """The addition 'medium' base model, its tokenizer and the held-out prompts."""
    from ..lm import load_base_model
    from ..tasks import get_task

    model, tok = load_base_model("addition", "medium", prof=Profile(**sizes["profile"]), progress=False)
    return model, tok, get_task("addition").examples(sizes["eval_prompts"], seed=1234, split="test")


def run_lm_base_cell(arm: str, seed: int, sizes: dict) -> dict:
    """The base model's greedy held-out accuracy (``base_acc``); ``arm`` must be :data:`BASE`."""
    from ..lm.zoo import greedy_accuracy

    if arm != BASE:
        raise ValueError(f"unknown arm {arm!r}; the arms are {(BASE,)}")
    with one_torch_thread():
        model, tok, ex = _lm_base(sizes)
        return {"base_acc": greedy_accuracy(model, tok, "addition", ex, max_new_tokens=10)}


def run_lm_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train the base model with arm ``arm`` of :data:`LM_ARMS` from ``seed`` under the noisy verifier
    (each reward flipped with probability 0.2). With ``T`` steps:

    ============  ========  ==============================================================
    true_reward   ``(T,)``  true mean reward of the fresh samples
    fresh_reward  ``(T,)``  their observed (noisy) mean reward
    acc           scalar    held-out greedy accuracy at the end
    layback_frac  scalar    mean over steps of ``pipo_layback`` (0 without PIPO)
    ============  ========  ==============================================================
    """
    from ..methods.noisy import make_noisy_reward
    from ..train import RLConfig, Trainer

    if arm not in LM_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(LM_ARMS)}")
    with one_torch_thread():
        model, tok, ex = _lm_base(sizes)
        cfg = RLConfig(num_generations=sizes["num_generations"], prompts_per_step=sizes["prompts_per_step"],
                       steps=sizes["steps"], learning_rate=sizes["lr"], max_completion_length=10, seed=seed,
                       reward=make_noisy_reward(0.2, 0.2, "sample", seed=seed), progress=False,
                       **copy.deepcopy(LM_ARMS[arm]))
        trainer = Trainer(model, tok, "addition", cfg, eval_examples=ex)
        trainer.train()
        return {"true_reward": trainer.state["noisy_verifier"]["true_reward"],
                "fresh_reward": [m.get("pipo_fresh_reward", m["reward"]) for m in trainer.history],
                "acc": trainer.evaluate(),
                "layback_frac": float(np.mean([m.get("pipo_layback", 0.0) for m in trainer.history]))}


LM_MODULES = (*MODULES, "rlcourse.methods.noisy", "rlcourse.train")


def lm_base_study(P: Profile, steps: int | None = None, lr: float = 1e-4) -> Study:
    """The one-cell study of the base model's accuracy (:func:`run_lm_base_cell`), shared by every cell."""
    return Study(name="pipo-lm-base", arms=(BASE,), seeds=(0,), run=run_lm_base_cell, sizes=lm_sizes(P, steps, lr),
                 modules=LM_MODULES)


def lm_study(P: Profile, seeds: int | None = None, steps: int | None = None, lr: float = 1e-4) -> Study:
    """Every arm of :data:`LM_ARMS` on ``seeds`` (default ``P.seeds``) paired seeds."""
    return Study(name="pipo-lm", arms=tuple(LM_ARMS), seeds=tuple(range(seeds or P.seeds)), run=run_lm_cell,
                 sizes=lm_sizes(P, steps, lr), modules=LM_MODULES)


def run_lm_experiment(P: Profile, seeds: int | None = None, steps: int | None = None, lr: float = 1e-4,
                      **run_kw) -> dict:
    """GRPO against GRPO + PIPO (the registered ``pipo`` sampler and loss) on the tiny addition model
    with a noisy verifier (each reward flipped with probability 0.2), ``P.seeds`` paired seeds:
    :func:`lm_study` and :func:`lm_base_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`).

    Returns ``true_reward[arm]`` ``(seeds, steps)`` (true mean reward of the fresh samples),
    ``fresh_reward[arm]`` ``(seeds, steps)`` (their observed, noisy mean reward: the loop's ``reward``
    metric for GRPO, ``pipo_fresh_reward`` for PIPO, whose ``reward`` also averages the cached rows),
    ``acc[arm]`` ``(seeds,)`` held-out greedy accuracy at the end, ``base_acc``, ``layback_frac[arm]``,
    ``seconds``."""
    base = run_study(lm_base_study(P, steps, lr), **run_kw)
    results = run_study(lm_study(P, seeds, steps, lr), **run_kw)
    out = {key: {arm: np.array(results.values(arm, key)) for arm in LM_ARMS}
           for key in ("true_reward", "fresh_reward", "acc", "layback_frac")}
    out.update(base_acc=base.metrics[(BASE, 0)]["base_acc"], seeds=len(results.study.seeds),
               steps=results.study.sizes["steps"], seconds=base.wall_seconds + results.wall_seconds)
    return out


LM_LEARNS = Claim(key="pipo/lm-grpo-learns", paper=PAPER, source="ours (a positive control: the base algorithm "
                  "learns at all in this run)", statement="positive control: GRPO ends above the base model under the "
                  "noisy verifier", paper_number="", role="positive control",
                  setting="tiny Llama (book profile) pre-trained on two-digit addition to about 50%; GRPO, 8 prompts x 8 "
                  "samples, lr 1e-4, rewards flipped with probability 0.2",
                  metric="held-out greedy accuracy at the end of training minus the base model's", method="GRPO",
                  baseline=None, reference=0.0, kind="greater")
LM_CLAIM = Claim(key="pipo/lm-final", paper=PAPER, source="abstract", statement="PIPO ends higher than its base "
                 "algorithm (GRPO) under a noisy verifier", paper_number="math benchmarks (not reproduced)",
                 setting="tiny Llama (book profile) pre-trained on two-digit addition to about 50%; GRPO, 8 prompts x 8 "
                 "samples, lr 1e-4, rewards flipped with probability 0.2; PIPO K = 8, s_neg = 0.1",
                 metric="held-out greedy accuracy at the end of training", method="GRPO+PIPO", baseline="GRPO",
                 kind="greater", control=LM_LEARNS.key)


LM_CONTROL = replace(LM_CLAIM, key="pipo/lm-oracle-control", role="positive control", statement="positive control: PIPO whose verdict "
                     "mu_t is computed with the clean verifier ends higher than GRPO", method="GRPO+PIPO (oracle verdict)",
                     control=None)


def lm_verdicts(out: dict) -> dict[str, Verdict]:
    """The tiny-LM claim, resting on the control that GRPO learns at all (its held-out accuracy above the
    base model's: a claim about PIPO's gains is uninformative in a run where training makes the base
    algorithm worse), and the positive control of the oracle verdict."""
    g, s = out["acc"]["GRPO"], out["seconds"]
    learns = evaluate(LM_LEARNS, np.asarray(g) - out["base_acc"], seconds=s)
    return {"learns": learns,
            "final": evaluate(LM_CLAIM, out["acc"]["GRPO+PIPO"], g, seconds=s, control=learns),
            "control": evaluate(LM_CONTROL, out["acc"]["GRPO+PIPO (oracle verdict)"], g, seconds=s)}
