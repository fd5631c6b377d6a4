"""The R2PO chapter's claims, in the book profile (slow: `pytest -m claims`).

The same experiment function, with the same arguments, as book/r2po.md: `run_lm_experiment` at the
profile's defaults (GRPO, R2PO with the released ratio, R2PO with the corrected ratio; P.seeds paired
seeds), decided by `lm_verdicts`.

What is asserted follows from the claims and the mechanism, not from a run's numbers:
- the mechanism itself: the head moves the training rollouts away from the policy (the sampled
  KL(mu || pi) of the R2PO arms' batches is positive on average, GRPO's is zero because its head never
  trains: up to float rounding between the sampling and the training forward pass);
- the diversity claim's direction: the paper's mechanism (a head trained on a rarity score, whose
  group sum is the number of distinct outcomes) should not make the head's rollouts *less* diverse
  than GRPO's, so that verdict must not be "does not hold";
- every verdict is computed over P.seeds seeds and is consistent with its interval. The accuracy and
  format claims may come out either way at this scale; the chapter's text is written for any verdict.

The book run of the chapter gave: see the report of the run recorded below.
"""
import numpy as np
import pytest

import rlcourse
from rlcourse.claims import decide
from rlcourse.methods import r2po


@pytest.fixture(scope="module")
def P():
    return rlcourse.profile("book")


@pytest.fixture(scope="module")
def run(P):
    out = r2po.run_lm_experiment(P)
    return out, r2po.lm_verdicts(out)


@pytest.mark.claims
def test_r2po_claims(P, run):
    out, v = run
    assert out["seeds"] == P.seeds >= 3
    kl = {arm: np.mean([np.mean([m["r2po_kl"] for m in r["history"]]) for r in rows])
          for arm, rows in out["arms"].items()}
    assert abs(kl["GRPO"]) < 1e-4
    assert kl["R2PO (released ratio)"] > 0 and kl["R2PO (corrected ratio)"] > 0
    assert v["diverse"].verdict != "does not hold", v["diverse"].sentence()
    for name, verdict in v.items():
        assert verdict.seeds == P.seeds, name
        c = verdict.claim  # the verdict is the rule's on its own interval
        assert decide(c.kind, c.margin, verdict.low, verdict.high, verdict.seeds) == verdict.verdict, name
