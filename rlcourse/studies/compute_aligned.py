"""Compute-aligned training's experiments: the exact contextual bandit, the tiny LM on addition and its positive
controls (the operators and registered estimators are in :mod:`rlcourse.methods.compute_aligned`).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..claims import Claim, Verdict, evaluate
from ..methods.compute_aligned import (  # noqa: F401
    ABSTRACT_CLAIM, PAPER, grpo_weight, maj_objective, passk_objective,
)
from ..profiles import Profile, one_torch_thread


# ---------------------------------------------------------------------- experiment 1: the exact contextual bandit
@dataclass(frozen=True)
class BanditConfig:
    """A contextual bandit: ``prompts`` prompts, each with ``answers`` answers of which one is correct;
    a tabular softmax policy. The correct answer's starting logit is offset by ``U(low, high)``, so
    difficulty ranges from nearly hopeless to nearly solved; wrong logits are ``N(0, 1)``."""

    prompts: int = 200
    answers: int = 6
    low: float = -3.5
    high: float = 1.5
    k: int = 8
    steps: int = 150
    budget: float = 30.0  # total path length of the logit table (steps of length budget / steps)
    every: int = 10

    @property
    def lr(self) -> float:
        """The length of one normalised step."""
        return self.budget / self.steps


BANDIT_ARMS = ("standard", "grpo", "pass@k", "maj@k")
PASS_KS = (1, 2, 4, 8, 16, 32, 64)
MAJ_KS = (1, 3, 5, 8, 9)


def make_bandit(cfg: BanditConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits (P, K) float64, correct (P,) long)`` of one random bandit."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(cfg.prompts, cfg.answers))
    correct = rng.integers(cfg.answers, size=cfg.prompts)
    logits[np.arange(cfg.prompts), correct] = logits.max(1) + rng.uniform(cfg.low, cfg.high, size=cfg.prompts)
    return torch.tensor(logits), torch.tensor(correct)


def bandit_objective(arm: str, logits: torch.Tensor, correct: torch.Tensor, k: int) -> torch.Tensor:
    """The objective whose gradient each arm follows (mean over prompts): ``standard`` p (REINFORCE's
    expected gradient), ``grpo`` a surrogate whose gradient is ``grad p / sqrt(p(1-p))``, ``pass@k``
    ``1-(1-p)^k``, ``maj@k`` maj@k of the answer distribution."""
    q = torch.softmax(logits, -1)
    p = q.gather(1, correct[:, None]).squeeze(1)
    if arm == "standard":
        return p.mean()
    if arm == "grpo":
        return (p * grpo_weight(p.detach())).mean()
    if arm == "pass@k":
        return passk_objective(p, k).mean()
    if arm == "maj@k":
        return maj_objective(q, correct, k).mean()
    raise ValueError(f"arm must be one of {BANDIT_ARMS}, got {arm!r}")


def bandit_metrics(logits: torch.Tensor, correct: torch.Tensor, pass_ks=PASS_KS, maj_ks=MAJ_KS) -> dict:
    """Exact ``pass`` ``(len(pass_ks),)`` and ``maj`` ``(len(maj_ks),)`` curves (means over prompts) and
    the per-prompt success probabilities ``p``."""
    with torch.no_grad():
        q = torch.softmax(logits, -1)
        p = q.gather(1, correct[:, None]).squeeze(1)
        return {"pass": np.array([float(passk_objective(p, k).mean()) for k in pass_ks]),
                "maj": np.array([float(maj_objective(q, correct, k).mean()) for k in maj_ks]),
                "p": p.numpy().copy()}


def train_bandit(arm: str, cfg: BanditConfig, seed: int) -> dict:
    """Normalised gradient ascent (every arm moves the table by the same length ``cfg.lr`` per step, so
    arms differ in direction only). Returns ``start``/``final`` :func:`bandit_metrics`, the curves of
    pass@1, pass@k and maj@k every ``cfg.every`` steps, and ``steps``."""
    logits, correct = make_bandit(cfg, seed)
    start = bandit_metrics(logits, correct)
    z = logits.clone().requires_grad_(True)
    curve = []
    for t in range(cfg.steps + 1):
        if t % cfg.every == 0:
            with torch.no_grad():
                q = torch.softmax(z, -1)
                p = q.gather(1, correct[:, None]).squeeze(1)
                curve.append((t, float(p.mean()), float(passk_objective(p, cfg.k).mean()),
                              float(maj_objective(q, correct, cfg.k).mean())))
        if t == cfg.steps:
            break
        J = bandit_objective(arm, z, correct, cfg.k)
        (g,) = torch.autograd.grad(J, z)
        with torch.no_grad():
            z += cfg.lr * g / g.norm().clamp_min(1e-30)
    return {"start": start, "final": bandit_metrics(z.detach(), correct), "curve": np.array(curve)}


def run_bandit_experiment(P: Profile, cfg: BanditConfig | None = None, seeds: int | None = None) -> dict:
    """Every arm of :data:`BANDIT_ARMS` on ``P.toy_seeds`` random bandits (paired: seed = bandit).
    Returns ``runs[arm]`` (lists of :func:`train_bandit` outputs), ``cfg``, ``seeds``, ``seconds``."""
    cfg = cfg or BanditConfig(steps=P.pick(smoke=30, book=150))
    n, t0 = seeds or P.toy_seeds, time.perf_counter()
    with one_torch_thread():
        runs = {arm: [train_bandit(arm, cfg, s) for s in range(n)] for arm in BANDIT_ARMS}
    return {"runs": runs, "cfg": cfg, "seeds": n, "seconds": time.perf_counter() - t0}


BUDGETS = (7.5, 15.0, 30.0, 60.0)


def run_budget_sweep(P: Profile, budgets=BUDGETS, seeds: int | None = None) -> dict:
    """:func:`run_bandit_experiment` at each training budget (total path length). Returns
    ``{budget: output}`` and ``seconds``."""
    t0 = time.perf_counter()
    steps = P.pick(smoke=30, book=150)
    out = {b: run_bandit_experiment(P, BanditConfig(steps=steps, budget=b), seeds) for b in budgets}
    return {"by_budget": out, "seconds": time.perf_counter() - t0}


def _bandit_setting(cfg: BanditConfig) -> str:
    return (f"exact contextual bandit: {cfg.prompts} prompts x {cfg.answers} answers, tabular softmax, correct "
            f"logit offset U({cfg.low}, {cfg.high}) from the best wrong one; {cfg.steps} normalised exact-gradient "
            f"steps, total path length {cfg.budget:g}; train-time k = {cfg.k}; exact pass@k and maj@k")


def bandit_claims(cfg: BanditConfig) -> dict[str, Claim]:
    common = dict(paper=PAPER, setting=_bandit_setting(cfg), margin=0.0, paper_number="not given in the abstract")
    k = cfg.k
    return {
        "pass": Claim(key="compute_aligned/bandit-passk", statement=ABSTRACT_CLAIM + f" (here: pass@{k}; a "
                      "mechanism check: the aligned arm ascends the exact pass@k it is scored on, so its win is "
                      "close to guaranteed)", source="abstract", metric=f"exact pass@{k}, mean over prompts",
                      method=f"pass@{k}-aligned", baseline="standard", kind="greater", role="course hypothesis",
                      **common),
        "maj": Claim(key="compute_aligned/bandit-majk", statement=ABSTRACT_CLAIM + f" (here: maj@{k})",
                     source="abstract", metric=f"exact maj@{k}, mean over prompts", method=f"maj@{k}-aligned",
                     baseline="standard", kind="greater", **common),
        "tradeoff": Claim(key="compute_aligned/bandit-pass1-tradeoff",
                          statement="(our expectation, not the abstract's) training for pass@k gives up some "
                                    "pass@1: the standard objective ends higher at k = 1",
                          source="ours; the abstract does not discuss k = 1",
                          metric="exact pass@1, mean over prompts", method="standard", baseline=f"pass@{k}-aligned",
                          kind="greater", **common),
        "control": Claim(key="compute_aligned/bandit-control", role="positive control",
                         statement=f"positive control: pass@{k}-aligned training raises pass@{k} above its start "
                                   "(the budget is large enough to move the metric the claim is about)",
                         source="this chapter", metric=f"exact pass@{k}, mean over prompts",
                         method=f"pass@{k}-aligned (final)", baseline="the same bandit at the start",
                         kind="greater", **common),
    }


def bandit_verdicts(out: dict) -> dict[str, Verdict]:
    cfg, runs, s = out["cfg"], out["runs"], out["seconds"]
    c = bandit_claims(cfg)
    ik, i1, jm = PASS_KS.index(cfg.k), PASS_KS.index(1), MAJ_KS.index(cfg.k)
    get = lambda arm, key, i, when="final": [r[when][key][i] for r in runs[arm]]  # noqa: E731
    return {"pass": evaluate(c["pass"], get("pass@k", "pass", ik), get("standard", "pass", ik), seconds=s),
            "maj": evaluate(c["maj"], get("maj@k", "maj", jm), get("standard", "maj", jm), seconds=s),
            "tradeoff": evaluate(c["tradeoff"], get("standard", "pass", i1), get("pass@k", "pass", i1), seconds=s),
            "control": evaluate(c["control"], get("pass@k", "pass", ik), get("pass@k", "pass", ik, "start"),
                                seconds=s)}


# ---------------------------------------------------------------------- experiment 2: the tiny LM on addition
LM_ARMS = {"standard (RLOO)": dict(advantage_estimator="best_of_n", advantage_kwargs={"subset_size": 1}),
           "pass@k-aligned": dict(advantage_estimator="best_of_n"),
           "maj@k-aligned": dict(advantage_estimator="maj_at_k")}


def lm_sizes(P: Profile) -> dict:
    """The LM experiment's sizes for a profile."""
    return P.pick(smoke=dict(steps=2, prompts_per_step=2, G=4, k=2, eval_prompts=8, n=8, seeds=1,
                             pass_ks=(1, 2, 4, 8), maj_ks=(1, 3, 8)),
                  book=dict(steps=40, prompts_per_step=8, G=8, k=4, eval_prompts=64, n=16, seeds=P.seeds,
                            pass_ks=(1, 2, 4, 8, 16), maj_ks=(1, 3, 5, 9, 16)))


def run_lm_experiment(P: Profile, lr: float = 1e-4, strength: str = "weak", arms=None, seeds: int | None = None,
                      prompts_per_step: int | None = None) -> dict:
    """RLOO (``best_of_n`` with k = 1, the standard objective) against the pass@k- and maj@k-aligned
    estimators (train-time k = ``lm_sizes(P)['k']``) on the lab's medium addition model, AdamW at
    ``lr``, one run per seed; pass@k and maj@k of each final model on held-out prompts
    (:func:`rlcourse.testtime.evaluate_samples`, unbiased curves). Returns ``curves[arm]`` (per seed,
    dicts with ``pass`` and ``maj``), ``base`` (the base model's), ``sizes``, ``seconds``. ``arms`` (names
    of :data:`LM_ARMS`), ``seeds`` and ``prompts_per_step`` override the profile's choice."""
    from ..lm import load_base_model
    from ..tasks import get_task
    from ..testtime import evaluate_samples, maj_at_k_curve, pass_at_k_curve
    from ..train import RLConfig, Trainer

    sz, t0 = lm_sizes(P), time.perf_counter()
    sz.update({k: v for k, v in (("seeds", seeds), ("prompts_per_step", prompts_per_step)) if v is not None})
    arms = list(LM_ARMS) if arms is None else list(arms)
    if not set(arms) <= set(LM_ARMS):
        raise ValueError(f"unknown arms {sorted(set(arms) - set(LM_ARMS))}; choose from {list(LM_ARMS)}")
    task = get_task("addition")
    held = task.examples(sz["eval_prompts"], seed=2000, split="test")
    refs = [int(e.answer) for e in held]

    def curves(model, seed):
        ev = evaluate_samples(model, tok, held, sz["n"], 10, torch.Generator().manual_seed(seed))
        return {"pass": pass_at_k_curve(ev["correct"], sz["pass_ks"]),
                "maj": maj_at_k_curve(ev["answers"], refs, sz["maj_ks"], max_subsets=200, seed=seed)}

    out = {"curves": {}, "reward": {}}
    with one_torch_thread():
        base, tok = load_base_model("addition", strength, prof=P, progress=False)
        out["base"] = curves(base, 0)
        for arm in arms:
            parts, cs, rew = LM_ARMS[arm], [], []
            for seed in range(sz["seeds"]):
                kw = {"subset_size": sz["k"], **parts.get("advantage_kwargs", {})}
                cfg = RLConfig(num_generations=sz["G"], prompts_per_step=sz["prompts_per_step"], steps=sz["steps"],
                               learning_rate=lr, max_completion_length=10, seed=seed, progress=False,
                               advantage_estimator=parts["advantage_estimator"], advantage_kwargs=kw)
                torch.manual_seed(seed)
                trainer = Trainer(copy.deepcopy(base), tok, task, cfg, eval_examples=held[:4])
                trainer.train()
                rew.append([h["reward"] for h in trainer.history])
                cs.append(curves(trainer.model, 1 + seed))
            out["curves"][arm], out["reward"][arm] = cs, np.array(rew)
    out.update(sizes=sz, lr=lr, seconds=time.perf_counter() - t0)
    return out


def _lm_setting(sz: dict, lr: float) -> str:
    return (f"tiny Llama on 2-digit addition (the lab's medium base), {sz['steps']} steps of {sz['prompts_per_step']} "
            f"prompts x {sz['G']} samples, AdamW lr {lr:g}, train-time k = {sz['k']}; {sz['eval_prompts']} held-out "
            f"prompts x {sz['n']} samples at T = 1, unbiased pass@k and maj@k")


def lm_claims(sz: dict, lr: float) -> dict[str, Claim]:
    common = dict(paper=PAPER, setting=_lm_setting(sz, lr), margin=0.0, paper_number="not given in the abstract",
                  source="abstract")
    K, M = max(sz["pass_ks"]), max(sz["maj_ks"])
    return {
        "pass": Claim(key="compute_aligned/lm-passk", statement=ABSTRACT_CLAIM + f" (here: pass@{K})",
                      metric=f"pass@{K} on held-out prompts", method="pass@k-aligned", baseline="standard (RLOO)",
                      kind="greater", **common),
        "maj": Claim(key="compute_aligned/lm-majk", statement=ABSTRACT_CLAIM + f" (here: maj@{M})",
                     metric=f"maj@{M} on held-out prompts", method="maj@k-aligned", baseline="standard (RLOO)",
                     kind="greater", **common),
        "control": Claim(key="compute_aligned/lm-control", role="positive control",
                         statement="control: standard training raises pass@1 above the base model (the run moves "
                                   "the policy)", metric="pass@1 on held-out prompts", method="standard (RLOO)",
                         baseline=None, reference=0.0, kind="greater",
                         **{**common, "source": "this chapter"}),
    }


def lm_verdicts(out: dict, control: Verdict | None = None) -> dict[str, Verdict]:
    """The LM claims; ``control`` (the verdict of :func:`lm_control_verdict`), when given, gates the
    pass@k claim: uninformative unless the control showed the comparison can register a difference."""
    sz, s = out["sizes"], out["seconds"]
    c = lm_claims(sz, out["lr"])
    if control is not None:
        c["pass"] = replace(c["pass"], control=LM_CONTROL_KEY)
    get = lambda arm, key, i: [cv[key][i] for cv in out["curves"][arm]]  # noqa: E731
    moved = replace(c["control"], reference=float(out["base"]["pass"][0]))
    return {"pass": evaluate(c["pass"], get("pass@k-aligned", "pass", -1), get("standard (RLOO)", "pass", -1),
                             seconds=s, control=control),
            "maj": evaluate(c["maj"], get("maj@k-aligned", "maj", -1), get("standard (RLOO)", "maj", -1), seconds=s),
            "control": evaluate(moved, get("standard (RLOO)", "pass", 0), seconds=s)}


# ---------------------------------------------------------------------- an LM control that can show a difference
def select_hard(correct, hi: float = 0.25) -> np.ndarray:
    """Indices of the prompts whose estimated pass rate ``p`` lies in ``(0, hi]``: solvable, but rarely.

    ======= ========== =============================================
    correct ``(P, n)`` 0/1 outcomes of ``n`` samples of each prompt
    return  ``(H,)``   the kept prompts' indices, in order
    ======= ========== =============================================

    On such prompts the pass@k weight ``k (1 - p)^(k - 1)`` is near its largest, ``k``, while the
    standard objective's weight is 1, so an aligned and a standard run should differ most there.
    """
    c = np.asarray(correct, dtype=float)
    if c.ndim != 2 or c.shape[1] < 1:
        raise ValueError(f"correct must be (prompts, samples), got shape {c.shape}")
    if not 0 < hi < 1:
        raise ValueError(f"hi must lie in (0, 1), got {hi}")
    p = c.mean(1)
    return np.flatnonzero((p > 0) & (p <= hi))


def run_lm_control(P: Profile, lr: float = 1e-4, strength: str = "weak", seeds: int | None = None,
                   candidates: int | None = None, hi: float = 0.25) -> dict:
    """The LM positive control for the aligned-vs-standard comparison: train and evaluate on *hard*
    prompts only (:func:`select_hard`, the base model's pass rate in ``(0, hi]`` from 16 samples), with
    train-time k equal to the evaluated k, RLOO against the pass@k-aligned estimator. Returns
    ``pass[arm]`` (per seed, pass@k at the train-time k on the hard held-out prompts), the numbers of
    hard prompts, ``sizes`` and ``seconds``."""
    from ..lm import load_base_model
    from ..tasks import get_task
    from ..testtime import evaluate_samples, pass_at_k_curve
    from ..train import RLConfig, Trainer

    sz, t0 = lm_sizes(P), time.perf_counter()
    n_seeds = sz["seeds"] if seeds is None else seeds
    cand = P.pick(smoke=16, book=256) if candidates is None else candidates
    task = get_task("addition")
    arms = ("standard (RLOO)", "pass@k-aligned")
    out = {"pass": {a: [] for a in arms}}
    with one_torch_thread():
        base, tok = load_base_model("addition", strength, prof=P, progress=False)
        pools = {}
        for split, seed in (("train", 3000), ("test", 2000)):
            ex = task.examples(cand, seed=seed, split=split)
            ev = evaluate_samples(base, tok, ex, 16, 10, torch.Generator().manual_seed(seed))
            keep = select_hard(ev["correct"], hi)
            pools[split] = [ex[int(i)] for i in keep] or ex[:2]  # (smoke: a tiny base may solve none)
        held = pools["test"]
        for arm in arms:
            parts = LM_ARMS[arm]
            for seed in range(n_seeds):
                kw = {"subset_size": sz["k"], **parts.get("advantage_kwargs", {})}
                cfg = RLConfig(num_generations=sz["G"], prompts_per_step=sz["prompts_per_step"], steps=sz["steps"],
                               learning_rate=lr, max_completion_length=10, seed=seed, progress=False,
                               advantage_estimator=parts["advantage_estimator"], advantage_kwargs=kw)
                torch.manual_seed(seed)
                trainer = Trainer(copy.deepcopy(base), tok, task, cfg, train_examples=pools["train"],
                                  eval_examples=held[:4])
                trainer.train()
                ev = evaluate_samples(trainer.model, tok, held, sz["n"], 10, torch.Generator().manual_seed(1 + seed))
                out["pass"][arm].append(float(pass_at_k_curve(ev["correct"], (sz["k"],))[0]))
    out.update(hard={s: len(v) for s, v in pools.items()}, sizes=sz, lr=lr, seconds=time.perf_counter() - t0)
    return out


LM_CONTROL_KEY = "compute_aligned/lm-control-aligned-differs"


def lm_control_claim(sz: dict, lr: float) -> Claim:
    """The positive control of :func:`run_lm_control`: the comparison can register an aligned-vs-standard
    difference where the objectives differ most."""
    return Claim(key="compute_aligned/lm-control-aligned-differs", role="positive control", paper=PAPER, source="this chapter",
                 statement=f"on hard prompts (base pass rate at most 0.25) with train-time k = evaluated k = "
                           f"{sz['k']}, pass@k-aligned training ends with a higher pass@{sz['k']} than RLOO: the LM "
                           "comparison can show a difference where the two objectives' weights differ most",
                 setting=_lm_setting(sz, lr) + "; training and held-out prompts restricted to the hard ones",
                 metric=f"pass@{sz['k']} on hard held-out prompts", method="pass@k-aligned",
                 baseline="standard (RLOO)", kind="greater", margin=0.0)


def lm_control_verdict(out: dict) -> Verdict:
    """:func:`lm_control_claim` evaluated on :func:`run_lm_control`'s output."""
    c = lm_control_claim(out["sizes"], out["lr"])
    return evaluate(c, out["pass"]["pass@k-aligned"], out["pass"]["standard (RLOO)"], seconds=out["seconds"])
