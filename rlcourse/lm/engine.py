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
from typing import Callable

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM


# the projections whose weights the lean engine reads, per block of a decoder layer
PROJECTIONS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def lean_engine_refusal(model: torch.nn.Module) -> str | None:
    """Why the lean engine cannot run ``model``, or None when it can.

    It runs a ``LlamaForCausalLM`` without biases or attention dropout, with the default rotary
    embedding and plain ``nn.Linear`` projections (what :func:`~rlcourse.lm.build_model` makes), and
    with no forward hook on any module (but transformers' output-recording ones, ``_records_only``):
    it reads the weights directly, so an adapter wrapped around a
    projection, a hook that edits a module's output (R2PO's rollout head,
    :mod:`rlcourse.methods.r2po`) or FSDP's unsharding pre-hooks would be skipped without a word.
    """
    if not isinstance(model, LlamaForCausalLM):
        return f"it runs LlamaForCausalLM, not {type(model).__name__}"
    cfg = model.config
    if getattr(model.model.rotary_emb, "rope_type", "default") != "default":
        return "it runs the default rotary embedding only"
    if cfg.attention_dropout or getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        return "it runs models without attention dropout or biases"
    for layer in model.model.layers:
        for block, names in PROJECTIONS.items():
            for name in names:
                if type(getattr(getattr(layer, block), name, None)) is not torch.nn.Linear:
                    return f"{block}.{name} is not a plain nn.Linear (an adapter around it would be skipped)"
    hooked = [name or "the model" for name, m in model.named_modules()
              if m._forward_pre_hooks or any(not _records_only(h) for h in m._forward_hooks.values())]
    if hooked:
        return f"forward hooks on {', '.join(hooked[:3])} would be skipped"
    return None


def _records_only(hook) -> bool:
    """True for the hooks transformers installs, at the first forward that asks for hidden states or
    attentions, to collect them (``transformers.utils.output_capturing``): they never change an output
    and record nothing unless a forward asks, which the lean engine never does. Refusing them would send
    every later rollout of such a model to the slower ``"hf"`` path, and a resumed run (whose first
    rollout comes before any such forward) to a different path from the uninterrupted one."""
    return getattr(hook, "__module__", None) == "transformers.utils.output_capturing"


def lean_engine_supports(model: torch.nn.Module) -> bool:
    """True when the lean engine can run ``model`` (:func:`lean_engine_refusal` says why not)."""
    return lean_engine_refusal(model) is None


@dataclass
class LeanLayer:
    """One decoder layer's parameters for :func:`lean_forward` (plain tensors: no module lookups per pass).

    ========= ======================= ===========================================
    qkv       ``(H D + 2 H_kv D, d)`` query, key and value projections stacked
    o         ``(d, H D)``            attention output projection
    gate_up   ``(2 F, d)``            gate and up projections of the MLP stacked
    down      ``(d, F)``              MLP output projection
    norm_in   (``(d,)``, float)       RMSNorm weight and epsilon before attention
    norm_post (``(d,)``, float)       RMSNorm weight and epsilon before the MLP
    act       callable                the MLP's activation
    ========= ======================= ===========================================
    """

    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    norm_in: tuple[torch.Tensor, float]
    norm_post: tuple[torch.Tensor, float]
    act: Callable[[torch.Tensor], torch.Tensor]


@dataclass
class LeanWeights:
    """The model's parameters laid out for decoding, built once per rollout (no gradient; the weight
    sync of a real engine).

    ============== ================================= =========================================================
    layers         ``n_layers`` x :class:`LeanLayer` one entry per decoder layer
    embed, lm_head ``(V, d)``                        token embeddings and output projection
    norm           (``(d,)``, float)                 final RMSNorm weight and epsilon
    cos, sin       ``(L_max, D)``                    rotary angles per position; ``sin`` by :func:`signed_sin`
    heads          int                               query heads ``H``
    kv_heads       int                               key/value heads ``H_kv``
    head_dim       int                               ``D``
    scaling        float                             the attention's score scale
    ============== ================================= =========================================================
    """

    layers: list[LeanLayer]
    embed: torch.Tensor
    lm_head: torch.Tensor
    norm: tuple[torch.Tensor, float]
    cos: torch.Tensor
    sin: torch.Tensor
    heads: int
    kv_heads: int
    head_dim: int
    scaling: float

    @classmethod
    @torch.no_grad()
    def from_model(cls, model: LlamaForCausalLM) -> "LeanWeights":
        cfg, body = model.config, model.model
        positions = torch.arange(cfg.max_position_embeddings, device=body.rotary_emb.inv_freq.device)
        cos, sin = rotary_angles(model, positions)
        dtype = body.embed_tokens.weight.dtype
        layers = [LeanLayer(
            qkv=torch.cat([l.self_attn.q_proj.weight, l.self_attn.k_proj.weight, l.self_attn.v_proj.weight]),
            o=l.self_attn.o_proj.weight, gate_up=torch.cat([l.mlp.gate_proj.weight, l.mlp.up_proj.weight]),
            down=l.mlp.down_proj.weight, act=l.mlp.act_fn,
            norm_in=(l.input_layernorm.weight, l.input_layernorm.variance_epsilon),
            norm_post=(l.post_attention_layernorm.weight, l.post_attention_layernorm.variance_epsilon),
        ) for l in body.layers]
        attn = body.layers[0].self_attn
        return cls(layers=layers, embed=body.embed_tokens.weight, lm_head=model.lm_head.weight,
                   norm=(body.norm.weight, body.norm.variance_epsilon), cos=cos.to(dtype),
                   sin=signed_sin(sin).to(dtype), heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads,
                   head_dim=attn.head_dim, scaling=attn.scaling)


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


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``(..., D)`` sines with the first half negated: what :func:`rotate` takes (see there)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last axis, computed in float32 (as Llama does)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (h if h.dtype == x.dtype else h.to(x.dtype))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply the rotary embedding to ``x`` ``(..., D)``: pairs ``(i, i + D/2)`` rotate together.

    ``sin`` is signed (:func:`signed_sin`): Llama's ``rotate_half(x) * sin`` is
    ``cat(-x2, x1) * sin``, which equals ``cat(x2, x1) * cat(-sin1, sin2)`` to the bit (a sign flip is
    exact), and ``cat(x2, x1)`` is one ``roll``; the sign is paid once per rollout, not per layer.
    """
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


def lean_forward(model: LlamaForCausalLM, weights: LeanWeights, input_ids: torch.Tensor,
                 positions: torch.Tensor, input_ok: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run ``n`` new tokens per row through the model, append their keys and values to ``cache``
    and return the logits of the last one.

    A new token attends to the real tokens up to its own position; a padding token attends only to
    itself, so that no row of the attention is empty (its output is never used). Only ``weights``
    is read (``model`` names the architecture the weights came from).

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

    H, H_kv, D = weights.heads, weights.kv_heads, weights.head_dim
    x = F.embedding(input_ids, weights.embed)
    cos, sin = weights.cos[positions][:, :, None], weights.sin[positions][:, :, None]  # (B, n, 1, D)
    for layer, keys, values in zip(weights.layers, cache.keys, cache.values):
        qkv = F.linear(rms_norm(x, *layer.norm_in), layer.qkv).view(B, n, H + 2 * H_kv, D)
        qk = rotate(qkv[:, :, :H + H_kv], cos, sin).transpose(1, 2)  # queries and keys rotated at once
        keys[:, :, start:end] = qk[:, H:]
        values[:, :, start:end] = qkv[:, :, H + H_kv:].transpose(1, 2)
        out = F.scaled_dot_product_attention(qk[:, :H], keys[:, :, :end], values[:, :, :end], attn_mask=allowed,
                                             scale=weights.scaling, enable_gqa=H != H_kv)
        x = x + F.linear(out.transpose(1, 2).reshape(B, n, H * D), layer.o)
        gate, up = F.linear(rms_norm(x, *layer.norm_post), layer.gate_up).chunk(2, dim=-1)
        x = x + F.linear(layer.act(gate) * up, layer.down)
    cache.length = end
    return F.linear(rms_norm(x[:, -1], *weights.norm), weights.lm_head)
