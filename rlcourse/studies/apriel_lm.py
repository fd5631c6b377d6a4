"""Apriel-Reasoner's language-model run as a study on the one runner: static and adaptive domain sampling on
``apriel_mix`` from one base model (:func:`mix_study`, one cell per arm and seed, each loading the base model
itself); :func:`mix_experiment` rebuilds the dict the chapter reads.
"""
from __future__ import annotations

import copy

import numpy as np

from ..methods.apriel import STATE_KEY, check_targets
from ..profiles import Profile
from .runner import Study, run_study

MIX_ARMS = ("static", "adaptive")
MIX_KEYS = ("sampled", "completed", "usable", "correct", "tokens", "targets", "response_length")  # arrays


def mix_run(adaptive: bool, seed: int, base, steps: int, prompts: int, G: int, lr: float,
            max_completion_length: int = 9, gamma: float = 0.1) -> dict:
    """RL on ``apriel_mix`` from the base ``(model, tokenizer)`` with the difficulty-aware length reward
    and the adaptive (or static) domain sampler. Returns the per-step outcomes recorded in
    ``state['apriel']`` as arrays ``(steps, D)`` (``sampled``, ``completed``, ``usable``, ``correct``,
    ``tokens``), the sampler's log, the domains and the targets."""
    from ..train import RLConfig, Trainer

    model, tok = base
    cfg = RLConfig(prompt_sampler="apriel_domains" if adaptive else "apriel_domains_static", reward="apriel_length",
                   reward_kwargs={"gamma": gamma}, scale_rewards="none", num_generations=G, prompts_per_step=prompts,
                   max_completion_length=max_completion_length, steps=steps, learning_rate=lr, seed=seed,
                   progress=False, train_pool_size=2000)
    trainer = Trainer(copy.deepcopy(model), tok, "apriel_mix", cfg, eval_examples=[])
    trainer.train()
    st = trainer.state[STATE_KEY]
    keys = ("sampled", "completed", "usable", "correct", "tokens")
    out = {k: np.array([st["outcomes"][s][k] for s in sorted(st["outcomes"])]) for k in keys}
    out.update(domains=st["domains"], targets=np.array(st["targets"]), log=st["log"],
               response_length=np.array([h["response_length"] for h in trainer.history]))
    return out


def share_deviation(usable, targets, start: int = 0) -> float:
    """``max_d |s_d - w_d|`` for the shares ``s`` of usable rollouts summed over steps ``start..``
    (1.0, the largest possible error, when those steps yielded no usable rollout).

    ======== ========== ==================================
    usable   ``(S, D)`` usable rollouts per step and domain
    targets  ``(D,)``   target shares
    ======== ========== ==================================
    """
    u = np.asarray(usable, float)[start:].sum(0)
    w = check_targets(targets)
    if u.shape != w.shape:
        raise ValueError(f"usable has {u.shape[0] if u.ndim else 0} domains, targets {len(w)}")
    if u.sum() <= 0:  # no usable rollout at all delivers none of the targets: the worst case, 1
        return 1.0
    return float(np.abs(u / u.sum() - w).max())


def _base(prof: Profile):
    from ..lm.zoo import load_base_model

    return load_base_model("apriel_mix", 0.5, prof=prof, progress=False)


def run_mix_cell(arm: str, seed: int, sizes: dict) -> dict:
    """:func:`mix_run` with the static or adaptive sampler (``arm``, one of :data:`MIX_ARMS`) from ``seed``,
    from the base model of the profile ``sizes["profile"]``; its arrays (:data:`MIX_KEYS`) as lists."""
    from ..profiles import one_torch_thread

    if arm not in MIX_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {MIX_ARMS}")
    prof = Profile(**sizes["profile"])
    with one_torch_thread():
        out = mix_run(arm == "adaptive", seed, _base(prof), sizes["steps"], prompts=prof.rl_prompts,
                      G=prof.num_generations, lr=prof.rl_lr)
    return {k: v.tolist() if k in MIX_KEYS else v for k, v in out.items()}


def mix_study(prof: Profile, seeds=None) -> Study:
    """Static and adaptive sampling on ``seeds`` (default ``range(prof.seeds)``), the profile's steps."""
    seeds = tuple(range(prof.seeds)) if seeds is None else tuple(seeds)
    return Study(name="apriel-mix", arms=MIX_ARMS, seeds=seeds, run=run_mix_cell,
                 sizes={"profile": prof.as_dict(), "steps": prof.pick(smoke=3, book=60)},
                 modules=("rlcourse.methods.apriel", "rlcourse.train", "rlcourse.lm.zoo"))


def mix_experiment(prof, seeds=None, start: int | None = None, **run_kw) -> dict:
    """The chapter's language-model run: static and adaptive sampling on ``apriel_mix`` for each seed
    (sizes from the profile ``prof``; the base model is ``load_base_model("apriel_mix", 0.5)``), as
    :func:`mix_study` on the study runner (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`).
    Returns ``runs[arm]`` (lists of :func:`mix_run` outputs), ``deviation[arm]`` (per seed, shares of
    usable rollouts over steps ``start..``), the base model's pre-training record and the seconds."""
    base = _base(prof)  # built once here, before any cell loads it
    study = mix_study(prof, seeds)
    res = run_study(study, **run_kw)
    start = prof.pick(smoke=0, book=10) if start is None else start
    runs = {arm: [{k: np.array(v) if k in MIX_KEYS else v for k, v in res.metrics[(arm, s)].items()}
                  for s in study.seeds] for arm in MIX_ARMS}
    dev = {arm: [share_deviation(r["usable"], r["targets"], start) for r in rs] for arm, rs in runs.items()}
    return {"runs": runs, "deviation": dev, "start": start, "steps": study.sizes["steps"],
            "seeds": list(study.seeds), "base": getattr(base[0].config, "rlcourse_pretrain", {}),
            "seconds": res.wall_seconds}
