"""The PoE-steering chapter's claims, measured in the book profile (slow: `pytest -m claims`)."""
import pytest

import rlcourse
from rlcourse.control.poe import run_poe_experiment


@pytest.mark.claims
def test_poe_claims_book_profile():
    r = run_poe_experiment(rlcourse.profile("book"))
    c = r["cells"]
    i = r["alphas"].index(0.5)
    # 1. Under a random prior, PoE stays near every competent actor; additive and prior-only collapse.
    for actor in ("expert", "medium", "mixed"):
        cell = c[f"{actor}|random"]
        assert cell["poe"][i] > cell["additive"][i] + 0.1, actor
        assert cell["poe"][i] > cell["prior"] + 0.3, actor
    assert c["expert|random"]["poe"][i] >= c["expert|random"]["frozen"] - 0.05
    # 2. A precise (expert) actor anchors PoE under every prior, at every alpha < 0.9;
    #    additive steering with a degraded prior does not survive alpha = 0.5.
    for prior in r["priors"]:
        assert min(c[f"expert|{prior}"]["poe"][:4]) >= c[f"expert|{prior}"]["frozen"] - 0.05, prior
    assert c["expert|degraded"]["additive"][i] < c["expert|degraded"]["frozen"] - 0.3
    # 3. With a good prior, composition helps the weaker actors.
    for actor in ("medium", "mixed", "random"):
        assert r["labels"]["poe"][f"{actor}|good"] == "HELP", actor
    # 4. The chapter's honest caveat: a degraded prior that is about as confident as a medium
    #    actor hurts PoE too (anchoring is relative to the actor's precision).
    assert r["labels"]["poe"]["medium|degraded"] == "HURT"
    # 5. Over the 12 cells, PoE is hurt in fewer cells than additive and prior-only steering.
    assert r["tally"]["poe"]["HURT"] < r["tally"]["additive"]["HURT"]
    assert r["tally"]["poe"]["HURT"] < r["tally"]["prior"]["HURT"]
    assert sum(r["tally"]["poe"].values()) == 12
