"""The tiny causal language model and the log-probabilities the RL loop trains on."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from ..lora import is_peft_model
from ..profiles import Profile, profile as current_profile
from .engine import lean_engine_supports, rms_norm, rotary_angles, rotate, signed_sin


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


LOGPROB_CHUNK_ELEMENTS = 2 ** 25
"""The most float32 elements of one chunk of :func:`logprobs_from_logits`: ``2**25`` (128 MB), about
220 positions of a 151,936-token vocabulary. Smaller logits are one chunk."""


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                         chunk_elements: int = LOGPROB_CHUNK_ELEMENTS) -> torch.Tensor:
    """Log-probabilities of ``labels`` under ``softmax(logits / temperature)``, in float32.

    Logits of at most ``chunk_elements`` elements take one float32 log-softmax; larger ones are
    done in chunks of positions (:func:`chunked_logprobs`), so the float32 copy and the
    log-softmax of a real vocabulary never exist for the whole batch at once.

    ========== =========== ===============================================
    logits     ``(B,T,V)`` scores; position t scores label t (any float dtype)
    labels     ``(B,T)``   token ids
    returns    ``(B,T)``   float32 log pi(label_t)
    ========== =========== ===============================================
    """
    return _logprobs_and_entropy(logits, labels, temperature, False, chunk_elements)


def _check_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> None:
    if temperature <= 0:
        raise ValueError(f"temperature must be positive to define log-probs, got {temperature}")
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")


def logit_chunks(B: int, T: int, V: int, chunk_elements: int) -> list[tuple[slice, slice]]:
    """``(rows, positions)`` slices that cover a ``(B,T,V)`` tensor, each of at most ``chunk_elements``
    elements (at least one position): whole rows when a row fits, else runs of positions of one row.
    Slicing a strided tensor by them gives views, never copies."""
    if chunk_elements < 1:
        raise ValueError(f"chunk_elements must be >= 1, got {chunk_elements}")
    if T * V <= chunk_elements:
        rows = chunk_elements // (T * V)
        return [(slice(b, b + rows), slice(0, T)) for b in range(0, B, rows)]
    width = max(1, chunk_elements // V)
    return [(slice(b, b + 1), slice(t, t + width)) for b in range(B) for t in range(0, T, width)]


class _ChunkedLogprobs(torch.autograd.Function):
    """Log-probs (and entropies) of ``(B,T,V)`` logits, one chunk (:func:`logit_chunks`) at a time,
    forward and backward: only the input logits and their gradient are ``(B,T,V)``; every float32
    temporary is the size of a chunk. Gradient with respect to ``z = logits / temperature``:
    ``onehot - p`` for the log-prob, ``-p (log p + H)`` for the entropy ``H``."""

    @staticmethod
    def forward(ctx, logits, labels, temperature, chunk_elements, want_entropy):
        ctx.set_materialize_grads(False)
        B, T, V = logits.shape
        chunks = logit_chunks(B, T, V, chunk_elements)
        logp = logits.new_empty(B, T, dtype=torch.float32)
        ent = logits.new_empty((B, T) if want_entropy else (0, 0), dtype=torch.float32)
        for rows, cols in chunks:
            logz = torch.log_softmax(logits[rows, cols].float() / temperature, dim=-1)
            logp[rows, cols] = logz.gather(-1, labels[rows, cols, None]).squeeze(-1)
            if want_entropy:
                ent[rows, cols] = -(logz.exp() * logz).sum(-1)
        ctx.save_for_backward(logits, labels, ent)
        ctx.temperature, ctx.chunks = temperature, chunks
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        logits, labels, ent = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for rows, cols in ctx.chunks:
            logz = torch.log_softmax(logits[rows, cols].float() / ctx.temperature, dim=-1)
            p = logz.exp()
            gz = torch.zeros_like(p)
            if g_logp is not None:
                g = g_logp[rows, cols, None]
                gz = gz - p * g
                gz.scatter_add_(-1, labels[rows, cols, None], g)
            if g_ent is not None:
                gz = gz - p * (logz + ent[rows, cols, None]) * g_ent[rows, cols, None]
            grad[rows, cols] = (gz / ctx.temperature).to(grad.dtype)
        return grad, None, None, None, None


def chunked_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                     return_entropy: bool = False, chunk_elements: int = LOGPROB_CHUNK_ELEMENTS):
    """:func:`logprobs_from_logits` (and the entropy) computed a chunk of at most ``chunk_elements``
    logits at a time (:func:`logit_chunks`), in the forward and in the backward pass, with the same
    values and gradients as one float32 log-softmax over the whole tensor. Beyond the logits and
    their gradient, the peak memory is a few float32 chunks, whatever the batch.

    ============== =========== ===================================================
    logits         ``(B,T,V)`` scores (any float dtype; the gradient has that dtype)
    labels         ``(B,T)``   token ids
    returns        ``(B,T)``   float32 log pi(label_t)
    (entropy)      ``(B,T)``   float32 entropy of the tempered distribution
    ============== =========== ===================================================
    """
    _check_logits(logits, labels, temperature)
    if logits.ndim != 3:
        raise ValueError(f"logits must be (B,T,V), got shape {tuple(logits.shape)}")
    logp, ent = _ChunkedLogprobs.apply(logits, labels, float(temperature), int(chunk_elements), return_entropy)
    return (logp, ent) if return_entropy else logp


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    temperature: float = 1.0,
    return_entropy: bool = False,
    micro_batch_size: int | None = None,
):
    """Training-time recomputation of the response tokens' log-probs (one forward pass, or one per
    ``micro_batch_size`` rows, so that the logits of at most that many rows exist at once).

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
    if micro_batch_size is not None and micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if micro_batch_size is not None and micro_batch_size < input_ids.shape[0]:
        parts = [response_logprobs(model, input_ids[s:s + micro_batch_size], attention_mask[s:s + micro_batch_size],
                                   T, temperature, return_entropy) for s in range(0, input_ids.shape[0], micro_batch_size)]
        return tuple(torch.cat(x) for x in zip(*parts)) if return_entropy else torch.cat(parts)
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids_from_mask(attention_mask), use_cache=False, logits_to_keep=T + 1)
    logits = out.logits[:, :-1, :]  # (B, T, V): scores for the T response tokens
    return _logprobs_and_entropy(logits, input_ids[:, -T:], temperature, return_entropy)


def _logprobs_and_entropy(logits: torch.Tensor, labels: torch.Tensor, temperature: float, return_entropy: bool,
                          chunk_elements: int = LOGPROB_CHUNK_ELEMENTS):
    """:func:`logprobs_from_logits`, and with ``return_entropy`` also the ``(B,T)`` entropy of the
    tempered next-token distribution; in chunks (:func:`chunked_logprobs`) beyond ``chunk_elements``."""
    _check_logits(logits, labels, temperature)
    if logits.numel() > chunk_elements and logits.ndim == 3:
        return chunked_logprobs(logits, labels, temperature, return_entropy, chunk_elements)
    logz = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logz.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    if not return_entropy:
        return logp
    return logp, -(logz.exp() * logz).sum(-1)


def shared_prefix_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    group: torch.Tensor,
    response_ids: torch.Tensor,
    temperature: float = 1.0,
    return_entropy: bool = False,
    response_lengths: torch.Tensor | None = None,
):
    """:func:`response_logprobs` for a batch whose rows share prompts, running each prompt once and
    no padding.

    The ``G`` responses of a prompt attend to the same prompt keys and values, which depend on the
    prompt alone (causal attention), so the prompt positions go through the model once per distinct
    prompt and their keys and values are copied to the prompt's responses; gradients flowing back
    through the copies add up, as they would over ``G`` separate forward passes. Of the responses,
    only the positions whose output scores a real token go through the layers (``t + 1 <
    response_lengths``; the last real token scores nothing and the padding after it is never attended
    by a real token): they are packed for the position-wise operations and laid out per row only for
    the attention. The result equals :func:`response_logprobs` on ``[prompt_ids[group] |
    response_ids]`` up to float rounding, on the real positions, at the cost of ``N`` instead of
    ``B`` prompt rows and of the real response tokens instead of ``B x T``.

    Two implementations compute it. A bias-free ``LlamaForCausalLM`` with the default rotary
    embedding (:func:`rlcourse.lm.engine.lean_engine_supports`) runs the lean engine's packed layers
    above. Any other causal LM of ``transformers`` (a Qwen2, a model with a peft LoRA adapter, one with
    forward hooks) runs its own forward twice: once on the distinct prompts, keeping their keys and
    values in a cache with their autograd graph, then, with that cache's rows selected by ``group``,
    on the responses (all but their last token, which scores nothing). Under gradient checkpointing
    ``transformers`` keeps no cache in training, so such a model is refused
    (:func:`shared_prefix_refusal` says why; the caller then runs :func:`response_logprobs`).

    ================ ========== ==========================================================
    prompt_ids       ``(N,P)``   distinct prompts, left-padded
    prompt_mask      ``(N,P)``   1 on real prompt tokens
    group            ``(B,)``    long, the row of ``prompt_ids`` that each response answers
    response_ids     ``(B,T)``   responses, right-padded
    response_lengths ``(B,)``    real tokens of each response, in ``[1, T]`` (default: all ``T``);
                                 the log-probs and entropies after them are returned as 0
    returns          ``(B,T)``   float32 log pi(y_t | x, y_<t) at ``temperature``
    (entropy)        ``(B,T)``   entropy of the tempered next-token distribution
    ================ ========== ==========================================================
    """
    refusal = shared_prefix_refusal(model)
    if refusal is not None:
        raise ValueError(f"shared_prefix_logprobs cannot run this model: {refusal}")
    if prompt_ids.shape != prompt_mask.shape or group.ndim != 1 or group.shape[0] != response_ids.shape[0]:
        raise ValueError(f"shapes do not fit: prompt_ids {tuple(prompt_ids.shape)}, prompt_mask "
                         f"{tuple(prompt_mask.shape)}, group {tuple(group.shape)}, response_ids {tuple(response_ids.shape)}")
    N, P = prompt_ids.shape
    B, T = response_ids.shape
    if len(group) and not (0 <= int(group.min()) and int(group.max()) < N):
        raise ValueError(f"group holds rows outside [0, {N})")
    device = prompt_ids.device
    r_idx = torch.arange(T, device=device)
    if response_lengths is None:
        response_lengths = torch.full((B,), T, device=device)
    elif response_lengths.shape != (B,) or bool(((response_lengths < 1) | (response_lengths > T)).any()):
        raise ValueError(f"response_lengths must be ({B},) with values in [1, {T}], got "
                         f"{response_lengths.tolist() if response_lengths.numel() <= 16 else tuple(response_lengths.shape)}")
    if not lean_engine_supports(model):
        return _cached_shared_prefix(model, prompt_ids, prompt_mask, group, response_ids, temperature, return_entropy,
                                     response_lengths)
    # the response positions that go through the layers, as indices into the B*T grid; each scores the next token
    fed = (r_idx < response_lengths[:, None] - 1).flatten().nonzero().squeeze(-1)  # (M,)
    ok = prompt_mask.bool()
    pos_p = position_ids_from_mask(prompt_mask)
    pos_r = (prompt_mask.sum(-1)[group][:, None] + r_idx).flatten()[fed]
    p_idx = torch.arange(P, device=device)
    # prompts: causal over real tokens (a padding query sees itself); responses: the whole real prompt
    # of their group, then causal over the response
    allowed_p = (((p_idx[None, :] <= p_idx[:, None])[None] & ok[:, None, :]) | (p_idx[None, :] == p_idx[:, None])[None])
    allowed_r = torch.cat([ok[group][:, None, :].expand(B, T, P), (r_idx[None, :] <= r_idx[:, None])[None].expand(B, T, T)], -1)
    # every position-wise operation runs once on the packed rows [prompt tokens; fed response tokens]
    NP = N * P
    cos, sin = rotary_angles(model, torch.arange(P + T, device=device))  # a table of every position
    positions = torch.cat([pos_p.flatten(), pos_r])
    cos, sin = cos[positions][:, None], signed_sin(sin)[positions][:, None]  # (NP + M, 1, D)
    x = model.model.embed_tokens(torch.cat([prompt_ids.flatten(), response_ids.flatten()[fed]]))  # (NP + M, d)
    H, H_kv = model.config.num_attention_heads, model.config.num_key_value_heads
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = F.linear(_rms(x, layer.input_layernorm),
                       torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])).view(len(x), -1, attn.head_dim)
        qkv = torch.cat([rotate(qkv[:, :H + H_kv], cos, sin), qkv[:, H + H_kv:]], 1)  # queries and keys rotated
        prompt = qkv[:NP].view(N, P, -1, attn.head_dim).transpose(1, 2)  # (N, heads, P, D)
        # responses laid out (B, heads, T, D); the positions not fed are zeros that no fed query attends to
        resp = qkv.new_zeros(B * T, *qkv.shape[1:]).index_copy(0, fed, qkv[NP:]).view(B, T, -1, attn.head_dim)
        (q_p, k_p, v_p), (q_r, k_r, v_r) = (t.split([H, H_kv, H_kv], 1) for t in (prompt, resp.transpose(1, 2)))
        o_p = F.scaled_dot_product_attention(q_p, k_p, v_p, attn_mask=allowed_p[:, None], scale=attn.scaling,
                                             enable_gqa=H != H_kv)
        o_r = F.scaled_dot_product_attention(q_r, torch.cat([k_p[group], k_r], 2), torch.cat([v_p[group], v_r], 2),
                                             attn_mask=allowed_r[:, None], scale=attn.scaling, enable_gqa=H != H_kv)
        x = x + attn.o_proj(torch.cat([o_p.transpose(1, 2).reshape(NP, -1), o_r.transpose(1, 2).reshape(B * T, -1)[fed]]))
        gate, up = F.linear(_rms(x, layer.post_attention_layernorm),
                            torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])).chunk(2, dim=-1)
        x = x + mlp.down_proj(mlp.act_fn(gate) * up)
    # the last prompt position scores the first response token; fed position t scores token t+1
    hidden = torch.cat([x[:NP].view(N, P, -1)[group, -1], x[NP:]])  # (B + M, d)
    scored = torch.cat([torch.arange(B, device=device) * T, fed + 1])
    logits = model.lm_head(_rms(hidden, model.model.norm))
    out = _logprobs_and_entropy(logits[None], response_ids.flatten()[scored][None], temperature, return_entropy)
    grid = lambda v: v.new_zeros(B * T).index_copy(0, scored, v[0]).view(B, T)  # noqa: E731
    return tuple(grid(v) for v in out) if return_entropy else grid(out)


def shared_prefix_refusal(model: torch.nn.Module) -> str | None:
    """Why :func:`shared_prefix_logprobs` cannot run ``model``, or None when it can: it runs the lean
    engine's models and any ``transformers`` causal LM that keeps a cache when it trains, which one under
    gradient checkpointing does not."""
    if lean_engine_supports(model):
        return None
    base = model.get_base_model() if is_peft_model(model) else model
    if not isinstance(base, GenerationMixin):
        return f"it runs a transformers causal LM (or a peft model around one), not {type(model).__name__}"
    if any(getattr(m, "gradient_checkpointing", False) for m in model.modules()):
        return "gradient checkpointing is on (transformers keeps no cache in training then)"
    return None


def _cached_shared_prefix(model, prompt_ids, prompt_mask, group, response_ids, temperature, return_entropy,
                          response_lengths):
    """:func:`shared_prefix_logprobs` through the model's own forward and cache (see there)."""
    B, T = response_ids.shape
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=position_ids_from_mask(prompt_mask),
                use_cache=True, logits_to_keep=1)
    if out.cache is None:
        raise RuntimeError(f"{type(model).__name__} returned no cache from its prompt pass")
    first = out.logits[:, -1][group][:, None]  # (B, 1, V): the last prompt position scores response token 0
    parts = [_logprobs_and_entropy(first, response_ids[:, :1], temperature, return_entropy)]
    if T > 1:
        cache = out.cache
        cache.batch_select_indices(group)  # each response's copy of its prompt's keys and values (autograd adds)
        r_idx = torch.arange(T - 1, device=response_ids.device)
        response_mask = (r_idx < response_lengths[:, None]).to(prompt_mask.dtype)
        positions = prompt_mask.sum(-1)[group][:, None] + r_idx
        rest = model(input_ids=response_ids[:, :-1], attention_mask=torch.cat([prompt_mask[group], response_mask], 1),
                     position_ids=positions, cache=cache, use_cache=True).logits  # (B, T-1, V)
        # scored apart from the first position: a concatenation would copy the (B, T, V) logits
        parts.append(_logprobs_and_entropy(rest, response_ids[:, 1:], temperature, return_entropy))
    real = torch.arange(T, device=response_ids.device) < response_lengths[:, None]
    if not return_entropy:
        return torch.where(real, torch.cat(parts, 1), 0.0)
    return tuple(torch.where(real, torch.cat(v, 1), 0.0) for v in zip(*parts))


def _rms(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    return rms_norm(x, norm.weight, norm.variance_epsilon)
