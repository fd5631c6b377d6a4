"""The PPO chapter's claims, in the book profile (slow: `make claims`).

The book-profile run made while writing the chapter (3 seeds, 545 s on a loaded 2-core machine) computed:
- the clip keeps ppo_kl below the unclipped arm's with four passes (0.036 vs 0.077): "holds";
- with four passes the clipped arm ends more accurate than the unclipped one (0.315 vs 0.036): "holds";
- four passes at the one-pass learning rate beat one pass: "does not hold" (0.315 vs 0.534);
- PPO + GAE lifts accuracy above the base model in 40 steps: "inconclusive" (0.540 vs 0.538; the
  one-pass GRPO arm did not rise above the base in that budget either).
This test asserts those verdicts.
"""
import pytest

import rlcourse
from rlcourse.methods.ppo_lab import ppo_verdicts, run_ppo_experiment


@pytest.mark.claims
def test_ppo_claims():
    v = ppo_verdicts(run_ppo_experiment(rlcourse.profile("book")))
    # the clip keeps the per-step KL below that of the unclipped arm
    assert v["kl"].verdict == "holds", v["kl"].sentence()
    # with four passes, the clipped arm ends more accurate than the unclipped arm
    assert v["clip-vs-none"].verdict == "holds", v["clip-vs-none"].sentence()
    # four passes at the one-pass learning rate do not beat one pass
    assert v["reuse"].verdict == "does not hold", v["reuse"].sentence()
    # PPO + GAE vs the base model after 40 steps: inconclusive, as the book run computed
    assert v["gae"].verdict == "inconclusive", v["gae"].sentence()
