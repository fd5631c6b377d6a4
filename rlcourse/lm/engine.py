"""A lean decoding engine for the tiny Llama: the same weights and the same numbers, less overhead.

RL systems sample with an inference engine (vLLM, SGLang) and train with another (FSDP, DeepSpeed);
the two hold the same weights and must agree on the log-probabilities, or the "on-policy" update is
quietly off-policy. This module is rlcourse's inference engine in miniature. At the start of each
rollout it lays the current parameters of a ``transformers`` ``LlamaForCausalLM`` out for decoding
(:class:`LeanWeights`: the query, key and value projections in one matrix, the gate and up
projections in another, a table of rotary angles; the "weight sync" of a real engine), keeps the keys
and values of every layer in one preallocated cache, and runs a forward pass as a dozen tensor
operations. For a model of a few hundred thousand parameters the work per decode step is tiny and
per-operation overhead dominates, so skipping the general machinery of ``LlamaForCausalLM.forward``
(cache objects, mask builders, output classes) and fusing the projections makes sampling faster.
``tests/test_engine.py`` checks that its logits equal the reference implementation's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM


def lean_engine_supports(model: torch.nn.Module) -> bool:
    """True for a ``LlamaForCausalLM`` without biases and with the default rotary embedding (what
    :func:`~rlcourse.lm.build_model` makes)."""
    if not isinstance(model, LlamaForCausalLM):
        return False
    cfg = model.config
    return (getattr(model.model.rotary_emb, "rope_type", "default") == "default" and not cfg.attention_dropout
            and not getattr(cfg, "attention_bias", False) and not getattr(cfg, "mlp_bias", False))


@dataclass
class LeanWeights:
    """The model's parameters laid out for decoding, built once per rollout (no gradient).

    ========= =============================== =============================================
    qkv       ``n_layers x (3 H D, d)``        query, key and value projections stacked
    gate_up   ``n_layers x (2 F, d)``          gate and up projections of the MLP stacked
    cos, sin  ``(L_max, D)``                   rotary angles of every position, scaled
    ========= =============================== =============================================
    """

    qkv: list[torch.Tensor]
    gate_up: list[torch.Tensor]
    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    @torch.no_grad()
    def from_model(cls, model: LlamaForCausalLM) -> "LeanWeights":
        layers = model.model.layers
        positions = torch.arange(model.config.max_position_embeddings, device=model.model.rotary_emb.inv_freq.device)
        cos, sin = rotary_angles(model, positions)
        dtype = model.model.embed_tokens.weight.dtype
        return cls(
            qkv=[torch.cat([l.self_attn.q_proj.weight, l.self_attn.k_proj.weight, l.self_attn.v_proj.weight])
                 for l in layers],
            gate_up=[torch.cat([l.mlp.gate_proj.weight, l.mlp.up_proj.weight]) for l in layers],
            cos=cos.to(dtype), sin=sin.to(dtype),
        )


def rotary_angles(model: LlamaForCausalLM, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled cosines and sines of the default rotary embedding, as ``LlamaRotaryEmbedding`` computes them.

    ========= ========== ============================================
    positions ``(...,)`` long position ids
    returns              2 x ``(...,D)`` float32 cos and sin (angles repeated over both halves)
    ========= ========== ============================================
    """
    rotary = model.model.rotary_emb
    freqs = positions[..., None].float() * rotary.inv_freq.float()
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos() * rotary.attention_scaling, angles.sin() * rotary.attention_scaling


@dataclass
class KVCache:
    """Keys and values of every layer, preallocated for the whole rollout.

    ======== =========================== ================================================
    keys     ``n_layers x (B,H_kv,L,D)`` rotated keys of positions ``[0, length)``
    values   ``n_layers x (B,H_kv,L,D)`` values of the same positions
    key_ok   ``(B,L)`` bool              True where a position holds a real token (not padding)
    length   int                         how many positions are filled
    ======== =========================== ================================================
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_ok: torch.Tensor
    length: int = 0

    @classmethod
    def empty(cls, model: LlamaForCausalLM, batch: int, capacity: int) -> "KVCache":
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        p = next(model.parameters())
        shape = (batch, cfg.num_key_value_heads, capacity, head_dim)
        return cls(keys=[p.new_empty(shape) for _ in range(cfg.num_hidden_layers)],
                   values=[p.new_empty(shape) for _ in range(cfg.num_hidden_layers)],
                   key_ok=torch.zeros(batch, capacity, dtype=torch.bool, device=p.device))

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the given rows (an index tensor, repeats allowed), in that order."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.key_ok = self.key_ok.index_select(0, rows)


def rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last axis, computed in float32 (as Llama does)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply the rotary embedding to ``x`` of shape ``(B,H,n,D)``: pairs ``(i, i + D/2)`` rotate together."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def lean_forward(model: LlamaForCausalLM, weights: LeanWeights, input_ids: torch.Tensor,
                 positions: torch.Tensor, input_ok: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run ``n`` new tokens per row through the model, append their keys and values to ``cache``
    and return the logits of the last one.

    A new token attends to the real tokens up to its own position; a padding token attends only to
    itself, so that no row of the attention is empty (its output is never used).

    ========== =========== =======================================================
    weights    LeanWeights :meth:`LeanWeights.from_model` of the same model
    input_ids  ``(B,n)``   new tokens (the left-padded prompt, or one sampled token)
    positions  ``(B,n)``   their position ids
    input_ok   ``(B,n)``   bool, False on padding
    cache      KVCache     filled up to ``cache.length``; advanced by ``n``
    returns    ``(B,V)``   logits of the last new token, in the model's dtype
    ========== =========== =======================================================
    """
    B, n = input_ids.shape
    start, end = cache.length, cache.length + n
    if end > cache.key_ok.shape[1]:
        raise ValueError(f"the KV cache holds {cache.key_ok.shape[1]} positions; {end} were asked for")
    cache.key_ok[:, start:end] = input_ok
    if n == 1:  # one real token per row: it sees every real key so far, itself included
        allowed = cache.key_ok[:, None, None, :end]
    else:
        key_pos = torch.arange(end, device=input_ids.device)
        query_pos = torch.arange(start, end, device=input_ids.device)
        causal = key_pos[None, :] <= query_pos[:, None]                      # (n, end)
        itself = key_pos[None, :] == query_pos[:, None]
        allowed = ((causal[None] & cache.key_ok[:, None, :end]) | itself[None])[:, None]  # (B, 1, n, end)

    x = model.model.embed_tokens(input_ids)
    cos, sin = weights.cos[positions][:, None], weights.sin[positions][:, None]  # (B, 1, n, D)
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        h = rms_norm(x, layer.input_layernorm)
        q, k, v = F.linear(h, weights.qkv[i]).view(B, n, -1, attn.head_dim).transpose(1, 2).split(
            [attn.config.num_attention_heads, cache.keys[i].shape[1], cache.keys[i].shape[1]], dim=1)
        cache.keys[i][:, :, start:end] = rotate(k, cos, sin)
        cache.values[i][:, :, start:end] = v
        out = F.scaled_dot_product_attention(
            rotate(q, cos, sin), cache.keys[i][:, :, :end], cache.values[i][:, :, :end], attn_mask=allowed,
            scale=attn.scaling, enable_gqa=attn.num_key_value_groups > 1)
        x = x + F.linear(out.transpose(1, 2).reshape(B, n, -1), attn.o_proj.weight)
        h = rms_norm(x, layer.post_attention_layernorm)
        gate, up = F.linear(h, weights.gate_up[i]).chunk(2, dim=-1)
        x = x + F.linear(layer.mlp.act_fn(gate) * up, layer.mlp.down_proj.weight)
    cache.length = end
    return model.lm_head(rms_norm(x[:, -1], model.model.norm))
