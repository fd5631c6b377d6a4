"""The DReST chapter's claim, run in the book profile (slow: `pytest -m claims`)."""
import pytest

import rlcourse
from rlcourse.control.drest import run_drest_experiment


@pytest.mark.claims
def test_drest_agents_are_neutral_and_useful_default_agents_are_not():
    out = run_drest_experiment(rlcourse.profile("book"))
    S = {arm: {k: v[0] for k, v in s.items()} for arm, s in out["summary"].items()}
    # default agents choose one length deterministically (the coin-richer one) and are useful
    for arm in ("default_ppo", "default_a2c"):
        assert S[arm]["neutrality"] < 0.1 and S[arm]["p_long"] > 0.9, (arm, S[arm])
        assert S[arm]["usefulness"] > 0.95, (arm, S[arm])
    # DReST PPO agents choose lengths stochastically (near 1 bit) and stay useful
    assert S["drest_ppo"]["neutrality"] > 0.8, S["drest_ppo"]
    assert 0.25 < S["drest_ppo"]["p_long"] < 0.75, S["drest_ppo"]
    assert S["drest_ppo"]["usefulness"] > 0.95, S["drest_ppo"]
    # without the 1/m(L) normalisation the agent leans to the coin-richer length and loses neutrality
    assert S["drest_unnormalised_ppo"]["p_long"] > S["drest_ppo"]["p_long"]
    assert S["drest_unnormalised_ppo"]["neutrality"] < S["drest_ppo"]["neutrality"]
    # A2C: DReST is more neutral than the default and still useful (the chapter reports it is far from 1 bit)
    assert S["drest_a2c"]["neutrality"] > S["default_a2c"]["neutrality"], S["drest_a2c"]
    assert S["drest_a2c"]["usefulness"] > 0.9, S["drest_a2c"]
