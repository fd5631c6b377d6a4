"""S-GRPO: conditional ground-truth injection when a whole group fails.

Paper: *S-GRPO: Unified Post-Training for Large Vision-Language Models*, Yan, Tang, Chen, Xu, Hu, Yu,
Hu (2026), arXiv:2604.16557.

What the abstract states: when a binary verifier finds that every rollout of a group failed, the
verified ground-truth answer enters the group with the maximal reward, so the group-relative
advantage carries a positive signal and the supervised objective becomes a high-advantage term of the
policy gradient. Everything else here (the sampler that *replaces* one failed sample by the
demonstration, the log-probs recomputed under the current policy so the importance ratio starts at 1,
the closed forms) is the course's reconstruction.

Registered parts:

============== =============== ==============================================================
``s_grpo``     sampler         G samples per prompt; in an all-fail group the last sample is
                               replaced by the prompt's demonstration (reward 1)
``sg_sortadd`` task            pre-training mixture of ``sort`` and ``addition``
============== =============== ==============================================================
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

import numpy as np
import torch

from ..lm.model import response_logprobs
from ..lm.sampling import RolloutBatch
from ..rollout import policy_sampler, register_sampler
from ..tasks import Addition, Example, Sort, Task, get_task, register_task

STATE_KEY = "s_grpo"


# ---------------------------------------------------------------------- closed forms
def zero_variance_probability(p, G: int):
    """Probability that a group of G independent Bernoulli(p) rewards has zero variance:
    all succeed or all fail, :math:`p^G + (1-p)^G`. Works on floats and arrays."""
    if G < 1:
        raise ValueError(f"G must be >= 1, got {G}")
    p = np.asarray(p, dtype=np.float64)
    if ((p < 0) | (p > 1)).any():
        raise ValueError("p must be in [0, 1]")
    out = p**G + (1 - p) ** G
    return float(out) if out.ndim == 0 else out


def injected_advantages(n: int, std: str = "sample") -> tuple[float, float]:
    """GRPO advantages in a group of ``n`` with exactly one success (reward 1) and n-1 failures
    (reward 0), as after an injection: ``(A_success, A_fail)``.

    ======= ===== ==============================================================
    n       int   group size after injection (G when replacing, G+1 when appending)
    std     str   ``"sample"`` (Bessel, as TRL/verl) or ``"pop"`` (population)
    returns       sample: ((n-1)/sqrt(n), -1/sqrt(n)); pop: (sqrt(n-1), -1/sqrt(n-1))
    ======= ===== ==============================================================
    """
    if n < 2:
        raise ValueError(f"a group needs n >= 2 for a standard deviation, got {n}")
    if std == "sample":
        return (n - 1) / math.sqrt(n), -1 / math.sqrt(n)
    if std == "pop":
        return math.sqrt(n - 1), -1 / math.sqrt(n - 1)
    raise ValueError(f"std must be 'sample' or 'pop', got {std!r}")


# ---------------------------------------------------------------------- the injection
def all_fail_groups(rewards: torch.Tensor, G: int, threshold: float = 0.0) -> torch.Tensor:
    """``(N,)`` bool: which contiguous groups of G rewards have every reward <= ``threshold``.

    ======= ========== ==========================================
    rewards ``(N*G,)`` verifier rewards, groups contiguous
    returns ``(N,)``   True where the whole group failed
    ======= ========== ==========================================
    """
    if rewards.ndim != 1 or len(rewards) % G:
        raise ValueError(f"rewards must be (N*G,) with G={G}, got shape {tuple(rewards.shape)}")
    return (rewards.reshape(-1, G) <= threshold).all(1)


@torch.no_grad()
def inject_demonstrations(model, tokenizer, batch: RolloutBatch, rows: Sequence[int],
                          demonstrations: Sequence[str]) -> RolloutBatch:
    """A copy of ``batch`` where each row in ``rows`` holds a demonstration instead of its sample.

    The demonstration is tokenised as a response (text + EOS), the batch is right-padded if it is
    longer than the sampled responses (every per-token tensor, see :meth:`RolloutBatch.widen`), and
    the row's ``logprobs`` (and ``entropy``, if the batch records it) are recomputed under the current
    ``model`` at the batch's temperature, so that the importance ratio of the injected row is exactly 1
    before the first update (the demonstration is treated as if the current policy had sampled it).
    Per-token ``extras`` of the replaced rows described the replaced samples; they are dropped (a part
    that needs one computes it from the model, as the ``otb`` estimator does), and so are ``scores``.

    ============== ========= ====================================================
    batch          B rows    the sampled rollout batch (not modified)
    rows           ``K``     which rows to replace
    demonstrations ``K``     the replacement completions (without EOS)
    returns        B rows    the new batch; ``response_len`` may have grown
    ============== ========= ====================================================
    """
    rows = [int(r) for r in rows]
    if len(rows) != len(demonstrations):
        raise ValueError(f"{len(rows)} rows but {len(demonstrations)} demonstrations")
    if len(set(rows)) != len(rows) or any(not 0 <= r < len(batch) for r in rows):
        raise ValueError(f"rows must be distinct indices in [0, {len(batch)}), got {rows}")
    if not rows:
        return batch
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    demo_ids = [tokenizer(d, add_special_tokens=False)["input_ids"] + [eos] for d in demonstrations]
    T = max(batch.response_len, max(len(d) for d in demo_ids))
    wide = replace(batch, extras={}, scores=None).widen(T, pad)
    response_ids, response_mask = wide.response_ids.clone(), wide.response_mask.clone()
    logprobs = wide.logprobs.clone()
    entropy = None if wide.entropy is None else wide.entropy.clone()
    truncated, texts = batch.truncated.clone(), list(batch.texts)
    for r, ids, text in zip(rows, demo_ids, demonstrations):
        response_ids[r] = pad
        response_ids[r, :len(ids)] = torch.tensor(ids)
        response_mask[r] = 0.0
        response_mask[r, :len(ids)] = 1.0
        truncated[r], texts[r] = False, text
    new = replace(wide, response_ids=response_ids, response_mask=response_mask, logprobs=logprobs,
                  entropy=entropy, truncated=truncated, texts=texts)
    sub = torch.tensor(rows)
    was_training = model.training
    model.eval()
    try:
        out = response_logprobs(model, new.input_ids[sub], new.attention_mask[sub], T, batch.temperature,
                                return_entropy=entropy is not None)
    finally:
        model.train(was_training)
    lp, ent = out if entropy is not None else (out, None)
    new.logprobs[sub] = lp * response_mask[sub]
    if entropy is not None:
        new.entropy[sub] = ent.float() * response_mask[sub]
    return new


def attach_references(state: dict, task: Task | str, examples: Sequence[Example]) -> None:
    """Optional: store a verifier and demonstrations in ``state["s_grpo"]`` for calls of the
    ``s_grpo`` sampler outside the trainer (the trainer hands the sampler the step's examples, its
    task and its reward, so a config alone is enough there). Checks that the demonstrations pass."""
    task = get_task(task)
    refs = {e.prompt: e for e in examples}
    bad = [e.prompt for e in list(refs.values())[:200] if task.score(e.solution, e).reward < 1.0]
    if bad:
        raise ValueError(f"demonstrations must pass the verifier; these do not: {bad[:3]}")
    state.setdefault(STATE_KEY, {}).update({"task": task, "references": refs, "injected": []})


@register_sampler("s_grpo")
def s_grpo_sampler(model, tokenizer, prompts, config, generator, state, examples=None, task=None,
                   reward=None) -> RolloutBatch:
    """Sample G per prompt; in every group where the loop's reward failed all G, replace the last sample
    by the prompt's demonstration (log-probs recomputed, so the ratio starts at 1) with the maximal
    reward 1. Returns the batch with ``scores`` set, so the trainer's advantages use exactly the rewards
    the injection acted on (under a noisy verifier too). Appends the fraction of injected groups to
    ``state["s_grpo"]["injected"]``.

    The trainer passes ``examples`` (the step's examples), ``task`` and ``reward``; called by hand,
    the sampler falls back on what :func:`attach_references` stored and the task's verifier.
    """
    G = config.num_generations
    if G < 2:
        raise ValueError(f"s_grpo needs num_generations >= 2, got {G}")
    memo = state.setdefault(STATE_KEY, {})
    memo.setdefault("injected", [])
    if examples is None:
        if "references" not in memo:
            raise ValueError("the s_grpo sampler needs the step's examples (the trainer passes them) or "
                             "state['s_grpo'] from attach_references(state, task, examples)")
        try:
            examples = [memo["references"][p] for p in prompts]
        except KeyError as err:
            raise ValueError(f"no demonstration for prompt {err.args[0]!r}") from None
    if len(examples) != len(prompts) or any(e.prompt != p for e, p in zip(examples, prompts)):
        raise ValueError("s_grpo: examples must be the examples of the prompts, in order")
    task = task if task is not None else memo.get("task")
    if task is None:
        raise ValueError("the s_grpo sampler needs a task (the trainer passes it) for its verifier")
    task = get_task(task)
    batch = policy_sampler(model, tokenizer, prompts, config, generator, state)
    per_row = [examples[int(i)] for i in batch.index]
    if reward is None:
        rewards = task.rewards(batch.texts, per_row)
    else:
        rewards = reward(batch, per_row, task, state)
    rewards = torch.as_tensor(rewards, dtype=torch.float32).reshape(-1).clone()
    failed = all_fail_groups(rewards, G)
    rows = [int(g) * G + G - 1 for g in failed.nonzero().flatten()]
    memo["injected"].append(float(failed.float().mean()))
    new = inject_demonstrations(model, tokenizer, batch, rows, [per_row[r].solution for r in rows])
    rewards[rows] = 1.0  # the verified demonstration enters with the maximal reward
    new.scores = rewards
    return new


# ---------------------------------------------------------------------- the two-task base model
class SortAddition(Task):
    """Pre-training mixture: half ``sort`` (4 digits), half 2-digit ``addition``, each scored by
    its own verifier. Stopped at a low target, a base model sorts well and rarely adds right."""

    name = "sg_sortadd"

    def __init__(self):
        self.sort, self.add = Sort(), Addition()

    def _draw(self, rng):
        return (self.sort if rng.random() < 0.5 else self.add)._draw(rng)

    def score(self, completion, example):
        return (self.add if "+" in example.prompt else self.sort).score(completion, example)


register_task("sg_sortadd")(SortAddition)


# ---------------------------------------------------------------------- the chapter's experiment
def _accuracies(model, tokenizer, held: dict) -> dict:
    from ..lm.zoo import greedy_accuracy

    return {name: greedy_accuracy(model, tokenizer, name, ex, max_new_tokens=10) for name, ex in held.items()}
