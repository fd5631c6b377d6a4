"""The lean decoding engine computes what ``transformers`` computes, and the sampler draws what it should."""
import copy

import pytest
import torch

import rlcourse
from rlcourse.lm import build_model, build_tokenizer, response_logprobs, sample
from rlcourse.lm.engine import KVCache, LeanWeights, lean_engine_supports, lean_forward
from rlcourse.lm.model import position_ids_from_mask, shared_prefix_logprobs
from rlcourse.lm.sampling import _draw, encode_prompts
from rlcourse.lm.heads import ScalarHeadModel

PROMPTS = ["12+7=", "3+45=", "sort 93:", "9+9="]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    m = build_model(tok, rlcourse.profile("smoke"), seed=3).eval()
    with torch.no_grad():  # make EOS likely, so that rows finish at different steps
        m.model.embed_tokens.weight[tok.eos_token_id] *= 4.0
    return m


def test_lean_forward_equals_transformers(tok, model):
    """Prefill on left-padded prompts, then decode steps: the logits agree with a full forward pass."""
    ids, mask = encode_prompts(tok, PROMPTS)
    g = torch.Generator().manual_seed(0)
    extra = torch.randint(2, len(tok), (len(PROMPTS), 5), generator=g)
    full_ids = torch.cat([ids, extra], 1)
    full_mask = torch.cat([mask, torch.ones_like(extra)], 1)
    with torch.no_grad():
        ref = model(input_ids=full_ids, attention_mask=full_mask,
                    position_ids=position_ids_from_mask(full_mask)).logits
        cache = KVCache.empty(model, len(PROMPTS), full_ids.shape[1])
        pos = position_ids_from_mask(mask)
        weights = LeanWeights.from_model(model)
        got = [lean_forward(model, weights, ids, pos, mask.bool(), cache)]
        ok = torch.ones(len(PROMPTS), 1, dtype=torch.bool)
        for t in range(extra.shape[1]):
            pos = pos[:, -1:] + 1
            got.append(lean_forward(model, weights, extra[:, t:t + 1], pos, ok, cache))
    P = ids.shape[1]
    for t, logits in enumerate(got):
        torch.testing.assert_close(logits, ref[:, P - 1 + t], atol=1e-5, rtol=1e-5)
    assert cache.length == full_ids.shape[1]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_lean_and_hf_engines_sample_the_same(tok, model, temperature):
    """Same generator, same draws: the engines give the same tokens and log-probs, including after
    the lean engine has dropped finished rows and shared each prompt's prefill across its G samples."""
    batches = [sample(model, tok, PROMPTS, num_generations=8, max_new_tokens=12, temperature=temperature,
                      generator=torch.Generator().manual_seed(1), engine=e) for e in ("hf", "lean")]
    hf, lean = batches
    assert torch.equal(hf.response_ids, lean.response_ids) and hf.texts == lean.texts
    torch.testing.assert_close(hf.logprobs, lean.logprobs, atol=1e-5, rtol=1e-5)
    lengths = lean.lengths
    if temperature > 0:  # rows did finish at different steps, so compaction was exercised
        assert lengths.min() < lengths.max() and lean.truncated.any() and not lean.truncated.all()
    recomputed = response_logprobs(model, lean.input_ids, lean.attention_mask, lean.response_len,
                                   lean.temperature) * lean.response_mask
    torch.testing.assert_close(recomputed, lean.logprobs, atol=1e-5, rtol=1e-5)
    # the entropy recorded while sampling is the training-time entropy of the same weights
    _, entropy = response_logprobs(model, lean.input_ids, lean.attention_mask, lean.response_len,
                                   lean.temperature, return_entropy=True)
    torch.testing.assert_close(entropy * lean.response_mask, lean.entropy, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hf.entropy, lean.entropy, atol=1e-5, rtol=1e-5)


def test_draw_matches_the_distribution_and_skips_zero_mass():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0],
                          [0.1, 0.0, 0.0, 0.0, 0.0, 0.9]]).repeat(20_000, 1)
    draws = _draw(probs, torch.Generator().manual_seed(0))
    assert draws.shape == (40_000,)
    for row in range(2):
        picked = draws[row::2]
        freq = torch.bincount(picked, minlength=6).double() / picked.numel()
        assert (freq[probs[row] == 0] == 0).all()
        se = (probs[row].double() * (1 - probs[row].double()) / picked.numel()).sqrt()
        assert ((freq - probs[row].double()).abs() <= 5 * se + 1e-12).all()
    # the last token with zero mass is never drawn, even by a uniform at the top of its range
    edge = torch.tensor([[0.25, 0.75, 0.0]])
    assert _draw(edge.repeat(10_000, 1), torch.Generator().manual_seed(1)).max() <= 1


def test_lean_engine_errors(tok, model):
    cache = KVCache.empty(model, 2, 3)
    ids = torch.full((2, 4), 5)
    with pytest.raises(ValueError, match="KV cache holds 3 positions; 4"):
        lean_forward(model, LeanWeights.from_model(model), ids, torch.arange(4).expand(2, 4),
                     torch.ones(2, 4, dtype=torch.bool), cache)
    head = ScalarHeadModel.from_policy(model)
    assert lean_engine_supports(model) and not lean_engine_supports(head)
    with pytest.raises(ValueError, match="engine must be"):
        sample(model, tok, PROMPTS, engine="vllm")
    with pytest.raises(ValueError, match="runs LlamaForCausalLM, not ScalarHeadModel"):
        sample(head, tok, PROMPTS, engine="lean")
    # a forward hook would be skipped by the lean engine's direct weight reads: refused, by name
    handle = model.model.layers[0].mlp.register_forward_hook(lambda module, args, out: out * 2)
    try:
        assert not lean_engine_supports(model)
        with pytest.raises(ValueError, match=r"forward hooks on model\.layers\.0\.mlp"):
            sample(model, tok, PROMPTS, engine="lean")
    finally:
        handle.remove()
    assert lean_engine_supports(model)


def test_transformers_output_recording_hooks_keep_the_lean_engine(tok, model):
    """A forward asking for hidden states makes transformers install hooks that record them (and do
    nothing otherwise). They do not send later rollouts to the "hf" path: a resumed run, whose first
    rollout comes before any such forward, samples on the same path as the uninterrupted one."""
    m = copy.deepcopy(model)
    ids = torch.full((2, 4), 5)
    m(input_ids=ids, output_hidden_states=True)
    assert any(mod._forward_hooks for mod in m.modules())  # transformers' recorders are installed
    assert lean_engine_supports(m)
    fresh = [sample(x, tok, PROMPTS, num_generations=2, max_new_tokens=4, generator=torch.Generator().manual_seed(0))
             for x in (copy.deepcopy(model), m)]
    assert torch.equal(fresh[0].response_ids, fresh[1].response_ids)
    assert torch.equal(fresh[0].logprobs, fresh[1].logprobs)  # the same (lean) path, bit for bit


def test_shared_prefix_logprobs_equal_full_forward_with_gradients(tok, model):
    """Running each prompt once and copying its keys and values to its G responses changes neither the
    log-probs, nor the entropies, nor the gradient with respect to any parameter."""
    batch = sample(model, tok, PROMPTS, num_generations=3, max_new_tokens=8, temperature=1.0,
                   generator=torch.Generator().manual_seed(2))
    first = torch.arange(len(PROMPTS)) * 3
    weights = torch.randn(batch.response_ids.shape, generator=torch.Generator().manual_seed(3)) * batch.response_mask
    assert batch.lengths.min() < batch.response_len  # some rows are padded: packing them away is exercised
    results = []
    for shared in (False, True, "lengths"):
        model.zero_grad()
        if shared:
            lengths = batch.lengths if shared == "lengths" else None
            logp, ent = shared_prefix_logprobs(model, batch.prompt_ids[first], batch.prompt_mask[first], batch.index,
                                               batch.response_ids, batch.temperature, return_entropy=True,
                                               response_lengths=lengths)
            if lengths is not None:  # nothing is computed after a row's length
                assert not logp[batch.response_mask == 0].any() and not ent[batch.response_mask == 0].any()
        else:
            logp, ent = response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_len,
                                          batch.temperature, return_entropy=True)
        ((logp + 0.1 * ent) * weights).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((logp * batch.response_mask, ent * batch.response_mask, grads))
    model.zero_grad()
    for full, shared, packed in zip(*results):
        torch.testing.assert_close(shared, full, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(packed, full, atol=2e-5, rtol=1e-4)


def test_shared_prefix_logprobs_errors(tok, model):
    ids, mask = encode_prompts(tok, PROMPTS)
    resp = torch.full((2, 3), 5)
    with pytest.raises(ValueError, match="group holds rows outside"):
        shared_prefix_logprobs(model, ids, mask, torch.tensor([0, len(PROMPTS)]), resp)
    with pytest.raises(ValueError, match="shapes do not fit"):
        shared_prefix_logprobs(model, ids, mask, torch.tensor([0]), resp)
    for bad in (torch.tensor([0, 3]), torch.tensor([1, 4]), torch.tensor([3])):
        with pytest.raises(ValueError, match=r"response_lengths must be \(2,\) with values in \[1, 3\]"):
            shared_prefix_logprobs(model, ids, mask, torch.tensor([0, 1]), resp, response_lengths=bad)
    with pytest.raises(ValueError, match="cannot run this model: it runs a transformers causal LM"):
        shared_prefix_logprobs(ScalarHeadModel.from_policy(model), ids, mask, torch.tensor([0, 1]), resp)


def _hf_models(tok, model):
    """Models the lean engine does not run: a Qwen2 (biases) with a peft LoRA adapter, and the tiny
    Llama with a forward hook that edits the lm_head's output (as R2PO's rollout head does)."""
    from rlcourse.capstone import add_lora, build_tiny_qwen2

    qwen = build_tiny_qwen2(tok, hidden=32, intermediate=64, layers=2, heads=4, kv_heads=2, max_positions=64, seed=1)
    lora = add_lora(qwen, r=4, alpha=8, seed=0)
    with torch.no_grad():  # a non-zero adapter, so its gradient depends on the whole forward
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    hooked = copy.deepcopy(model)
    hooked.lm_head.register_forward_hook(lambda module, args, out: out * 0.5 + 0.1)
    return {"qwen2+lora": lora, "hooked llama": hooked}


def test_shared_prefix_logprobs_of_transformers_models_equal_full_forward_with_gradients(tok, model):
    """For a model the lean engine does not run, the prompt pass keeps its cache (with its graph), the
    cache's rows are copied to the responses, and the responses run on it: log-probs, entropies and
    every trainable parameter's gradient equal one full forward's."""
    for name, m in _hf_models(tok, model).items():
        assert not lean_engine_supports(m)
        m.train()
        batch = sample(m, tok, PROMPTS, num_generations=3, max_new_tokens=8, temperature=1.0,
                       generator=torch.Generator().manual_seed(2))
        assert batch.lengths.min() < batch.response_len, name  # padded rows are exercised
        first = torch.arange(len(PROMPTS)) * 3
        weights = torch.randn(batch.response_ids.shape, generator=torch.Generator().manual_seed(3)) * batch.response_mask
        results = []
        for shared in (False, True):
            m.zero_grad()
            if shared:
                logp, ent = shared_prefix_logprobs(m, batch.prompt_ids[first], batch.prompt_mask[first], batch.index,
                                                   batch.response_ids, batch.temperature, return_entropy=True,
                                                   response_lengths=batch.lengths)
                assert not logp[batch.response_mask == 0].any() and not ent[batch.response_mask == 0].any()
            else:
                logp, ent = response_logprobs(m, batch.input_ids, batch.attention_mask, batch.response_len,
                                              batch.temperature, return_entropy=True)
            ((logp + 0.1 * ent) * weights).sum().backward()
            grads = torch.cat([p.grad.flatten() for p in m.parameters() if p.requires_grad])
            results.append((logp * batch.response_mask, ent * batch.response_mask, grads))
        for full, shared in zip(*results):
            torch.testing.assert_close(shared, full, atol=2e-5, rtol=1e-4, msg=name)


def test_shared_prefix_logprobs_refuses_gradient_checkpointing(tok):
    from rlcourse.capstone import build_tiny_qwen2
    from rlcourse.capstone.models import enable_checkpointing
    from rlcourse.lm.model import shared_prefix_refusal

    qwen = build_tiny_qwen2(tok, hidden=32, intermediate=64, layers=1, heads=4, kv_heads=2, max_positions=64)
    assert shared_prefix_refusal(qwen) is None
    enable_checkpointing(qwen)
    assert "gradient checkpointing" in shared_prefix_refusal(qwen)
    ids, mask = encode_prompts(tok, PROMPTS[:2])
    with pytest.raises(ValueError, match="gradient checkpointing is on"):
        shared_prefix_logprobs(qwen, ids, mask, torch.tensor([0, 1]), torch.full((2, 3), 5))
