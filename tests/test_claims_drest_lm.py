"""The DReST chapter's language-model claims, run in the book profile over P.seeds (slow: `pytest -m claims`)."""
import pytest

import rlcourse
from rlcourse.methods.drest_lm import drest_lm_verdicts, run_drest_lm_experiment


@pytest.mark.claims
def test_drest_lm_is_neutral_and_useful():
    out = run_drest_lm_experiment(rlcourse.profile("book"))
    v = drest_lm_verdicts(out)
    # DReST LM more neutral than the default LM by more than half a bit, paired by seed
    assert v["lm_neutral"].verdict == "holds", v["lm_neutral"].sentence()
    # and its usefulness on held-out prompts exceeds 0.9
    assert v["lm_useful"].verdict == "holds", v["lm_useful"].sentence()
    # both arms gained usefulness over the base model, which chooses at random
    S = {arm: {k: val[0] for k, val in s.items()} for arm, s in out["summary"].items()}
    assert min(S["drest"]["usefulness"], S["default"]["usefulness"]) > out["base"]["usefulness"] + 0.1
