import dataclasses

import pytest
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast

import rlcourse
from rlcourse.lm import (base_model_path, build_model, build_tokenizer, filter_logits, load_base_model,
                         logprobs_from_logits, response_logprobs, sample)
from rlcourse.tasks import get_task


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_model(tok, rlcourse.profile("smoke"), seed=1).eval()


def test_tokenizer_round_trip(tok, tmp_path):
    text = "47+85=231|132 sort 4179: 3*5-7 (What is x?)"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text
    tok.save_pretrained(tmp_path)
    for loaded in (PreTrainedTokenizerFast.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)):
        assert loaded(text, add_special_tokens=False)["input_ids"] == ids
        assert loaded.pad_token == "<pad>" and loaded.eos_token == "<eos>"
        assert (loaded.pad_token_id, loaded.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == text


def test_profile_and_seed(monkeypatch):
    monkeypatch.setenv("RLCOURSE_PROFILE", "book")
    assert rlcourse.profile().name == "book"
    monkeypatch.delenv("RLCOURSE_PROFILE")
    assert rlcourse.profile().name == "book"
    assert rlcourse.profile("smoke").pick(1, 2, 3) == 1
    with pytest.raises(ValueError, match="unknown profile 'huge'"):
        rlcourse.profile("huge")
    rlcourse.seed_everything(5)
    a = torch.rand(3)
    rlcourse.seed_everything(5)
    assert torch.equal(a, torch.rand(3))
    with pytest.raises(ValueError):
        rlcourse.seed_everything(-1)


def test_torch_threads_follow_the_environment_else_the_cores_at_most_two_by_default(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # make book running two chapters side by side on 2 cores
    assert rlcourse.torch_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert rlcourse.torch_threads() == 2 and rlcourse.torch_threads(cap=8) == 3
    for bad in ("two", "0"):
        monkeypatch.setenv("OMP_NUM_THREADS", bad)
        with pytest.raises(ValueError, match="OMP_NUM_THREADS"):
            rlcourse.torch_threads()
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert rlcourse.torch_threads() == 2 and rlcourse.torch_threads(cap=8) == 8
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0}, raising=False)
    assert rlcourse.torch_threads() == 1


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("RLCOURSE_CACHE", str(tmp_path / "c"))
    assert rlcourse.cache_dir() == tmp_path / "c" and (tmp_path / "c").is_dir()


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_sampling_logprobs_equal_recomputed(tok, model, temperature):
    prompts = ["1+2=", "sort 93715:", "47+85=", "9 9 9>81:"]  # different lengths: left padding
    g = torch.Generator().manual_seed(0)
    b = sample(model, tok, prompts, num_generations=3, max_new_tokens=12, temperature=temperature, generator=g)
    assert b.prompt_mask[:, 0].tolist().count(0) > 0  # some rows really are left-padded
    recomputed = response_logprobs(model, b.input_ids, b.attention_mask, b.response_len, temperature)
    m = b.response_mask
    assert torch.allclose(recomputed * m, b.logprobs, atol=1e-5)
    assert (b.logprobs[m == 0] == 0).all()


def test_sampling_logprobs_match_step_by_step_log_softmax(tok, model):
    """The per-token log-prob of a sampled response equals log_softmax of a fresh forward pass on
    the unpadded prefix, one position at a time (no cache, no padding)."""
    b = sample(model, tok, ["12+3=", "sort 4179:"], num_generations=2, max_new_tokens=6, temperature=0.8,
               generator=torch.Generator().manual_seed(3))
    for row in range(len(b)):
        prefix = b.prompt_ids[row][b.prompt_mask[row] == 1]
        for t in range(int(b.lengths[row])):
            with torch.no_grad():
                logits = model(input_ids=prefix[None]).logits[0, -1]
            expected = torch.log_softmax(logits / 0.8, -1)[b.response_ids[row, t]]
            assert abs(float(expected) - float(b.logprobs[row, t])) < 1e-5
            prefix = torch.cat([prefix, b.response_ids[row, t:t + 1]])


def test_rollout_layout(tok, model):
    b = sample(model, tok, ["1+2=", "33+4="], num_generations=4, max_new_tokens=10,
               generator=torch.Generator().manual_seed(1))
    assert b.index.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert b.prompts[:5] == ["1+2="] * 4 + ["33+4="]
    eos = tok.eos_token_id
    for row in range(len(b)):
        n = int(b.lengths[row])
        assert b.response_mask[row, :n].eq(1).all() and b.response_mask[row, n:].eq(0).all()
        ids = b.response_ids[row].tolist()
        if not b.truncated[row]:
            assert ids[n - 1] == eos and eos not in ids[:n - 1]  # mask includes the first EOS
            assert all(i == tok.pad_token_id for i in ids[n:])
        else:
            assert n == b.response_len and eos not in ids
    assert b.texts[0] == tok.decode(b.response_ids[0][b.response_mask[0] == 1], skip_special_tokens=True)


def test_sampling_deterministic_and_greedy(tok, model):
    kw = dict(num_generations=2, max_new_tokens=8, temperature=1.0)
    a = sample(model, tok, ["5+5="], generator=torch.Generator().manual_seed(7), **kw)
    b = sample(model, tok, ["5+5="], generator=torch.Generator().manual_seed(7), **kw)
    assert torch.equal(a.response_ids, b.response_ids)
    g = sample(model, tok, ["5+5=", "5+5="], temperature=0.0, max_new_tokens=8)
    assert torch.equal(g.response_ids[0], g.response_ids[1])


def test_filter_logits():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, False, True, True]]
    # nucleus 0.7: 0.5 alone is below, 0.5+0.3 reaches it; the rest are dropped
    assert torch.isinf(filter_logits(logits, top_p=0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.5)).tolist() == [[False, True, True, True]]
    assert not torch.isinf(filter_logits(logits)).any()


def test_top_k_samples_only_allowed_tokens(tok, model):
    b = sample(model, tok, ["1+1="], num_generations=64, max_new_tokens=1, top_k=1,
               generator=torch.Generator().manual_seed(0))
    greedy = sample(model, tok, ["1+1="], temperature=0.0, max_new_tokens=1)
    assert (b.response_ids[:, 0] == greedy.response_ids[0, 0]).all()


def test_bad_input_is_a_clear_error(tok, model):
    with pytest.raises(ValueError, match="num_generations"):
        sample(model, tok, ["1+1="], num_generations=0)
    with pytest.raises(ValueError, match="prompts is empty"):
        sample(model, tok, [])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        sample(model, tok, ["1+1=", ""])
    with pytest.raises(TypeError, match="list of strings"):
        sample(model, tok, "1+1=")
    with pytest.raises(ValueError, match="exceeds the model's context of 64"):
        sample(model, tok, ["1" * 60], max_new_tokens=8)
    with pytest.raises(ValueError, match="response_len"):
        response_logprobs(model, torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5), 5)
    with pytest.raises(ValueError, match="do not match"):
        logprobs_from_logits(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="unknown task"):
        load_base_model("nope")
    with pytest.raises(ValueError, match="strength"):
        load_base_model("sort", strength=1.5)


def test_zoo_is_deterministic_and_cached(tmp_path, monkeypatch):
    prof = rlcourse.profile("smoke")
    monkeypatch.setenv("RLCOURSE_CACHE", str(tmp_path / "a"))
    m1, _ = load_base_model("sort", strength=0.9, prof=prof, progress=False)
    assert base_model_path("sort", 0.9, prof=prof).joinpath("model.safetensors").exists()
    m_cached, tok = load_base_model("sort", strength=0.9, prof=prof, progress=False)
    monkeypatch.setenv("RLCOURSE_CACHE", str(tmp_path / "b"))
    m2, _ = load_base_model("sort", strength=0.9, prof=prof, progress=False)  # a fresh build elsewhere
    for (n, p1), p2, p3 in zip(m1.named_parameters(), m2.parameters(), m_cached.parameters()):
        assert torch.equal(p1, p2), n
        assert torch.equal(p1, p3), n
    info = m_cached.config.rlcourse_pretrain
    assert info["task"] == "sort" and info["steps"] >= 1 and len(info["history"]) >= 2
    assert info["history"][0]["step"] == 0
    assert isinstance(tok, PreTrainedTokenizerFast)


def test_pretraining_learns_sorting():
    """A real (if small) learning check: SFT must lift held-out accuracy well above its start."""
    from rlcourse.lm import greedy_accuracy, pretrain

    torch.manual_seed(0)
    tok = build_tokenizer()
    prof = rlcourse.profile("smoke")
    model = build_model(tok, rlcourse.Profile(**{**prof.as_dict(), "lm_hidden": 64, "lm_intermediate": 128,
                                                 "lm_layers": 2}), seed=0)
    task = get_task("sort")
    result = pretrain(model, tok, task, max_steps=150, batch_size=64, lr=3e-3, eval_every=150, eval_prompts=64,
                      progress=False)
    assert result.history[0]["accuracy"] < 0.05
    assert result.accuracy > 0.3, result.history
    assert greedy_accuracy(model, tok, task, task.examples(64, split="test")) == pytest.approx(result.accuracy)


def test_pretraining_lands_near_its_target():
    """Checks come every eval_every // 5 steps near the target, and the model keeps the weights of
    whichever of the last two checks is closer to it (it used to keep the first check past it)."""
    from rlcourse.lm import greedy_accuracy, pretrain

    tok = build_tokenizer()
    prof = rlcourse.profile("smoke")
    model = build_model(tok, rlcourse.Profile(**{**prof.as_dict(), "lm_hidden": 64, "lm_intermediate": 128,
                                                 "lm_layers": 2}), seed=0)
    task = get_task("sort")
    target = 0.3
    result = pretrain(model, tok, task, max_steps=200, batch_size=64, lr=3e-3, target_accuracy=target,
                      eval_every=25, eval_prompts=64, progress=False, approach=target)
    steps = [h["step"] for h in result.history]
    assert steps[1:4] == [5, 10, 15]  # within `approach` of the target from the start: fine checks
    assert result.history[-1]["accuracy"] >= target, result.history
    closest = min(result.history[-2:], key=lambda h: abs(h["accuracy"] - target))
    assert (result.steps, result.accuracy) == (closest["step"], closest["accuracy"])
    assert greedy_accuracy(model, tok, task, task.examples(64, split="test")) == pytest.approx(result.accuracy)
    assert not model.training
    assert all(p.grad is None for p in model.parameters())  # no SFT gradient left for a later trainer


def test_rollout_batch_extras_survive_select_and_widen(tok, model):
    batch = sample(model, tok, ["sort 12:", "sort 4179:"], num_generations=2, max_new_tokens=3,
                   generator=torch.Generator().manual_seed(0))
    batch.extras["w"] = torch.arange(12.0).reshape(4, 3)
    batch.scores = torch.tensor([0.0, 1.0, 0.5, 0.25])
    sub = batch.select([3, 1])
    assert torch.equal(sub.extras["w"], batch.extras["w"][[3, 1]]) and torch.equal(sub.scores, torch.tensor([0.25, 1.0]))
    wide = batch.widen(5, tok.pad_token_id)
    for x in (wide.response_mask, wide.logprobs, wide.entropy, wide.extras["w"]):
        assert x.shape == (4, 5) and (x[:, 3:] == 0).all()
    assert (wide.response_ids[:, 3:] == tok.pad_token_id).all() and torch.equal(wide.extras["w"][:, :3], batch.extras["w"])
    with pytest.raises(ValueError, match="narrower"):
        batch.widen(2, tok.pad_token_id)
    with pytest.raises(ValueError, match="extras"):
        dataclasses.replace(batch, extras={"bad": torch.zeros(4, 7)})


def test_proposal_draws_from_its_own_distribution_and_records_log_q(tok, model):
    """A proposal uniform over each step's top-2 tokens: every drawn token is in the top 2 of the
    policy at its step, log q = -log 2 on every real token, and the log-probs stay the policy's."""
    def top2_uniform(logits):
        return torch.zeros_like(logits).scatter_(-1, logits.topk(2, -1).indices, 1.0)  # unnormalised
    prompts = ["1+2=", "sort 93715:"]
    b = sample(model, tok, prompts, num_generations=16, max_new_tokens=6, generator=torch.Generator().manual_seed(0),
               proposal=top2_uniform)
    m = b.response_mask
    q = b.extras["behaviour_logprob"]
    assert torch.allclose(q[m == 1], torch.full_like(q[m == 1], -torch.log(torch.tensor(2.0))))
    assert (q[m == 0] == 0).all()
    recomputed = response_logprobs(model, b.input_ids, b.attention_mask, b.response_len, 1.0)
    assert torch.allclose(recomputed * m, b.logprobs, atol=1e-5)
    # each drawn token is one of the two most likely under the policy at its position
    logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[:, b.prompt_ids.shape[1] - 1:-1]
    top2 = logits.topk(2, -1).indices
    assert ((top2 == b.response_ids[..., None]).any(-1) | (m == 0)).all()
    # both of the top 2 are drawn at the first step of a prompt (16 draws, chance of one missing 2^-15)
    assert len(set(b.response_ids[:16, 0].tolist())) == 2
    plain = sample(model, tok, prompts, num_generations=2, max_new_tokens=4)
    assert "behaviour_logprob" not in plain.extras
    with pytest.raises(ValueError, match="proposal must return"):
        sample(model, tok, prompts, max_new_tokens=2, proposal=lambda z: -torch.ones_like(z))
    with pytest.raises(ValueError, match="proposal must return"):
        sample(model, tok, prompts, max_new_tokens=2, proposal=lambda z: torch.ones(z.shape[0], 3))
    with pytest.raises(ValueError, match="not both"):
        sample(model, tok, prompts, max_new_tokens=2, top_k=2, proposal=top2_uniform)
    with pytest.raises(ValueError, match="temperature > 0"):
        sample(model, tok, prompts, max_new_tokens=2, temperature=0, proposal=top2_uniform)


@pytest.mark.parametrize("env", ["1", None])
def test_no_progress_bars_restores_the_state_it_found(env):
    """Loading a cached model switches the progress bars off and back to what they were; with
    ``HF_HUB_DISABLE_PROGRESS_BARS=1`` nothing is switched on, so the hub warns of nothing (the
    warning once appeared under every chapter cell that loaded a model). Run in a fresh interpreter:
    the hub reads the variable at import."""
    import os
    import subprocess
    import sys

    code = ("import warnings; warnings.simplefilter('error')\n"
            "from huggingface_hub import utils as hub\n"
            "from transformers.utils import logging as tf\n"
            "from rlcourse.lm.zoo import no_progress_bars\n"
            "before = (tf.is_progress_bar_enabled(), hub.are_progress_bars_disabled())\n"
            "with no_progress_bars():\n"
            "    inside = (tf.is_progress_bar_enabled(), hub.are_progress_bars_disabled())\n"
            "after = (tf.is_progress_bar_enabled(), hub.are_progress_bars_disabled())\n"
            "assert inside == (False, True), inside\n"
            "assert after == before, (before, after)\n"
            "print(before)\n")
    env_vars = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    if env is not None:
        env_vars["HF_HUB_DISABLE_PROGRESS_BARS"] = env
    out = subprocess.run([sys.executable, "-c", code], env=env_vars, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ("(False, True)" if env == "1" else "(True, False)"), out.stdout
