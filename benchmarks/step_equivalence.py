"""Does a change to the step compute the same thing? Record a few Trainer steps at one commit, compare
at another: the sampled token ids of every step (must be identical: same random stream, same draws),
the sampler's log-probs and entropies, the step-1 metrics and the step-1 gradient (same weights and
samples, so equal up to float rounding), and the weights after the last step (for orientation only:
AdamW turns a rounding difference in a near-zero gradient into a step of size lr).

    python benchmarks/step_equivalence.py --save before.pt [--profile smoke]   # at one commit
    python benchmarks/step_equivalence.py --compare before.pt                 # at another

The configurations cover the update's paths: micro-batches, several passes with the trainer's own old
log-probs, an entropy bonus at another temperature, top-k sampling with a KL term (no row skipped).
Exit status 1 when an id differs or a step-1 gradient differs by more than ``--tol`` in norm.
"""
from __future__ import annotations

import argparse
import copy
import functools
import os
import sys

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONFIGS = {
    "bench": {},
    "grpo_micro_batches": dict(loss_type="grpo", micro_batch_size=24),
    "bnpo_two_passes": dict(loss_type="bnpo", num_iterations=2, micro_batch_size=16, old_logprobs="training"),
    "entropy_bonus_t07": dict(entropy_coef=0.01, temperature=0.7, loss_type="dr_grpo"),
    "top_k_kl_no_skip": dict(top_k=5, skip_zero_advantage_rows=False, beta=0.05),
}


def record(profile: str, overrides: dict, steps: int) -> dict:
    """Per step: sampled ids, log-probs, entropies, metrics and the gradient the optimiser stepped with."""
    import rlcourse
    from rlcourse.lm import load_base_model
    from rlcourse.tasks import get_task
    from rlcourse.train import RLConfig, Trainer

    base, tok = load_base_model("addition", "medium", prof=rlcourse.profile(profile), progress=False)
    task = get_task("addition")
    cfg = RLConfig(num_generations=8, prompts_per_step=8, max_completion_length=16, learning_rate=1e-3,
                   steps=steps, progress=False, **{"loss_type": "dapo", **overrides})
    trainer = Trainer(copy.deepcopy(base), tok, task, cfg, train_examples=task.examples(8 * steps, seed=0))
    out = {"ids": [], "logprobs": [], "entropy": [], "grads": [], "metrics": []}
    sampler = trainer.sampler

    @functools.wraps(sampler)  # the loop reads the sampler's signature
    def spy(*a, **k):
        batch = sampler(*a, **k)
        out["ids"].append(batch.response_ids)
        out["logprobs"].append(batch.logprobs)
        out["entropy"].append(batch.entropy)
        return batch

    trainer.sampler = spy
    trainer.optimizer.register_step_pre_hook(lambda *_: out["grads"].append(
        torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])))
    for _ in range(steps):
        m = trainer.step()
        out["metrics"].append({k: v for k, v in m.items() if not k.startswith("time") and not k.endswith("seconds")})
    out["params"] = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    return out


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference over the largest absolute value of ``b`` (0 when both are 0)."""
    scale = float(b.abs().max()) if b.numel() else 0.0
    diff = float((a - b).abs().max()) if b.numel() else 0.0
    return diff / scale if scale else diff


def compare(now: dict, then: dict, tol: float) -> bool:
    ok = True
    for name in then:
        x, y = now[name], then[name]
        same = len(x["ids"]) == len(y["ids"]) and all(torch.equal(p, q) for p, q in zip(x["ids"], y["ids"]))
        g_norm = float((x["grads"][0] - y["grads"][0]).norm() / y["grads"][0].norm().clamp_min(1e-30))
        metrics = {k: abs(x["metrics"][0][k] - v) for k, v in y["metrics"][0].items() if isinstance(v, float)}
        worst = max(metrics, key=metrics.get)
        print(f"{name}: ids identical {same}; step 1: log-probs {relative(x['logprobs'][0], y['logprobs'][0]):.1e}, "
              f"entropy {relative(x['entropy'][0], y['entropy'][0]):.1e}, gradient {relative(x['grads'][0], y['grads'][0]):.1e} "
              f"(norm {g_norm:.1e}), largest metric difference {worst} {metrics[worst]:.1e}; "
              f"weights after {len(x['ids'])} steps {relative(x['params'], y['params']):.1e}")
        ok &= same and g_norm <= tol
    print("SAME" if ok else "DIFFERENT")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="book", choices=("smoke", "book"))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--save", help="record here")
    parser.add_argument("--compare", help="an earlier --save: compare with it")
    parser.add_argument("--tol", type=float, default=1e-6, help="largest step-1 gradient difference, relative, in norm")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    now = {name: record(args.profile, over, args.steps) for name, over in CONFIGS.items()}
    if args.save:
        torch.save(now, args.save)
    return 0 if not args.compare or compare(now, torch.load(args.compare), args.tol) else 1


if __name__ == "__main__":
    sys.exit(main())
