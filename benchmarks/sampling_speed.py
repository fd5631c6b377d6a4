"""Target: sampling 64 prompts x 8 samples x 16 new tokens with the default tiny model (book profile)
takes under 1 second on 2 cores. Reports the median of several runs after a warm-up.

    python benchmarks/sampling_speed.py [--prompts 64] [--samples 8] [--tokens 16]
"""
import argparse
import statistics
import sys
import time

import torch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import rlcourse
    from rlcourse.lm import build_model, build_tokenizer, sample
    from rlcourse.tasks import get_task

    tok = build_tokenizer()
    model = build_model(tok, rlcourse.profile("book"))  # untrained: rows rarely reach EOS, so all 16 steps run
    prompts = [e.prompt for e in get_task("addition").examples(args.prompts)]
    times = []
    for i in range(args.repeats + 1):
        start = time.perf_counter()
        batch = sample(model, tok, prompts, num_generations=args.samples, max_new_tokens=args.tokens,
                       temperature=1.0, generator=torch.Generator().manual_seed(i))
        times.append(time.perf_counter() - start)
    med = statistics.median(times[1:])
    n_tokens = int(batch.response_mask.sum())
    ok = med < args.limit
    print(f"sampling {args.prompts} prompts x {args.samples} samples x {args.tokens} new tokens "
          f"({len(batch)} rows, {batch.response_len} steps, {n_tokens} tokens): median {med:.3f} s "
          f"over {args.repeats} runs; target < {args.limit} s: {'MET' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
