"""The PoE-steering chapter's claims, measured in the book profile (slow: `pytest -m claims`).

Each assert is the verdict the chapter computes from the same claim objects (rlcourse.studies.poe_steering.CLAIMS)
on the same experiment functions, over the profile's toy seeds.
"""
import numpy as np
import pytest

import rlcourse
from rlcourse.studies.poe_steering import (poe_verdicts, run_balance_cells, run_poe_experiment,
                                           selector_prefers_random_prior)


@pytest.fixture(scope="module")
def runs():
    prof = rlcourse.profile("book")
    res = run_poe_experiment(prof)
    bal = run_balance_cells(prof)
    return res, bal, poe_verdicts(res, bal)


@pytest.mark.claims
def test_poe_anchoring_on_the_navigation_task(runs):
    res, _, v = runs
    # the paper's graceful degradation: under a random prior, PoE stays within 0.05 of the frozen expert.
    # The earlier percentile-bootstrap rule read "holds" from an interval [0, 0]; the Student-t rule reads a
    # comparison with no spread as "inconclusive". The fresh-clone make claims of 6 Dec 2026 (10 seeds):
    # PoE 1.000 against frozen 1.000 on every seed, so "inconclusive", and the chapter says why
    # (poe_anchor_reading): the expert row sits at the task's ceiling
    poe = np.asarray(res["cells"]["expert|random"]["per_seed"]["poe@0.5"])
    frozen = np.asarray(res["cells"]["expert|random"]["per_seed"]["frozen"])
    assert np.all(poe == frozen) and v["anchored"].verdict == "inconclusive", v["anchored"].sentence()
    # ... while additive and prior-only steering fall more than 0.10 below PoE (competent actors)
    assert v["additive_collapses"].verdict == "holds", v["additive_collapses"].sentence()
    assert v["prior_collapses"].verdict == "holds", v["prior_collapses"].sentence()


@pytest.mark.claims
def test_poe_expert_row_contradicts_the_papers_medium_expert_hurt(runs):
    res, _, v = runs
    # the chapter says plainly: our expert row is not HURT (the paper: medium-expert HURT 9/9). As a claim
    # over seeds the earlier rule read "does not hold" from [0, 0]; on 6 Dec 2026 (10 seeds) PoE and the
    # frozen expert both succeeded in 1.000 of the episodes under every prior: no spread, "inconclusive".
    # The episode-level labels below still find no HURT cell in the expert row
    assert v["expert_hurt"].verdict == "inconclusive", v["expert_hurt"].sentence()
    assert "HURT" not in {res["labels"]["poe"][f"expert|{p}"] for p in res["priors"]}
    # positive control: the same bootstrap does label a cell HURT (medium actor, degraded prior)
    assert res["labels"]["poe"]["medium|degraded"] == "HURT"


@pytest.mark.claims
def test_poe_kl_selector(runs):
    res, _, v = runs
    # the book run computed "does not hold": the selector's success is more than 0.05 below the
    # best grid alpha (mean over the 12 cells, paired by seed)
    assert v["kl_near_oracle"].verdict == "does not hold", v["kl_near_oracle"].sentence()
    # the selector picks a larger alpha for the random prior than for the good one for most actors
    assert len(selector_prefers_random_prior(res)) >= 3, selector_prefers_random_prior(res)


@pytest.mark.claims
def test_poe_mujoco_cell(runs):
    _, bal, v = runs
    # the LQR expert is competent and the cloned expert actor keeps most of it
    assert min(bal["reference"]["expert"]) > 5 * max(bal["reference"]["random"])
    assert sum(bal["score"]["expert|random"]["frozen"]) / bal["sizes"]["seeds"] > 50
    # under a random prior PoE stays anchored (within 10 points) and beats additive by > 10 points
    assert v["idp_anchored"].verdict == "holds", v["idp_anchored"].sentence()
    assert v["idp_additive_collapses"].verdict == "holds", v["idp_additive_collapses"].sentence()
