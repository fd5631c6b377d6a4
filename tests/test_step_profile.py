"""benchmarks/grpo_step_profile.py counts one GRPO step in the smoke profile, so the script cannot rot."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_grpo_step_profile_counts_every_stage(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("grpo_step_profile", ROOT / "benchmarks" / "grpo_step_profile.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "counts.json"
    assert bench.main(["--profile", "smoke", "--steps", "1", "--warmup", "1", "--json", str(out)]) == 0
    counts = json.loads(out.read_text())
    assert set(counts["stages"]) == {"rollout", "score", "update"}
    rollout, update = counts["stages"]["rollout"], counts["stages"]["update"]
    assert rollout["aten ops"] > 0 and rollout["forward passes"] >= 2 and rollout["python calls"] > 0
    assert update["aten ops"] > 0 and counts["workload"]["rows"] == 64
    assert counts["workload"]["tokens sampled"] > 0
    assert "aten ops" in capsys.readouterr().out
