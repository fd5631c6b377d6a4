"""Data parallelism (rlcourse.distributed) and the command-line entry point: two gloo processes on
the CPU take the same step, to the same weights, as one process on the whole batch."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")

from rlcourse.distributed import Group  # noqa: E402
from rlcourse.losses import agg_loss  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_shares_cover_the_prompts_once_and_refuse_too_many_processes():
    for n, world in [(5, 2), (8, 3), (4, 4)]:
        shares = [range(n)[Group(r, world).share(n)] for r in range(world)]
        assert [i for s in shares for i in s] == list(range(n))
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    with pytest.raises(ValueError, match="3 prompts per step cannot be shared by 4 processes"):
        Group(0, 4).share(3)


def test_global_token_mean_is_not_the_mean_of_local_token_means():
    """The proposition of the scale-out page: sum_r S_r / sum_r n_r differs from mean_r S_r / n_r
    when the processes hold different numbers of tokens, and global denominators give the former."""
    torch.manual_seed(0)
    losses = torch.randn(6, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0],
                         [1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.float32)
    whole = agg_loss(losses, mask, "token-mean")
    parts = [slice(0, 3), slice(3, 6)]  # process 0 holds 12 tokens, process 1 holds 4
    local = torch.stack([agg_loss(losses[p], mask[p], "token-mean") for p in parts]).mean()
    shared = sum(agg_loss(losses[p], mask[p], "token-mean", global_tokens=float(mask.sum())) for p in parts)
    assert torch.allclose(shared, whole, atol=1e-6)
    assert not torch.allclose(local, whole, atol=1e-3)


def test_backend_is_mixed_with_cuda_and_gloo_without():
    """A plain "nccl" group has no backend for the CPU scalars the loop all-reduces (denominators,
    metrics): with CUDA the group must map cpu to gloo and cuda to nccl."""
    from torch.distributed.distributed_c10d import BackendConfig

    from rlcourse.distributed import choose_backend

    assert choose_backend(cuda=False) == "gloo"
    mixed = choose_backend(cuda=True)
    assert mixed == "cpu:gloo,cuda:nccl"
    mapping = BackendConfig(mixed).get_device_backend_map()
    assert mapping["cpu"] == "gloo" and mapping["cuda"] == "nccl"
    assert "cpu" not in BackendConfig("nccl").get_device_backend_map()  # why plain nccl fails


def test_metric_keys_are_the_numbers_outside_keep():
    from rlcourse.distributed import metric_keys

    assert metric_keys({"b": 1.0, "a": 2, "flag": True, "name": "x", "step": 3}, keep={"step"}) == ["a", "b"]


def _ranks_log_different_keys(rank: int, world: int, port: int, out: str) -> None:
    """One process of the beta = 0 run: rank 1's groups all have equal rewards, so it trains no row
    and logs no clipping metrics, while rank 0's groups have live rows."""
    import torch.distributed as dist

    from rlcourse.capstone import build_tiny_qwen2, char_chat_tokenizer
    from rlcourse.train import RLConfig, Trainer

    torch.set_num_threads(1)
    _init_group(rank, world, port)
    try:
        tok = char_chat_tokenizer()
        model = build_tiny_qwen2(tok, 32, 64, 1, 2, 1, 128, seed=1)

        def reward(batch, examples, task, state):  # rank 0: a different reward per sample; rank 1: all 0
            return [float(i % 2) if rank == 0 else 0.0 for i in range(len(batch))]

        cfg = RLConfig(steps=1, prompts_per_step=4, num_generations=2, max_completion_length=4, beta=0.0,
                       learning_rate=1e-2, reward=reward, train_pool_size=16, eval_prompts=0, progress=False)
        metrics = Trainer(model, tok, "addition", cfg).step()
        Path(out, f"rank{rank}.json").write_text(json.dumps(metrics))
    finally:
        dist.destroy_process_group()


def _init_group(rank: int, world: int, port: int) -> None:
    """A gloo group on this machine whose collectives give up after 2 minutes (torch's default is
    30): a test whose ranks disagree fails instead of waiting."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=2))


def _run_processes(fn, args: tuple, nprocs: int = 2, timeout: float = 300.0) -> None:
    """``mp.spawn(fn, args, nprocs)``, but a run that has not ended after ``timeout`` seconds is
    stopped and fails the test, naming the ranks still running (``mp.spawn`` waits forever)."""
    import time

    import torch.multiprocessing as mp

    context = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):  # raises if a process failed
        if time.monotonic() >= deadline:
            alive = [rank for rank, process in enumerate(context.processes) if process.is_alive()]
            for process in context.processes:
                process.kill()
            pytest.fail(f"{fn.__name__}: ranks {alive} of {nprocs} still running after {timeout:.0f} s (stopped)")


def test_ranks_that_log_different_metrics_reduce_over_the_same_keys(tmp_path):
    """beta = 0 skips zero-advantage rows; a rank with no live row logs fewer keys. The metrics must
    still reduce (a vector of each rank's own keys made gloo abort: "48 vs 40") to one dict on every
    rank, and a metric only one rank logged is that rank's value."""
    _run_processes(_ranks_log_different_keys, (2, _free_port(), str(tmp_path)))
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0.keys() == r1.keys() and "pg_clipfrac" in r0
    for key in r0:
        assert r0[key] == pytest.approx(r1[key], nan_ok=True) or key.startswith("time") or \
            key.endswith("seconds"), key
    assert r0["frac_rows_trained"] == pytest.approx(0.5)  # rank 0 trained all its rows, rank 1 none


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_config(path: Path, model: Path, output_dir: Path, steps: int = 1) -> Path:
    # 5 prompts over 2 processes (3 and 2): unequal shares, so local denominators would differ. The
    # data-parallel engines run each row's full forward (a wrapped model runs one forward per backward),
    # so the one-process run compared with them does too, and the two agree to float32 rounding
    path.write_text(f'''profile = "smoke"
model = "{model}"
output_dir = "{output_dir}"
eval_prompts = 0
lora_r = 4
lora_alpha = 8
[task_config]
min_terms = 2
max_terms = 2
min_digits = 1
max_digits = 1
operators = ["+", "-"]
allow_parentheses = false
allow_negation = false
[rl]
steps = {steps}
prompts_per_step = 5
num_generations = 4
max_completion_length = 4
learning_rate = 0.01
beta = 0.1
entropy_coef = 0.05
sampler = "policy_per_prompt"
share_prompt_forward = false
save_every = 1
train_pool_size = 64
''')
    return path


def _adapter(checkpoint: Path) -> dict:
    from safetensors.torch import load_file
    return load_file(str(checkpoint / "adapter" / "adapter_model.safetensors"))


def test_two_processes_take_the_step_of_one(tmp_path):
    from rlcourse.capstone import build_tiny_qwen2, char_chat_tokenizer, save_tiny_qwen2
    from rlcourse.capstone.cli import train_from_config
    from rlcourse.profiles import one_torch_thread

    tok = char_chat_tokenizer()
    # a random model rarely earns a reward, so the entropy bonus (aggregated with the same global
    # denominators as the policy loss) is what moves the adapter in this one step
    model_dir = save_tiny_qwen2(tmp_path / "tiny", build_tiny_qwen2(tok, 32, 64, 1, 2, 1, 256), tok)
    cfg_dp = _write_config(tmp_path / "dp.toml", model_dir, tmp_path / "dp")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), "-m", "rlcourse", "train", "--config", str(cfg_dp), "--no-progress"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cfg_one = _write_config(tmp_path / "one.toml", model_dir, tmp_path / "one")
    with one_torch_thread():
        result = train_from_config(cfg_one, progress=False)
    dp, one = _adapter(tmp_path / "dp" / "checkpoint-000001"), _adapter(tmp_path / "one" / "checkpoint-000001")
    assert dp.keys() == one.keys() and dp
    history = [json.loads(line) for line in (tmp_path / "dp" / "metrics.jsonl").read_text().splitlines()]
    assert history[0]["response_tokens"] == result["history"][0]["response_tokens"]  # the same 20 rollouts
    assert history[0]["loss"] == pytest.approx(result["history"][0]["loss"], abs=1e-5)
    moved = max(float(t.abs().max()) for k, t in one.items() if "lora_B" in k)
    assert moved > 1e-4, "the step did not move the adapter: nothing was compared"
    for key in one:
        assert torch.allclose(dp[key], one[key], atol=1e-6, rtol=1e-5), key


def _torchrun(config: Path, *extra: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), "-m", "rlcourse", "train", "--config", str(config), "--no-progress",
           *extra]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_two_processes_resume_exactly(tmp_path):
    """Two gloo processes stopped after step 1 and resumed from its checkpoint end step 2 with the
    adapter of an uninterrupted two-process run."""
    from rlcourse.capstone import build_tiny_qwen2, char_chat_tokenizer, save_tiny_qwen2

    tok = char_chat_tokenizer()
    model_dir = save_tiny_qwen2(tmp_path / "tiny", build_tiny_qwen2(tok, 32, 64, 1, 2, 1, 256), tok)
    _torchrun(_write_config(tmp_path / "whole.toml", model_dir, tmp_path / "whole", steps=2))
    _torchrun(_write_config(tmp_path / "cut.toml", model_dir, tmp_path / "cut", steps=1))
    _torchrun(_write_config(tmp_path / "cut.toml", model_dir, tmp_path / "cut", steps=2), "--resume")
    whole, resumed = _adapter(tmp_path / "whole" / "checkpoint-000002"), _adapter(tmp_path / "cut" / "checkpoint-000002")
    first = _adapter(tmp_path / "whole" / "checkpoint-000001")
    assert whole.keys() == resumed.keys() and whole
    assert max(float((whole[k] - first[k]).abs().max()) for k in whole) > 1e-4  # step 2 moved the adapter
    for key in whole:
        assert torch.equal(whole[key], resumed[key]), key


def _tiny_lm():
    from rlcourse.capstone import build_tiny_qwen2, char_chat_tokenizer
    tok = char_chat_tokenizer()
    return build_tiny_qwen2(tok, 32, 64, 1, 2, 1, 128, seed=1), tok


def test_cat_batches_keeps_every_row_meaning_what_it_meant():
    from rlcourse.lm import response_logprobs, sample
    from rlcourse.lm.sampling import cat_batches

    model, tok = _tiny_lm()
    gen = torch.Generator().manual_seed(0)
    a = sample(model, tok, ["Q: 1+1? A: ", "Q: 12+7? A: "], num_generations=2, max_new_tokens=5, generator=gen)
    b = sample(model, tok, ["Q: 3? A: "], num_generations=3, max_new_tokens=3, generator=gen)
    both = cat_batches([a, b], tok.pad_token_id)
    assert len(both) == 7 and both.index.tolist() == [0, 0, 1, 1, 2, 2, 2]
    assert both.texts == a.texts + b.texts and both.prompts == a.prompts + b.prompts
    with torch.no_grad():
        again = response_logprobs(model, both.input_ids, both.attention_mask, both.response_len, both.temperature)
    for part, rows in [(a, slice(0, 4)), (b, slice(4, 7))]:
        T = part.response_len
        assert torch.allclose(again[rows, :T] * part.response_mask, part.logprobs, atol=1e-5)
        assert both.response_mask[rows, T:].sum() == 0
    with pytest.raises(ValueError, match="temperature"):
        cat_batches([a, sample(model, tok, ["x"], max_new_tokens=2, temperature=0.5)], tok.pad_token_id)
    with pytest.raises(ValueError, match="at least one"):
        cat_batches([], tok.pad_token_id)


def test_per_prompt_sampler_does_not_depend_on_the_other_prompts():
    from rlcourse.rollout import get_sampler
    from rlcourse.train import RLConfig

    model, tok = _tiny_lm()
    sampler, cfg = get_sampler("policy_per_prompt"), RLConfig(num_generations=3, max_completion_length=6, seed=4)
    alone = sampler(model, tok, ["Q: 5+5? A: "], cfg, step=2)
    shared = sampler(model, tok, ["Q: 1+8? A: ", "Q: 5+5? A: "], cfg, step=2)
    assert shared.texts[3:] == alone.texts
    assert torch.allclose(shared.logprobs[3:, :alone.response_len], alone.logprobs)
    from rlcourse.rollout import prompt_seed
    assert prompt_seed(4, 2, "a") != prompt_seed(4, 3, "a") and prompt_seed(4, 2, "a") == prompt_seed(4, 2, "a")


def test_config_files_refuse_what_they_cannot_mean(tmp_path):
    from rlcourse.capstone.cli import config_from_mapping, main, read_config_file

    cfg, run = config_from_mapping({"profile": "smoke", "lora_r": 2, "ks": [1, 2], "rl": {"steps": 7}, "seed": 3})
    assert cfg.lora_r == 2 and cfg.ks == (1, 2) and run == {"profile": "smoke", "seed": 3}
    assert cfg.rl["steps"] == 7 and cfg.rl["num_generations"] == 4  # rl merged over the profile's
    with pytest.raises(ValueError, match=r"unknown config keys \['lora_rank'\]"):
        config_from_mapping({"lora_rank": 4})
    with pytest.raises(ValueError, match="not fields of RLConfig"):
        config_from_mapping({"rl": {"stepz": 1}})
    with pytest.raises(FileNotFoundError, match="no config file"):
        read_config_file(tmp_path / "missing.toml")
    bad = tmp_path / "run.ini"
    bad.write_text("x = 1")
    with pytest.raises(ValueError, match=r"\.toml, \.yaml"):
        read_config_file(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="mapping"):
        read_config_file(listed)
    with pytest.raises(SystemExit):
        main(["train"])  # --config is required


# ---------------------------------------------------------------------- DDP and FSDP engines
LIVE_STEPS = {1: 3, 2: 5, 3: 3}  # step -> how many of the step's 5 prompts have rewards that differ
MICRO_BATCH = 2


def _engine_run(rank: int, world: int, port: int, out: str, parallel: str, steps: int, resume: bool = False) -> None:
    """Train a LoRA adapter on a tiny Qwen2 for ``steps`` steps with beta = 0, in one process
    (``world == 1``) or as one of ``world`` gloo processes under ``parallel``. Every step takes the
    same 5 prompts (3 for rank 0, 2 for rank 1); only the first ``LIVE_STEPS[step]`` have rewards
    that differ, so at steps 1 and 3 rank 1 has no live row at all. Micro-batches of 2 rows give
    rank 0 three passes and rank 1 none or two."""
    from rlcourse.capstone import add_lora, build_tiny_qwen2, char_chat_tokenizer
    from rlcourse.capstone.parallel import ParallelTrainer
    from rlcourse.distributed import finish
    from rlcourse.tasks import get_task
    from rlcourse.train import RLConfig

    torch.set_num_threads(1)
    if world > 1:
        _init_group(rank, world, port)
    trainer = None
    try:
        tok = char_chat_tokenizer()
        policy = add_lora(build_tiny_qwen2(tok, 32, 64, 2, 2, 1, 128, seed=1), r=4, alpha=8,
                          target_modules=("q_proj", "v_proj"), seed=0)
        pool = get_task("addition").examples(8, seed=0, split="train")
        live = {step: {e.prompt for e in pool[:n]} for step, n in LIVE_STEPS.items()}

        def first_prompts(pool, n):
            return pool[:n]

        def reward(batch, examples, task, state, step):  # alternating rewards within a live group
            return [float(i % 2) if e.prompt in live[step] else 0.0 for i, e in enumerate(examples)]

        cfg = RLConfig(steps=steps, prompts_per_step=5, num_generations=2, max_completion_length=5, beta=0.0,
                       learning_rate=1e-2, micro_batch_size=MICRO_BATCH, reward=reward, prompt_sampler=first_prompts,
                       sampler="policy_per_prompt", eval_prompts=0, progress=False, output_dir=out, save_every=1)
        trainer = ParallelTrainer(policy, tok, "addition", cfg, parallel=parallel, train_examples=pool,
                                  resume=resume)
        trainer.train()
    finally:
        if world > 1:  # the DDP wrapper first, then the group (destroyed the other way round, both ranks could hang)
            finish(*([trainer.dp] if trainer is not None else []))


def _spawn(parallel: str, out: Path, steps: int, resume: bool = False) -> None:
    _run_processes(_engine_run, (2, _free_port(), str(out), parallel, steps, resume))


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_engines_take_the_steps_of_one_process_and_resume_exactly(tmp_path, parallel):
    """DDP and FSDP (torch's engines, gloo, 2 processes) reach the adapter of one process on the
    whole batch after 3 steps, although rank 1 has no live row at steps 1 and 3 (beta = 0 skips
    them) and the ranks run different numbers of micro-batches; and a run resumed from step 1's
    checkpoint ends with the uninterrupted run's adapter."""
    import shutil

    from rlcourse.profiles import one_torch_thread

    with one_torch_thread():
        _engine_run(0, 1, 0, str(tmp_path / "one"), parallel, steps=3)
    _spawn(parallel, tmp_path / "dp", steps=3)
    one, dp = _adapter(tmp_path / "one" / "checkpoint-000003"), _adapter(tmp_path / "dp" / "checkpoint-000003")
    start = _adapter(tmp_path / "one" / "checkpoint-000001")
    assert one.keys() == dp.keys() and one
    assert max(float((one[k] - start[k]).abs().max()) for k in one) > 1e-3  # steps 2 and 3 moved it
    for key in one:
        assert torch.allclose(dp[key], one[key], atol=1e-5, rtol=0), (key, float((dp[key] - one[key]).abs().max()))
    history = [json.loads(line) for line in (tmp_path / "dp" / "metrics.jsonl").read_text().splitlines()]
    assert [h["frac_rows_trained"] for h in history] == [0.5, 1.0, 0.5]  # averaged: rank 1 trains none, all, none
    shutil.copytree(tmp_path / "dp" / "checkpoint-000001", tmp_path / "cut" / "checkpoint-000001")
    _spawn(parallel, tmp_path / "cut", steps=3, resume=True)
    resumed = _adapter(tmp_path / "cut" / "checkpoint-000003")
    for key in dp:
        assert torch.equal(resumed[key], dp[key]), key


def test_finish_frees_the_ddp_wrapper_while_the_group_still_exists(tmp_path):
    """DDP's reducer holds the process group and keeps the GIL in its destructor: freed after
    ``destroy_process_group`` it destroys the group itself, waiting for a gloo thread that waits for
    the GIL (the DDP test above hung so in 2 of 9 runs on a 2-core machine, 7 Dec 2026). :func:`finish` frees the
    wrapper first; the engine is unusable after."""
    import weakref

    import torch.distributed as dist

    from rlcourse.distributed import Engine, PARALLEL, finish

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    model = torch.nn.Linear(2, 1)
    engine = Engine(0, 1, "ddp", PARALLEL["ddp"](model, torch.optim.SGD(model.parameters(), lr=0.1)))
    engine.module(torch.ones(3, 2)).sum().backward()  # a reduction ran: the group's threads have worked
    group_alive_when_freed = []
    weakref.finalize(engine.module, lambda: group_alive_when_freed.append(dist.is_initialized()))
    finish(engine)
    assert group_alive_when_freed == [True] and engine.module is None and not dist.is_initialized()
    finish()  # a single process, or a group already ended: nothing to do


def test_optimizer_state_round_trips_between_indices_and_names_and_unknown_engines_are_refused():
    from rlcourse.distributed import engage, optimizer_parameter_names, optimizer_state_by_index, \
        optimizer_state_by_name

    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(4, 2)).sum().backward()
    opt.step()
    names = optimizer_parameter_names(model, opt)
    assert names == ["0.weight", "0.bias", "1.weight", "1.bias"]
    state = opt.state_dict()
    by_name = optimizer_state_by_name(state, names)
    assert set(by_name["state"]) == set(names) and by_name["param_groups"][0]["params"] == names
    back = optimizer_state_by_index(by_name, names)
    assert back["param_groups"] == state["param_groups"]
    assert all(torch.equal(back["state"][i]["exp_avg"], state["state"][i]["exp_avg"]) for i in range(4))
    with pytest.raises(ValueError, match=r"unknown parallel strategy 'zero3'; choose one of \['ddp', 'fsdp'\]"):
        engage(model, opt, "zero3")
