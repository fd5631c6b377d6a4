"""Poly-EPO (set RL): the marginal advantage's identities, the set policy-gradient theorem, the
failed-but-diverse example, the sampled estimator, the strategy rule and the registered estimators."""
import itertools
from math import comb
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlcourse.advantages import get_estimator
from rlcourse.methods import poly_epo as pe
from rlcourse.studies import poly_epo as study
from rlcourse.tasks import Example, get_task


def _all(N, n, r, s=None, objective="poly", baseline="all", lam=0.5):
    m = pe.subsets(N, n)
    return pe.marginal_advantage(pe.set_objective(r, s, m, objective, lam), m, N, baseline)


def test_subsets_and_distinct_share():
    m = pe.subsets(5, 2)
    assert m.shape == (10, 2) and m[0].tolist() == [0, 1] and m[-1].tolist() == [3, 4]
    assert pe.distinct_share(torch.tensor([[3, 3, 1, 3], [0, 1, 2, 3]])).tolist() == [0.5, 1.0]
    with pytest.raises(ValueError, match="1 <= n <= N"):
        pe.subsets(3, 4)


@pytest.mark.parametrize("N,n", [(8, 4), (6, 2), (5, 3), (16, 8)])
@pytest.mark.parametrize("baseline", ["all", "loo"])
def test_mean_objective_is_scaled_grpo(N, n, baseline):
    """f = mean r: A = (N-n)/(n(N-1)) (r - rbar) ('all') and N/(n(N-1)) (r - rbar) = RLOO / n ('loo')."""
    r = torch.rand(3, N, generator=torch.Generator().manual_seed(N + n), dtype=torch.float64)
    assert torch.allclose(_all(N, n, r, objective="mean", baseline=baseline), pe.mean_objective_advantage(r, n, baseline),
                          atol=1e-12, rtol=0)
    rloo, _ = get_estimator("rloo")(r.reshape(-1, 1), torch.ones(3 * N, 1), torch.arange(3).repeat_interleave(N))
    if baseline == "loo":
        assert torch.allclose(_all(N, n, r, objective="mean", baseline="loo"), rloo.reshape(3, N).double() / n, atol=1e-6)
    # normalised by the group std, every scale disappears: GRPO's advantage exactly
    grpo, _ = get_estimator("grpo")(r.reshape(-1, 1).float(), torch.ones(3 * N, 1), torch.arange(3).repeat_interleave(N))
    assert torch.allclose(pe.normalise_groups(_all(N, n, r, objective="mean", baseline=baseline), 0.0).float(),
                          grpo.reshape(3, N), atol=1e-5)


def test_all_baseline_is_a_fixed_multiple_of_leave_one_out():
    g = torch.Generator().manual_seed(1)
    r, s = torch.randint(0, 2, (4, 7), generator=g).double(), torch.randint(0, 3, (4, 7), generator=g)
    for objective in ("poly", "max", "additive"):
        a_all, a_loo = _all(7, 3, r, s, objective, "all"), _all(7, 3, r, s, objective, "loo")
        assert torch.allclose(a_all, (7 - 3) / 7 * a_loo, atol=1e-12)


@pytest.mark.parametrize("N,n", [(8, 4), (8, 1), (10, 3)])
def test_max_objective_gives_the_pkpo_pass_at_k_weights(N, n):
    """f = max r (binary): the score weight (n/N) mean_{S ni i} f equals PKPO's effective reward, and
    A_i = m_i - rho with m_i = 1 (correct) or rho(N-1, c, n-1) (wrong), rho the unbiased pass@n."""
    r = torch.tensor([[1.0] * c + [0.0] * (N - c) for c in range(N + 1)], dtype=torch.float64)
    m = pe.subsets(N, n)
    inside = torch.zeros(len(m), N, dtype=torch.float64).scatter_(1, m, 1.0)
    with_i = pe.set_objective(r, None, m, "max") @ inside / comb(N - 1, n - 1)
    assert torch.allclose(n / N * with_i, pe.pkpo_effective_rewards(r, n), atol=1e-12)
    c = r.sum(1, keepdim=True)
    rho = 1 - torch.tensor([comb(N - int(ci), n) / comb(N, n) for ci in c.flatten()], dtype=torch.float64)[:, None]
    wrong = 1 - torch.tensor([comb(max(N - 1 - int(ci), 0), n - 1) / comb(N - 1, n - 1) if ci < N else 0.0
                              for ci in c.flatten()],
                             dtype=torch.float64)[:, None]
    closed = torch.where(r > 0, 1.0, wrong) - rho
    assert torch.allclose(_all(N, n, r, objective="max"), closed, atol=1e-12)


def _bandit_J(theta, values, strategies, n, objective):
    """J = sum over all ordered n-tuples of arms of prod pi * f (exact, differentiable)."""
    pi = torch.softmax(theta, 0)
    J = 0.0
    for tup in itertools.product(range(len(pi)), repeat=n):
        idx = torch.tensor(tup)
        r, s = values[idx][None], strategies[idx][None]
        f = pe.set_objective(r, s, torch.arange(n)[None], objective)[0, 0]
        J = J + torch.prod(pi[idx]) * f
    return J


@pytest.mark.parametrize("objective", ["poly", "max", "mean"])
def test_set_policy_gradient_theorem_on_a_three_arm_bandit(objective):
    """grad J = n E_y[ E_{S ni y} f(S) grad log pi(y) ] (enumerated exactly) equals autograd of J."""
    theta = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64, requires_grad=True)
    values, strategies, n = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64), torch.tensor([0, 1, 2]), 3
    auto, = torch.autograd.grad(_bandit_J(theta, values, strategies, n, objective), theta)
    pi = torch.softmax(theta.detach(), 0)
    formula = torch.zeros(3, dtype=torch.float64)
    for y in range(3):
        # E over the other n-1 members of f({y} + others)
        g = sum(torch.prod(pi[list(rest)]) * pe.set_objective(values[[y, *rest]][None], strategies[[y, *rest]][None],
                                                               torch.arange(n)[None], objective)[0, 0]
                for rest in itertools.product(range(3), repeat=n - 1))
        formula += n * pi[y] * g * (torch.eye(3, dtype=torch.float64)[y] - pi)
    assert torch.allclose(formula, auto, rtol=1e-6, atol=1e-12)


def test_u_statistic_estimator_is_unbiased_exactly():
    """E over all 3^N sample tuples of sum_i (n/N) A_i grad log pi(y_i) = grad J with the leave-one-out
    baseline, and (N-n)/N grad J with the all-subsets one (enumerated, no Monte Carlo)."""
    theta = torch.tensor([0.4, -0.1, 0.2], dtype=torch.float64, requires_grad=True)
    values, strategies, N, n = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64), torch.tensor([0, 1, 2]), 5, 3
    auto, = torch.autograd.grad(_bandit_J(theta, values, strategies, n, "poly"), theta)
    pi = torch.softmax(theta.detach(), 0)
    eye = torch.eye(3, dtype=torch.float64)
    expect = {"loo": torch.zeros(3, dtype=torch.float64), "all": torch.zeros(3, dtype=torch.float64)}
    for tup in itertools.product(range(3), repeat=N):
        idx = torch.tensor(tup)
        p = torch.prod(pi[idx])
        for b in expect:
            A = _all(N, n, values[idx][None], strategies[idx][None], "poly", b)[0]
            expect[b] += p * (n / N) * (A[:, None] * (eye[idx] - pi)).sum(0)
    assert torch.allclose(expect["loo"], auto, rtol=1e-9, atol=1e-12)
    assert torch.allclose(expect["all"], (N - n) / N * auto, rtol=1e-9, atol=1e-12)


def test_failed_but_diverse_sample_gets_a_positive_advantage_only_under_the_coupled_objective():
    """N = 4, n = 3: three right answers of strategy A and one wrong answer of strategy B."""
    r, s = torch.tensor([[1.0, 1.0, 1.0, 0.0]]), torch.tensor([[0, 0, 0, 1]])
    poly = pe.set_advantage(r, s, 3, "poly", baseline="loo")[0]
    assert abs(float(poly[3]) - 1 / 9) < 1e-12  # (n - 2) / n^2
    for lam in (0.0, 0.25, 0.5, 1.0):
        add = pe.set_advantage(r, s, 3, "additive", lam=lam, baseline="loo")[0]
        assert float(add[3]) <= 1e-12 and abs(float(add[3]) - (lam - 1) / 3) < 1e-12
    # if the others fail too, the coupled objective gives the diverse sample nothing; the bonus still pays it
    r0 = torch.zeros(1, 4)
    assert float(pe.set_advantage(r0, s, 3, "poly", baseline="loo")[0, 3]) == 0.0
    assert abs(float(pe.set_advantage(r0, s, 3, "additive", lam=0.5, baseline="loo")[0, 3]) - 0.5 / 3) < 1e-12


@pytest.mark.parametrize("baseline", ["all", "loo"])
def test_sampled_estimator_matches_the_exact_one_within_its_standard_error(baseline):
    g = torch.Generator().manual_seed(3)
    N, n, M = 10, 4, 4000
    r, s = torch.randint(0, 2, (2, N), generator=g).double(), torch.randint(0, 4, (2, N), generator=g)
    exact = _all(N, n, r, s, "poly", baseline)
    est = pe.sampled_marginal_advantage(r, s, n, M, "poly", baseline=baseline, generator=g)
    # standard error from the exact spread of f over the two pools each mean draws from
    m = pe.subsets(N, n)
    f = pe.set_objective(r, s, m, "poly")  # (2, C)
    inside = torch.zeros(len(m), N).scatter_(1, m, 1.0).bool()
    for gi in range(2):
        for i in range(N):
            base_pool = f[gi] if baseline == "all" else f[gi][~inside[:, i]]
            se = (f[gi][inside[:, i]].var() / M + base_pool.var() / M).sqrt()
            assert abs(float(est[gi, i] - exact[gi, i])) < 5 * float(se) + 1e-12
    # set_advantage switches to sampling above max_subsets
    assert pe.set_advantage(r, s, n, "poly", max_subsets=10, num_subsets=8, generator=g).shape == (2, N)


def test_countdown_strategy_rule():
    assert pe.countdown_strategy("3*5+7") == "*+" and pe.countdown_strategy(" 7+3*5 ") == "+*"
    assert pe.countdown_strategy("12") == "" and pe.countdown_strategy("3*5+") == "malformed"
    assert pe.countdown_strategy("3 5") == "malformed" and pe.countdown_strategy("8-2-1") == "--"
    ex = get_task("countdown").examples(2, seed=0)
    codes = pe.strategy_codes(["3*5+7", "1+2", "2*9+1", "x"], [ex[0]] * 4, torch.arange(4))
    assert codes[0] == codes[2] and len(set(codes.tolist())) == 3


def _batch(texts):
    return SimpleNamespace(texts=texts)


def test_registered_poly_epo_equals_the_normalised_set_advantage_and_refuses_other_tasks():
    ex = get_task("countdown").examples(2, seed=0)
    texts = ["3*5+7", "3*5+7", "1+2+3", "9*9*9", "1-1", "2*2*2", "5+5+5", "x"]
    r = torch.tensor([1, 1, 0, 1, 0, 0, 1, 0], dtype=torch.float32)
    est = get_estimator("poly_epo")
    index = torch.tensor([0] * 4 + [1] * 4)
    examples = [ex[0]] * 4 + [ex[1]] * 4
    adv, ret = est(r[:, None], torch.ones(8, 1), index, _batch(texts), examples)
    for g in (0, 1):
        rows = torch.arange(4 * g, 4 * g + 4)
        codes = pe.strategy_codes(texts, examples, rows)[None]
        want = pe.normalise_groups(pe.set_advantage(r[rows][None], codes, 2, "poly"))[0]  # n = N // 2
        assert torch.allclose(adv[rows, 0], want.float(), atol=1e-6)
    assert torch.equal(ret[:, 0], r)
    add, _ = est(r[:, None], torch.ones(8, 1), index, _batch(texts), examples, objective="additive", lam=0.0)
    grpo, _ = get_estimator("grpo")(r[:, None], torch.ones(8, 1), index)
    assert torch.allclose(add, grpo, atol=1e-5)  # lam = 0: the additive objective is mean r, i.e. GRPO
    adds = get_task("addition").examples(8, seed=0)
    with pytest.raises(ValueError, match="countdown.*'numbers'"):
        est(r[:, None], torch.ones(8, 1), index, _batch(texts), adds)
    with pytest.raises(ValueError, match="subset size"):
        est(r[:, None], torch.ones(8, 1), index, _batch(texts), examples, subset_size=4)
    with pytest.raises(ValueError, match="objective"):
        est(r[:, None], torch.ones(8, 1), index, _batch(texts), examples, objective="max")


def test_registered_set_max_and_zero_groups():
    est = get_estimator("set_max")
    r = torch.tensor([0, 0, 0, 0, 1, 0, 1, 0], dtype=torch.float32)
    adv, _ = est(r[:, None], torch.ones(8, 1), torch.tensor([0] * 4 + [1] * 4))
    assert torch.all(adv[:4] == 0)  # all wrong: no signal
    assert adv[4, 0] > 0 and adv[5, 0] < 0 and torch.isclose(adv[4:, 0].std(), torch.tensor(1.0), atol=1e-4)
    raw, _ = est(r[:, None], torch.ones(8, 1), torch.tensor([0] * 4 + [1] * 4), normalize=False)
    assert torch.allclose(raw[4:, 0], _all(4, 2, r[None, 4:].double(), objective="max")[0].float(), atol=1e-6)


def test_bandit_instance_and_a_short_run():
    cfg = study.BanditConfig(steps=5)
    train, held, theta = study.make_strategy_bandit(cfg, 0)
    assert train.shape == (10, 6) and held.shape == (40, 6) and theta.shape == (6,)
    assert train[:, 0].sum() == 6 and (train[:, 1:].sum(0) < 6).all() and train.any(1).all()
    for arm in study.BANDIT_ARMS:
        out = study.train_strategy_bandit(arm, cfg, 0, every=5)
        assert out["curve"].shape == (2, len(study.KS)) and np.all(np.diff(out["pass"]) >= 0)
        assert 1 <= out["modes"] <= 6 and np.isclose(out["mass"][-1].sum(), 1.0)
    with pytest.raises(ValueError, match="arm"):
        study.train_strategy_bandit("PPO", cfg, 0)


def test_bandit_study_cell_alone_equals_the_grid_and_bad_arms_are_named():
    import json

    import rlcourse
    from rlcourse.studies import run_study

    s = study.bandit_study(rlcourse.profile("smoke"), seeds=2)
    res = run_study(s, jobs=1, cache=False)
    arm, seed = s.cells()[-1]  # a later cell: Poly-EPO on seed 1
    assert (arm, seed) == ("Poly-EPO", 1)
    assert res.metrics[(arm, seed)] == json.loads(json.dumps(study.run_bandit_cell(arm, seed, s.sizes)))
    assert set(res.verdicts()) == {"pass4", "pass16", "modes", "held", "control"}
    with pytest.raises(ValueError, match="set RL, f = max r"):
        study.run_bandit_cell("no such arm", 0, s.sizes)


def test_lm_study_cell_alone_equals_the_grid_and_bad_arms_are_named():
    import json

    import rlcourse
    from rlcourse.studies import run_study

    s = study.lm_study(rlcourse.profile("smoke"), seeds=2, steps=1)
    res = run_study(s, jobs=1, cache=False)
    arm, seed = s.cells()[-1]  # a later cell: Poly-EPO on seed 1
    assert res.metrics[(arm, seed)] == json.loads(json.dumps(study.run_lm_cell(arm, seed, s.sizes)))
    base = study.lm_base_study(rlcourse.profile("smoke"), steps=1)
    assert set(study.run_lm_base_cell(study.BASE, 0, base.sizes)) == {"pass", "distinct_correct", "modes_correct"}
    with pytest.raises(ValueError, match="Poly-EPO"):
        study.run_lm_cell("no such arm", 0, s.sizes)
    with pytest.raises(ValueError, match="base model"):
        study.run_lm_base_cell("GRPO", 0, base.sizes)
