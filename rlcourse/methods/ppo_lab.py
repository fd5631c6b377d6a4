"""The PPO chapter's lab: where the clipped surrogate's gradient vanishes, and a Trainer experiment on
the tiny addition model (clip fraction and KL against the clip and the number of passes over each
batch, a run without the clip, and PPO with a GAE critic).

Nothing here is registered: the loss under test is ``rlcourse.losses.compute_policy_loss`` (the
Trainer's default, registered as ``"vanilla"``) and the critic is the Trainer's own.
"""
from __future__ import annotations

import copy
import time

import numpy as np
import torch

from ..claims import Claim, evaluate
from ..lm import load_base_model
from ..profiles import Profile, profile as current_profile
from ..train import RLConfig, Trainer

NO_CLIP = 1e6  # an epsilon so large that clip(rho, 1 - eps, 1 + eps) never binds (rho > 0)


def clip_zero_grad_region(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float = 0.2,
                          eps_high: float = 0.2, clip_ratio_c: float | None = None) -> torch.Tensor:
    """Where the per-token PPO-clip loss has zero gradient with respect to the log-prob.

    The clipped branch is taken, and is constant in the ratio, when the ratio has left the trust
    region in the direction the advantage pushes it: ``A > 0`` and ``rho > 1 + eps_high``, or
    ``A < 0`` and ``rho < 1 - eps_low``. With dual clip ``c``, tokens with ``A < 0`` and
    ``rho > c`` are capped at the constant ``-A c`` too. ``A = 0`` gives zero gradient everywhere.

    ============ ========= ==========================================
    ratio        ``(...)`` pi_theta / pi_old per token (> 0)
    advantages   ``(...)`` per-token advantages
    returns      ``(...)`` bool, True where the gradient is exactly 0
    ============ ========= ==========================================
    """
    if ratio.shape != advantages.shape:
        raise ValueError(f"ratio {tuple(ratio.shape)} and advantages {tuple(advantages.shape)} differ in shape")
    if (ratio <= 0).any():
        raise ValueError("ratio must be positive")
    zero = (advantages == 0) | ((advantages > 0) & (ratio > 1 + eps_high)) | ((advantages < 0) & (ratio < 1 - eps_low))
    if clip_ratio_c is not None:
        zero = zero | ((advantages < 0) & (ratio > clip_ratio_c))
    return zero


# ---------------------------------------------------------------------- the Trainer experiment
ARMS = {  # name: (epsilon, num_iterations)
    "clip 0.2, 1 pass": (0.2, 1),
    "clip 0.2, 4 passes": (0.2, 4),
    "no clip, 4 passes": (NO_CLIP, 4),
}


def ppo_config(prof: Profile, epsilon: float, num_iterations: int, seed: int = 0,
               estimator: str = "grpo", steps: int | None = None) -> RLConfig:
    """The experiment's configuration; the arms differ only in ``epsilon`` and ``num_iterations``
    (and the GAE run in ``advantage_estimator``). The learning rate, 2e-4 constant, is one at which a
    single pass per batch of 16 prompts still improves this model over 40 steps (1e-4 barely moved it
    in that budget, and 4e-4 lost half its accuracy within 8 steps even with one pass); four passes
    take four optimiser steps of that size per batch, which moves the policy far enough for the clip
    to bind. ``steps`` overrides the profile's number of RL steps (the sweep runs shorter)."""
    steps = prof.pick(smoke=2, book=40) if steps is None else int(steps)
    return RLConfig(
        advantage_estimator=estimator, epsilon=epsilon, num_iterations=num_iterations,
        num_generations=prof.num_generations, prompts_per_step=prof.pick(smoke=prof.rl_prompts, book=16),
        learning_rate=prof.pick(smoke=prof.rl_lr, book=2e-4), steps=steps, max_completion_length=10,
        loss_type="dapo", eval_every=steps, eval_prompts=prof.eval_prompts, seed=seed, progress=False,
        lam=0.95, vf_coef=0.5, critic_learning_rate=prof.pick(smoke=1e-3, book=1e-3), cliprange_value=0.2)


def _summary(history: list[dict], base_acc: float, seconds: float) -> dict:
    return {"history": history, "base_accuracy": base_acc, "final_accuracy": history[-1]["eval_greedy_accuracy"],
            "mean_kl": float(np.mean([h.get("ppo_kl", 0.0) for h in history])),
            "max_kl": float(np.max([h.get("ppo_kl", 0.0) for h in history])),
            "mean_clipfrac": float(np.mean([h.get("pg_clipfrac", 0.0) for h in history])), "seconds": seconds}


def run_ppo_experiment(prof: Profile | None = None, seeds=None, arms=None, with_gae: bool = True,
                       steps: int | None = None) -> dict:
    """Train the addition 'medium' base model under each arm of ``ARMS`` (and PPO + GAE) for each
    seed; the arms of one seed share prompts until their policies differ. Returns
    ``{"runs": {seed: {arm: summary}}, "seconds"}``; a summary holds the history, base and final
    greedy accuracy, the mean and max over steps of ``ppo_kl`` and the mean clip fraction.
    ``steps`` overrides the profile's number of RL steps (see :func:`ppo_config`)."""
    prof = prof or current_profile()
    seeds = list(range(prof.seeds)) if seeds is None else list(seeds)
    arms = ARMS if arms is None else arms
    base, tok = load_base_model("addition", "medium", prof=prof, progress=False)
    start = time.perf_counter()
    runs: dict = {}
    for s in seeds:
        runs[s] = {}
        plan = [(name, ppo_config(prof, eps, mu, s, steps=steps)) for name, (eps, mu) in arms.items()]
        if with_gae:
            plan.append(("PPO + GAE", ppo_config(prof, 0.2, 1, s, estimator="gae", steps=steps)))
        for name, cfg in plan:
            trainer = Trainer(copy.deepcopy(base), tok, "addition", cfg)
            if not runs[s]:  # the base model's accuracy on this seed's held-out prompts
                base_acc = trainer.evaluate()
            t0 = time.perf_counter()
            history = trainer.train()
            runs[s][name] = _summary(history, base_acc, time.perf_counter() - t0)
    return {"runs": runs, "seconds": time.perf_counter() - start}


# ---------------------------------------------------------------------- the epsilon x reuse sweep
SWEEP_EPSILONS = (0.1, 0.2, 0.3)
SWEEP_REUSE = (1, 2, 4)


def sweep_steps(prof: Profile) -> int:
    """RL steps per run of the sweep: short, since the sweep runs 9 configurations per seed and its
    quantities (clip fraction, KL) are per-step averages that need no long run to be measured; sized so
    that the sweep adds under a minute to the chapter in the book profile on one thread."""
    return prof.pick(smoke=1, book=6)


def run_clip_reuse_sweep(prof: Profile | None = None, epsilons=SWEEP_EPSILONS, reuse=SWEEP_REUSE, seeds=None,
                         steps: int | None = None) -> dict:
    """Clip fraction and KL against the clip ``epsilon`` and the passes per batch ``num_iterations``.

    Each pair ``(epsilon, mu)`` is one arm of :func:`run_ppo_experiment` (GRPO advantages, no GAE
    run), trained for ``steps`` steps (default :func:`sweep_steps`) on each seed (default
    ``range(prof.seeds)``); the arms of a seed share prompts until their policies differ. Per run, the
    Trainer history's ``pg_clipfrac`` and ``ppo_kl`` (each averaged over the passes of a step) are
    averaged over the steps. With ``R = len(reuse)``, ``E = len(epsilons)``, ``N`` seeds:

    ============== ============= ===================================================
    epsilons       ``(E,)``      the clip values, as given
    reuse          ``(R,)``      the numbers of passes per batch, as given
    seeds          ``(N,)``      the seeds
    steps          int           RL steps per run
    clipfrac       ``(R, E, N)`` mean over steps of ``pg_clipfrac``, in [0, 1]
    kl             ``(R, E, N)`` mean over steps of ``ppo_kl``
    final_accuracy ``(R, E, N)`` greedy held-out accuracy after the last step
    base_accuracy  ``(N,)``      the base model's, on each seed's held-out prompts
    seconds        float         wall-clock time of the whole sweep
    ============== ============= ===================================================
    """
    prof = prof or current_profile()
    epsilons, reuse = tuple(float(e) for e in epsilons), tuple(int(m) for m in reuse)
    if not epsilons or not reuse:
        raise ValueError("the sweep needs at least one epsilon and one reuse level")
    if any(e <= 0 for e in epsilons) or any(m < 1 for m in reuse):
        raise ValueError(f"epsilons must be > 0 and reuse levels >= 1, got {epsilons} and {reuse}")
    steps = sweep_steps(prof) if steps is None else int(steps)
    arms = {(m, e): (e, m) for m in reuse for e in epsilons}  # run_ppo_experiment keys its runs by arm
    res = run_ppo_experiment(prof, seeds=seeds, arms=arms, with_gae=False, steps=steps)
    runs = res["runs"]
    seeds = sorted(runs)
    grid = lambda key: np.array([[[runs[s][(m, e)][key] for s in seeds] for e in epsilons]  # noqa: E731
                                 for m in reuse], dtype=float)
    return {"epsilons": epsilons, "reuse": reuse, "seeds": seeds, "steps": steps,
            "clipfrac": grid("mean_clipfrac"), "kl": grid("mean_kl"), "final_accuracy": grid("final_accuracy"),
            "base_accuracy": np.array([runs[s][(reuse[0], epsilons[0])]["base_accuracy"] for s in seeds]),
            "seconds": res["seconds"]}


def monotone_trend(values: np.ndarray, increasing: bool) -> dict:
    """Whether ``values`` move in one direction along their second axis, in the seed mean and per seed.

    ============ ============= ==========================================================
    values       ``(L, K, N)`` L lines, K points along the swept axis, N seeds
    increasing   bool          the predicted direction (strictly up, or strictly down)
    returns      dict          ``mean_holds``: every line's seed mean moves that way at
                               every step; ``mean_breaks``: the ``(line, k)`` where the
                               mean from point k to k + 1 does not; ``seed_breaks`` and
                               ``seed_pairs``: how many of the per-seed steps do not, of all
    ============ ============= ==========================================================
    """
    v = np.asarray(values, dtype=float)
    if v.ndim != 3 or v.shape[1] < 2:
        raise ValueError(f"values must be (lines, points >= 2, seeds), got shape {v.shape}")
    sign = 1.0 if increasing else -1.0
    d_mean = sign * np.diff(v.mean(-1), axis=1)  # (L, K-1)
    d_seed = sign * np.diff(v, axis=1)  # (L, K-1, N)
    breaks = [(int(i), int(k)) for i, k in zip(*np.nonzero(d_mean <= 0))]
    return {"mean_holds": not breaks, "mean_breaks": breaks, "seed_breaks": int((d_seed <= 0).sum()),
            "seed_pairs": int(d_seed.size)}


def trend_sentence(trend: dict, prediction: str, lines: list[str], points: list[str]) -> str:
    """The sentence a :func:`monotone_trend` result supports, for a prediction stated before the run.

    ``lines[i]`` names line ``i`` (e.g. ``"2 passes"``) and ``points[k]`` point ``k`` along the swept
    axis (e.g. ``"epsilon 0.1"``); ``prediction`` is the predicted direction in words. Returns one of:
    the prediction held in every line's seed mean and every per-seed step; it held in the means but
    some per-seed steps went the other way (how many); or the run contradicts it, naming where.
    """
    if len(lines) != len(set(lines)) or not lines or not points:
        raise ValueError("lines and points need distinct, non-empty labels")
    n, m = trend["seed_breaks"], trend["seed_pairs"]
    if trend["mean_holds"] and n == 0:
        return f"As predicted, {prediction}: in the seed means and in all {m} per-seed comparisons."
    if trend["mean_holds"]:
        return (f"In the seed means {prediction}, as predicted, but {n} of the {m} per-seed comparisons went "
                f"the other way, so the direction is not settled seed by seed.")
    breaks = trend["mean_breaks"]
    where = "; ".join(f"{lines[i]}, from {points[k]} to {points[k + 1]}" for i, k in breaks[:3])
    more = f" (and {len(breaks) - 3} more of the {len(lines) * (len(points) - 1)} steps)" if len(breaks) > 3 else ""
    return (f"The run contradicts the prediction that {prediction}: the seed mean did not move that way at "
            f"{where}{more}.")


_PPO = "Schulman, Wolski, Dhariwal, Radford, Klimov 2017, Proximal Policy Optimization Algorithms, arXiv:1707.06347"
_SETTING = ("tiny Llama (book profile) on reversed-digit addition ('medium' base), GRPO advantages, 16 prompts x 8 "
            "samples, 40 steps, AdamW 2e-4 constant, token-mean loss, gradient norm clipped at 1")


def ppo_claims() -> dict:
    """The chapter's claims, fixed before the run."""
    return {
        "kl": Claim(
            key="ppo/clip-limits-policy-change", paper=_PPO,
            statement="the clipped objective removes the incentive to move the probability ratio outside "
                      "[1 - eps, 1 + eps], so several epochs on one batch keep the policy near the one that sampled it",
            source="sec. 3 (Clipped Surrogate Objective), paraphrase", setting=_SETTING + "; 4 passes per batch",
            metric="mean over steps of the KL estimate between the sampling policy and the policy during the "
                   "passes (ppo_kl)", method="clip 0.2, 4 passes", baseline="no clip, 4 passes",
            kind="less", margin=0.0, unit="{:.4f}"),
        "reuse": Claim(
            key="ppo/reuse-beats-one-pass", paper=_PPO,
            statement="the paper's new objective function makes several epochs of minibatch updates on one batch "
                      "possible (tested here as: four passes per batch beat one pass at the same number of "
                      "sampled batches)",
            source="abstract (arXiv:1707.06347), paraphrase of the abstract; not a quotation", setting=_SETTING,
            metric="final greedy accuracy on 256 held-out prompts, per seed", method="clip 0.2, 4 passes",
            baseline="clip 0.2, 1 pass", kind="greater", margin=0.0),
        "clip-vs-none": Claim(
            key="ppo/clip-beats-no-clip", paper=_PPO,
            statement="without a constraint, maximisation of the surrogate would lead to an excessively large "
                      "policy update; the clipped version performs best in the paper's comparison of surrogates",
            source="sec. 3 and sec. 6.1 (comparison of surrogate objectives), paraphrase", setting=_SETTING + "; 4 passes",
            metric="final greedy accuracy on 256 held-out prompts, per seed", method="clip 0.2, 4 passes",
            baseline="no clip, 4 passes", kind="greater", margin=0.0),
        "gae": Claim(
            key="ppo/gae-lifts-accuracy", paper=_PPO + "; Schulman et al. 2015, GAE, arXiv:1506.02438",
            statement="PPO with a learned value function and generalised advantage estimation improves the policy "
                      "(the algorithm of the paper's sec. 5)",
            source="sec. 5, paraphrase", setting=_SETTING.replace("GRPO advantages", "GAE (lambda 0.95) with a "
                                                                   "critic (a copy of the trunk with a scalar head, "
                                                                   "lr 1e-3)"),
            metric="final greedy accuracy minus the base model's, per seed", method="PPO + GAE", baseline="base model",
            kind="greater", margin=0.0),
    }


def ppo_verdicts(res: dict) -> dict:
    """The verdicts of :func:`ppo_claims` on :func:`run_ppo_experiment`'s output."""
    runs, claims, secs = res["runs"], ppo_claims(), res["seconds"]
    seeds = sorted(runs)
    col = lambda arm, key: [runs[s][arm][key] for s in seeds]  # noqa: E731
    out = {
        "kl": evaluate(claims["kl"], col("clip 0.2, 4 passes", "mean_kl"), col("no clip, 4 passes", "mean_kl"),
                       seconds=secs),
        "reuse": evaluate(claims["reuse"], col("clip 0.2, 4 passes", "final_accuracy"),
                          col("clip 0.2, 1 pass", "final_accuracy"), seconds=secs),
        "clip-vs-none": evaluate(claims["clip-vs-none"], col("clip 0.2, 4 passes", "final_accuracy"),
                                 col("no clip, 4 passes", "final_accuracy"), seconds=secs),
    }
    if all("PPO + GAE" in runs[s] for s in seeds):
        out["gae"] = evaluate(claims["gae"], col("PPO + GAE", "final_accuracy"), col("PPO + GAE", "base_accuracy"),
                              seconds=secs)
    return out
