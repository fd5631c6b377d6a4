"""The Thinking Seeds chapter's claims, in the book profile (slow: `pytest -m claims`).

The same experiment functions, with the same arguments, as book/thinking_seeds.md: the exact bias
computation on the tabular three-token model (`bias_experiment`, `bias_verdict`) and the language-model
experiment on two-digit addition (`run_soup_experiment`, `soup_verdicts`: GRPO, sequence-level mixing
and Thinking Seeds over 3 paired seeds).

An earlier version of this experiment (3 seeds, percentile-bootstrap verdicts; 145 s) gave: the control
holds (GRPO pass@1 0.415 against the base model's 0.331); less clipping than sequence mixing holds (0.025
against 0.028); pass@1 against GRPO 0.446 vs 0.415, against sequence mixing 0.446 vs 0.429, effective
entropy 0.360 vs 0.354 and pass@16 0.948 vs 0.948 inconclusive; the tabular bias claim held (0.267
against 0.389 at lag 15 over 20 instances). The book run of 5 Dec 2026 (5 seeds, t intervals, chapter
224 s) gave the same verdicts: control holds +0.090 [0.063, 0.116]; less clipping holds -0.003
[-0.004, -0.002]; against GRPO +0.012 [-0.031, 0.055], against sequence mixing -0.004 [-0.043, 0.036],
pass@16 -0.003 [-0.064, 0.057] and entropy -0.001 [-0.015, 0.013] inconclusive; the tabular bias claim
holds -0.122 [-0.181, -0.063] over 20 instances.

What is asserted follows from the claims and the derivation, not from that run:
- the bias computation obeys its proposition (zero on-policy and with the prefix product, under the
  bound), and the one-token prefix is less biased than the whole sequence over 20 instances;
- the positive control holds (the protocol can see a training effect), and the four performance claims
  rest on it: each is "uninformative" exactly when the control did not hold;
- Thinking Seeds clips fewer tokens than sequence mixing, since its prefixes are shorter (fewer tokens
  carry off-policy ratios): a count, not a performance claim;
- every verdict is the one its t-interval gives.
The directions of the four performance effects are not asserted: at 3 seeds the t quantile is 4.3, and
nothing in the claims fixes what a run of this size must show; a "does not hold" would be reported by
the chapter's glued sentences as it is.
"""
import numpy as np
import pytest

import rlcourse
from rlcourse.methods.soup import T3
from rlcourse.studies.thinking_seeds import bias_experiment, bias_verdict, run_soup_experiment, soup_verdicts


@pytest.fixture(scope="module")
def P():
    return rlcourse.profile("book")


@pytest.mark.claims
def test_tabular_bias_follows_the_proposition(P):
    tab = bias_experiment(P)
    assert tab["instances"] == 20 and tab["bound_ok"]
    assert (tab["bias"][0] < 1e-12).all() and (tab["seq_bias"] < 1e-10).all()
    assert all((tab["bias"][c][:, 0] < 1e-12).all() for c in range(1, T3 + 1))
    assert bias_verdict(tab).holds


@pytest.mark.claims
def test_language_model_claims(P):
    res = run_soup_experiment(P)
    v = soup_verdicts(res)
    assert all(x.seeds == P.seeds for x in v.values())
    assert v["control"].holds, v["control"].sentence()
    assert v["clipping"].holds, v["clipping"].sentence()
    for name in ("vs-grpo", "vs-sequence", "entropy", "pass-at-k"):
        x = v[name]
        assert x.claim.control == v["control"].claim.key and x.control_verdict == "holds", x.sentence()
        expected = "holds" if x.low > 0 else "does not hold" if x.high <= 0 else "inconclusive"
        assert x.verdict == expected, x.sentence()
    # GRPO's tokens are all on-policy with one pass per batch: its clip fraction is exactly zero
    assert np.all(res["clipfrac"]["GRPO"] == 0.0)
    assert (res["bank_share"]["Thinking Seeds"].mean() < res["bank_share"]["sequence mixing"].mean())
