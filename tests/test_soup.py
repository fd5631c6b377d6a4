"""Thinking Seeds (SOUP): the exact gradient bias of token-level ratios on the tabular three-token
model (zero at lag 0, zero with the full prefix product, below the proposition's bound), the exact
expectation against a Monte Carlo run of the loop's own policy loss, and the claims' plumbing."""
import numpy as np
import pytest

import rlcourse
from rlcourse.rollout import SAMPLERS
from rlcourse.methods.soup import (SEQS, N_CTX, V, ascent_trajectory, bias_bound, expected_gradient,
                                   monte_carlo_gradient, token_probs)
from rlcourse.studies import thinking_seeds as study
from rlcourse.studies.runner import run_study
from rlcourse.studies.thinking_seeds import bias_experiment, bias_verdict, soup_verdicts


@pytest.fixture(scope="module")
def instance():
    reward = np.random.default_rng(7).random(len(SEQS))
    return reward, ascent_trajectory(reward, 20, 2.0, seed=3)


def test_sequence_probabilities_sum_to_one(instance):
    _, traj = instance
    for theta in traj[[0, -1]]:
        assert abs(token_probs(theta).prod(1).sum() - 1) < 1e-12


def test_on_policy_expectation_is_the_gradient(instance):
    """cut 0 gives grad J, checked against central finite differences of J = sum_y pi(y) R(y)."""
    reward, traj = instance
    theta = traj[5]
    g = expected_gradient(theta, theta, reward, 0)
    J = lambda th: float((token_probs(th).prod(1) * reward).sum())  # noqa: E731
    fd = np.zeros_like(theta)
    for c in range(N_CTX):
        for v in range(V):
            e = np.zeros_like(theta)
            e[c, v] = 1e-6
            fd[c, v] = (J(theta + e) - J(theta - e)) / 2e-6
    assert np.abs(fd - g).max() < 1e-8


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_bias_is_zero_at_lag_zero_and_with_the_prefix_product(instance, cut):
    reward, traj = instance
    cur = traj[-1]
    g = expected_gradient(cur, cur, reward, 0)
    assert np.abs(expected_gradient(cur, cur, reward, cut) - g).max() < 1e-14  # lag 0: pi_hist = pi_theta
    for lag in (1, 5, 20):
        hist = traj[-1 - lag]
        assert np.abs(expected_gradient(cur, hist, reward, cut, "sequence") - g).max() < 1e-12
        err = np.linalg.norm(expected_gradient(cur, hist, reward, cut) - g)
        assert err > 1e-6  # the token-level ratios alone are biased off-policy
        assert err <= bias_bound(cur, hist, reward, cut)


def test_exact_expectation_matches_the_loss_by_monte_carlo(instance):
    reward, traj = instance
    cur, hist = traj[-1], traj[-11]
    for cut in (1, 3):
        exact = expected_gradient(cur, hist, reward, cut)
        mc, se = monte_carlo_gradient(cur, hist, reward, cut, n=20_000, seed=cut)
        # 20,000 samples: each entry within 5 standard errors (a false alarm has probability < 1e-5 per entry)
        assert (np.abs(mc - exact) <= 5 * se + 1e-12).all()


def test_bad_input_is_refused(instance):
    reward, traj = instance
    with pytest.raises(ValueError, match="cut"):
        expected_gradient(traj[0], traj[0], reward, 4)
    with pytest.raises(ValueError, match="weighting"):
        expected_gradient(traj[0], traj[0], reward, 1, "turn")
    with pytest.raises(ValueError, match="reward"):
        expected_gradient(traj[0], traj[0], reward[:5], 1)
    with pytest.raises(ValueError, match="theta"):
        token_probs(np.zeros((3, 3)))


def test_bias_experiment_smoke():
    res = bias_experiment(rlcourse.profile("smoke"))
    assert res["bound_ok"] and (res["bias"][0] < 1e-12).all() and (res["seq_bias"] < 1e-10).all()
    assert (res["bias"][1][:, 0] < 1e-12).all()  # lag 0
    v = bias_verdict(res)
    assert v.seeds == res["instances"]


def test_samplers_are_registered():
    assert "soup_prefix" in SAMPLERS and "bank_sequence_mix" in SAMPLERS


def test_verdicts_on_a_synthetic_run():
    N, S = 3, 8
    rng = np.random.default_rng(0)
    arms = list(study.ARMS)
    res = {"ks": [1, 2, 4], "seconds": 1.0, "seeds": N, "base_passk": np.array([0.3, 0.4, 0.5]),
           "passk": {a: np.array([[0.4, 0.5, 0.6]] * N) + 0.1 * i + 0.01 * rng.random((N, 3))
                     for i, a in enumerate(arms)},
           "held_entropy": {a: rng.random(N) for a in arms}, "clipfrac": {a: rng.random((N, S)) for a in arms}}
    v = soup_verdicts(res)
    assert set(v) == {"vs-grpo", "vs-sequence", "entropy", "clipping", "pass-at-k", "control"}
    assert v["vs-grpo"].holds and v["vs-sequence"].holds and v["control"].holds
    assert v["vs-grpo"].effect == pytest.approx(0.2, abs=0.02)


def test_soup_study_cells_stand_alone():
    """A later cell of the grid, run with the others, equals the same cell run alone (each cell loads
    the base model and seeds torch itself); a bad arm is named."""
    s = study.soup_study(rlcourse.profile("smoke"))
    res = run_study(s, jobs=1, cache=False)
    arm, seed = s.cells()[-1]
    assert arm == "Thinking Seeds"
    assert res.metrics[(arm, seed)] == study.run_cell(arm, seed, dict(s.sizes))
    with pytest.raises(ValueError, match="the arms are .*'GRPO'"):
        study.run_cell("no such arm", 0, dict(s.sizes))
