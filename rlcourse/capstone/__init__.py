"""Capstones: the book's loop on real Hugging Face models.

=====================  ===========================================================================
:mod:`.models`         load any causal LM by name or path (clear error offline), a tiny Qwen2 built
                       from a config, LoRA adapters (``peft``), a chat template for the tiny tokenizer
:mod:`.math_tasks`     chat-formatted prompts, reasoning-gym's procedural math, GSM8K-format JSONL
                       through ``datasets``, answers checked with ``math-verify``
:mod:`.grpo_lora`      the capstone's profiles, pass@k evaluation before and after, the GRPO + LoRA run
:mod:`.parallel`       the trainer under torch's engines (DDP, FSDP) when several processes run
:mod:`.tis`            truncated importance sampling: the ``"tis"`` policy loss and its weights
=====================  ===========================================================================
"""
from .models import CHAT_TEMPLATE, add_lora, build_tiny_qwen2, char_chat_tokenizer, linear_module_names, \
    load_causal_lm, save_tiny_qwen2
from .math_tasks import ChatTask, JsonlMathTask, ReasoningGymMath, gsm8k_final_answer, math_verify_score
from .grpo_lora import CapstoneConfig, capstone_config, evaluate_pass_at_k, prepare_base_model, run_grpo_lora
from .parallel import ParallelTrainer
from .tis import recording_rollout_logprobs, tis_policy_loss, tis_weights

__all__ = [
    "CHAT_TEMPLATE", "add_lora", "build_tiny_qwen2", "char_chat_tokenizer", "linear_module_names", "load_causal_lm",
    "save_tiny_qwen2", "ChatTask", "JsonlMathTask", "ReasoningGymMath", "gsm8k_final_answer", "math_verify_score",
    "CapstoneConfig", "capstone_config", "evaluate_pass_at_k", "prepare_base_model", "run_grpo_lora",
    "ParallelTrainer", "recording_rollout_logprobs", "tis_policy_loss", "tis_weights",
]
