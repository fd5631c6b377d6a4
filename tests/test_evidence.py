"""rlcourse.claims: decision rules, intervals, the exact test, and the ledger round trip."""
import itertools

import numpy as np
import pytest

from rlcourse.claims import Claim, Verdict, decide, evaluate, ledger_markdown, paired_bootstrap, read_ledger, \
    record, sign_flip_p_value


def claim(**kw):
    base = dict(key="demo/x", paper="P", statement="s", source="abstract", setting="toy", metric="m",
                method="A", baseline="B")
    base.update(kw)
    return Claim(**base)


def test_decision_table():
    assert decide("greater", 0.0, 0.1, 0.3, 5) == "holds"
    assert decide("greater", 0.0, -0.3, -0.1, 5) == "does not hold"
    assert decide("greater", 0.0, -0.1, 0.3, 5) == "inconclusive"
    assert decide("greater", 0.2, 0.1, 0.3, 5) == "inconclusive"  # positive but maybe below the margin
    assert decide("greater", 0.2, 0.05, 0.15, 5) == "does not hold"  # surely below the margin
    assert decide("less", 0.0, -0.3, -0.1, 5) == "holds"
    assert decide("less", 0.0, 0.0, 0.2, 5) == "does not hold"
    assert decide("equivalent", 0.02, -0.01, 0.015, 5) == "holds"
    assert decide("equivalent", 0.02, 0.03, 0.05, 5) == "does not hold"
    assert decide("equivalent", 0.02, -0.01, 0.05, 5) == "inconclusive"
    assert decide("greater", 0.0, 1.0, 2.0, 1) == "inconclusive"  # one seed has no interval
    with pytest.raises(ValueError, match="kind"):
        decide("bigger", 0.0, 0, 1, 5)


def test_sign_flip_is_exact():
    d = np.array([0.3, -0.1, 0.2, 0.4])
    # enumerate the 16 sign patterns by hand
    obs = abs(d.mean())
    count = sum(abs((np.array(s) * d).mean()) >= obs - 1e-12 for s in itertools.product((1, -1), repeat=4))
    assert sign_flip_p_value(d) == pytest.approx(count / 16)
    # all positive: the smallest attainable p-value, 2 / 2^n
    assert sign_flip_p_value([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2 / 32)


def test_bootstrap_covers_the_mean_at_the_nominal_rate():
    # Monte Carlo: with 20 normal seeds the 95% percentile interval covers the true mean ~93-96% of the time
    rng = np.random.default_rng(0)
    hits = 0
    trials = 300
    for t in range(trials):
        x = rng.normal(0.5, 1.0, size=20)
        lo, hi = paired_bootstrap(x, n_boot=2000, seed=t)
        hits += lo <= 0.5 <= hi
    assert 0.88 <= hits / trials <= 0.99


def test_evaluate_pairs_seeds_and_checks_input():
    c = claim(kind="greater", margin=0.0)
    v = evaluate(c, [0.8, 0.82, 0.79, 0.85, 0.81], [0.6, 0.61, 0.58, 0.62, 0.6])
    assert v.verdict == "holds" and v.seeds == 5 and v.effect == pytest.approx(0.212)
    assert v.low > 0 and "holds" in v.sentence() and "5 seeds" in v.sentence()
    # pairing matters: a common seed effect cancels in the differences
    shared = np.array([0.0, 0.3, -0.3, 0.6, -0.6])
    v2 = evaluate(c, 0.5 + shared + 0.05, 0.5 + shared)
    assert v2.verdict == "holds"
    with pytest.raises(ValueError, match="one of each per seed"):
        evaluate(c, [1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="pass baseline_values"):
        evaluate(c, [1, 2, 3])
    with pytest.raises(ValueError, match="non-finite"):
        evaluate(c, [1, float("nan")], [1, 2])
    one = evaluate(c, [0.9], [0.1])
    assert one.verdict == "inconclusive" and "one seed" in one.sentence()


def test_reference_claims_and_bad_claims():
    c = claim(key="demo/ninety", baseline=None, reference=0.9, kind="greater")
    v = evaluate(c, [0.93, 0.95, 0.94])
    assert v.holds and v.baseline_mean == 0.9
    with pytest.raises(ValueError, match="baseline arm or a reference"):
        claim(baseline=None)
    with pytest.raises(ValueError, match="margin"):
        claim(margin=-1)
    with pytest.raises(ValueError, match="<chapter>/<name>"):
        claim(key="nochapter")


def test_ledger_round_trip(tmp_path):
    v = evaluate(claim(), [1.0, 1.2, 1.1], [0.5, 0.4, 0.6], seconds=12.0)
    record(v, tmp_path)
    rows = read_ledger(tmp_path)
    assert len(rows) == 1 and rows[0]["verdict"] == v.verdict and rows[0]["seconds"] == 12.0
    assert Verdict.from_dict(rows[0]).sentence() == v.sentence()
    table = ledger_markdown(rows)
    assert "demo" in table and f"**{v.verdict}**" in table and table.count("\n") == 2
