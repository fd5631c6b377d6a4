"""The lab chapter's study (rlcourse.studies.lab): its cells stand alone."""
import pytest

import rlcourse
from rlcourse.studies import lab as LS
from rlcourse.studies.runner import run_study


def test_studies_cells_stand_alone():
    """A later cell of the grid, run with the others, equals the same cell run alone (wall seconds
    aside); a bad arm is refused with the arms named."""
    study = LS.pretraining_study(rlcourse.profile("smoke"))
    res = run_study(study, jobs=1, cache=False)
    arm, seed = study.cells()[-1]
    assert arm == "countdown"
    alone = LS.run_cell(arm, seed, dict(study.sizes))
    cell = res.metrics[(arm, seed)]
    assert cell.pop("seconds") > 0 and alone.pop("seconds") > 0
    assert cell == alone and len(cell["history"]) >= 2 and cell["history"][-1]["step"] == study.sizes["steps"]
    with pytest.raises(ValueError, match="the arms are .*'sort'.*'countdown'"):
        LS.run_cell("subtraction", 0, dict(study.sizes))
