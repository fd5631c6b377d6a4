"""The tiny causal language model and the log-probabilities the RL loop trains on."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from ..profiles import Profile, profile as current_profile


def build_model(tokenizer: PreTrainedTokenizerBase, prof: Profile | None = None, seed: int = 0) -> LlamaForCausalLM:
    """A freshly initialised ``LlamaForCausalLM`` sized by the profile (about 0.6M parameters in
    the book profile), with the tokenizer's pad and EOS ids."""
    prof = prof or current_profile()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=prof.lm_hidden,
        intermediate_size=prof.lm_intermediate,
        num_hidden_layers=prof.lm_layers,
        num_attention_heads=prof.lm_heads,
        num_key_value_heads=prof.lm_heads,
        max_position_embeddings=prof.lm_max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on the first real token of each left-padded row.

    ============== ======== ===========================================
    attention_mask ``(B,L)`` 1 for real tokens, 0 for padding
    returns        ``(B,L)`` long; padding positions are clamped to 0
    ============== ======== ===========================================
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probabilities of ``labels`` under ``softmax(logits / temperature)``, in float32.

    ========== =========== ===============================================
    logits     ``(B,T,V)`` scores; position t scores label t
    labels     ``(B,T)``   token ids
    returns    ``(B,T)``   float32 log pi(label_t)
    ========== =========== ===============================================
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive to define log-probs, got {temperature}")
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    temperature: float = 1.0,
    return_entropy: bool = False,
):
    """Training-time recomputation of the response tokens' log-probs (one forward pass).

    ``input_ids`` is ``[prompt (left-padded) | response (right-padded)]``. The logit at position
    ``t`` predicts token ``t+1``, so the response's scores are the logits at ``[-T-1 : -1]``.

    ============== ========== ===================================================
    input_ids      ``(B,P+T)`` prompt then response token ids
    attention_mask ``(B,P+T)`` 1 for real prompt and response tokens
    response_len   ``T``       number of response positions
    returns        ``(B,T)``   float32 log pi(y_t | x, y_<t) at ``temperature``
    (entropy)      ``(B,T)``   entropy of the tempered next-token distribution
    ============== ========== ===================================================
    """
    if input_ids.shape != attention_mask.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} differ")
    T = int(response_len)
    if not 0 < T < input_ids.shape[1]:
        raise ValueError(f"response_len must be in [1, {input_ids.shape[1] - 1}], got {response_len}")
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids_from_mask(attention_mask), use_cache=False, logits_to_keep=T + 1)
    logits = out.logits[:, :-1, :]  # (B, T, V): scores for the T response tokens
    logp = logprobs_from_logits(logits, input_ids[:, -T:], temperature)
    if not return_entropy:
        return logp
    logz = torch.log_softmax(logits.float() / temperature, dim=-1)
    entropy = -(logz.exp() * logz).sum(-1)
    return logp, entropy
