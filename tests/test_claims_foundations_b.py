"""Claims of the reward-model and test-time-scaling chapters, in the book profile (slow: `pytest -m claims`)."""
import numpy as np
import pytest

import rlcourse
from rlcourse.studies.reward_models import rm_verdicts, run_reward_model_experiment
from rlcourse.studies.test_time_scaling import run_test_time_experiment, tts_verdicts


@pytest.mark.claims
def test_reward_model_best_of_n_overoptimises():
    r = run_reward_model_experiment(rlcourse.profile("book"))
    Ns = r["Ns"]
    assert Ns[0] == 1 and Ns[-1] == 64 and len(r["pair_acc"]) >= 3
    # the reward model learned something, but far less than its labels carry
    assert r["pair_acc"].mean() > 0.52
    assert r["pair_acc"].mean() < r["label_agreement"].mean()
    # Gao et al.'s direction, decided by the claim objects over the seeds: the proxy of the pick rises
    # from N = 1 to N = 64, and the true reward of the pick at N = 64 is below its N = 1 value
    v = rm_verdicts(r)
    assert v["proxy_rises"].verdict == "holds", v["proxy_rises"].sentence()
    assert v["falls"].verdict == "holds", v["falls"].sentence()
    # the correlated error that explains the fall: the favourites have the wrong number of digits more
    # often than the samples do, and those answers are worse than average
    assert r["top_wrong_len"].mean() > r["base_wrong_len"].mean()
    assert np.nanmean(r["true_wrong_len"]) < r["base_true"].mean()
    # the proxy's score of its own pick rises with N (every seed, every step of the grid)
    assert np.all(np.diff(r["proxy"], axis=1) > 0)
    # the true reward of the proxy's pick peaks at an intermediate N and ends below its N = 1 value:
    # over-optimisation, in the mean over seeds and in every seed
    true = r["true"].mean(0)
    assert 0 < int(true.argmax()) < len(Ns) - 1
    assert true[-1] < true[0] - 0.1
    assert np.all(r["true"][:, -1] < r["true"][:, 0])
    # the gap between proxy and true gains widens with N
    gap = (r["proxy"] - r["proxy"][:, :1]) - (r["true"] - r["true"][:, :1])
    assert gap.mean(0)[-1] > gap.mean(0)[len(Ns) // 2] > 0
    # not a formatting exploit: the favourites are malformed less often than the samples are
    assert r["top_malformed"].mean() <= r["base_malformed"].mean()
    # the right answer is there: selection by the true reward keeps improving
    assert np.all(np.diff(r["oracle"].mean(0)) > 0) and r["acc_oracle"].mean(0)[-1] > 0.9


@pytest.mark.claims
def test_rl_raises_pass1_and_maj_more_than_pass_at_large_k():
    r = run_test_time_experiment(rlcourse.profile("book"))
    base, rl = r["base"], r["rl"]
    assert len(rl) >= 3
    v = tts_verdicts(r)
    # Yue et al.'s direction, decided by the claim objects over the GRPO seeds: RL raises pass@1, and its
    # pass@k gain is smaller at k = n than at k = 1
    assert v["pass1"].verdict == "holds", v["pass1"].sentence()
    assert v["gain_shrinks"].verdict == "holds", v["gain_shrinks"].sentence()
    # best-of-k by the noisy reward: "recovers most" means RL's lead at k = n is below half its lead at
    # k = 1 (the claim's own threshold, no slack added)
    assert v["bok"].verdict == "holds", v["bok"].sentence()
    # "comparable within 2 points at k = n": the book run (3 seeds, 2026-12-01) computed "inconclusive"
    # (RL 0.971 vs base 0.953, interval [0.008, 0.023] of the difference straddles the margin 0.02)
    assert v["large_k"].verdict == "inconclusive", v["large_k"].sentence()
    # (and again on 4 Dec, a fresh machine: -0.016, [-0.031, 0.008]). Its control, the base model against
    # fresh samples of itself, is comparable by construction, so the rule must not call it "does not hold";
    # whether it resolves 2 points depends on the sampled draws: inconclusive on 2026-12-01 (-0.013,
    # [-0.023, -0.008]), holds on 4 Dec (-0.008, [-0.016, 0.000]). This test used to assert the first run's
    # "inconclusive", which the second run contradicted: a verdict, not the truth the control is built on.
    assert v["control"].verdict != "does not hold", v["control"].sentence()
    # RL raises maj@k at the largest k (the mode moved)
    mean_maj = np.mean([x["maj"] for x in rl], axis=0)
    assert mean_maj[-1] > base["maj"][-1]
