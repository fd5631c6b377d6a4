"""The ParetoSlider chapter's study (rlcourse.studies.paretoslider): its cells stand alone."""
from dataclasses import replace

import pytest

import rlcourse
from rlcourse.studies import paretoslider as PSS
from rlcourse.studies.runner import run_study


def test_studies_cells_stand_alone():
    """A later cell of each grid, run with the others, equals the same cell run alone; a bad arm is
    refused with the arms named."""
    prof = replace(rlcourse.profile("smoke"), toy_seeds=2)
    for study in (PSS.ring_study(prof), PSS.digits_study(prof)):
        res = run_study(study, jobs=1, cache=False)
        arm, seed = study.cells()[-1]
        assert seed == max(study.seeds)
        assert res.metrics[(arm, seed)] == PSS.run_cell(arm, seed, dict(study.sizes))
    assert PSS.ring_study(prof).seeds == (0, 1)
    with pytest.raises(ValueError, match="the arms are .*'conditioned late'.*'digits conditioned'"):
        PSS.run_cell("conditioned middle", 0, dict(PSS.ring_study(prof).sizes))


def test_equal_calls_arms_share_the_conditioned_models_reward_calls():
    """The five equal-calls fixed models together use as many reward calls as one conditioned model."""
    res = PSS.run_paretoslider_experiment(rlcourse.profile("smoke"), cache=False)
    assert res["fixed_eq_reward_calls"] <= res["cond_reward_calls"] < res["fixed_reward_calls"]
    assert res["fixed_J"].shape == (res["seeds"], 5, 2) and res["cond_J"].shape == (res["seeds"], 11, 2)
