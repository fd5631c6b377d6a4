"""Checks of a capstone configuration that run before any model loads: a typo or a wrong type in a
config file should cost a second, not a model download and a base-model evaluation."""
from __future__ import annotations

import collections.abc
import types
import typing

import torch

from .models import linear_module_names


def matches_type(value, hint) -> bool:
    """Whether ``value`` fits the annotation ``hint``: ``int`` (not ``bool``), ``float`` (an ``int``
    too), ``str``, ``bool``, ``dict``, ``tuple``/``list`` (either sequence), ``Callable``, ``None``,
    and unions of them; any other annotation accepts everything."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(matches_type(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    base = origin or hint
    if base is dict:
        return isinstance(value, dict)
    if base in (tuple, list):
        return isinstance(value, (tuple, list))
    if base is collections.abc.Callable:
        return callable(value)
    return True


def type_errors(cls, values: dict, where: str = "") -> list[str]:
    """One message per entry of ``values`` whose value does not fit the annotation of the field of
    dataclass ``cls`` with that name (names that are not fields are left to other checks)."""
    hints = typing.get_type_hints(cls)
    out = []
    for key, value in values.items():
        if key in hints and not matches_type(value, hints[key]):
            name = getattr(hints[key], "__name__", None) or str(hints[key]).replace("typing.", "")
            out.append(f"{where}{key} = {value!r} should be {name}")
    return out


def check_before_loading(cfg, processes: int = 1) -> None:
    """Everything about ``cfg`` (a :class:`~rlcourse.capstone.grpo_lora.CapstoneConfig`) that can be
    checked without loading weights; a ValueError listing every problem found.

    - the ``rl`` keywords make an :class:`~rlcourse.train.RLConfig` (its own checks);
    - ``processes`` can share ``prompts_per_step`` (at least one prompt each);
    - ``dtype`` names a torch dtype and ``device`` parses;
    - the task can be built (a reasoning-gym name and its ``task_config``; JSONL files exist);
    - the LoRA targets are linear layers of the model, read from its config on the meta device;
    - with ``parallel = "fsdp"`` and several processes, the model names its decoder layers
      (``_no_split_modules``), the units FSDP shards it by.
    """
    from ..train import RLConfig
    from .grpo_lora import base_task

    problems = []
    try:
        rl = RLConfig(**cfg.rl)
    except (TypeError, ValueError) as err:
        problems.append(f"rl: {err}")
        rl = None
    if rl is not None and rl.prompts_per_step < processes:
        problems.append(f"{processes} processes cannot share prompts_per_step = {rl.prompts_per_step}: give at "
                        f"least one prompt per process")
    if cfg.dtype is not None and not isinstance(getattr(torch, cfg.dtype, None), torch.dtype):
        problems.append(f"dtype = {cfg.dtype!r} is not a torch dtype (e.g. 'bfloat16', 'float32')")
    if cfg.device is not None:
        try:
            torch.device(cfg.device)
        except RuntimeError as err:
            problems.append(f"device = {cfg.device!r}: {err}")
    try:
        task = base_task(cfg)
        if not cfg.jsonl_path:  # a generator's configuration is checked when it first draws
            task.examples(1, seed=0, split="train")
    except (TypeError, ValueError, FileNotFoundError) as err:
        problems.append(f"task: {err}")
    try:
        model = meta_model(cfg)
    except ValueError as err:
        problems.append(str(err))
    else:
        available = linear_module_names(model)
        unknown = sorted(set(cfg.lora_targets) - set(available))
        if unknown:
            problems.append(f"LoRA targets {unknown} are not linear layers of {cfg.model!r}; it has {available}")
        if cfg.parallel == "fsdp" and processes > 1 and not getattr(model, "_no_split_modules", None):
            problems.append(f"parallel = 'fsdp' shards a model by its decoder layers, but {type(model).__name__} "
                            "names none (_no_split_modules); use parallel = 'ddp'")
    if problems:
        raise ValueError("the capstone config cannot run: " + "; ".join(problems))


def meta_model(cfg):
    """The model ``cfg`` names, built from its config on the meta device (no weights read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from .models import build_tiny_qwen2, cannot_load, char_chat_tokenizer

    with torch.device("meta"):
        if cfg.model == "tiny":
            model = build_tiny_qwen2(char_chat_tokenizer(), cfg.tiny_hidden, cfg.tiny_intermediate, cfg.tiny_layers,
                                     cfg.tiny_heads, cfg.tiny_kv_heads, cfg.tiny_max_positions)
        else:
            try:
                config = AutoConfig.from_pretrained(cfg.model)
            except OSError as err:
                raise cannot_load(cfg.model, err) from err
            model = AutoModelForCausalLM.from_config(config)
    return model
