"""The EVPO chapter's study: PPO, GRPO and EVPO on the multi-prompt bandit of
:func:`rlcourse.methods.evpo.run_evpo_bandit`, with an informative critic and with a noise critic.

The arms are the six (critic, method) pairs, e.g. ``"informative evpo"``; each (arm, seed) cell is one
run of the bandit with its own random generator, so a cell's numbers do not depend on which other cells
ran before it or where. :func:`run_evpo_experiment` runs the grid on the study runner (cached per cell)
and rebuilds the chapter's ``(seeds, steps)`` arrays; :func:`evpo_verdicts` turns the grid into the
verdicts of :data:`CLAIMS`.
"""
from __future__ import annotations

import numpy as np

from ..claims import Claim, Verdict, evaluate
from ..methods.evpo import run_evpo_bandit
from ..profiles import Profile, one_torch_thread
from .runner import Results, Study, run_study

CRITICS = ("informative", "noise")
METHODS = ("ppo", "grpo", "evpo")
ARMS = tuple(f"{critic} {method}" for critic in CRITICS for method in METHODS)
KEYS = ("reward", "adv_var", "var_critic", "var_mean", "ev", "use_critic")  # run_evpo_bandit's per-step logs


def arm_name(critic: str, method: str) -> str:
    """The study's arm for ``method`` with ``critic``, e.g. ``"informative evpo"``."""
    if critic not in CRITICS or method not in METHODS:
        raise ValueError(f"unknown (critic, method) ({critic!r}, {method!r}); critics are {CRITICS}, "
                         f"methods {METHODS}")
    return f"{critic} {method}"


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """One (critic, method) arm on one seed: :func:`~rlcourse.methods.evpo.run_evpo_bandit`'s per-step
    logs as lists (the explained variance is ``None`` on a batch whose rewards do not vary)."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {ARMS}")
    critic, method = arm.split(" ")
    with one_torch_thread():
        log = run_evpo_bandit(method, critic, seed=seed, **sizes)
    return {k: [None if np.isnan(x) else x for x in log[k].tolist()] for k in KEYS}


def evpo_study(prof: Profile) -> Study:
    """Every (critic, method) arm on ``max(prof.toy_seeds, 1 / 8 / 16)`` seeds (smoke / book / full)."""
    sizes = dict(steps=prof.pick(smoke=30, book=200, full=400), n_prompts=200, n_answers=10, prompts_per_step=64,
                 group_size=4, lr=0.1, critic_lr=0.1, critic_init_std=0.5)
    seeds = max(prof.toy_seeds, prof.pick(smoke=1, book=8, full=16))
    return Study(name="evpo", arms=ARMS, seeds=tuple(range(seeds)), run=run_cell, sizes=sizes,
                 verdicts=evpo_verdicts, modules=("rlcourse.methods.evpo", "rlcourse.advantages"))


def stacked(results: Results, arm: str, key: str) -> np.ndarray:
    """``(seeds, steps)`` array of one of :data:`KEYS` for ``arm`` (NaN where the cell logged ``None``)."""
    return np.asarray(results.values(arm, key), dtype=float)


def final_rewards(results: Results, arm: str) -> np.ndarray:
    """``(seeds,)`` expected reward of ``arm``, the mean of the last 10% of steps of each seed."""
    tail = max(1, results.study.sizes["steps"] // 10)
    return stacked(results, arm, "reward")[:, -tail:].mean(1)


def summarise(results: Results) -> dict:
    """The chapter's view of an :func:`evpo_study`'s grid.

    =========  ==================================================================================
    key        meaning
    =========  ==================================================================================
    config     the study's sizes plus ``seeds`` (how many)
    runs       ``{(critic, method): {key: (seeds, steps) array}}`` with the keys of
               :func:`~rlcourse.methods.evpo.run_evpo_bandit`
    summary    ``{(critic, method): dict}``: mean over seeds of the final reward (last 10% of steps)
               and its standard error, of the advantage variance, and the fraction of steps on
               the critic branch
    per_seed   ``{(critic, method): (seeds,) array}`` of :func:`final_rewards`
    seconds    the grid's wall seconds on one core (``cpu_seconds``: its CPU seconds)
    results    the runner's :class:`~rlcourse.studies.runner.Results`
    =========  ==================================================================================
    """
    seeds = len(results.study.seeds)
    tail = max(1, results.study.sizes["steps"] // 10)
    runs = {(c, m): {k: stacked(results, arm_name(c, m), k) for k in KEYS} for c in CRITICS for m in METHODS}
    summary = {key: {"final_reward": float(r["reward"][:, -tail:].mean()),
                     "final_reward_se": float(r["reward"][:, -tail:].mean(1).std(ddof=1) / np.sqrt(seeds))
                     if seeds > 1 else float("nan"),
                     "adv_var": float(r["adv_var"].mean()),
                     "critic_frac": float(r["use_critic"].mean())}
               for key, r in runs.items()}
    per_seed = {(c, m): final_rewards(results, arm_name(c, m)) for c in CRITICS for m in METHODS}
    return {"config": dict(results.study.sizes, seeds=seeds), "runs": runs, "summary": summary,
            "per_seed": per_seed, "seconds": results.wall_seconds, "cpu_seconds": results.cpu_seconds,
            "results": results}


def run_evpo_experiment(prof: Profile, **run_kw) -> dict:
    """The chapter's experiment: :func:`evpo_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`), as :func:`summarise` describes it."""
    return summarise(run_study(evpo_study(prof), **run_kw))


# ---------------------------------------------------------------------- the claims
PAPER = "EVPO (Pan et al., 2026, arXiv:2604.19485)"
SETTING = ("multi-prompt Bernoulli bandit: 200 prompts x 10 answers, tabular softmax policy, 64 prompts x G = 4 "
           "answers per step, advantages whitened over the batch; tabular critic (rate 0.1, initial noise 0.5) "
           "indexed by the prompt (informative) or by a random bucket (noise)")
_OUTPERFORMS = ("EVPO consistently outperforms both PPO and GRPO regardless of which fixed baseline is stronger on "
                "a given task (four tasks: classical control, agentic interaction, mathematical reasoning)")
CLAIMS = {
    "informative": Claim(
        key="evpo/informative", paper=PAPER, source="abstract (arXiv v1)", statement=_OUTPERFORMS,
        setting=SETTING + "; informative critic", metric="expected reward, mean of the last 10% of steps, per seed",
        method="EVPO", baseline="better of PPO and GRPO", kind="greater", margin=0.0, unit="{:.4f}",
        paper_number="not reproduced (the paper's tasks and models)"),
    "noise": Claim(
        key="evpo/noise", paper=PAPER, source="abstract (arXiv v1)", statement=_OUTPERFORMS,
        setting=SETTING + "; noise critic", metric="expected reward, mean of the last 10% of steps, per seed",
        method="EVPO", baseline="better of PPO and GRPO", kind="greater", margin=0.0, unit="{:.4f}",
        paper_number="not reproduced (the paper's tasks and models)"),
    "gate": Claim(
        key="evpo/gate-tracks-critic", paper=PAPER, source="abstract (arXiv v1)",
        statement="the adaptive gating tracks critic maturation over training",
        setting=SETTING + "; informative critic that starts noisy",
        metric="fraction of EVPO's steps on the critic branch, last 50 steps (method) vs first 10 (baseline)",
        method="late critic fraction", baseline="early critic fraction", kind="greater", margin=0.5,
        unit="{:.2f}", paper_number="qualitative"),
}


def evpo_verdicts(results: Results) -> dict[str, Verdict]:
    """Evaluate :data:`CLAIMS` on an :func:`evpo_study`'s grid.

    The "better of PPO and GRPO" is the arm with the higher mean over seeds in that setting, chosen
    from the run and then paired with EVPO seed by seed.
    """
    s = results.wall_seconds
    verdicts = {}
    for critic in CRITICS:
        ps = {m: final_rewards(results, arm_name(critic, m)) for m in METHODS}
        best = max(("ppo", "grpo"), key=lambda m: float(ps[m].mean()))
        verdicts[critic] = evaluate(CLAIMS[critic], ps["evpo"], ps[best], seconds=s, better_arm=best)
    use = stacked(results, arm_name("informative", "evpo"), "use_critic")
    verdicts["gate"] = evaluate(CLAIMS["gate"], use[:, -50:].mean(1), use[:, :10].mean(1), seconds=s)
    return verdicts
