"""Math of the test-time-scaling chapter: pass@k, best-of-k and maj@k estimators are unbiased
(checked by exact enumeration over all samples and by Monte Carlo), and the plug-in pass@k is not."""
import itertools
from math import comb

import numpy as np
import pytest

from rlcourse.metrics import best_of_k, maj_at_k, majority_vote, pass_at_k
from rlcourse.testtime import (best_of_k_curve, exact_best_of_k, exact_pass_at_k, expected_estimator,
                               maj_at_k_curve, naive_pass_at_k, pass_at_k_curve)


@pytest.mark.parametrize("n,p", [(5, 0.3), (10, 0.05), (8, 0.9)])
def test_pass_at_k_is_unbiased_by_enumeration(n, p):
    for k in range(1, n + 1):
        expected = sum(comb(n, c) * p**c * (1 - p) ** (n - c) * pass_at_k(n, c, k) for c in range(n + 1))
        assert expected == pytest.approx(exact_pass_at_k(p, k), abs=1e-12)


def test_pass_at_k_unbiased_by_monte_carlo_and_naive_is_biased():
    rng = np.random.default_rng(0)
    n, p, k, trials = 10, 0.15, 5, 20000
    correct = (rng.random((trials, n)) < p).astype(int)
    est = pass_at_k_curve(correct, [k])[0]
    truth = exact_pass_at_k(p, k)
    se = np.std([pass_at_k(n, int(c), k) for c in correct.sum(1)]) / np.sqrt(trials)
    assert abs(est - truth) < 4 * se
    naive = naive_pass_at_k(correct, [k])[0]
    assert truth - naive > 8 * se  # the plug-in estimate is clearly low
    # exact bias of the plug-in estimate, by enumeration: strictly negative for k > 1
    bias = sum(comb(n, c) * p**c * (1 - p) ** (n - c) * (1 - (1 - c / n) ** k) for c in range(n + 1)) - truth
    assert bias < -0.01


def test_pass_at_k_counts_subsets():
    """1 - C(n-c,k)/C(n,k) is the fraction of k-subsets with at least one correct sample."""
    correct = np.array([0, 1, 0, 0, 1, 0])
    for k in range(1, 7):
        frac = np.mean([correct[list(s)].any() for s in itertools.combinations(range(6), k)])
        assert pass_at_k(6, 2, k) == pytest.approx(frac)


OUTCOME_SCORES = np.array([0.9, 0.2, 0.5, -1.0])
OUTCOME_RIGHT = np.array([1.0, 0.0, 1.0, 0.0])
OUTCOME_PROBS = np.array([0.1, 0.4, 0.2, 0.3])


def test_exact_best_of_k_against_monte_carlo():
    rng = np.random.default_rng(1)
    for k in (1, 3, 6):
        draws = rng.choice(4, size=(40000, k), p=OUTCOME_PROBS)
        picks = draws[np.arange(len(draws)), OUTCOME_SCORES[draws].argmax(1)]
        vals = OUTCOME_RIGHT[picks]
        assert abs(vals.mean() - exact_best_of_k(OUTCOME_SCORES, OUTCOME_RIGHT, OUTCOME_PROBS, k)) < 4 * vals.std() / 200
    # k = 1 is the mean; a wrong formula (T_j^k only) would not sum to one
    assert exact_best_of_k(OUTCOME_SCORES, OUTCOME_RIGHT, OUTCOME_PROBS, 1) == pytest.approx(0.3)


@pytest.mark.parametrize("n", [3, 5])
def test_best_of_k_is_unbiased_by_enumeration(n):
    for k in range(1, n + 1):
        def estimator(seq):
            return best_of_k(OUTCOME_SCORES[seq], OUTCOME_RIGHT[seq], k)

        assert expected_estimator(estimator, OUTCOME_PROBS, n) == pytest.approx(
            exact_best_of_k(OUTCOME_SCORES, OUTCOME_RIGHT, OUTCOME_PROBS, k), abs=1e-12)


def test_best_of_k_equals_subset_average():
    rng = np.random.default_rng(2)
    s, c = rng.normal(size=7), rng.integers(0, 2, 7).astype(float)
    for k in range(1, 8):
        avg = np.mean([c[list(sub)][np.argmax(s[list(sub)])] for sub in itertools.combinations(range(7), k)])
        assert best_of_k(s, c, k) == pytest.approx(avg)


def exact_maj_at_k(answers_support, probs, reference, k):
    """maj@k of k iid draws, by enumerating all M**k ordered draws (ties: first to appear)."""
    total = 0.0
    for seq in itertools.product(range(len(probs)), repeat=k):
        vote = majority_vote([answers_support[i] for i in seq])
        total += float(np.prod(probs[list(seq)])) * (vote is not None and vote == reference)
    return total


def test_maj_at_k_is_unbiased_by_enumeration():
    support = [7, 8, None]  # 7 is right, 8 a common wrong answer, None unparseable
    probs = np.array([0.4, 0.35, 0.25])
    n = 5
    for k in (1, 2, 3, 4, 5):
        est = expected_estimator(lambda seq: maj_at_k([support[i] for i in seq], 7, k), probs, n)
        assert est == pytest.approx(exact_maj_at_k(support, probs, 7, k), abs=1e-12)


def test_curves_and_errors():
    correct = np.array([[1, 0, 0, 1], [0, 0, 0, 0]])
    np.testing.assert_allclose(pass_at_k_curve(correct, [1, 4]), [0.25, 0.5])
    np.testing.assert_allclose(best_of_k_curve(np.array([[3.0, 2, 1, 0], [0, 1, 2, 3]]), correct, [1, 4]),
                               [0.25, 0.5])
    answers = [[5, 5, 6, None], [1, 2, 2, 2]]
    np.testing.assert_allclose(maj_at_k_curve(answers, [5, 1], [1, 4]), [(0.5 + 0.25) / 2, 0.5])
    with pytest.raises(ValueError, match="k must be"):
        pass_at_k_curve(correct, [5])
    with pytest.raises(ValueError, match="0 and 1"):
        pass_at_k_curve(correct * 2, [1])
    with pytest.raises(ValueError, match="same"):
        best_of_k_curve(np.zeros((2, 3)), correct, [1])
    with pytest.raises(ValueError, match="references"):
        maj_at_k_curve(answers, [5], [1])
    with pytest.raises(ValueError, match="distinct"):
        exact_best_of_k([1, 1], [0, 1], [0.5, 0.5], 2)


def test_test_time_study_cells_stand_alone():
    """A later cell of the grid, run with the others, equals the same cell run alone (each cell loads
    the base model and seeds torch and numpy itself); a bad arm is named."""
    import rlcourse
    from rlcourse.studies import run_study
    from rlcourse.studies import test_time_scaling as study

    s = study.tts_study(rlcourse.profile("smoke"))
    res = run_study(s, jobs=1, cache=False)
    arm, seed = s.cells()[-1]
    assert arm == "GRPO"
    assert res.metrics[(arm, seed)] == study.run_cell(arm, seed, dict(s.sizes))
    with pytest.raises(ValueError, match="the arms are .*'GRPO'"):
        study.run_cell("no such arm", 0, dict(s.sizes))
