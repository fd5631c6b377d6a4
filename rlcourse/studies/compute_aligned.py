"""Compute-aligned training's experiments: the exact contextual bandit and its budget sweep, as studies on the
one runner (:func:`bandit_study`, one cell per arm and bandit); the tiny LM on addition and its positive
controls are in :mod:`rlcourse.studies.compute_aligned_lm` (their names stay importable here), the operators
and registered estimators in :mod:`rlcourse.methods.compute_aligned`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..claims import Claim, Verdict, evaluate
from ..methods.compute_aligned import (  # noqa: F401
    ABSTRACT_CLAIM, PAPER, grpo_weight, maj_objective, passk_objective,
)
from ..profiles import Profile, one_torch_thread
from .compute_aligned_lm import (  # noqa: F401
    LM_ARMS, LM_CONTROL_KEY, _lm_setting, lm_claims, lm_control_claim, lm_control_verdict, lm_sizes, lm_verdicts,
    run_lm_control, run_lm_experiment, select_hard,
)
from .runner import Results, Study, run_study


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


MODULES = ("rlcourse.methods.compute_aligned", "rlcourse.methods.poly_epo")
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


def run_bandit_cell(arm: str, seed: int, sizes: dict) -> dict:
    """:func:`train_bandit` of arm ``arm`` on bandit ``seed``, with the :class:`BanditConfig` of
    ``sizes["cfg"]``, as JSON-ready lists (``C = cfg.steps // cfg.every + 1`` curve points).

    =====================  ============  =====================================================
    start, final: pass     ``(7,)``      exact pass@k at each of :data:`PASS_KS`
    start, final: maj      ``(5,)``      exact maj@k at each of :data:`MAJ_KS`
    start, final: p        ``(P,)``      each prompt's success probability
    curve                  ``(C, 4)``    step, pass@1, pass@k and maj@k every ``every`` steps
    =====================  ============  =====================================================
    """
    if arm not in BANDIT_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {BANDIT_ARMS}")
    with one_torch_thread():
        out = train_bandit(arm, BanditConfig(**sizes["cfg"]), seed)
    return {"start": {k: v.tolist() for k, v in out["start"].items()},
            "final": {k: v.tolist() for k, v in out["final"].items()}, "curve": out["curve"].tolist()}


def bandit_study(P: Profile, cfg: BanditConfig | None = None, seeds: int | None = None) -> Study:
    """Every arm of :data:`BANDIT_ARMS` on ``seeds`` (default ``P.toy_seeds``) random bandits (paired:
    seed = bandit), with ``cfg`` (default: the profile's number of steps)."""
    cfg = cfg or BanditConfig(steps=P.pick(smoke=30, book=150))
    return Study(name="compute_aligned-bandit", arms=BANDIT_ARMS, seeds=tuple(range(seeds or P.toy_seeds)),
                 run=run_bandit_cell, sizes={"cfg": asdict(cfg)}, modules=MODULES)


def bandit_output(results: Results) -> dict:
    """The chapter's dict from a :func:`bandit_study`'s results: ``runs[arm]`` (per seed, a
    :func:`train_bandit` output), ``cfg``, ``seeds`` and ``seconds`` (the cells' wall seconds)."""
    study = results.study

    def arrays(m: dict) -> dict:
        return {"start": {k: np.array(v) for k, v in m["start"].items()},
                "final": {k: np.array(v) for k, v in m["final"].items()}, "curve": np.array(m["curve"])}

    runs = {arm: [arrays(results.metrics[(arm, s)]) for s in study.seeds] for arm in study.arms}
    return {"runs": runs, "cfg": BanditConfig(**study.sizes["cfg"]), "seeds": len(study.seeds),
            "seconds": results.wall_seconds}


def run_bandit_experiment(P: Profile, cfg: BanditConfig | None = None, seeds: int | None = None, **run_kw) -> dict:
    """Every arm of :data:`BANDIT_ARMS` on ``P.toy_seeds`` random bandits (paired: seed = bandit):
    :func:`bandit_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`). Returns ``runs[arm]`` (lists of :func:`train_bandit`
    outputs), ``cfg``, ``seeds``, ``seconds``."""
    return bandit_output(run_study(bandit_study(P, cfg, seeds), **run_kw))


BUDGETS = (7.5, 15.0, 30.0, 60.0)


def run_budget_sweep(P: Profile, budgets=BUDGETS, seeds: int | None = None, **run_kw) -> dict:
    """:func:`run_bandit_experiment` at each training budget (total path length). Returns
    ``{budget: output}`` and ``seconds``."""
    steps = P.pick(smoke=30, book=150)
    out = {b: run_bandit_experiment(P, BanditConfig(steps=steps, budget=b), seeds, **run_kw) for b in budgets}
    return {"by_budget": out, "seconds": sum(o["seconds"] for o in out.values())}


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


