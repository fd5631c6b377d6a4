"""The claims of the P-GRPO and S-GRPO chapters, run in the book profile (slow: `-m claims`).

Each test runs the chapter's experiment and its verdict function. The first asserted verdicts were computed
by an earlier version of the experiments (3 paired seeds, 4 Dec 2026) under the earlier percentile
bootstrap, which at 3 seeds called "holds" whenever every seed cleared the margin. Under the t-interval
rule each verdict is pinned here with the run that computed it, and its history in a comment beside its
assert. Now (6 Dec 2026, 5 seeds; confirmed by the fresh-clone make claims of that day): P-GRPO above the
pooled normalisation holds, above GRPO per prompt holds (inconclusive on 5 Dec), the stale-history bias
holds; S-GRPO above GRPO holds, above SFT at its best rate inconclusive (does not hold on 5 Dec), forgetting
less than SFT holds (inconclusive on 5 Dec). The S-GRPO adaptation claim compares with SFT at the rate
choose_sft_lr picks on seeds from 10 on, which the 4 Dec run did not.
"""
import numpy as np
import pytest

import rlcourse


@pytest.mark.claims
def test_pgrpo_claims_book_profile():
    from rlcourse.studies.p_grpo import minority_mean_advantage, pgrpo_verdicts, run_pgrpo_experiment

    res = run_pgrpo_experiment(rlcourse.profile("book"))
    v = pgrpo_verdicts(res)
    for name, verdict in v.items():
        print(name, verdict.sentence())
    # P-GRPO's minority curve lies above the pooled normalisation's on every seed: the claim holds
    assert v["vs-pooled"].verdict == "holds"
    # and above GRPO per prompt (which never mixes users). At 3 seeds on the percentile bootstrap this
    # read "holds"; the book-profile run of 5 Dec 2026 at 5 seeds on the t interval computed
    # "inconclusive": +0.053 [-0.030, 0.136], p = 0.075, smallest detectable effect 0.111. The run of
    # 6 Dec 2026 on the code since (the experiment a study on the one runner, the decode engine changed in
    # its last bits) computed "holds": +0.070 [0.008, 0.131], p = 0.017. Two runs of one design on either
    # side of the rule's edge: the effect is near the smallest this many seeds can detect
    assert v["vs-grpo"].verdict == "holds", v["vs-grpo"].sentence()
    # the stale-history bias of the proposition: the minority's mean advantage is positive: holds
    assert v["stale"].verdict == "holds"
    assert np.all(minority_mean_advantage(res) > 0)
    # the experiment spreads difficulty within each preference group
    assert res["lengths"] == (3, 4, 5)


@pytest.mark.claims
def test_sgrpo_claims_book_profile():
    from rlcourse.studies.s_grpo import (choose_sft_lr, gains_and_forgetting, learning_summary, run_sgrpo_frontier,
                                         sgrpo_verdicts)

    prof = rlcourse.profile("book")
    choice = choose_sft_lr(prof)
    assert choice["seeds"] == list(range(10, 10 + prof.seeds))  # disjoint from the reported seeds 0..seeds-1
    res = run_sgrpo_frontier(prof)
    v = sgrpo_verdicts(res, sft_lr=choice["lr"])
    for name, verdict in v.items():
        print(name, verdict.sentence())
    print(gains_and_forgetting(res))
    assert res["base_p"] < 0.1  # a cold start: few sampled answers are right
    assert set(v) == {"vs-grpo", "vs-sft-gain", "forgetting"} and all(x.seeds == prof.seeds for x in v.values())
    # The budget (200 steps, RL lr 3e-4) was chosen on seeds 10-12 so that S-GRPO learns addition; on the
    # chapter's seeds it gained at least the threshold fixed before the run, so every verdict is backed
    learned = learning_summary(res, sft_lr=choice["lr"])
    assert learned["learned"]["S-GRPO"] and learned["weak"] == []
    # The verdicts of the book run (3 seeds, 4 Dec 2026, S-GRPO +0.10 on addition, GRPO -0.01), and of the
    # 5 Dec 2026 one (5 seeds, t intervals, chapter 677 s):
    # S-GRPO's area under the addition curve lies above GRPO's: holds (5 Dec: +0.045 [0.035, 0.055])
    assert v["vs-grpo"].verdict == "holds"
    # S-GRPO's final addition above SFT's at SFT's best rate: the earlier run (SFT at the RL rate, which
    # gained more than S-GRPO) computed "does not hold"; so does the book run of 5 Dec 2026 (5 seeds, t
    # intervals, SFT at the rate chosen on seeds 10-12): -0.086 [-0.147, -0.025]. The run of 6 Dec 2026
    # (the SFT rate now chosen on seeds 10-14, as many as the reported ones; the experiment a study on the
    # one runner) computed "inconclusive": -0.083 [-0.220, 0.054], p = 0.92, detectable 0.184
    assert v["vs-sft-gain"].verdict == "inconclusive", v["vs-sft-gain"].sentence()
    # at S-GRPO's gain, read off the SFT frontier, SFT forgets more sort than S-GRPO: "holds" at 3 seeds
    # on the bootstrap; the 5 Dec 2026 run computed "inconclusive", -0.020 [-0.497, 0.457] (the frontier
    # read at one seed's gain varies widely between seeds), smallest detectable effect 0.64; the 6 Dec
    # 2026 run "holds", +0.113 [0.003, 0.222], p = 0.023 (the SFT frontier read at S-GRPO's gain
    # gave 0.836 on every seed: the base model's whole sort accuracy, so SFT had lost all of it there, and
    # the chapter says so, glued as sg_sft_ceiling; the fresh-clone make claims of 6 Dec 2026 passed on these pins)
    assert v["forgetting"].verdict == "holds", v["forgetting"].sentence()
