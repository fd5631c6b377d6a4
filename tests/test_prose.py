"""Reader-facing prose never speaks of how the book was built.

A reader meets an experiment, its settings and, where the settings changed, what an earlier version
of the experiment did ("an earlier version of this experiment (30 steps at 1e-4) ..."). Words about
the making of the book (its "first book run", a "fresh-clone" build, "lab notes", "this session")
refer to nothing the reader can see. This static test reads every chapter (``book/*.md``) and
capstone (``notebooks/*.md``) and reports each such phrase as ``file:line``, outside code: code cells
and other fenced code blocks, inline code spans, the jupytext header and MyST comments are skipped.
Prose inside directives (admonitions, exercises, figure captions) is checked like any other.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# each pattern names a way of speaking about the book's making, not about the experiment
BUILD_PHRASES = re.compile(r"|".join([
    # "the first book run", "a fresh book run" (but not "at the end of the book run the capstones")
    r"\b(first|second|third|last|latest|previous|earlier|later|next|another|fresh|a|one|each|every|this|that|"
    r"same)\s+book[- ]runs?\b",
    r"\bthe book's runs?\b",
    r"\bbook builds?\b",           # "the fresh-clone book build"
    r"\bfresh[- ]?clones?\b",
    r"\blab[- ]notes?\b",
    r"\bour notes\b",
    r"\bthis session\b",
]), re.IGNORECASE)

# fenced blocks whose body is code (or a directive's options), not prose
CODE_INFO = re.compile(r"^(\{(code-cell|code|code-block|literalinclude|eval-rst)\}.*|[^{].*|)$")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)")


def prose_lines(text: str):
    """``(line number, prose)`` for every line a reader sees as text: outside the jupytext header,
    MyST comments and code fences, with inline code spans blanked out."""
    lines = text.splitlines()
    start = 0
    if lines and lines[0].strip() == "---":  # the jupytext (YAML) header
        start = next((i + 1 for i in range(1, len(lines)) if lines[i].strip() == "---"), len(lines))
    stack: list[tuple[str, bool]] = []  # open fences: (fence, holds code)
    for n in range(start, len(lines)):
        line = lines[n]
        m = FENCE.match(line)
        if m:
            fence, info = m.group(1), m.group(2).strip()
            top = stack[-1] if stack else None
            closes = not info and top is not None and top[0][0] == fence[0] and len(fence) >= len(top[0])
            if top is not None and top[1]:  # inside code: only its closing fence counts
                if closes:
                    stack.pop()
                continue
            if closes:
                stack.pop()
                continue
            stack.append((fence, bool(CODE_INFO.match(info))))
            if not stack[-1][1]:
                yield n + 1, CODE_SPAN.sub("", info)  # a directive's title is prose
            continue
        if stack and stack[-1][1]:
            continue
        if line.lstrip().startswith("%") or line.lstrip().startswith("<!--"):
            continue
        yield n + 1, CODE_SPAN.sub("", line)


def build_phrases(path: Path) -> list[str]:
    """``file:line: phrase`` for each phrase about the book's making in the prose of ``path``."""
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    lines = list(prose_lines(path.read_text()))
    hits = [f"{rel}:{n}: {m.group(0)!r} in {line.strip()[:100]!r}"
            for n, line in lines for m in BUILD_PHRASES.finditer(line)]
    for (n, line), (n2, after) in zip(lines, lines[1:]):  # a phrase broken across two lines
        joined = line.rstrip() + " " + after.lstrip()
        hits += [f"{rel}:{n}: {m.group(0)!r} in {joined.strip()[:100]!r}" for m in BUILD_PHRASES.finditer(joined)
                 if n2 == n + 1 and m.start() < len(line.rstrip()) < m.end()]
    return hits


CHAPTER_FILES = sorted((ROOT / "book").glob("*.md")) + sorted((ROOT / "notebooks").glob("*.md"))


def test_the_scanner_reads_prose_and_skips_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "---", "jupytext: {book run: in the header}", "---",
        "The first book run trained 30 steps.",            # 4: prose
        "Call `plot(book_run)` or `the lab notes`.",        # 5: code spans only
        "```{code-cell} ipython3", "# the fresh-clone build", "x = 'this session'", "```",
        "````{admonition} From lab notes",                   # 10: a directive's title is prose
        "In this session we ran it.",                        # 11: prose inside a directive
        "```python", "book_build = 1  # book build", "```",
        "````",
        "% a comment about the book run",
        "After the fresh clone, an earlier version of this experiment.",  # 17: prose
        "It was the second book",                                          # 18: broken across lines
        "run that showed it.",
    ]))
    hits = build_phrases(page)
    assert [h.split(":")[1] for h in hits] == ["4", "10", "11", "17", "18"], hits
    assert all(h.startswith(str(page)) for h in hits)


def test_the_phrases_are_specific():
    ok = ["The book profile runs 120 steps.", "Run the book with `make book`.", "The lab's base model.",
          "Notes on the derivation.", "An earlier version of this experiment (30 steps at 1e-4).",
          "The capstones at the end of the book run on a GPU."]
    assert not [s for s in ok if BUILD_PHRASES.search(s)]
    bad = ["The first book run", "a fresh-clone build", "the lab notes' rate", "our notes", "This session",
           "the book's run uses seeds 100 and up", "the fresh clone book build of 4 Dec"]
    assert all(BUILD_PHRASES.search(s) for s in bad)


@pytest.mark.parametrize("path", CHAPTER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_chapter_prose_does_not_speak_of_how_the_book_was_built(path):
    hits = build_phrases(path)
    assert not hits, ("say what an earlier version of the experiment did, and link the chapter it comes "
                      "from with {ref} or {doc}:\n" + "\n".join(hits))
