"""Test-session settings: smoke profile, offline hub, and a fresh model cache for the session.

A fresh cache means every base model the tests use is built by the code under test, never
loaded from a stale copy left by an older version.
"""
import os
import sys
import tempfile
from pathlib import Path

# scripts/ (the book's build and execution scripts) importable by the tests that drive them
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

os.environ.setdefault("RLCOURSE_PROFILE", "smoke")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # as `make`: no widget state in executed chapters
if "RLCOURSE_TEST_KEEP_CACHE" not in os.environ:
    os.environ["RLCOURSE_CACHE"] = tempfile.mkdtemp(prefix="rlcourse-test-cache-")

# chapters executed by the tests record their verdicts here, not in the user's ledger
os.environ.setdefault("RLCOURSE_LEDGER", tempfile.mkdtemp(prefix="rlcourse-test-ledger-"))
# ... and are kept here as executed notebooks, from which tests/test_web_book.py builds the HTML book
os.environ.setdefault("RLCOURSE_EXECUTED_DIR", tempfile.mkdtemp(prefix="rlcourse-test-executed-"))

import torch  # noqa: E402

torch.set_num_threads(min(2, os.cpu_count() or 1))
