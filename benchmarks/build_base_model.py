"""Target: the default addition base model builds from an empty cache in under 2 minutes on a
2-core CPU in the book profile, with the held-out accuracy its strength asks for.

    python benchmarks/build_base_model.py [--task addition] [--strength medium]
"""
import argparse
import os
import sys
import tempfile
import time

import torch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="addition")
    parser.add_argument("--strength", default="medium")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=float, default=120.0, help="target in seconds")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["RLCOURSE_CACHE"] = tempfile.mkdtemp(prefix="rlcourse-bench-")  # an empty cache
    import rlcourse
    from rlcourse.lm import load_base_model
    from rlcourse.lm.zoo import NAMED_STRENGTHS

    prof = rlcourse.profile("book")
    start = time.perf_counter()
    model, _ = load_base_model(args.task, args.strength, prof=prof, progress=False)
    build = time.perf_counter() - start
    start = time.perf_counter()
    load_base_model(args.task, args.strength, prof=prof, progress=False)
    load = time.perf_counter() - start
    info = model.config.rlcourse_pretrain
    target = NAMED_STRENGTHS.get(args.strength, None) or float(args.strength)
    ok = build < args.limit and info["accuracy"] >= target
    print(f"base model {args.task}/{args.strength}: built in {build:.1f} s ({info['steps']} SFT steps), "
          f"held-out greedy accuracy {info['accuracy']:.3f} (asked for >= {target}); cached load {load:.2f} s; "
          f"target < {args.limit:.0f} s: {'MET' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
