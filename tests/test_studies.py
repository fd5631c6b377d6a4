"""rlcourse.studies: one runner for every chapter's grid, serially, over loky workers and on Ray, cached."""

import json

import pytest

from rlcourse.studies import Study, cell_key, grid_label, run_study, study_manifests
from rlcourse.studies import demo, runner


def small(**kw):
    return demo.study(seeds=4, steps=20, **kw)


def test_serial_and_loky_give_the_same_metrics_per_cell():
    s = small()
    serial = run_study(s, jobs=1, cache=False)
    loky = run_study(s, jobs=2, backend="loky", cache=False)
    assert serial.metrics == loky.metrics
    # the metrics differ between arms and seeds: the comparison above could fail
    finals = {c: m["final"] for c, m in serial.metrics.items()}
    assert len(set(finals.values())) == len(finals)


def _start_local_ray(ray):
    """A local Ray instance of 2 CPUs. Ray gives its node 30 s to register, which a loaded 2-core machine
    can miss: one more try then."""
    kwargs = dict(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        ray.init(**kwargs)
    except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception for a slow start
        if "timed out during startup" not in str(err):
            raise
        ray.shutdown()
        ray.init(**kwargs)


def test_ray_gives_the_same_metrics_per_cell(monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a local instance on loopback
    s = small()
    serial = run_study(s, jobs=1, cache=False)
    _start_local_ray(ray)
    try:
        on_ray = run_study(s, jobs=2, backend="ray", cache=False)
    finally:
        ray.shutdown()
    assert serial.metrics == on_ray.metrics


def test_the_cache_resumes_and_a_change_reruns(tmp_path, monkeypatch):
    s = small()
    first = run_study(s, cache_root=tmp_path)
    assert not first.cached and len(list((tmp_path / "demo").glob("[0-9a-f]*.json"))) == len(s.cells())
    # an interrupted grid: one cell's file lost, one torn; the rest is read back
    files = sorted((tmp_path / "demo").glob("[0-9a-f]*.json"))
    files[0].unlink()
    files[1].write_text("{")
    again = run_study(s, cache_root=tmp_path)
    assert len(again.cached) == len(s.cells()) - 2 and again.metrics == first.metrics
    assert again.cpu_seconds > 0 and again.wall_seconds > 0
    # new sizes are a new key: nothing cached is read
    assert not run_study(small(lr=0.4), cache_root=tmp_path).cached
    # every grid this process ran is on record with its cost, named by the size that tells them apart
    grids = study_manifests(tmp_path)
    assert [g["varies"] for g in grids] == [{"lr": s.sizes["lr"]}, {"lr": 0.4}]
    assert all(g["study"] == "demo" and g["cells"] == len(s.cells()) and g["cpu_seconds"] > 0 for g in grids)
    # a later execution (another process) replaces them: the manifest describes the study's last execution
    monkeypatch.setattr(runner, "_PROCESS", "a later process")
    run_study(s, cache_root=tmp_path)
    (grid,) = study_manifests(tmp_path)
    assert grid["cached"] == len(s.cells()) and grid["varies"] == {}
    assert grid_label(grids[1]) == "demo (lr 0.4)" and grid_label(grid) == "demo"
    # so is changed code
    assert cell_key(s, "REINFORCE", 0, code="a") != cell_key(s, "REINFORCE", 0, code="b")


def test_a_grid_label_names_any_size_it_varies_by(tmp_path):
    """Arms (a list of names), seeds, floats, nested lists, dicts and None all make a label; the
    execution-status page failed on a list of arm names, which it tried to read as a run of integers."""
    varies = {"arms": ["GRPO", "Dr. GRPO", "RLOO"], "seeds": [10, 11, 12], "lr": 0.003, "tag": None}
    assert grid_label({"study": "s", "varies": varies}) == "s (arms GRPO,Dr. GRPO,RLOO, seeds 10-12, lr 0.003, tag None)"
    varies = {"steps": [100, 200, 400], "mix": {"a": 1, "b": 2}, "widths": [[8, 16], [32]],
              "flags": [True, False, True], "rates": [0.5, 1.5, 2.5]}
    assert grid_label({"study": "s", "varies": varies}) == "s (steps 100,200,400, mix a/b, widths 8,16,32, +2 more)"
    # a config that differs in one entry is named by that entry; dicts with different keys by their keys
    grids = [{"study": "s", "arms": ["A", "B"], "seeds": [0], "sizes": {"cfg": {"k": 8, "budget": b}},
              "recorded_at": f"2026-12-07 00:00:0{i}"} for i, b in enumerate([7.5, 15.0])]
    grids.append({**grids[0], "sizes": {"cfg": {"k": 8}}, "recorded_at": "2026-12-07 00:00:09"})
    for i, g in enumerate(grids):
        (tmp_path / f"s{i}").mkdir()
        (tmp_path / f"s{i}" / runner.MANIFEST).write_text(json.dumps(g))
    assert [grid_label(m) for m in study_manifests(tmp_path)] == ["s"] * 3  # one grid per study: nothing varies
    (tmp_path / "s0" / runner.MANIFEST).write_text(json.dumps({"process": "p", "grids": dict(enumerate(grids[:2]))}))
    assert [grid_label(m) for m in study_manifests(tmp_path)][:2] == ["s (cfg.budget 7.5)", "s (cfg.budget 15)"]
    assert runner._differences([g["sizes"] for g in grids]) == [{"cfg": {"k": 8, "budget": 7.5}},
                                                               {"cfg": {"k": 8, "budget": 15.0}}, {"cfg": {"k": 8}}]
    assert grid_label({"study": "s", "varies": {}}) == "s"


def test_verdicts_come_from_the_grid():
    res = run_study(demo.study(seeds=5), cache=False)
    v = res.verdicts()["baseline-helps"]
    assert v.seeds == 5 and v.method_values == res.values("REINFORCE + baseline", "final")
    assert v.claim.role == "course hypothesis"


def bad_run(arm, seed, sizes):
    return {"x": float("nan")} if seed == 1 else {"x": 1.0}


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="arms must be distinct"):
        Study(name="x", arms=("a", "a"), seeds=(0,), run=demo.run_cell)
    with pytest.raises(ValueError, match="seeds must be distinct"):
        Study(name="x", arms=("a",), seeds=(0, -1), run=demo.run_cell)
    with pytest.raises(ValueError, match="module-level"):
        Study(name="x", arms=("a",), seeds=(0,), run=lambda a, s, z: {})
    with pytest.raises(ValueError, match="JSON"):
        Study(name="x", arms=("a",), seeds=(0,), run=demo.run_cell, sizes={"f": object()})
    with pytest.raises(ValueError, match="backend"):
        run_study(small(), backend="dask", cache=False)
    s = Study(name="bad", arms=("a",), seeds=(0, 1), run=bad_run)
    with pytest.raises(ValueError, match=r"arm 'a', seed 1: metric 'x' is nan"):
        run_study(s, cache=False)
    res = run_study(small(), cache=False)
    with pytest.raises(KeyError, match="no arm 'PPO'"):
        res.values("PPO", "final")
    with pytest.raises(KeyError, match="no metric 'best'"):
        res.values("REINFORCE", "best")


def test_jobs_and_backend_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("RLCOURSE_JOBS", "two")
    with pytest.raises(ValueError, match="RLCOURSE_JOBS"):
        run_study(small(), cache=False)
    monkeypatch.setenv("RLCOURSE_JOBS", "2")
    monkeypatch.setenv("RLCOURSE_BACKEND", "loky")
    assert run_study(small(), cache=False).metrics == run_study(small(), jobs=1, backend="serial", cache=False).metrics
