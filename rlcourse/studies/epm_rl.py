"""EPM-RL's experiment: the base model, the SFT and RL stages, the arms, controls and claims (the task, rewards
and checked math are in :mod:`rlcourse.methods.epm_rl`). The grid of noise levels and seeds is a study on
the one runner (:func:`study`, one cell per noise level and seed: :func:`run_cell`).
"""
from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import replace
from typing import Sequence

import numpy as np
import torch

from ..claims import Claim, evaluate
from ..lm.model import build_model
from ..lm.sampling import sample
from ..lm.tokenizer import build_tokenizer
from ..methods.epm_rl import (PAPER, ProductPairs, reward_parts)  # noqa: F401
from ..profiles import Profile, cache_dir, one_torch_thread, profile as current_profile
from ..tasks import Example
from .runner import Study, run_study


# ---------------------------------------------------------------------- the experiment
def sizes(prof: Profile | None = None) -> dict:
    """Every size of the experiment, from the profile (fixed before the reported run)."""
    prof = prof or current_profile()
    lm = replace(prof, lm_hidden=prof.pick(smoke=32, book=64), lm_intermediate=prof.pick(smoke=64, book=192),
                 lm_layers=prof.pick(smoke=1, book=2), lm_heads=prof.pick(smoke=2, book=4), lm_max_positions=96)
    return dict(lm=lm, base_steps=prof.pick(smoke=20, book=500), base_lr=2e-3, lora_r=8, lora_alpha=16,
                sft_steps=prof.pick(smoke=4, book=100), sft_batch=prof.pick(smoke=8, book=32), sft_lr=3e-3,
                full_lr=1e-3, control_sft_steps=prof.pick(smoke=2, book=10), control_seed_offset=10, deficit=1.0,
                rl_steps=prof.pick(smoke=2, book=80), prompts=prof.pick(smoke=2, book=8),
                G=prof.pick(smoke=4, book=8), rl_lr=3e-4, noises=(0.2, 0.7),
                eval_prompts=prof.pick(smoke=16, book=256), weights={"w_format": 0.2, "w_label": 1.0, "w_judge": 0.5})


def load_base(prof: Profile | None = None, seed: int = 0, progress: bool = False):
    """The "general" base: the tiny LM fully fine-tuned on clean (noise 0) pairs with rationales,
    before it meets promotional noise. Deterministic for ``seed``; cached (``epm_rl/``)."""
    from ..lm.zoo import cached_model
    from ..train import sft

    prof = prof or current_profile()
    S = sizes(prof)
    recipe = {"v": 1, "lm": S["lm"].as_dict(), "steps": S["base_steps"], "lr": S["base_lr"], "seed": seed}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / "epm_rl" / f"base-{prof.name}-seed{seed}-{digest}"

    def build():
        tok = build_tokenizer()
        model = build_model(tok, S["lm"], seed=seed)
        pool = ProductPairs(0.0).examples(20000, seed=seed, split="train")
        with one_torch_thread():
            sft(model, tok, pool, steps=S["base_steps"], batch_size=64, lr=S["base_lr"], seed=seed, progress=progress)
        return model, tok

    return cached_model(path, build)


@torch.no_grad()
def measure(model, tokenizer, examples: Sequence[Example]) -> dict:
    """Greedy decoding on held-out pairs: balanced accuracy (mean of the recall on matches and on
    non-matches), faithfulness (share with judge score 1), format rate, and tokens per pair."""
    with one_torch_thread():
        batch = sample(model, tokenizer, [e.prompt for e in examples], temperature=0.0, max_new_tokens=16)
    parts = reward_parts(batch.texts, examples)
    y = np.array([e.answer == "Y" for e in examples])
    lab = parts["label"].numpy()
    recall = [float(lab[y].mean()) if y.any() else 0.0, float(lab[~y].mean()) if (~y).any() else 0.0]
    return {"accuracy": float(np.mean(recall)), "faithful": float((parts["judge"] == 1).float().mean()),
            "format": float(parts["format"].mean()), "label_acc": float(lab.mean()),
            "infer_tokens": float(batch.prompt_mask.sum() + batch.response_mask.sum()) / len(examples),
            "new_tokens": float(batch.response_mask.sum()) / len(examples)}


def count_parameters(model) -> tuple[int, int]:
    """``(trainable, total)`` parameters (tied embeddings counted once)."""
    seen, total, train = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        train += p.numel() if p.requires_grad else 0
    return train, total


def _train_flops(tokens: float, n_total: int, n_train: int) -> float:
    """Training FLOPs of ``tokens`` through a model: 2N forward + 2N for the activations' gradients
    + 2 N_trainable for the weights' gradients (a frozen weight needs no weight gradient)."""
    return tokens * (4 * n_total + 2 * n_train)


def plant_label_deficit(examples: Sequence[Example], share: float = 1.0, seed: int = 0) -> list[Example]:
    """Demonstrations with a class-conditional label error: on a ``share`` of the pairs whose brands
    agree but whose model ids differ (true label ``N``), the shown label is ``Y``; the rationale still
    cites the true fields and every other pair is untouched. An adapter SFT'd on them learns "same brand,
    so Y": a systematic deficit of its labels that the label reward sees, while its grammar is intact.
    ``Example.answer`` (what is graded) stays the true label."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be a probability in [0, 1], got {share}")
    rng = np.random.default_rng(seed)
    out = []
    for e in examples:
        b, m = e.meta["brands"], e.meta["models"]
        if b[0] == b[1] and m[0] != m[1] and rng.random() < share:
            e = replace(e, solution=e.solution[:-1] + "Y")
        out.append(e)
    return out


def sft_stage(model, tokenizer, task: ProductPairs, steps: int, S: dict, seed: int, lr: float,
              deficit: float = 0.0) -> dict:
    """SFT on teacher rationales of noisy pairs (with :func:`plant_label_deficit` at ``deficit`` when it
    is above 0); returns seconds, tokens and FLOPs."""
    from ..train import sft

    pool = task.examples(4000, seed=100 + seed, split="train")
    if deficit > 0:
        pool = plant_label_deficit(pool, deficit, seed)
    t0 = time.perf_counter()
    with one_torch_thread():
        sft(model, tokenizer, pool, steps=steps, batch_size=S["sft_batch"], lr=lr, seed=seed)
    per = np.mean([len(e.prompt) + len(e.solution) + 1 for e in pool])
    tokens = steps * S["sft_batch"] * per
    n_train, n_total = count_parameters(model)
    return {"seconds": time.perf_counter() - t0, "train_tokens": tokens, "flops": _train_flops(tokens, n_total, n_train)}


def rl_stage(model, tokenizer, task: ProductPairs, S: dict, seed: int, reward: str = "epm_composite",
             reward_kwargs: dict | None = None) -> dict:
    """GRPO on the LoRA adapter with ``reward``; returns seconds, tokens, FLOPs and the reward curve."""
    from ..train import RLConfig, Trainer

    cfg = RLConfig(num_generations=S["G"], prompts_per_step=S["prompts"], steps=S["rl_steps"], learning_rate=S["rl_lr"],
                   max_completion_length=16, seed=seed, progress=False, reward=reward,
                   reward_kwargs=dict(reward_kwargs or {}))
    trainer = Trainer(model, tokenizer, task, cfg, train_examples=task.examples(2000, seed=200 + seed, split="train"),
                      eval_examples=task.examples(8, seed=0, split="test"))
    t0 = time.perf_counter()
    with one_torch_thread():
        trainer.train()
    sampled = sum(h["prompt_tokens"] + h["response_tokens"] for h in trainer.history)
    trained = sum((h["prompt_tokens"] + h["response_tokens"]) * h["frac_rows_trained"] for h in trainer.history)
    n_train, n_total = count_parameters(model)
    return {"seconds": time.perf_counter() - t0, "train_tokens": sampled + trained,
            "flops": sampled * 2 * n_total + _train_flops(trained, n_total, n_train),
            "reward": [h["reward"] for h in trainer.history]}


def run_seed(noise: float, seed: int, prof: Profile | None = None, ablation: bool = False) -> dict:
    """One seed at one noise level: LoRA SFT, then RL with the full reward. With ``ablation`` also RL
    without the judge, a full fine-tune with the same SFT budget, the format-channel sanity check (the
    same RL stage and reward from an adapter SFT'd for only ``control_sft_steps`` steps), and the
    label-channel control (the full SFT budget on demonstrations with a planted class-conditional label
    error, then the same RL stage), the latter on the disjoint seed ``control_seed_offset + seed``.
    Every arm is measured on the same held-out pairs."""
    from ..capstone.models import add_lora

    prof = prof or current_profile()
    S = sizes(prof)
    base, tok = load_base(prof)
    task = ProductPairs(noise)
    held = task.examples(S["eval_prompts"], seed=0, split="test")
    torch.manual_seed(seed)
    out: dict = {"noise": noise, "seed": seed, "base": measure(base, tok, held)}
    out["base"].update(trainable=0, seconds=0.0, flops=0.0, train_tokens=0.0)
    lora = add_lora(copy.deepcopy(base), r=S["lora_r"], alpha=S["lora_alpha"], seed=seed)
    cost = sft_stage(lora, tok, task, S["sft_steps"], S, seed, S["sft_lr"])
    n_train = count_parameters(lora)[0]
    out["SFT-LoRA"] = {**measure(lora, tok, held), "trainable": n_train, **cost}
    arms = [("SFT-LoRA+RL", S["weights"])] + ([("SFT-LoRA+RL (no judge)", {**S["weights"], "w_judge": 0.0})]
                                               if ablation else [])
    for name, w in arms:
        m = copy.deepcopy(lora)
        rl = rl_stage(m, tok, task, S, seed, reward_kwargs=w)
        out[name] = {**measure(m, tok, held), "trainable": n_train, "seconds": cost["seconds"] + rl["seconds"],
                     "flops": cost["flops"] + rl["flops"], "train_tokens": cost["train_tokens"] + rl["train_tokens"],
                     "reward": rl["reward"]}
    if ablation:
        full = copy.deepcopy(base)
        fcost = sft_stage(full, tok, task, S["sft_steps"], S, seed, S["full_lr"])
        out["SFT-full"] = {**measure(full, tok, held), "trainable": count_parameters(full)[0], **fcost}
        weak = add_lora(copy.deepcopy(base), r=S["lora_r"], alpha=S["lora_alpha"], seed=seed)
        sft_stage(weak, tok, task, S["control_sft_steps"], S, seed, S["sft_lr"])
        out["weak SFT"] = measure(weak, tok, held)
        rl_stage(weak, tok, task, S, seed, reward_kwargs=S["weights"])
        out["weak SFT+RL"] = measure(weak, tok, held)
        cseed = S["control_seed_offset"] + seed
        torch.manual_seed(cseed)
        planted = add_lora(copy.deepcopy(base), r=S["lora_r"], alpha=S["lora_alpha"], seed=cseed)
        sft_stage(planted, tok, task, S["sft_steps"], S, cseed, S["sft_lr"], deficit=S["deficit"])
        out["planted SFT"] = measure(planted, tok, held)
        rl_stage(planted, tok, task, S, cseed, reward_kwargs=S["weights"])
        out["planted SFT+RL"] = measure(planted, tok, held)
    return out


MODULES = ("rlcourse.methods.epm_rl", "rlcourse.train", "rlcourse.capstone.models", "rlcourse.lm.sampling",
           "rlcourse.lm.zoo")


def arm_name(noise: float) -> str:
    """The study's arm for a noise level, e.g. ``"noise 0.7"``."""
    return f"noise {noise:g}"


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """:func:`run_seed` at the noise level of arm ``arm`` of ``sizes["arms"]`` (``{name: noise}``) for
    the profile ``sizes["profile"]``, with the ablation and controls at ``sizes["ablation_noise"]``:
    ``{stage: measures}`` plus ``noise`` and ``seed``."""
    if arm not in sizes["arms"]:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(sizes['arms'])}")
    noise = sizes["arms"][arm]
    return run_seed(noise, seed, Profile(**sizes["profile"]), ablation=noise == sizes["ablation_noise"])


def study(prof: Profile | None = None) -> Study:
    """Every noise level of :func:`sizes` (an arm each) on ``prof.seeds`` seeds; the ablation and
    controls at the highest noise."""
    prof = prof or current_profile()
    noises = sizes(prof)["noises"]
    return Study(name="epm_rl", arms=tuple(arm_name(nz) for nz in noises), seeds=tuple(range(prof.seeds)),
                 run=run_cell, sizes={"profile": prof.as_dict(), "arms": {arm_name(nz): nz for nz in noises},
                                      "ablation_noise": max(noises)}, modules=MODULES)


def run_experiment(prof: Profile | None = None, **run_kw) -> dict:
    """Every noise level on ``prof.seeds`` seeds; the ablation and controls at the highest noise:
    :func:`study` on the study runner (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`),
    after building the shared base model once. Returns ``runs[noise]`` (per seed, :func:`run_seed`'s
    output), ``seeds``, ``sizes``, ``profile``, ``base_seconds`` and ``seconds``."""
    prof = prof or current_profile()
    S = sizes(prof)
    t0 = time.perf_counter()
    load_base(prof)
    t_base = time.perf_counter() - t0
    grid = study(prof)
    res = run_study(grid, **run_kw)
    runs = {nz: [res.metrics[(arm, s)] for s in grid.seeds] for arm, nz in grid.sizes["arms"].items()}
    return {"runs": runs, "seeds": len(grid.seeds), "sizes": S, "profile": prof, "base_seconds": t_base,
            "seconds": t_base + res.wall_seconds}


def setting(S: dict) -> str:
    """Our setting in words, from :func:`sizes`."""
    lm = S["lm"]
    return (f"tiny Llama ({lm.lm_layers} layers, width {lm.lm_hidden}) SFT'd {S['base_steps']} steps on clean pairs; "
            f"LoRA r={S['lora_r']} SFT {S['sft_steps']} steps x {S['sft_batch']} on noisy pairs; GRPO {S['rl_steps']} "
            f"steps of {S['prompts']} prompts x {S['G']} samples on the adapter, no KL term; rule judge; greedy "
            f"balanced accuracy on {S['eval_prompts']} held-out pairs")


def claims(prof: Profile | None = None) -> dict[str, Claim]:
    """The chapter's claims, margins fixed before the run."""
    S = sizes(prof or current_profile())
    c = dict(paper=PAPER, setting=setting(S), source="abstract")
    out = {}
    for nz in S["noises"]:
        out[f"rl_{nz:g}"] = Claim(
            key=f"epm_rl/rl-over-peft-noise{nz:g}", statement="EPM-RL consistently improves over PEFT-only training",
            metric=f"greedy balanced accuracy, noise {nz:g}", method="SFT-LoRA+RL", baseline="SFT-LoRA",
            kind="greater", margin=0.02, **c)
    hi = max(S["noises"])
    out["ablation_accuracy"] = Claim(
        key="epm_rl/no-judge-keeps-accuracy", statement="[ours] dropping the judge term keeps accuracy",
        metric=f"greedy balanced accuracy, noise {hi:g}", method="SFT-LoRA+RL (no judge)", baseline="SFT-LoRA+RL",
        kind="equivalent", margin=0.03, **c)
    out["ablation_faithful"] = Claim(
        key="epm_rl/no-judge-loses-faithfulness",
        statement="[ours] dropping the judge term lowers rationale faithfulness",
        metric=f"share of faithful rationales (judge = 1), noise {hi:g}", method="SFT-LoRA+RL (no judge)",
        baseline="SFT-LoRA+RL", kind="less", margin=0.01, **c)
    out["control"] = Claim(
        key="epm_rl/control-rl-lifts-weak-sft", role="positive control",
        statement=f"pipeline sanity check (format channel): the same RL stage lifts an adapter SFT'd for only "
        f"{S['control_sft_steps']} steps, which has the grammar still to learn",
        metric=f"greedy balanced accuracy, noise {hi:g}", method="weak SFT+RL", baseline="weak SFT",
        kind="greater", margin=0.02, **c)
    out["label_control"] = Claim(
        key="epm_rl/control-rl-repairs-planted-labels", role="positive control",
        statement="label-channel control: the same RL stage lifts the balanced accuracy of a fully SFT'd adapter "
        "whose demonstrations said Y on every same-brand, different-model pair (a planted class-conditional "
        "label error), on seeds disjoint from the reported ones",
        metric=f"greedy balanced accuracy, noise {hi:g}", method="planted SFT+RL", baseline="planted SFT",
        kind="greater", margin=0.02, **c)
    out[f"rl_{hi:g}"] = replace(out[f"rl_{hi:g}"], control=out["label_control"].key)
    return out


def verdicts(result: dict) -> dict:
    """The claims evaluated on :func:`run_experiment`'s result."""
    C = claims(result.get("profile"))
    runs, s = result["runs"], result["seconds"]
    hi = max(runs)

    def arm(nz, name, key="accuracy"):
        return [r[name][key] for r in runs[nz]]

    label_control = evaluate(C["label_control"], arm(hi, "planted SFT+RL"), arm(hi, "planted SFT"), seconds=s)
    V = {f"rl_{nz:g}": evaluate(C[f"rl_{nz:g}"], arm(nz, "SFT-LoRA+RL"), arm(nz, "SFT-LoRA"), seconds=s,
                                control=label_control if C[f"rl_{nz:g}"].control else None)
         for nz in runs}
    V["label_control"] = label_control
    V["ablation_accuracy"] = evaluate(C["ablation_accuracy"], arm(hi, "SFT-LoRA+RL (no judge)"),
                                      arm(hi, "SFT-LoRA+RL"), seconds=s)
    V["ablation_faithful"] = evaluate(C["ablation_faithful"], arm(hi, "SFT-LoRA+RL (no judge)", "faithful"),
                                      arm(hi, "SFT-LoRA+RL", "faithful"), seconds=s)
    V["control"] = evaluate(C["control"], arm(hi, "weak SFT+RL"), arm(hi, "weak SFT"), seconds=s)
    return V


def cost_table(result: dict) -> list[dict]:
    """Quality against cost at the highest noise, means over seeds (measured, not typed)."""
    runs = result["runs"][max(result["runs"])]
    rows = []
    for name in ("base", "SFT-LoRA", "SFT-LoRA+RL", "SFT-LoRA+RL (no judge)", "SFT-full"):
        ds = [r[name] for r in runs]
        rows.append({"arm": name, **{k: float(np.mean([d[k] for d in ds]))
                                     for k in ("accuracy", "faithful", "trainable", "seconds", "flops", "train_tokens",
                                               "infer_tokens")}})
    return rows
