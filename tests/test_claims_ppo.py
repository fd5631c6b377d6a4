"""The PPO chapter's claims, in the book profile (slow: `make claims`).

A book-profile run of the three GRPO arms on seeds 0 and 1 (written while making the chapter) gave:
mean ppo_kl 0.012 with the clip against 0.020 without it (4 passes), final greedy accuracy 0.520 with
the clip against 0.330 without it, and 0.520 for four passes against 0.568 for one pass. So: the clip
keeps ppo_kl below the unclipped arm's ("holds"), the clipped four-pass arm ends more accurate than the
unclipped one ("holds"), and four passes at the one-pass learning rate do not beat one pass (not
"holds"). PPO + GAE must lift accuracy above the base model ("holds"); its book run was not finished
when this test was written.
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
    assert v["reuse"].verdict != "holds", v["reuse"].sentence()
    # PPO + GAE ends above the base model
    assert v["gae"].verdict == "holds", v["gae"].sentence()
