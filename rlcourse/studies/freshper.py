"""The FreshPER chapter's studies: replay arms on FrozenLake (:func:`rlcourse.methods.freshper.train_lake`),
a sweep of the age decay ``tau``, and the registered ``"replay"`` sampler in the language-model loop;
then the paper's claims and their verdicts on the grids.

The lake's arms are the names of an arm table (default ``rlcourse.methods.freshper.ARMS``), whose
entries travel in the study's sizes with the :class:`~rlcourse.methods.freshper.LakeConfig`; the seeds
are the maps ``0 .. n-1`` (the profile's ``toy_seeds``). One cell trains one policy on one map from its
own seeded generator (:func:`run_cell`), so a cell's numbers do not depend on which cells ran before it.
:func:`run_lake_experiment` and :func:`run_tau_sweep` run the grid on the study runner (cached per
cell) and rebuild the dict the chapter reads; :func:`lake_verdicts` evaluates :data:`CLAIMS` on it.
The language-model grid (:func:`lm_study`) loads the profile's base model in every cell.
"""
from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np

from ..claims import Claim, Verdict, evaluate
from ..methods.freshper import ARMS, LakeConfig, train_lake
from ..profiles import Profile, one_torch_thread
from .runner import Results, Study, run_study

MODULES = ("rlcourse.methods.freshper", "rlcourse.replay", "rlcourse.envs.frozenlake")
LAKE_METRICS = ("ess", "replay_weight", "success_weight", "replayed_success")  # per-draw means, NaN without draws


# ---------------------------------------------------------------------- the lake
def stale_after(cfg: LakeConfig) -> int:
    """A replay draw older than this many steps (a third of training) counts as stale."""
    return max(1, cfg.steps // 3)


def lake_config(sizes: dict) -> LakeConfig:
    """The :class:`~rlcourse.methods.freshper.LakeConfig` stored in a lake study's sizes."""
    c = dict(sizes["config"])
    c["beta"] = None if c["beta"] is None else tuple(c["beta"])
    return LakeConfig(**c)


def lake_arm(arm: str, sizes: dict) -> tuple:
    """The arm ``(priority, tau, replayed, refresh)`` named ``arm`` in a lake study's sizes."""
    if arm not in sizes["arms"]:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(sizes['arms'])}")
    return tuple(sizes["arms"][arm])


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train arm ``arm`` on map ``seed`` (:func:`rlcourse.methods.freshper.train_lake`, one torch thread).

    ================  ==========  ==============================================================
    success           ``(T,)``    exact success after each of the ``T`` steps
    stale             scalar      share of replay draws older than :func:`stale_after` steps
    ess, ...          ``(D,)``    per draw step (none on-policy): the metrics of :data:`LAKE_METRICS`
    ================  ==========  ==============================================================
    """
    spec, cfg = lake_arm(arm, sizes), lake_config(sizes)
    with one_torch_thread():
        r = train_lake(spec, cfg, seed)
    stale = (r["ages"] > stale_after(cfg)).mean() if r["ages"].size else 0.0
    return {"success": r["success"].tolist(), "stale": float(stale), **{k: r[k].tolist() for k in LAKE_METRICS}}


def lake_study(P: Profile, arms: dict | None = None, cfg: LakeConfig | None = None, seeds: int | None = None,
               name: str = "freshper-lake") -> Study:
    """The lake's grid: every arm of ``arms`` (default ``rlcourse.methods.freshper.ARMS``) on maps
    ``0 .. n-1`` (``n`` = ``seeds`` or ``P.toy_seeds``), with ``cfg`` (default: the profile's steps)."""
    cfg = cfg or LakeConfig(steps=P.pick(smoke=30, book=150))
    arms = arms or ARMS
    config = asdict(cfg)
    config["beta"] = None if cfg.beta is None else list(cfg.beta)
    sizes = {"config": config, "arms": {k: list(v) for k, v in arms.items()}}
    return Study(name=name, arms=tuple(arms), seeds=tuple(range(seeds or P.toy_seeds)), run=run_cell, sizes=sizes,
                 verdicts=verdicts, modules=MODULES)


def lake_output(results: Results) -> dict:
    """The chapter's dict from a :func:`lake_study`'s results (``N`` maps, ``T`` steps).

    ==================  ==========  ===========================================================
    curves[arm]         ``(N, T)``  exact success
    auc[arm]            ``(N,)``    mean success over training (sample efficiency)
    final[arm]          ``(N,)``    mean success over the last fifth
    post[arm]           ``(N,)``    mean success from ``switch_at`` on (only with a map switch)
    stale[arm]          ``(N,)``    share of replay draws older than ``stale_after`` steps
    ess[arm], ...       ``(N,)``    mean of each of :data:`LAKE_METRICS` (NaN without draws)
    config, arms        ...         the :class:`LakeConfig` and the arm table
    seeds, stale_after  int         number of maps, staleness threshold
    seconds             float       wall seconds of the grid's cells
    ==================  ==========  ===========================================================
    """
    study = results.study
    cfg = lake_config(study.sizes)
    res = {k: {} for k in ("curves", "auc", "final", "post", "stale", *LAKE_METRICS)}
    for name in study.arms:
        curves = np.array(results.values(name, "success"), dtype=float)
        res["curves"][name] = curves
        res["auc"][name] = curves.mean(1)
        res["final"][name] = curves[:, -max(1, cfg.steps // 5):].mean(1)
        if cfg.switch_at is not None:  # success on the second map only
            res["post"][name] = curves[:, cfg.switch_at - 1:].mean(1)
        res["stale"][name] = np.array(results.values(name, "stale"), dtype=float)
        for key in LAKE_METRICS:
            res[key][name] = np.array([np.asarray(x, dtype=float).mean() if len(x) else np.nan
                                       for x in results.values(name, key)])
    res.update(config=cfg, arms={k: tuple(v) for k, v in study.sizes["arms"].items()}, seeds=len(study.seeds),
               stale_after=stale_after(cfg), seconds=results.wall_seconds)
    return res


def run_lake_experiment(P: Profile, arms: dict | None = None, cfg: LakeConfig | None = None,
                        seeds: int | None = None, **run_kw) -> dict:
    """Every arm on maps ``0 .. n-1``: :func:`lake_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`), as :func:`lake_output`'s dict."""
    return lake_output(run_study(lake_study(P, arms, cfg, seeds), **run_kw))


def tau_arms(taus) -> dict:
    """FreshPER at each ``tau``: ``{"tau=<t>": ("reward", t, None, True)}``."""
    return {f"tau={t:g}": ("reward", t, None, True) for t in taus}


def run_tau_sweep(P: Profile, taus=None, cfg: LakeConfig | None = None, seeds: int | None = None, **run_kw) -> dict:
    """FreshPER at several ``tau`` (default: the profile's): :func:`lake_output`'s dict plus ``taus``."""
    taus = tuple(taus or P.pick(smoke=(5.0, 25.0), book=(3.0, 10.0, 25.0, 100.0, 400.0)))
    out = lake_output(run_study(lake_study(P, tau_arms(taus), cfg, seeds, name="freshper-tau"), **run_kw))
    out["taus"] = taus
    return out


# ---------------------------------------------------------------------- the language-model loop
LM_ARMS = {  # name -> RLConfig overrides; both arms sample the same fresh groups per step
    "on-policy": dict(sampler="policy", policy_loss="vanilla"),
    "FreshPER": dict(sampler="replay", policy_loss="ppo_is",
                     sampler_kwargs=dict(replay_groups=8, capacity=512, tau=10.0, priority="advantage", beta=0.0)),
}


def run_lm_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train the profile's ``addition`` base model with arm ``arm`` of :data:`LM_ARMS` from ``seed``:
    its per-step ``history``, final greedy ``accuracy`` and final replay ``buffer`` size."""
    import copy

    from ..lm.zoo import load_base_model
    from ..train import RLConfig, Trainer

    if arm not in LM_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(LM_ARMS)}")
    prof = Profile(**sizes["profile"])
    with one_torch_thread():
        model, tok = load_base_model("addition", prof=prof, progress=False)
        cfg = RLConfig(num_generations=sizes["num_generations"], prompts_per_step=sizes["prompts_per_step"],
                       max_completion_length=8, steps=sizes["steps"], learning_rate=sizes["lr"], seed=seed,
                       eval_prompts=sizes["eval_prompts"], progress=False, **copy.deepcopy(LM_ARMS[arm]))
        tr = Trainer(model, tok, "addition", cfg)
        tr.train()
        return {"history": tr.history, "accuracy": float(tr.evaluate()),
                "buffer": len(tr.state["replay_buffer"]) if "replay_buffer" in tr.state else 0}


def lm_study(P: Profile, seeds: int | None = None, steps: int | None = None) -> Study:
    """The language-model grid: :data:`LM_ARMS` on ``seeds`` (default ``P.seeds``) seeds."""
    sizes = {"profile": P.as_dict(), "steps": steps or P.pick(smoke=3, book=25), "lr": P.rl_lr,
             "num_generations": P.pick(smoke=4, book=8), "prompts_per_step": P.pick(smoke=2, book=8),
             "eval_prompts": P.pick(smoke=8, book=128)}
    return Study(name="freshper-lm", arms=tuple(LM_ARMS), seeds=tuple(range(seeds or P.seeds)), run=run_lm_cell,
                 sizes=sizes, modules=("rlcourse.methods.freshper", "rlcourse.replay", "rlcourse.train"))


def run_lm_experiment(P: Profile, seeds: int | None = None, steps: int | None = None, **run_kw) -> dict:
    """The registered ``"replay"`` sampler in the :class:`~rlcourse.train.Trainer` on the lab's
    two-digit addition (the profile's base model): on-policy GRPO against GRPO plus 8 replayed groups
    per step (priority: mean ``|A|`` of the group, ``tau = 10``, no PER weights, ``beta = 0``, as the
    authors' buffer defaults to), 8 prompts x 8 samples fresh per step in both arms, ``P.seeds`` seeds:
    :func:`lm_study` on the study runner.

    Returns ``history[arm]`` (a list of per-seed metric histories), ``accuracy[arm]`` ``(seeds,)``
    final greedy accuracy on ``eval_prompts`` held-out prompts, ``buffer[arm]`` the final buffer size,
    ``seconds``."""
    results = run_study(lm_study(P, seeds, steps), **run_kw)
    study, sz = results.study, results.study.sizes
    out = {"history": {}, "accuracy": {}, "buffer": {}}
    for arm in study.arms:
        out["history"][arm] = results.values(arm, "history")
        out["accuracy"][arm] = np.array(results.values(arm, "accuracy"))
        out["buffer"][arm] = results.values(arm, "buffer")
    out.update(seeds=len(study.seeds), steps=sz["steps"], eval_prompts=sz["eval_prompts"], seconds=results.wall_seconds)
    return out


# ---------------------------------------------------------------------- the claims
PAPER = ("Freshness-Aware Prioritized Experience Replay for LLM/VLM Reinforcement Learning, W. Ma, Y. Zeng, "
         "Y. Song, X. Cui, J. Zhao, X. Liu, M. Elhoseiny (2026, arXiv:2604.16918)")


def setting(cfg: LakeConfig, seeds: int) -> str:
    """The setting of the lake's claims for ``cfg`` on ``seeds`` maps."""
    return (f"tabular softmax policy on {seeds} random solvable {cfg.size}x{cfg.size} deterministic FrozenLake maps "
            f"(Gymnasium's dynamics, horizon {cfg.max_turns}); {cfg.episodes} fresh episodes per step for every arm, "
            f"{cfg.replay} replayed trajectories per step; REINFORCE++-style batch-normalised returns, PPO clip "
            f"{cfg.clip}, one Adam step (lr {cfg.lr}) per step, {cfg.steps} steps; alpha {cfg.alpha}; "
            + ("no IS weights (the authors' default)" if cfg.beta is None else
               f"IS weights, beta {cfg.beta[0]}->{cfg.beta[1]}") + "; PER = the authors' standard PER (new items "
            "at the maximum priority until sampled)")


AUC = "exact success probability averaged over training steps (equal fresh episodes)"
# short name -> (statement, source, paper's number, method, baseline, kind, metric)
CLAIMS = {
    "beats-on-policy": ("Freshness-Aware PER significantly outperforms on-policy baselines", "abstract",
                        "FrozenLake success 0.305 vs 0.297 (LLM), 0.630 vs 0.270 (VLM) (authors' README)",
                        "FreshPER", "on-policy", "greater", AUC),
    "per-degrades": ("standard PER without age decay consistently degrades performance", "abstract",
                     "FrozenLake (LLM) 0.281 vs 0.297 on-policy (authors' README)", "PER", "on-policy", "less", AUC),
    "decay-beats-per": ("the multiplicative exponential age decay addresses PER's priority staleness", "abstract",
                        "FrozenLake (LLM) 0.305 vs 0.281 (authors' README)", "FreshPER", "PER", "greater", AUC),
    "decay-cuts-staleness": ("without decay, old high-priority trajectories dominate sampling long after they have "
                             "become uninformative", "abstract", "", "FreshPER", "PER", "less",
                             "share of replay draws older than a third of training"),
    "replay-can-help": ("positive control: replay can beat on-policy training on this testbed at equal fresh "
                        "episodes (our control, not a claim of the paper)", "ours", "", "PER", "on-policy",
                        "greater", AUC),
}


CONTROLLED = ("beats-on-policy",)  # claims that rest on the positive control "replay-can-help"


def claim(name: str, cfg: LakeConfig, seeds: int, note: str = "") -> Claim:
    """The claim ``name`` of :data:`CLAIMS` in the setting ``cfg`` (``note`` says what differs)."""
    statement, source, number, method, baseline, kind, metric = CLAIMS[name]
    suffix = f"-{note.split()[0]}" if note else ""  # a variant's claims get keys of their own
    role = "positive control" if name == "replay-can-help" else "paper claim"
    control = f"freshper/lake-replay-can-help{suffix}" if name in CONTROLLED else None
    return Claim(key=f"freshper/lake-{name}{suffix}", paper=PAPER,
                 statement=statement, source=source, paper_number=number, method=method, baseline=baseline,
                 kind=kind, metric=metric, setting=setting(cfg, seeds) + (f"; {note}" if note else ""),
                 role=role, control=control)


def lake_verdicts(out: dict, names=("replay-can-help", "beats-on-policy", "per-degrades", "decay-beats-per",
                                   "decay-cuts-staleness"), note: str = "") -> dict[str, Verdict]:
    """Evaluate the claims ``names`` on the output of :func:`run_lake_experiment` (with a map switch,
    success is measured on the second map only, and the claim's metric says so). A claim that rests on
    the positive control (:data:`CONTROLLED`) gets its verdict, which is evaluated first."""
    verdicts = {}
    post = out["config"].switch_at is not None
    if any(n in CONTROLLED for n in names) and "replay-can-help" not in names:
        raise ValueError(f"{[n for n in names if n in CONTROLLED]} rest on the positive control 'replay-can-help': "
                         "evaluate it too")
    names = sorted(names, key=lambda n: n != "replay-can-help")
    for name in names:
        c = claim(name, out["config"], out["seeds"], note)
        if post and name != "decay-cuts-staleness":
            c = replace(c, metric=f"exact success on the second map, averaged over steps {out['config'].switch_at}"
                                  f"-{out['config'].steps}")
        values = out["stale"] if name == "decay-cuts-staleness" else out["post"] if post else out["auc"]
        kw = {"control": verdicts["replay-can-help"]} if c.control else {}
        verdicts[name] = evaluate(c, values[c.method], values[c.baseline], seconds=out["seconds"], **kw)
    return verdicts


LM_CLAIM = Claim(
    key="freshper/lm-beats-on-policy", paper=PAPER, source="abstract", kind="greater",
    statement="Freshness-Aware PER significantly outperforms on-policy baselines",
    paper_number="+46% NQ Search, +367% Sokoban, +133% VLM FrozenLake (abstract)",
    setting="the lab's tiny Llama on two-digit addition, 8 prompts x 8 samples fresh per step in both arms, "
            "25 GRPO steps (lr 1e-4), FreshPER adds 8 replayed groups per step (tau 10, priority mean |A|, "
            "no PER importance weights, beta 0, the authors' default)",
    metric="greedy accuracy on 128 held-out prompts after training", method="FreshPER", baseline="on-policy")


def lm_verdict(out: dict) -> Verdict:
    """:data:`LM_CLAIM` (whose setting and metric are the book profile's) evaluated on
    :func:`run_lm_experiment`'s output, with the run's own number of steps and held-out prompts."""
    c = replace(LM_CLAIM, setting=LM_CLAIM.setting.replace("25 GRPO steps", f"{out['steps']} GRPO steps"),
                metric=LM_CLAIM.metric.replace("128", str(out["eval_prompts"])))
    return evaluate(c, out["accuracy"]["FreshPER"], out["accuracy"]["on-policy"], seconds=out["seconds"])


def verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`lake_verdicts` (every claim) on a :func:`lake_study`'s results."""
    return lake_verdicts(lake_output(results))
