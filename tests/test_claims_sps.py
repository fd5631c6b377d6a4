"""The SPS chapter's claims, in the book profile (slow: `pytest -m claims`).

The same experiment functions, with the same arguments, as book/sps.md: the shared-strategy bandit
(`run_bandit_experiment`, decided by `bandit_verdicts`) and the tiny-LM run on countdown
(`run_lm_experiment`, `lm_verdicts`), at the profile's defaults.

What is asserted follows from the claims and from the derivation, not from a run's numbers:
- the bandit shows the squeeze the chapter derives (Proposition "a shared strategy squeezes out the
  minority's prompts"): GRPO's held-out pass@16 falls by more than the claim's 0.02 from step 0 (the
  verdict holds), while its pass@1 rises; this is the positive control of the pass@k claim;
- SPS's IRL phases keep more of the minority strategy than GRPO: its final pass@16 is not below
  GRPO's, and its mean pi(s2) is above GRPO's on every seed (the IRL reward's fixed point gives s2 a
  share c2 > 0, GRPO's gives 0);
- every verdict is computed over the profile's seeds and is consistent with its numbers (a "holds"
  for a greater-claim has an interval above the margin, and so on); the language-model verdicts are
  not asserted in either direction: the chapter's text is written for any outcome.

BOOK_RUN_PLACEHOLDER
"""
import numpy as np
import pytest

import rlcourse
from rlcourse.methods import sps


def _consistent(v):
    c = v.claim
    if v.verdict == "holds":
        assert {"greater": v.low > c.margin, "less": v.high < -c.margin,
                "equivalent": -c.margin <= v.low and v.high <= c.margin}[c.kind]
    assert v.seeds >= 3


@pytest.mark.claims
def test_bandit_claims():
    P = rlcourse.profile()
    out = sps.run_bandit_experiment(P)
    v = sps.bandit_verdicts(out)
    assert out["seeds"] == P.toy_seeds
    assert v["squeeze"].holds
    g, s = out["runs"]["GRPO"], out["runs"]["SPS"]
    assert all(r["pass1"][-1] > r["pass1"][0] + 0.2 for r in g)
    assert np.mean([r["passk"][-1] for r in s]) >= np.mean([r["passk"][-1] for r in g])
    assert all(a["pi2"][-1] > b["pi2"][-1] for a, b in zip(s, g))
    for verdict in v.values():
        _consistent(verdict)


@pytest.mark.claims
def test_lm_claims():
    P = rlcourse.profile()
    out = sps.run_lm_experiment(P)
    v = sps.lm_verdicts(out)
    assert out["seeds"] == P.seeds and all(d > 0 for d in out["demos"])
    for verdict in v.values():
        _consistent(verdict)
