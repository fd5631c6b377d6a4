"""Base models of a chosen strength: SFT pre-training on a task's demonstrations, cached on disk.

``load_base_model("addition", strength=0.5)`` trains the tiny model on demonstrations until its greedy
accuracy on held-out prompts reaches 50% (checked every ``eval_every`` steps, five times as often once
within 0.15 of the target, keeping whichever of the last two checks is closer to it), saves it as safetensors
under :func:`rlcourse.cache_dir`, and loads it from there on every later call. The build is
deterministic for a seed, so the cache is only a shortcut: deleting it rebuilds the same weights.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast
from huggingface_hub import utils as hub_utils
from transformers.utils import logging as hf_logging

from ..profiles import Profile, cache_dir, profile as current_profile
from ..tasks import Example, Task, get_task
from .model import build_model, response_logprobs
from .sampling import encode_prompts, sample
from .tokenizer import build_tokenizer

ZOO_VERSION = 2  # bump when anything that changes the built weights changes (2: land near the target)
NAMED_STRENGTHS = {"weak": 0.2, "medium": 0.5, "strong": 0.8}


def max_new_tokens_for(task: Task, examples: list[Example] | None = None) -> int:
    """Enough new tokens for the task's longest demonstration plus EOS (at least 4)."""
    examples = examples if examples is not None else task.examples(64, seed=12345)
    return max(4, max(len(e.solution) for e in examples) + 1)


def sft_batch(tokenizer, examples: list[Example]):
    """Tokenised SFT batch in the rollout layout: ``(input_ids, attention_mask, response_mask)``.

    ============== =========== ===============================================
    input_ids      ``(B,P+T)`` left-padded prompt, right-padded solution + EOS
    attention_mask ``(B,P+T)`` 1 on real tokens
    response_mask  ``(B,T)``   1 on solution tokens and the EOS
    ============== =========== ===============================================
    """
    p_ids, p_mask = encode_prompts(tokenizer, [e.prompt for e in examples])
    enc = tokenizer([e.solution + tokenizer.eos_token for e in examples], return_tensors="pt",
                    padding=True, padding_side="right", add_special_tokens=False)
    r_ids, r_mask = enc["input_ids"], enc["attention_mask"]
    return torch.cat([p_ids, r_ids], 1), torch.cat([p_mask, r_mask], 1), r_mask.float()


def sft_loss(model, tokenizer, examples: list[Example]) -> torch.Tensor:
    """Mean negative log-likelihood per response token of the demonstrations (a scalar)."""
    input_ids, attention_mask, response_mask = sft_batch(tokenizer, examples)
    logp = response_logprobs(model, input_ids, attention_mask, response_mask.shape[1])
    return -(logp * response_mask).sum() / response_mask.sum()


def greedy_accuracy(model, tokenizer, task: Task | str, examples: list[Example], max_new_tokens: int | None = None,
                    batch_size: int = 256) -> float:
    """Fraction of ``examples`` that greedy decoding answers correctly."""
    task = get_task(task)
    max_new_tokens = max_new_tokens or max_new_tokens_for(task, examples)
    rewards = []
    for i in range(0, len(examples), batch_size):
        chunk = examples[i:i + batch_size]
        batch = sample(model, tokenizer, [e.prompt for e in chunk], temperature=0.0, max_new_tokens=max_new_tokens)
        rewards.extend(task.rewards(batch.texts, chunk).tolist())
    return float(sum(rewards) / len(rewards))


@dataclass
class PretrainResult:
    steps: int
    accuracy: float
    history: list[dict]
    seconds: float


def pretrain(model, tokenizer, task: Task | str, max_steps: int, batch_size: int = 64, lr: float = 1e-3,
             target_accuracy: float | None = None, eval_every: int = 50, eval_prompts: int = 256, seed: int = 0,
             progress: bool = True, approach: float = 0.15) -> PretrainResult:
    """SFT on the task's demonstrations with AdamW; stops early once held-out greedy accuracy reaches
    ``target_accuracy``. Returns the accuracy curve (``history``: step, loss, accuracy).

    Accuracy rises steeply, so a coarse check overshoots the target. Once a check is within
    ``approach`` of the target, accuracy is checked every ``max(1, eval_every // 5)`` steps, and when
    it reaches the target the model keeps the weights of whichever of the last two checks is closer
    to it (``steps`` and ``accuracy`` of the result are that check's)."""
    task = get_task(task)
    if max_steps < 1 or batch_size < 1:
        raise ValueError(f"max_steps and batch_size must be positive, got {max_steps}, {batch_size}")
    if target_accuracy is not None and not 0.0 < target_accuracy <= 1.0:
        raise ValueError(f"target_accuracy must be in (0, 1], got {target_accuracy}")
    pool = task.examples(min(max_steps * batch_size, 20000), seed=seed, split="train")
    held_out = task.examples(eval_prompts, seed=seed, split="test")
    max_new = max_new_tokens_for(task, held_out)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    history: list[dict] = [{"step": 0, "loss": None,
                            "accuracy": greedy_accuracy(model, tokenizer, task, held_out, max_new)}]
    start = time.perf_counter()
    fine_every = max(1, eval_every // 5)
    last = {"step": 0, "accuracy": history[0]["accuracy"], "weights": None}  # the previous check
    chosen = None
    model.train()
    bar = tqdm(range(1, max_steps + 1), desc=f"SFT {task.name}", disable=not progress, mininterval=1.0)
    for step in bar:
        rows = torch.randint(len(pool), (batch_size,), generator=gen).tolist()
        loss = sft_loss(model, tokenizer, [pool[i] for i in rows])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        near = target_accuracy is not None and last["accuracy"] >= target_accuracy - approach
        if step % (fine_every if near else eval_every) == 0 or step == max_steps:
            acc = greedy_accuracy(model, tokenizer, task, held_out, max_new)
            model.train()
            history.append({"step": step, "loss": loss.item(), "accuracy": acc})
            bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{acc:.2f}")
            if target_accuracy is not None and acc >= target_accuracy:
                if last["weights"] is not None and \
                        abs(last["accuracy"] - target_accuracy) < abs(acc - target_accuracy):
                    model.load_state_dict(last["weights"])  # the check before was closer
                    chosen = {"step": last["step"], "accuracy": last["accuracy"]}
                break
            if target_accuracy is not None and acc >= target_accuracy - approach:
                last = {"step": step, "accuracy": acc,
                        "weights": {k: v.detach().clone() for k, v in model.state_dict().items()}}
            else:
                last = {"step": step, "accuracy": acc, "weights": None}
    bar.close()
    # no gradient of the last SFT step stays on the parameters: a trainer that accumulates into .grad
    # (the RL loop's first step) would otherwise add it to its own, and a fresh build would train
    # differently from the same weights loaded from the cache
    opt.zero_grad(set_to_none=True)
    model.eval()
    chosen = chosen or {"step": history[-1]["step"], "accuracy": history[-1]["accuracy"]}
    return PretrainResult(steps=chosen["step"], accuracy=chosen["accuracy"], history=history,
                          seconds=time.perf_counter() - start)


def _resolve_strength(strength: float | str) -> float:
    if isinstance(strength, str):
        if strength not in NAMED_STRENGTHS:
            raise ValueError(f"unknown strength {strength!r}; use a number in (0, 1] or one of {sorted(NAMED_STRENGTHS)}")
        return NAMED_STRENGTHS[strength]
    if not 0.0 < float(strength) <= 1.0:
        raise ValueError(f"strength must be a target accuracy in (0, 1], got {strength}")
    return float(strength)


def base_model_path(task: Task | str, strength: float | str = "medium", seed: int = 0,
                    prof: Profile | None = None) -> Path:
    """Where :func:`load_base_model` caches this model (a folder named by a hash of everything that
    determines its weights)."""
    task, prof = get_task(task), prof or current_profile()
    recipe = {"zoo_version": ZOO_VERSION, "task": task.name, "strength": _resolve_strength(strength), "seed": seed,
              "profile": prof.as_dict()}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir() / "zoo" / f"{task.name}-{prof.name}-acc{recipe['strength']:.2f}-seed{seed}-{digest}"


def load_base_model(task: Task | str, strength: float | str = "medium", seed: int = 0, prof: Profile | None = None,
                    progress: bool = True) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A base model for ``task`` whose held-out greedy accuracy is near ``strength``: of the two checks
    around the first time it reached it, the closer one (see :func:`pretrain`).

    ``strength`` is a target accuracy in (0, 1] or ``"weak"`` (0.2), ``"medium"`` (0.5), ``"strong"``
    (0.8). Pre-training stops at the profile's ``pretrain_max_steps`` if the target is not reached;
    ``model.config.rlcourse_pretrain`` records the steps, the accuracy reached and the curve.
    """
    target = _resolve_strength(strength)
    task, prof = get_task(task), prof or current_profile()
    path = base_model_path(task, target, seed, prof)

    def build():
        tokenizer = build_tokenizer()
        model = build_model(tokenizer, prof, seed=seed)
        result = pretrain(model, tokenizer, task, max_steps=prof.pretrain_max_steps, batch_size=prof.pretrain_batch,
                          lr=prof.pretrain_lr, target_accuracy=target, eval_every=prof.eval_every,
                          eval_prompts=prof.eval_prompts, seed=seed, progress=progress)
        model.config.rlcourse_pretrain = {"task": task.name, "target_accuracy": target, "steps": result.steps,
                                          "accuracy": result.accuracy, "seconds": result.seconds,
                                          "history": result.history, "profile": prof.name, "seed": seed}
        return model, tokenizer

    return cached_model(path, build)


def cached_model(path: Path, build) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """The model and tokenizer saved at ``path``; if there are none, ``build()``'s, saved there first.

    The save is atomic: written to a temporary folder and renamed, so a reader never sees half a model;
    if another process finished first, its copy is kept. Chapters that build a base model of their own
    (a task mixture, a planted error mode) cache it with this under :func:`rlcourse.cache_dir`, with a
    hash of their recipe in ``path``. Loading and saving show no progress bar (0.6M parameters).
    """
    with no_progress_bars():
        if (path / "model.safetensors").exists():
            return LlamaForCausalLM.from_pretrained(path).eval(), PreTrainedTokenizerFast.from_pretrained(path)
        model, tokenizer = build()
        tmp = path.with_name(path.name + f".tmp{time.time_ns()}")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(path)
        except OSError:  # another process finished first; keep its copy
            shutil.rmtree(tmp, ignore_errors=True)
        return model.eval(), tokenizer


@contextlib.contextmanager
def no_progress_bars():
    """transformers' and huggingface_hub's progress bars off inside the block, and afterwards as they
    were: a bar that was off (``HF_HUB_DISABLE_PROGRESS_BARS=1``, or a caller's choice) is not switched
    on, so the hub does not warn that its environment variable has priority."""
    transformers_on = hf_logging.is_progress_bar_enabled()
    hub_on = not hub_utils.are_progress_bars_disabled()
    if transformers_on:
        hf_logging.disable_progress_bar()  # both
    elif hub_on:
        hub_utils.disable_progress_bars()
    try:
        yield
    finally:
        if transformers_on:
            hf_logging.enable_progress_bar()  # both; a hub whose bars were off goes back off
            if not hub_on:
                hub_utils.disable_progress_bars()
        elif hub_on:
            hub_utils.enable_progress_bars()
