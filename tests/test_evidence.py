"""rlcourse.claims: decision rules, intervals, the exact test, and the ledger round trip."""
import ast
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from rlcourse.claims import Claim, Verdict, decide, detectable_effect, evaluate, ledger_counts, ledger_markdown, \
    paired_bootstrap, read_ledger, record, seeds_needed, sign_flip_p_value, t_interval


def claim(**kw):
    base = dict(key="demo/x", paper="P", statement="s", source="abstract", setting="toy", metric="m",
                method="A", baseline="B")
    base.update(kw)
    return Claim(**base)


def test_decision_table():
    # one-sided claims on the 95% t-interval: mean 0.2, sd 0.079, n 5 -> [0.102, 0.298]
    d = [0.1, 0.15, 0.2, 0.25, 0.3]
    assert decide("greater", 0.0, d) == "holds"
    assert decide("greater", 0.15, d) == "inconclusive"  # positive but maybe below the margin
    assert decide("greater", 0.4, d) == "does not hold"  # surely below the margin
    assert decide("less", 0.0, [-x for x in d]) == "holds"
    assert decide("less", 0.0, d) == "does not hold"
    # non-inferiority: [0.102, 0.298] - 0.2 = [-0.098, 0.098] lies above -0.1, not above -0.09
    assert decide("not worse", 0.1, [x - 0.2 for x in d]) == "holds"
    assert decide("not worse", 0.09, [x - 0.2 for x in d]) == "inconclusive"
    assert decide("not worse", 0.0, [-x for x in d]) == "does not hold"
    # equivalence by TOST on the 90% interval: [0.125, 0.275] lies within +-0.28, not within +-0.27
    assert decide("equivalent", 0.28, d) == "holds"
    assert decide("equivalent", 0.27, d) == "inconclusive"
    assert decide("equivalent", 0.05, d) == "does not hold"
    assert decide("greater", 0.0, [1.0]) == "inconclusive"  # one seed has no interval
    assert decide("greater", 0.0, [0.3, 0.3, 0.3]) == "inconclusive"  # no spread, no interval
    with pytest.raises(ValueError, match="kind"):
        decide("bigger", 0.0, d)


def test_t_interval_is_the_textbook_formula():
    from scipy import stats

    d = np.array([0.3, -0.1, 0.2, 0.4])
    half = stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert t_interval(d) == pytest.approx((d.mean() - half, d.mean() + half))
    with pytest.raises(ValueError, match="at least 2"):
        t_interval([1.0])


def test_sign_flip_is_exact():
    d = np.array([0.3, -0.1, 0.2, 0.4])
    # enumerate the 16 sign patterns by hand
    obs = abs(d.mean())
    count = sum(abs((np.array(s) * d).mean()) >= obs - 1e-12 for s in itertools.product((1, -1), repeat=4))
    assert sign_flip_p_value(d) == pytest.approx(count / 16)
    # all positive: the smallest attainable p-value, 2 / 2^n
    assert sign_flip_p_value([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2 / 32)


REPS = 20_000


def _noise(rng, dist, n):
    return rng.standard_normal((REPS, n)) if dist == "normal" else rng.standard_t(3, (REPS, n))


def _within(rate, nominal, reps, *, conservative_ok):
    """``rate`` is within 3.5 Monte Carlo standard errors of ``nominal`` (or below it, when a conservative
    rule is acceptable: heavy tails make the t-test conservative)."""
    se = np.sqrt(nominal * (1 - nominal) / reps)
    return rate <= nominal + 3.5 * se and (conservative_ok or rate >= nominal - 3.5 * se)


@pytest.mark.parametrize("dist", ["normal", "t3"])
@pytest.mark.parametrize("n", [3, 5, 8, 20])
def test_the_decision_rule_keeps_its_error_rates_under_the_null(n, dist):
    """Simulate the null of each kind of claim through ``decide`` (the whole rule) with the true effect
    exactly on the margin (``-m`` for non-inferiority): a directional claim must "hold" at most 2.5% of
    the time, an equivalence claim at most 5%, and the 95% interval must cover the true mean 95% of the
    time; exactly so (within Monte Carlo error) for normal differences, at most so for heavy-tailed ones (t with 3 df)."""
    rng = np.random.default_rng(1000 * n + (dist == "t3"))
    noise = _noise(rng, dist, n)
    exact = dist == "normal"
    greater = np.mean(decide("greater", 0.1, 0.1 + noise) == "holds")
    less = np.mean(decide("less", 0.1, -0.1 + noise) == "holds")
    not_worse = np.mean(decide("not worse", 0.1, -0.1 + noise) == "holds")
    # equivalence at its margin: the noise is small beside the margin, so both one-sided tests bite
    equivalent = np.mean(decide("equivalent", 1.0, 1.0 + 0.1 * noise) == "holds")
    lo, hi = t_interval(noise, 0.95)
    coverage = np.mean((lo <= 0) & (0 <= hi))
    assert _within(greater, 0.025, REPS, conservative_ok=not exact), (n, dist, greater)
    assert _within(less, 0.025, REPS, conservative_ok=not exact), (n, dist, less)
    assert _within(not_worse, 0.025, REPS, conservative_ok=not exact), (n, dist, not_worse)
    assert _within(equivalent, 0.05, REPS, conservative_ok=not exact), (n, dist, equivalent)
    assert _within(1 - coverage, 0.05, REPS, conservative_ok=not exact), (n, dist, coverage)


def test_the_simulation_rejects_the_percentile_bootstrap_rule():
    """The same simulation catches the rule the book used before: a percentile bootstrap over 3 seeds is
    [min, max] of the differences, so a claim on its margin "holds" whenever every seed clears it
    (about 1 in 8), five times the nominal 2.5%."""
    rng = np.random.default_rng(7)
    reps = 2000
    holds = 0
    for i in range(reps):
        lo, _ = paired_bootstrap(0.1 + rng.standard_normal(3), n_boot=1000, seed=i)
        holds += lo > 0.1
    assert not _within(holds / reps, 0.025, reps, conservative_ok=True), holds / reps


def test_detectable_effect_has_the_power_it_promises():
    """A true effect exactly the detectable amount beyond the margin "holds" about 80% of the time."""
    rng = np.random.default_rng(3)
    for n in (5, 10):
        d = detectable_effect(1.0, n)
        rate = np.mean(decide("greater", 0.0, d + rng.standard_normal((REPS, n))) == "holds")
        assert 0.72 <= rate <= 0.85, (n, rate)  # the central-t approximation is close, slightly optimistic
    n = seeds_needed(1.0, 1.5)
    assert detectable_effect(1.0, n) <= 1.5 < detectable_effect(1.0, n - 1) and n >= 3
    with pytest.raises(ValueError, match="cannot be told"):
        seeds_needed(1.0, 0.1, margin=0.2)


def test_evaluate_pairs_seeds_and_checks_input():
    c = claim(kind="greater", margin=0.0)
    v = evaluate(c, [0.8, 0.82, 0.79, 0.85, 0.81], [0.6, 0.61, 0.58, 0.62, 0.6])
    assert v.verdict == "holds" and v.seeds == 5 and v.effect == pytest.approx(0.212)
    assert v.low > 0 and v.p_value < 0.025 and v.detectable > 0
    assert "holds" in v.sentence() and "Over 5 seeds" in v.sentence() and "95% t-interval" in v.sentence()
    # pairing matters: a common seed effect cancels in the differences
    shared = np.array([0.0, 0.3, -0.3, 0.6, -0.6])
    v2 = evaluate(c, 0.5 + shared + 0.05 + [0.01, -0.01, 0.0, 0.02, -0.02], 0.5 + shared)
    assert v2.verdict == "holds"
    with pytest.raises(ValueError, match="one of each per seed"):
        evaluate(c, [1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="pass baseline_values"):
        evaluate(c, [1, 2, 3])
    with pytest.raises(ValueError, match="non-finite"):
        evaluate(c, [1, float("nan")], [1, 2])
    one = evaluate(c, [0.9], [0.1])
    assert one.verdict == "inconclusive" and "one seed" in one.sentence()


def test_evaluate_enforces_the_profiles_minimum_seed_count():
    c = claim()
    with pytest.raises(ValueError, match="needs at least 5"):
        evaluate(c, [1.0, 1.2, 1.1, 0.9], [0.5, 0.4, 0.6, 0.5], profile="book")
    assert evaluate(c, [1.0, 1.2], [0.5, 0.4], profile="smoke").seeds == 2
    with pytest.raises(ValueError, match="needs at least 5"):
        evaluate(c, [1.0, 1.2, 1.1], [0.5, 0.4, 0.6], min_seeds=5)


def test_zero_variance_is_inconclusive_not_a_verdict():
    v = evaluate(claim(kind="greater"), [0.0] * 5, [0.0] * 5, profile="book")
    assert v.verdict == "inconclusive" and "no spread" in v.sentence() and v.detectable is None
    w = evaluate(claim(kind="less"), [0.5] * 5, [0.7] * 5, profile="book")  # deterministic arms
    assert w.verdict == "inconclusive"


def test_a_claim_whose_positive_control_failed_is_uninformative():
    ctrl = claim(key="demo/control", role="positive control")
    paper = claim(key="demo/paper", control="demo/control")
    good = evaluate(ctrl, [1.0, 1.2, 1.1], [0.5, 0.4, 0.6])
    bad = evaluate(ctrl, [0.5, 0.6, 0.4], [0.5, 0.4, 0.6])
    assert good.holds and not bad.holds
    vals = ([1.0, 1.2, 1.1], [0.5, 0.4, 0.6])
    assert evaluate(paper, *vals, control=good).verdict == "holds"
    v = evaluate(paper, *vals, control=bad)
    assert v.verdict == "uninformative" and "demo/control" in v.sentence() and v.control_verdict == bad.verdict
    with pytest.raises(ValueError, match="pass its verdict"):
        evaluate(paper, *vals)
    with pytest.raises(ValueError, match="names no positive control"):
        evaluate(ctrl, *vals, control=good)
    with pytest.raises(ValueError, match="cannot rest on"):
        claim(key="demo/c2", role="positive control", control="demo/control")
    with pytest.raises(ValueError, match="role"):
        claim(role="control")


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
    assert rows[0]["recorded_at"] in table and "95% t" in table
    # roles are counted apart, and a row recorded before roles existed counts as a paper claim
    record(evaluate(claim(key="demo/ctl", role="positive control"), [1.0, 1.2, 1.1], [0.5, 0.4, 0.6]), tmp_path)
    old = {k: val for k, val in v.to_dict().items() if k not in ("level", "detectable", "reason", "control_verdict")}
    old["claim"] = {k: val for k, val in old["claim"].items() if k not in ("role", "control")}
    old["claim"]["key"] = "demo/old"
    Path(tmp_path, "demo__old.json").write_text(json.dumps(old))
    rows = read_ledger(tmp_path)
    counts = ledger_counts(rows)
    assert counts["paper claim"][v.verdict] == 2 and counts["positive control"]["holds"] == 1
    assert ledger_markdown(rows, role="positive control").count("\n") == 2
    assert Verdict.from_dict(rows[1]).claim.role == "paper claim"


def test_record_replaces_the_chapters_older_rows(tmp_path):
    v = lambda key: evaluate(claim(key=key), [1.0, 1.2, 1.1], [0.5, 0.4, 0.6])  # noqa: E731
    # what earlier runs left: a claim of 'demo' that its next run no longer tests, and other chapters' rows
    for key in ("demo/renamed-since", "other/x", "demo_more/y"):
        record(v(key), tmp_path, replace_chapter=False)
    record(v("demo/new"), tmp_path)  # the chapter's next run: its first record starts the chapter afresh
    record(v("demo/second"), tmp_path)  # ... and its later records of the same run keep what it wrote
    keys = [r["claim"]["key"] for r in read_ledger(tmp_path)]
    assert keys == ["demo/new", "demo/second", "demo_more/y", "other/x"]
    assert ledger_markdown(read_ledger(tmp_path)).count("\n") == 1 + len(keys)


ROOT = Path(__file__).resolve().parents[1]


def _claim_calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id == "Claim") or (isinstance(f, ast.Attribute) and f.attr == "Claim"):
                yield node


def test_every_claim_key_in_the_package_is_unique_and_names_its_chapter():
    """Static: every ``Claim(...)`` in rlcourse/ gives its key as a string (or an f-string whose chapter
    part is literal), no two keys can be equal, and the chapter part is a chapter of the book."""
    literal, templates = {}, {}
    for path in sorted((ROOT / "rlcourse").rglob("*.py")):
        for node in _claim_calls(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            key = next((k.value for k in node.keywords if k.arg == "key"), None)
            if key is None:
                # Verdict.from_dict rebuilds a recorded claim from its fields
                assert path.name == "claims.py" and any(k.arg is None for k in node.keywords), where
                continue
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                assert key.value not in literal, f"claim key {key.value!r} at {where} and {literal[key.value]}"
                literal[key.value] = where
                continue
            assert isinstance(key, ast.JoinedStr), f"{where}: the claim key must be a string or an f-string"
            pattern = "".join(re.escape(p.value) if isinstance(p, ast.Constant) else "(.+)" for p in key.values)
            assert pattern not in templates, f"claim key pattern {pattern!r} at {where} and {templates[pattern]}"
            first = key.values[0]
            assert isinstance(first, ast.Constant) and "/" in first.value, f"{where}: the chapter part must be literal"
            templates[pattern] = where
    assert len(literal) + len(templates) >= 60  # the scan sees the package's claims
    for pattern, where in templates.items():
        clash = [k for k in literal if re.fullmatch(pattern, k)]
        assert not clash, f"the key pattern at {where} can equal {clash}"
    chapters = {p.stem for p in (ROOT / "book").glob("*.md")}
    prefixes = {k.split("/")[0]: w for k, w in literal.items()}
    prefixes.update({p.split("/")[0].replace("\\", ""): w for p, w in templates.items()})
    unknown = {p: w for p, w in prefixes.items() if p not in chapters}
    assert not unknown, f"claim keys whose chapter part is no chapter of the book: {unknown}"


def _code_cells(path: Path) -> list[ast.Module]:
    import jupytext

    cells = []
    for cell in jupytext.read(path).cells:
        if cell.cell_type == "code":
            src = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
            cells.append(ast.parse(src, f"{path.name} cell"))
    return cells


def _called_names(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            out.append((name, node))
    return out


def test_every_chapter_that_decides_a_claim_records_it():
    """Static: a chapter that computes a verdict (``evaluate``, ``*_verdict(s)``, ``.sentence()``) glues
    it with ``glue_verdict``, and never with ``record_it`` off, so the reproduction page sees it."""
    deciding = []
    for path in sorted((ROOT / "book").glob("*.md")):
        calls = [c for tree in _code_cells(path) for c in _called_names(tree)]
        decides = any(n == "evaluate" or n.endswith(("_verdict", "_verdicts")) or n == "sentence" for n, _ in calls)
        glued = [node for n, node in calls if n == "glue_verdict"]
        for node in glued:
            for k in node.keywords:
                assert k.arg != "record_it" or (isinstance(k.value, ast.Constant) and k.value.value is True), \
                    f"{path.name}:{node.lineno}: glue_verdict(..., record_it=...) keeps a verdict off the ledger"
        if decides:
            deciding.append(path.stem)
            assert glued, f"{path.name} computes verdicts but never calls glue_verdict"
    assert len(deciding) >= 15, deciding  # the scan sees the chapters' code
