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


# ---------------------------------------------------------------------- why the surrogate: a tabular MDP
def _check_mdp(P: np.ndarray, r: np.ndarray, gamma: float, rho0: np.ndarray, *pis: np.ndarray) -> None:
    S, A = r.shape
    if P.shape != (S, A, S) or rho0.shape != (S,):
        raise ValueError(f"P must be (S, A, S) = {(S, A, S)} and rho0 (S,) = {(S,)}; got {P.shape} and {rho0.shape}")
    if not 0 <= gamma < 1:
        raise ValueError(f"gamma must be in [0, 1), got {gamma}")
    if not np.allclose(P.sum(-1), 1) or (P < 0).any() or not np.isclose(rho0.sum(), 1) or (rho0 < 0).any():
        raise ValueError("P[s, a] and rho0 must be probability distributions")
    for pi in pis:
        if pi.shape != (S, A) or (pi < 0).any() or not np.allclose(pi.sum(-1), 1):
            raise ValueError(f"a policy must be (S, A) = {(S, A)} with rows that are distributions")


def mdp_quantities(P: np.ndarray, r: np.ndarray, pi: np.ndarray, gamma: float, rho0: np.ndarray) -> dict:
    """Exact values of policy ``pi`` in a finite discounted MDP.

    ========== ============ ====================================================================
    P          ``(S,A,S)``  transition probabilities P(s' | s, a)
    r          ``(S,A)``    expected reward of action a in state s
    pi         ``(S,A)``    the policy, each row a distribution
    rho0       ``(S,)``     the start-state distribution
    returns    dict         ``V (S,)``, ``Q (S,A)``, ``A (S,A)`` = Q - V, ``J`` = rho0 . V (the
                            discounted return), ``d (S,)`` the normalised discounted state
                            distribution (1 - gamma) rho0^T (I - gamma P_pi)^{-1}
    ========== ============ ====================================================================
    """
    _check_mdp(P, r, gamma, rho0, pi)
    S = r.shape[0]
    P_pi = np.einsum("sa,sat->st", pi, P)
    inv = np.linalg.inv(np.eye(S) - gamma * P_pi)
    V = inv @ (pi * r).sum(1)
    Q = r + gamma * P @ V
    return {"V": V, "Q": Q, "A": Q - V[:, None], "J": float(rho0 @ V), "d": (1 - gamma) * rho0 @ inv}


def surrogate_objective(P, r, pi_old, pi_new, gamma, rho0) -> float:
    """The surrogate
    :math:`L_{old}(\\pi') = J(\\pi_{old}) + \\frac{1}{1-\\gamma}\\sum_s d_{old}(s)\\sum_a \\pi'(a|s) A_{old}(s,a)`:
    the performance-difference identity with the new policy's state distribution replaced by the old one's
    (shapes as in :func:`mdp_quantities`)."""
    _check_mdp(P, r, gamma, rho0, pi_new)
    old = mdp_quantities(P, r, pi_old, gamma, rho0)
    return old["J"] + float(old["d"] @ (pi_new * old["A"]).sum(1)) / (1 - gamma)


def trust_region_bound(P, r, pi_old, pi_new, gamma, rho0) -> dict:
    """The lower bound of Kakade and Langford (2002) in the form of Schulman et al. (2015, TRPO, Theorem 1):
    :math:`J(\\pi') \\ge L_{old}(\\pi') - \\frac{4\\varepsilon\\gamma}{(1-\\gamma)^2}\\alpha^2`, with
    :math:`\\alpha = \\max_s \\mathrm{TV}(\\pi_{old}(\\cdot|s), \\pi'(\\cdot|s))` and
    :math:`\\varepsilon = \\max_{s,a}|A_{old}(s,a)|`.

    ========== ====== ============================================================
    returns    dict   ``J_new``, ``surrogate``, ``bound`` (the right-hand side),
                      ``alpha``, ``max_kl`` (the largest per-state KL(old || new); since
                      TV^2 <= KL the bound also holds with ``max_kl`` for ``alpha**2``)
    ========== ====== ============================================================
    """
    old = mdp_quantities(P, r, pi_old, gamma, rho0)
    L = surrogate_objective(P, r, pi_old, pi_new, gamma, rho0)
    alpha = float(0.5 * np.abs(pi_new - pi_old).sum(1).max())
    eps = float(np.abs(old["A"]).max())
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.where(pi_old > 0, pi_old * np.log(pi_old / pi_new), 0.0).sum(1)
    return {"J_new": mdp_quantities(P, r, pi_new, gamma, rho0)["J"], "surrogate": L,
            "bound": L - 4 * eps * gamma / (1 - gamma) ** 2 * alpha ** 2, "alpha": alpha, "max_kl": float(kl.max())}


def adaptive_kl_beta(beta: float, kl: float, target: float, tolerance: float = 1.5, factor: float = 2.0) -> float:
    """PPO's adaptive KL coefficient (Schulman et al. 2017, sec. 4): after an update whose measured
    KL(pi_old || pi) is ``kl``, halve ``beta`` if ``kl < target / tolerance``, double it if
    ``kl > target * tolerance``, else keep it (the paper's 1.5 and 2, which it says are not sensitive)."""
    if not (beta > 0 and target > 0 and tolerance > 1 and factor > 1) or not np.isfinite(kl) or kl < 0:
        raise ValueError(f"need beta > 0, kl >= 0 finite, target > 0, tolerance > 1, factor > 1; got "
                         f"{beta}, {kl}, {target}, {tolerance}, {factor}")
    if kl < target / tolerance:
        return beta / factor
    if kl > target * tolerance:
        return beta * factor
    return beta


# ---------------------------------------------------------------------- the Trainer experiment
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


def _summary(history: list[dict], base_acc: float, seconds: float) -> dict:
    return {"history": history, "base_accuracy": base_acc, "final_accuracy": history[-1]["eval_greedy_accuracy"],
            "mean_kl": float(np.mean([h.get("ppo_kl", 0.0) for h in history])),
            "max_kl": float(np.max([h.get("ppo_kl", 0.0) for h in history])),
            "mean_clipfrac": float(np.mean([h.get("pg_clipfrac", 0.0) for h in history])), "seconds": seconds}


GAE_ARM = "PPO + GAE, 4 passes"  # GAE advantages with the critic, epsilon 0.2, four passes per batch


def run_ppo_experiment(prof: Profile | None = None, seeds=None, arms=None, with_gae: bool = True,
                       steps: int | None = None, learning_rate: float | None = None) -> dict:
    """Train the addition 'medium' base model under each arm of ``ARMS`` (and :data:`GAE_ARM`, real PPO:
    a critic, GAE, the clip and four passes per batch) for each seed; the arms of one seed share
    prompts until their policies differ. Returns ``{"runs": {seed: {arm: summary}}, "seconds"}``; a
    summary holds the history, base and final greedy accuracy, the mean and max over steps of
    ``ppo_kl`` and the mean clip fraction. ``steps`` and ``learning_rate`` override the profile's (see
    :func:`ppo_config`)."""
    prof = prof or current_profile()
    seeds = list(range(prof.seeds)) if seeds is None else list(seeds)
    arms = ARMS if arms is None else arms
    base, tok = load_base_model("addition", "medium", prof=prof, progress=False)
    start = time.perf_counter()
    runs: dict = {}
    for s in seeds:
        runs[s] = {}
        plan = [(name, ppo_config(prof, eps, mu, s, steps=steps, learning_rate=learning_rate))
                for name, (eps, mu) in arms.items()]
        if with_gae:
            plan.append((GAE_ARM, ppo_config(prof, 0.2, 4, s, estimator="gae", steps=steps,
                                             learning_rate=learning_rate)))
        for name, cfg in plan:
            trainer = Trainer(copy.deepcopy(base), tok, "addition", cfg)
            if not runs[s]:  # the base model's accuracy on this seed's held-out prompts
                base_acc = trainer.evaluate()
            t0 = time.perf_counter()
            history = trainer.train()
            runs[s][name] = _summary(history, base_acc, time.perf_counter() - t0)
    return {"runs": runs, "seconds": time.perf_counter() - start}


LR_GRID = (5e-5, 1e-4, 2e-4)  # the rates the rule chooses from (book profile)
SELECTION_SEEDS = (10, 11, 12)  # seeds (and the held-out prompts they draw) the rule runs on; never 0-2


def choose_ppo_lr(prof: Profile | None = None, grid=None, seeds=None, steps: int | None = None) -> dict:
    """The rule that fixes the experiment's learning rate before the reported runs.

    Run the one-pass arm (GRPO advantages, epsilon 0.2, one pass per batch: the positive control of the
    experiment) at each rate of ``grid`` on the selection ``seeds``, which draw their own prompts and
    held-out prompts, disjoint from the reported seeds 0, 1, ...; take the rate whose mean gain in final
    greedy accuracy over the base model is largest, so that the control has its best chance to show
    that this budget can improve the model. Defaults: the book profile's :data:`LR_GRID` and
    :data:`SELECTION_SEEDS`; the smoke profile tries its own rate on seed 10.

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
                                 with_gae=False, steps=steps, learning_rate=lr)
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
