"""Math of the reward-model chapter: the Bradley-Terry likelihood and its gradient, the per-prompt
shift invariance, label noise, best-of-N estimators and the Gaussian best-of-N closed form."""
import itertools
import math

import numpy as np
import pytest
import torch

from rlcourse.losses import bradley_terry_loss
from rlcourse.preferences import (best_of_n_curve, best_of_n_monte_carlo, best_of_n_weights, bt_preference_prob,
                                  expected_max_normal, gaussian_best_of_n, make_preference_pairs, pair_accuracy,
                                  parse_final_answer, true_reward, true_rewards)
from rlcourse.tasks import Example

EX = Example("47+85=", "132", "231|132")


def test_true_reward_is_graded():
    assert true_reward("231|132", EX) == 0.0
    assert true_reward("231|133", EX) == pytest.approx(-math.log10(2))
    assert true_reward("|141", EX) == pytest.approx(-1.0)
    assert true_reward("231|13x", EX) == pytest.approx(-3.0)
    assert true_reward("no bar", EX) == pytest.approx(-3.0)
    assert true_reward("|99999", EX) == pytest.approx(-3.0)  # capped
    assert parse_final_answer("1|2|-7") == -7 and parse_final_answer("12") is None
    np.testing.assert_allclose(true_rewards(["|132", "|131"], [EX, EX]), [0.0, -math.log10(2)])
    with pytest.raises(ValueError, match="no integer answer"):
        true_reward("|1", Example("x", "abc", ""))
    with pytest.raises(ValueError, match="completions"):
        true_rewards(["|1"], [EX, EX])
    with pytest.raises(TypeError):
        parse_final_answer(3)


def test_bradley_terry_gradient_closed_form_and_finite_differences():
    g = torch.Generator().manual_seed(0)
    rc = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    rr = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    loss = bradley_terry_loss(rc, rr)
    loss.backward()
    delta = (rc - rr).detach()
    closed = -torch.sigmoid(-delta) / 7  # dL/dr_chosen; dL/dr_rejected is its negative
    torch.testing.assert_close(rc.grad, closed)
    torch.testing.assert_close(rr.grad, -closed)
    h = 1e-6
    for i in range(7):
        e = torch.zeros(7, dtype=torch.float64)
        e[i] = h
        fd = (bradley_terry_loss(rc.detach() + e, rr.detach()) - bradley_terry_loss(rc.detach() - e, rr.detach())) / (2 * h)
        assert float(fd) == pytest.approx(float(closed[i]), abs=1e-8)
    # a wrong formula (sigmoid(+delta)) would fail
    assert not torch.allclose(rc.grad, -torch.sigmoid(delta) / 7)


def test_bradley_terry_is_invariant_to_per_prompt_shifts():
    g = torch.Generator().manual_seed(1)
    rc, rr = torch.randn(12, generator=g), torch.randn(12, generator=g)
    prompt = torch.arange(12) % 4
    c = torch.randn(4, generator=g) * 10
    torch.testing.assert_close(bradley_terry_loss(rc + c[prompt], rr + c[prompt]), bradley_terry_loss(rc, rr))
    # a shift that differs between the two answers of a pair does change it
    assert not torch.isclose(bradley_terry_loss(rc + 1.0, rr), bradley_terry_loss(rc, rr))


def test_bt_probability():
    a, b = np.array([0.0, 1.0, -2.0]), np.array([0.5, -1.0, -2.0])
    p = bt_preference_prob(a, b, beta=3.0)
    np.testing.assert_allclose(p, 1 / (1 + np.exp(-3.0 * (a - b))))
    np.testing.assert_allclose(p + bt_preference_prob(b, a, 3.0), 1.0)
    with pytest.raises(ValueError, match="beta"):
        bt_preference_prob(a, b, 0.0)
    with pytest.raises(ValueError, match="shape"):
        bt_preference_prob(a, b[:2])


def test_bt_maximum_likelihood_recovers_rewards_up_to_a_constant():
    """Fit free rewards of 5 items to Bradley-Terry labels: the differences come back, the level does not."""
    rng = np.random.default_rng(0)
    true = np.array([0.0, -0.3, -1.0, -1.5, -3.0])
    i, j = rng.integers(0, 5, (2, 8000))
    keep = i != j
    i, j = i[keep], j[keep]
    i_wins = rng.random(len(i)) < bt_preference_prob(true[i], true[j], 1.0)
    c, r = np.where(i_wins, i, j), np.where(i_wins, j, i)
    for start in (0.0, 7.0):  # two different starting levels
        theta = torch.full((5,), start, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([theta], max_iter=200, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = bradley_terry_loss(theta[torch.as_tensor(c)], theta[torch.as_tensor(r)])
            loss.backward()
            return loss

        opt.step(closure)
        est = theta.detach().numpy()
        np.testing.assert_allclose(est - est.mean(), true - true.mean(), atol=0.12)
        assert est.mean() == pytest.approx(start + (true - true.mean()).mean(), abs=0.5)  # level never moves


def test_preference_labels_follow_bradley_terry():
    rng = np.random.default_rng(0)
    P, d, beta = 4000, 0.3, 4.0
    rewards = np.tile([0.0, -d], (P, 1))
    texts = [["good", "bad"]] * P
    pairs, agrees = make_preference_pairs([f"p{i}" for i in range(P)], texts, rewards, 1, beta, rng)
    expected = 1 / (1 + math.exp(-beta * d))
    se = math.sqrt(expected * (1 - expected) / P)
    assert abs(agrees.mean() - expected) < 4 * se
    assert np.mean([p.chosen == "good" for p in pairs]) == pytest.approx(agrees.mean())
    pairs, agrees = make_preference_pairs(["a"], [["x", "y", "z"]], np.array([[0.0, 0.0, -1.0]]), 5, None, rng)
    assert agrees.all() and len(pairs) == 2  # the tie (x, y) is skipped
    with pytest.raises(ValueError, match="rewards"):
        make_preference_pairs(["a"], [["x"]], np.zeros((1, 2)), 1, None, rng)


def test_best_of_n_curve_matches_brute_force():
    rng = np.random.default_rng(3)
    proxy, true = rng.normal(size=(3, 7)), rng.normal(size=(3, 7))
    curve = best_of_n_curve(proxy, true, [1, 2, 3, 7])
    for idx, N in enumerate([1, 2, 3, 7]):
        brute_t, brute_p = [], []
        for row in range(3):
            subsets = list(itertools.combinations(range(7), N))
            picks = [max(s, key=lambda j: proxy[row, j]) for s in subsets]
            brute_t.append(np.mean([true[row, j] for j in picks]))
            brute_p.append(np.mean([proxy[row, j] for j in picks]))
        assert curve["true"][idx] == pytest.approx(np.mean(brute_t))
        assert curve["proxy"][idx] == pytest.approx(np.mean(brute_p))
    assert curve["true"][0] == pytest.approx(true.mean())
    assert curve["oracle"][-1] == pytest.approx(true.max(1).mean())
    np.testing.assert_allclose(best_of_n_weights(7, 3).sum(), 1.0)
    with pytest.raises(ValueError, match="N must be"):
        best_of_n_curve(proxy, true, [8])


def test_pair_accuracy():
    r = np.array([[0.0, -1.0, -2.0, -2.0]])
    assert pair_accuracy(None, None, ["a"], [["w", "x", "y", "z"]], r, proxy=r) == 1.0
    assert pair_accuracy(None, None, ["a"], [["w", "x", "y", "z"]], r, proxy=-r) == 0.0
    assert pair_accuracy(None, None, ["a"], [["w", "x", "y", "z"]], r, proxy=np.zeros_like(r)) == 0.5


def test_expected_max_normal_known_values():
    assert expected_max_normal(1) == pytest.approx(0.0, abs=1e-9)
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-7)
    assert expected_max_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-7)
    with pytest.raises(ValueError):
        expected_max_normal(0)


@pytest.mark.parametrize("N,sigma", [(4, 1.0), (16, 0.5), (64, 2.0)])
def test_gaussian_best_of_n_against_monte_carlo(N, sigma):
    closed = gaussian_best_of_n(N, sigma)
    mc = best_of_n_monte_carlo(N, 20000, np.random.default_rng(N), sigma=sigma)
    assert abs(mc["true"] - closed["true"]) < 4 * mc["true_se"]
    assert abs(mc["proxy"] - closed["proxy"]) < 4 * mc["proxy_se"]
    assert closed["gap"] == pytest.approx(closed["proxy"] - closed["true"])


def test_gaussian_gap_grows_with_n():
    gaps = [gaussian_best_of_n(N, 1.0)["gap"] for N in (1, 2, 4, 8, 16, 64)]
    assert gaps[0] == pytest.approx(0.0, abs=1e-9)
    assert np.all(np.diff(gaps) > 0)


def test_self_consistent():
    from rlcourse.preferences import self_consistent

    assert self_consistent("231|132") and self_consistent("82|28")
    assert not self_consistent("231|133") and not self_consistent("1|2|1") and not self_consistent("12")
    assert not self_consistent("|")


def test_reward_model_study_cells_stand_alone():
    """A later cell of the grid, run with the others, equals the same cell run alone (each cell loads
    the base model and seeds its samplers itself); a bad arm is named."""
    import rlcourse
    from rlcourse.studies import reward_models as study
    from rlcourse.studies import run_study

    s = study.rm_study(rlcourse.profile("smoke"))
    res = run_study(s, jobs=1, cache=False)
    arm, seed = s.cells()[-1]
    assert res.metrics[(arm, seed)] == study.run_cell(arm, seed, dict(s.sizes))
    with pytest.raises(ValueError, match="the arms are .*'Bradley-Terry RM'"):
        study.run_cell("no such arm", 0, dict(s.sizes))
