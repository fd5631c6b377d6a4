"""Capstone 1: GRPO with LoRA on a real Hugging Face model, in three profiles.

==========  ===================================================================================
smoke       a tiny random Qwen2 (written with ``save_pretrained``, read with ``from_pretrained``),
            a few steps: proves the code path runs
book        a small Qwen2 pre-trained from scratch by the lab on the task (SFT, cached), then GRPO
            with LoRA on 2 CPU cores in a few minutes
full        any model name or local path (default ``Qwen/Qwen2.5-0.5B-Instruct``) on a GPU, bf16,
            gradient checkpointing
==========  ===================================================================================

Environment overrides for the full profile: ``RLCOURSE_CAPSTONE_MODEL`` (a hub name or a local
folder), ``RLCOURSE_GSM8K_JSONL`` (a GSM8K-format JSONL file to train and evaluate on instead of
reasoning-gym's ``gsm_symbolic``), ``RLCOURSE_CAPSTONE_DEVICE``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..distributed import PARALLEL, current as current_group
from ..profiles import Profile, cache_dir, profile as current_profile
from ..rollout import get_sampler
from ..tasks import Example, Task, get_task
from ..train import RLConfig
from .math_tasks import ChatTask, JsonlMathTask, ReasoningGymMath
from .models import add_lora, build_tiny_qwen2, char_chat_tokenizer, load_causal_lm, save_tiny_qwen2
from .parallel import ParallelTrainer
from .tis import recording_rollout_logprobs

BOXED_INSTRUCTION = " Think step by step, then give the final answer as \\boxed{<number>}."


@dataclass
class CapstoneConfig:
    """Everything one capstone run depends on.

    ====================== =====================================================================
    model                  ``"tiny"`` (the lab's Qwen2, built from the ``tiny_*`` sizes) or a hub
                           name / local folder for ``from_pretrained``
    task, task_config      a reasoning-gym dataset name and its configuration
    jsonl_path             a GSM8K-format JSONL file; when set it replaces the reasoning-gym task
    jsonl_test_path        a second such file, the test split (without it one file is split by a hash)
    instruction            appended to each question in the user turn
    tiny_*                 the tiny model's sizes (hidden, MLP, layers, heads, key/value heads)
    pretrain_*             the lab's SFT of the tiny model on the task (0 steps: random weights)
    lora_*                 rank, alpha and target modules of the adapter
    rl                     keywords of :class:`~rlcourse.train.RLConfig` (the loop's parts by name)
    eval_prompts           held-out prompts for the before/after evaluation
    eval_prompts           (0: no evaluation; data-parallel runs evaluate on rank 0)
    eval_samples, ks       samples per prompt ``n`` and the ``k`` of pass@k (each ``k <= n``)
    dtype, device          e.g. ``"bfloat16"``, ``"cuda"``; gradient_checkpointing on or off
    parallel               with several processes, the engine that reduces the gradients: ``"ddp"``
                           (every process holds the model) or ``"fsdp"`` (each holds a shard;
                           :mod:`rlcourse.capstone.parallel`); one process ignores it
    tis_cap                ``C`` of truncated importance sampling (:mod:`rlcourse.capstone.tis`):
                           each token's term weighted by ``min(pi_old / pi_rollout, C)``; needs
                           ``rl.old_logprobs = "training"`` and the ``vanilla`` policy loss; None: off
    ====================== =====================================================================
    """

    model: str = "tiny"
    task: str = "basic_arithmetic"
    task_config: dict = field(default_factory=dict)
    jsonl_path: str | None = None
    jsonl_test_path: str | None = None
    instruction: str = ""
    tiny_hidden: int = 64
    tiny_intermediate: int = 128
    tiny_layers: int = 2
    tiny_heads: int = 4
    tiny_kv_heads: int = 2
    tiny_max_positions: int = 96
    pretrain_steps: int = 0
    pretrain_batch: int = 64
    pretrain_lr: float = 1e-3
    pretrain_target: float | None = None
    lora_r: int = 8
    lora_alpha: int = 16
    lora_targets: tuple = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    rl: dict = field(default_factory=dict)
    eval_prompts: int = 16
    eval_samples: int = 4
    ks: tuple = (1, 4)
    dtype: str | None = None
    device: str | None = None
    gradient_checkpointing: bool = False
    parallel: str = "ddp"
    tis_cap: float | None = None

    def __post_init__(self):
        from .validate import type_errors

        wrong = type_errors(CapstoneConfig, vars(self)) + type_errors(RLConfig, self.rl, where="rl.")
        wrong += [f"ks entry {k!r} should be int" for k in self.ks if isinstance(k, bool) or not isinstance(k, int)]
        if wrong:
            raise TypeError("capstone config: " + "; ".join(wrong))
        if self.jsonl_test_path and not self.jsonl_path:
            raise ValueError("jsonl_test_path needs jsonl_path (the training file) too")
        if any(not 1 <= k <= self.eval_samples for k in self.ks):
            raise ValueError(f"every k of pass@k must be in [1, eval_samples={self.eval_samples}], got {self.ks}")
        unknown = set(self.rl) - set(RLConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"rl keys {sorted(unknown)} are not fields of RLConfig")
        if self.parallel not in PARALLEL:
            raise ValueError(f"parallel = {self.parallel!r} is not an engine; choose one of {sorted(PARALLEL)}")
        if self.tis_cap is not None:
            if not self.tis_cap > 0:
                raise ValueError(f"tis_cap must be positive (the largest importance weight), got {self.tis_cap}")
            if self.rl.get("old_logprobs", "sampler") != "training":
                raise ValueError("tis_cap weights each token by pi_old / pi_rollout, which is 1 when the old "
                                 "log-probs are the sampler's: set rl.old_logprobs = \"training\"")
            if self.rl.get("policy_loss", "vanilla") != "vanilla":
                raise ValueError(f"tis_cap weights the vanilla PPO loss; rl.policy_loss = "
                                 f"{self.rl['policy_loss']!r} cannot take it")


def capstone_config(prof: Profile | str | None = None, **overrides) -> CapstoneConfig:
    """The capstone's configuration for a profile (``overrides`` replace fields)."""
    prof = current_profile(prof) if not isinstance(prof, Profile) else prof
    arithmetic = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2, operators=("+", "-"),
                      allow_parentheses=False, allow_negation=False)
    if prof.name == "smoke":
        cfg = CapstoneConfig(
            task_config=arithmetic, tiny_hidden=32, tiny_intermediate=64, tiny_layers=1, tiny_heads=2,
            tiny_kv_heads=1, pretrain_steps=0, lora_r=4, lora_alpha=8, eval_prompts=8, eval_samples=4, ks=(1, 4),
            rl=dict(steps=3, prompts_per_step=4, num_generations=4, max_completion_length=6, learning_rate=1e-3,
                    beta=0.02, train_pool_size=64, save_every=2))
    elif prof.name == "book":
        # The book's addition task (the sum written reversed, then '|' and the sum), not reasoning-gym's
        # arithmetic: on the latter a model this small memorises the training problems (greedy 0.40 on
        # training prompts, 0.11 on distinct held-out ones), and RL then improves only what it memorised.
        cfg = CapstoneConfig(
            task="addition", tiny_hidden=128, tiny_intermediate=384, tiny_layers=4, tiny_heads=4,
            tiny_kv_heads=2, pretrain_steps=1500, pretrain_batch=64, pretrain_lr=2e-3, pretrain_target=0.3,
            lora_r=16, lora_alpha=32, eval_prompts=128, eval_samples=8, ks=(1, 8),
            rl=dict(steps=150, prompts_per_step=16, num_generations=8, max_completion_length=8, learning_rate=1e-3,
                    beta=0.02, train_pool_size=2000, save_every=50))
    else:
        jsonl = os.environ.get("RLCOURSE_GSM8K_JSONL")
        cfg = CapstoneConfig(
            model=os.environ.get("RLCOURSE_CAPSTONE_MODEL", "Qwen/Qwen2.5-0.5B-Instruct"), task="gsm_symbolic",
            jsonl_path=jsonl, instruction=BOXED_INSTRUCTION, lora_r=16, lora_alpha=32, eval_prompts=256,
            eval_samples=8, ks=(1, 8), dtype="bfloat16",
            device=os.environ.get("RLCOURSE_CAPSTONE_DEVICE", "cuda" if torch.cuda.is_available() else "cpu"),
            gradient_checkpointing=True,
            rl=dict(steps=200, prompts_per_step=16, num_generations=8, max_completion_length=384, learning_rate=5e-5,
                    beta=0.04, micro_batch_size=16, temperature=1.0, save_every=50, eval_every=0,
                    train_pool_size=4000, old_logprobs="training"))
    return replace(cfg, **overrides)


BOOK_TASKS = ("addition", "addition3", "sort", "countdown")


def base_task(cfg: CapstoneConfig) -> Task:
    """The raw task (before the chat template): GSM8K-format JSONL if given, one of the book's own
    tasks (``BOOK_TASKS``, e.g. ``"addition"``), else a reasoning-gym generator."""
    if cfg.jsonl_path:
        return JsonlMathTask(cfg.jsonl_path, test_path=cfg.jsonl_test_path)
    if cfg.task in BOOK_TASKS:
        if cfg.task_config:
            raise ValueError(f"the book's task {cfg.task!r} takes no task_config, got {cfg.task_config}")
        return get_task(cfg.task)
    return ReasoningGymMath(cfg.task, **cfg.task_config)


def _recipe_path(cfg: CapstoneConfig, task: Task) -> Path:
    """The cache folder of the lab's tiny model: named by everything it is built from (sizes,
    pre-training, the task and its chat-formatted prompts)."""
    keys = [k for k in asdict(cfg) if k.startswith(("tiny_", "pretrain_"))]
    chat = ChatTask(task, char_chat_tokenizer(), instruction=cfg.instruction)
    recipe = {"version": 2, "task": chat.name, **{k: getattr(cfg, k) for k in keys}}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return cache_dir() / "capstone" / f"qwen2-{cfg.tiny_hidden}x{cfg.tiny_layers}-{digest}"


def prepare_base_model(cfg: CapstoneConfig, progress: bool = True):
    """``(model, tokenizer, task, info)``: the base model, its tokenizer, the chat-formatted task, and
    what was built. For ``model="tiny"`` the lab builds a Qwen2 from a config, pre-trains it on the
    task when ``pretrain_steps > 0`` (SFT, :func:`rlcourse.lm.zoo.pretrain`), writes it with
    ``save_pretrained`` to a cache folder named by its recipe, and loads it back with
    ``from_pretrained``; any other name goes straight to :func:`load_causal_lm`."""
    raw = base_task(cfg)
    info: dict = {}
    group = current_group()
    if cfg.model == "tiny":
        path = _recipe_path(cfg, raw)
        if group.is_main and not (path / "config.json").exists():  # data-parallel: rank 0 builds, the rest wait
            from ..lm.zoo import pretrain

            tokenizer = char_chat_tokenizer()
            model = build_tiny_qwen2(tokenizer, cfg.tiny_hidden, cfg.tiny_intermediate, cfg.tiny_layers,
                                     cfg.tiny_heads, cfg.tiny_kv_heads, cfg.tiny_max_positions)
            if cfg.pretrain_steps > 0:
                result = pretrain(model, tokenizer, ChatTask(raw, tokenizer, instruction=cfg.instruction),
                                  max_steps=cfg.pretrain_steps, batch_size=cfg.pretrain_batch, lr=cfg.pretrain_lr,
                                  target_accuracy=cfg.pretrain_target, eval_every=50, eval_prompts=128,
                                  progress=progress)
                model.config.rlcourse_pretrain = {"steps": result.steps, "accuracy": result.accuracy,
                                                  "seconds": result.seconds, "history": result.history}
            tmp = path.with_name(path.name + f".tmp{time.time_ns()}")
            save_tiny_qwen2(tmp, model, tokenizer)
            try:
                tmp.rename(path)
            except OSError:  # another process wrote it first
                shutil.rmtree(tmp, ignore_errors=True)
        group.barrier()
        name = path
        info["path"] = str(path)
    else:
        name = cfg.model
    dtype = getattr(torch, cfg.dtype) if cfg.dtype else None
    model, tokenizer = load_causal_lm(name, dtype=dtype, device=cfg.device,
                                      gradient_checkpointing=cfg.gradient_checkpointing)
    info["pretrain"] = getattr(model.config, "rlcourse_pretrain", None)
    info["parameters"] = sum(p.numel() for p in model.parameters())
    task = ChatTask(raw, tokenizer, instruction=cfg.instruction)
    return model, tokenizer, task, info


@torch.no_grad()
def evaluate_pass_at_k(model, tokenizer, task: Task, examples: Sequence[Example], n: int, ks: Sequence[int],
                       max_new_tokens: int, temperature: float = 1.0, seed: int = 0, prompts_per_batch: int = 32,
                       progress: bool = False) -> dict:
    """pass@k on held-out ``examples`` with the unbiased estimator (:func:`rlcourse.testtime.pass_at_k_curve`):
    ``n`` samples per prompt at ``temperature``, ``c`` of them correct, pass@k averaged over prompts.
    Also the greedy accuracy (:func:`rlcourse.lm.zoo.greedy_accuracy`). Returns
    ``{"pass@<k>": ..., "greedy": ..., "correct": (N,) counts}``."""
    from tqdm import tqdm

    from ..lm.sampling import sample
    from ..lm.zoo import greedy_accuracy
    from ..testtime import pass_at_k_curve

    if any(not 1 <= k <= n for k in ks):
        raise ValueError(f"every k must be in [1, n={n}], got {list(ks)}")
    examples = list(examples)
    if not examples:
        raise ValueError("evaluate_pass_at_k needs at least one example")
    gen = torch.Generator().manual_seed(seed)
    correct = []
    for i in tqdm(range(0, len(examples), prompts_per_batch), desc="eval", disable=not progress):
        chunk = examples[i:i + prompts_per_batch]
        batch = sample(model, tokenizer, [e.prompt for e in chunk], num_generations=n, max_new_tokens=max_new_tokens,
                       temperature=temperature, generator=gen)
        rewards = task.rewards(batch.texts, [e for e in chunk for _ in range(n)]).reshape(len(chunk), n)
        correct.append((rewards >= 1.0).astype(float))
    correct = np.concatenate(correct)
    out = {f"pass@{k}": float(v) for k, v in zip(ks, pass_at_k_curve(correct, ks))}
    out["greedy"] = greedy_accuracy(model, tokenizer, task, examples, max_new_tokens, batch_size=prompts_per_batch)
    out["correct"] = correct.sum(1).astype(int).tolist()
    return out


def tis_settings(cfg: CapstoneConfig) -> dict:
    """The :class:`~rlcourse.train.RLConfig` keywords that turn truncated importance sampling on
    (``cfg.tis_cap`` set): the ``"tis"`` policy loss with the cap, and the configured sampler
    recording its log-probs for it. Empty when ``tis_cap`` is None."""
    if cfg.tis_cap is None:
        return {}
    sampler = cfg.rl.get("sampler", "policy")
    return {"policy_loss": "tis", "loss_kwargs": {**cfg.rl.get("loss_kwargs", {}), "tis_cap": cfg.tis_cap},
            "sampler": recording_rollout_logprobs(get_sampler(sampler) if isinstance(sampler, str) else sampler)}


def run_grpo_lora(cfg: CapstoneConfig | None = None, output_dir: str | Path | None = None, resume: bool = False,
                  seed: int = 0, progress: bool = True) -> dict:
    """Evaluate the base model, train a LoRA adapter with GRPO (the book's :class:`~rlcourse.train.Trainer`,
    parts by name in ``cfg.rl``), evaluate again. The reference policy of the KL term is the same
    base with the adapter switched off (no second copy). With ``output_dir``, checkpoints (the adapter,
    the optimiser, the RNG states) go there every ``rl["save_every"]`` steps and ``resume=True``
    continues from the last one exactly.

    Under a launcher (:mod:`rlcourse.distributed`) each process trains on its share of every step's
    prompts, the engine ``cfg.parallel`` reducing the gradients (:class:`~rlcourse.capstone.parallel.ParallelTrainer`);
    rank 0 builds the tiny model, evaluates and writes checkpoints. ``cfg.tis_cap`` turns truncated
    importance sampling on (:func:`tis_settings`).

    Returns ``before`` and ``after`` (:func:`evaluate_pass_at_k`; ``None`` with ``eval_prompts=0``
    and on ranks other than 0), ``history`` (per-step metrics), ``info`` (model size, trainable
    parameters), ``seconds``, ``is_main`` and the ``trainer``."""
    from .validate import check_before_loading

    cfg = cfg or capstone_config()
    start = time.perf_counter()
    check_before_loading(cfg, processes=current_group().world_size)  # before any weights load
    model, tokenizer, task, info = prepare_base_model(cfg, progress=progress)
    rl = RLConfig(**{"seed": seed, "progress": progress, **cfg.rl, **tis_settings(cfg),
                     **({"output_dir": str(output_dir)} if output_dir is not None else {})})
    group = current_group()
    eval_examples = task.examples(cfg.eval_prompts, seed=seed, split="test") if cfg.eval_prompts else []

    def evaluate(m):
        if not eval_examples or not group.is_main:
            return None
        return evaluate_pass_at_k(m, tokenizer, task, eval_examples, cfg.eval_samples, cfg.ks,
                                  rl.max_completion_length, rl.temperature, seed=seed + 1, progress=progress)

    before = evaluate(model)
    policy = add_lora(model, r=cfg.lora_r, alpha=cfg.lora_alpha, target_modules=cfg.lora_targets, seed=seed)
    info["trainable"] = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    trainer = ParallelTrainer(policy, tokenizer, task, rl, parallel=cfg.parallel, eval_examples=eval_examples,
                              resume=resume)
    trainer.train()
    with trainer.gathered():  # FSDP: every process gathers the weights, rank 0 evaluates
        after = evaluate(policy)
    return {"before": before, "after": after, "history": trainer.history, "info": info, "trainer": trainer,
            "config": cfg, "seconds": time.perf_counter() - start, "is_main": group.is_main}
