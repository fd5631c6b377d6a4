"""Softmax-bandit math of the foundations chapters: exact gradients, estimator moments, baselines,
reward-to-go, KL estimators and the KL-regularised optimum (closed forms, finite differences, and
Monte Carlo with tolerances that a wrong formula would fail)."""
import math

import pytest
import torch

import rlcourse
from rlcourse.advantages import get_estimator
from rlcourse.bandits import (batch_baselines, enumerate_sequences, estimator_moments, exact_ascent,
                              expected_loss_ascent,
                              exact_policy_gradient, expected_reward, kl_categorical, kl_estimator_moments,
                              kl_regularised_optimum, optimal_baseline, regularised_objective, reinforce_estimates,
                              sample_bandit, score_vectors, sequence_estimator_moments, train_bandit, train_kl_bandit)
from rlcourse.losses import kl_penalty

D = torch.float64


def bandit(seed=0, K=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(K, generator=g, dtype=D), torch.rand(K, generator=g, dtype=D)


def test_exact_gradient_matches_autograd_and_finite_differences():
    theta, means = bandit()
    g = exact_policy_gradient(theta, means)
    th = theta.clone().requires_grad_()
    (auto,) = torch.autograd.grad(expected_reward(th, means), th)
    assert torch.allclose(g, auto)
    eps = 1e-6
    for k in range(len(theta)):
        e = torch.zeros_like(theta)
        e[k] = eps
        fd = (expected_reward(theta + e, means) - expected_reward(theta - e, means)) / (2 * eps)
        assert float(fd) == pytest.approx(float(g[k]), abs=1e-8)
    # the score of each arm has zero mean under pi
    pi = torch.softmax(theta, -1)
    assert torch.allclose((pi.unsqueeze(-1) * score_vectors(theta)).sum(0), torch.zeros_like(theta), atol=1e-12)


@pytest.mark.parametrize("noise", ["bernoulli", "none"])
def test_monte_carlo_mean_and_variance_match_enumeration(noise):
    theta, means = bandit(1)
    n = 200_000
    gen = torch.Generator().manual_seed(2)
    a, r = sample_bandit(theta, means, n, gen, noise)
    for b in (0.0, 0.7):
        g = reinforce_estimates(theta, a, r, b)
        mean, var = estimator_moments(theta, means, b, noise)
        assert torch.allclose(mean, exact_policy_gradient(theta, means))  # any constant baseline: unbiased
        se = g.std(0) / math.sqrt(n)
        assert ((g.mean(0) - mean).abs() < 4 * se + 1e-12).all()
        emp = float(((g - g.mean(0)) ** 2).sum(-1).mean())
        assert emp == pytest.approx(var, rel=0.03)


def test_optimal_baseline_is_the_grid_argmin_and_beats_the_value_baseline():
    theta, means = bandit(3, K=6)
    b_star = optimal_baseline(theta, means)
    grid = torch.linspace(-1, 2, 3001, dtype=D)
    variances = torch.tensor([estimator_moments(theta, means, float(b))[1] for b in grid])
    assert float(grid[variances.argmin()]) == pytest.approx(b_star, abs=2e-3)
    J = float(expected_reward(theta, means))
    assert abs(J - b_star) > 1e-3  # the value is a different, worse, constant
    assert estimator_moments(theta, means, b_star)[1] < estimator_moments(theta, means, J)[1]
    # variance is quadratic in b: Var(b) = Var(b*) + (b - b*)^2 E||s||^2
    pi = torch.softmax(theta, -1)
    e_s2 = float((pi * (score_vectors(theta) ** 2).sum(-1)).sum())
    assert estimator_moments(theta, means, b_star + 0.5)[1] == pytest.approx(
        estimator_moments(theta, means, b_star)[1] + 0.25 * e_s2)


def test_batch_mean_baseline_shrinks_the_gradient_and_loo_does_not():
    theta, means = bandit(4)
    N, n_batches = 4, 100_000
    gen = torch.Generator().manual_seed(5)
    a, r = sample_bandit(theta, means, N * n_batches, gen)
    a, r = a.reshape(n_batches, N), r.reshape(n_batches, N)
    S = score_vectors(theta)[a]  # (batches, N, K)
    true = exact_policy_gradient(theta, means)
    for kind, factor in [("batch_mean", 1 - 1 / N), ("loo", 1.0), ("none", 1.0)]:
        g = ((r - batch_baselines(r, kind)).unsqueeze(-1) * S).mean(1)  # one estimate per batch
        se = g.std(0) / math.sqrt(n_batches)
        assert ((g.mean(0) - factor * true).abs() < 4 * se).all(), kind
    g_mean = ((r - batch_baselines(r, "batch_mean")).unsqueeze(-1) * S).mean(1).mean(0)
    assert ((g_mean - true).abs() > 4 * g.std(0) / math.sqrt(n_batches)).any()  # the 1 - 1/N bias is visible


def test_batch_baselines_match_the_registered_estimators():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0], dtype=D)
    mask = torch.ones(8, 1)
    adv_b, _ = get_estimator("reinforce_baseline")(r[:, None].float(), mask, None)
    assert torch.allclose(adv_b[:, 0].double(), r - batch_baselines(r, "batch_mean"), atol=1e-6)
    adv_l, _ = get_estimator("rloo")(r[:, None].float(), mask, torch.zeros(8, dtype=torch.long))
    assert torch.allclose(adv_l[:, 0].double(), r - batch_baselines(r, "loo"), atol=1e-6)
    with pytest.raises(ValueError, match="N >= 2"):
        batch_baselines(r[:1], "loo")
    with pytest.raises(ValueError, match="unknown batch baseline"):
        batch_baselines(r, "median")


def test_reward_to_go_is_unbiased_with_less_variance():
    g = torch.Generator().manual_seed(6)
    L, V = 3, 3
    theta = torch.randn(L, V, V, generator=g, dtype=D)
    seqs = enumerate_sequences(V, L)
    table = torch.randn(L, V, V, generator=g, dtype=D) + 1.0  # r_t depends on (y_{t-1}, y_t) only
    prev = torch.cat([torch.zeros(len(seqs), 1, dtype=torch.long), seqs[:, :-1]], 1)
    rewards = table[torch.arange(L).expand(len(seqs), L), prev, seqs]
    mom = sequence_estimator_moments(theta, rewards)
    assert torch.allclose(mom["full"][0], mom["exact"])
    assert torch.allclose(mom["reward_to_go"][0], mom["exact"])
    assert mom["reward_to_go"][1] < mom["full"][1]
    # with a reward that looks at the future, dropping the past would be wrong: r_0 depends on y_2
    future = rewards.clone()
    future[:, 0] = (seqs[:, 2] == 1).to(D) * 3.0
    mom_f = sequence_estimator_moments(theta, future)
    assert torch.allclose(mom_f["full"][0], mom_f["exact"])
    assert not torch.allclose(mom_f["reward_to_go"][0], mom_f["exact"], atol=1e-4)
    with pytest.raises(ValueError, match="token_rewards"):
        sequence_estimator_moments(theta, rewards[:5])


def test_kl_estimator_moments():
    g = torch.Generator().manual_seed(7)
    logp = torch.log_softmax(torch.randn(6, generator=g, dtype=D), -1)
    logref = torch.log_softmax(torch.randn(6, generator=g, dtype=D), -1)
    mom = kl_estimator_moments(logp, logref)
    assert mom["k1"][0] == pytest.approx(mom["kl"])
    assert mom["k3"][0] == pytest.approx(mom["kl"])
    assert abs(mom["k2"][0] - mom["kl"]) > 1e-3
    assert (kl_penalty(logp, logref, "k3") >= 0).all()
    # far apart, the library's clamp at 10 biases k3 downwards; the unclamped k3 stays unbiased
    far = torch.log_softmax(torch.tensor([12.0, 0, 0, 0, 0, 0], dtype=D), -1)
    mom_far = kl_estimator_moments(far, logref)
    assert mom_far["k3_unclamped"][0] == pytest.approx(mom_far["kl"], rel=1e-9)
    assert mom_far["k3"][0] < mom_far["kl"] - 1e-3
    same = kl_estimator_moments(logp, logp)
    assert same["kl"] == 0 and same["k1"] == (0.0, 0.0) and same["k3"] == (0.0, 0.0)


def test_kl_regularised_optimum_closed_form():
    g = torch.Generator().manual_seed(8)
    logref = torch.log_softmax(torch.randn(5, generator=g, dtype=D), -1)
    means = torch.rand(5, generator=g, dtype=D)
    beta = 0.3
    lo = kl_regularised_optimum(logref, means, beta)
    th = exact_ascent(lambda t: regularised_objective(t, logref, means, beta), logref, steps=4000, lr=2.0)
    assert torch.allclose(torch.log_softmax(th, -1), lo, atol=1e-6)
    # Gibbs: J - beta KL(pi||ref) = beta log Z - beta KL(pi||pi*) for every pi
    logZ = torch.logsumexp(logref + means / beta, -1)
    for s in range(3):
        t = torch.randn(5, generator=g, dtype=D)
        lhs = regularised_objective(t, logref, means, beta)
        rhs = beta * logZ - beta * kl_categorical(torch.log_softmax(t, -1), lo)
        assert float(lhs) == pytest.approx(float(rhs))
    with pytest.raises(ValueError, match="beta"):
        kl_regularised_optimum(logref, means, 0.0)


def test_training_runs_are_deterministic_and_reach_the_optimum():
    means = torch.linspace(0.1, 0.9, 4, dtype=D)
    logref = torch.log_softmax(torch.zeros(4, dtype=D), -1)
    a = train_kl_bandit(means, logref, 0.2, "k2-loss", 300, 16, 0.5, runs=3, seed=1)
    b = train_kl_bandit(means, logref, 0.2, "k3+-loss", 300, 16, 0.5, runs=3, seed=1)
    assert torch.equal(a["J"], b["J"])  # same gradient, same random numbers
    lo = kl_regularised_optimum(logref, means, 0.2)
    assert float(kl_categorical(a["logp"], lo.expand_as(a["logp"])).mean()) < 0.02
    r1 = train_bandit(means, torch.zeros(4, dtype=D), "loo", 20, 4, 1.0, runs=2, seed=3)
    r2 = train_bandit(means, torch.zeros(4, dtype=D), "loo", 20, 4, 1.0, runs=2, seed=3)
    assert torch.equal(r1["J"], r2["J"])
    with pytest.raises(ValueError, match="unknown KL placement"):
        train_kl_bandit(means, logref, 0.2, "k4-loss", 3, 4, 0.5, runs=1)
    with pytest.raises(ValueError, match="unknown baseline"):
        train_bandit(means, torch.zeros(4, dtype=D), "median", 3, 4, 1.0, runs=1)


def test_bad_inputs_raise_clear_errors():
    theta, means = bandit()
    with pytest.raises(TypeError, match="theta must be a torch.Tensor"):
        expected_reward([0.0, 1.0], means)
    with pytest.raises(ValueError, match="means must have shape"):
        expected_reward(theta, means[:3])
    with pytest.raises(ValueError, match="K >= 2"):
        score_vectors(torch.zeros(1, dtype=D))
    with pytest.raises(ValueError, match="reward_noise"):
        estimator_moments(theta, means, 0.0, "gaussian")
    with pytest.raises(ValueError, match="baseline must be a scalar"):
        reinforce_estimates(theta, torch.tensor([0, 1]), torch.tensor([1.0, 0.0], dtype=D), torch.zeros(3))


def test_sequence_logprob_gradient_is_the_sum_of_token_gradients():
    from rlcourse.lm import build_model, build_tokenizer, response_logprobs, sample

    tok = build_tokenizer()
    model = build_model(tok, rlcourse.profile("smoke"), seed=0)
    batch = sample(model, tok, ["12+3=", "sort 931:"], num_generations=2, max_new_tokens=5,
                   generator=torch.Generator().manual_seed(0))
    params = [p for p in model.parameters() if p.requires_grad]
    logp = response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_len)
    mask = batch.response_mask
    assert torch.allclose(logp * mask, batch.logprobs, atol=1e-5)
    i = 1
    seq = torch.autograd.grad((logp[i] * mask[i]).sum(), params, retain_graph=True)
    total = [torch.zeros_like(p) for p in params]
    for t in range(int(mask[i].sum())):
        for acc, gt in zip(total, torch.autograd.grad(logp[i, t], params, retain_graph=True, allow_unused=True)):
            if gt is not None:
                acc += gt
    seq_flat = torch.cat([g.flatten() for g in seq])
    tot_flat = torch.cat([g.flatten() for g in total])
    assert float((seq_flat - tot_flat).abs().max() / seq_flat.abs().max()) < 1e-4


def test_expected_loss_ascent_fixed_points():
    """k2 in the loss reaches pi*_beta; k3 (where its clamp does not bind) reaches the forward-KL optimum."""
    means = torch.linspace(0.1, 0.9, 4, dtype=D)
    logref = torch.log_softmax(torch.linspace(0.5, -0.5, 4, dtype=D), -1)
    beta = 0.5
    lo = kl_regularised_optimum(logref, means, beta)
    th2 = expected_loss_ascent(logref, means, beta, "k2", steps=1500)
    assert torch.allclose(torch.log_softmax(th2, -1), lo, atol=1e-5)
    th3 = expected_loss_ascent(logref, means, beta, "k3", steps=1500)
    fwd = exact_ascent(lambda t: regularised_objective(t, logref, means, beta, "forward"), logref, steps=1500, lr=2.0)
    assert torch.allclose(torch.log_softmax(th3, -1), torch.log_softmax(fwd, -1), atol=1e-5)
    assert not torch.allclose(torch.log_softmax(th3, -1), lo, atol=1e-2)


def test_kl_study_cells_do_not_depend_on_order():
    from dataclasses import replace

    from rlcourse.profiles import profile
    from rlcourse.studies import run_study
    from rlcourse.studies.kl_control import arm_name, kl_study, run_cell

    study = kl_study(profile("smoke"))
    study = replace(study, sizes={**study.sizes, "steps": 12})  # a shorter grid
    res = run_study(study, jobs=1, cache=False)
    last = arm_name("k3+-loss", study.sizes["betas"][-1])
    assert res.metrics[(last, 0)] == run_cell(last, 0, dict(study.sizes))  # alone, nothing run before it
    # the placements of one beta share their random numbers; the betas do not
    b0, b1 = study.sizes["betas"]
    assert res.metrics[(arm_name("k2-loss", b0), 0)]["J_runs"] == res.metrics[(arm_name("k3+-loss", b0), 0)]["J_runs"]
    assert res.metrics[(arm_name("k2-loss", b0), 0)]["J_runs"] != res.metrics[(arm_name("k2-loss", b1), 0)]["J_runs"]
    with pytest.raises(ValueError, match="the arms are .*k1-reward beta="):
        run_cell("k4-loss beta=0.1", 0, dict(study.sizes))
    with pytest.raises(ValueError, match="the arms are"):
        run_cell("k2-loss beta=0.3", 0, dict(study.sizes))


def test_kl_lm_study_cells_stand_alone():
    """The tiny-LM sweep: a later cell run inside the grid equals the same cell run alone; a bad arm is
    refused with the arms named (the base model's one-cell study too)."""
    from dataclasses import replace

    from rlcourse.profiles import profile
    from rlcourse.studies import run_study
    from rlcourse.studies.kl_control import (LM_BASE, lm_base_study, lm_study, run_lm_base_cell, run_lm_cell,
                                             run_kl_beta_sweep_lm)

    P = replace(profile("smoke"), seeds=2)
    study = lm_study(P)
    res = run_study(study, jobs=1, cache=False)
    arm, seed = study.cells()[-1]
    assert (arm, seed) == ("beta=1.0", 1)
    assert res.metrics[(arm, seed)] == run_lm_cell(arm, seed, dict(study.sizes))
    with pytest.raises(ValueError, match="the arms are .*'beta=0.0'"):
        run_lm_cell("beta=0.5", 0, dict(study.sizes))
    base = lm_base_study(P)
    with pytest.raises(ValueError, match="the arms are .*'base model'"):
        run_lm_base_cell("beta=0.0", 0, dict(base.sizes))
    # the wrapper reshapes the same grid: rows are betas, columns seeds
    S = run_kl_beta_sweep_lm(P, cache=False)
    assert S["kl"].shape == (2, 2) and S["kl"][1, 1] == res.metrics[(arm, seed)]["kl"]
    assert S["base_reward"] == run_lm_base_cell(LM_BASE, 0, dict(base.sizes))["reward"]
    assert res.verdicts()["lm"].seeds == 2
