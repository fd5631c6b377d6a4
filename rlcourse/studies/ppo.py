"""The PPO chapter's study: the tiny addition model trained with the clipped surrogate at one and four
passes per batch, without the clip, and as real PPO with a GAE critic (:data:`ARMS`, :data:`GAE_ARM`);
the rule that fixes its learning rate on seeds of its own (:func:`choose_ppo_lr`); the sweep of the clip
against the passes per batch (:func:`run_clip_reuse_sweep`); and the claims and their verdicts.

The arms are the names of an arm table (``{name: [epsilon, num_iterations, advantage_estimator]}``)
that travels in the study's sizes with the profile, the steps and the learning rate, plus
:data:`BASE`, the base model's greedy accuracy on a seed's held-out prompts; the seeds are the
profile's ``seeds``. One cell (:func:`run_cell`) loads the base model and trains it with one arm from
one seed, which draws the prompts, so the arms of one seed share prompts until their policies differ
and a cell's numbers do not depend on which cells ran before it. :func:`run_ppo_experiment` runs the
grid on the study runner (cached per cell) and rebuilds the dict the chapter reads.
"""
from __future__ import annotations

import numpy as np

from ..claims import Claim, evaluate
from ..methods.ppo_lab import NO_CLIP
from ..profiles import Profile, one_torch_thread, profile as current_profile
from ..train import RLConfig
from .runner import Results, Study, run_study

ARMS = {  # name: (epsilon, num_iterations)
    "clip 0.2, 1 pass": (0.2, 1),
    "clip 0.2, 4 passes": (0.2, 4),
    "no clip, 4 passes": (NO_CLIP, 4),
}


def ppo_config(prof: Profile, epsilon: float, num_iterations: int, seed: int = 0,
               estimator: str = "grpo", steps: int | None = None, learning_rate: float | None = None) -> RLConfig:
    """The experiment's configuration; the arms differ only in ``epsilon`` and ``num_iterations``
    (and the GAE run in ``advantage_estimator``). ``learning_rate`` (constant) is the one
    :func:`choose_ppo_lr` picks on seeds disjoint from the reported ones (default: the profile's
    2e-4 in the book profile, the sweep's rate); four passes take four optimiser steps of that size per
    batch, which moves the policy far enough for the clip to bind. ``steps`` overrides the profile's
    number of RL steps (the sweep runs shorter)."""
    steps = prof.pick(smoke=2, book=40) if steps is None else int(steps)
    lr = prof.pick(smoke=prof.rl_lr, book=2e-4) if learning_rate is None else float(learning_rate)
    if not lr > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate!r}")
    return RLConfig(
        advantage_estimator=estimator, epsilon=epsilon, num_iterations=num_iterations,
        num_generations=prof.num_generations, prompts_per_step=prof.pick(smoke=prof.rl_prompts, book=16),
        learning_rate=lr, steps=steps, max_completion_length=10,
        loss_type="dapo", eval_every=steps, eval_prompts=prof.eval_prompts, seed=seed, progress=False,
        lam=0.95, vf_coef=0.5, critic_learning_rate=prof.pick(smoke=1e-3, book=1e-3), cliprange_value=0.2)


GAE_ARM = "PPO + GAE, 4 passes"  # GAE advantages with the critic, epsilon 0.2, four passes per batch
BASE = "base model"  # the base model's greedy accuracy on a seed's held-out prompts (no training)
MODULES = ("rlcourse.methods.ppo_lab", "rlcourse.train", "rlcourse.losses", "rlcourse.advantages")


def arm_table(arms: dict | None = None, with_gae: bool = True) -> dict:
    """``{name: [epsilon, num_iterations, advantage_estimator]}`` for the ``{name: (epsilon, passes)}``
    of ``arms`` (default :data:`ARMS`, GRPO advantages) and, ``with_gae``, :data:`GAE_ARM`."""
    table = {name: [float(eps), int(mu), "grpo"] for name, (eps, mu) in (ARMS if arms is None else arms).items()}
    if with_gae:
        table[GAE_ARM] = [0.2, 4, "gae"]
    if BASE in table:
        raise ValueError(f"{BASE!r} names the base model's cells; choose another arm name")
    return table


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train the addition 'medium' base model with arm ``arm`` of ``sizes["arms"]`` from ``seed``
    (:func:`ppo_config`), or, for :data:`BASE`, measure the base model on the seed's held-out prompts.
    With ``T`` steps:

    ===============  ========  ==============================================================
    history          ``(T,)``  the Trainer's per-step dicts (``None`` where a value was NaN)
    final_accuracy   scalar    greedy held-out accuracy after the last step
    mean_kl          scalar    mean over steps of ``ppo_kl`` (0 where a step logged none)
    max_kl           scalar    the largest ``ppo_kl``
    mean_clipfrac    scalar    mean over steps of ``pg_clipfrac``
    base_accuracy    scalar    :data:`BASE` only: the base model's greedy held-out accuracy
    ===============  ========  ==============================================================
    """
    from ..lm import load_base_model
    from ..train import Trainer

    if arm != BASE and arm not in sizes["arms"]:
        raise ValueError(f"unknown arm {arm!r}; the arms are {(BASE, *sizes['arms'])}")
    prof = Profile(**sizes["profile"])
    eps, mu, estimator = sizes["arms"][arm] if arm != BASE else (0.2, 1, "grpo")
    cfg = ppo_config(prof, eps, mu, seed, estimator=estimator, steps=sizes["steps"],
                     learning_rate=sizes["learning_rate"])
    with one_torch_thread():
        model, tok = load_base_model("addition", "medium", prof=prof, progress=False)
        trainer = Trainer(model, tok, "addition", cfg)
        if arm == BASE:
            return {"base_accuracy": trainer.evaluate()}
        history = trainer.train()
    kl, clip = [h.get("ppo_kl", 0.0) for h in history], [h.get("pg_clipfrac", 0.0) for h in history]
    return {"history": [{k: None if v != v else v for k, v in h.items()} for h in history],
            "final_accuracy": history[-1]["eval_greedy_accuracy"], "mean_kl": float(np.mean(kl)),
            "max_kl": float(np.max(kl)), "mean_clipfrac": float(np.mean(clip))}


def ppo_study(prof: Profile, seeds=None, arms: dict | None = None, with_gae: bool = True, steps: int | None = None,
              learning_rate: float | None = None, name: str = "ppo") -> Study:
    """:data:`BASE` and every arm of :func:`arm_table` on ``seeds`` (default ``range(prof.seeds)``);
    ``steps`` and ``learning_rate`` override the profile's (see :func:`ppo_config`). The verdicts
    (:func:`verdicts`) need the chapter's arms, so only the default ``arms`` gets them."""
    seeds = tuple(range(prof.seeds)) if seeds is None else tuple(int(s) for s in seeds)
    table = arm_table(arms, with_gae)
    sizes = {"profile": prof.as_dict(), "steps": steps, "learning_rate": learning_rate, "arms": table}
    return Study(name=name, arms=(BASE, *table), seeds=seeds, run=run_cell, sizes=sizes,
                 verdicts=verdicts if arms is None else None, modules=MODULES)


def ppo_output(results: Results) -> dict:
    """The chapter's dict from a :func:`ppo_study`'s results: ``{"runs": {seed: {arm: summary}},
    "seconds"}``, a summary being a cell's metrics (NaN back where it stored ``None``) with the seed's
    ``base_accuracy`` and the cell's wall ``seconds``; ``seconds`` is the grid's, base cells included."""
    runs = {}
    for seed in results.study.seeds:
        base = results.metrics[(BASE, seed)]["base_accuracy"]
        runs[seed] = {}
        for arm in results.study.arms[1:]:
            m = dict(results.metrics[(arm, seed)])
            m["history"] = [{k: float("nan") if v is None else v for k, v in h.items()} for h in m["history"]]
            runs[seed][arm] = {**m, "base_accuracy": base, "seconds": results.seconds[(arm, seed)]}
    return {"runs": runs, "seconds": results.wall_seconds}


def run_ppo_experiment(prof: Profile | None = None, seeds=None, arms=None, with_gae: bool = True,
                       steps: int | None = None, learning_rate: float | None = None, name: str = "ppo",
                       **run_kw) -> dict:
    """Train the addition 'medium' base model under each arm of ``ARMS`` (and :data:`GAE_ARM`, real PPO:
    a critic, GAE, the clip and four passes per batch) for each seed: :func:`ppo_study` on the study
    runner (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`), as :func:`ppo_output`'s dict.
    A summary holds the history, base and final greedy accuracy, the mean and max over steps of
    ``ppo_kl`` and the mean clip fraction. ``steps`` and ``learning_rate`` override the profile's (see
    :func:`ppo_config`); ``name`` names the study (and its cache folder)."""
    prof = prof or current_profile()
    return ppo_output(run_study(ppo_study(prof, seeds, arms, with_gae, steps, learning_rate, name), **run_kw))


LR_GRID = (5e-5, 1e-4, 2e-4)  # the rates the rule chooses from (book profile)
SELECTION_SEEDS = (10, 11, 12)  # seeds (and the held-out prompts they draw) the rule runs on; disjoint from the reported seeds, which start at 0


def choose_ppo_lr(prof: Profile | None = None, grid=None, seeds=None, steps: int | None = None,
                  **run_kw) -> dict:
    """The rule that fixes the experiment's learning rate before the reported runs.

    Run the one-pass arm (GRPO advantages, epsilon 0.2, one pass per batch: the positive control of the
    experiment) at each rate of ``grid`` on the selection ``seeds``, which draw their own prompts and
    held-out prompts, disjoint from the reported seeds 0, 1, ...; take the rate whose mean gain in final
    greedy accuracy over the base model is largest, so that the control has its best chance to show
    that this budget can improve the model. Defaults: the book profile's :data:`LR_GRID` and
    :data:`SELECTION_SEEDS`; the smoke profile tries its own rate on seed 10. ``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`.

    ======== ==================== =============================================
    key      shape                meaning
    ======== ==================== =============================================
    lr       float                the chosen rate
    gains    ``(len(grid), N)``   final minus base accuracy, per rate and seed
    grid     tuple                the rates tried
    seeds    list                 the selection seeds
    ======== ==================== =============================================
    """
    prof = prof or current_profile()
    grid = tuple(prof.pick(smoke=(prof.rl_lr,), book=LR_GRID) if grid is None else grid)
    seeds = list(prof.pick(smoke=SELECTION_SEEDS[:1], book=SELECTION_SEEDS) if seeds is None else seeds)
    if not grid or not seeds:
        raise ValueError("the rule needs at least one rate and one seed")
    if set(seeds) & set(range(prof.seeds)):
        raise ValueError(f"selection seeds {seeds} overlap the reported seeds 0..{prof.seeds - 1}")
    gains = np.zeros((len(grid), len(seeds)))
    for i, lr in enumerate(grid):
        res = run_ppo_experiment(prof, seeds=seeds, arms={"clip 0.2, 1 pass": ARMS["clip 0.2, 1 pass"]},
                                 with_gae=False, steps=steps, learning_rate=lr,
                                 name="ppo-lr", **run_kw)
        gains[i] = [res["runs"][s]["clip 0.2, 1 pass"]["final_accuracy"] -
                    res["runs"][s]["clip 0.2, 1 pass"]["base_accuracy"] for s in seeds]
    return {"lr": float(grid[int(gains.mean(1).argmax())]), "gains": gains, "grid": grid, "seeds": seeds}


# ---------------------------------------------------------------------- the epsilon x reuse sweep
SWEEP_EPSILONS = (0.1, 0.2, 0.3)
SWEEP_REUSE = (1, 2, 4)


def sweep_steps(prof: Profile) -> int:
    """RL steps per run of the sweep: short, since the sweep runs 9 configurations per seed and its
    quantities (clip fraction, KL) are per-step averages that need no long run to be measured; sized so
    that the sweep adds under a minute to the chapter in the book profile on one thread."""
    return prof.pick(smoke=1, book=6)


def sweep_arm(epsilon: float, passes: int) -> str:
    """The name of the sweep's arm with clip ``epsilon`` and ``passes`` passes per batch."""
    return f"epsilon {epsilon!r}, {passes} passes"


def run_clip_reuse_sweep(prof: Profile | None = None, epsilons=SWEEP_EPSILONS, reuse=SWEEP_REUSE, seeds=None,
                         steps: int | None = None, **run_kw) -> dict:
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
    arms = {sweep_arm(e, m): (e, m) for m in reuse for e in epsilons}
    res = run_ppo_experiment(prof, seeds=seeds, arms=arms, with_gae=False, steps=steps, name="ppo-sweep", **run_kw)
    runs = res["runs"]
    seeds = sorted(runs)
    grid = lambda key: np.array([[[runs[s][sweep_arm(e, m)][key] for s in seeds] for e in epsilons]  # noqa: E731
                                 for m in reuse], dtype=float)
    return {"epsilons": epsilons, "reuse": reuse, "seeds": seeds, "steps": steps,
            "clipfrac": grid("mean_clipfrac"), "kl": grid("mean_kl"), "final_accuracy": grid("final_accuracy"),
            "base_accuracy": np.array([runs[s][sweep_arm(epsilons[0], reuse[0])]["base_accuracy"] for s in seeds]),
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
            "samples, 40 steps, AdamW at a constant rate chosen on seeds 10-12 (choose_ppo_lr), token-mean loss, "
            "gradient norm clipped at 1")
_CONTROL = "ppo/control-one-pass-learns"


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
        "control": Claim(
            key="ppo/control-one-pass-learns", paper=_PPO, role="positive control",
            statement="(not a claim of the paper) at this budget, one ordinary policy-gradient pass per batch lifts "
                      "the model above its base accuracy, so the budget can show an improvement at all",
            source="positive control of the experiment", setting=_SETTING + "; 1 pass per batch",
            metric="final greedy accuracy on 256 held-out prompts, per seed", method="clip 0.2, 1 pass",
            baseline="base model", kind="greater", margin=0.0),
        "reuse": Claim(
            key="ppo/reuse-beats-one-pass", control=_CONTROL, paper=_PPO,
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
            source="sec. 5, paraphrase", control=_CONTROL,
            setting=_SETTING.replace("GRPO advantages", "GAE (lambda 0.95) with a critic (a copy of the trunk with a "
                                                        "scalar head, lr 1e-3), clip 0.2, 4 full-batch passes"),
            metric="final greedy accuracy, per seed", method=GAE_ARM, baseline="base model",
            kind="greater", margin=0.0),
    }


def ppo_verdicts(res: dict) -> dict:
    """The verdicts of :func:`ppo_claims` on :func:`run_ppo_experiment`'s output."""
    runs, claims, secs = res["runs"], ppo_claims(), res["seconds"]
    seeds = sorted(runs)
    col = lambda arm, key: [runs[s][arm][key] for s in seeds]  # noqa: E731
    control = evaluate(claims["control"], col("clip 0.2, 1 pass", "final_accuracy"),
                       col("clip 0.2, 1 pass", "base_accuracy"), seconds=secs)
    out = {
        "control": control,
        "kl": evaluate(claims["kl"], col("clip 0.2, 4 passes", "mean_kl"), col("no clip, 4 passes", "mean_kl"),
                       seconds=secs),
        "reuse": evaluate(claims["reuse"], col("clip 0.2, 4 passes", "final_accuracy"),
                          col("clip 0.2, 1 pass", "final_accuracy"), seconds=secs, control=control),
        "clip-vs-none": evaluate(claims["clip-vs-none"], col("clip 0.2, 4 passes", "final_accuracy"),
                                 col("no clip, 4 passes", "final_accuracy"), seconds=secs),
    }
    if all(GAE_ARM in runs[s] for s in seeds):
        out["gae"] = evaluate(claims["gae"], col(GAE_ARM, "final_accuracy"), col(GAE_ARM, "base_accuracy"),
                              seconds=secs, control=control)
    return out


def verdicts(results: Results) -> dict:
    """:func:`ppo_verdicts` on a :func:`ppo_study`'s results."""
    return ppo_verdicts(ppo_output(results))
