"""The tiny-LM lab: tokenizer, model, sampling, log-probs, and the base-model zoo."""
from .model import build_model, logprobs_from_logits, position_ids_from_mask, response_logprobs
from .sampling import RolloutBatch, encode_prompts, filter_logits, sample
from .tokenizer import build_tokenizer
from .zoo import (NAMED_STRENGTHS, base_model_path, greedy_accuracy, load_base_model, max_new_tokens_for, pretrain,
                  sft_batch, sft_loss)

__all__ = [
    "build_tokenizer", "build_model", "logprobs_from_logits", "position_ids_from_mask", "response_logprobs",
    "RolloutBatch", "encode_prompts", "filter_logits", "sample", "NAMED_STRENGTHS", "base_model_path",
    "greedy_accuracy", "load_base_model", "max_new_tokens_for", "pretrain", "sft_batch", "sft_loss",
]
