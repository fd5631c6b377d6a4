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
