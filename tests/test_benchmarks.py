"""The GPU check runs in its tiny form on the CPU, so the script cannot rot."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_tiny_on_cpu(tmp_path):
    gpu_check = load("gpu_check")
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--tiny", "--device", "cpu", "--steps", "2", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["tiny"] and r["training"]["tokens_per_second"] > 0 and r["mfu"] > 0
    assert r["rollout"]["rlcourse"]["tokens_per_second"] > 0 and r["rollout"]["generate"]["tokens_per_second"] > 0
    rl = r["rl_update"]  # rlcourse's own RL step, every row trained (rewards vary in each group)
    # MFU is a ratio of two timings (the update's FLOP/s over a matmul peak measured a moment before): on a
    # machine shared with other jobs either can be slowed alone, so only its sign is a unit-test property
    assert rl["frac_rows_trained"] == 1.0 and rl["tokens_per_second"] > 0 and rl["mfu"] > 0


def test_flop_count_of_the_real_shape():
    # 6 N + 12 L d S with N the matmul parameters: Qwen2.5-0.5B has 494M parameters, of which the
    # 136M of the tied embedding count once (as the output head)
    gpu_check = load("gpu_check")
    from transformers import Qwen2ForCausalLM
    import torch
    with torch.device("meta"):
        model = Qwen2ForCausalLM(gpu_check.qwen25_05b_config(tiny=False))
    total = sum(p.numel() for p in model.parameters())
    assert 490e6 < total < 500e6
    n = gpu_check.matmul_params(model)
    assert n == total - sum(p.numel() for p in model.parameters() if p.dim() == 1)
    assert gpu_check.flops_per_token(model, 1024) == 6 * n + 12 * 24 * 896 * 1024


def test_grpo_lora_vs_trl_runs_in_its_tiny_form(capsys):
    import pytest
    pytest.importorskip("trl")
    bench = load("grpo_lora_vs_trl")
    assert bench.main(["--tiny", "--gradient-checkpointing"]) == 0  # the setting's path, on both sides
    out = capsys.readouterr().out
    assert "ratio rlcourse / TRL" in out and "GFLOP/s achieved" in out
    assert "gradient checkpointing on on both sides" in out


def test_lora_update_flops_count_four_n_per_token():
    # LoRA's backward still carries activation gradients through the frozen weights: 4 N per token
    bench = load("grpo_lora_vs_trl")
    gpu_check = load("gpu_check")
    from transformers import Qwen2ForCausalLM
    import torch
    with torch.device("meta"):
        model = Qwen2ForCausalLM(gpu_check.qwen25_05b_config(tiny=True))
    n, cfg = gpu_check.matmul_params(model), model.config
    assert bench.update_flops(model, 10, 32) == 10 * (4 * n + 12 * cfg.num_hidden_layers * cfg.hidden_size * 32)


def test_trl_comparison_sets_gradient_checkpointing_alike():
    """TRL's GRPOConfig turns gradient checkpointing on by default; the comparison sets it explicitly,
    off unless asked, so neither side re-runs its forward pass when the other does not."""
    import pytest
    pytest.importorskip("trl")
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    trl_common = load("trl_common")
    assert trl_common.grpo_config(2, 2, 4, 1e-3, 1).gradient_checkpointing is False
    assert trl_common.grpo_config(2, 2, 4, 1e-3, 1, gradient_checkpointing=True).gradient_checkpointing is True
