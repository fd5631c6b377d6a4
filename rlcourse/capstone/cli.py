"""``python -m rlcourse train --config FILE``: the capstone's GRPO + LoRA run from a config file,
in one process or data-parallel under a launcher.

The file (TOML, or YAML when PyYAML is installed) holds fields of
:class:`~rlcourse.capstone.grpo_lora.CapstoneConfig` (``model``, ``task``, ``lora_r``, ``rl`` with
the :class:`~rlcourse.train.RLConfig` keywords, ...) on top of the chosen profile's defaults, and
optionally ``profile``, ``seed``, ``output_dir`` and ``resume``::

    profile = "full"
    model = "Qwen/Qwen2.5-0.5B-Instruct"
    output_dir = "runs/grpo-lora"
    [rl]
    steps = 200
    prompts_per_step = 64      # the whole step, shared by the processes

Launch on one machine with several GPUs (``accelerate launch`` starts one process per GPU through
``torch.distributed.run``; ``torchrun --nproc_per_node N`` does the same)::

    accelerate launch --multi_gpu --num_processes 8 -m rlcourse train --config run.toml

Each process samples its share of the step's prompts; the loss's denominators and the gradients are
global (:mod:`rlcourse.distributed`). On CPUs, ``torchrun --nproc_per_node 2`` starts two ``gloo``
processes (``accelerate launch --cpu`` starts one).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

RUN_KEYS = {"profile", "seed", "output_dir", "resume"}


def read_config_file(path: str | Path) -> dict:
    """The mapping in a ``.toml``, ``.yaml``/``.yml`` or ``.json`` file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no config file at {path}")
    if path.suffix == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            import tomli as tomllib
        return tomllib.loads(path.read_text())
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(path.read_text()) or {}
    elif path.suffix == ".json":
        data = json.loads(path.read_text())
    else:
        raise ValueError(f"config file {path} must end in .toml, .yaml, .yml or .json")
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of keys to values, not {type(data).__name__}")
    return data


def config_from_mapping(data: dict):
    """``(CapstoneConfig, run options)`` from a config file's mapping: the profile's defaults with the
    file's fields on top (``rl`` merged key by key). A ``task`` given without ``task_config`` starts
    from an empty ``task_config`` (the profile's belongs to the profile's task). An unknown key is a
    ValueError naming it; a value of the wrong type, a TypeError naming it."""
    from .grpo_lora import CapstoneConfig, capstone_config

    allowed = {f.name for f in fields(CapstoneConfig)}
    unknown = sorted(set(data) - allowed - RUN_KEYS)
    if unknown:
        raise ValueError(f"unknown config keys {unknown}; a capstone config takes {sorted(allowed | RUN_KEYS)}")
    run = {k: data[k] for k in RUN_KEYS if k in data}
    base = capstone_config(run.get("profile"))
    given = {k: v for k, v in data.items() if k in allowed}
    if "task" in given and "task_config" not in given:
        given["task_config"] = {}
    if "rl" in given and not isinstance(given["rl"], dict):
        raise TypeError(f"rl = {given['rl']!r} should be a table of RLConfig keywords")
    if "rl" in given:
        given["rl"] = {**base.rl, **given["rl"]}
    for key in ("ks", "lora_targets"):  # TOML and YAML give lists
        if isinstance(given.get(key), list):
            given[key] = tuple(given[key])
    return capstone_config(run.get("profile"), **given), run


def train_from_config(path: str | Path, output_dir: str | None = None, resume: bool | None = None,
                      progress: bool = True) -> dict:
    """Run :func:`~rlcourse.capstone.grpo_lora.run_grpo_lora` from a config file, in this process
    or, under a launcher, as one of several data-parallel processes. A process group this call
    started is ended before it returns (:func:`rlcourse.distributed.finish`): the result's trainer
    can be read, not trained further."""
    from ..distributed import current, finish, init_from_env
    from .grpo_lora import run_grpo_lora

    cfg, run = config_from_mapping(read_config_file(path))
    started = current().world_size == 1
    group = init_from_env()
    result = run_grpo_lora(cfg, output_dir=output_dir or run.get("output_dir"),
                           resume=run.get("resume", False) if resume is None else resume, seed=run.get("seed", 0),
                           progress=progress and group.is_main)
    if started and group.world_size > 1:
        finish(result["trainer"].dp)
    return result


def one_line(err: BaseException) -> str:
    """``err``'s message on one line (its lines joined), or its type's name when it has none."""
    text = " ".join(str(err).split())
    return text or type(err).__name__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlcourse", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="GRPO + LoRA on a causal LM, from a config file")
    train.add_argument("--config", required=True, help="a .toml, .yaml or .json file (see rlcourse.capstone.cli)")
    train.add_argument("--output-dir", help="checkpoints and metrics (overrides the file's output_dir)")
    train.add_argument("--resume", action="store_true", default=None, help="continue from the last checkpoint")
    train.add_argument("--no-progress", action="store_true", help="no progress bars")
    train.add_argument("--traceback", action="store_true", help="show the full traceback of an error")
    args = parser.parse_args(argv)
    try:
        result = train_from_config(args.config, output_dir=args.output_dir, resume=args.resume,
                                   progress=not args.no_progress)
    except (ValueError, TypeError, FileNotFoundError) as err:  # bad input: one line, not a traceback
        if args.traceback:
            raise
        print(f"{parser.prog}: error: {one_line(err)} (--traceback for details)", file=sys.stderr)
        return 2
    if result.get("is_main", True):
        summary = {k: result[k] for k in ("before", "after") if result.get(k) is not None}
        print(json.dumps({k: {m: v for m, v in d.items() if m != "correct"} for k, d in summary.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
