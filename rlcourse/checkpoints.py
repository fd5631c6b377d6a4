"""What a training run writes to its ``output_dir`` and reads back: the metrics log and checkpoints.

==================================== ============================================================
``metrics.jsonl``, ``metrics.csv``   one row per step (:func:`append_metrics`; read back with
                                     :func:`load_metrics`, drawn with :func:`plot_metrics`)
``checkpoint-<step>/``               weights, optimiser, RNG states, the parts' state, the history
                                     (:func:`save_checkpoint`, :func:`load_checkpoint`): a resumed
                                     run continues exactly as the uninterrupted one
==================================== ============================================================

The :class:`~rlcourse.train.Trainer` calls these from its methods of the same names.
"""
from __future__ import annotations

import csv
import json
import os
import random
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from .lora import is_peft_model, load_adapter_weights


# ---------------------------------------------------------------------- the metrics log
def append_metrics(output_dir: str | Path, history: list[dict], metrics: dict) -> None:
    """Append one step's ``metrics`` to ``metrics.jsonl`` and rewrite ``metrics.csv`` from the whole
    ``history`` (its columns are every key seen so far)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    with open(output_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(metrics) + "\n")
    write_csv(history, output_dir / "metrics.csv")


def rewrite_metrics(output_dir: str | Path, history: list[dict]) -> None:
    """Rewrite both logs from ``history`` (after a resume, so that they end at the checkpoint)."""
    output_dir = Path(output_dir)
    (output_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in history))
    write_csv(history, output_dir / "metrics.csv")


def write_csv(history: list[dict], path: str | Path) -> None:
    """Write ``history`` (one dict per step) as a CSV whose columns are every key, in order of first
    appearance; a step without a key leaves its cell empty."""
    keys: list[str] = []
    for row in history:
        keys += [key for key in row if key not in keys]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(history)


def load_metrics(path: str | Path) -> list[dict]:
    """Read ``metrics.jsonl`` (or a folder holding it) back into a list of dicts."""
    path = Path(path)
    path = path / "metrics.jsonl" if path.is_dir() else path
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_metrics(history: list[dict] | str | Path, keys: Sequence[str], ax=None, label: str | None = None,
                 smooth: int = 1, **plot_kwargs):
    """Plot metrics against ``step`` (one line per key) and return the axes. ``smooth`` is the width of
    a trailing moving average; steps where a key is missing are skipped."""
    import matplotlib.pyplot as plt

    history = load_metrics(history) if isinstance(history, (str, Path)) else history
    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    for key in keys:
        pts = [(h["step"], h[key]) for h in history if key in h and h[key] is not None]
        if not pts:
            raise KeyError(f"metric {key!r} is not in the history; available: {sorted(history[0]) if history else []}")
        x, y = map(np.asarray, zip(*pts))
        if smooth > 1:
            y = np.array([y[max(0, i - smooth + 1):i + 1].mean() for i in range(len(y))])
        ax.plot(x, y, label=label if len(keys) == 1 and label else (f"{label}: {key}" if label else key), **plot_kwargs)
    ax.set_xlabel("step")
    return ax


# ---------------------------------------------------------------------- checkpoints
def save_checkpoint(trainer) -> Path:
    """Write the trainer's ``checkpoint-<step>`` into its ``output_dir`` atomically: weights
    (safetensors; with LoRA the adapter alone), optimiser and scheduler, RNG states, the parts'
    ``state`` and the metrics history. Returns the checkpoint's folder."""
    if trainer.output_dir is None:
        raise ValueError("save_checkpoint needs config.output_dir")
    final = trainer.output_dir / f"checkpoint-{trainer.step_count:06d}"
    if not trainer.dp.is_main:  # data-parallel: the replicas are equal; rank 0 writes
        trainer.dp.barrier()
        return final
    tmp = trainer.output_dir / f".tmp-checkpoint-{trainer.step_count:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if is_peft_model(trainer.model):  # LoRA: the adapter alone (a peft adapter folder), not the frozen base
        trainer.model.save_pretrained(str(tmp / "adapter"))
    else:
        save_model(trainer.model, str(tmp / "model.safetensors"))
    if trainer.value_model is not None:
        save_model(trainer.value_model, str(tmp / "value_model.safetensors"))
    torch.save({
        "step": trainer.step_count,
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "critic_optimizer": trainer.critic_optimizer.state_dict() if trainer.critic_optimizer else None,
        "generator": trainer.generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
        "state": trainer.state,
        "history": trainer.history,
        "config": trainer.config.to_dict(),
    }, tmp / "trainer_state.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    trainer.dp.barrier()
    return final


def latest_checkpoint(output_dir: str | Path | None) -> Path | None:
    """The newest ``checkpoint-<step>`` folder in ``output_dir`` (None if there is none)."""
    if output_dir is None or not Path(output_dir).exists():
        return None
    found = sorted(Path(output_dir).glob("checkpoint-*"))
    return found[-1] if found else None


def load_checkpoint(trainer, path: str | Path) -> None:
    """Restore into ``trainer`` everything :func:`save_checkpoint` wrote; its next step continues exactly.

    The weights load from safetensors (no code runs). ``trainer_state.pt`` is a pickle, because
    the parts' ``state`` may hold any Python data (a replay buffer, a bank of past weights), so
    it is read with ``weights_only=False``: resume only from checkpoints you wrote."""
    path = Path(path)
    if not (path / "trainer_state.pt").exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no trainer_state.pt)")
    if (path / "adapter").exists():
        load_adapter_weights(trainer.model, path / "adapter")
    else:
        load_model(trainer.model, str(path / "model.safetensors"))
    if trainer.value_model is not None:
        load_model(trainer.value_model, str(path / "value_model.safetensors"))
    st = torch.load(path / "trainer_state.pt", weights_only=False)
    trainer.optimizer.load_state_dict(st["optimizer"])
    trainer.scheduler.load_state_dict(st["scheduler"])
    if trainer.critic_optimizer is not None and st["critic_optimizer"] is not None:
        trainer.critic_optimizer.load_state_dict(st["critic_optimizer"])
    trainer.generator.set_state(st["generator"])
    torch.set_rng_state(st["torch_rng"])
    np.random.set_state(st["numpy_rng"])
    random.setstate(st["python_rng"])
    trainer.state, trainer.history, trainer.step_count = st["state"], st["history"], st["step"]
    if trainer.output_dir is not None and trainer.dp.is_main:  # rewrite the logs so they end at the checkpoint
        rewrite_metrics(trainer.output_dir, trainer.history)
