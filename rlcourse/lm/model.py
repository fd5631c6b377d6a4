"""The tiny causal language model and the log-probabilities the RL loop trains on."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from ..profiles import Profile, profile as current_profile
from .engine import lean_engine_supports, rms_norm, rotary_angles, rotate


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

    ============== ========= ===========================================
    attention_mask ``(B,L)`` 1 for real tokens, 0 for padding
    returns                  ``(B,L)`` long; padding positions are clamped to 0
    ============== ========= ===========================================
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

    ============== =========== ===================================================
    input_ids      ``(B,P+T)`` prompt then response token ids
    attention_mask ``(B,P+T)`` 1 for real prompt and response tokens
    response_len   ``T``       number of response positions
    returns        ``(B,T)``   float32 log pi(y_t | x, y_<t) at ``temperature``
    (entropy)      ``(B,T)``   entropy of the tempered next-token distribution
    ============== =========== ===================================================
    """
    if input_ids.shape != attention_mask.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} differ")
    T = int(response_len)
    if not 0 < T < input_ids.shape[1]:
        raise ValueError(f"response_len must be in [1, {input_ids.shape[1] - 1}], got {response_len}")
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids_from_mask(attention_mask), use_cache=False, logits_to_keep=T + 1)
    logits = out.logits[:, :-1, :]  # (B, T, V): scores for the T response tokens
    return _logprobs_and_entropy(logits, input_ids[:, -T:], temperature, return_entropy)


def _logprobs_and_entropy(logits: torch.Tensor, labels: torch.Tensor, temperature: float, return_entropy: bool):
    """:func:`logprobs_from_logits`, and with ``return_entropy`` also the ``(B,T)`` entropy of the
    tempered next-token distribution."""
    logp = logprobs_from_logits(logits, labels, temperature)
    if not return_entropy:
        return logp
    logz = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp, -(logz.exp() * logz).sum(-1)


def shared_prefix_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    group: torch.Tensor,
    response_ids: torch.Tensor,
    temperature: float = 1.0,
    return_entropy: bool = False,
):
    """:func:`response_logprobs` for a batch whose rows share prompts, running each prompt once.

    The ``G`` responses of a prompt attend to the same prompt keys and values, which depend on the
    prompt alone (causal attention), so the prompt positions go through the model once per distinct
    prompt and their keys and values are copied to the prompt's responses; gradients flowing back
    through the copies add up, as they would over ``G`` separate forward passes. The result equals
    :func:`response_logprobs` on ``[prompt_ids[group] | response_ids]`` up to float rounding, at the
    cost of ``N`` instead of ``B`` prompt rows. Runs a bias-free ``LlamaForCausalLM`` with the default
    rotary embedding (:func:`rlcourse.lm.engine.lean_engine_supports`).

    ============ ========== ==========================================================
    prompt_ids   ``(N,P)``   distinct prompts, left-padded
    prompt_mask  ``(N,P)``   1 on real prompt tokens
    group        ``(B,)``    long, the row of ``prompt_ids`` that each response answers
    response_ids ``(B,T)``   responses, right-padded
    returns      ``(B,T)``   float32 log pi(y_t | x, y_<t) at ``temperature``
    (entropy)    ``(B,T)``   entropy of the tempered next-token distribution
    ============ ========== ==========================================================
    """
    if not lean_engine_supports(model):
        raise ValueError(f"shared_prefix_logprobs runs a bias-free LlamaForCausalLM, not {type(model).__name__}")
    if prompt_ids.shape != prompt_mask.shape or group.ndim != 1 or group.shape[0] != response_ids.shape[0]:
        raise ValueError(f"shapes do not fit: prompt_ids {tuple(prompt_ids.shape)}, prompt_mask "
                         f"{tuple(prompt_mask.shape)}, group {tuple(group.shape)}, response_ids {tuple(response_ids.shape)}")
    N, P = prompt_ids.shape
    B, T = response_ids.shape
    if len(group) and not (0 <= int(group.min()) and int(group.max()) < N):
        raise ValueError(f"group holds rows outside [0, {N})")
    device = prompt_ids.device
    ok = prompt_mask.bool()
    pos_p = position_ids_from_mask(prompt_mask)
    pos_r = prompt_mask.sum(-1)[group][:, None] + torch.arange(T, device=device)
    p_idx, r_idx = torch.arange(P, device=device), torch.arange(T, device=device)
    # prompts: causal over real tokens (a padding query sees itself); responses: the whole real prompt
    # of their group, then causal over the response
    allowed_p = (((p_idx[None, :] <= p_idx[:, None])[None] & ok[:, None, :]) | (p_idx[None, :] == p_idx[:, None])[None])
    allowed_r = torch.cat([ok[group][:, None, :].expand(B, T, P), (r_idx[None, :] <= r_idx[:, None])[None].expand(B, T, T)], -1)
    # every position-wise operation runs once on the packed rows [prompt tokens; response tokens]
    NP = N * P
    (cos_p, sin_p), (cos_r, sin_r) = rotary_angles(model, pos_p), rotary_angles(model, pos_r)
    cos = torch.cat([cos_p.reshape(NP, -1), cos_r.reshape(B * T, -1)])[:, None]  # (NP + BT, 1, D)
    sin = torch.cat([sin_p.reshape(NP, -1), sin_r.reshape(B * T, -1)])[:, None]
    x = model.model.embed_tokens(torch.cat([prompt_ids.reshape(-1), response_ids.reshape(-1)]))  # (NP + BT, d)
    gqa = model.config.num_attention_heads != model.config.num_key_value_heads

    def split(t):  # (NP + BT, heads, D) -> prompt (N, heads, P, D) and responses (B, heads, T, D)
        return t[:NP].view(N, P, -1, t.shape[-1]).transpose(1, 2), t[NP:].view(B, T, -1, t.shape[-1]).transpose(1, 2)

    for layer in model.model.layers:
        attn = layer.self_attn
        h = rms_norm(x, layer.input_layernorm)
        q, k, v = (proj(h).view(len(h), -1, attn.head_dim) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        (q_p, q_r), (k_p, k_r), (v_p, v_r) = split(rotate(q, cos, sin)), split(rotate(k, cos, sin)), split(v)
        o_p = F.scaled_dot_product_attention(q_p, k_p, v_p, attn_mask=allowed_p[:, None], scale=attn.scaling,
                                             enable_gqa=gqa)
        o_r = F.scaled_dot_product_attention(q_r, torch.cat([k_p[group], k_r], 2), torch.cat([v_p[group], v_r], 2),
                                             attn_mask=allowed_r[:, None], scale=attn.scaling, enable_gqa=gqa)
        x = x + attn.o_proj(torch.cat([o_p.transpose(1, 2).reshape(NP, -1), o_r.transpose(1, 2).reshape(B * T, -1)]))
        x = x + layer.mlp(rms_norm(x, layer.post_attention_layernorm))
    # the last prompt position scores the first response token; response position t scores token t+1
    x_p, x_r = x[:NP].view(N, P, -1), x[NP:].view(B, T, -1)
    hidden = torch.cat([x_p[group, -1:], x_r[:, :-1]], 1)
    logits = model.lm_head(rms_norm(hidden, model.model.norm))
    return _logprobs_and_entropy(logits, response_ids, temperature, return_entropy)
