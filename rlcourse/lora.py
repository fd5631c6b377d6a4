"""LoRA in the loop: a ``peft`` model as the policy, its own base weights as the reference.

With a LoRA adapter, the trainer's reference policy is the policy with the adapter switched off
(:class:`AdapterOffReference`: no second copy of the weights, as in TRL), and a checkpoint holds the
adapter alone, read back by :func:`load_adapter_weights`.
"""
from __future__ import annotations

from pathlib import Path


def is_peft_model(model) -> bool:
    """True for a ``peft`` model with adapters (it can switch them off with ``disable_adapter()``)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


class AdapterOffReference:
    """The reference policy of a LoRA run: the policy's own base weights with the adapter switched off
    (``peft``'s ``disable_adapter()`` context), so no second copy of the weights exists, as in TRL.
    Callable like the model; ``eval()`` and ``requires_grad_()`` leave the policy untouched."""

    def __init__(self, model):
        if not is_peft_model(model):
            raise ValueError(f"AdapterOffReference needs a peft model with an adapter, not {type(model).__name__}")
        self.model = model

    def __call__(self, *args, **kwargs):
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)

    @property
    def config(self):
        return self.model.config

    def eval(self):
        return self

    def requires_grad_(self, requires_grad: bool = True):
        return self


def load_adapter_weights(model, folder: str | Path) -> None:
    """Load the adapter that ``model.save_pretrained(folder)`` wrote back into the peft ``model``
    (exact: the same tensors); an adapter key the model lacks, or one of the model's adapter weights
    missing from the file, is a ValueError."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    if not is_peft_model(model):
        raise ValueError(f"{folder} holds a LoRA adapter, but the model ({type(model).__name__}) has none")
    result = set_peft_model_state_dict(model, load_file(str(Path(folder) / "adapter_model.safetensors")))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise ValueError(f"adapter in {folder} does not fit the model: unexpected {result.unexpected_keys[:5]}, "
                         f"missing {missing[:5]}")
