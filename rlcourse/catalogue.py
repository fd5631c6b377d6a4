"""The book's catalogue: each paper, its chapter, the registered parts it adds, its tests, its verdicts.

Nothing here is typed by hand; everything is read from the sources, so the index cannot drift:

* the registries (every part a config can name: estimators, losses, rewards, samplers, prompt
  samplers, reward-model losses, tasks);
* the chapters' ``literalinclude`` directives: a chapter *adds* a part when it shows the code that
  implements it (the part's function, its class, or the factory that builds it). A part of a
  ``rlcourse/methods`` module whose own code no chapter shows belongs to the first chapter, in
  table-of-contents order, that shows anything from that module;
* the paper a chapter covers: the first arXiv identifier its text cites, with the italic title
  before it;
* the test files named after the chapter or after its method modules, or naming the chapter's file;
* the verdicts of the reproduction ledger (:mod:`rlcourse.claims`), keyed by chapter.

========================  ==============================================================
:func:`registered_parts`  ``[Part]``: kind, name, defining file and top-level object
:func:`chapter_includes`  ``[(file, pyobject)]`` a chapter's source shows
:func:`chapter_paper`     ``(title, arxiv_id)`` of a chapter's source
:func:`prerequisites`     the chapter labels a chapter's "Builds on" box names
:func:`catalogue`         ``[Entry]``, one per chapter of the table of contents
:func:`papers_markdown`   the index as a Markdown table
========================  ==============================================================
"""
from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = re.compile(r"^```\{literalinclude\}\s+(\S+)\s*\n((?::[^\n]*\n)*)", re.MULTILINE)
ARXIV = re.compile(r"arXiv[:\s]*(\d{4}\.\d{4,5})")
TITLE = re.compile(r"\*([^*\n][^*]{3,200}?)\*")
BUILDS_ON = re.compile(r"^:::\{admonition\} Builds on\n(.*?)^:::", re.MULTILINE | re.DOTALL)
CHAPTER_REF = re.compile(r"\{ref\}`(?:[^`<]*<)?(ch-[a-z0-9-]+)>?`")


@dataclass(frozen=True)
class Part:
    kind: str  # e.g. "advantage estimator"
    name: str  # the registry name a config uses
    file: str  # the defining file, relative to the repository root (e.g. "rlcourse/methods/gipo.py")
    obj: str  # the top-level function or class that implements it (a closure's enclosing factory)


@dataclass
class Entry:
    stem: str  # "book/gipo"
    title: str
    arxiv: str
    parts: list[Part] = field(default_factory=list)
    builds_on: list[str] = field(default_factory=list)  # stems of the chapters it names as prerequisites
    tests: list[str] = field(default_factory=list)
    verdicts: dict[str, int] = field(default_factory=dict)  # verdict word -> count


def _registries() -> dict:
    from .advantages import ESTIMATORS
    from .data import PROMPT_SAMPLERS
    from .losses import POLICY_LOSSES
    from .registry import load_methods
    from .rewards import REWARDS
    from .rollout import SAMPLERS
    from .supervised import REWARD_MODEL_LOSSES

    load_methods()
    return {r.kind: r for r in (ESTIMATORS, POLICY_LOSSES, REWARDS, SAMPLERS, PROMPT_SAMPLERS, REWARD_MODEL_LOSSES)}


def _implementation(obj):
    """The function or class whose source implements a registered object."""
    while isinstance(obj, functools.partial):
        obj = obj.func
    if inspect.isfunction(obj) or inspect.isclass(obj):
        return obj
    return type(obj)  # a callable instance: its class


def _where(obj) -> tuple[str, str]:
    impl = _implementation(obj)
    try:
        file = Path(inspect.getsourcefile(impl)).resolve()
        file = str(file.relative_to(ROOT))
    except (TypeError, ValueError):
        file = "?"
    return file, impl.__qualname__.split(".")[0]


def registered_parts() -> list[Part]:
    """Every registered part of the loop, the tasks included, sorted by kind and name."""
    from . import tasks

    parts = [Part(kind, name, *_where(fn)) for kind, reg in _registries().items() for name, fn in reg._items.items()]
    parts += [Part("task", name, *_where(factory)) for name, factory in tasks._TASKS.items()]
    return sorted(parts, key=lambda p: (p.kind, p.name))


def chapter_includes(text: str, chapter_dir: str) -> list[tuple[str, str | None]]:
    """``(file, pyobject)`` for each ``literalinclude`` of a chapter (``pyobject`` None when the whole
    file or a line range is shown); files relative to the repository root."""
    out = []
    for path, options in INCLUDE.findall(text):
        file = str((ROOT / chapter_dir / path).resolve().relative_to(ROOT)) if not path.startswith("/") else path.lstrip("/")
        obj = re.search(r"^:pyobject:\s*(\S+)", options, re.MULTILINE)
        out.append((file, obj.group(1).split(".")[0] if obj else None))
    return out


def chapter_paper(text: str) -> tuple[str, str]:
    """``(title, arxiv_id)``: the first arXiv id the chapter cites and the last italic span before
    it in the same paragraph (``("", "")`` when the chapter cites none)."""
    m = ARXIV.search(text)
    if not m:
        return "", ""
    paragraph = text[:m.start()].rsplit("\n\n", 1)[-1]
    titles = TITLE.findall(paragraph)
    return (" ".join(titles[-1].split()) if titles else ""), m.group(1)


def prerequisites(text: str) -> list[str]:
    """The chapter labels (``ch-<stem>``) a chapter's "Builds on" admonition names, in its order."""
    m = BUILDS_ON.search(text)
    return CHAPTER_REF.findall(m.group(1)) if m else []


def toc_parts(root: Path = ROOT) -> list[tuple[str, list[str]]]:
    """``(caption, [stem, ...])`` for each part of the table of contents holding chapters."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    parts = []
    for part in toc.get("parts", []):
        stems = [c["file"] for c in part.get("chapters", []) if c.get("file", "").startswith(("book/", "notebooks/"))]
        if stems:
            parts.append((part.get("caption", ""), stems))
    return parts


def toc_stems(root: Path = ROOT) -> list[str]:
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    stems = []

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                stems.append(entry["file"])
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    return [s for s in stems if s.startswith(("book/", "notebooks/"))]


def catalogue(ledger_rows: list[dict] | None = None, root: Path = ROOT) -> list[Entry]:
    """One :class:`Entry` per chapter of the table of contents, in its order."""
    stems = [s for s in toc_stems(root) if (root / f"{s}.md").exists()]
    texts = {s: (root / f"{s}.md").read_text() for s in stems}
    includes = {s: chapter_includes(texts[s], str(Path(s).parent)) for s in stems}
    entries = {s: Entry(s, *chapter_paper(texts[s])) for s in stems}
    by_label = {"ch-" + Path(s).name.replace("_", "-"): s for s in stems}
    for s, entry in entries.items():
        entry.builds_on = [by_label[label] for label in prerequisites(texts[s]) if label in by_label]
    for part in registered_parts():
        exact = [s for s in stems if (part.file, part.obj) in includes[s]]
        owner = exact[0] if exact else None
        if owner is None and part.file.startswith("rlcourse/methods/"):
            owner = next((s for s in stems if any(f == part.file for f, _ in includes[s])), None)
        if owner is not None:
            entries[owner].parts.append(part)
    tests = {p.name: p.read_text() for p in sorted((root / "tests").glob("test_*.py"))}
    for s, entry in entries.items():
        names = {Path(s).name} | {Path(p.file).stem for p in entry.parts if p.file.startswith("rlcourse/methods/")}
        entry.tests = [t for t, text in tests.items()
                       if any(re.search(rf"(^|_){re.escape(n)}(_|\.py$)", t[len("test_"):]) for n in names)
                       or re.search(rf"\b{re.escape(s)}(\.md)?\b", text)]
    for row in ledger_rows or []:
        stem = "book/" + row["claim"]["key"].split("/")[0]
        if stem in entries:
            entries[stem].verdicts[row["verdict"]] = entries[stem].verdicts.get(row["verdict"], 0) + 1
    return [entries[s] for s in stems]


def loop_parts(entries: list[Entry]) -> list[Part]:
    """The registered parts no chapter adds: the loop's own defaults and shared pieces."""
    owned = {p for e in entries for p in e.parts}
    return [p for p in registered_parts() if p not in owned]


def papers_markdown(entries: list[Entry], link=None) -> str:
    """The catalogue as a Markdown table; ``link(stem)`` may turn a stem into a MyST link."""
    head = ("| chapter | paper | registered parts it adds | tests | verdicts (last build) |\n"
            "|---|---|---|---|---|")
    lines = [head]
    for e in entries:
        paper = f"*{e.title}*, arXiv:{e.arxiv}" if e.title else (f"arXiv:{e.arxiv}" if e.arxiv else "")
        parts = "; ".join(f"{kind}: " + ", ".join(f"`{p.name}`" for p in e.parts if p.kind == kind)
                          for kind in sorted({p.kind for p in e.parts}))
        tests = ", ".join(f"`{t}`" for t in e.tests)
        verdicts = ", ".join(f"{n} {v}" for v, n in sorted(e.verdicts.items())) or "none recorded"
        cells = [link(e.stem) if link else e.stem, paper, parts or "(none: builds on the loop's parts)", tests, verdicts]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines)
