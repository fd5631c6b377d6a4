"""rlcourse.replay: the formulas of Freshness-Aware PER, the sum-tree, the buffer, the registered
``"replay"`` sampler (in the Trainer, with an exact resume) and the ``"ppo_is"`` loss."""
import copy
import math

import numpy as np
import pytest
import torch
from scipy import stats

import rlcourse
from rlcourse.losses import compute_policy_loss
from rlcourse.profiles import one_torch_thread
from rlcourse.replay import (ReplayBuffer, SumTree, age_decay, compute_ppo_is_loss, group_priority, half_life,
                             importance_weights, kish_ess, sampling_probabilities, staleness_fraction)


# ---------------------------------------------------------------------- formulas
def test_half_life_of_priority_and_of_sampling_weight():
    for tau in (1.0, 50.0, 500.0):
        p_base = 0.37
        assert p_base * age_decay(half_life(tau), tau) == pytest.approx(p_base / 2, rel=1e-12)
        # the exponent applies after the decay: the sampling weight (p e^{-a/tau})^alpha halves at tau ln2 / alpha
        alpha = 0.6
        a = half_life(tau, alpha)
        assert a == pytest.approx(tau * math.log(2) / alpha)
        assert (p_base * age_decay(a, tau)) ** alpha == pytest.approx(p_base ** alpha / 2, rel=1e-12)
    assert (age_decay([0, 10, 1000], None) == 1).all()
    with pytest.raises(ValueError, match="tau"):
        age_decay([1.0], 0.0)
    with pytest.raises(ValueError, match="ages"):
        age_decay([-1.0], 5.0)


@pytest.mark.parametrize("sigma2", [0.1, 0.5, 1.0])
def test_lognormal_ess_is_exp_minus_sigma2(sigma2):
    """log w ~ N(-sigma^2/2, sigma^2): ESS/N -> 1/E[w^2] = e^{-sigma^2}. The tolerance is four standard
    errors of the estimate, from the delta method: the relative error of mean(w^2) dominates, with
    variance (E w^4 - (E w^2)^2) / N = (e^{6 s} - e^{2 s}) / N."""
    N = 1_000_000
    w = np.exp(np.random.default_rng(0).normal(-sigma2 / 2, math.sqrt(sigma2), N))
    ratio = kish_ess(w) / N
    rel_se = math.sqrt((math.exp(6 * sigma2) - math.exp(2 * sigma2)) / N) / math.exp(sigma2)
    assert abs(ratio / math.exp(-sigma2) - 1) < 4 * rel_se + 1e-3, (ratio, math.exp(-sigma2), rel_se)


def test_kish_ess_of_age_weights_matches_the_closed_form():
    ages = np.arange(500)
    for tau in (50, 100, 500, 1000):
        q = math.exp(-1 / tau)
        exact = (1 - q**500) ** 2 / (1 - q) ** 2 / ((1 - q**1000) / (1 - q**2))  # geometric sums
        assert kish_ess(np.exp(-ages / tau)) == pytest.approx(exact, rel=1e-9)
    with pytest.raises(ValueError):
        kish_ess([0.0, 0.0])


def test_importance_weights_lie_in_0_1_and_are_1_for_the_least_likely():
    rng = np.random.default_rng(1)
    for _ in range(20):
        probs = sampling_probabilities(rng.uniform(0.01, 3, 50), 0.6)
        for beta in (0.0, 0.4, 1.0):
            w = importance_weights(probs, beta)
            assert ((w > 0) & (w <= 1)).all()
            assert w[probs.argmin()] == 1.0
            N = len(probs)
            ref = (N * probs) ** -beta
            assert np.allclose(w, ref / ref.max())
    with pytest.raises(ValueError, match="beta"):
        importance_weights(probs, 1.5)


def test_sampling_probabilities_refuses_bad_priorities():
    with pytest.raises(ValueError, match="positive"):
        sampling_probabilities([1.0, 0.0], 0.6)
    p = sampling_probabilities([1.0, 4.0], 0.5)
    assert p == pytest.approx([1 / 3, 2 / 3])


# ---------------------------------------------------------------------- the sum-tree
@pytest.mark.parametrize("stratified", [False, True])
def test_sum_tree_draws_match_p_alpha(stratified):
    """Chi-square test of 100,000 draws against p^alpha / sum p^alpha (capacity not a power of two,
    so padding leaves are exercised). Stratification makes the counts less variable than
    multinomial ones, so the test is conservative there."""
    rng = np.random.default_rng(2)
    p = rng.uniform(0.05, 2.0, 37)
    alpha = 0.6
    tree = SumTree(37)
    tree.set_all(p ** alpha)
    assert tree.total == pytest.approx((p ** alpha).sum())
    n = 100_000
    counts = np.zeros(37)
    for _ in range(n // 1000):
        np.add.at(counts, tree.sample(rng.uniform(0, 1, 1000), stratified=stratified), 1)
    expected = n * sampling_probabilities(p, alpha)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert stats.chi2.sf(chi2, df=36) > 1e-3, chi2


def test_sum_tree_updates_agree_with_rebuild_and_find_never_returns_empty_leaves():
    rng = np.random.default_rng(3)
    a, b = SumTree(10), SumTree(10)
    v = rng.uniform(0, 1, 10)
    v[[2, 7]] = 0.0
    for i, x in enumerate(v):
        a.update(i, x)
    b.set_all(v)
    assert np.allclose(a.nodes, b.nodes)
    draws = a.sample(rng.uniform(0, 1, 5000))
    assert not np.isin(draws, [2, 7]).any()
    assert a.find(a.total) == 9 and a.find(0.0) == 0  # the ends of the mass
    with pytest.raises(ValueError, match="uniforms"):
        a.sample([1.0])
    with pytest.raises(ValueError, match="empty"):
        SumTree(3).find(0.1)


# ---------------------------------------------------------------------- staleness of a stream
def _stream_ages(tau, steps, capacity, T, draws=4000, alpha=0.6, seed=0):
    """One item per step (fixed random base priorities) into a FIFO buffer; at steps 2C and 4C
    (buffer full) draw ``draws`` items and return the share older than T."""
    rng = np.random.default_rng(seed)
    buf = ReplayBuffer(capacity, alpha, tau)
    out = {}
    for step in range(1, steps + 1):
        buf.refresh(step)
        if step in (2 * capacity, 4 * capacity):
            # requests of at most the buffer's size (a larger one is refused), repeated
            slots = np.concatenate([buf.sample(capacity, rng.uniform(0, 1, capacity))[0]
                                    for _ in range(draws // capacity)])
            out[step] = staleness_fraction(step - buf.stored_at[slots], T)
        buf.add(None, float(rng.uniform(0.5, 1.5)), step)
    return out


def test_staleness_is_constant_without_decay_and_falls_like_exp_with_decay():
    C, T, n = 400, 100, 4000
    se = lambda p: math.sqrt(p * (1 - p) / n)  # noqa: E731
    fixed = _stream_ages(None, 4 * C, C, T, n)
    # without decay, a full FIFO buffer's ages are uniform on 1..C: share (C - T) / C at every time
    for share in fixed.values():
        # + a margin for the random priorities: given them, the share is sum_old p^alpha / sum p^alpha, whose
        # standard deviation over draws of U(0.5, 1.5)^0.6 (coefficient of variation 0.18) is about
        # 0.18 sqrt(0.75 * 0.25 / 400) = 0.004, so 0.02 is five of those
        assert abs(share - (C - T) / C) < 4 * se((C - T) / C) + 0.02
    assert abs(fixed[2 * C] - fixed[4 * C]) < 6 * se(0.75) + 0.02
    tau, alpha = 40.0, 0.6
    decayed = _stream_ages(tau, 4 * C, C, T, n, alpha)
    q = math.exp(-alpha / tau)
    exact = q ** T * (1 - q ** (C - T)) / (1 - q ** C)  # ages 1..C weighted by q^age
    for share in decayed.values():
        assert abs(share - exact) < 4 * se(exact) + 0.01
        assert share == pytest.approx(math.exp(-alpha * T / tau), abs=0.02)
    assert max(decayed.values()) < 0.5 * min(fixed.values())


def test_buffer_fifo_and_request_larger_than_buffer():
    buf = ReplayBuffer(3, 0.6, 10.0)
    for s in range(1, 6):
        buf.add(s, 1.0, s)
    assert len(buf) == 3 and sorted(buf.items) == [3, 4, 5]
    buf.refresh(6)
    assert np.allclose(buf.priorities(6), np.exp(-(6 - buf.stored_at) / 10.0))
    with pytest.raises(ValueError, match="requested but the buffer holds 3"):
        buf.sample(4, np.zeros(4))
    with pytest.raises(ValueError, match="before"):
        buf.refresh(2)
    with pytest.raises(ValueError, match="priorities"):
        buf.add(0, 0.0, 6)


def test_group_priority_rules():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert group_priority(r, "reward") == pytest.approx(0.5 + 1e-6)
    assert group_priority(r, "advantage") == pytest.approx(0.5 + 1e-6)
    assert group_priority(torch.ones(4), "advantage") == pytest.approx(1e-6)
    assert group_priority(r, "uniform") == 1.0
    with pytest.raises(ValueError, match="unknown priority"):
        group_priority(r, "td")


# ---------------------------------------------------------------------- the loss
def test_ppo_is_loss_is_the_weighted_vanilla_loss():
    torch.manual_seed(0)
    B, T = 6, 5
    old = torch.randn(B, T) * 0.3 - 1
    logp = (old + 0.4 * torch.randn(B, T)).requires_grad_(True)
    adv = torch.randn(B, 1).expand(B, T)
    mask = (torch.rand(B, T) > 0.2).float()
    w = torch.rand(B, 1).expand(B, T).contiguous()
    loss, m = compute_ppo_is_loss(old, logp, adv, mask, is_weight=w, clip_ratio_c=3.0)
    ref, m_ref = compute_policy_loss(old, logp, adv * w, mask, clip_ratio_c=3.0)
    assert torch.allclose(loss, ref)
    # per token: the weighted loss is w times the vanilla per-token loss (checked through the gradient)
    g, = torch.autograd.grad(loss, logp)
    parts = [torch.autograd.grad(compute_policy_loss(old, logp, adv, mask * (torch.arange(B)[:, None] == i),
                                                     clip_ratio_c=3.0, global_tokens=float(mask.sum()))[0], logp)[0]
             for i in range(B)]
    assert torch.allclose(g, sum(w[i, 0] * parts[i] for i in range(B)), atol=1e-6)
    same, _ = compute_ppo_is_loss(old, logp, adv, mask)
    assert torch.allclose(same, compute_policy_loss(old, logp, adv, mask)[0])
    with pytest.raises(ValueError, match="is_weight has shape"):
        compute_ppo_is_loss(old, logp, adv, mask, is_weight=torch.ones(B))
    with pytest.raises(ValueError, match=">= 0"):
        compute_ppo_is_loss(old, logp, adv, mask, is_weight=-w)


# ---------------------------------------------------------------------- the sampler in the Trainer
@pytest.fixture(scope="module")
def base():
    """The smoke addition model; its rewards are mostly 0, so the Trainer runs below score rows by
    their share of digits (varies within a group), for the updates to have something to do."""
    from rlcourse.lm.zoo import load_base_model

    return load_base_model("addition", prof=rlcourse.profile("smoke"), progress=False)


def _digit_share(batch, examples, task, state):
    return torch.tensor([sum(c.isdigit() for c in t) / max(1, len(t)) for t in batch.texts])


def _trainer(base, tmp_path=None, resume=False, **kw):
    from rlcourse.rewards import register_reward
    from rlcourse.tasks import get_task

    register_reward("test_replay_digits", overwrite=True)(_digit_share)
    from rlcourse.train import RLConfig, Trainer

    model, tok = base
    task = get_task("addition")
    sk = dict(replay_groups=2, capacity=6, tau=5.0, priority="uniform")
    sk.update(kw)
    cfg = RLConfig(num_generations=4, prompts_per_step=2, max_completion_length=6, steps=4, progress=False,
                   learning_rate=1e-3, seed=0, sampler="replay", reward="test_replay_digits", policy_loss="ppo_is", sampler_kwargs=sk,
                   output_dir=str(tmp_path) if tmp_path else None, save_every=2 if tmp_path else 0)
    return Trainer(copy.deepcopy(model), tok, task, cfg, train_examples=task.examples(20, seed=0, split="train"),
                   eval_examples=task.examples(4, seed=0, split="test"), resume=resume)


def test_replay_sampler_in_the_trainer(base):
    from rlcourse.rollout import get_sampler

    with one_torch_thread():
        tr = _trainer(base)
        m1 = tr.step()  # the buffer is empty: fresh rows only (the documented rule)
        buf = tr.state["replay_buffer"]
        assert len(buf) == 2 and m1["response_tokens"] > 0
        tr.step()  # holds 2 groups now: 2 replayed groups of 4 rows follow the 8 fresh rows
        assert len(buf) == 4
        # call the sampler directly, as the loop does, to look at its batch
        examples = tr.train_pool[:2]
        ex = list(examples)
        batch = get_sampler("replay")(tr.model, tr.tokenizer, [e.prompt for e in ex], tr.config, tr.generator,
                                      tr.state, ex, tr.train_pool, tr.task, tr.reward_fn, 3,
                                      **tr.config.sampler_kwargs)
    # the loop's list is left alone; every row names its example, a replayed group's the one it was sampled for
    assert len(batch) == 16 and len(ex) == 2 and len(batch.examples) == 16
    assert batch.examples[:8] == [ex[0]] * 4 + [ex[1]] * 4
    assert all(e.prompt == p for e, p in zip(batch.examples, batch.prompts))
    w, age = batch.extras["is_weight"], batch.extras["age"]
    assert (w[:8] == 1).all() and (age[:8] == 0).all() and (age[8:] >= 1).all()
    # groups: two fresh (ids 0, 1), then two replayed groups apart from them and from each other
    assert batch.index.tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    # replayed rows carry the behaviour log-probs and rewards stored with them (the buffer's groups,
    # right-padded to the batch's width)
    stored = [it[0].widen(batch.response_len, tr.tokenizer.pad_token_id) for it in buf.items if it is not None]
    for g in (2, 3):
        rows = batch.select((batch.index == g).nonzero().squeeze(-1))
        assert any(torch.equal(rows.response_ids, s.response_ids) and torch.equal(rows.logprobs, s.logprobs)
                   and torch.equal(rows.scores, s.scores) for s in stored)


def test_replay_sampler_anneals_beta(base):
    """With beta_final the weights' exponent runs from beta at step 1 to beta_final at config.steps:
    at the last step, the replayed rows' weights are (P_min / P(i))^beta_final."""
    with one_torch_thread():
        tr = _trainer(base, priority="reward", beta=0.4, beta_final=1.0)
        tr.train(3)
        from rlcourse.rollout import get_sampler

        ex = list(tr.train_pool[:2])
        buf_before = copy.deepcopy(tr.state["replay_buffer"])
        batch = get_sampler("replay")(tr.model, tr.tokenizer, [e.prompt for e in ex], tr.config, tr.generator,
                                      tr.state, ex, tr.train_pool, tr.task, tr.reward_fn, 4, **tr.config.sampler_kwargs)
    buf_before.refresh(4)
    p = buf_before.probabilities()
    w = batch.extras["is_weight"][8:, 0].numpy()
    allowed = (p[buf_before.valid].min() / p[buf_before.valid]) ** 1.0  # beta = beta_final at the last step
    assert len(w) == 8 and all(np.isclose(allowed, x).any() for x in w), (w, allowed)
    assert not np.allclose(allowed, allowed ** 0.4)  # the two exponents give different weights here


def test_replay_sampler_refuses_bad_requests(base):
    from rlcourse.train import RLConfig

    with one_torch_thread():
        with pytest.raises(ValueError, match="replay_groups must lie"):
            _trainer(base, replay_groups=7).step()
        tr = _trainer(base)
        tr.step()
        tr.config = RLConfig(**{**tr.config.__dict__, "sampler_kwargs": {**tr.config.sampler_kwargs, "tau": 9.0}})
        with pytest.raises(ValueError, match="built with"):
            tr.step()


def test_replay_sampler_resume_is_exact(base, tmp_path):
    with one_torch_thread():
        straight = _trainer(base, tmp_path / "a")
        straight.train()
        first = _trainer(base, tmp_path / "b")
        first.train(2)
        resumed = _trainer(base, tmp_path / "b", resume=True)
        assert resumed.step_count == 2
        resumed.train()
    keys = ("reward", "loss", "pg_clipfrac", "ppo_kl", "response_tokens")
    assert all(h["frac_rows_trained"] > 0 and h["loss"] != 0 for h in straight.history)  # not vacuous
    assert [[h.get(k) for k in keys] for h in straight.history] == [[h.get(k) for k in keys] for h in resumed.history]
    a, b = straight.state["replay_buffer"], resumed.state["replay_buffer"]
    assert np.array_equal(a.tree.nodes, b.tree.nodes) and np.array_equal(a.stored_at, b.stored_at)
    for x, y in zip(a.items, b.items):
        assert torch.equal(x[0].response_ids, y[0].response_ids) and torch.equal(x[0].logprobs, y[0].logprobs)


def test_replay_sampler_refuses_a_loss_that_would_drop_the_per_weights(base):
    """PER weights reach the update only through a loss that names ``is_weight``: with another loss
    the sampler refuses (naming the fix) whenever the weights can differ from 1, and runs when they
    cannot (``beta=0``, or uniform priorities) or when the loss takes them."""
    from rlcourse.train import RLConfig

    with one_torch_thread():
        for loss in ("vanilla", "gipo", "sorl"):
            tr = _trainer(base, priority="reward", beta=0.4)
            tr.config = RLConfig(**{**tr.config.__dict__, "policy_loss": loss})
            with pytest.raises(ValueError, match=rf"policy_loss={loss!r} does not: use policy_loss='ppo_is'"):
                tr.step()
        tr = _trainer(base, priority="reward", beta=0.0, beta_final=0.5)
        tr.config = RLConfig(**{**tr.config.__dict__, "policy_loss": "vanilla"})
        with pytest.raises(ValueError, match="beta_final=0.5"):
            tr.step()
        for kw in (dict(priority="reward", beta=0.0), dict(priority="uniform", beta=0.4)):
            tr = _trainer(base, **kw)
            tr.config = RLConfig(**{**tr.config.__dict__, "policy_loss": "vanilla"})
            tr.train(3)
            assert tr.history[-1]["frac_rows_trained"] > 0
        tr = _trainer(base, priority="reward", beta=0.4)  # ppo_is takes the weights
        tr.train(3)
        assert len(tr.state["replay_buffer"]) > 0
