"""Every chapter and capstone in _toc.yml, executed in the smoke profile (as a reader's kernel would)."""
import os
import re
import time
from pathlib import Path

import jupytext
import nbclient
import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHAPTER_TIME_LIMIT_S = int(os.environ.get("RLCOURSE_CHAPTER_TIMEOUT", "600"))


def toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    return files


def executable(stem: str) -> bool:
    path = ROOT / f"{stem}.md"
    return path.exists() and path.read_text().startswith("---\njupytext:")


def test_every_chapter_file_is_in_the_toc():
    listed = set(toc_files())
    for folder in ("book", "notebooks"):
        for path in (ROOT / folder).glob("*.md"):
            stem = str(path.relative_to(ROOT).with_suffix(""))
            assert stem in listed, f"{stem}.md is not listed in _toc.yml"
    for stem in listed:
        assert (ROOT / f"{stem}.md").exists(), f"_toc.yml lists {stem}, which does not exist"


CHAPTERS = [s for s in toc_files() if executable(s)]


def glued_figures_without_image(nb) -> list[str]:
    """Names of glued outputs that are matplotlib figures but carry no PNG (the book would show the
    figure's repr, ``<Figure size ...>``, instead of the plot)."""
    missing = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            record = out.get("metadata", {}).get("scrapbook", {})
            prefix = record.get("mime_prefix", "")
            data = {key[len(prefix):] if key.startswith(prefix) else key: v for key, v in out.get("data", {}).items()}
            name = record.get("name")
            if name and str(data.get("text/plain", "")).startswith("<Figure") and "image/png" not in data:
                missing.append(name)
    return missing


def glued_numpy_scalars(nb) -> list[str]:
    """Names of glued outputs whose value is a NumPy scalar: its repr is ``np.float64(0.3)``, which
    myst-nb cannot format with a spec such as ``{glue:text}`name:.2f``` (a warning, so the -W build of
    the book fails). Glue ``float(x)`` or ``int(x)`` instead."""
    return [out["metadata"]["scrapbook"]["name"]
            for cell in nb.cells for out in cell.get("outputs", [])
            if out.get("metadata", {}).get("scrapbook", {}).get("name")
            and any(k.endswith("text/plain") and str(v).startswith("np.") for k, v in out.get("data", {}).items())]


STDERR_PROBLEM = re.compile(r"Warning|warn\(|Traceback")


def stderr_problems(nb) -> list[str]:
    """Every stream output on stderr that holds a warning (``...Warning``, ``warn(``) or a traceback,
    as ``cell N (first line of its source): "text"``. A reader sees these under the cell, and the book
    shows them on the page; a progress bar on stderr holds none of these words and passes."""
    found = []
    for n, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            text = out.get("text", "")
            text = "".join(text) if isinstance(text, list) else text
            if out.get("output_type") == "stream" and out.get("name") == "stderr" and STDERR_PROBLEM.search(text):
                first = next((line for line in cell.source.splitlines() if line.strip()), "")
                found.append(f"cell {n} ({first[:60]}): {text.strip()[:400]!r}")
    return found


def test_stderr_problems_finds_warnings_and_tracebacks_only():
    def nb(*outputs):
        return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1\nf(x)", outputs=list(outputs))])

    def stream(name, text):
        return nbformat.v4.new_output("stream", name=name, text=text)

    warned = stderr_problems(nb(stream("stderr", "/x/hub.py:176: UserWarning: Cannot enable progress bars\n  warnings.warn(")))
    assert len(warned) == 1 and warned[0].startswith("cell 0 (x = 1)") and "Cannot enable" in warned[0]
    assert stderr_problems(nb(stream("stderr", "Traceback (most recent call last):\n  ...")))
    assert not stderr_problems(nb(stream("stderr", "SFT addition: 100%|##########| 40/40 [00:01<00:00]")))
    assert not stderr_problems(nb(stream("stdout", "a UserWarning printed on purpose")))


@pytest.mark.chapters
@pytest.mark.parametrize("stem", CHAPTERS)
def test_chapter_executes_in_smoke_profile(stem, monkeypatch, tmp_path):
    # the kernel gets the backend a reader's kernel (and `make book`) has, so figures render to PNG
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    # ... and a ledger of its own, to see what it records
    ledger = tmp_path / "ledger"
    monkeypatch.setenv("RLCOURSE_LEDGER", str(ledger))
    nb = jupytext.read(ROOT / f"{stem}.md")
    client = nbclient.NotebookClient(nb, timeout=CHAPTER_TIME_LIMIT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str((ROOT / stem).parent)}})
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    assert elapsed < CHAPTER_TIME_LIMIT_S, f"{stem} took {elapsed:.0f} s in the smoke profile"
    missing = glued_figures_without_image(nb)
    assert not missing, f"{stem}: glued figures without an image: {missing}"
    numpy_scalars = glued_numpy_scalars(nb)
    assert not numpy_scalars, f"{stem}: glued NumPy scalars (glue float(x) or int(x)): {numpy_scalars}"
    problems = stderr_problems(nb)
    assert not problems, f"{stem}: warnings or tracebacks on stderr under cells: " + "; ".join(problems)
    # the executed notebook is kept for the HTML build of tests/test_web_book.py (no second execution)
    saved = Path(os.environ["RLCOURSE_EXECUTED_DIR"]) / f"{stem}.ipynb"
    saved.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, saved)
    # a chapter that glues verdicts records them, and only claims keyed by its own name (a chapter's
    # run replaces the ledger rows of its name: rlcourse.claims.record)
    recorded = sorted(p.name for p in ledger.glob("*.json"))
    foreign = [n for n in recorded if not n.startswith(Path(stem).name + "__")]
    assert not foreign, f"{stem} recorded claims keyed by another chapter: {foreign}"
    if "glue_verdict(" in (ROOT / f"{stem}.md").read_text():
        assert recorded, f"{stem} glues verdicts but recorded none in the ledger"


LABEL = re.compile(r"^\(([A-Za-z0-9_.:-]+)\)=\s*$", re.MULTILINE)
NAMED = re.compile(r"^:(?:name|label):\s*([A-Za-z0-9_.:-]+)\s*$", re.MULTILINE)
REF = re.compile(r"\{(?:ref|numref)\}`(?:[^`<]*<)?([A-Za-z0-9_.:-]+)>?`")


def test_every_chapter_has_its_label_and_every_ref_resolves():
    """Static check of the book's cross-references (the Sphinx build with -W -n checks them too, but
    only where the whole book is built): each chapter opens with the label ``ch-<stem>`` (underscores
    as hyphens), and every {ref}/{numref} names a label, figure or exercise defined somewhere."""
    sources = {stem: (ROOT / f"{stem}.md").read_text() for stem in toc_files() if (ROOT / f"{stem}.md").exists()}
    labels = set()
    for text in sources.values():
        labels.update(LABEL.findall(text))
        labels.update(NAMED.findall(text))
    for stem, text in sources.items():
        if stem.startswith(("book/", "notebooks/")):
            expected = "ch-" + Path(stem).name.replace("_", "-")
            assert f"({expected})=" in text, f"{stem}.md does not open with the label ({expected})="
        unknown = sorted(set(REF.findall(text)) - labels)
        assert not unknown, f"{stem}.md refers to undefined labels: {unknown}"


def test_no_chapter_sends_the_reader_to_a_brief():
    """The reader has no course brief: chapters cite the paper or the authors' code instead."""
    for stem in toc_files():
        path = ROOT / f"{stem}.md"
        if path.exists():
            hits = [n for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"\bthe brief\b", line, re.I)]
            assert not hits, f"{stem}.md mentions 'the brief' on lines {hits}"


def nested_code_cells(text: str) -> list[int]:
    """Line numbers of ``{code-cell}`` fences inside a ``:::`` directive (an exercise, a solution, an
    admonition). myst-nb executes only top-level cells: a nested one is shown as text and never runs,
    so its printed "answer" was never computed. A hidden cell before the directive is the way."""
    depth, hits = 0, []
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if re.match(r"^:{3,}\s*\{", s):
            depth += 1
        elif re.fullmatch(r":{3,}", s) and depth:
            depth -= 1
        elif s.startswith("```{code-cell}") and depth:
            hits.append(n)
    return hits


def test_nested_code_cells_are_found():
    text = (":::{solution} ex\n:class: dropdown\n\n```{code-cell} ipython3\nprint(1)\n```\n:::\n\n"
            "```{code-cell} ipython3\n```\n")
    assert nested_code_cells(text) == [4]


def test_no_code_cell_is_nested_in_a_directive():
    for stem in CHAPTERS:
        hits = nested_code_cells((ROOT / f"{stem}.md").read_text())
        assert not hits, f"{stem}.md has code cells inside a ::: directive on lines {hits}: they never execute"
