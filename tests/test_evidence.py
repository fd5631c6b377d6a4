"""rlcourse.claims: decision rules, intervals, the exact test, and the ledger round trip."""
import ast
import itertools
import re
from pathlib import Path

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
