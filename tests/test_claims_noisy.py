"""The noisy-verifier chapter's claims, measured in the book profile (slow: `pytest -m claims`).

What the chapter reports at toy scale (50 GRPO steps on the tiny addition model, 3 seeds): noise slows
RL down in proportion to how much it lowers Youden's J, and at high symmetric noise the run ends
below where it started; a lenient verifier (false positives only) costs less than a symmetric one
at the same rate.
"""
import numpy as np
import pytest

import rlcourse
from rlcourse.methods.noisy import run_noisy_experiment


@pytest.mark.claims
def test_noisy_verifier_claims_book_profile():
    r = run_noisy_experiment(rlcourse.profile("book"))
    mean, rates = r["mean"], r["rates"]
    sym, len_ = r["structures"].index("symmetric"), r["structures"].index("lenient")
    i4 = rates.index(0.4)
    print("base", r["base_accuracy"], "\nmean", np.round(mean, 3), "\nci", np.round(r["ci"], 3),
          "\ndrop", np.round(r["drop_mean"], 3), "\ndrop ci", np.round(r["drop_ci"], 3), "\nseconds", r["seconds"])
    clean = mean[sym, 0]
    # 1. The clean run learns: every seed ends above the base model.
    assert np.all(r["accuracy"][sym, 0] > r["base_accuracy"])
    # 2. Noise costs accuracy: the noisiest symmetric verifier ends well below the clean run on
    #    every seed (paired), and below the mildest symmetric noise on average.
    assert np.all(r["accuracy"][sym, i4] < r["accuracy"][sym, 0] - 0.03)
    assert mean[sym, i4] < mean[sym, rates.index(0.1)]
    # 3. Structure matters: at rho = 0.4 the lenient verifier (J = 0.6) beats the symmetric one (J = 0.2).
    assert mean[len_, i4] > mean[sym, i4]
    # 4. The realised error rates are the configured ones (per-sample noise on ~0.4 base accuracy).
    assert abs(r["error_rate"][sym, i4].mean() - 0.4) < 0.03
    assert clean > r["base_accuracy"]
