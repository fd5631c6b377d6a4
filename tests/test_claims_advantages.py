"""The advantages chapter's claim, in the book profile (slow: `make claims`)."""
import pytest

import rlcourse
from rlcourse.experiments import run_advantage_comparison


@pytest.mark.claims
def test_grpo_reaches_90_percent_and_baselines_help():
    res = run_advantage_comparison(rlcourse.profile("book"))
    grpo, rloo, reinforce = res["grpo"], res["rloo"], res["reinforce"]
    assert grpo["final_accuracy"] >= 0.9, grpo["final_accuracy"]
    assert grpo["final_accuracy"] > grpo["base_accuracy"] + 0.2
    assert max(grpo["final_accuracy"], rloo["final_accuracy"]) > reinforce["final_accuracy"]
