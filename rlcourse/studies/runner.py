"""The one runner: a study's (arm, seed) grid, serially, over local cores (loky) or on Ray, cached on disk."""
from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

BACKENDS = ("serial", "loky", "ray")


@dataclass(frozen=True)
class Study:
    """A chapter's experiment as a grid: arms x seeds, one pure function per cell.

    ========  ==========================================================================================
    name      the study's name, usually the chapter's stem (``"evpo"``); names its cache folder
    arms      the arms, e.g. ``("GRPO", "EVPO")``
    seeds     the seeds, e.g. ``tuple(range(prof.toy_seeds))``
    run       ``run(arm, seed, sizes) -> {metric: number or list of numbers}``: one cell, a
              module-level function (workers import it by name) that depends on nothing else
    sizes     the budget, JSON-serialisable (steps, prompts, learning rates...): part of the cache key
    verdicts  ``verdicts(results) -> {name: Verdict}``, or ``None``
    modules   further modules whose source code the cached cells depend on (``run``'s own module
              always counts): a change to any of them re-runs the grid
    ========  ==========================================================================================
    """

    name: str
    arms: tuple
    seeds: tuple
    run: Callable[[str, int, dict], dict]
    sizes: Mapping[str, Any] = field(default_factory=dict)
    verdicts: Callable[["Results"], dict] | None = None
    modules: tuple = ()

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ValueError(f"a study's name must be a non-empty string without '/', got {self.name!r}")
        arms, seeds = tuple(self.arms), tuple(self.seeds)
        object.__setattr__(self, "arms", arms)
        object.__setattr__(self, "seeds", seeds)
        object.__setattr__(self, "modules", tuple(self.modules))
        if not arms or not all(isinstance(a, str) and a for a in arms) or len(set(arms)) != len(arms):
            raise ValueError(f"study {self.name!r}: arms must be distinct non-empty strings, got {arms!r}")
        if not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds) or len(set(seeds)) != len(seeds):
            raise ValueError(f"study {self.name!r}: seeds must be distinct non-negative integers, got {seeds!r}")
        qual = getattr(self.run, "__qualname__", "")
        if not callable(self.run) or "<" in qual or getattr(self.run, "__module__", None) in (None, "__main__"):
            raise ValueError(f"study {self.name!r}: run must be a module-level function of an importable module "
                             f"(workers import it by name), got {self.run!r}")
        try:
            json.dumps(dict(self.sizes), sort_keys=True)
        except TypeError as err:
            raise ValueError(f"study {self.name!r}: sizes must be JSON-serialisable ({err})") from None

    def cells(self) -> list[tuple[str, int]]:
        """Every (arm, seed) of the grid, seed-major (all arms of seed 0 first)."""
        return [(arm, seed) for seed in self.seeds for arm in self.arms]


@dataclass
class Results:
    """A study's grid of metrics.

    =========  ===========================================================
    metrics    ``{(arm, seed): {metric: value}}``
    seconds    ``{(arm, seed): wall seconds}`` of each cell when it ran
    cpu        ``{(arm, seed): CPU seconds}`` of each cell when it ran
    cached     the cells read from the cache instead of run
    =========  ===========================================================
    """

    study: Study
    metrics: dict
    seconds: dict
    cpu: dict
    cached: set = field(default_factory=set)

    def values(self, arm: str, metric: str) -> list:
        """``metric`` of ``arm`` on every seed, in the study's seed order."""
        if arm not in self.study.arms:
            raise KeyError(f"study {self.study.name!r} has no arm {arm!r}; its arms are {self.study.arms}")
        out = []
        for seed in self.study.seeds:
            m = self.metrics[(arm, seed)]
            if metric not in m:
                raise KeyError(f"study {self.study.name!r}, arm {arm!r}, seed {seed}: no metric {metric!r} "
                               f"(it returned {sorted(m)})")
            out.append(m[metric])
        return out

    @property
    def cpu_seconds(self) -> float:
        """CPU seconds of the whole grid, as first run (cached cells count with their recorded time)."""
        return float(sum(self.cpu.values()))

    @property
    def wall_seconds(self) -> float:
        """The sum of the cells' wall seconds: what the grid takes on one core."""
        return float(sum(self.seconds.values()))

    def verdicts(self) -> dict:
        """The study's verdicts from these results."""
        if self.study.verdicts is None:
            raise ValueError(f"study {self.study.name!r} defines no verdicts")
        return self.study.verdicts(self)


def _module_source(name: str) -> str:
    module = sys.modules.get(name) or importlib.import_module(name)
    try:
        return inspect.getsource(module)
    except (OSError, TypeError) as err:
        raise ValueError(f"cannot read the source of module {name!r} to key the cache ({err})") from None


def code_hash(study: Study) -> str:
    """A hash of the source of ``study.run``'s module and of ``study.modules``."""
    h = hashlib.sha256()
    for name in sorted({study.run.__module__, *study.modules}):
        h.update(name.encode())
        h.update(_module_source(name).encode())
    return h.hexdigest()[:16]


def cell_key(study: Study, arm: str, seed: int, code: str | None = None) -> str:
    """The cache key of one cell: a hash of the study's name, the arm, the seed, the sizes and the code."""
    payload = {"study": study.name, "arm": arm, "seed": seed, "sizes": dict(study.sizes),
               "code": code_hash(study) if code is None else code}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def _check_metrics(study: Study, arm: str, seed: int, metrics) -> dict:
    """The metrics as JSON would give them back, after checking every number is finite."""
    if not isinstance(metrics, Mapping) or not all(isinstance(k, str) for k in metrics):
        raise TypeError(f"study {study.name!r}, arm {arm!r}, seed {seed}: run must return a dict with string keys "
                        f"(metric names), got {type(metrics).__name__}")

    def walk(value, where):
        if isinstance(value, bool) or value is None or isinstance(value, str):
            return
        if isinstance(value, (int, float)):
            if not math.isfinite(value):
                raise ValueError(f"study {study.name!r}, arm {arm!r}, seed {seed}: metric {where} is {value}")
            return
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, f"{where}[{k!r}]")
            return
        if isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")
            return
        if hasattr(value, "tolist"):  # numpy scalars and arrays
            walk(value.tolist(), where)
            return
        raise TypeError(f"study {study.name!r}, arm {arm!r}, seed {seed}: metric {where} has type "
                        f"{type(value).__name__}; return numbers, lists or dicts of them")

    for k, v in metrics.items():
        walk(v, repr(k))
    return json.loads(json.dumps(dict(metrics), default=lambda x: x.tolist()))


def _run_cell(run, arm: str, seed: int, sizes: dict, one_thread: bool):
    """One cell in whatever process runs it: its metrics, wall seconds and CPU seconds."""
    if one_thread:
        os.environ["OMP_NUM_THREADS"] = "1"
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)
    wall, cpu = time.perf_counter(), time.process_time()
    metrics = run(arm, seed, dict(sizes))
    return metrics, time.perf_counter() - wall, time.process_time() - cpu


def study_cache_dir(study: Study, root: str | Path | None = None) -> Path:
    """Where a study's cells are cached: ``<root or the model cache>/studies/<name>``."""
    if root is None:
        from ..profiles import cache_dir

        root = cache_dir() / "studies"
    return Path(root) / study.name


def _read_cell(path: Path, study: Study, arm: str, seed: int):
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # a torn or missing file is simply run again
    if data.get("arm") != arm or data.get("seed") != seed or data.get("study") != study.name:
        return None
    return data


def _write_cell(path: Path, study: Study, arm: str, seed: int, metrics: dict, seconds: float, cpu: float):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"study": study.name, "arm": arm, "seed": seed, "sizes": dict(study.sizes),
                               "metrics": metrics, "seconds": seconds, "cpu_seconds": cpu,
                               "recorded_at": time.strftime("%Y-%m-%d %H:%M:%S")}))
    tmp.replace(path)


def default_jobs() -> int:
    """The workers a study runs on when none are given: ``$RLCOURSE_JOBS``, or 1."""
    from ..profiles import count_from_env

    return count_from_env("RLCOURSE_JOBS", 1, "workers")


def _start_ray(jobs: int):
    try:
        import ray
        from ray.util.joblib import register_ray
    except ImportError:
        raise ImportError("backend='ray' needs Ray: pip install 'rlcourse[ray]'") from None
    register_ray()
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local instance on loopback, for this process
        kwargs = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        ray.init(address=address, **kwargs) if address else ray.init(num_cpus=jobs, **kwargs)


def run_study(study: Study, *, jobs: int | None = None, backend: str | None = None, cache: bool = True,
              cache_root: str | Path | None = None, progress: bool | None = None) -> Results:
    """Run every (arm, seed) cell of ``study`` not already cached, and return the whole grid.

    ========== ==================================================================================
    jobs       workers (default ``$RLCOURSE_JOBS`` or 1); 1 runs the cells in this process
    backend    ``"serial"``, ``"loky"`` (local processes, one BLAS thread each) or ``"ray"``;
               default ``$RLCOURSE_BACKEND``, else serial for one job and loky for more
    cache      read cached cells and write new ones (a changed name, arm, seed, size or
               source of the study's modules gives a new key, so stale results are never read)
    progress   a progress bar over the cells (default: when stderr is a terminal)
    ========== ==================================================================================
    """
    jobs = default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    backend = backend or os.environ.get("RLCOURSE_BACKEND") or ("serial" if jobs == 1 else "loky")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if progress is None:
        progress = sys.stderr.isatty()
    folder = study_cache_dir(study, cache_root)
    code = code_hash(study) if cache else ""
    metrics, seconds, cpu, cached = {}, {}, {}, set()
    todo = []
    for arm, seed in study.cells():
        path = folder / f"{cell_key(study, arm, seed, code)}.json"
        data = _read_cell(path, study, arm, seed) if cache else None
        if data is None:
            todo.append((arm, seed, path))
            continue
        metrics[(arm, seed)] = data["metrics"]
        seconds[(arm, seed)], cpu[(arm, seed)] = data["seconds"], data["cpu_seconds"]
        cached.add((arm, seed))

    def finish(arm, seed, path, out):
        m, wall, used = out
        metrics[(arm, seed)] = _check_metrics(study, arm, seed, m)
        seconds[(arm, seed)], cpu[(arm, seed)] = wall, used
        if cache:
            _write_cell(path, study, arm, seed, metrics[(arm, seed)], wall, used)

    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc=study.name, disable=not progress or not todo)
    try:
        if backend == "serial" or (jobs == 1 and backend != "ray") or not todo:
            for arm, seed, path in todo:
                finish(arm, seed, path, _run_cell(study.run, arm, seed, study.sizes, False))
                bar.update()
        else:
            from joblib import Parallel, delayed, parallel_config

            if backend == "ray":
                _start_ray(jobs)
                config = dict(backend="ray", n_jobs=jobs)
            else:
                config = dict(backend="loky", n_jobs=jobs, inner_max_num_threads=1)
            # Ray's joblib backend returns lists only: it gets the cells in chunks, so the cache and the
            # bar still advance as the grid runs (and an interrupted grid keeps its finished chunks)
            chunk = len(todo) if backend == "loky" else 2 * jobs
            with parallel_config(**config):
                for start in range(0, len(todo), chunk):
                    part = todo[start:start + chunk]
                    outs = Parallel(return_as="generator" if backend == "loky" else "list")(
                        delayed(_run_cell)(study.run, arm, seed, dict(study.sizes), True) for arm, seed, _ in part)
                    for (arm, seed, path), out in zip(part, outs):
                        finish(arm, seed, path, out)
                        bar.update()
    finally:
        bar.close()
    order = study.cells()
    results = Results(study=study, metrics={c: metrics[c] for c in order}, seconds={c: seconds[c] for c in order},
                      cpu={c: cpu[c] for c in order}, cached=cached)
    if cache:
        _write_manifest(folder, results, jobs, backend)
    return results


MANIFEST = "_last_run.json"
# which process wrote a manifest's grids: one chapter execution (or one claims test) runs in one process
_PROCESS = f"{os.getpid()}-{time.time_ns()}"


def _grid_key(study: Study) -> str:
    """What tells a study's grids apart in its manifest: its arms, seeds and sizes."""
    payload = {"arms": list(study.arms), "seeds": list(study.seeds), "sizes": dict(study.sizes)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _write_manifest(folder: Path, results: Results, jobs: int, backend: str) -> None:
    """Record the grid just run, with its cost in CPU seconds and how it ran, in the study's manifest.

    The manifest holds every grid of the study that the current process ran (a chapter that runs one
    study at several sizes, a sweep, has one entry per size); a run from another process, a later
    execution of the chapter, replaces them all, so the manifest describes the study's last execution.
    """
    study = results.study
    folder.mkdir(parents=True, exist_ok=True)
    try:
        old = json.loads((folder / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        old = {}
    grids = old.get("grids", {}) if isinstance(old, dict) and old.get("process") == _PROCESS else {}
    grids[_grid_key(study)] = {
        "study": study.name, "arms": list(study.arms), "seeds": list(study.seeds), "sizes": dict(study.sizes),
        "cells": len(results.metrics), "cached": len(results.cached), "cpu_seconds": results.cpu_seconds,
        "wall_seconds": results.wall_seconds, "jobs": jobs, "backend": backend,
        "profile": os.environ.get("RLCOURSE_PROFILE", "book"), "recorded_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    tmp = folder / f"{MANIFEST}.tmp{os.getpid()}"
    tmp.write_text(json.dumps({"process": _PROCESS, "grids": grids}, indent=1))
    tmp.replace(folder / MANIFEST)


def study_manifests(root: str | Path | None = None) -> list[dict]:
    """Every grid of every study cached under ``root`` (default: the model cache's ``studies``), from each
    study's last execution, sorted by study name then by when it ran: its arms, seeds, sizes and cost
    (``cpu_seconds``: what one core spends on it; ``N`` cores take about 1/N of that). A study run at
    several sizes in one execution gives several grids; ``varies`` names the sizes that tell them apart."""
    if root is None:
        from ..profiles import cache_dir

        root = cache_dir() / "studies"
    out = []
    for path in sorted(Path(root).glob(f"*/{MANIFEST}")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        grids = sorted(data.get("grids", {}).values(), key=lambda g: g["recorded_at"]) if "grids" in data else [data]
        described = [{"arms": g["arms"], "seeds": g["seeds"], **g["sizes"]} for g in grids]
        out.extend({**g, "varies": v} for g, v in zip(grids, _differences(described)))
    return out


def _differences(settings: list[dict], prefix: str = "") -> list[dict]:
    """For each of several settings (dicts of sizes), the entries in which they differ. A dict that
    differs between them but has the same keys in all is opened, its differing entries named
    ``outer.inner`` (``cfg.budget``), so a grid is named by what tells it apart, not by a whole config."""
    out = [{} for _ in settings]
    for key in sorted({k for d in settings for k in d}, key=str):
        values = [d.get(key) for d in settings]
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) == 1:
            continue
        name = f"{prefix}{key}"
        if all(isinstance(v, dict) for v in values) and len({tuple(v) for v in values}) == 1:
            for entry, inner in zip(out, _differences(values, f"{name}.")):
                entry.update(inner)
        else:
            for entry, value in zip(out, values):
                entry[name] = value
    return out


def _short(value) -> str:
    """A size's value, short enough for a table cell: a run of consecutive integers as ``first-last``,
    a list or a dict's keys joined, a float in ``%g``; anything else as ``str``."""
    if isinstance(value, dict):
        return "/".join(map(str, value))
    if isinstance(value, (list, tuple)):
        if (len(value) > 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
                and list(value) == list(range(value[0], value[0] + len(value)))):
            return f"{value[0]}-{value[-1]}"
        return ",".join(map(_short, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def grid_label(manifest: dict) -> str:
    """The name of one grid from :func:`study_manifests`: the study's name, followed by the sizes that
    tell its grids apart (``varies``), e.g. ``r2po-lm (head_lr 0.003, seeds 10-12)``; past four, the
    first three and how many more."""
    parts = [f"{k} {_short(v)}" for k, v in manifest.get("varies", {}).items()]
    if len(parts) > 4:
        parts = parts[:3] + [f"+{len(parts) - 3} more"]
    setting = ", ".join(parts)
    return f"{manifest['study']} ({setting})" if setting else manifest["study"]
