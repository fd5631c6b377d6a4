"""Compute-aligned training's language-model experiments as studies on the one runner: RLOO against the
pass@k- and maj@k-aligned estimators on the tiny addition model (:func:`lm_study`, one cell per arm and
seed, each loading the base model itself; the base model's curves are the one-cell :func:`lm_base_study`),
and the positive control on hard prompts (:func:`control_study`, whose hard prompts are chosen once by the
one-cell :func:`pools_study`). :func:`run_lm_experiment` and :func:`run_lm_control` rebuild the dicts the
chapter reads.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ..claims import Claim, Verdict, evaluate
from ..methods.compute_aligned import ABSTRACT_CLAIM, PAPER
from ..profiles import Profile, one_torch_thread
from .runner import Study, run_study

MODULES = ("rlcourse.methods.compute_aligned", "rlcourse.methods.poly_epo", "rlcourse.train", "rlcourse.testtime",
           "rlcourse.advantages")
BASE = "base model"
CONTROL_ARMS = ("standard (RLOO)", "pass@k-aligned")
POOLS = (("train", 3000), ("test", 2000))  # (split, seed) of the control's candidate prompts


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


def _base(sizes: dict):
    """``(model, tokenizer)``: the lab's addition model of ``sizes["strength"]`` for ``sizes["profile"]``."""
    from ..lm import load_base_model

    return load_base_model("addition", sizes["strength"], prof=Profile(**sizes["profile"]), progress=False)


def _held(sizes: dict) -> list:
    """The experiment's held-out addition prompts."""
    from ..tasks import get_task

    return get_task("addition").examples(sizes["eval_prompts"], seed=2000, split="test")


def _curves(model, tok, held: list, sizes: dict, seed: int) -> dict:
    """Unbiased pass@k and maj@k (``sizes["pass_ks"]``, ``sizes["maj_ks"]``) of ``model`` on ``held``
    from ``sizes["n"]`` samples a prompt, as lists."""
    from ..testtime import evaluate_samples, maj_at_k_curve, pass_at_k_curve

    ev = evaluate_samples(model, tok, held, sizes["n"], 10, torch.Generator().manual_seed(seed))
    refs = [int(e.answer) for e in held]
    return {"pass": pass_at_k_curve(ev["correct"], sizes["pass_ks"]).tolist(),
            "maj": maj_at_k_curve(ev["answers"], refs, sizes["maj_ks"], max_subsets=200, seed=seed).tolist()}


def _train(model, tok, arm: str, seed: int, sizes: dict, **trainer_kw):
    """Train ``model`` in place with arm ``arm`` of :data:`LM_ARMS` from ``seed``; the trainer."""
    from ..tasks import get_task
    from ..train import RLConfig, Trainer

    parts = LM_ARMS[arm]
    kw = {"subset_size": sizes["k"], **parts.get("advantage_kwargs", {})}
    cfg = RLConfig(num_generations=sizes["G"], prompts_per_step=sizes["prompts_per_step"], steps=sizes["steps"],
                   learning_rate=sizes["lr"], max_completion_length=10, seed=seed, progress=False,
                   advantage_estimator=parts["advantage_estimator"], advantage_kwargs=kw)
    torch.manual_seed(seed)
    trainer = Trainer(model, tok, get_task("addition"), cfg, **trainer_kw)
    trainer.train()
    return trainer


def _check_arm(arm: str, arms) -> None:
    if arm not in arms:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(arms)}")


def run_lm_base_cell(arm: str, seed: int, sizes: dict) -> dict:
    """The base model's ``pass`` and ``maj`` curves (its only arm is ``"base model"``; the sampling seed
    is fixed, so ``seed`` only names the cell)."""
    _check_arm(arm, (BASE,))
    with one_torch_thread():
        model, tok = _base(sizes)
        return _curves(model, tok, _held(sizes), sizes, 0)


def run_lm_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train the base model with arm ``arm`` of :data:`LM_ARMS` from ``seed`` (``T`` steps) and sample it.

    ======  ==========  ==========================================
    pass    ``(K,)``    pass@k at ``sizes["pass_ks"]``, held out
    maj     ``(M,)``    maj@k at ``sizes["maj_ks"]``, held out
    reward  ``(T,)``    mean training reward at each step
    ======  ==========  ==========================================
    """
    _check_arm(arm, LM_ARMS)
    held = _held(sizes)
    with one_torch_thread():
        model, tok = _base(sizes)
        trainer = _train(model, tok, arm, seed, sizes, eval_examples=held[:4])
        out = _curves(trainer.model, tok, held, sizes, 1 + seed)
    return {**out, "reward": [float(h["reward"]) for h in trainer.history]}


def _study_sizes(P: Profile, sz: dict, lr: float, strength: str) -> dict:
    """What every cell reads: the profile, the base model's strength, ``lr`` and ``sz`` but its seeds."""
    return {"profile": P.as_dict(), "strength": strength, "lr": lr,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in sz.items() if k != "seeds"}}


def _sizes(P: Profile, seeds: int | None = None, prompts_per_step: int | None = None) -> dict:
    sz = lm_sizes(P)
    sz.update({k: v for k, v in (("seeds", seeds), ("prompts_per_step", prompts_per_step)) if v is not None})
    return sz


def lm_base_study(P: Profile, strength: str = "weak") -> Study:
    """The base model's held-out curves: one cell."""
    sizes = {k: v for k, v in _study_sizes(P, lm_sizes(P), 0.0, strength).items()
             if k in ("profile", "strength", "eval_prompts", "n", "pass_ks", "maj_ks")}
    return Study(name="compute_aligned-lm-base", arms=(BASE,), seeds=(0,), run=run_lm_base_cell, sizes=sizes,
                 modules=MODULES)


def lm_study(P: Profile, lr: float = 1e-4, strength: str = "weak", arms=None, seeds: int | None = None,
             prompts_per_step: int | None = None) -> Study:
    """The arms (names of :data:`LM_ARMS`, default all) on ``seeds`` seeds (default: the profile's), with
    ``prompts_per_step`` overriding :func:`lm_sizes`."""
    arms = tuple(LM_ARMS) if arms is None else tuple(arms)
    if not set(arms) <= set(LM_ARMS):
        raise ValueError(f"unknown arms {sorted(set(arms) - set(LM_ARMS))}; choose from {list(LM_ARMS)}")
    sz = _sizes(P, seeds, prompts_per_step)
    return Study(name="compute_aligned-lm", arms=arms, seeds=tuple(range(sz["seeds"])), run=run_lm_cell,
                 sizes=_study_sizes(P, sz, lr, strength), modules=MODULES)


def run_lm_experiment(P: Profile, lr: float = 1e-4, strength: str = "weak", arms=None, seeds: int | None = None,
                      prompts_per_step: int | None = None, **run_kw) -> dict:
    """RLOO (``best_of_n`` with k = 1, the standard objective) against the pass@k- and maj@k-aligned
    estimators (train-time k = ``lm_sizes(P)['k']``) on the lab's medium addition model, AdamW at
    ``lr``, one run per seed; pass@k and maj@k of each final model on held-out prompts
    (:func:`rlcourse.testtime.evaluate_samples`, unbiased curves): :func:`lm_study` and
    :func:`lm_base_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`). Returns ``curves[arm]`` (per seed, dicts with ``pass``
    and ``maj``), ``reward[arm]`` ``(seeds, steps)``, ``base`` (the base model's curves), ``sizes``,
    ``lr``, ``seconds``. ``arms`` (names of :data:`LM_ARMS`), ``seeds`` and ``prompts_per_step``
    override the profile's choice."""
    study = lm_study(P, lr, strength, arms, seeds, prompts_per_step)
    res, base = run_study(study, **run_kw), run_study(lm_base_study(P, strength), **run_kw)

    def arrays(m: dict) -> dict:
        return {"pass": np.array(m["pass"]), "maj": np.array(m["maj"])}

    grid = {arm: [res.metrics[(arm, s)] for s in study.seeds] for arm in study.arms}
    return {"curves": {arm: [arrays(m) for m in ms] for arm, ms in grid.items()},
            "reward": {arm: np.array([m["reward"] for m in ms]) for arm, ms in grid.items()},
            "base": arrays(base.metrics[(BASE, 0)]), "sizes": _sizes(P, seeds, prompts_per_step), "lr": lr,
            "seconds": res.wall_seconds + base.wall_seconds}


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


def _candidates(sizes: dict, split: str, seed: int) -> list:
    from ..tasks import get_task

    return get_task("addition").examples(sizes["candidates"], seed=seed, split=split)


def run_pools_cell(arm: str, seed: int, sizes: dict) -> dict:
    """The control's hard prompts: per split of :data:`POOLS`, the indices among ``sizes["candidates"]``
    candidates that :func:`select_hard` keeps from 16 samples of the base model (``[0, 1]`` where it
    keeps none: a tiny smoke base may solve none). Its only arm is ``"hard prompts"``."""
    from ..testtime import evaluate_samples

    _check_arm(arm, ("hard prompts",))
    out = {}
    with one_torch_thread():
        model, tok = _base(sizes)
        for split, s in POOLS:
            ev = evaluate_samples(model, tok, _candidates(sizes, split, s), 16, 10, torch.Generator().manual_seed(s))
            out[split] = select_hard(ev["correct"], sizes["hi"]).tolist() or [0, 1]
    return out


def run_lm_control_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train the base model on the hard training prompts ``sizes["pools"]["train"]`` with arm ``arm`` of
    :data:`CONTROL_ARMS` from ``seed``; ``pass`` is its pass@k at the train-time k on the hard held-out
    prompts."""
    from ..testtime import evaluate_samples, pass_at_k_curve

    _check_arm(arm, CONTROL_ARMS)
    pools = {split: [_candidates(sizes, split, s)[i] for i in sizes["pools"][split]] for split, s in POOLS}
    held = pools["test"]
    with one_torch_thread():
        model, tok = _base(sizes)
        trainer = _train(model, tok, arm, seed, sizes, train_examples=pools["train"], eval_examples=held[:4])
        ev = evaluate_samples(trainer.model, tok, held, sizes["n"], 10, torch.Generator().manual_seed(1 + seed))
    return {"pass": float(pass_at_k_curve(ev["correct"], (sizes["k"],))[0])}


def pools_study(P: Profile, strength: str = "weak", candidates: int | None = None, hi: float = 0.25) -> Study:
    """The choice of the control's hard prompts: one cell."""
    cand = P.pick(smoke=16, book=256) if candidates is None else candidates
    return Study(name="compute_aligned-hard-pools", arms=("hard prompts",), seeds=(0,), run=run_pools_cell,
                 sizes={"profile": P.as_dict(), "strength": strength, "candidates": cand, "hi": hi}, modules=MODULES)


def control_study(P: Profile, pools: dict, lr: float = 1e-4, strength: str = "weak", seeds: int | None = None,
                  candidates: int | None = None) -> Study:
    """:data:`CONTROL_ARMS` on ``seeds`` seeds (default: the profile's) on the hard prompts ``pools``
    (``{"train": indices, "test": indices}`` from :func:`pools_study`)."""
    sz = lm_sizes(P)
    cand = P.pick(smoke=16, book=256) if candidates is None else candidates
    return Study(name="compute_aligned-lm-control", arms=CONTROL_ARMS,
                 seeds=tuple(range(sz["seeds"] if seeds is None else seeds)), run=run_lm_control_cell,
                 sizes={**_study_sizes(P, sz, lr, strength), "candidates": cand, "pools": pools}, modules=MODULES)


def run_lm_control(P: Profile, lr: float = 1e-4, strength: str = "weak", seeds: int | None = None,
                   candidates: int | None = None, hi: float = 0.25, **run_kw) -> dict:
    """The LM positive control for the aligned-vs-standard comparison: train and evaluate on *hard*
    prompts only (:func:`select_hard`, the base model's pass rate in ``(0, hi]`` from 16 samples), with
    train-time k equal to the evaluated k, RLOO against the pass@k-aligned estimator:
    :func:`pools_study` and :func:`control_study` on the study runner. Returns ``pass[arm]`` (per seed,
    pass@k at the train-time k on the hard held-out prompts), the numbers of hard prompts, ``sizes`` and
    ``seconds``."""
    chosen = run_study(pools_study(P, strength, candidates, hi), **run_kw)
    pools = chosen.metrics[("hard prompts", 0)]
    res = run_study(control_study(P, pools, lr, strength, seeds, candidates), **run_kw)
    return {"pass": {arm: res.values(arm, "pass") for arm in CONTROL_ARMS},
            "hard": {split: len(pools[split]) for split, _ in POOLS}, "sizes": lm_sizes(P), "lr": lr,
            "seconds": res.wall_seconds + chosen.wall_seconds}


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
