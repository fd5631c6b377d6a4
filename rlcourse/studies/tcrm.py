"""TCRM's experiments: the reward models on walk pairs, PPO with a separate or a unified critic, and their sizes
(the method's losses and loop parts are in :mod:`rlcourse.methods.tcrm`).
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from ..lm.heads import ScalarHeadModel
from ..lm.sampling import sample
from ..lm.tokenizer import build_tokenizer
from ..methods.tcrm import (  # noqa: F401
    DyckWalk, REWARD_MODELS, WALK_LENGTH, final_accuracy, first_dip, first_error_f1, middle_columns,
    middle_token_accuracy, new_reward_model, oracle_scores, pair_target, pair_target_scores,
    parse_prompt, rm_sizes, sample_walks, test_prompts, tiny_lm, train_tcrm, use_reward_model,
    value_r2, walk_pairs, walk_scores, walk_truth,
)
from ..profiles import Profile, profile as current_profile


# ---------------------------------------------------------------------------------------- experiment
def rm_data(prof: Profile, seed: int) -> dict:
    """Train pairs, held-out pairs, and calibration/test walks for the reward-model experiment."""
    s, task, rng = rm_sizes(prof), DyckWalk(), np.random.default_rng([2604_22981, seed])
    train_ex = task.examples(2000, seed=seed, split="train")
    test_ex = test_prompts()
    pairs = walk_pairs(train_ex, s["train_pairs"], rng)
    test_pairs = walk_pairs(test_ex, s["test_pairs"], rng)
    cal_ex = [train_ex[int(i)] for i in rng.integers(len(train_ex), size=s["test_walks"])]
    tst_ex = [test_ex[int(i)] for i in rng.integers(len(test_ex), size=s["test_walks"])]
    return dict(pairs=pairs, test_pairs=test_pairs, cal=(cal_ex, sample_walks([e.prompt for e in cal_ex], rng)),
                test=(tst_ex, sample_walks([e.prompt for e in tst_ex], rng)))


def score_all(scorer, data: dict) -> dict:
    """The three metrics of a scorer ``(examples, walks) -> (values, masks)`` on ``data``."""
    tp = data["test_pairs"]
    exs = [p[0] for p in tp]
    vp, mp = scorer(exs, [p[1] for p in tp])
    vn, mn = scorer(exs, [p[2] for p in tp])
    cols = middle_columns(exs)
    # pairs whose dispreferred walk has already gone below zero by the middle column
    decided = np.array([first_dip(parse_prompt(e.prompt)[0], parse_prompt(e.prompt)[1] + neg[:c]) is not None
                        for e, neg, c in zip(exs, [p[2] for p in tp], cols)])
    out = {"middle_acc": middle_token_accuracy(vp, vn, cols), "final_acc": final_accuracy(vp, mp, vn, mn),
           "middle_acc_decided": middle_token_accuracy(vp[decided], vn[decided], cols[decided]) if decided.any()
           else float("nan"), "decided_share": float(decided.mean())}
    sets = {}
    for name in ("cal", "test"):
        e, w = data[name]
        v, _ = scorer(e, w)
        steps, truth = walk_truth(e, w)
        sets[name] = (v, steps, truth)
    out["f1"], out["tau"] = first_error_f1(sets["cal"], sets["test"])
    e, w = data["test"]
    exact = oracle_scores(e, w)[0]
    out["value_r2"] = value_r2(sets["test"][0], exact, sets["test"][1])
    out["target_r2"] = value_r2(sets["test"][0], pair_target(exact), sets["test"][1])
    return out


def rm_experiment(prof: Profile | None = None, seeds: int | None = None) -> dict:
    """BT-only against TCRM (BT + MC + TD) on walk pairs over seeds, with the exact value function
    (``oracle``) and the regularisers' pair-data target (``pair target``, :func:`pair_target`) as
    ceilings. Returns per-arm lists of metrics, one per seed, the models of seed 0, and times."""
    prof = prof or current_profile()
    s = rm_sizes(prof)
    seeds = s["seeds"] if seeds is None else seeds
    tok = build_tokenizer()
    arms = {"BT": (0.0, 0.0), "TCRM": (s["lam_mc"], s["lam_td"])}
    res = {a: [] for a in arms} | {"oracle": [], "pair target": []}
    models, logs, t0 = {}, {}, time.perf_counter()
    for seed in range(seeds):
        data = rm_data(prof, seed)
        res["oracle"].append(score_all(oracle_scores, data))
        res["pair target"].append(score_all(pair_target_scores, data))
        for arm, (lm, lt) in arms.items():
            torch.manual_seed(seed)
            rm = new_reward_model(tok, prof, seed)
            log = train_tcrm(rm, tok, data["pairs"], s["rm_steps"], s["rm_batch"], s["rm_lr"], lm, lt, seed=seed)
            res[arm].append(score_all(lambda e, w: walk_scores(rm, tok, e, w), data))
            if seed == 0:
                models[arm], logs[arm] = rm, log
    return dict(metrics=res, models=models, logs=logs, tokenizer=tok, seconds=time.perf_counter() - t0,
                sizes=s, data0=rm_data(prof, 0))


# ---------------------------------------------------------------------------------------- PPO experiment
def data_policy(tokenizer, prof: Profile, seed: int = 0):
    """A tiny LM fitted by SFT to the data policy :math:`\\mu` (fair-coin walks of the right length):
    the policy PPO starts from, and the policy TCRM's values are values of."""
    from ..train import sft

    s, rng = rm_sizes(prof), np.random.default_rng([7, seed])
    model = tiny_lm(tokenizer, prof, seed)
    exs = DyckWalk().examples(4000, seed=seed, split="train")
    demos = [dataclasses.replace(e, solution=w) for e, w in zip(exs, sample_walks([e.prompt for e in exs], rng))]
    sft(model, tokenizer, demos, steps=s["policy_sft_steps"], batch_size=64, lr=3e-3, seed=seed)
    return model


def validity(model, tokenizer, examples, generator) -> float:
    """Share of sampled walks (temperature 1) that are well formed and stay non-negative."""
    b = sample(model, tokenizer, [e.prompt for e in examples], max_new_tokens=WALK_LENGTH + 1, generator=generator)
    return float(DyckWalk().rewards(b.texts, examples).mean())


def state_bytes(trainer) -> dict:
    """Bytes of the model state a PPO step keeps: parameters of every model it holds (policy, critic,
    reward models in use), gradients of the trainable ones, and optimiser moments."""
    models = [trainer.model] + ([trainer.value_model] if trainer.value_model is not None else [])
    name = (trainer.config.reward_kwargs.get("reward_model") or trainer.config.advantage_kwargs.get("reward_model"))
    if name in REWARD_MODELS:
        models.append(REWARD_MODELS[name])
    params = {id(p): p for m in models for p in m.parameters()}
    weights = sum(p.numel() * p.element_size() for p in params.values())
    grads = sum(p.numel() * p.element_size() for p in params.values() if p.requires_grad)
    opt = 0
    for o in (trainer.optimizer, trainer.critic_optimizer):
        if o is not None:
            opt += sum(v.numel() * v.element_size() for st in o.state.values() for v in st.values()
                       if torch.is_tensor(v) and v.ndim > 0)
    return {"weights": weights, "grads": grads, "optimizer": opt, "total": weights + grads + opt}


def ppo_experiment(rm: ScalarHeadModel, tokenizer, prof: Profile | None = None, seeds: int | None = None) -> dict:
    """PPO from the data policy with a TCRM reward, two ways: a separate critic (``gae``, a critic
    initialised from the reward model, as is usual in RLHF, and trained) and the unified model
    (``tcrm_gae``: the reward model's own values, frozen). Returns per arm and seed: the true validity
    curve, median step time, state bytes."""
    from ..train import RLConfig, Trainer

    prof = prof or current_profile()
    s = rm_sizes(prof)
    seeds = s["seeds"] if seeds is None else seeds
    name = use_reward_model("tcrm_ppo", rm)
    base = data_policy(tokenizer, prof)
    task = DyckWalk()
    held = task.examples(s["ppo_eval_walks"], seed=1, split="train")
    arms = {"separate critic": dict(advantage_estimator="gae"),
            "unified": dict(advantage_estimator="tcrm_gae", advantage_kwargs={"reward_model": name})}
    out = {a: [] for a in arms}
    base_validity = validity(base, tokenizer, held, torch.Generator().manual_seed(99))
    t0 = time.perf_counter()
    for seed in range(seeds):
        for arm, parts in arms.items():
            import copy
            cfg = RLConfig(num_generations=s["ppo_generations"], prompts_per_step=s["ppo_prompts"],
                           max_completion_length=WALK_LENGTH + 1, steps=s["ppo_steps"], learning_rate=s["ppo_lr"],
                           reward="tcrm_score", reward_kwargs={"reward_model": name}, whiten_advantages=True,
                           progress=False, seed=seed, lam=0.95, **parts)
            critic = None
            if arm == "separate critic":
                critic = copy.deepcopy(rm)
                critic.requires_grad_(True)
            tr = Trainer(copy.deepcopy(base), tokenizer, task, cfg, eval_examples=test_prompts(), value_model=critic)
            curve = [(0, base_validity)]
            while tr.step_count < cfg.steps:
                tr.train(min(cfg.steps, tr.step_count + s["ppo_eval_every"]))
                curve.append((tr.step_count, validity(tr.model, tokenizer, held,
                                                      torch.Generator().manual_seed(1000 + tr.step_count))))
            st = [h["step_seconds"] for h in tr.history]
            out[arm].append({"curve": curve, "final_validity": curve[-1][1],
                             "step_seconds": float(np.median(st[1:] if len(st) > 1 else st)),
                             "update_seconds": float(np.median([h["time_update"] for h in tr.history])),
                             "bytes": state_bytes(tr), "rm_score": [h["reward"] for h in tr.history]})
    return dict(runs=out, base_validity=base_validity, seconds=time.perf_counter() - t0, sizes=s)
