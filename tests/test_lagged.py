"""The ``"lagged"`` sampler (rlcourse.lagged): lag 0 is the base sampler, lag L samples with the
policy of L steps ago (checked against copies of the weights the test keeps itself), a resumed run
samples what the uninterrupted one did, LoRA snapshots hold the adapter alone, and bad settings are
refused by name."""
import copy

import pytest
import torch

import rlcourse
from rlcourse.lagged import STATE_KEY, behaviour_policy, lagged_sampler, trainable_weights
from rlcourse.lm.model import response_logprobs
from rlcourse.lm.zoo import load_base_model
from rlcourse.profiles import one_torch_thread
from rlcourse.rollout import get_sampler
from rlcourse.tasks import get_task
from rlcourse.train import RLConfig, Trainer, call_with_supported


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def lab():
    """The smoke profile's tiny adder, its tokenizer and a small (train, held-out) pool of additions."""
    model, tok = load_base_model("addition", prof=rlcourse.profile("smoke"), progress=False)
    task = get_task("addition")
    return model, tok, (task.examples(40, seed=0, split="train"), task.examples(4, seed=0, split="test"))


def response_length(batch, examples, task, state):
    """A reward that differs within a group even for the untrained smoke model, so the policy moves."""
    return batch.lengths.float() / batch.response_ids.shape[1]


class Recorder:
    """A sampler that calls ``inner`` and keeps, per call, the batch, a copy of the current weights
    and the generator's state before sampling (so the test can redraw the batch itself)."""

    def __init__(self, inner):
        self.inner, self.batches, self.weights, self.rng = inner, [], [], []

    def __call__(self, **loop):
        self.weights.append({k: v.detach().clone() for k, v in loop["model"].state_dict().items()})
        self.rng.append(loop["generator"].get_state())
        batch = call_with_supported(self.inner, **loop)
        self.batches.append(batch)
        return batch


def config(**kw):
    defaults = dict(num_generations=4, prompts_per_step=3, max_completion_length=8, steps=5, learning_rate=3e-3,
                progress=False, reward=response_length, seed=2)
    return RLConfig(**{**defaults, **kw})


def run(model, tok, pool, steps=5, **kw):
    rec = Recorder(get_sampler(kw.pop("sampler", "lagged")))
    tr = Trainer(copy.deepcopy(model), tok, "addition", config(sampler=rec, steps=steps, **kw),
                 train_examples=pool[0], eval_examples=pool[1])
    tr.train()
    return tr, rec


def same_batch(a, b) -> bool:
    fields = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logprobs", "index", "truncated")
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in fields) and a.texts == b.texts


def test_lag_zero_is_the_base_sampler(lab):
    model, tok, pool = lab
    plain, rec_plain = run(model, tok, pool, sampler="policy")
    lag0, rec_lag0 = run(model, tok, pool, sampler="lagged", sampler_kwargs={"lag": 0})
    assert all(same_batch(a, b) for a, b in zip(rec_plain.batches, rec_lag0.batches))
    assert all(a.entropy is not None and torch.equal(a.entropy, b.entropy)
               for a, b in zip(rec_plain.batches, rec_lag0.batches))
    for a, b in zip(plain.model.parameters(), lag0.model.parameters()):
        assert torch.equal(a, b)
    assert STATE_KEY not in lag0.state  # nothing kept at lag 0


@pytest.mark.parametrize("lag", [1, 2])
def test_lag_samples_with_the_policy_of_lag_steps_ago(lab, lag):
    model, tok, pool = lab
    tr, rec = run(model, tok, pool, steps=5, sampler_kwargs={"lag": lag})
    policy = get_sampler("policy")
    scratch = copy.deepcopy(model).eval()
    for k, batch in enumerate(rec.batches, start=1):
        old = max(1, k - lag)  # the call whose weights sample at step k
        assert tr.history[k - 1]["behaviour_lag"] == k - old
        assert batch.entropy is None
        # the same draw, made by the test itself from the weights it kept at call `old`
        scratch.load_state_dict(rec.weights[old - 1])
        g = torch.Generator().manual_seed(0)
        g.set_state(rec.rng[k - 1])
        redrawn = policy(scratch, tok, batch.prompts[::4], tr.config, g, {})
        assert same_batch(batch, redrawn)
        # ... and the log-probs are those of the old policy, not of the current one
        mask = batch.response_mask.bool()
        scratch.load_state_dict(rec.weights[k - 1])
        current = response_logprobs(scratch, batch.input_ids, batch.attention_mask, batch.response_len)
        gap = (current - batch.logprobs)[mask].abs().max()
        if k > 1:
            assert gap > 1e-3, (k, float(gap))  # the policy moved in k - old steps: the ratio is not 1
        else:
            assert gap < 1e-4


def test_the_loss_sees_the_staleness(lab):
    """Through the trainer's update: the first (only) pass's ratio is pi_theta / mu, not 1, and its
    log is what the test computes from the weights it kept."""
    model, tok, pool = lab
    seen = []

    def capture(old_log_prob, log_prob, advantages, response_mask, **agg):
        from rlcourse.methods.gipo import compute_gipo_loss
        seen.append((log_prob.detach() - old_log_prob, response_mask))
        return compute_gipo_loss(old_log_prob, log_prob, advantages, response_mask, **agg)

    _, rec = run(model, tok, pool, steps=4, policy_loss=capture, sampler_kwargs={"lag": 2},
                 skip_zero_advantage_rows=False)
    log_ratio, mask = seen[-1]
    assert log_ratio[mask == 1].abs().max() > 1e-3
    log_ratio0, mask0 = seen[0]
    assert log_ratio0[mask0 == 1].abs().max() < 1e-4  # step 1: the behaviour policy is the current one


def test_resume_samples_what_the_uninterrupted_run_did(lab, tmp_path):
    model, tok, pool = lab
    kw = dict(sampler_kwargs={"lag": 2})
    whole, rec_whole = run(model, tok, pool, steps=6, **kw)
    run(model, tok, pool, steps=3, output_dir=str(tmp_path), save_every=3, **kw)
    rec = Recorder(get_sampler("lagged"))
    again = Trainer(copy.deepcopy(model), tok, "addition",
                    config(sampler=rec, steps=6, output_dir=str(tmp_path), save_every=3, **kw),
                    train_examples=pool[0], eval_examples=pool[1], resume=True)
    assert again.step_count == 3 and again.state[STATE_KEY]["steps"] == [1, 2, 3]
    again.train()
    assert len(rec.batches) == 3
    assert all(same_batch(a, b) for a, b in zip(rec_whole.batches[3:], rec.batches))
    for a, b in zip(whole.model.parameters(), again.model.parameters()):
        assert torch.equal(a, b)
    # the control: without the saved snapshots, step 4 samples with another policy
    rec_bare = Recorder(get_sampler("lagged"))
    bare = Trainer(copy.deepcopy(model), tok, "addition", config(sampler=rec_bare, steps=6, output_dir=str(tmp_path),
                                                                 **kw),
                   train_examples=pool[0], eval_examples=pool[1], resume=True)
    assert bare.step_count == 6
    bare.load_checkpoint(sorted(tmp_path.glob("checkpoint-*"))[0])  # the one of step 3
    assert bare.step_count == 3
    del bare.state[STATE_KEY]
    bare.step()
    assert not torch.equal(rec_bare.batches[0].logprobs, rec_whole.batches[3].logprobs)


def test_lora_snapshots_hold_the_adapter_alone(lab):
    pytest.importorskip("peft")
    from rlcourse.capstone.models import add_lora

    model, tok, pool = lab
    lora = add_lora(copy.deepcopy(model), r=2, alpha=4, target_modules=("q_proj", "v_proj"))
    tr, rec = run(lora, tok, pool, steps=3, learning_rate=3e-2, sampler_kwargs={"lag": 1})
    kept = tr.state[STATE_KEY]["weights"]
    assert len(kept) == 2 and kept[0] and all("lora_" in name for name in kept[0])
    n_all = sum(p.numel() for p in tr.model.parameters())
    assert sum(w.numel() for w in kept[0].values()) < n_all / 10
    # the behaviour policy of step 3 is the adapter of call 2 on the shared frozen base
    old = behaviour_policy(tr.model, kept[0])
    b = rec.batches[-1]
    ref = copy.deepcopy(tr.model).eval()
    ref.load_state_dict(rec.weights[1])
    want = response_logprobs(ref, b.input_ids, b.attention_mask, b.response_len)
    got = response_logprobs(old, b.input_ids, b.attention_mask, b.response_len)
    mask = b.response_mask.bool()
    assert (want - got)[mask].abs().max() < 1e-5
    assert (want - b.logprobs)[mask].abs().max() < 1e-4
    cur = response_logprobs(tr.model.eval(), b.input_ids, b.attention_mask, b.response_len)
    assert (cur - b.logprobs)[mask].abs().max() > 1e-4  # the adapter moved since


def test_trainable_weights_are_the_parameters_that_train(lab):
    model = copy.deepcopy(lab[0])
    assert set(trainable_weights(model)) == {n for n, _ in model.named_parameters()}
    model.get_input_embeddings().requires_grad_(False)
    assert all(p.requires_grad for p in trainable_weights(model).values())
    with pytest.raises(ValueError, match="does not have"):
        behaviour_policy(model, {"no.such.weight": torch.zeros(1)})


@pytest.mark.parametrize("lag", [-1, 1.5, True, "2"])
def test_bad_lag_is_refused(lab, lag):
    model, tok, pool = lab
    tr = Trainer(copy.deepcopy(model), tok, "addition", config(sampler="lagged", sampler_kwargs={"lag": lag}),
                 train_examples=pool[0], eval_examples=pool[1])
    with pytest.raises(ValueError, match="lag must be an integer >= 0"):
        tr.step()


@pytest.mark.parametrize("kw, match", [
    (dict(old_logprobs="training"), "old_logprobs='sampler'"),
    (dict(sampler_kwargs={"base": "lagged"}), "cannot be 'lagged' itself"),
    (dict(sampler_kwargs={"base_kwargs": {"lagg": 1}}), r"base_kwargs \['lagg'\]"),
])
def test_bad_settings_are_refused_by_name(lab, kw, match):
    model, tok, pool = lab
    tr = Trainer(copy.deepcopy(model), tok, "addition", config(sampler="lagged", **kw),
                 train_examples=pool[0], eval_examples=pool[1])
    with pytest.raises(ValueError, match=match):
        tr.step()


def test_a_state_built_for_another_lag_is_refused(lab):
    model, tok, pool = lab
    tr = Trainer(copy.deepcopy(model), tok, "addition", config(sampler="lagged", sampler_kwargs={"lag": 2}),
                 train_examples=pool[0], eval_examples=pool[1])
    tr.step()
    tr.config.sampler_kwargs["lag"] = 3
    with pytest.raises(ValueError, match="snapshots for lag 2, not 3"):
        tr.step()


def test_wraps_a_configured_base(lab):
    """The base is any registered sampler with its own keywords (here the per-prompt sampler)."""
    model, tok, pool = lab
    tr, rec = run(model, tok, pool, steps=3, sampler_kwargs={"lag": 1, "base": "policy_per_prompt"})
    assert [h["behaviour_lag"] for h in tr.history] == [0, 1, 1]
    assert lagged_sampler.__name__ == "lagged_sampler" and get_sampler("lagged") is lagged_sampler
