"""The DReST chapter's language-model claim, run in the book profile (slow: `pytest -m claims`)."""
import pytest

import rlcourse
from rlcourse.methods.drest_lm import run_drest_lm_experiment


@pytest.mark.claims
def test_drest_lm_is_neutral_and_useful_the_default_lm_is_not_neutral():
    out = run_drest_lm_experiment(rlcourse.profile("book"))
    S = {arm: {k: v[0] for k, v in s.items()} for arm, s in out["summary"].items()}
    base = out["base"]
    # the default agent goes for the coin-richer long options, deterministically, and plays them well
    assert S["default"]["p_long"] > 0.95 and S["default"]["neutrality"] < 0.1, S["default"]
    assert S["default"]["usefulness"] > 0.95, S["default"]
    # the DReST agent mixes the two lengths (near 1 bit) and picks the best option of each length
    assert S["drest"]["neutrality"] > 0.9 and 0.3 < S["drest"]["p_long"] < 0.7, S["drest"]
    assert S["drest"]["usefulness"] > 0.95, S["drest"]
    # both arms gained usefulness over the base model, which chooses at random
    assert min(S["drest"]["usefulness"], S["default"]["usefulness"]) > base["usefulness"] + 0.1, base
    # and every DReST seed is more neutral than every default seed
    assert min(r["final"]["neutrality"] for r in out["runs"]["drest"]) > \
        max(r["final"]["neutrality"] for r in out["runs"]["default"]) + 0.5
