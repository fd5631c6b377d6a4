"""GPU check: training throughput and MFU, rollout speed and peak memory of a Qwen2.5-0.5B-shaped model.

    python benchmarks/gpu_check.py            # on a GPU: the real shape, bf16 (about 3-5 minutes)
    python benchmarks/gpu_check.py --tiny     # anywhere, in seconds: a tiny model of the same family (a test runs this)

The model is built from a ``Qwen2Config`` with random weights (no download): the shape of
Qwen/Qwen2.5-0.5B (24 layers, hidden 896, 14 query heads and 2 key-value heads, vocabulary 151,936,
tied embeddings). It prints

- the training step (forward + backward + AdamW, bf16, gradient checkpointing optional): tokens per
  second, achieved FLOP/s and MFU, with FLOPs counted by the PaLM convention
  ``6 N + 12 L d S`` per token (``N`` the parameters in matrix multiplies, the tied output head
  included; ``L`` layers, ``d`` the model width, ``S`` the sequence length);
- rollout tokens per second of rlcourse's sampler (:func:`rlcourse.lm.sample`) against plain
  ``model.generate`` with the same prompts, batch and sampling settings;
- rlcourse's own RL update: one step of :class:`rlcourse.train.Trainer` with a LoRA adapter (rank 16
  on every projection) on a batch of the capstone's full-profile shape (16 prompts x 8 samples, 128
  prompt and 384 response tokens, micro-batches of 16, the reference pass, gradient checkpointing),
  with random tokens and rewards: its update's tokens per second and FLOP/s (``4 N`` per token plus
  attention: LoRA's backward carries activation gradients through the frozen weights) and MFU;
- the peak memory of each part.

The plain training step's default batch for the real shape is 8 x 2048 tokens (16 x 2048 without
checkpointing needs more than an 80 GB H100 holds at the peak of the forward pass). With
``--checkpointing`` the count above leaves out the recomputed forward, so the MFU it reports is at most
0.75 of the hardware's actual use.

The peak FLOP/s that MFU divides by comes from a table of dense bf16 peaks for known GPUs, or from
``--peak-tflops``; on a CPU it is the matmul rate this script measures (so the "MFU" there is the share
of this machine's own achievable matmul rate). Target: MFU >= 0.40 on a GPU; the script exits 1 when
a GPU run misses it. Nothing is asserted on a CPU.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

# dense bf16 peaks (no sparsity), TFLOP/s, by a substring of torch.cuda.get_device_name()
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100 SXM": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "H20": 148.0,
                    "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 125.0, "RTX 4090": 165.0, "B200": 2250.0}
TARGET_MFU = 0.40


def qwen25_05b_config(tiny: bool):
    """The Qwen2.5-0.5B shape, or a tiny model of the same family."""
    from transformers import Qwen2Config

    if tiny:
        return Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           tie_word_embeddings=True, rope_theta=1e6)
    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)


def matmul_params(model) -> int:
    """Parameters that take part in a matrix multiply per token: every 2-D weight of the decoder
    layers, plus the output head (counted once even when tied to the embedding; the embedding
    lookup itself is not a multiply)."""
    n = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in name)
    head = model.get_output_embeddings().weight
    if all(head is not p for name, p in model.named_parameters() if "embed_tokens" not in name):
        n += head.numel()
    return n


def flops_per_token(model, seq_len: int) -> float:
    """PaLM's count for forward + backward: ``6 N + 12 L d S``."""
    cfg = model.config
    return 6.0 * matmul_params(model) + 12.0 * cfg.num_hidden_layers * cfg.hidden_size * seq_len


def update_flops(model, tokens: int, seq_len: int) -> float:
    """Forward + backward of a LoRA step: ``4 N`` per token plus PaLM's attention term ``12 L d S``."""
    cfg = model.config
    return tokens * (4.0 * matmul_params(model) + 12.0 * cfg.num_hidden_layers * cfg.hidden_size * seq_len)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measured_matmul_peak(device, dtype, n: int = 1024, reps: int = 10) -> float:
    """FLOP/s of a square matmul on this device: the practical peak for a CPU."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t)


def peak_flops(device, dtype, override_tflops: float | None) -> tuple[float, str]:
    if override_tflops:
        return override_tflops * 1e12, "given by --peak-tflops"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, tflops in PEAK_BF16_TFLOPS.items():
            if key in name:
                return tflops * 1e12, f"dense bf16 peak of {key} ({name})"
        raise SystemExit(f"unknown GPU {name!r}: pass its dense bf16 peak with --peak-tflops")
    return measured_matmul_peak(device, dtype, n=256 if dtype == torch.float32 else 512), \
        "this CPU's measured matmul rate"


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.empty_cache()


def peak_memory_gib(device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def bench_training(model, device, batch: int, seq_len: int, steps: int, warmup: int, checkpointing: bool) -> dict:
    """Forward + backward + fused AdamW on random tokens; tokens/s and FLOP/s of the steady state."""
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq_len), generator=gen).to(device)
    reset_peak(device)
    times = []
    for i in range(warmup + steps):
        sync(device)
        t = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t)
    if checkpointing:
        model.gradient_checkpointing_disable()
    model.eval()
    per_step = sorted(times)[len(times) // 2]
    tokens = batch * seq_len
    return {"seconds_per_step": per_step, "tokens_per_second": tokens / per_step,
            "flops_per_second": flops_per_token(model, seq_len) * tokens / per_step,
            "peak_memory_gib": peak_memory_gib(device), "loss": loss.item()}


class _Tokenizer:
    """The least a tokenizer must do for :func:`rlcourse.lm.sample` on random-token prompts."""

    def __init__(self, vocab: int):
        self.vocab, self.pad_token_id, self.eos_token_id = vocab, 0, 1

    def __call__(self, texts, **kw):
        rows = [[2 + (int(x) % (self.vocab - 2)) for x in t.split()] for t in texts]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
        return {"input_ids": ids, "attention_mask": (ids != 0).long()}

    def batch_decode(self, ids, skip_special_tokens=True):
        return [" ".join(str(int(t)) for t in row if int(t) > 1) for row in ids]


def bench_rollout(model, device, prompts: int, group: int, prompt_len: int, new_tokens: int, reps: int) -> dict:
    """rlcourse's sampler against ``generate`` on the same prompts, ``group`` samples each, no EOS
    (every row decodes ``new_tokens`` tokens, so both produce the same number of tokens)."""
    from rlcourse.lm import sample

    tok = _Tokenizer(model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    texts = [" ".join(str(int(x)) for x in torch.randint(0, 10**6, (prompt_len,), generator=gen)) for _ in range(prompts)]
    enc = tok(texts)
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    # no EOS for either: suppress token 1 in rlcourse's sampler by making it impossible to sample
    head = model.get_output_embeddings()
    bias_hook = head.register_forward_hook(lambda m, i, o: o.index_fill(-1, torch.tensor([1], device=o.device), float("-inf")))
    out = {}
    try:
        def run_rlcourse():
            return sample(model, tok, texts, num_generations=group, max_new_tokens=new_tokens, temperature=1.0,
                          generator=torch.Generator().manual_seed(1), engine="hf")

        def run_generate():
            return model.generate(input_ids=ids.repeat_interleave(group, 0), attention_mask=mask.repeat_interleave(group, 0),
                                  do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens)

        for name, fn in (("rlcourse", run_rlcourse), ("generate", run_generate)):
            fn()  # warm-up
            reset_peak(device)
            times = []
            for _ in range(reps):
                sync(device)
                t = time.perf_counter()
                fn()
                sync(device)
                times.append(time.perf_counter() - t)
            per = sorted(times)[len(times) // 2]
            out[name] = {"seconds": per, "tokens_per_second": prompts * group * new_tokens / per,
                         "peak_memory_gib": peak_memory_gib(device)}
    finally:
        bias_hook.remove()
    out["speedup"] = out["generate"]["seconds"] / out["rlcourse"]["seconds"]
    return out


def bench_rl_update(model, device, prompts: int, group: int, prompt_len: int, new_tokens: int,
                    micro_batch: int, checkpointing: bool) -> dict:
    """One step of rlcourse's Trainer with LoRA on a random batch of the given shape: a sampler that
    returns the batch (no decoding), rewards that vary within each group (so every row trains), the
    reference pass (the base with the adapter off, ``beta > 0``) and the update. Returns the update's
    seconds, tokens per second and FLOP/s (:func:`update_flops`), the reference pass's seconds and the
    peak memory. ``model`` is wrapped with the adapter in place (run this last)."""
    from rlcourse.capstone import add_lora
    from rlcourse.capstone.models import enable_checkpointing
    from rlcourse.lm.sampling import RolloutBatch
    from rlcourse.train import RLConfig, Trainer

    V, B = model.config.vocab_size, prompts * group
    gen = torch.Generator().manual_seed(2)
    prompt_ids = torch.randint(2, V, (prompts, prompt_len), generator=gen).repeat_interleave(group, 0).to(device)
    response_ids = torch.randint(2, V, (B, new_tokens), generator=gen).to(device)

    def random_batch(prompts, config):  # the step's "rollout": fixed random tokens of full length
        return RolloutBatch(prompt_ids=prompt_ids, prompt_mask=torch.ones_like(prompt_ids, dtype=torch.long),
                            response_ids=response_ids, response_mask=torch.ones(B, new_tokens, device=device),
                            logprobs=torch.full((B, new_tokens), -float(torch.log(torch.tensor(float(V)))), device=device),
                            index=torch.arange(len(prompts), device=device).repeat_interleave(group),
                            truncated=torch.ones(B, dtype=torch.bool, device=device),
                            prompts=[p for p in prompts for _ in range(group)], texts=[""] * B, temperature=1.0)

    def varied(batch, examples, task, state):
        return [float(i % 2) for i in range(len(batch))]

    if checkpointing:
        enable_checkpointing(model)
    policy = add_lora(model, r=16, alpha=32)
    cfg = RLConfig(steps=1, prompts_per_step=prompts, num_generations=group, max_completion_length=new_tokens,
                   micro_batch_size=micro_batch, beta=0.04, learning_rate=1e-5, sampler=random_batch, reward=varied,
                   old_logprobs="training", train_pool_size=prompts, progress=False)
    trainer = Trainer(policy, _Tokenizer(V), "addition", cfg, eval_examples=[])
    trainer.step()  # warm-up
    reset_peak(device)
    m = trainer.step()
    tokens = B * (prompt_len + new_tokens) * m["frac_rows_trained"]
    flops = update_flops(model, int(tokens), prompt_len + new_tokens)
    return {"seconds_update": m["time_update"], "seconds_reference": m["time_reference"],
            "tokens_per_second": tokens / m["time_update"], "flops_per_second": flops / m["time_update"],
            "peak_memory_gib": peak_memory_gib(device), "rows": B, "micro_batch": micro_batch,
            "frac_rows_trained": m["frac_rows_trained"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a tiny model of the same family (seconds on a CPU)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=None, help="training sequences per step")
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing in the training step")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's dense bf16 peak")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)

    from transformers import Qwen2ForCausalLM

    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    tiny = args.tiny or not on_gpu
    torch.manual_seed(0)
    cfg = qwen25_05b_config(tiny)
    model = Qwen2ForCausalLM(cfg).to(device=device, dtype=dtype)
    n_params = sum(p.numel() for p in model.parameters())
    batch = args.batch or 8
    seq_len = args.seq_len or (64 if tiny else 2048)
    steps = args.steps or (3 if tiny else 10)
    peak, peak_src = peak_flops(device, dtype, args.peak_tflops)
    print(f"device {device} ({torch.cuda.get_device_name(device) if on_gpu else 'CPU'}), {dtype}, "
          f"{'tiny ' if tiny else ''}Qwen2 with {n_params / 1e6:.1f}M parameters "
          f"({matmul_params(model) / 1e6:.1f}M in matmuls)")
    print(f"peak for MFU: {peak / 1e9:.1f} GFLOP/s ({peak_src})")

    train = bench_training(model, device, batch, seq_len, steps, warmup=1 if tiny else 3, checkpointing=args.checkpointing)
    mfu = train["flops_per_second"] / peak
    print(f"training: {batch} x {seq_len} tokens, {train['seconds_per_step'] * 1e3:.1f} ms/step, "
          f"{train['tokens_per_second']:.0f} tokens/s, {train['flops_per_second'] / 1e9:.1f} GFLOP/s, "
          f"MFU {mfu:.3f}" + (f", peak memory {train['peak_memory_gib']:.1f} GiB" if on_gpu else ""))

    roll = bench_rollout(model, device, prompts=4 if tiny else 64, group=2 if tiny else 8, prompt_len=16 if tiny else 128,
                         new_tokens=8 if tiny else 256, reps=1 if tiny else 3)
    for name in ("rlcourse", "generate"):
        r = roll[name]
        print(f"rollout ({name}): {r['tokens_per_second']:.0f} new tokens/s ({r['seconds']:.2f} s)"
              + (f", peak memory {r['peak_memory_gib']:.1f} GiB" if on_gpu else ""))
    print(f"rollout speed-up of rlcourse's sampler over generate: {roll['speedup']:.2f}x")

    rl = bench_rl_update(model, device, prompts=2 if tiny else 16, group=4 if tiny else 8,
                         prompt_len=16 if tiny else 128, new_tokens=8 if tiny else 384, micro_batch=4 if tiny else 16,
                         checkpointing=not tiny)
    rl["mfu"] = rl["flops_per_second"] / peak
    print(f"rlcourse RL update (LoRA r=16, {rl['rows']} rows in micro-batches of {rl['micro_batch']}): "
          f"{rl['seconds_update']:.2f} s, {rl['tokens_per_second']:.0f} tokens/s, "
          f"{rl['flops_per_second'] / 1e9:.1f} GFLOP/s, MFU {rl['mfu']:.3f}; reference pass {rl['seconds_reference']:.2f} s"
          + (f", peak memory {rl['peak_memory_gib']:.1f} GiB" if on_gpu else ""))

    results = {"device": str(device), "gpu": torch.cuda.get_device_name(device) if on_gpu else None, "tiny": tiny,
               "dtype": str(dtype), "params": n_params, "peak_flops": peak, "peak_source": peak_src,
               "training": train, "mfu": mfu, "rollout": roll, "rl_update": rl, "date": time.strftime("%Y-%m-%d"),
               "command": " ".join(sys.argv)}
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if on_gpu and not tiny:
        ok = mfu >= TARGET_MFU
        print(f"target MFU >= {TARGET_MFU}: {'MET' if ok else 'MISSED'}")
        return 0 if ok else 1
    print("(CPU or tiny run: no target is checked)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
