"""What one rlcourse GRPO step does, counted rather than timed. Per stage (``rollout``: the sampler;
``score``: the reward; ``update``: forward, loss, backward and optimiser step) it counts the tensor
operations run (aten ops as ``torch.profiler`` counts them, nested ones included, backward too), the
scalar syncs among them (``.item()``, ``float(tensor)``), the Python function calls (``cProfile``)
and the policy's forward passes; and the workload they served (rows, engine passes, tokens sampled,
rows trained).

The counts do not depend on how loaded the machine is, so a regression of the step shows here on any
machine: more ops or calls per step at the same workload is the code, a larger workload at the same
ops per token is the base model or the data. The configuration is that of ``grpo_vs_trl.py``
(8 prompts x 8 samples, <= 16 new tokens, ``loss_type="dapo"``, ``beta=0``).

    python benchmarks/grpo_step_profile.py [--steps 3] [--warmup 2] [--profile book] [--top 8]
    python benchmarks/grpo_step_profile.py --model DIR --json a.json              # at one commit
    python benchmarks/grpo_step_profile.py --model DIR --compare a.json           # at another: the differences

``--profile smoke`` builds a tiny base model in seconds (the counts are then not comparable with
the book profile's). Process CPU seconds per stage are printed too, for orientation only: they
depend on the machine.
"""
from __future__ import annotations

import argparse
import cProfile
import collections
import contextlib
import functools
import json
import os
import pstats
import re
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

STAGES = ("rollout", "score", "update")
SYNC_OPS = {"aten::_local_scalar_dense"}  # what .item(), float(t), int(t), bool(t) dispatch


@contextlib.contextmanager
def quiet_stderr():
    """Send what C++ code writes to stderr (file descriptor 2) to /dev/null for a moment."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


class StageRecorder:
    """Per step and stage: aten op counts, Python calls (cProfile), process CPU seconds."""

    def __init__(self, count: bool):
        self.count = count
        self.steps: list[dict] = []

    def new_step(self):
        self.steps.append({s: {"ops": collections.Counter(), "calls": collections.Counter(), "cpu": 0.0}
                           for s in STAGES})

    def run(self, stage: str, fn, *args, **kwargs):
        rec = self.steps[-1][stage]
        prof = cProfile.Profile() if self.count else None
        t = time.process_time()
        if self.count:
            ops = profile(activities=[ProfilerActivity.CPU])
            with quiet_stderr():  # the profiler's start and stop lines
                ops.__enter__()
            prof.enable()
            try:
                out = fn(*args, **kwargs)
            finally:
                prof.disable()
                with quiet_stderr():
                    ops.__exit__(None, None, None)
            for event in ops.key_averages():
                if event.key.startswith("aten::"):
                    rec["ops"][event.key] += event.count
            for (file, line, name), row in pstats.Stats(prof).stats.items():  # row[1]: all calls, with recursion
                name = re.sub(r" at 0x[0-9a-f]+", "", name)  # no addresses: names compare across runs
                rec["calls"][name if file == "~" else f"{Path(file).name}:{name}"] += row[1]
        else:
            out = fn(*args, **kwargs)
        rec["cpu"] += time.process_time() - t
        return out


def instrument(trainer, recorder: StageRecorder) -> None:
    """Wrap the trainer's sampler (rollout), reward (score) and update; the signatures stay visible
    (``functools.wraps``), since the loop passes each part only the arguments it names."""
    sampler, reward, update = trainer.sampler, trainer.reward_fn, trainer._update

    @functools.wraps(sampler)
    def rollout(*a, **k):
        recorder.new_step()
        return recorder.run("rollout", sampler, *a, **k)

    @functools.wraps(reward)
    def score(*a, **k):
        return recorder.run("score", reward, *a, **k)

    @functools.wraps(update)
    def train(*a, **k):
        return recorder.run("update", update, *a, **k)

    trainer.sampler, trainer.reward_fn, trainer._update = rollout, score, train


FORWARD_FUNCTIONS = ("engine.py:lean_forward", "model.py:shared_prefix_logprobs", "model.py:response_logprobs")


def summarise(recorder: StageRecorder, history: list[dict], rows: int) -> dict:
    """Per-step means of the counts (and the median CPU seconds) of each stage, and the workload."""
    n = len(recorder.steps)
    out = {"workload": {
        "rows": rows,
        "engine passes": statistics.mean(s["rollout"]["calls"].get("engine.py:lean_forward", 0)
                                         for s in recorder.steps),
        "tokens sampled": statistics.mean(m["response_tokens"] for m in history),
        "reward": statistics.mean(m["reward"] for m in history),
        "rows trained": statistics.mean(m["frac_rows_trained"] * rows for m in history),
    }, "stages": {}}
    for stage in STAGES:
        ops = sum((s[stage]["ops"] for s in recorder.steps), collections.Counter())
        calls = sum((s[stage]["calls"] for s in recorder.steps), collections.Counter())
        out["stages"][stage] = {
            "aten ops": sum(ops.values()) / n, "syncs": sum(ops[o] for o in SYNC_OPS) / n,
            "python calls": sum(calls.values()) / n,
            "forward passes": sum(calls.get(f, 0) for f in FORWARD_FUNCTIONS) / n,
            "cpu seconds": statistics.median(s[stage]["cpu"] for s in recorder.steps),
            "ops": {k: v / n for k, v in ops.most_common()}, "calls": {k: v / n for k, v in calls.most_common()},
        }
    return out


def report(summary: dict, top: int, other: dict | None = None) -> None:
    """Print the workload, the per-stage table and the commonest ops and calls; with ``other`` (an
    earlier ``--json``), the differences from it as well."""
    print("workload per step (mean): " + ", ".join(f"{k} {v:.1f}" for k, v in summary["workload"].items()))
    if other:
        print("  earlier:                 " + ", ".join(f"{k} {v:.1f}" for k, v in other["workload"].items()))
    keys = ("aten ops", "syncs", "python calls", "forward passes")
    print(f"{'stage':<8} {'aten ops':>9} {'syncs':>6} {'py calls':>9} {'fwd':>5} {'CPU s':>7}" +
          ("   (earlier: ops, syncs, calls, fwd)" if other else ""))
    for stage, st in summary["stages"].items():
        line = f"{stage:<8} {st['aten ops']:>9.0f} {st['syncs']:>6.0f} {st['python calls']:>9.0f} " \
               f"{st['forward passes']:>5.0f} {st['cpu seconds']:>7.3f}"
        if other:
            line += "   (" + ", ".join(f"{other['stages'][stage][k]:.0f}" for k in keys) + ")"
        print(line)
    for stage, st in summary["stages"].items():
        print(f"\n{stage}: top aten ops per step: " + ", ".join(
            f"{name.removeprefix('aten::')} {c:.0f}" for name, c in list(st["ops"].items())[:top]))
        print(f"{stage}: top Python calls per step: " + ", ".join(
            f"{name} {c:.0f}" for name, c in list(st["calls"].items())[:top]))
        if other:
            for what in ("ops", "calls"):
                old = other["stages"][stage][what]
                delta = {k: st[what].get(k, 0) - old.get(k, 0) for k in set(st[what]) | set(old)}
                changed = sorted((k for k in delta if abs(delta[k]) >= 0.5), key=lambda k: -abs(delta[k]))[:top]
                print(f"{stage}: {what} per step, now minus earlier: " +
                      (", ".join(f"{k} {delta[k]:+.0f}" for k in changed) or "no difference"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="book", choices=("smoke", "book", "full"))
    parser.add_argument("--model", help="a saved model folder to start from instead of the profile's "
                                        "addition/medium base model (to compare two commits on one model)")
    parser.add_argument("--steps", type=int, default=3, help="counted steps (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top", type=int, default=8, help="ops and Python functions listed per stage")
    parser.add_argument("--json", help="write the counts here (every op and call, per step)")
    parser.add_argument("--compare", help="a --json file of an earlier run (another commit): print the differences")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    import rlcourse
    from rlcourse.lm import load_base_model
    from rlcourse.tasks import get_task
    from rlcourse.train import RLConfig, Trainer

    if args.model:
        from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

        base = AutoModelForCausalLM.from_pretrained(args.model).eval()
        tok = PreTrainedTokenizerFast.from_pretrained(args.model)
    else:
        base, tok = load_base_model("addition", "medium", prof=rlcourse.profile(args.profile), progress=False)
    info = getattr(base.config, "rlcourse_pretrain", {}) or {}
    task = get_task("addition")
    total = args.warmup + args.steps
    pool = task.examples(args.prompts * total, seed=0)
    cfg = RLConfig(num_generations=args.generations, prompts_per_step=args.prompts,
                   max_completion_length=args.max_completion_length, learning_rate=args.lr, steps=total, beta=0.0,
                   temperature=1.0, loss_type="dapo", max_grad_norm=1.0, progress=False)
    trainer = Trainer(base, tok, task, cfg, train_examples=pool)
    recorder = StageRecorder(count=False)
    instrument(trainer, recorder)
    for _ in range(args.warmup):
        trainer.step()
    recorder.steps.clear()
    recorder.count = True
    history = [trainer.step() for _ in range(args.steps)]

    print(f"rlcourse GRPO step, counted over {args.steps} steps after {args.warmup} warm-up (torch "
          f"{torch.__version__}, {args.threads} thread(s)); base model: {args.model or 'addition/medium'}, "
          f"{args.profile} profile, pretrained {info.get('steps', '?')} steps to held-out accuracy "
          f"{info.get('accuracy', float('nan')):.3f}")
    summary = summarise(recorder, history, args.prompts * args.generations)
    other = json.loads(Path(args.compare).read_text()) if args.compare else None
    report(summary, args.top, other)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
