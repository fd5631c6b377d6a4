# The two commands of the README: `make book` and `make test`.
# Both create .venv on a fresh machine and install everything from the package registries.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# no tqdm widgets from transformers/huggingface_hub in executed chapters: their saved state would make
# the offline HTML book fetch the widget JavaScript from a CDN (tests/test_web_book.py checks)
export HF_HUB_DISABLE_PROGRESS_BARS := 1
# Chapters glue matplotlib figures: their kernels need the inline backend (not Agg) for a figure's
# output to carry a PNG; scripts and tests without a kernel use Agg (tests/conftest.py).
INLINE := module://matplotlib_inline.backend_inline

.PHONY: book test claims bench lab assignments venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[book,test]'
	$(PY) -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

# Execute every chapter in the book profile and build the HTML into _build/html.
# scripts/execute_book.py executes the chapters into the execution cache first (CHAPTER_JOBS at a time;
# every failure listed, the chapters that succeeded kept), which Jupyter Book then reads; a second run
# re-executes only the chapters that changed.
# Chapters record their verdicts in _build/ledger; reports/reproduction.md (always re-executed, and
# read last) turns them into the "Reproduction status" page.
# JOBS: the processes make book (and make claims) may keep busy at once; by default the cores this
# process may use, at most one per 2 GiB of memory (one process's peak in make claims JOBS=1 was
# 1.7 GB), so 2 on a 2-core machine. make book executes CHAPTER_JOBS chapters side by side (default:
# JOBS), each kernel on cores / CHAPTER_JOBS torch threads (OMP_NUM_THREADS, which
# rlcourse.torch_threads reads), and runs each chapter's study grid (rlcourse.studies) on
# JOBS / CHAPTER_JOBS worker processes, at least one; one runs the cells in the chapter's own kernel.
# RLCOURSE_BACKEND=ray with RAY_ADDRESS set sends the cells to a Ray cluster instead.
# On 2 cores (fresh clone, idle machine; the README gives the times): chapters side by side, the
# default, beat one chapter at a time with its grids on 2 workers, whose chapters leave one core idle
# through the ~1,400 s of cells outside any grid. An earlier try of chapters side by side was slower
# (the lab, 141 s alone, ran over 20 minutes beside the advantages chapter's workers): its chapters
# then forced two torch threads each, whatever the environment said, and spinning threads stall.
JOBS ?= $(shell $(PYTHON) -c "import os; cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1; memory = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'); print(max(1, min(cores, memory // 2**31)))")
CHAPTER_JOBS ?= $(JOBS)
GRID_JOBS = $(shell echo $$(( $(JOBS) / $(CHAPTER_JOBS) > 1 ? $(JOBS) / $(CHAPTER_JOBS) : 1 )))
# per-cell limit of that step: the advantages chapter's race passed the 900 s of _config.yml (which a
# build without this step keeps) in a fresh-clone make book at load ~3, and took 1378 s at JOBS=1 on an
# idle 2-core machine (7 Dec 2026): an hour leaves a laptop 2.6 times slower room to finish
BOOK_TIMEOUT ?= 3600
BOOK_ENV = RLCOURSE_JOBS=$(GRID_JOBS) RLCOURSE_LEDGER=$(CURDIR)/_build/ledger/$${RLCOURSE_PROFILE:-book} RLCOURSE_PROFILE=$${RLCOURSE_PROFILE:-book} MPLBACKEND=$(INLINE)
book: $(STAMP)
	$(BOOK_ENV) $(PY) scripts/execute_book.py --jobs $(CHAPTER_JOBS) --timeout $(BOOK_TIMEOUT)
	touch reports/papers.md reports/syllabus.md reports/reproduction.md reports/execution.md  # Sphinx re-reads (and so re-executes) only files that changed
	$(BOOK_ENV) $(VENV)/bin/jupyter-book build . --warningiserror --nitpick --keep-going

# Unit tests, then every chapter and capstone executed in the smoke profile.
test: $(STAMP)
	RLCOURSE_PROFILE=smoke $(PY) -m pytest -q

# The chapters' claims in the book profile (slow: several minutes per chapter), one test at a time, each
# grid on JOBS worker processes.
claims: $(STAMP)
	RLCOURSE_JOBS=$(JOBS) RLCOURSE_PROFILE=book $(PY) -m pytest -q -m claims --timeout 0

# JupyterLab on the chapters: a chapter's .md opens as a notebook (jupytext), with this repository's
# settings (.jupyter/lab/user-settings) instead of the user's own; jupyterlab-myst renders its MyST
# (the README's "Reading a chapter in JupyterLab" says what does not render; tests/test_lab_myst.py).
lab: $(STAMP)
	JUPYTERLAB_SETTINGS_DIR=$(CURDIR)/.jupyter/lab/user-settings $(VENV)/bin/jupyter lab

# Student versions of the Foundations chapters (solutions removed) with pytest autograders, and the
# key, in _build/assignments/<chapter>/ (see scripts/make_assignments.py).
assignments: $(STAMP)
	$(PY) scripts/make_assignments.py --out _build/assignments

# Speed targets; see benchmarks/README.md. The GRPO step's op and call counts (load-independent) are
# printed before the comparison with TRL, whose ratio is a target only on an otherwise idle machine.
bench: $(STAMP)
	$(PY) -c "import trl" 2>/dev/null || $(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/build_base_model.py
	$(PY) benchmarks/sampling_speed.py
	$(PY) benchmarks/grpo_step_profile.py
	$(PY) benchmarks/grpo_vs_trl.py

clean:
	rm -rf _build
