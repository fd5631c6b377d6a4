"""Real models for the capstones: load by name or path, a tiny Qwen2 from a config, LoRA adapters.

The full profile loads a hub model (default ``Qwen/Qwen2.5-0.5B-Instruct``) with ``from_pretrained``;
the smoke and book profiles run the same loading code on a small ``Qwen2ForCausalLM`` that the lab
builds from a config and writes with ``save_pretrained``. Its tokenizer is the book's character
tokenizer (:func:`rlcourse.lm.build_tokenizer`) given a chat template, so the capstone formats
prompts with ``apply_chat_template`` whichever model it runs.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from ..lm.tokenizer import build_tokenizer

# A short chat template for the character tokenizer (every character is a token, so a short one keeps
# prompts short): "Q: <question> A: ". Its vocabulary is printable ASCII, so turns are separated by a
# space, not a newline (which it would encode as <unk>). An instruct model's tokenizer brings its own.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }} "
    "{% elif m['role'] == 'user' %}Q: {{ m['content'] }} "
    "{% else %}A: {{ m['content'] }}{{ eos_token }} {% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}A: {% endif %}"
)


def char_chat_tokenizer():
    """The book's character tokenizer (vocabulary 98) with :data:`CHAT_TEMPLATE` as its chat template."""
    tokenizer = build_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_qwen2(tokenizer, hidden: int = 64, intermediate: int = 128, layers: int = 2, heads: int = 4,
                     kv_heads: int = 2, max_positions: int = 128, seed: int = 0) -> Qwen2ForCausalLM:
    """A randomly initialised ``Qwen2ForCausalLM`` (Qwen2.5's architecture: grouped-query attention,
    biases on the query/key/value projections, RoPE, SwiGLU, tied embeddings) of the given size."""
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must divide into heads ({heads}), and heads into kv_heads ({kv_heads})")
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config).eval()


def save_tiny_qwen2(path: str | Path, model, tokenizer) -> Path:
    """Write model and tokenizer with ``save_pretrained`` (what a hub model folder holds)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def cannot_load(name: str, err: OSError) -> ValueError:
    """The error for a model that is neither a local folder nor downloadable (``err``: the loader's)."""
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    where = "offline (HF_HUB_OFFLINE=1) it is not in the Hugging Face cache" if offline else str(err)
    return ValueError(f"cannot load model {name!r}: it is not a local folder and {where}; it needs a download "
                      "(a network and HF_HUB_OFFLINE unset) or a local path to a saved model")


def load_causal_lm(name_or_path: str | Path, dtype: torch.dtype | None = None, device: str | None = None,
                   gradient_checkpointing: bool = False):
    """``(model, tokenizer)`` from a hub name or a local folder, through ``AutoModelForCausalLM`` and
    ``AutoTokenizer``: the same call for Qwen2.5 and for the lab's tiny model.

    The tokenizer pads on the left (generation needs it) and has a pad token (its EOS if it had
    none). Offline (``HF_HUB_OFFLINE=1``), a name that is neither a local folder nor in the Hugging
    Face cache is a ValueError that says it needs a download or a local path.
    """
    name = str(name_or_path)
    try:
        tokenizer = _load_tokenizer(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype or "auto")
    except OSError as err:
        raise cannot_load(name, err) from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if model.generation_config is not None and getattr(model.generation_config, "eos_token_id", None) is not None:
        # instruct models end a turn with a token (Qwen2.5: <|im_end|>) that may differ from the base EOS
        eos = model.generation_config.eos_token_id
        eos = eos[0] if isinstance(eos, (list, tuple)) else eos
        if tokenizer.eos_token_id != eos:
            tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    if device is not None:
        model = model.to(device)
    if gradient_checkpointing:
        enable_checkpointing(model)
    return model.eval(), tokenizer


def enable_checkpointing(model) -> None:
    """Gradient (activation) checkpointing on a ``transformers`` model, non-reentrant, with the
    embeddings' output requiring a gradient (LoRA's frozen embeddings would otherwise cut the graph)."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.20's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()


# tokenizer classes that mean "the pipeline in tokenizer.json, as it is"
GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _load_tokenizer(name: str):
    """``AutoTokenizer.from_pretrained(name)``, except for a folder whose tokenizer is generic (the
    lab's character tokenizer): AutoTokenizer would give it the model family's class (for a Qwen2
    config, ``Qwen2Tokenizer``, whose byte-level pipeline drops the spaces), so it is loaded as
    the ``tokenizer.json`` it is."""
    config = Path(name) / "tokenizer_config.json"
    if config.exists() and json.loads(config.read_text()).get("tokenizer_class") in GENERIC_TOKENIZERS:
        return PreTrainedTokenizerFast.from_pretrained(name)
    return AutoTokenizer.from_pretrained(name)


def linear_module_names(model) -> list[str]:
    """The distinct last names of the model's ``nn.Linear`` modules (what ``target_modules`` may name)."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def add_lora(model, r: int = 8, alpha: int = 16, target_modules: Sequence[str] = ("q_proj", "k_proj", "v_proj",
             "o_proj", "gate_proj", "up_proj", "down_proj"), dropout: float = 0.0, seed: int = 0):
    """Wrap ``model`` with a ``peft`` LoRA adapter on ``target_modules``; only the adapter trains.

    LoRA (Hu et al., 2021, arXiv:2106.09685) adds ``(alpha / r) * B A x`` to each targeted linear map
    ``W x``, with ``A`` (r x in) random and ``B`` (out x r) zero, so the wrapped model starts equal to
    the base. A target the model does not have is a ValueError naming the ones it has.
    """
    from peft import LoraConfig, get_peft_model

    if r < 1:
        raise ValueError(f"LoRA rank r must be >= 1, got {r}")
    available = linear_module_names(model)
    unknown = sorted(set(target_modules) - set(available))
    if unknown:
        raise ValueError(f"LoRA target modules {unknown} are not linear layers of {type(model).__name__}; "
                         f"it has {available}")
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=list(target_modules), lora_dropout=dropout,
                        bias="none", task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(seed)
        # peft reads transformers' deprecated `is_gradient_checkpointing` property while it wraps the
        # model (a FutureWarning under every chapter cell that adds an adapter); only that one is silenced
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, config)
