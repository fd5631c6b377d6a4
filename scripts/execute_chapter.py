"""Execute one chapter (a MyST-markdown notebook) in the current profile and report its time.

    RLCOURSE_PROFILE=smoke python scripts/execute_chapter.py book/lab.md [--save out.ipynb]
"""
import argparse
import time
from pathlib import Path

import jupytext
import nbclient
import nbformat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapter", type=Path)
    parser.add_argument("--save", type=Path, help="write the executed notebook here")
    parser.add_argument("--timeout", type=int, default=900, help="per-cell timeout in seconds")
    args = parser.parse_args()
    nb = jupytext.read(args.chapter)
    start = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=args.timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(args.chapter.resolve().parent)}}).execute()
    print(f"{args.chapter}: executed in {time.perf_counter() - start:.1f} s")
    if args.save:
        nbformat.write(nb, args.save)


if __name__ == "__main__":
    main()
