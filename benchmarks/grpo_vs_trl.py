"""Seconds per GRPO step: TRL's GRPOTrainer vs rlcourse's Trainer, on CPU, with the same tiny model,
prompts, group size (8 prompts x 8 samples), max_completion_length, optimiser (AdamW, same lr) and
step count. Target (issue 34): rlcourse takes at most 0.45 of TRL's time per step.

The two trainers run in alternating rounds (TRL, rlcourse, TRL, ...), each from the same base
weights, and each one's time per step is the median over all its measured steps, so that a drift in
the machine's speed during the run weighs on both alike.

    pip install -e '.[bench]'      # TRL is not a core dependency
    python benchmarks/grpo_vs_trl.py [--steps 20] [--warmup 3] [--rounds 2]
"""
import argparse
import copy
import os
import sys
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

TARGET = 0.45  # rlcourse's seconds per step / TRL's, median of the rounds (issue 34)


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
    except ImportError:
        print("this benchmark needs TRL: pip install -e '.[bench]'")
        return 2
    from trl_common import alternate, grpo_config, rlcourse_config, step_timer

    import rlcourse
    from rlcourse.lm import load_base_model
    from rlcourse.tasks import get_task
    from rlcourse.train import Trainer

    base, tok = load_base_model("addition", "medium", prof=rlcourse.profile("book"), progress=False)
    task = get_task("addition")
    total = args.warmup + args.steps
    pool = task.examples(args.prompts * total, seed=0)

    # ---- TRL
    def reward(completions, answer, **kwargs):
        return [task.score(c, ex).reward for c, ex in zip(completions, [_Ex(a) for a in answer])]

    data = datasets.Dataset.from_dict({"prompt": [e.prompt for e in pool], "answer": [e.answer for e in pool]})

    def trl_times() -> list[float]:
        timer = step_timer()
        cfg = grpo_config(args.prompts, args.generations, args.max_completion_length, args.lr, total)
        trainer = trl.GRPOTrainer(model=copy.deepcopy(base), reward_funcs=reward, args=cfg, train_dataset=data,
                                  processing_class=tok, callbacks=[timer])
        trainer.train()
        return timer.times[args.warmup:]

    def our_times() -> list[dict]:
        ours = Trainer(copy.deepcopy(base), tok, task, rlcourse_config(args.prompts, args.generations,
                                                            args.max_completion_length, args.lr, total),
                       train_examples=pool)
        return ours.train()[args.warmup:]

    run = alternate(trl_times, our_times, args.rounds)
    trl_step, our_step, ratio, stages = run["trl"], run["ours"], run["ratio"], run["stages"]
    print(f"TRL {trl.__version__} GRPOTrainer: {trl_step:.3f} s/step; rlcourse Trainer: {our_step:.3f} s/step "
          f"({args.prompts} prompts x {args.generations} samples, <= {args.max_completion_length} new tokens, "
          f"median of {args.rounds} rounds x {args.steps} steps after {args.warmup} warm-up)")
    print(f"rlcourse stages (median s): rollout {stages['time_rollout']:.3f}, update {stages['time_update']:.3f}")
    print(f"ratio rlcourse / TRL = {ratio:.2f}; target <= {TARGET}: {'MET' if ratio <= TARGET else 'MISSED'}")
    return 0 if ratio <= TARGET else 1


class _Ex:
    """The verifier only reads the reference answer."""

    def __init__(self, answer):
        self.answer = answer


if __name__ == "__main__":
    sys.exit(main())
