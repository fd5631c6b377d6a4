"""SORL: the turn-level ratio, the clipping-triggered normaliser (a reconstruction), the variance
identities, the multi-turn sampler in the loop (environment tokens, turn indices, a lagged behaviour
policy that survives a resume) and the tabular toy."""
import copy

import numpy as np
import pytest
import torch

import rlcourse
from rlcourse.lm import build_model, build_tokenizer, response_logprobs
from rlcourse.losses import compute_policy_loss, get_policy_loss
from rlcourse.methods import sorl
from rlcourse.rewards import register_reward
from rlcourse.studies import sorl as study
from rlcourse.multiturn import episode_text, multiturn_sampler, play_episodes, split_turns
from rlcourse.envs import TextFrozenLake
from rlcourse.tasks import get_task
from rlcourse.train import RLConfig, Trainer


def episode_batch(seed=0, B=5, K=4, n=3, env=2, dtype=torch.float64):
    """Rows of K turns: n agent tokens then ``env`` environment tokens each, and some padding."""
    g = torch.Generator().manual_seed(seed)
    T = K * (n + env) + 3
    turn = torch.full((B, T), -1, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=dtype)
    for b in range(B):
        k_b = K - (b % 2)  # rows of different lengths
        for k in range(k_b):
            s = k * (n + env)
            turn[b, s:s + n + env] = k
            mask[b, s:s + n] = 1
    old = -torch.rand(B, T, generator=g, dtype=dtype) * 2
    new = old + 0.3 * torch.randn(B, T, generator=g, dtype=dtype)
    adv = torch.randn(B, 1, generator=g, dtype=dtype).expand(B, T).clone() * mask
    return old * mask, new * mask, adv, mask, turn


def test_turn_ratio_is_constant_within_a_turn_and_the_exp_mean_of_agent_tokens():
    old, new, adv, mask, turn = episode_batch()
    lr = sorl.turn_mean_log_ratio(new - old, mask, turn)
    for b in range(mask.shape[0]):
        for k in turn[b].unique().tolist():
            if k < 0:
                continue
            agent = (turn[b] == k) & (mask[b] == 1)
            expected = (new - old)[b][agent].mean()
            assert torch.allclose(lr[b][turn[b] == k], expected.expand(int((turn[b] == k).sum())))
    # environment tokens are excluded: changing their log-ratios changes nothing
    noisy = new + 5.0 * (1 - mask) * (turn >= 0)
    assert torch.equal(sorl.turn_mean_log_ratio(noisy - old, mask, turn) * mask, lr * mask)
    # no turn index: the whole response is one turn (the sequence level)
    seq = sorl.turn_mean_log_ratio(new - old, mask, None)
    assert torch.allclose(seq[:, 0], ((new - old) * mask).sum(-1) / mask.sum(-1))


def test_token_level_without_normaliser_is_vanilla_ppo():
    old, new, adv, mask, turn = episode_batch(seed=1)
    a = new.clone().requires_grad_(True)
    b = new.clone().requires_grad_(True)
    la, ma = sorl.compute_turn_ppo_loss(old, a, adv, mask, 0.2, 0.2, turn, level="token", normalizer="none")
    lb, mb = compute_policy_loss(old, b, adv, mask, 0.2, 0.2)
    ga, = torch.autograd.grad(la, a)
    gb, = torch.autograd.grad(lb, b)
    assert torch.allclose(la, lb) and torch.allclose(ga, gb) and ma["pg_clipfrac"] == mb["pg_clipfrac"]


def test_normaliser_is_one_when_nothing_is_clipped_and_shrinks_otherwise():
    old, new, adv, mask, turn = episode_batch(seed=2)
    near = old + 0.01 * (new - old)  # every ratio inside [0.8, 1.2]
    for kind in ("bias", "mass"):
        w = sorl.clipping_normalizer(torch.exp(near - old), adv, mask, 0.2, 0.2, kind)
        assert torch.equal(w, torch.ones_like(w))
        loss_n, _ = sorl.compute_turn_ppo_loss(old, near, adv, mask, turn_index=turn, normalizer=kind)
        loss_0, _ = sorl.compute_turn_ppo_loss(old, near, adv, mask, turn_index=turn, normalizer="none")
        assert torch.equal(loss_n, loss_0)
    rho = torch.tensor([[0.5, 1.0, 1.5, 3.0]], dtype=torch.float64)
    A = torch.tensor([[1.0, -2.0, -1.0, 2.0]], dtype=torch.float64)
    m = torch.ones_like(rho)
    w = sorl.clipping_normalizer(rho, A, m, 0.2, 0.2, "bias", coef=1.0)
    assert torch.allclose(w, 1 / (1 + torch.tensor([[0.3, 0.0, 0.3, 3.6]], dtype=torch.float64)))
    share = sorl.clipping_normalizer(rho, A, m, 0.2, 0.2, "mass")
    assert torch.allclose(share, torch.full_like(rho, 2 / 6))


def central_differences(f, x, mask, h=1e-6):
    num = torch.zeros_like(x)
    for i, j in (mask > 0).nonzero().tolist():
        e = torch.zeros_like(x)
        e[i, j] = h
        num[i, j] = (f(x + e) - f(x - e)) / (2 * h)
    return num


def test_sorl_gradient_matches_finite_differences():
    """The loss's gradient against central differences of the same surrogate with the (detached)
    normaliser held at its value, in float64, at a point where turns are clipped."""
    old, new, adv, mask, turn = episode_batch(seed=3)
    x = (old + 1.5 * (new - old)).clone()
    for kind in ("bias", "mass", "none"):
        loss, met = sorl.compute_turn_ppo_loss(old, x.clone().requires_grad_(True), adv, mask, 0.2, 0.2, turn,
                                               normalizer=kind)
        assert met["ratio_out_frac"] > 0.1  # the check covers clipped turns
        xg = x.clone().requires_grad_(True)
        g, = torch.autograd.grad(sorl.compute_turn_ppo_loss(old, xg, adv, mask, 0.2, 0.2, turn, normalizer=kind)[0], xg)
        w = sorl.clipping_normalizer(torch.exp(sorl.turn_mean_log_ratio(x - old, mask, turn)), adv, mask, 0.2, 0.2, kind)

        def frozen(lp):
            r = torch.exp(sorl.turn_mean_log_ratio(lp - old, mask, turn))
            return (w * torch.maximum(-adv * r, -adv * r.clamp(0.8, 1.2)) * mask).sum() / mask.sum()
        assert torch.allclose(frozen(x), loss.detach())
        torch.testing.assert_close(g * mask, central_differences(frozen, x, mask), atol=1e-7, rtol=1e-5)
        assert torch.equal(g * (1 - mask), torch.zeros_like(g))  # no gradient reaches environment tokens


def test_log_variance_of_token_turn_and_sequence_ratios_by_monte_carlo():
    rng = np.random.default_rng(0)
    N, K, n, s = 20_000, 4, 5, 0.3
    draws = rng.normal(0.0, s, (N, K, n))
    got = sorl.log_ratio_variances(draws)
    want = sorl.log_ratio_variance_theory(s**2, n, K)
    # the sample variance of M normal draws has relative standard error sqrt(2 / (M - 1)); allow 5 of them
    for level, M in (("token", N * K * n), ("turn", N * K), ("sequence", N)):
        assert abs(got[level] / want[level] - 1) < 5 * np.sqrt(2 / (M - 1)), (level, got[level], want[level])
    assert got["sequence"] > got["token"] > got["turn"]


def test_clip_bias_is_zero_inside_and_nonpositive_everywhere():
    rho = np.linspace(0.1, 3, 301)
    for a in (-1.0, 1.0):
        b = sorl.clip_bias(rho, a)
        assert (b <= 1e-15).all() and np.allclose(b[(rho >= 0.8) & (rho <= 1.2)], 0)


def test_bad_inputs_are_refused():
    old, new, adv, mask, turn = episode_batch()
    with pytest.raises(ValueError, match="normalizer"):
        sorl.compute_turn_ppo_loss(old, new, adv, mask, turn_index=turn, normalizer="nope")
    with pytest.raises(ValueError, match="level"):
        sorl.compute_turn_ppo_loss(old, new, adv, mask, turn_index=turn, level="paragraph")
    with pytest.raises(ValueError, match="negative turn_index"):
        sorl.turn_mean_log_ratio(new - old, mask, torch.full_like(turn, -1))
    with pytest.raises(ValueError, match="integer"):
        sorl.turn_mean_log_ratio(new - old, mask, turn.double())
    with pytest.raises(ValueError, match="shape"):
        sorl.turn_mean_log_ratio(new - old, mask, turn[:, :-1])
    assert get_policy_loss("sorl") is sorl.sorl_loss and get_policy_loss("turn_ppo") is sorl.turn_ppo_loss


def test_transcript_format_round_trips_through_the_verifier():
    assert split_turns(episode_text(["R<eos>", "RR", ""])) == ["R<eos>", "RR", ""]
    assert split_turns("RR D") == ["R", "R", "D"]
    task = get_task("frozenlake")
    e = task.examples(1, seed=3)[0]
    assert task.score(e.solution, e).reward == 1.0
    assert task.score(episode_text([m + "<eos>" for m in e.solution]), e).reward == 1.0
    assert task.score(episode_text(["X"]), e).reward == 0.0


# ---------------------------------------------------------------------- the sampler in the loop
@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return build_model(tok, rlcourse.profile("smoke"), seed=0), tok


def test_sampler_batch_layout_and_reward_is_the_episode_return(tiny):
    model, tok = tiny
    task = get_task("frozenlake")
    ex = task.examples(3, seed=0)
    cfg = RLConfig(num_generations=4, prompts_per_step=3)
    batch = multiturn_sampler(model, tok, [e.prompt for e in ex], cfg, torch.Generator().manual_seed(5), {}, ex)
    B, T = batch.response_ids.shape
    assert B == 12 and batch.extras["turn_index"].shape == (B, T) and batch.index.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert ((batch.attention == 1) >= (batch.response_mask == 1)).all()
    # the same draws played by hand: the task reward of the batch's texts is each episode's return
    envs = [TextFrozenLake() for _ in range(B)]
    ep = play_episodes(model, tok, envs, [{"options": {"map_seed": e.meta["map_seed"]}} for e in ex for _ in range(4)],
                       max_turns=8, generator=torch.Generator().manual_seed(5))
    per_row = [e for e in ex for _ in range(4)]
    torch.testing.assert_close(torch.as_tensor(task.rewards(batch.texts, per_row)), ep.rewards)
    assert torch.equal(batch.response_ids, ep.response_ids)


def test_sampler_refuses_other_tasks_by_name(tiny):
    model, tok = tiny
    ex = get_task("addition").examples(2, seed=0)
    with pytest.raises(ValueError, match="'map_seed'"):
        multiturn_sampler(model, tok, [e.prompt for e in ex], RLConfig(num_generations=2), None, {}, ex)
    with pytest.raises(ValueError, match="unknown text environment 'maze'; registered: .*'frozenlake'"):
        multiturn_sampler(model, tok, [e.prompt for e in ex], RLConfig(num_generations=2), None, {}, ex, env="maze")


def test_a_registered_text_environment_is_played_by_name(tiny):
    """The sampler builds each row's environment with the function registered under ``env``: a FrozenLake
    registered under a second name (with a different size rule) is played exactly as that name says."""
    from rlcourse.envs.frozenlake import TextFrozenLake
    from rlcourse.multiturn import TEXT_ENVS, register_text_env
    model, tok = tiny
    ex = get_task("frozenlake").examples(2, seed=0)
    made = []

    @register_text_env("frozenlake-logged")
    def logged(example, max_turns):
        made.append(example.meta["map_seed"])
        return TextFrozenLake(size=4, max_turns=max_turns), {"options": {"map_seed": example.meta["map_seed"]}}
    try:
        cfg = RLConfig(num_generations=2)
        a = multiturn_sampler(model, tok, [e.prompt for e in ex], cfg, torch.Generator().manual_seed(0), {}, ex,
                              env="frozenlake-logged")
        b = multiturn_sampler(model, tok, [e.prompt for e in ex], cfg, torch.Generator().manual_seed(0), {}, ex)
        assert made == [e.meta["map_seed"] for e in ex for _ in range(2)]
        assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
        with pytest.raises(ValueError, match="already registered"):
            register_text_env("frozenlake")(logged)
    finally:
        TEXT_ENVS._items.pop("frozenlake-logged", None)


def test_lagged_behaviour_logprobs_and_exact_resume(tiny, tmp_path):
    model, tok = tiny
    task = get_task("frozenlake")
    train, held = task.examples(40, seed=0), task.examples(4, seed=0, split="test")

    def trainer(out, resume=False):
        cfg = RLConfig(num_generations=4, prompts_per_step=2, steps=4, learning_rate=1e-2, sampler="multiturn",
                       sampler_kwargs={"lag": 2}, policy_loss="sorl", progress=False, output_dir=str(out), save_every=2)
        return Trainer(copy.deepcopy(model), tok, task, cfg, train_examples=train, eval_examples=held, resume=resume)

    full = trainer(tmp_path / "a")
    full.train(3)
    kept = full.state["multiturn"]["weights"]
    assert len(kept) == 3  # lag + 1 snapshots
    # the behaviour log-probs of the next batch are those of the policy two updates old
    old = copy.deepcopy(model)
    # after the next call appends, kept[1] becomes the oldest; a snapshot holds the trained parameters
    # (a tied output matrix once, under its first name)
    assert not old.load_state_dict(kept[1], strict=False).unexpected_keys
    batch = multiturn_sampler(full.model, tok, [train[0].prompt], full.config, torch.Generator().manual_seed(1),
                              copy.deepcopy(full.state), [train[0]], lag=2)
    with torch.no_grad():
        lp = response_logprobs(old, batch.input_ids, batch.attention_mask, batch.response_len)
    torch.testing.assert_close(lp * batch.response_mask, batch.logprobs, atol=2e-5, rtol=0)
    assert batch.entropy is None
    full.train(4)
    part = trainer(tmp_path / "b")
    part.train(2)
    resumed = trainer(tmp_path / "b", resume=True)
    assert resumed.step_count == 2 and len(resumed.state["multiturn"]["weights"]) == 2
    resumed.train(4)
    for (n, p), q in zip(full.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), n


# ---------------------------------------------------------------------- the toy
def test_lock_exact_return_matches_monte_carlo():
    cfg = study.LockConfig(samples=4000, contexts=2)
    codes = study.make_codes(cfg, 0)
    logits = torch.randn(cfg.contexts, cfg.doors, cfg.turn_len, cfg.symbols, generator=torch.Generator().manual_seed(0))
    ep = study.play_lock(logits, codes, cfg, torch.Generator().manual_seed(1))
    r = ep["reward"]
    exact = study.expected_lock_return(logits, codes, cfg)
    assert abs(float(r.mean()) - exact) < 5 * float(r.std()) / np.sqrt(len(r))
    # recorded log-probs: the turn of a row is its door's code attempt, padding after the end is masked
    lp = study.lock_log_probs(logits, ep)
    assert lp.shape == ep["response_mask"].shape and (ep["turn_index"][:, :cfg.turn_len] == 0).all()


def test_staleness_experiment_runs_and_gives_every_verdict():
    P = rlcourse.profile("smoke")
    out = study.run_staleness_experiment(P, stalenesses=(0, 2), seeds=2, cfg=study.LockConfig(steps=4))
    v = study.staleness_verdicts(out)
    assert set(v) == {"less-lost-to-clip", "turn-ratio-alone", "normaliser-adds", "prevents-collapse", "lower-clip",
                      "lower-grad", "on-policy-match", "control-staleness", "control-collapse"}
    assert all(x.seeds == 2 for x in v.values())
    # the claims that rest on a control are uninformative when it did not hold, whatever their interval
    for name in ("less-lost-to-clip", "turn-ratio-alone", "normaliser-adds", "lower-grad"):
        assert v[name].control_verdict == v["control-staleness"].verdict
        assert (v[name].verdict == "uninformative") == (not v["control-staleness"].holds)
    assert (v["prevents-collapse"].verdict == "uninformative") == (not v["control-collapse"].holds)
    roles = {k: x.claim.role for k, x in v.items()}
    assert roles["control-collapse"] == roles["control-staleness"] == "positive control"
    assert roles["lower-clip"] == roles["on-policy-match"] == roles["turn-ratio-alone"] == "course hypothesis"


def test_mass_normaliser_refuses_a_split_batch_and_is_exact_on_the_whole_one(tiny):
    """The "mass" factor is a share over the whole batch: a call that sees part of it (a micro-batch)
    is refused by name; on the whole batch, passing the loop's global_tokens changes nothing, and the
    "bias" normaliser (per token) splits exactly."""
    old, new, adv, mask, turn = episode_batch(seed=4)
    x = old + 1.5 * (new - old)  # some turns out of the clip range
    n = float(mask.sum())
    whole, _ = sorl.compute_turn_ppo_loss(old, x, adv, mask, turn_index=turn, normalizer="mass")
    same, _ = sorl.compute_turn_ppo_loss(old, x, adv, mask, turn_index=turn, normalizer="mass", global_tokens=n)
    assert torch.equal(whole, same)
    with pytest.raises(ValueError, match="micro_batch_size"):
        sorl.compute_turn_ppo_loss(old[:2], x[:2], adv[:2], mask[:2], turn_index=turn[:2], normalizer="mass",
                                   global_tokens=n)
    # the per-part mass really differs from the whole batch's here (what the refusal prevents) ...
    parts = sum(sorl.compute_turn_ppo_loss(old[s], x[s], adv[s], mask[s], turn_index=turn[s], normalizer="mass")[0]
                * float(mask[s].sum()) / n for s in (slice(0, 2), slice(2, None)))
    assert not torch.allclose(parts, whole)
    # ... while the per-token "bias" normaliser sums over micro-batches to the whole-batch loss
    bias = sorl.compute_turn_ppo_loss(old, x, adv, mask, turn_index=turn, normalizer="bias")[0]
    split = sum(sorl.compute_turn_ppo_loss(old[s], x[s], adv[s], mask[s], turn_index=turn[s], normalizer="bias",
                                           global_tokens=n)[0] for s in (slice(0, 2), slice(2, None)))
    torch.testing.assert_close(split, bias)
    # in the Trainer: refused with micro-batches, runs on the whole batch
    model, tok = tiny
    task = get_task("frozenlake")
    train = task.examples(8, seed=0)

    def step(**kw):
        cfg = RLConfig(num_generations=4, prompts_per_step=2, steps=1, sampler="multiturn", policy_loss="sorl",
                       loss_kwargs={"normalizer": "mass"}, reward="test_sorl_rand", skip_zero_advantage_rows=False,
                       progress=False, **kw)
        return Trainer(copy.deepcopy(model), tok, task, cfg, train_examples=train, eval_examples=train[:2]).train()

    with pytest.raises(ValueError, match="'mass' normaliser"):
        step(micro_batch_size=3)
    assert np.isfinite(step()[-1]["loss"])


@register_reward("test_sorl_rand", overwrite=True)
def _random_reward(batch, examples, task, state):
    """A reward that varies within every group, so that every row has a nonzero advantage."""
    return torch.rand(len(batch.texts), generator=torch.Generator().manual_seed(len(batch.texts)))


def test_lock_studies_cells_stand_alone():
    """A later cell of the staleness grid and of the learning-rate sweep, run with the others, equals the
    same cell run alone; a bad arm is refused with the arms named; the grid's verdicts are those of the
    chapter's dict."""
    from rlcourse.studies.runner import run_study

    P = rlcourse.profile("smoke")
    for s in (study.staleness_study(P, stalenesses=(0, 2), seeds=2, cfg=study.LockConfig(steps=4)),
              study.learning_rate_study(P, lrs=(30.0, 100.0), staleness=2, seeds=2)):
        res = run_study(s, jobs=1, cache=False)
        arm, seed = s.cells()[-1]
        assert seed == s.seeds[1]
        assert res.metrics[(arm, seed)] == study.run_lock_cell(arm, seed, dict(s.sizes))
        with pytest.raises(ValueError, match="the arms are .*'GRPO \\(token\\) @ L=0"):
            study.run_lock_cell("no such arm", 0, dict(s.sizes))
    full = study.staleness_study(P, stalenesses=(0, 2), seeds=2, cfg=study.LockConfig(steps=4))
    v = run_study(full, jobs=1, cache=False).verdicts()
    assert v["control-staleness"].claim.key == "sorl/control-staleness" and v["lower-clip"].seeds == 2
