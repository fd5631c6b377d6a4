"""Execute the book's chapters into Jupyter Book's execution cache, several at a time.

    python scripts/execute_book.py [--jobs N] [--timeout S] [--only STEM ...]

Jupyter Book 1 executes notebooks one after another while Sphinx reads them, and stops the build at
the first chapter that fails. This script does the execution part first: every chapter
of ``_toc.yml`` that is a notebook (and has no ``mystnb.execution_mode`` of its own, as the generated
report pages do) and is not in the cache yet is executed in one of ``--jobs`` worker processes and
stored in ``_build/.jupyter_cache`` exactly as myst-nb stores it (same reader, same executor, same
``execution_seconds`` record). The Sphinx build that follows finds every chapter cached ("Using cached
notebook") and only renders. A chapter whose source changed hashes differently and runs again; one
that did not is skipped, so a second ``make book`` executes only what changed. The cache holds one
profile's executions: run in another profile, it is emptied first (:func:`cache_for_profile`).

The kernels inherit this process's environment (``RLCOURSE_PROFILE``, ``RLCOURSE_LEDGER``,
``MPLBACKEND``: the Makefile sets them for both steps), and ``OMP_NUM_THREADS`` = cores / jobs unless
it is set. Exits 1, naming the chapters, if any failed;
the others stay cached.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import nbformat
import yaml

from rlcourse.catalogue import toc_stems  # the chapters of _toc.yml (book/ and notebooks/), in order

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "_build" / ".jupyter_cache"


def front_matter(text: str) -> dict:
    if not text.startswith("---\n"):
        return {}
    return yaml.safe_load(text[4:text.index("\n---", 4)]) or {}


def executable_chapters(root: Path = ROOT) -> list[Path]:
    """The toc's chapters that are notebooks (jupytext front matter) and leave execution to the cache
    (none sets its own ``mystnb.execution_mode``; the report pages, which do, are not chapters)."""
    out = []
    for stem in toc_stems(root):
        path = root / f"{stem}.md"
        if not path.exists():
            continue
        meta = front_matter(path.read_text())
        if "jupytext" in meta and "execution_mode" not in (meta.get("mystnb") or {}):
            out.append(path)
    return out


def read_notebook(path: Path, root: Path = ROOT):
    """``(notebook, read_fmt)``: the notebook myst-nb builds from ``path`` with the book's
    configuration (so the cache key is the one the Sphinx build looks up), and its reader's name."""
    from myst_nb.core.config import NbParserConfig
    from myst_nb.core.read import create_nb_reader
    from myst_parser.config.main import MdParserConfig

    cfg = yaml.safe_load((root / "_config.yml").read_text())
    exts = cfg.get("parse", {}).get("myst_enable_extensions", [])
    reader = create_nb_reader(str(path), MdParserConfig(enable_extensions=set(exts)), NbParserConfig(),
                              path.read_text())
    if reader is None:
        raise ValueError(f"{path} is not a notebook myst-nb can read")
    return reader.read(path.read_text()), reader.read_fmt


def _execute(job: tuple[str, int]) -> tuple[str, str | None, float, str | None]:
    """Worker: execute one chapter; return (path, executed notebook as JSON or None, seconds, error)."""
    from jupyter_cache.executors.utils import single_nb_execution

    path, timeout = Path(job[0]), job[1]
    nb, _ = read_notebook(path)
    result = single_nb_execution(nb, cwd=str(path.parent), timeout=timeout, allow_errors=False, meta_override=True)
    if result.err is not None:
        return str(path), None, result.time, f"{result.err.__class__.__name__}: {str(result.err)[-2000:]}"
    return str(path), nbformat.writes(nb), result.time, None


def cache_for_profile(profile: str, cache_dir: Path = CACHE) -> None:
    """Empty ``cache_dir`` when it holds chapters executed in another profile, and mark it with ``profile``.

    The cache's key is a chapter's source, not the sizes it ran at, so without this a chapter executed in
    the smoke profile would be reused by a book-profile build (and its smoke verdicts shown as the book's).
    A cache with no mark (made before marks were written) is treated as another profile's."""
    mark = cache_dir / "PROFILE"
    held = mark.read_text().strip() if mark.exists() else None
    if cache_dir.exists() and any(cache_dir.iterdir()) and held != profile:
        print(f"the execution cache {cache_dir} holds chapters executed in the {held or 'unmarked'} profile; "
              f"emptying it for the {profile} profile", flush=True)
        shutil.rmtree(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    mark.write_text(profile + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1, help="chapters executed at once (default 1)")
    parser.add_argument("--timeout", type=int, help="per-cell timeout in seconds (default: _config.yml's)")
    parser.add_argument("--only", nargs="*", help="stems to execute (default: every chapter)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    from jupyter_cache import get_cache
    from jupyter_cache.cache.main import CacheBundleIn

    timeout = args.timeout or yaml.safe_load((ROOT / "_config.yml").read_text())["execute"]["timeout"]
    chapters = executable_chapters()
    if args.only:
        unknown = sorted(set(args.only) - {str(p.relative_to(ROOT).with_suffix("")) for p in chapters})
        if unknown:
            parser.error(f"not executable chapters of _toc.yml: {unknown}")
        chapters = [p for p in chapters if str(p.relative_to(ROOT).with_suffix("")) in args.only]
    from rlcourse import profile as current_profile  # validates RLCOURSE_PROFILE (default "book")
    from rlcourse.profiles import usable_cores

    cache_for_profile(current_profile().name)
    cache = get_cache(str(CACHE))
    todo = []
    for path in chapters:
        try:
            cache.match_cache_notebook(read_notebook(path)[0])
        except KeyError:
            todo.append(path)
    # the longest first (by the time an earlier version took, where the cache has one), so that a long
    # chapter does not start last and run alone
    took = {r.uri: (r.data or {}).get("execution_seconds", 0.0) for r in cache.list_cache_records()}
    todo.sort(key=lambda p: -took.get(str(p), 0.0))
    print(f"{len(chapters) - len(todo)} chapters cached, {len(todo)} to execute with {args.jobs} workers", flush=True)
    # chapters side by side must not each start one BLAS/OpenMP thread per core (oversubscribed threads
    # spin against each other)
    threads = str(max(1, usable_cores() // args.jobs))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, threads)
    failed, start = [], time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(_execute, (str(p), timeout)) for p in todo]
        for future in as_completed(futures):
            path, nb_json, seconds, error = future.result()
            rel = Path(path).relative_to(ROOT)
            if error:
                failed.append(str(rel))
                print(f"FAILED {rel} after {seconds:.0f} s: {error}", flush=True)
                continue
            record = cache.add_nb_to_project(path, read_data=read_notebook(Path(path))[1])
            cache.cache_notebook_bundle(CacheBundleIn(nbformat.reads(nb_json, 4), record.uri,
                                                      data={"execution_seconds": seconds}),
                                        check_validity=False, overwrite=True)
            print(f"{rel}: executed in {seconds:.0f} s ({time.perf_counter() - start:.0f} s so far)", flush=True)
    if failed:
        print(f"{len(failed)} chapters failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
