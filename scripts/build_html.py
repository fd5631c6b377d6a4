"""Build the HTML book from chapters that were already executed, without executing them again.

    python scripts/build_html.py --executed DIR --out STAGING

The book's sources are copied to ``STAGING`` (the files git tracks, plus untracked files it does not
ignore); every chapter with an executed notebook ``DIR/<stem>.ipynb`` (``tests/test_chapters.py``
writes them) replaces its ``.md`` there, and Jupyter Book builds with ``-W -n`` (warnings are
errors, every cross-reference must resolve). A chapter with no executed copy is executed by the
build in the current profile (``execute_notebooks: auto`` runs only notebooks without outputs).
The HTML lands in ``STAGING/_build/html``. ``make book`` is the build a reader runs; this one lets
the test suite look at the whole book in a browser at the cost of one Sphinx run.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]


def source_files(root: Path) -> list[Path]:
    """The files of the book's sources: tracked and untracked-but-not-ignored (git), else every file
    outside the build, virtual-environment and cache folders."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, check=True,
                             capture_output=True, text=True).stdout
        return [Path(line) for line in out.splitlines() if (root / line).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "_build", "__pycache__", ".pytest_cache", ".ipynb_checkpoints"}
        return [p.relative_to(root) for p in root.rglob("*") if p.is_file() and not skip & set(p.relative_to(root).parts)]


def stage(root: Path, executed: Path | None, staging: Path) -> list[str]:
    """Copy the sources to ``staging``, swap in the executed notebooks; return the stems swapped."""
    if staging.exists():
        shutil.rmtree(staging)
    for rel in source_files(root):
        target = staging / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
    swapped = []
    if executed is not None and executed.exists():
        for nb_path in sorted(executed.rglob("*.ipynb")):
            stem = nb_path.relative_to(executed).with_suffix("")
            md = staging / stem.with_suffix(".md")
            if not md.exists():
                continue  # an executed copy of a chapter that is no longer in the sources
            nb = nbformat.read(nb_path, as_version=4)
            nb.metadata.pop("jupytext", None)  # the .ipynb is the source now, not a pair of the .md
            nbformat.write(nb, md.with_suffix(".ipynb"))
            md.unlink()
            swapped.append(str(stem))
    config = yaml.safe_load((staging / "_config.yml").read_text())
    config.setdefault("execute", {})["execute_notebooks"] = "auto"
    (staging / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    return swapped


def build(staging: Path, timeout: int = 3600) -> subprocess.CompletedProcess:
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(staging), "--warningiserror", "--nitpick",
           "--keep-going"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--executed", type=Path, help="folder of executed notebooks, <stem>.ipynb")
    parser.add_argument("--out", type=Path, required=True, help="staging folder (replaced)")
    args = parser.parse_args()
    swapped = stage(ROOT, args.executed, args.out)
    print(f"{len(swapped)} chapters taken from executed notebooks")
    result = build(args.out)
    print(result.stdout[-4000:], result.stderr[-4000:], sep="\n")
    sys.exit(result.returncode)


if __name__ == "__main__":
    main()
