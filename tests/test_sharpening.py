"""Beyond sharpening: the exact identities (Gibbs optimum, power distribution, length bias, the accuracy
derivative, the -H gradient and its vertices) and the registered self-rewards and task."""
import copy

import numpy as np
import pytest
import torch

import rlcourse
from rlcourse.lm.sampling import sample
from rlcourse.methods import sharpening as S
from rlcourse.profiles import one_torch_thread
from rlcourse.rewards import get_reward
from rlcourse.tasks import get_task
from rlcourse.train import RLConfig, Trainer


def fd_grad(f, z, h=1e-6):
    g = np.zeros_like(z)
    for j in range(len(z)):
        e = np.zeros_like(z)
        e[j] = h
        g[j] = (f(z + e) - f(z - e)) / (2 * h)
    return g


def test_gibbs_optimum_is_the_limit_of_gradient_ascent():
    rng = np.random.default_rng(0)
    ref, r, beta = rng.dirichlet(np.ones(20)), rng.normal(size=20), 0.5
    z = np.log(ref)
    for _ in range(20000):
        z += 2.0 * S.kl_objective(z, ref, r, beta)[1]
    target = S.kl_regularized_optimum(ref, r, beta)
    assert np.abs(S.softmax(z) - target).sum() < 1e-4
    # and it is the maximum: random policies do worse
    best = S.kl_objective(np.log(target), ref, r, beta)[0]
    assert all(S.kl_objective(rng.normal(size=20), ref, r, beta)[0] < best for _ in range(100))


def test_kl_objective_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    ref, r, z = rng.dirichlet(np.ones(7)), rng.normal(size=7), rng.normal(size=7)
    g = S.kl_objective(z, ref, r, 0.3)[1]
    assert np.allclose(g, fd_grad(lambda x: S.kl_objective(x, ref, r, 0.3)[0], z), atol=1e-7)


def test_sharpening_optimum_is_the_power_distribution():
    rng = np.random.default_rng(2)
    base = rng.dirichlet(np.ones(12))
    for beta in (0.1, 0.5, 2.0):
        assert np.allclose(S.kl_regularized_optimum(base, np.log(base), beta), S.power_distribution(base, 1 + 1 / beta))
    assert np.argmax(S.power_distribution(base, 200.0)) == np.argmax(base)
    assert S.power_distribution(base, 200.0).max() > 0.99


def test_power_distribution_shortens_the_autoregressive_toy():
    seqs, p = S.ar_sequences(q_stop=0.3, max_len=8)
    assert np.isclose(p.sum(), 1.0) and len(seqs) == 2**9 - 1
    lengths = [S.expected_length(S.power_distribution(p, a), seqs) for a in (1, 1.5, 2, 4, 8)]
    assert all(a > b for a, b in zip(lengths, lengths[1:]))
    long = seqs.index("abab")  # a designated correct long answer
    mass = [S.power_distribution(p, a)[long] for a in (1, 2, 4, 8)]
    assert all(a > b for a, b in zip(mass, mass[1:]))


def test_accuracy_derivative_is_the_covariance_formula():
    rng = np.random.default_rng(3)
    for _ in range(20):
        pi, correct = rng.dirichlet(np.ones(10)), rng.random(10) < 0.4
        if not correct.any():
            continue
        a, h = rng.uniform(0.5, 3), 1e-5
        fd = (np.log(S.sharpened_accuracy(pi, correct, a + h)) - np.log(S.sharpened_accuracy(pi, correct, a - h))) / (2 * h)
        assert abs(fd - S.dlog_accuracy_dalpha(pi, correct, a)) < 1e-6
    # sharpening helps exactly where the correct answers are on average likelier
    pi = np.array([0.5, 0.3, 0.2])
    assert S.dlog_accuracy_dalpha(pi, np.array([True, False, False]), 1.0) > 0
    assert S.dlog_accuracy_dalpha(pi, np.array([False, False, True]), 1.0) < 0


def test_neg_entropy_gradient_and_its_vertices():
    rng = np.random.default_rng(4)
    z = rng.normal(size=6)
    assert np.allclose(S.neg_entropy_grad(z)[1], fd_grad(lambda x: S.neg_entropy_grad(x)[0], z), atol=1e-7)
    # from near-uniform starts, different seeds end at different vertices; each end point is deterministic
    ends = [S.entropy_ascent(1e-3 * np.random.default_rng(s).normal(size=6), steps=3000) for s in range(12)]
    assert all(e.max() > 0.99 for e in ends)
    assert len({int(e.argmax()) for e in ends}) >= 3
    # a task reward from the same starts reaches the correct set every time
    r = np.array([1.0, 1.0, 0, 0, 0, 0])
    for s in range(12):
        z = 1e-3 * np.random.default_rng(s).normal(size=6)
        for _ in range(3000):
            pi = S.softmax(z)
            z = z + 1.0 * pi * (r - pi @ r)
        assert S.softmax(z)[:2].sum() > 0.99


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="beta"):
        S.kl_regularized_optimum(np.ones(3) / 3, np.zeros(3), 0.0)
    with pytest.raises(ValueError, match="shape"):
        S.kl_regularized_optimum(np.ones(3) / 3, np.zeros(4), 1.0)
    with pytest.raises(ValueError, match="sum to 1"):
        S.power_distribution(np.ones(3), 2.0)
    with pytest.raises(ValueError, match="unknown toy reward"):
        S.toy_train(S.toy_prompts(2, 0), "confidence", seed=0, steps=1)
    with pytest.raises(ValueError, match="seeds, prompts"):
        S.seed_disagreement(np.zeros(3))


def test_dropped_carry_sum_and_task():
    assert S.dropped_carry_sum(47, 85) == 22 and S.dropped_carry_sum(12, 34) == 46 and S.dropped_carry_sum(95, 5) == 90
    task = get_task("addition_dropcarry")
    ex = task.examples(400, seed=0)
    dropped = [e for e in ex if e.solution.split("|")[1] != e.answer]
    assert all(e.meta["carry"] and e.solution.split("|")[1] == e.meta["dropped"] for e in dropped)
    share = len(dropped) / sum(e.meta["carry"] for e in ex)
    assert 0.4 < share < 0.6
    e = dropped[0]
    assert task.score(e.solution, e).reward == 0.0 and task.score(f"{e.answer[::-1]}|{e.answer}", e).reward == 1.0


def test_toy_regimes_reach_their_optima():
    toy = S.toy_prompts(16, seed=0)
    base = np.exp(toy["log_base"])
    task = S.toy_train(toy, "task", seed=0, steps=300)
    sharp = S.toy_train(toy, "base_loglik", seed=0, steps=300)
    opt = np.mean([S.power_distribution(b, 11.0)[c].sum() for b, c in zip(base, toy["correct"])])
    assert task["accuracy"][-1] > 0.95
    assert abs(sharp["accuracy"][-1] - opt) < 0.05
    selfr = S.toy_train(toy, "self_loglik", seed=0, steps=300)
    assert selfr["entropy"][-1] < 0.1 * selfr["entropy"][0]


@pytest.fixture(scope="module")
def lm():
    with one_torch_thread():
        model, tok = S.base_model(rlcourse.profile("smoke"))
    return model, tok


def _batch(model, tok, n=3):
    task = get_task("addition_dropcarry")
    ex = task.examples(2, seed=0, split="test")
    b = sample(model, tok, [e.prompt for e in ex], num_generations=n, max_new_tokens=8,
               generator=torch.Generator().manual_seed(0))
    return b, [e for e in ex for _ in range(n)], task


def test_loglik_rewards_match_the_sampled_logprobs(lm):
    model, tok = lm
    b, rows, task = _batch(model, tok)
    want = (b.logprobs * b.response_mask).sum(-1)
    got = S.self_loglik(b, rows, task, {}, model=model)
    assert torch.allclose(got, want, atol=1e-4)
    assert torch.allclose(S.base_loglik(b, rows, task, {}, model=model, ref_model=model, step=1), want, atol=1e-4)
    mean = S.self_loglik(b, rows, task, {}, model=model, normalize="mean")
    assert torch.allclose(mean, want / b.response_mask.sum(-1), atol=1e-4)
    with pytest.raises(ValueError, match="normalize"):
        S.self_loglik(b, rows, task, {}, model=model, normalize="max")


def test_base_loglik_keeps_a_frozen_copy_without_a_reference(lm):
    model, tok = lm
    b, rows, task = _batch(model, tok)
    policy, state = copy.deepcopy(model), {}
    first = S.base_loglik(b, rows, task, state, model=policy, ref_model=None, step=1)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.1)
    assert torch.allclose(S.base_loglik(b, rows, task, state, model=policy, ref_model=None, step=2), first)
    assert not torch.allclose(S.self_loglik(b, rows, task, {}, model=policy), first)
    with pytest.raises(ValueError, match="step 3"):
        S.base_loglik(b, rows, task, {}, model=policy, ref_model=None, step=3)


def test_self_certainty_is_zero_for_a_uniform_policy(lm):
    model, tok = lm
    b, rows, task = _batch(model, tok)
    sc = S.self_certainty(b, rows, task, {}, model=model)
    assert sc.shape == (len(b),) and (sc >= -1e-6).all()
    flat = copy.deepcopy(model)
    with torch.no_grad():
        flat.lm_head.weight.zero_()
    assert torch.allclose(S.self_certainty(b, rows, task, {}, model=flat), torch.zeros(len(b)), atol=1e-5)


@pytest.mark.parametrize("reward", ["base_loglik", "self_loglik", "self_certainty"])
def test_self_rewards_run_in_the_loop(lm, reward):
    model, tok = lm
    assert get_reward(reward) is getattr(S, reward)
    cfg = RLConfig(num_generations=4, prompts_per_step=2, steps=2, max_completion_length=8, reward=reward,
                   progress=False, learning_rate=1e-3)
    with one_torch_thread():
        tr = Trainer(copy.deepcopy(model), tok, "addition_dropcarry", cfg)
        tr.train()
    assert len(tr.history) == 2 and np.isfinite(tr.history[-1]["reward"])
    if reward == "base_loglik":
        assert "base_loglik" in tr.state  # beta = 0: the frozen copy


def test_lm_experiment_smoke_shapes():
    out = S.lm_experiment(rlcourse.profile("smoke"), seeds=1, arms=("task",))
    assert set(out["final"]) == {"task"} and len(out["curves"]["task"][0]) == 3
    assert 0 <= out["final"]["task"][0]["accuracy"] <= 1


def test_lm_study_cell_alone_equals_the_grid_and_bad_arms_are_named():
    """A later cell of the language-model grid, run alone, gives the numbers the runner gave it."""
    from rlcourse.studies import sharpening as study
    from rlcourse.studies.runner import run_study

    s = study.lm_study(rlcourse.profile("smoke"), seeds=2, arms=("task", "self_loglik"), steps=1)
    res = run_study(s, jobs=1, cache=False)
    arm, seed = s.cells()[-1]
    assert (arm, seed) == ("self_loglik", 1) and [k for k, _ in res.metrics[(arm, seed)]["curve"]] == [1]
    assert res.metrics[(arm, seed)] == study.run_cell(arm, seed, dict(s.sizes))
    with pytest.raises(ValueError, match="the arms are .*'base_loglik'"):
        study.run_cell("sharpen", 0, dict(s.sizes))
    with pytest.raises(ValueError, match="the arms are .*'base model'"):
        study.run_base_cell("task", 0, study.lm_base_study(rlcourse.profile("smoke")).sizes)
