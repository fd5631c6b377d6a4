"""Studies: each chapter's experiment as a grid of (arm, seed) runs on one runner.

A chapter's experiment has the same shape in every chapter: some arms (the method, its baselines, its
controls), some seeds (from the profile), one pure function that runs one (arm, seed) and returns its
metrics, and one function that turns the grid's metrics into verdicts (:mod:`rlcourse.claims`). A
:class:`Study` holds exactly these; :func:`run_study` executes its grid

- serially (``jobs=1``), in this process;
- over local cores with joblib's ``loky`` backend (``jobs=N``), one BLAS thread per worker, since
  tiny models on oversubscribed threads were measured several times slower than on one thread each;
- or on a Ray cluster through joblib's Ray backend (``backend="ray"``; ``pip install rlcourse[ray]``),
  which connects to ``$RAY_ADDRESS`` when it is set and otherwise starts a local instance,

with the same code in all three, so a run's metrics for an (arm, seed) do not depend on where it ran
(``tests/test_studies.py`` checks this on all three). Each cell's metrics are cached on disk under a
hash of what they depend on (the study's name, the arm, the seed, the sizes, and the source code of the
modules the study names), so a rebuilt page reads them, an interrupted grid resumes where it stopped,
and a changed method re-runs. The defaults come from the environment: ``RLCOURSE_JOBS`` (workers, 1)
and ``RLCOURSE_BACKEND`` (``loky`` or ``ray``); ``make book JOBS=N`` and ``make claims JOBS=N`` set them.
"""
from .runner import Results, Study, cell_key, grid_label, run_study, study_manifests

__all__ = ["Study", "Results", "run_study", "cell_key", "grid_label", "study_manifests"]
