"""The FreshPER chapter's claims, in the book profile (slow: `pytest -m claims`).

The same experiment functions, with the same arguments, as book/freshper.md: the main FrozenLake run
with the authors' default buffer (no PER importance weights; standard PER with lazy priorities), the
weighted ablation (beta 0.4 -> 1), the planted map switch and the language-model run, decided by the
chapter's claim objects (`lake_verdicts`, `lm_verdict`).

What is asserted follows from the claims and the derivation, not from a recorded run: every verdict is
the one its t-interval gives, and the headline ("FreshPER beats on-policy") is "uninformative" exactly
when its positive control (PER beats on-policy) did not hold; the control and "PER degrades" are the
same comparison in opposite directions, so they cannot both hold; with the weights on, a replayed
success carries a small weight (Prop. fp-weights: (eps / (1 + eps))^(alpha beta) is 0.036 at beta = 0.4).

An earlier version of this experiment (weights on as the main protocol, refreshed PER, percentile
bootstrap) recorded "FreshPER beats on-policy: does not hold" (0.069 against 0.233). A book run of the
lake with this code on 2026-12-05 gave, without weights: PER 0.414, refreshed PER 0.408, FreshPER
0.406, uniform 0.290, on-policy 0.233; the control inconclusive (interval [-0.047, 0.411]), so the
headline uninformative; FreshPER against PER inconclusive ([-0.044, 0.027]).
"""
from dataclasses import replace

import numpy as np
import pytest

import rlcourse
from rlcourse.methods.freshper import ARMS, WEIGHTED_BETA, LakeConfig
from rlcourse.studies.freshper import lake_verdicts, lm_verdict, run_lake_experiment, run_lm_experiment


@pytest.fixture(scope="module")
def P():
    return rlcourse.profile("book")


def _consistent(v):
    for name, x in v.items():
        if x.claim.control is not None:
            assert (x.verdict == "uninformative") == (x.control_verdict != "holds"), x.sentence()
            continue
        if x.claim.kind == "greater":
            expected = "holds" if x.low > 0 else "does not hold" if x.high <= 0 else "inconclusive"
        else:
            expected = "holds" if x.high < 0 else "does not hold" if x.low >= 0 else "inconclusive"
        assert x.verdict == expected, x.sentence()
    if "per-degrades" in v and "replay-can-help" in v:
        assert not (v["per-degrades"].holds and v["replay-can-help"].holds)


@pytest.mark.claims
def test_freshper_main_and_weighted(P):
    out = run_lake_experiment(P)
    assert out["seeds"] == P.toy_seeds and out["config"].steps == 150 and out["config"].beta is None
    v = lake_verdicts(out)
    _consistent(v)
    weighted = run_lake_experiment(P, cfg=replace(out["config"], beta=WEIGHTED_BETA))
    vw = lake_verdicts(weighted, note="weighted")
    _consistent(vw)
    assert max(np.nanmean(weighted["success_weight"][k]) for k in ("PER", "FreshPER")) < 0.1


@pytest.mark.claims
def test_freshper_switch(P):
    switch = run_lake_experiment(P, arms={k: ARMS[k] for k in ("on-policy", "PER", "FreshPER")},
                                 cfg=LakeConfig(steps=150, switch_at=76))
    vs = lake_verdicts(switch, names=("decay-beats-per", "replay-can-help"), note="switch")
    _consistent(vs)


@pytest.mark.claims
def test_freshper_lm_runs_with_three_seeds(P):
    lm = run_lm_experiment(P)
    v = lm_verdict(lm)
    assert v.seeds == P.seeds and lm["steps"] == 25
    assert all(n > 0 for n in lm["buffer"]["FreshPER"])  # groups were stored (and, after step 1, replayed)
