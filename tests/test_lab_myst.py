"""A chapter as a JupyterLab reader sees it: `make lab`'s JupyterLab, with jupyterlab-myst, in Chromium.

JupyterLab's own Markdown renderer knows no MyST, so without jupyterlab-myst a chapter's admonitions,
propositions and references show as raw text (``:::{admonition}``, ``{ref}`ch-advantages```). The
browser test starts JupyterLab on a free localhost port with the repository's settings
(``JUPYTERLAB_SETTINGS_DIR=.jupyter/lab/user-settings``, as ``make lab``; no token, no browser), opens a
chapter as a notebook (jupytext), and checks the rendered markdown cells. The server serves a copy of
the chapter in a temporary folder: opening a notebook starts a kernel, whose kernelspec JupyterLab
writes into the notebook's metadata and autosaves, so the repository's chapter is never opened.
Screenshots are kept in ``_build/lab/``.

It needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them) and is skipped,
saying so, without them. The check of the sources at the end needs no browser.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTEFACTS = ROOT / "_build" / "lab"
SETTINGS = ROOT / ".jupyter" / "lab" / "user-settings"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
CHAPTER = "book/ppo.md"
# what a chapter's MyST looks like when nothing rendered it
RAW_MYST = (":::{", "```{", "{ref}`", "{prf:ref}`", "{numref}`", "{eq}`", "{doc}`", "$$", "\\begin{")
ADMONITIONS = ("admonition", "note", "tip", "hint", "important", "warning", "caution", "attention", "danger",
               "error", "seealso")
# the one directive of the book that jupyterlab-myst does not know (the README says so)
UNKNOWN_ALLOWED = {"glue:figure"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def directives(text: str, name: str) -> int:
    """How many ``name`` directives (colon or backtick fence) the chapter's source opens."""
    return len(re.findall(rf"^\s*(?::{{3,}}|`{{3,}})\s*\{{{re.escape(name)}\}}", text, flags=re.M))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab serving a copy of the chapter; yields its base URL and stops the server after."""
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no browser here: install Debian's chromium and chromium-driver (`.ci/run` does) "
                    "to run the JupyterLab test")
    exe = Path(sys.executable).with_name("jupyter-lab")
    if not exe.exists():
        pytest.skip("jupyterlab is not installed in this environment (the book and test extras install it)")
    pytest.importorskip("jupyterlab_myst", reason="jupyterlab-myst is not installed (the book and test extras install it)")
    pytest.importorskip("selenium")

    tmp = tmp_path_factory.mktemp("lab")
    served = tmp / "root"
    (served / Path(CHAPTER).parent).mkdir(parents=True)
    shutil.copy(ROOT / CHAPTER, served / CHAPTER)
    shutil.copy(ROOT / "jupytext.toml", served / "jupytext.toml")  # the format the chapter is saved in
    port = free_port()
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(SETTINGS),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),  # not the user's saved layout
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp / "config")}
    log = open(tmp / "lab.log", "w+")  # a file, not a pipe nobody reads (a full pipe blocks the server)
    proc = subprocess.Popen([str(exe), "--no-browser", f"--port={port}", "--ip=127.0.0.1",
                             "--IdentityProvider.token=", f"--ServerApp.root_dir={served}",
                             "--allow-root"],  # CI runs as root
                            env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(base + "/api/status", timeout=10).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"JupyterLab did not start:\n{log.read()[-3000:]}")
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()  # the server shuts down the kernel it started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def browser(lab, tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1400,1000",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)  # no driver download
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


# per markdown cell: whether jupyterlab-myst rendered it, its rendered text (code, math and the folded
# boxes of unknown directives left out; folded solutions kept), the directives it did not know, and
# the references it could not resolve
CELLS_JS = """
const unknownTitle = e => /- Unknown Directive$/.test(e.textContent.trim());
return Array.from(document.querySelectorAll('.jp-Notebook .jp-MarkdownCell')).map(cell => {
  const myst = cell.querySelector('.myst');
  if (!myst) return {myst: false, text: cell.innerText, unknown: [], unresolved: []};
  const titles = Array.from(myst.querySelectorAll('details > summary .myst-exercise-title')).filter(unknownTitle);
  const unknown = titles.map(t => (t.querySelector('code') || t).textContent.trim());
  const unresolved = Array.from(myst.querySelectorAll('[title="Cross Reference Not Found"]'))
    .map(e => e.textContent.trim());
  const clone = myst.cloneNode(true);
  clone.querySelectorAll('details').forEach(d => {
    const t = d.querySelector(':scope > summary .myst-exercise-title');
    if (t && unknownTitle(t)) d.remove();
  });
  clone.querySelectorAll('pre, code, .katex').forEach(e => e.remove());
  return {myst: true, text: clone.textContent, unknown, unresolved};
});
"""


@pytest.mark.web
def test_a_chapter_renders_its_myst_in_jupyterlab(lab, browser):
    """ppo.md opened as a notebook: every markdown cell rendered by jupyterlab-myst, its admonitions
    and propositions as rendered boxes (as many as the source has), exercises and solutions too, and
    no raw MyST left in the visible text."""
    import jupytext
    from selenium.webdriver.support.ui import WebDriverWait

    base = lab
    source = (ROOT / CHAPTER).read_text()
    n_markdown = sum(c.cell_type == "markdown" for c in jupytext.read(ROOT / CHAPTER).cells)
    browser.get(f"{base}/lab/tree/{CHAPTER}")
    try:
        # rendered by jupyterlab-myst (.myst) or, without it, by JupyterLab's own renderer
        WebDriverWait(browser, 180).until(lambda d: d.execute_script(
            "return document.querySelectorAll('.jp-Notebook .jp-MarkdownCell .myst, "
            ".jp-Notebook .jp-MarkdownCell .jp-RenderedMarkdown').length") >= n_markdown)
    finally:
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTEFACTS / "ppo_top.png"))
    time.sleep(2)  # math and references settle after the first render

    cells = browser.execute_script(CELLS_JS)
    assert len(cells) == n_markdown, f"{len(cells)} markdown cells in JupyterLab, {n_markdown} in {CHAPTER}"
    assert all(c["myst"] for c in cells), "markdown cells not rendered by jupyterlab-myst (is it installed?)"
    problems = []
    for i, cell in enumerate(cells):
        for raw in RAW_MYST:
            if raw in cell["text"]:
                at = cell["text"].index(raw)
                problems.append(f"cell {i}: raw {raw!r}: ...{cell['text'][max(0, at - 60):at + 60]!r}...")
        for name in set(cell["unknown"]) - UNKNOWN_ALLOWED:
            problems.append(f"cell {i}: directive {name!r} unknown to jupyterlab-myst")
        # a reference to a proposition, exercise or equation of this chapter resolves; to another
        # chapter, a section or a glued figure it cannot (one notebook at a time), and shows its label
        for label in cell["unresolved"]:
            if re.search(rf"^\s*:label:\s*{re.escape(label)}\s*$|^\$\$\s*\({re.escape(label)}\)", source, flags=re.M):
                problems.append(f"cell {i}: the reference to {label!r}, defined in this chapter, did not resolve")
    unresolved = sorted({label for c in cells for label in c["unresolved"]})
    print(f"{CHAPTER}: references JupyterLab shows as labels (other chapters, figures): {unresolved}")
    assert not problems, "raw MyST in the chapter as JupyterLab shows it:\n" + "\n".join(problems)

    counts = browser.execute_script("""
      const q = s => document.querySelectorAll('.jp-Notebook .jp-MarkdownCell .myst ' + s).length;
      return {admonition: q('aside.myst-admonition'), proof: q('aside.myst-proof'),
              exercise: q('aside.myst-exercise'), math: q('.katex'),
              solution: Array.from(document.querySelectorAll('.jp-Notebook .myst details > summary'))
                .filter(e => e.textContent.trim().startsWith('Solution to')).length};""")
    expected = {"admonition": sum(directives(source, k) for k in ADMONITIONS),
                "proof": sum(directives(source, f"prf:{k}") for k in ("proposition", "proof", "corollary",
                                                                         "lemma", "theorem", "definition")),
                "exercise": directives(source, "exercise")}
    assert expected["admonition"] and expected["proof"], f"{CHAPTER} has no admonition or proposition to check"
    for kind, n in expected.items():
        assert counts[kind] == n, f"{kind}: {counts[kind]} rendered in JupyterLab, {n} in {CHAPTER}"
    assert counts["solution"] == directives(source, "solution"), counts  # folded, as in the HTML book
    assert counts["math"] > 0, "no math typeset (KaTeX) in the chapter"

    browser.execute_script("document.querySelector('.jp-Notebook aside.myst-proof').scrollIntoView()")
    time.sleep(1)
    browser.save_screenshot(str(ARTEFACTS / "ppo_proposition.png"))


def chapter_titles() -> dict[str, tuple[Path, str]]:
    """Each chapter's label (the ``(label)=`` above its title) -> (its file, its title)."""
    titles = {}
    for path in sorted([*ROOT.glob("book/*.md"), *ROOT.glob("notebooks/*.md")]):
        m = re.search(r"^\(([\w-]+)\)=\s*\n+# (.+)$", path.read_text(), flags=re.M)
        if m:
            titles[m[1]] = (path, m[2].strip())
    return titles


def test_a_reference_to_another_chapter_names_it():
    """JupyterLab renders one notebook at a time: a bare {ref}`ch-ppo` to another chapter shows there
    as its label with a warning mark. With its text written out, {ref}`Title <ch-ppo>`, it reads the
    same in Lab and in the HTML book (which shows a chapter's title for a bare reference)."""
    titles = chapter_titles()
    assert "ch-ppo" in titles, "no chapter labels found: the check would pass vacuously"
    bare = []
    for path in sorted([*ROOT.glob("book/*.md"), *ROOT.glob("notebooks/*.md")]):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for label in re.findall(r"\{ref\}`([\w-]+)`", line):
                if label in titles and titles[label][0] != path:
                    bare.append(f"{path.relative_to(ROOT)}:{n}: {{ref}}`{label}` -> "
                                f"{{ref}}`{titles[label][1]} <{label}>`")
    assert not bare, "references to another chapter without their text:\n" + "\n".join(bare)
