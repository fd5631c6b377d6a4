"""The checkpoint bank (rlcourse.bank): bounded snapshots, clear errors, exact resume, and the
bookkeeping of behaviour log-probs (writer's on prefix tokens, current policy's on continuations)."""
import copy

import pytest
import torch

import rlcourse
from rlcourse.bank import BANK_KEY, bank_mixed_batch, bank_of, bank_policy, choose_version, cut_points, \
    snapshot_weights, take_snapshot, _continue_prefixes, _encode_ok
from rlcourse.lm.model import response_logprobs
from rlcourse.lm.sampling import sample
from rlcourse.lm.zoo import load_base_model
from rlcourse.losses import compute_policy_loss
from rlcourse.profiles import one_torch_thread
from rlcourse.tasks import get_task
from rlcourse.train import RLConfig, Trainer


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def base():
    return load_base_model("addition", prof=rlcourse.profile("smoke"), progress=False)


@pytest.fixture(scope="module")
def pool():
    task = get_task("addition")
    return task.examples(40, seed=0, split="train"), task.examples(4, seed=0, split="test")


def digit_share(batch, examples, task, state):
    """A reward that varies within groups even for the untrained smoke model (so the policy moves)."""
    return torch.tensor([sum(c.isdigit() for c in t) / max(1, len(t)) for t in batch.texts])


def _perturbed(model, scale, seed):
    m = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return m


def test_bank_keeps_every_k_and_at_most_max(base):
    model, _ = base
    bank = bank_of({}, every=2, max_snapshots=3)
    stored = [v for v in range(12) if take_snapshot(bank, model, v)]
    assert stored == [0, 2, 4, 6, 8, 10]
    assert bank["versions"] == [6, 8, 10] and sorted(bank["weights"]) == [6, 8, 10]
    assert choose_version(bank, "oldest") == 6 and choose_version(bank, "latest") == 10
    g = torch.Generator().manual_seed(0)
    assert {choose_version(bank, "random", g) for _ in range(50)} == {6, 8, 10}
    # snapshots are copies: changing the model afterwards leaves them alone
    m = copy.deepcopy(model)
    take_snapshot(bank, m, 12)
    before = {k: v.clone() for k, v in snapshot_weights(bank, 12).items()}
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1.0)
    assert all(torch.equal(before[k], v) for k, v in snapshot_weights(bank, 12).items())


def test_bank_errors_name_what_it_holds(base):
    model, _ = base
    bank = bank_of({}, every=2, max_snapshots=2)
    with pytest.raises(ValueError, match="empty"):
        choose_version(bank, "oldest")
    for v in range(7):
        take_snapshot(bank, model, v)
    with pytest.raises(ValueError, match=r"holds versions \[4, 6\], not 0: it was dropped"):
        snapshot_weights(bank, 0)
    with pytest.raises(ValueError, match=r"holds versions \[4, 6\], not 8: it has not been stored yet"):
        snapshot_weights(bank, 8)
    with pytest.raises(ValueError, match="every 2"):
        snapshot_weights(bank, 5)
    state = {BANK_KEY: bank}
    with pytest.raises(ValueError, match="every=2, max_snapshots=2"):
        bank_of(state, every=3, max_snapshots=2)
    with pytest.raises(ValueError, match="which"):
        choose_version(bank, "middle")
    with pytest.raises(ValueError, match="every"):
        bank_of({}, every=0, max_snapshots=2)
    with pytest.raises(ValueError, match="max_snapshots"):
        bank_of({}, every=1, max_snapshots=0)


def test_bank_policy_carries_the_snapshot(base):
    model, tok = base
    bank = bank_of({}, every=1, max_snapshots=2)
    take_snapshot(bank, model, 0)
    moved = _perturbed(model, 0.05, 1)
    take_snapshot(bank, moved, 1)
    old = bank_policy(bank, 0, moved)
    for a, b in zip(old.parameters(), model.parameters()):
        assert torch.equal(a, b)
    assert not old.training


def test_cut_points_stay_in_range_and_eos_in_prefix():
    g = torch.Generator().manual_seed(0)
    L = torch.tensor([1, 2, 4, 8, 10] * 40)
    k = cut_points(L, (0.25, 0.5), g)
    assert ((k >= 1) & (k <= L)).all()
    assert (k[L == 1] == 1).all()  # a writer that answered EOS at once: the prefix is the whole row
    assert (k[L == 8] >= 2).all() and (k[L == 8] <= 4).all()
    assert torch.equal(cut_points(L, (1.0, 1.0), g), L)  # sequence-level mixing
    for bad in [(0.0, 0.5), (0.6, 0.5), (0.5, 1.2)]:
        with pytest.raises(ValueError, match="prefix_frac"):
            cut_points(L, bad, g)


def test_continuation_keeps_prefix_and_leaves_finished_rows(base):
    model, tok = base
    cfg = RLConfig(num_generations=4, max_completion_length=8)
    written = sample(model, tok, ["12+34=", "5+7="], num_generations=4, max_new_tokens=8,
                     generator=torch.Generator().manual_seed(0))
    L = written.lengths
    cuts = torch.ones_like(L)
    cuts[0] = L[0]  # EOS (or the budget) inside the prefix: the writer finished row 0 itself
    out = _continue_prefixes(model, tok, written, cuts, cfg, torch.Generator().manual_seed(1))
    assert torch.equal(out.response_ids[0], written.response_ids[0])
    assert torch.equal(out.response_mask[0], written.response_mask[0])
    assert torch.equal(out.extras["from_bank"][0], written.response_mask[0])
    assert torch.equal(out.logprobs[0], written.logprobs[0])
    for r in range(1, len(L)):
        assert out.response_ids[r, 0] == written.response_ids[r, 0]
        assert out.extras["from_bank"][r].tolist() == [1.0] + [0.0] * (out.response_len - 1)
        assert out.logprobs[r, 0] == written.logprobs[r, 0]
    # the mask still runs up to and including the first EOS
    eos = (out.response_ids == tok.eos_token_id).long()
    assert torch.equal(out.response_mask, ((eos.cumsum(1) - eos) == 0).float())


def test_a_tokenizer_that_does_not_reencode_is_refused():
    class Bad:
        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [[0] for _ in texts]}
    with pytest.raises(ValueError, match="re-encodes decoded text"):
        _encode_ok(Bad(), ["1+1=2"], [[1, 2, 1, 3]], [[2]])


def test_batch_layout_and_bad_input(base):
    model, tok = base
    cfg = RLConfig(num_generations=4, max_completion_length=8)
    prompts = ["12+34=", "5+7=", "40+2="]
    b = bank_mixed_batch(model, tok, prompts, cfg, torch.Generator().manual_seed(0), {}, 1, every=1,
                         seeded=3, prefix_frac=(0.25, 0.5))
    assert len(b) == 12 and b.index.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert b.prompts == [p for p in prompts for _ in range(4)]
    fb = b.extras["from_bank"]
    assert (fb[0::4] == 0).all() and (fb.reshape(3, 4, -1)[:, 1:].sum(-1) >= 1).all()
    assert ((fb == 1) <= (b.response_mask == 1)).all() and set(b.extras) == {"from_bank", "bank_version"}
    with pytest.raises(ValueError, match="seeded"):
        bank_mixed_batch(model, tok, prompts, cfg, None, {}, 1, seeded=5)
    with pytest.raises(ValueError, match="step"):
        bank_mixed_batch(model, tok, prompts, cfg, None, {}, 0)


def test_ratios_at_the_first_update(base):
    """Continuation tokens: ratio 1 at the first update (the current policy sampled them). Prefix tokens:
    the recorded behaviour log-prob is the writer's, recomputed directly with the writer's weights."""
    model, tok = base
    cfg = RLConfig(num_generations=4, max_completion_length=8)
    state = {}
    bank = bank_of(state, every=1, max_snapshots=2)
    take_snapshot(bank, model, 0)
    current = _perturbed(model, 0.03, 2)  # the policy has moved since version 0 was stored
    prompts = ["12+34=", "5+7=", "40+2=", "99+1="]
    b = bank_mixed_batch(current, tok, prompts, cfg, torch.Generator().manual_seed(3), state, 2, every=1,
                         max_snapshots=2, which="oldest")
    assert b.metrics["bank_writer_version"] == 0 and b.metrics["bank_lag"] == 1 and bank["versions"] == [0, 1]
    assert 0 < b.metrics["bank_token_share"] < 1 and "log" not in bank  # per-step facts go to batch.metrics
    mask, fb = b.response_mask.bool(), b.extras["from_bank"].bool()
    cur = response_logprobs(current, b.input_ids, b.attention_mask, b.response_len, b.temperature)
    hist = response_logprobs(bank_policy(bank, 0, current), b.input_ids, b.attention_mask, b.response_len,
                             b.temperature)
    log_ratio = cur - b.logprobs
    assert log_ratio[mask & ~fb].abs().max() < 1e-5  # ratio 1
    assert (b.logprobs - hist)[fb].abs().max() < 1e-5  # the recorded behaviour log-prob is the writer's
    assert (log_ratio - (cur - hist))[fb].abs().max() < 1e-5  # so the ratio is pi_theta / pi_hist
    assert (cur - hist)[fb].abs().max() > 1e-3  # the check is not vacuous: the two policies differ there
    assert (b.extras["bank_version"][fb] == 0).all()


def test_trainer_first_pass_ratio_is_one_off_the_bank(base, pool):
    """Through the trainer's own update path (extras reach a loss that names them)."""
    model, tok = base
    seen = []

    def capture(old_log_prob, log_prob, advantages, response_mask, from_bank, **agg):
        seen.append((torch.exp(log_prob.detach() - old_log_prob), from_bank, response_mask))
        return compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, **agg)

    cfg = RLConfig(num_generations=4, prompts_per_step=3, max_completion_length=8, steps=4, learning_rate=1e-3,
                   progress=False, sampler="soup_prefix", policy_loss=capture, reward=digit_share,
                   sampler_kwargs={"every": 2, "max_snapshots": 2})
    tr = Trainer(copy.deepcopy(model), tok, "addition", cfg, train_examples=pool[0], eval_examples=pool[1])
    tr.train()
    assert len(seen) == 4
    ratio, fb, m = seen[-1]
    on = (m == 1) & (fb == 0)
    assert on.any() and (ratio[on] - 1).abs().max() < 1e-5
    assert (ratio[(fb == 1)] - 1).abs().max() > 1e-4  # the writer (version 0 or 2) lags behind version 3


@pytest.mark.parametrize("sampler", ["soup_prefix", "bank_sequence_mix"])
def test_resume_is_exact(base, pool, tmp_path, sampler):
    model, tok = base
    kw = dict(num_generations=4, prompts_per_step=3, max_completion_length=8, steps=5, learning_rate=1e-3,
              progress=False, sampler=sampler, sampler_kwargs={"every": 2, "max_snapshots": 2}, seed=4,
              reward=digit_share)
    whole = Trainer(copy.deepcopy(model), tok, "addition", RLConfig(**kw), train_examples=pool[0],
                    eval_examples=pool[1])
    whole.train()
    first = Trainer(copy.deepcopy(model), tok, "addition", RLConfig(**kw, output_dir=str(tmp_path), save_every=3),
                    train_examples=pool[0], eval_examples=pool[1])
    first.train(steps=3)
    again = Trainer(copy.deepcopy(model), tok, "addition", RLConfig(**kw, output_dir=str(tmp_path), save_every=3),
                    train_examples=pool[0], eval_examples=pool[1], resume=True)
    assert again.step_count == 3 and again.state[BANK_KEY]["versions"] == [0, 2]
    again.train()
    for a, b in zip(whole.model.parameters(), again.model.parameters()):
        assert torch.equal(a, b)
    wb, ab = whole.state[BANK_KEY], again.state[BANK_KEY]
    assert wb["versions"] == ab["versions"] == [2, 4]
    for v in wb["versions"]:
        for key, w in wb["weights"][v].items():
            assert torch.equal(w, ab["weights"][v][key])
    # the history (saved with the checkpoint) holds the bank's per-step metrics, alike in both runs
    keys = ("bank_writer_version", "bank_lag", "bank_token_share", "bank_prefix_log_ratio")
    assert [[m[k] for k in keys] for m in whole.history] == [[m[k] for k in keys] for m in again.history]
    assert [m["bank_writer_version"] for m in whole.history] == [0, 0, 0, 0, 2]
