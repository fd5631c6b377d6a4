"""SORL's claims in the book profile: the chapter's staleness experiment on the multi-turn code lock
(same function, same arguments), with the directions the claims state.

A book run (5 seeds per arm, stalenesses 0, 4, 8) gave "holds" for all five: return at L = 8, SO-GRPO
0.999 against token-level GRPO 0.878 (interval of the difference [0.093, 0.165]); share of
out-of-range ratios 0.210 against 0.376; gradient norm 0.007 against 0.020; fresh data 1.000 against
0.998 (within 0.05); control, token-level GRPO at L = 0 against L = 8, 0.998 against 0.878; and this
test passed in the book profile. The thresholds follow from the claims, not from that run: SO-GRPO's
return above token-level GRPO's on the stalest data (margin 0), its share of out-of-range ratios and
its gradient norm below GRPO's, its return within 0.05 of GRPO's on fresh data, and the control
(stale data hurt token-level GRPO) holding.
"""
import pytest

import rlcourse
from rlcourse.methods import sorl


@pytest.fixture(scope="module")
def verdicts():
    P = rlcourse.profile("book")
    return sorl.staleness_verdicts(sorl.run_staleness_experiment(P))


@pytest.mark.claims
def test_control_staleness_hurts_token_level_grpo(verdicts):
    assert verdicts["control-staleness"].holds, verdicts["control-staleness"].sentence()


@pytest.mark.claims
@pytest.mark.parametrize("name", ["stable-return", "lower-clip", "lower-grad"])
def test_sorl_is_more_stable_than_token_level_grpo_on_stale_data(verdicts, name):
    assert verdicts[name].holds, verdicts[name].sentence()


@pytest.mark.claims
def test_sorl_matches_token_level_grpo_on_fresh_data(verdicts):
    v = verdicts["on-policy-match"]
    assert v.holds, v.sentence()
