"""SORL's claims in the book profile: the chapter's staleness experiment on the multi-turn code lock
(same function, same arguments).

What is asserted follows from the claims and the set-up, not from a recorded run: the positive control
that stale data hurt token-level GRPO must hold (else the comparison could not show anything); every
claim resting on a control reads "uninformative" exactly when its control did not hold; the others are
decided by their t-intervals; and the clip-rate claim, which Prop. sorl-variance makes mechanical on
this testbed (a turn's ratio averages four independent token log-ratios), must hold.

An earlier version of this experiment (5 seeds, stalenesses 0, 4, 8, percentile-bootstrap verdicts)
recorded SO-GRPO 0.999 against token-level GRPO 0.878 at L = 8 as "prevents collapse: holds", though
no arm collapsed. With the claims re-framed (see the chapter), a book run of this code on 2026-12-05
(t-intervals, 5 seeds) gave: control-staleness holds (0.998 fresh against 0.874 at L = 8, [0.062,
0.186]); control-collapse does not hold (token GRPO's relative drawdown 0.052, margin 0.5), so
prevents-collapse is uninformative; less-lost-to-clip holds (0.999 against 0.874, [0.064, 0.188]);
turn-ratio-alone holds (Turn-GRPO 0.999, [0.064, 0.188]); normaliser-adds inconclusive (-0.000,
[-0.000, 0.000]); lower-clip holds (0.210 against 0.375); lower-grad holds; on-policy-match holds.
"""
import pytest

import rlcourse
from rlcourse.studies import sorl as study


@pytest.fixture(scope="module")
def verdicts():
    P = rlcourse.profile("book")
    return study.staleness_verdicts(study.run_staleness_experiment(P))


@pytest.mark.claims
def test_control_staleness_hurts_token_level_grpo(verdicts):
    assert verdicts["control-staleness"].holds, verdicts["control-staleness"].sentence()


@pytest.mark.claims
def test_controls_gate_the_claims_that_rest_on_them(verdicts):
    for name, v in verdicts.items():
        if v.claim.control is None:
            continue
        control = verdicts[v.claim.control.split("/", 1)[1]]
        assert (v.verdict == "uninformative") == (not control.holds), v.sentence()


@pytest.mark.claims
def test_turn_ratio_clips_fewer_tokens(verdicts):
    assert verdicts["lower-clip"].holds, verdicts["lower-clip"].sentence()
