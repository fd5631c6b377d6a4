"""Seconds per GRPO step: TRL's GRPOTrainer vs rlcourse's Trainer, on CPU, with the same tiny model,
prompts, group size (8 prompts x 8 samples), max_completion_length, optimiser (AdamW, same lr) and
step count. Target: rlcourse takes at most half of TRL's time per step.

The two trainers run in alternating rounds (TRL, rlcourse, TRL, ...), each from the same base
weights, and each one's time per step is the median over all its measured steps, so that a drift in
the machine's speed during the run weighs on both alike.

    pip install -e '.[bench]'      # TRL is not a core dependency
    python benchmarks/grpo_vs_trl.py [--steps 20] [--warmup 3] [--rounds 2]
"""
import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    try:
        import datasets
        import trl
        from transformers import TrainerCallback
    except ImportError:
        print("this benchmark needs TRL: pip install -e '.[bench]'")
        return 2
    import rlcourse
    from rlcourse.lm import load_base_model
    from rlcourse.tasks import get_task
    from rlcourse.train import RLConfig, Trainer

    base, tok = load_base_model("addition", "medium", prof=rlcourse.profile("book"), progress=False)
    task = get_task("addition")
    total = args.warmup + args.steps
    pool = task.examples(args.prompts * total, seed=0)

    # ---- TRL
    def reward(completions, answer, **kwargs):
        return [task.score(c, ex).reward for c, ex in zip(completions, [_Ex(a) for a in answer])]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.t = [], None

        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.times.append(time.perf_counter() - self.t)

    data = datasets.Dataset.from_dict({"prompt": [e.prompt for e in pool], "answer": [e.answer for e in pool]})

    def trl_times() -> list[float]:
        timer = StepTimer()
        cfg = trl.GRPOConfig(
            output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.prompts * args.generations,
            num_generations=args.generations, max_completion_length=args.max_completion_length,
            learning_rate=args.lr, max_steps=total, beta=0.0, temperature=1.0, loss_type="dapo",
            logging_steps=10_000, save_strategy="no", report_to=[], use_cpu=True, bf16=False, fp16=False,
            gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, shuffle_dataset=False,
            dataloader_num_workers=0, max_grad_norm=1.0, weight_decay=0.0, lr_scheduler_type="constant",
            warmup_steps=0, disable_tqdm=True,
        )
        trainer = trl.GRPOTrainer(model=copy.deepcopy(base), reward_funcs=reward, args=cfg, train_dataset=data,
                                  processing_class=tok, callbacks=[timer])
        trainer.train()
        return timer.times[args.warmup:]

    def our_times() -> list[dict]:
        ours = Trainer(copy.deepcopy(base), tok, task, RLConfig(
            num_generations=args.generations, prompts_per_step=args.prompts,
            max_completion_length=args.max_completion_length, learning_rate=args.lr, steps=total, beta=0.0,
            temperature=1.0, loss_type="dapo", max_grad_norm=1.0, progress=False), train_examples=pool)
        return ours.train()[args.warmup:]

    trl_all, hist = [], []
    for _ in range(args.rounds):
        trl_all += trl_times()
        hist += our_times()
    trl_step = statistics.median(trl_all)
    our_step = statistics.median([m["step_seconds"] for m in hist])

    ratio = our_step / trl_step
    stages = {key: statistics.median([m[key] for m in hist]) for key in ("time_rollout", "time_update")}
    print(f"TRL {trl.__version__} GRPOTrainer: {trl_step:.3f} s/step; rlcourse Trainer: {our_step:.3f} s/step "
          f"({args.prompts} prompts x {args.generations} samples, <= {args.max_completion_length} new tokens, "
          f"median of {args.rounds} rounds x {args.steps} steps after {args.warmup} warm-up)")
    print(f"rlcourse stages (median s): rollout {stages['time_rollout']:.3f}, update {stages['time_update']:.3f}")
    print(f"ratio rlcourse / TRL = {ratio:.2f}; target <= 0.5: {'MET' if ratio <= 0.5 else 'MISSED'}")
    return 0 if ratio <= 0.5 else 1


class _Ex:
    """The verifier only reads the reference answer."""

    def __init__(self, answer):
        self.answer = answer


if __name__ == "__main__":
    sys.exit(main())
