"""The advantages chapter's claims, in the book profile (slow: `make claims`).

What held in the book run: every estimator lifts held-out greedy accuracy well above the base
model's (0.60 -> 0.85-0.89 in 200 steps). What did not: the 90% target for GRPO (0.85 in that run),
which the chapter reports from the run rather than asserting; see the chapter's note on tuning.
"""
import pytest

import rlcourse
from rlcourse.experiments import run_advantage_comparison


@pytest.mark.claims
def test_every_estimator_lifts_greedy_accuracy_well_above_the_base_model():
    res = run_advantage_comparison(rlcourse.profile("book"))
    for name, r in res.items():
        assert r["final_accuracy"] >= r["base_accuracy"] + 0.15, (name, r["base_accuracy"], r["final_accuracy"])
    assert res["grpo"]["final_accuracy"] >= 0.8
