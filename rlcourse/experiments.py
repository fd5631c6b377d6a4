"""Experiments of the foundations chapters that run the whole loop; each returns measured numbers."""
from __future__ import annotations

import copy
import time

import torch

from .losses import agg_loss
from .lm import load_base_model, sample
from .profiles import Profile, profile as current_profile
from .tasks import get_task
from .train import RLConfig, Trainer


def advantage_comparison_config(prof: Profile, estimator: str, seed: int = 0) -> RLConfig:
    """The shared configuration of the estimator comparison: only ``advantage_estimator`` varies.
    (32 prompts x 8 samples, a learning rate of 2e-4 decayed linearly to 0 over 300 steps, came out
    of a short sweep on the book-profile addition model; see the chapter.)"""
    steps = prof.pick(smoke=prof.rl_steps, book=300, full=400)
    return RLConfig(
        advantage_estimator=estimator, num_generations=prof.num_generations,
        prompts_per_step=prof.pick(smoke=prof.rl_prompts, book=32, full=64),
        learning_rate=prof.pick(smoke=prof.rl_lr, book=2e-4, full=2e-4), lr_scheduler="linear",
        steps=steps, max_completion_length=10,
        loss_type="dapo", eval_every=max(1, steps // 8), eval_prompts=prof.eval_prompts, seed=seed, progress=False,
        lam=0.95, vf_coef=0.5, critic_learning_rate=prof.rl_lr * 10,
    )


def run_advantage_comparison(prof: Profile | None = None,
                             estimators=("reinforce", "rloo", "grpo"), seed: int = 0) -> dict:
    """Train the default addition base model with each advantage estimator from the same weights,
    prompts and seed; return each run's history, base and final held-out greedy accuracy, and time."""
    prof = prof or current_profile()
    base, tok = load_base_model("addition", "medium", prof=prof, progress=False)
    out = {}
    for est in estimators:
        trainer = Trainer(copy.deepcopy(base), tok, "addition", advantage_comparison_config(prof, est, seed))
        base_acc = trainer.evaluate()
        start = time.perf_counter()
        history = trainer.train()
        out[est] = {"history": history, "base_accuracy": base_acc,
                    "final_accuracy": history[-1]["eval_greedy_accuracy"],
                    "best_accuracy": max(h.get("eval_greedy_accuracy", 0.0) for h in history),
                    "seconds": time.perf_counter() - start}
    return out


def token_weights_by_mode(response_mask: torch.Tensor, modes, max_len: int | None = None) -> dict:
    """The weight each aggregation mode gives one token of each sequence: the gradient of the
    aggregated loss with respect to a per-token loss of 1, ``(B,)`` per mode."""
    out = {}
    for mode in modes:
        loss_mat = torch.ones_like(response_mask, dtype=torch.float32, requires_grad=True)
        (grad,) = torch.autograd.grad(agg_loss(loss_mat, response_mask, mode, max_len=max_len), loss_mat)
        out[mode] = grad[:, 0]
    return out


def rollout_lengths(prof: Profile | None = None, task: str = "countdown", n_prompts: int = 64, seed: int = 0):
    """Sampled rollouts of a base model, for the aggregation analysis: ``(batch, rewards)``."""
    prof = prof or current_profile()
    model, tok = load_base_model(task, "weak", prof=prof, progress=False)
    t = get_task(task)
    ex = t.examples(n_prompts, seed=seed, split="test")
    batch = sample(model, tok, [e.prompt for e in ex], num_generations=4, max_new_tokens=12, temperature=1.2,
                   generator=torch.Generator().manual_seed(seed))
    rewards = torch.as_tensor(t.rewards(batch.texts, [e for e in ex for _ in range(4)]))
    return batch, rewards
