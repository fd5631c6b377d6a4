"""The DReST chapter's language-model claims, run in the book profile over P.seeds (slow: `pytest -m claims`).

The verdicts come from rlcourse.studies.drest_lm.CLAIMS on the chapter's experiment.
"""
import pytest

import rlcourse
from rlcourse.studies.drest_lm import drest_lm_verdicts, run_drest_lm_experiment


@pytest.mark.claims
def test_drest_lm_verdicts():
    out = run_drest_lm_experiment(rlcourse.profile("book"))
    v = drest_lm_verdicts(out)
    # the book run (3 seeds) computed "inconclusive" for neutrality: the DReST LM is more neutral than
    # the default LM on every seed, but one seed stays lopsided, so the interval straddles the half-bit margin
    assert v["lm_neutral"].verdict == "inconclusive", v["lm_neutral"].sentence()
    assert all(d > m for d, m in zip(v["lm_neutral"].method_values, v["lm_neutral"].baseline_values))
    # the DReST LM's usefulness on held-out prompts exceeds 0.9 (computed: "holds")
    assert v["lm_useful"].verdict == "holds", v["lm_useful"].sentence()
    # both arms gained usefulness over the base model, which chooses at random
    S = {arm: {k: val[0] for k, val in s.items()} for arm, s in out["summary"].items()}
    assert min(S["drest"]["usefulness"], S["default"]["usefulness"]) > out["base"]["usefulness"] + 0.1
