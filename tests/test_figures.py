"""Every figure of the chapters and capstones has a caption and an alt text, read from the sources.

A figure reaches the HTML book in one of two ways: a ``{glue:figure}`` (or ``{figure}``) directive,
whose ``:alt:`` option and content (the caption) the chapter writes, or a code cell that shows a
figure itself (``plt.show()``), whose caption and alt text come from the cell's ``mystnb`` metadata
(``figure.caption`` and ``image.alt``). Without an ``:alt:``, Sphinx writes the image's file name, a
hash, as its alt text, which tells a screen-reader user nothing. ``tests/test_web_book.py`` checks
the same on the built pages.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.glob("book/*.md"), *ROOT.glob("notebooks/*.md")])
DIRECTIVE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|:{3,})\s*\{(?P<name>glue:figure|figure)\}\s*(?P<arg>.*)$")
# a code cell that shows a figure in its own output (a glued figure is shown by its directive instead):
# it says so, or it draws one and does not close it (the inline backend then shows it at the cell's end)
SHOWS_FIGURE = re.compile(r"\bplt\.show\(|\bdisplay\(\s*fig\w*\s*\)|\bfig\w*\.show\(")
DRAWS_FIGURE = re.compile(r"\bplt\.(subplots|figure|subplot_mosaic)\(")
CLOSES_FIGURE = re.compile(r"\bplt\.close\(")
MIN_ALT_WORDS = 4


def meaningless_alt(alt: str | None, *names: str) -> str | None:
    """Why ``alt`` says nothing about the image, or None when it is a description."""
    alt = (alt or "").strip()
    if not alt:
        return "no alt text"
    if re.fullmatch(r"[0-9a-f]{16,}(\.\w+)?", alt):
        return f"alt text {alt!r} is a hash"
    if alt in names or Path(alt).stem in names:
        return f"alt text {alt!r} is the figure's name"
    if len(alt.split()) < MIN_ALT_WORDS:
        return f"alt text {alt!r} is shorter than {MIN_ALT_WORDS} words"
    return None


def figure_directives(text: str) -> list[dict]:
    """Each figure directive: its line, argument, options and caption (first paragraph of content)."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        m = DIRECTIVE.match(line)
        if not m:
            continue
        body, j = [], i + 1
        while j < len(lines) and lines[j].strip() != m["fence"]:
            body.append(lines[j].strip())
            j += 1
        options = {}
        while body and re.match(r":[\w-]+:", body[0]):
            key, _, value = body.pop(0)[1:].partition(":")
            options[key] = value.strip()
        while body and not body[0]:
            body.pop(0)
        caption = " ".join(body[:body.index("")] if "" in body else body).strip()
        found.append({"line": i + 1, "name": m["name"], "arg": m["arg"].strip(), "options": options,
                      "caption": caption})
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_figure_directive_has_a_caption_and_alt_text(path):
    problems = []
    for fig in figure_directives(path.read_text()):
        where = f"{path.relative_to(ROOT)}:{fig['line']} {{{fig['name']}}} {fig['arg']}"
        if not fig["caption"]:
            problems.append(f"{where}: no caption")
        why = meaningless_alt(fig["options"].get("alt"), fig["arg"], fig["options"].get("name", ""))
        if why:
            problems.append(f"{where}: {why}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cell_that_shows_a_figure_has_a_caption_and_alt_text(path):
    import jupytext

    problems = []
    for i, cell in enumerate(jupytext.read(path).cells):
        shows = SHOWS_FIGURE.search(cell.source) or (DRAWS_FIGURE.search(cell.source)
                                                     and not CLOSES_FIGURE.search(cell.source))
        if cell.cell_type != "code" or not shows:
            continue
        mystnb = cell.metadata.get("mystnb", {})
        where = f"{path.relative_to(ROOT)}, code cell {i} ({cell.source.splitlines()[0][:50]!r}...)"
        figure = mystnb.get("figure", {})
        if not str(figure.get("caption", "")).strip():
            problems.append(f"{where}: shows a figure with no mystnb figure.caption")
        if not figure.get("name"):
            problems.append(f"{where}: shows a figure with no mystnb figure.name (label)")
        why = meaningless_alt(mystnb.get("image", {}).get("alt"), figure.get("name", ""))
        if why:
            problems.append(f"{where}: mystnb image.alt: {why}")
    assert not problems, "\n".join(problems)


def test_the_checks_see_a_missing_caption_and_a_hash_alt():
    """The parser behind the checks: a directive without a caption or with a hash for alt is caught."""
    text = "```{glue:figure} key\n:alt: 3f2a9c0e1b7d4a5f6e8c.png\n:name: fig-x\n```\n"
    (fig,) = figure_directives(text)
    assert fig["caption"] == "" and fig["options"]["name"] == "fig-x"
    assert "hash" in meaningless_alt(fig["options"]["alt"], "key")
    good = "```{glue:figure} key\n:alt: A line chart of reward against steps\n\nThe caption.\nGoes on.\n\nLegend.\n```\n"
    (fig,) = figure_directives(good)
    assert fig["caption"] == "The caption. Goes on." and meaningless_alt(fig["options"]["alt"], "key") is None
