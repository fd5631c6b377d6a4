"""The Papers index is read from the sources (rlcourse.catalogue): check the readers it relies on."""
from rlcourse import catalogue as C


def test_a_chapter_paper_is_the_first_arxiv_id_with_the_italic_title_before_it():
    text = ("Intro *not this*.\n\n*Proximal Policy\nOptimization Algorithms*, by J. Schulman et al. (2017, "
            "arXiv:1707.06347), and later *GAE* (arXiv:1506.02438).")
    assert C.chapter_paper(text) == ("Proximal Policy Optimization Algorithms", "1707.06347")
    assert C.chapter_paper("no citation") == ("", "")


def test_includes_are_read_with_their_pyobject():
    text = ("```{literalinclude} ../rlcourse/methods/gipo.py\n:pyobject: gipo_weight\n```\n\n"
            "```{literalinclude} ../rlcourse/losses.py\n:lines: 1-5\n```\n")
    assert C.chapter_includes(text, "book") == [("rlcourse/methods/gipo.py", "gipo_weight"), ("rlcourse/losses.py", None)]


def test_every_part_a_chapter_module_registers_is_shown_by_a_chapter():
    """A registered method part that no chapter shows would be a part readers cannot find."""
    entries = C.catalogue()
    parts = C.registered_parts()
    assert parts and all(p.file != "?" for p in parts), [p for p in parts if p.file == "?"]
    orphans = [p for p in C.loop_parts(entries) if p.file.startswith("rlcourse/methods/")]
    assert not orphans, f"registered by a chapter module but shown by no chapter: {orphans}"
    assert all(e.arxiv for e in entries), [e.stem for e in entries if not e.arxiv]


def test_the_index_lists_every_chapter_with_its_parts():
    entries = C.catalogue([{"claim": {"key": "gipo/x"}, "verdict": "holds"}])
    table = C.papers_markdown(entries)
    assert table.count("\n") == len(entries) + 1
    gipo = next(e for e in entries if e.stem == "book/gipo")
    assert gipo.verdicts == {"holds": 1} and any(p.name == "gipo" for p in gipo.parts)
    assert "test_gipo.py" in gipo.tests


def test_prerequisites_come_from_the_builds_on_box_and_come_earlier_in_the_book():
    text = ":::{admonition} Builds on\n:class: seealso\n{ref}`ch-ppo` (clip), {ref}`the critic <ch-advantages>`.\n:::\n{ref}`ch-gipo`"
    assert C.prerequisites(text) == ["ch-ppo", "ch-advantages"]
    entries = C.catalogue()
    order = {e.stem: i for i, e in enumerate(entries)}
    later = [(e.stem, p) for e in entries for p in e.builds_on if order[p] >= order[e.stem]]
    assert not later, f"a chapter builds on one that comes after it: {later}"
    assert sum(bool(e.builds_on) for e in entries) >= len(entries) - 1  # every chapter but the first
