import itertools
from math import comb

import numpy as np
import pytest
import torch

from rlcourse.metrics import best_of_k, entropy_from_logits, explained_variance, maj_at_k, majority_vote, pass_at_k


@pytest.mark.parametrize("n,c,k", [(5, 2, 1), (5, 2, 3), (8, 0, 4), (8, 8, 1), (10, 3, 7), (6, 5, 2)])
def test_pass_at_k_against_enumeration(n, c, k):
    correct = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    enum = np.mean([any(correct[i] for i in s) for s in subsets])
    assert pass_at_k(n, c, k) == pytest.approx(enum)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_pass_at_k_bad_input():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 0)


def test_best_of_k_against_enumeration():
    rng = np.random.default_rng(0)
    scores, correct = rng.normal(size=7), rng.integers(0, 2, size=7)
    for k in range(1, 8):
        enum = np.mean([correct[list(s)][np.argmax(scores[list(s)])] for s in itertools.combinations(range(7), k)])
        assert best_of_k(scores, correct, k) == pytest.approx(enum)


def test_majority_vote_and_maj_at_k():
    assert majority_vote(["3", "4", "4", "3", "5"]) == "3"  # tie: first seen
    answers = ["7", "7", "9", "7", "9", None]
    k = 3
    enum = np.mean([majority_vote([answers[i] for i in s]) == "7" for s in itertools.combinations(range(6), k)])
    assert maj_at_k(answers, "7", k) == pytest.approx(enum)
    mc = maj_at_k(answers * 4, "7", 9, max_subsets=3000, rng=np.random.default_rng(0))
    assert comb(24, 9) > 3000 and 0.5 < mc <= 1.0


def test_entropy_and_explained_variance():
    assert entropy_from_logits(torch.zeros(4)).item() == pytest.approx(np.log(4), rel=1e-6)
    r = torch.randn(100)
    assert explained_variance(r, r) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(100) + r.mean(), r) == pytest.approx(0.0, abs=1e-6)
    assert explained_variance(-r, r) < -1


def test_mean_pass_at_k_averages_the_unbiased_estimator():
    from rlcourse.metrics import mean_pass_at_k
    correct = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    out = mean_pass_at_k(correct, [1, 2, 4])
    assert out[1] == pytest.approx((0.25 + 0.5 + 0) / 3)
    assert out[2] == pytest.approx((pass_at_k(4, 1, 2) + pass_at_k(4, 2, 2)) / 3)
    assert out[4] == pytest.approx(2 / 3)
    # Monte Carlo: drawing k of n without replacement, the chance one is correct
    rng = np.random.default_rng(0)
    draws = np.mean([[correct[p, rng.choice(4, 2, replace=False)].max() for p in range(3)] for _ in range(20000)])
    assert draws == pytest.approx(out[2], abs=4 * 0.5 / np.sqrt(20000 * 3))
    with pytest.raises(ValueError, match="prompts, samples"):
        mean_pass_at_k(np.ones(4), [1])
    with pytest.raises(ValueError, match="0/1"):
        mean_pass_at_k(np.full((2, 2), 0.5), [1])
    with pytest.raises(ValueError, match="1 <= k <= n"):
        mean_pass_at_k(correct, [5])


def test_diversity_counts_and_entropy():
    from rlcourse.metrics import distinct_correct, distinct_count, empirical_entropy, frac_mixed_groups, modes_above
    items = ["a", "b", "a", "c", "a", "b", "d", "a"]
    assert distinct_count(items) == 4
    assert distinct_correct(items, [1, 0, 1, 1, 0, 0, 0, 0]) == 2
    assert empirical_entropy(["x"] * 5) == 0.0
    assert empirical_entropy(list("abcd")) == pytest.approx(np.log(4))
    p = np.array([4, 2, 1, 1]) / 8
    assert empirical_entropy(items) == pytest.approx(-(p * np.log(p)).sum())
    assert modes_above(items, 0.2) == 2 and modes_above(items, 0.0) == 4
    with pytest.raises(ValueError, match="correctness flags"):
        distinct_correct(items, [1])
    with pytest.raises(ValueError, match="threshold"):
        modes_above(items, 1.5)
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert frac_mixed_groups(scores, 2) == pytest.approx(1 / 3)
    assert frac_mixed_groups(scores, 3) == 1.0  # [1, 1, 0] and [1, 0, 0] both mixed
    with pytest.raises(ValueError, match="divisible"):
        frac_mixed_groups(scores, 4)
