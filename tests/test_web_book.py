"""The HTML book as a reader sees it: built from the chapters the suite executed, opened in Chromium.

The build (``scripts/build_html.py``) reuses the notebooks ``tests/test_chapters.py`` executed in the
smoke profile (this file runs after it: pytest collects files in name order), so no chapter runs
twice; a chapter executed by nothing is executed by the build. Sphinx builds with ``-W -n``, so a
broken cross-reference fails here even when single-chapter builds pass.

The browser checks need Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them);
without them they are skipped with a message saying so, and the build and link checks still run.
Screenshots of a few pages are kept in ``_build/browser/`` as artefacts of the run.
"""
from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest

from test_chapters import toc_files
from test_figures import meaningless_alt

ROOT = Path(__file__).resolve().parents[1]
ARTEFACTS = ROOT / "_build" / "browser"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
SCREENSHOTS = ("intro", "book/lab", "book/ppo", "book/banel")
# console messages that are not the page's fault: the browser asks every server for a favicon, and
# the theme logs that it falls back to its default colour mode on a first visit (empty localStorage)
HARMLESS = ("favicon.ico", "Got invalid theme mode")

pytestmark = pytest.mark.web


@pytest.fixture(scope="module")
def html(tmp_path_factory) -> Path:
    import build_html  # scripts/, put on sys.path by conftest

    staging = tmp_path_factory.mktemp("book-src")
    executed = Path(os.environ["RLCOURSE_EXECUTED_DIR"])
    swapped = build_html.stage(ROOT, executed, staging)
    start = time.perf_counter()
    result = build_html.build(staging)
    elapsed = time.perf_counter() - start
    print(f"HTML build: {len(swapped)} executed chapters reused, {elapsed:.0f} s")
    assert result.returncode == 0, f"the book build failed:\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
    return staging / "_build" / "html"


def page_paths(html: Path) -> list[Path]:
    pages = [html / f"{stem}.html" for stem in toc_files()]
    missing = [str(p.relative_to(html)) for p in pages if not p.exists()]
    assert not missing, f"pages of _toc.yml missing from the build: {missing}"
    return pages


def test_every_internal_link_and_anchor_resolves(html):
    from bs4 import BeautifulSoup

    ids: dict[Path, set] = {}

    def anchors(path: Path) -> set:
        if path not in ids:
            soup = BeautifulSoup(path.read_text(errors="replace"), "html.parser")
            ids[path] = {tag.get("id") for tag in soup.find_all(id=True)} | \
                        {tag.get("name") for tag in soup.find_all("a", attrs={"name": True})}
        return ids[path]

    broken = []
    for page in page_paths(html):
        soup = BeautifulSoup(page.read_text(errors="replace"), "html.parser")
        for a in soup.find_all("a", href=True):
            href = a["href"]
            parsed = urlparse(href)
            if parsed.scheme or href.startswith(("mailto:", "//", "javascript:")):
                continue  # external: the book is read offline, not checked here
            target = (page.parent / unquote(parsed.path)).resolve() if parsed.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(html)}: {href} (no such file)")
            elif parsed.fragment and target.suffix == ".html" and parsed.fragment not in anchors(target):
                broken.append(f"{page.relative_to(html)}: {href} (no such anchor)")
    assert not broken, f"{len(broken)} broken internal links:\n" + "\n".join(broken[:40])


def test_every_image_has_a_meaningful_alt_text(html):
    """Each image in a page's content (figures glued or shown by a cell) carries the alt text its
    chapter wrote, not the hash Sphinx names the file after (tests/test_figures.py checks the sources)."""
    from bs4 import BeautifulSoup

    problems, n_images = [], 0
    for page in page_paths(html):
        soup = BeautifulSoup(page.read_text(errors="replace"), "html.parser")
        for img in (soup.find("main") or soup).find_all("img"):
            n_images += 1
            src = Path(unquote(urlparse(img.get("src", "")).path)).name
            why = meaningless_alt(img.get("alt"), src, Path(src).stem)
            if why:
                problems.append(f"{page.relative_to(html)}: <img src={src!r}>: {why}")
    assert n_images, "no images in the built chapters: the check would pass vacuously"
    assert not problems, f"{len(problems)} images without a meaningful alt text:\n" + "\n".join(problems[:40])


# ---------------------------------------------------------------------------- the browser
@pytest.fixture(scope="module")
def server(html):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # the test reports problems; a line per request is noise
            pass

    handler = functools.partial(Quiet, directory=str(html))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no browser here: install Debian's chromium and chromium-driver (`.ci/run` does) "
                    "to run the browser tests")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)  # no driver download
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


# the page's visible prose (code blocks, scripts and rendered math left out), to look for raw TeX
PROSE_JS = """
const body = document.querySelector('main') || document.body;
const clone = body.cloneNode(true);
clone.querySelectorAll('pre, code, script, style, mjx-container, .highlight, textarea').forEach(e => e.remove());
return clone.innerText;
"""
IMAGES_JS = """
return Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src);
"""
MATH_JS = """
const done = arguments[arguments.length - 1];
const math = document.querySelectorAll('.math').length;
if (!math) { done([0, 0]); return; }
const count = () => done([math, document.querySelectorAll('mjx-container').length]);
if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
  MathJax.startup.promise.then(count, () => done([math, -1]));
} else { setTimeout(count, 3000); }
"""


def test_every_page_loads_cleanly_in_chromium(html, server, browser):
    """Each page of the table of contents: no console error; its math typeset by the offline
    MathJax with no raw $$ or \\begin left in the prose; every image loaded; no figure shown as
    its text repr."""
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    problems = []
    start = time.perf_counter()
    pages = page_paths(html)
    for page in pages:
        rel = page.relative_to(html).as_posix()
        browser.get_log("browser")  # drop what earlier pages left
        browser.get(urljoin(server, rel))
        n_math, n_rendered = browser.execute_async_script(MATH_JS)
        if n_math and n_rendered <= 0:
            problems.append(f"{rel}: {n_math} math elements, none typeset by MathJax")
        prose = browser.execute_script(PROSE_JS)
        for raw in ("$$", "\\begin{", "<Figure size"):
            if raw in prose:
                at = prose.index(raw)
                problems.append(f"{rel}: raw {raw!r} in the page text: ...{prose[max(0, at - 60):at + 60]!r}...")
        broken = browser.execute_script(IMAGES_JS)
        if broken:
            problems.append(f"{rel}: images that did not load: {broken}")
        errors = [e["message"] for e in browser.get_log("browser")
                  if e["level"] == "SEVERE" and not any(h in e["message"] for h in HARMLESS)]
        if errors:
            problems.append(f"{rel}: console errors: {errors}")
        stem = rel[:-len(".html")]
        if stem in SCREENSHOTS:
            browser.save_screenshot(str(ARTEFACTS / f"{stem.replace('/', '_')}.png"))
    print(f"{len(pages)} pages checked in Chromium in {time.perf_counter() - start:.0f} s; "
          f"screenshots in {ARTEFACTS}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)


@pytest.mark.parametrize("query, stem", [("GIPO", "book/gipo"), ("BaNEL", "book/banel"),
                                          ("proximal policy optimization", "book/ppo")])
def test_search_finds_a_chapter_by_its_method(html, server, browser, query, stem):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(urljoin(server, f"search.html?q={query}"))
    WebDriverWait(browser, 30).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "#search-results li, #search-results p.search-summary"))
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#search-results li"))
    links = [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "#search-results li a")]
    assert any(urlparse(link).path.endswith(f"/{stem}.html") for link in links), \
        f"searching {query!r} did not list {stem}.html; it listed {links[:10]}"
    if query == "GIPO":
        browser.save_screenshot(str(ARTEFACTS / "search.png"))
