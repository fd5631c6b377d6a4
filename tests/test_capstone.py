"""Capstone 1 (GRPO with LoRA on a real Hugging Face model): loading, LoRA, tasks, evaluation, resume."""
import json
from dataclasses import replace
import os

import numpy as np
import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("math_verify")

from rlcourse.capstone import (ChatTask, JsonlMathTask, ReasoningGymMath, add_lora, build_tiny_qwen2,  # noqa: E402
                               capstone_config, char_chat_tokenizer, evaluate_pass_at_k, gsm8k_final_answer,
                               load_causal_lm, math_verify_score, run_grpo_lora, save_tiny_qwen2)
from rlcourse.metrics import pass_at_k  # noqa: E402
from rlcourse.profiles import one_torch_thread  # noqa: E402
from rlcourse.tasks import Example, Task  # noqa: E402
from rlcourse.train import AdapterOffReference, RLConfig, Trainer  # noqa: E402

ARITH = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=("+", "-"), allow_parentheses=False,
             allow_negation=False)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    tok = char_chat_tokenizer()
    model = build_tiny_qwen2(tok, hidden=32, intermediate=64, layers=1, heads=2, kv_heads=1, max_positions=512)
    return save_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2"), model, tok)


def test_tiny_qwen2_round_trips_through_from_pretrained(tiny_path):
    model, tok = load_causal_lm(tiny_path)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    assert tok.apply_chat_template([{"role": "user", "content": "1+1?"}], tokenize=False,
                                   add_generation_prompt=True) == "Q: 1+1? A: "
    # the lab's character tokenizer comes back as it was written (AutoTokenizer alone would give it
    # Qwen2Tokenizer's byte-level pipeline, which drops the spaces)
    text = "Q: Calculate 48 + 16. A: "
    assert tok(text)["input_ids"] == char_chat_tokenizer()(text)["input_ids"]
    assert tok.decode(tok(text)["input_ids"]) == text and tok.unk_token_id not in tok(text)["input_ids"]
    again, _ = load_causal_lm(tiny_path)
    for (name, p), q in zip(model.named_parameters(), again.parameters()):
        assert torch.equal(p, q), name


def test_unknown_model_offline_says_it_needs_a_download(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="download.*local path"):
        load_causal_lm("no-such-org/no-such-model-xyz")
    with pytest.raises(ValueError, match="local path"):
        load_causal_lm(tmp_path / "missing")


def test_lora_trains_only_the_adapter_and_starts_at_the_base(tiny_path):
    model, tok = load_causal_lm(tiny_path)
    with pytest.raises(ValueError, match=r"not linear layers.*it has \[.*q_proj"):
        add_lora(model, target_modules=("q_proj", "qkv_fused"))
    ids = torch.tensor([[5, 6, 7, 8]])
    base_logits = model(input_ids=ids).logits
    policy = add_lora(model, r=4, alpha=8, target_modules=("q_proj", "v_proj"))
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert torch.allclose(policy(input_ids=ids).logits, base_logits)  # B = 0 at initialisation


class _ParityChat(ChatTask):
    """Reward 1 when the completion starts with an even character code: about half of a random
    model's samples, so groups have reward variance and the adapter learns from step 1."""

    def score(self, completion, example):
        from rlcourse.tasks import Score
        return Score(float(bool(completion) and ord(completion[0]) % 2 == 0), "parity")


def _trainer(tiny_path, tmp_path=None, resume=False, steps=4, **rl):
    model, tok = load_causal_lm(tiny_path)
    policy = add_lora(model, r=4, alpha=8, target_modules=("q_proj", "v_proj", "down_proj"))
    task = _ParityChat(ReasoningGymMath("basic_arithmetic", **ARITH), tok)  # a random model earns reward
    cfg = RLConfig(steps=steps, prompts_per_step=3, num_generations=4, max_completion_length=4, learning_rate=5e-2,
                   beta=0.1, train_pool_size=32, eval_prompts=4, progress=False, seed=3,
                   output_dir=str(tmp_path) if tmp_path else None, save_every=2 if tmp_path else 0, **rl)
    return Trainer(policy, tok, task, cfg, resume=resume)


def _adapter(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def test_reference_is_the_base_with_the_adapter_off(tiny_path):
    trainer = _trainer(tiny_path)
    assert isinstance(trainer.ref_model, AdapterOffReference) and trainer.ref_model.model is trainer.model
    # the optimiser holds the adapter's parameters only
    in_opt = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert in_opt == {id(p) for p in trainer.model.parameters() if p.requires_grad}
    base_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    trainer.train(2)
    for n, p in trainer.model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, base_before[n]), f"frozen {n} changed"
    assert any(h["kl"] != 0 for h in trainer.history)  # the adapter moved the policy away from the base
    # the reference equals the base model: adapter-off log-probs equal those of a fresh base copy
    base, _ = load_causal_lm(tiny_path)
    ids = torch.tensor([[40, 41, 42, 43, 44]])
    ref = trainer.ref_model(input_ids=ids).logits
    assert torch.allclose(ref, base(input_ids=ids).logits, atol=1e-6)
    assert not torch.allclose(trainer.model(input_ids=ids).logits, ref, atol=1e-6)


def test_resume_continues_the_adapter_exactly(tiny_path, tmp_path):
    straight = _trainer(tiny_path, tmp_path / "a")
    straight.train(4)
    first = _trainer(tiny_path, tmp_path / "b")
    first.train(2)
    assert (tmp_path / "b" / "checkpoint-000002" / "adapter" / "adapter_model.safetensors").exists()
    assert not (tmp_path / "b" / "checkpoint-000002" / "model.safetensors").exists()  # no copy of the base
    resumed = _trainer(tiny_path, tmp_path / "b", resume=True)
    assert resumed.step_count == 2
    resumed.train(4)
    a, b = _adapter(straight), _adapter(resumed)
    assert a.keys() == b.keys()
    for n in a:
        assert torch.equal(a[n], b[n]), n
    assert [h["reward"] for h in straight.history] == [h["reward"] for h in resumed.history]


def test_math_verify_score():
    assert math_verify_score("so the answer is \\boxed{288}", "288").reward == 1.0
    assert math_verify_score("-4", "-4").reward == 1.0
    assert math_verify_score("1/2", "0.5").reward == 1.0
    assert math_verify_score("28", "288").reward == 0.0
    s = math_verify_score("no idea", "288")
    assert s.reward == 0.0 and "malformed" in s.reason


def test_reasoning_gym_math_works_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, config in [("basic_arithmetic", ARITH), ("gsm_symbolic", {})]:
        task = ReasoningGymMath(name, **config)
        train, test = task.examples(6, seed=0), task.examples(3, seed=0, split="test")
        assert not {e.prompt for e in train} & {e.prompt for e in test}
        assert all(task.score(e.answer, e).reward == 1.0 for e in train)
        assert task.score("\\boxed{" + train[0].answer + "}", train[0]).reward == 1.0
    assert "max_digits=1" in ReasoningGymMath("basic_arithmetic", **ARITH).name
    # held-out prompts are distinct; 1-digit arithmetic has too few for 128 of them in the test split
    small = ReasoningGymMath("basic_arithmetic", **ARITH)
    test = small.examples(10, seed=0, split="test")
    assert len({e.prompt for e in test}) == 10
    with pytest.raises(ValueError, match="distinct test prompts"):
        small.examples(128, seed=0, split="test")
    with pytest.raises(ValueError, match="checker"):
        ReasoningGymMath("basic_arithmetic", checker="regex")


def test_gsm8k_jsonl_through_datasets(tmp_path):
    rows = [{"question": f"Tom has {i} apples and buys {i + 2} more. How many?",
             "answer": f"He has {i} + {i + 2} = {2 * i + 2} apples.\n#### {2 * i + 2:,}"} for i in range(600, 640)]
    path = tmp_path / "gsm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = JsonlMathTask(path)
    train, test = task.rows("train"), task.rows("test")
    assert len(train) + len(test) == 40 and not {e.prompt for e in train} & {e.prompt for e in test}
    ex = task.examples(5, seed=1)[0]
    assert "," not in ex.answer and ex.solution.endswith(f"\\boxed{{{ex.answer}}}.")
    assert task.score(ex.solution, ex).reward == 1.0
    assert task.score("The answer is 7.", ex).reward == 0.0
    assert task.examples(3, seed=1, split="test") == task.examples(3, seed=1, split="test")
    with pytest.raises(ValueError, match="distinct"):
        task.examples(len(test) + 1, split="test")
    split = JsonlMathTask(path, test_path=path)
    assert len(split.rows("test")) == 40
    assert gsm8k_final_answer("x\n#### 1,234") == "1234"
    with pytest.raises(ValueError, match="####"):
        gsm8k_final_answer("no marker")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "answer": "#### 1"}) + "\n")
    with pytest.raises(ValueError, match="question"):
        JsonlMathTask(bad).rows("train")
    with pytest.raises(FileNotFoundError):
        JsonlMathTask(tmp_path / "none.jsonl")


def test_chat_task_renders_and_scores_like_the_inner_task():
    tok = char_chat_tokenizer()
    inner = ReasoningGymMath("basic_arithmetic", **ARITH)
    task = ChatTask(inner, tok, instruction=" Answer:")
    ex = task.examples(2)[0]
    assert ex.prompt == f"Q: {ex.meta['question']} Answer: A: "
    assert task.score(ex.answer, ex).reward == 1.0
    tok.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        ChatTask(inner, tok)


class _Coin(Task):
    """Correct when the completion starts with an even character code (a fixed fraction per prompt)."""
    name = "coin"

    def score(self, completion, example):
        from rlcourse.tasks import Score
        return Score(float(bool(completion) and ord(completion[0]) % 2 == 0), "")


def test_pass_at_k_evaluation_uses_the_unbiased_estimator(tiny_path):
    model, tok = load_causal_lm(tiny_path)
    examples = [Example(prompt=f"Q: {i} A: ", answer="0", solution="0") for i in range(5)]
    out = evaluate_pass_at_k(model, tok, _Coin(), examples, n=6, ks=(1, 3, 6), max_new_tokens=3, seed=0)
    assert len(out["correct"]) == 5
    for k in (1, 3, 6):
        assert out[f"pass@{k}"] == pytest.approx(np.mean([pass_at_k(6, c, k) for c in out["correct"]]))
    assert out["pass@1"] <= out["pass@3"] <= out["pass@6"]
    with pytest.raises(ValueError, match="k must be"):
        evaluate_pass_at_k(model, tok, _Coin(), examples, n=2, ks=(4,), max_new_tokens=3)


def test_capstone_config_checks_its_keys():
    with pytest.raises(ValueError, match="not fields of RLConfig"):
        capstone_config("smoke", rl={"stepz": 3})
    with pytest.raises(ValueError, match="pass@k"):
        capstone_config("smoke", eval_samples=2, ks=(1, 4))
    from rlcourse.capstone.grpo_lora import base_task
    assert base_task(capstone_config("book")).name == "addition"
    with pytest.raises(ValueError, match="takes no task_config"):
        base_task(capstone_config("book", task_config={"digits": 3}))
    full = capstone_config("full")
    assert full.model == os.environ.get("RLCOURSE_CAPSTONE_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")
    assert full.dtype == "bfloat16" and full.gradient_checkpointing


def test_smoke_profile_runs_end_to_end(tmp_path):
    result = run_grpo_lora(capstone_config("smoke"), output_dir=tmp_path, progress=False)
    assert len(result["history"]) == 3 and {"pass@1", "pass@4", "greedy"} <= set(result["after"])
    assert result["info"]["trainable"] < result["info"]["parameters"]
    assert (tmp_path / "checkpoint-000002" / "adapter").exists()


def test_full_profile_code_path_on_cpu_with_a_tiny_model(tiny_path, tmp_path):
    """The full profile (bf16, gradient checkpointing, an instruct-style model by path, gsm_symbolic with
    a \\boxed{} instruction, micro-batches) on a tiny model: the GPU run's code path, not its scale."""
    cfg = capstone_config("full", model=str(tiny_path), device="cpu", eval_prompts=2, eval_samples=2, ks=(1, 2),
                          rl=dict(steps=2, prompts_per_step=2, num_generations=2, max_completion_length=8,
                                  learning_rate=1e-3, beta=0.04, micro_batch_size=2, train_pool_size=8, save_every=1))
    result = run_grpo_lora(cfg, output_dir=tmp_path, progress=False)
    policy = result["trainer"].model
    assert next(p for n, p in policy.named_parameters() if not p.requires_grad).dtype == torch.bfloat16
    inner = policy.base_model.model
    assert getattr(inner, "is_activation_checkpointing", None) or inner.is_gradient_checkpointing
    assert "\\boxed{<number>}" in result["trainer"].eval_examples[0].prompt
    assert len(result["history"]) == 2 and np.isfinite(result["history"][-1]["loss"])


# ---------------------------------------------------------------- the GPU path, checked on the CPU
def test_tokens_are_drawn_on_the_model_device_from_a_seed_of_the_cpu_generator(monkeypatch):
    """On the CPU the trainer's generator draws the tokens itself (results unchanged); on another
    device a generator there is seeded from one draw of the CPU generator, so the probabilities
    never leave the device and a resumed run (same CPU generator state) draws the same seed."""
    from rlcourse.lm.sampling import device_generator

    gen = torch.Generator().manual_seed(3)
    assert device_generator(gen, "cpu") is gen and device_generator(None, "cuda") is None
    made = []
    real = torch.Generator

    def on_device(device="cpu"):  # stands in for a CUDA generator on this CPU-only machine
        made.append(torch.device(device))
        return real()

    monkeypatch.setattr(torch, "Generator", on_device)
    a, b = real().manual_seed(5), real().manual_seed(5)
    first = device_generator(a, "cuda:1")
    assert made == [torch.device("cuda:1")]
    assert torch.equal(torch.rand(4, generator=first), torch.rand(4, generator=device_generator(b, "cuda:1")))
    assert not torch.equal(a.get_state(), real().manual_seed(5).get_state())  # the CPU generator moved on
    assert not torch.equal(torch.rand(4, generator=first), torch.rand(4, generator=device_generator(a, "cuda:1")))


@pytest.mark.parametrize("chunk_elements", [7, 40, 120, 10 ** 6])
def test_chunked_logprobs_equal_one_log_softmax_in_values_and_gradients(chunk_elements):
    """Chunks of one position (7 < V), of a few positions (40), of whole rows (120) and one chunk:
    log-probs, entropies and the gradient of any mix of them equal those of one float32 log-softmax."""
    from rlcourse.lm.model import chunked_logprobs

    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.float64) * 3
    labels = torch.randint(0, 11, (3, 5))
    w_logp, w_ent = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)

    def plain(x):
        logz = torch.log_softmax(x / 0.7, -1)
        return logz.gather(-1, labels[..., None]).squeeze(-1), -(logz.exp() * logz).sum(-1)

    a = logits.clone().requires_grad_()
    logp, ent = plain(a)
    ((logp * w_logp).sum() + (ent * w_ent).sum()).backward()
    b = logits.clone().requires_grad_()
    logp_c, ent_c = chunked_logprobs(b, labels, 0.7, return_entropy=True, chunk_elements=chunk_elements)
    assert logp_c.dtype == torch.float32
    ((logp_c * w_logp).sum() + (ent_c * w_ent).sum()).backward()
    assert torch.allclose(logp_c.double(), logp, atol=1e-5) and torch.allclose(ent_c.double(), ent, atol=1e-5)
    assert torch.allclose(b.grad, a.grad, atol=1e-5)
    c = logits.clone().requires_grad_()  # the log-prob alone (no entropy gradient)
    (chunked_logprobs(c, labels, 0.7, chunk_elements=chunk_elements) * w_logp).sum().backward()
    d = logits.clone().requires_grad_()
    (plain(d)[0] * w_logp).sum().backward()
    assert torch.allclose(c.grad, d.grad, atol=1e-5)
    with pytest.raises(ValueError, match="chunk_elements"):
        chunked_logprobs(logits, labels, chunk_elements=0)


class _LargestTensor(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the most elements of any tensor an operation returns, per dtype."""

    def __init__(self):
        super().__init__()
        self.largest: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest[t.dtype] = max(self.largest.get(t.dtype, 0), t.numel())
        return out


class _MetaLM(torch.nn.Module):
    """The logits a causal LM of vocabulary V returns, as meta tensors (no memory): enough to follow
    the shapes of the log-prob passes at the full profile's size on a CPU."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.rows = vocab, []

    def forward(self, input_ids, attention_mask, position_ids, use_cache, logits_to_keep):
        from types import SimpleNamespace
        self.rows.append(input_ids.shape[0])
        return SimpleNamespace(logits=torch.empty(input_ids.shape[0], logits_to_keep, self.vocab, dtype=torch.bfloat16,
                                                  device=input_ids.device))


def test_log_prob_passes_peak_at_one_micro_batch_at_full_profile_shapes():
    """The full profile (Qwen2.5's vocabulary of 151,936, 128 rows of 384 response tokens, micro-batches
    of 16): the reference pass runs 16 rows at a time, and no float32 tensor of the policy pass (forward
    and backward) exceeds one chunk; the whole-batch float32 log-softmax would be 128 x 384 x 151,936."""
    from rlcourse.lm.model import LOGPROB_CHUNK_ELEMENTS, chunked_logprobs, response_logprobs

    full = capstone_config("full")
    V, B, T, mb = 151_936, 16 * 8, full.rl["max_completion_length"], full.rl["micro_batch_size"]
    assert (B, T, mb) == (full.rl["prompts_per_step"] * full.rl["num_generations"], 384, 16)
    model, ids = _MetaLM(V), torch.zeros(B, 100 + T, dtype=torch.long, device="meta")
    with torch.no_grad(), _LargestTensor() as seen:
        ref = response_logprobs(model, ids, torch.ones_like(ids), T, micro_batch_size=mb)
    assert ref.shape == (B, T) and model.rows == [mb] * (B // mb)
    assert seen.largest[torch.bfloat16] == mb * (T + 1) * V  # one micro-batch's logits
    assert seen.largest[torch.float32] <= LOGPROB_CHUNK_ELEMENTS < B * T * V // 100
    logits = torch.empty(mb, T, V, dtype=torch.bfloat16, device="meta", requires_grad=True)
    with _LargestTensor() as seen:
        logp, ent = chunked_logprobs(logits, torch.zeros(mb, T, dtype=torch.long, device="meta"), 1.0, True)
        (logp.sum() + ent.sum()).backward()
    assert logits.grad.shape == logits.shape and logits.grad.dtype == torch.bfloat16
    assert seen.largest[torch.float32] <= LOGPROB_CHUNK_ELEMENTS
    assert seen.largest[torch.bfloat16] <= mb * T * V


def test_trainer_runs_the_reference_and_policy_passes_in_micro_batches(tiny_path):
    model, tok = load_causal_lm(tiny_path)
    policy = add_lora(model, r=2, alpha=4)
    # the full forward, so that every scoring pass is one call with use_cache=False; the shared-prompt
    # path is handed the same micro-batch rows (tests/test_train.py checks it gives the same update)
    cfg = RLConfig(steps=1, prompts_per_step=3, num_generations=4, max_completion_length=4, beta=0.1,
                   entropy_coef=0.01, micro_batch_size=5, train_pool_size=16, eval_prompts=0, progress=False,
                   share_prompt_forward=False)
    trainer = Trainer(policy, tok, ReasoningGymMath("basic_arithmetic", **ARITH), cfg, eval_examples=[])
    rows = []
    model.register_forward_pre_hook(lambda m, args, kwargs: rows.append(
        (kwargs["input_ids"].shape[0], kwargs.get("use_cache"))), with_kwargs=True)
    trainer.step()
    scoring = [n for n, cache in rows if cache is False]  # the reference and the policy passes
    assert scoring and max(scoring) <= 5 and sum(scoring) >= 2 * 12 - 5


def test_bfloat16_sampler_and_trainer_disagree_and_training_old_logprobs_make_the_ratio_one(tiny_path, tmp_path):
    """In bfloat16 the KV-cached sampler and the full-sequence forward round differently; in float32 they
    agree. With old_logprobs="training" the first pass's ratio is the update's own forward over itself (1,
    whatever the sampler reported), and with several passes a forward before the first one."""
    from rlcourse.capstone.mismatch import logprob_mismatch
    from rlcourse.rollout import policy_sampler

    tok = char_chat_tokenizer()
    path = save_tiny_qwen2(tmp_path / "wider", build_tiny_qwen2(tok, 64, 128, 2, 4, 2, 256), tok)
    prompts = ["Q: 1+2? A: ", "Q: 17-3? A: "]
    fp32 = logprob_mismatch(load_causal_lm(path)[0], tok, prompts, num_generations=4, max_new_tokens=8)
    bf16 = logprob_mismatch(load_causal_lm(path, dtype=torch.bfloat16)[0], tok, prompts, num_generations=4,
                            max_new_tokens=8)
    assert fp32["tokens"] > 0 and fp32["mean_abs"] < 1e-5 < bf16["mean_abs"]
    with pytest.raises(ValueError, match="old_logprobs"):
        RLConfig(old_logprobs="sampled")

    def other_engine(model, tokenizer, prompts, config, generator, state):  # reports log-probs off by noise
        batch = policy_sampler(model, tokenizer, prompts, config, generator, state)
        noise = 0.05 * torch.randn(batch.logprobs.shape, generator=torch.Generator().manual_seed(0))
        return replace(batch, logprobs=(batch.logprobs + noise) * batch.response_mask)

    task = ReasoningGymMath("basic_arithmetic", **ARITH)
    kl = {}
    for old, passes in [("sampler", 1), ("training", 1), ("training", 2)]:
        policy = add_lora(load_causal_lm(tiny_path)[0], r=2, alpha=4)
        cfg = RLConfig(steps=1, prompts_per_step=2, num_generations=4, max_completion_length=6, entropy_coef=0.01,
                       sampler=other_engine, old_logprobs=old, num_iterations=passes, learning_rate=1e-2,
                       train_pool_size=16, progress=False)
        kl[old, passes] = Trainer(policy, tok, task, cfg, eval_examples=[]).step()["ppo_kl"]
    assert abs(kl["sampler", 1]) > 1e-3 and kl["training", 1] == 0.0
    assert kl["training", 2] != 0.0 and abs(kl["training", 2]) < abs(kl["sampler", 1])  # the 2nd pass: the update


# ---------------------------------------------------------------- bad input, refused before anything loads
def test_config_types_are_checked_when_the_config_is_made():
    from rlcourse.capstone.cli import config_from_mapping
    from rlcourse.capstone.validate import matches_type

    for bad, named in [({"lora_r": "four"}, "lora_r = 'four' should be int"), ({"rl": {"steps": "3"}}, "rl.steps"),
                       ({"ks": [1, "4"]}, "ks entry '4'"), ({"gradient_checkpointing": 1}, "gradient_checkpointing"),
                       ({"rl": {"beta": "0.1"}}, "rl.beta"), ({"rl": 3}, "table of RLConfig")]:
        with pytest.raises(TypeError, match=named):
            config_from_mapping({"profile": "smoke", **bad})
    assert matches_type(3, float) and not matches_type(True, int) and not matches_type(2.5, int)
    assert matches_type(None, int | None) and matches_type([1], tuple) and not matches_type("x", int | None)
    cfg, _ = config_from_mapping({"profile": "smoke", "lora_alpha": 8, "rl": {"beta": 0}})
    assert cfg.rl["beta"] == 0


def test_a_new_task_starts_from_an_empty_task_config_and_gsm8k_takes_two_files(tmp_path):
    from rlcourse.capstone.cli import config_from_mapping
    from rlcourse.capstone.grpo_lora import base_task

    assert capstone_config("smoke").task_config  # the profile's arithmetic settings ...
    cfg, _ = config_from_mapping({"profile": "smoke", "task": "gsm_symbolic"})
    assert cfg.task_config == {}  # ... do not follow a different task
    cfg, _ = config_from_mapping({"profile": "smoke", "task": "basic_arithmetic", "task_config": {"min_terms": 2}})
    assert cfg.task_config == {"min_terms": 2}
    rows = [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(5)]
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    test.write_text("".join(json.dumps(r) + "\n" for r in rows[3:]))
    cfg, _ = config_from_mapping({"profile": "smoke", "jsonl_path": str(train), "jsonl_test_path": str(test)})
    task = base_task(cfg)
    assert len(task.rows("train")) == 3 and [e.answer for e in task.rows("test")] == ["4", "5"]
    with pytest.raises(ValueError, match="needs jsonl_path"):
        capstone_config("smoke", jsonl_test_path=str(test))


def test_everything_that_can_be_checked_without_weights_is_checked_first(tmp_path):
    from rlcourse.capstone.validate import check_before_loading

    check_before_loading(capstone_config("smoke"))  # the profile itself is fine
    for cfg, processes, named in [
            (capstone_config("smoke", lora_targets=("qkv_proj",)), 1, r"LoRA targets \['qkv_proj'\].*it has"),
            (capstone_config("smoke"), 5, "5 processes cannot share prompts_per_step = 4"),
            (capstone_config("smoke", dtype="bfloat17"), 1, "not a torch dtype"),
            (capstone_config("smoke", task_config={"min_termz": 2}), 1, "task: .*min_termz"),
            (capstone_config("smoke", jsonl_path=str(tmp_path / "none.jsonl")), 1, "no GSM8K-format JSONL"),
            (capstone_config("smoke", rl={"micro_batch_size": 0}), 1, "rl: micro_batch_size"),
            (capstone_config("full", model="no-such-org/no-such-model-xyz"), 1, "needs a download")]:
        with pytest.raises(ValueError, match=named):
            check_before_loading(cfg, processes)
    qwen = tmp_path / "qwen-config"  # a hub model's targets are read from its config on the meta device
    from transformers import Qwen2Config
    Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1).save_pretrained(qwen)
    check_before_loading(capstone_config("smoke", model=str(qwen)))
    with pytest.raises(ValueError, match="c_attn"):
        check_before_loading(capstone_config("smoke", model=str(qwen), lora_targets=("c_attn",)))


def test_fsdp_needs_a_model_that_names_its_decoder_layers(monkeypatch):
    from rlcourse.capstone import validate
    from rlcourse.capstone.validate import check_before_loading

    check_before_loading(capstone_config("smoke", parallel="fsdp"), processes=2)
    real = validate.meta_model

    def unnamed_layers(cfg):
        model = real(cfg)
        model._no_split_modules = None
        return model

    monkeypatch.setattr(validate, "meta_model", unnamed_layers)
    check_before_loading(capstone_config("smoke", parallel="fsdp"), processes=1)  # one process shards nothing
    check_before_loading(capstone_config("smoke", parallel="ddp"), processes=2)
    with pytest.raises(ValueError, match="parallel = 'fsdp' shards a model by its decoder layers"):
        check_before_loading(capstone_config("smoke", parallel="fsdp"), processes=2)


def test_the_command_line_prints_one_line_for_bad_input(tmp_path, capsys):
    from rlcourse.capstone.cli import main

    for text, named in [('profile = "smoke"\nlora_r = "four"\n', "lora_r = 'four' should be int"),
                        ('profile = "smoke"\nlora_targets = ["qkv_proj"]\n', "qkv_proj"),
                        ('profile = "smoke"\nlora_rank = 4\n', "unknown config keys")]:
        path = tmp_path / "run.toml"
        path.write_text(text + f'output_dir = "{tmp_path / "out"}"\n')
        assert main(["train", "--config", str(path), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert named in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert err.startswith("python -m rlcourse: error:")
        assert not (tmp_path / "out").exists()  # refused before a model was built or a run started
    assert main(["train", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "no config file" in capsys.readouterr().err
    with pytest.raises(TypeError, match="lora_r"):
        path.write_text('profile = "smoke"\nlora_r = "four"\n')
        main(["train", "--config", str(path), "--traceback"])


def test_the_readme_run_toml_is_a_valid_full_profile_config(tmp_path):
    """The README's complete run.toml parses, every key and type is accepted, and it asks for what a
    GPU run needs (the full profile, bf16, checkpointing, an output folder)."""
    from pathlib import Path

    from rlcourse.capstone.cli import config_from_mapping, read_config_file

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## Training a real model"):]
    block = section[section.index("```toml") + len("```toml"):]
    path = tmp_path / "run.toml"
    path.write_text(block[:block.index("```")])
    cfg, run = config_from_mapping(read_config_file(path))
    assert run["profile"] == "full" and run["output_dir"]
    assert cfg.dtype == "bfloat16" and cfg.gradient_checkpointing and cfg.rl["micro_batch_size"]
    assert cfg.rl["old_logprobs"] == "training"


# ---------------------------------------------------------------- truncated importance sampling
def _tis_inputs(B=3, T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 3).requires_grad_()
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    return logp, torch.randn(B, T, generator=g) * mask, mask


def test_tis_with_equal_logprobs_is_exactly_the_vanilla_loss_and_gradient():
    from rlcourse.capstone.tis import tis_policy_loss
    from rlcourse.losses import compute_policy_loss

    logp, adv, mask = _tis_inputs()
    old = logp.detach() + 0.1 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))
    plain, _ = compute_policy_loss(old, logp, adv, mask, global_tokens=20.0)
    (g_plain,) = torch.autograd.grad(plain, logp)
    tis, metrics = tis_policy_loss(old, logp, adv, mask, rollout_log_prob=old.clone(), tis_cap=2.0, global_tokens=20.0)
    (g_tis,) = torch.autograd.grad(tis, logp)
    assert torch.equal(tis, plain) and torch.equal(g_tis, g_plain)
    assert metrics["tis_weight_mean"] == 1.0 and metrics["tis_capped_frac"] == 0.0


def test_tis_weights_are_capped_detached_and_scale_each_tokens_gradient():
    from rlcourse.capstone.tis import tis_policy_loss, tis_weights
    from rlcourse.losses import compute_policy_loss

    logp, adv, mask = _tis_inputs()
    old = logp.detach().clone().requires_grad_()
    rollout = (logp.detach() + torch.linspace(-2, 2, logp.numel()).reshape(logp.shape)).requires_grad_()
    w = tis_weights(old, rollout, cap=1.5)
    raw = torch.exp(old - rollout).detach()
    assert not w.requires_grad and w.max() == 1.5 and (w <= 1.5).all()
    assert torch.equal(w[raw < 1.5], raw[raw < 1.5]) and (w[raw >= 1.5] == 1.5).all()
    # on-policy (old = the forward itself, ratio 1: no clipping), each token's gradient is its weight times
    loss, metrics = tis_policy_loss(logp.detach(), logp, adv, mask, rollout_log_prob=rollout.detach(), tis_cap=1.5)
    (g,) = torch.autograd.grad(loss, logp)
    (g0,) = torch.autograd.grad(compute_policy_loss(logp.detach(), logp, adv, mask)[0], logp)
    assert torch.allclose(g, g0 * w, atol=1e-7) and not torch.allclose(g, g0)
    assert 0 < metrics["tis_capped_frac"] < 1
    with pytest.raises(ValueError, match="positive"):
        tis_weights(old, rollout, cap=0.0)


def test_tis_is_unbiased_for_the_training_policys_gradient_when_nothing_is_truncated():
    """Monte Carlo on a 5-way categorical: tokens drawn from a rollout distribution q that differs from
    the training policy pi. Weighted by pi/q, the mean gradient is -sum_y pi(y) A(y) grad log pi(y)
    (the exact policy gradient of pi); unweighted, it is q's, which is measurably off."""
    from rlcourse.capstone.tis import tis_policy_loss

    torch.manual_seed(0)
    theta = torch.tensor([0.5, -0.3, 0.1, 1.0, -1.0], requires_grad=True)
    log_q = torch.log_softmax(theta.detach() + torch.tensor([0.6, -0.4, 0.3, -0.5, 0.2]), -1)
    A = torch.tensor([1.0, -0.5, 2.0, 0.0, -1.5])
    exact = torch.autograd.grad(-(torch.softmax(theta, -1) * A).sum(), theta)[0]
    n = 400_000
    y = torch.multinomial(log_q.exp(), n, replacement=True, generator=torch.Generator().manual_seed(1))

    def mc(cap):
        logp = torch.log_softmax(theta, -1)[y].unsqueeze(1)  # (n, 1): one token per sequence
        loss, _ = tis_policy_loss(logp.detach(), logp, A[y].unsqueeze(1), torch.ones(n, 1),
                                  rollout_log_prob=log_q[y].unsqueeze(1), tis_cap=cap)
        return torch.autograd.grad(loss, theta)[0]

    corrected = mc(1e9)  # a cap no weight reaches
    assert torch.allclose(corrected, exact, atol=0.01), (corrected, exact)
    assert (mc(1e-9).abs() < 1e-6).all()  # a cap near 0 weights every token by ~0
    from rlcourse.losses import compute_policy_loss
    logp = torch.log_softmax(theta, -1)[y].unsqueeze(1)
    plain = torch.autograd.grad(compute_policy_loss(logp.detach(), logp, A[y].unsqueeze(1), torch.ones(n, 1))[0],
                                theta)[0]
    assert (plain - exact).abs().max() > 0.05  # without the weights: q's gradient, not pi's


def test_capstone_tis_cap_trains_with_weights_from_the_samplers_logprobs(tiny_path):
    from rlcourse.capstone.grpo_lora import tis_settings
    from rlcourse.rollout import policy_sampler

    with pytest.raises(ValueError, match='old_logprobs = "training"'):
        capstone_config("smoke", tis_cap=2.0)
    with pytest.raises(ValueError, match="positive"):
        capstone_config("smoke", tis_cap=0.0, rl={"old_logprobs": "training"})
    with pytest.raises(ValueError, match="parallel = 'zero3' is not an engine"):
        capstone_config("smoke", parallel="zero3")
    assert tis_settings(capstone_config("smoke")) == {}

    def other_engine(model, tokenizer, prompts, config, generator, state):  # log-probs off by noise
        batch = policy_sampler(model, tokenizer, prompts, config, generator, state)
        noise = 0.3 * torch.randn(batch.logprobs.shape, generator=torch.Generator().manual_seed(0))
        return replace(batch, logprobs=(batch.logprobs + noise) * batch.response_mask)

    cfg = capstone_config("smoke", tis_cap=1.2, rl={"old_logprobs": "training", "sampler": other_engine})
    settings = tis_settings(cfg)
    assert settings["policy_loss"] == "tis" and settings["loss_kwargs"] == {"tis_cap": 1.2}
    policy = add_lora(load_causal_lm(tiny_path)[0], r=2, alpha=4)
    rl = RLConfig(**{**cfg.rl, **settings, "steps": 1, "entropy_coef": 0.01, "progress": False})
    metrics = Trainer(policy, char_chat_tokenizer(), ReasoningGymMath("basic_arithmetic", **ARITH), rl,
                      eval_examples=[]).step()
    assert metrics["tis_weight_mean"] != 1.0 and 0 < metrics["tis_capped_frac"] < 1
