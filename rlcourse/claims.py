"""Evidence: a paper's claim, tested over seeds, with a computed verdict.

A chapter's experiment is evidence only if its verdict could have come out the other way. So the
verdict is not written by hand: a :class:`Claim` records what the paper says (in its own terms, with
its protocol and numbers), what we measure, and the decision rule; :func:`evaluate` turns the
measurements of several seeds into a :class:`Verdict` (``"holds"``, ``"does not hold"`` or
``"inconclusive"``) with a paired bootstrap interval and an exact sign-flip test; the chapter glues
the verdict's sentence and numbers (:func:`glue_verdict`), and :func:`record` writes it to the
reproduction ledger, from which ``make book`` builds the "Reproduction status" page.

Decision rules, for the effect ``d = mean(method - baseline)`` (or ``mean(method) - reference``) and
its interval ``[lo, hi]`` at level ``1 - alpha``:

============  ================================  =====================================  ==========================
kind          the claim                         holds when                             does not hold when
============  ================================  =====================================  ==========================
greater       method exceeds baseline by > m    ``lo > m``                             ``hi <= m``
less          method is below baseline by > m   ``hi < -m``                            ``lo >= -m``
equivalent    method within +-m of baseline     ``-m <= lo`` and ``hi <= m``           ``lo > m`` or ``hi < -m``
============  ================================  =====================================  ==========================

Anything else is ``"inconclusive"``, and so is a single seed: one run has no interval. The margin
``m`` belongs to the claim (the paper's own number where it gives one, e.g. "within 2 points"), fixed
before the run; it is never tuned to the result.

With few seeds the percentile bootstrap interval is narrower than it should be (three seeds give at
most ten distinct resampled means), which is why :class:`Verdict` also reports the exact sign-flip
p-value of the paired differences and the number of seeds; chapters show both.
"""
from __future__ import annotations

import glob
import itertools
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

KINDS = ("greater", "less", "equivalent")
VERDICTS = ("holds", "does not hold", "inconclusive")


@dataclass(frozen=True)
class Claim:
    """One claim of one paper, and how the book tests it.

    ============  ==================================================================================
    key           unique id, ``"<chapter>/<short-name>"`` (e.g. ``"evpo/tracks-better-baseline"``)
    paper         short citation: title, first author et al., year, arXiv id
    statement     the paper's claim in the paper's own terms (quoted where possible)
    source        where the statement comes from (e.g. "abstract, v2 (2026)")
    paper_number  the paper's number for it, as the paper gives it (``""`` if none)
    setting       our setting: model, task, budget, what differs from the paper's protocol
    metric        what we measure, per seed (e.g. "final greedy accuracy on 256 held-out prompts")
    method        the arm the claim is about (e.g. "GRPO")
    baseline      the arm it is compared with (e.g. "base model"), or ``None`` for a reference value
    kind          ``greater``, ``less`` or ``equivalent`` (see the module docstring)
    margin        the effect size that counts (``>= 0``), fixed before the run
    reference     the constant compared with when ``baseline`` is ``None`` (e.g. 0.9 for "90%")
    unit          how numbers are written: ``"{:.3f}"``-style format of the effect and values
    replicate     what one paired value is (``"seed"`` by default; e.g. ``"instance"``)
    ============  ==================================================================================
    """

    key: str
    paper: str
    statement: str
    source: str
    setting: str
    metric: str
    method: str
    baseline: str | None = None
    kind: str = "greater"
    margin: float = 0.0
    reference: float | None = None
    paper_number: str = ""
    unit: str = "{:.3f}"
    replicate: str = "seed"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.key!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if not (isinstance(self.margin, (int, float)) and math.isfinite(self.margin) and self.margin >= 0):
            raise ValueError(f"claim {self.key!r}: margin must be a finite number >= 0, got {self.margin!r}")
        if self.baseline is None and self.reference is None:
            raise ValueError(f"claim {self.key!r}: give a baseline arm or a reference value to compare with")
        if "/" not in self.key:
            raise ValueError(f"claim key {self.key!r} must read '<chapter>/<name>'")

    @property
    def chapter(self) -> str:
        return self.key.split("/", 1)[0]

    def rule(self) -> str:
        """The decision rule in words."""
        other = self.baseline if self.baseline is not None else self.unit.format(self.reference)
        m = self.unit.format(self.margin)
        return {
            "greater": f"holds if the interval of {self.method} - {other} lies above {m}; "
                       f"does not hold if it lies at or below {m}",
            "less": f"holds if the interval of {self.method} - {other} lies below -{m}; "
                    f"does not hold if it lies at or above -{m}",
            "equivalent": f"holds if the interval of {self.method} - {other} lies within +-{m}; "
                          f"does not hold if it lies wholly outside",
        }[self.kind]


@dataclass
class Verdict:
    """The outcome of :func:`evaluate`: the effect, its interval, the verdict and the raw values.

    ============== =====================================================================
    claim          the :class:`Claim`
    verdict        ``"holds"``, ``"does not hold"`` or ``"inconclusive"``
    effect         mean over seeds of ``method - baseline`` (or ``method - reference``)
    low, high      the ``1 - alpha`` paired bootstrap interval of the effect
    p_value        exact two-sided sign-flip p-value of the paired differences (1.0 for 1 seed)
    seeds          number of seeds (paired replicates)
    method_values, baseline_values   the per-seed measurements
    seconds        wall-clock seconds of the experiment, when given
    ============== =====================================================================
    """

    claim: Claim
    verdict: str
    effect: float
    low: float
    high: float
    p_value: float
    seeds: int
    method_values: list[float]
    baseline_values: list[float] | None
    alpha: float = 0.05
    seconds: float | None = None
    profile: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        return self.verdict == "holds"

    @property
    def method_mean(self) -> float:
        return float(np.mean(self.method_values))

    @property
    def baseline_mean(self) -> float:
        return float(np.mean(self.baseline_values)) if self.baseline_values is not None else float(self.claim.reference)

    def interval(self) -> str:
        f = self.claim.unit.format
        return f"[{f(self.low)}, {f(self.high)}]"

    def sentence(self) -> str:
        """One sentence with the verdict and its numbers, for a chapter to glue."""
        c, f = self.claim, self.claim.unit.format
        other = c.baseline if c.baseline is not None else f(c.reference)
        level = round(100 * (1 - self.alpha))
        nums = (f"{c.method} {f(self.method_mean)} against {other} {f(self.baseline_mean)}"
                if c.baseline is not None else f"{c.method} {f(self.method_mean)} against {other}")
        why = {
            "holds": "the claim holds",
            "does not hold": "the claim does not hold",
            "inconclusive": "the result is inconclusive",
        }[self.verdict]
        extra = f" (one {c.replicate} has no interval)" if self.seeds < 2 else ""
        return (f"Over {self.seeds} {c.replicate}{'s' if self.seeds != 1 else ''}, {nums}: a difference of "
                f"{f(self.effect)}, {level}% interval {self.interval()}, sign-flip p = {self.p_value:.3g}; "
                f"{why}{extra}.")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["claim"] = asdict(self.claim)
        d["sentence"] = self.sentence()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Verdict":
        d = dict(d)
        d.pop("sentence", None)
        d.pop("recorded_at", None)
        d["claim"] = Claim(**d["claim"])
        return cls(**d)


def _as_values(name: str, values) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of per-seed values, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} holds non-finite values: {arr.tolist()}")
    return arr


def paired_bootstrap(diffs: Sequence[float], *, alpha: float = 0.05, n_boot: int = 10_000,
                     seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of paired differences (resampling seeds).

    ====== ======= ==========================================
    diffs  (n,)    per-seed differences method - baseline
    return         2 floats the ``alpha/2`` and ``1 - alpha/2`` quantiles
    ====== ======= ==========================================
    """
    d = _as_values("diffs", diffs)
    if d.size == 1:
        return float(d[0]), float(d[0])
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def sign_flip_p_value(diffs: Sequence[float], null: float = 0.0, *, max_exact: int = 16, n_perm: int = 100_000,
                      seed: int = 0) -> float:
    """Two-sided p-value of the paired sign-flip (permutation) test of ``mean(diffs) = null``.

    Exact (all ``2^n`` sign patterns) for ``n <= max_exact``, Monte Carlo beyond. With ``n`` seeds the
    smallest attainable p-value is ``2 / 2^n`` (0.25 for 3 seeds, 0.0625 for 5).
    """
    d = _as_values("diffs", diffs) - null
    n = d.size
    observed = abs(d.mean())
    if n <= max_exact:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    else:
        signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(n_perm, n))
    stats = np.abs((signs * d).mean(1))
    return float(np.mean(stats >= observed - 1e-12))


def decide(kind: str, margin: float, low: float, high: float, seeds: int) -> str:
    """The verdict of the module docstring's table, for an interval ``[low, high]``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if seeds < 2:
        return "inconclusive"
    if kind == "greater":
        return "holds" if low > margin else "does not hold" if high <= margin else "inconclusive"
    if kind == "less":
        return "holds" if high < -margin else "does not hold" if low >= -margin else "inconclusive"
    if -margin <= low and high <= margin:
        return "holds"
    return "does not hold" if (low > margin or high < -margin) else "inconclusive"


def evaluate(claim: Claim, method_values: Sequence[float], baseline_values: Sequence[float] | None = None, *,
             alpha: float = 0.05, n_boot: int = 10_000, seconds: float | None = None, profile: str | None = None,
             **extra) -> Verdict:
    """Test ``claim`` on per-seed measurements and return its :class:`Verdict`.

    ===============  =====  ============================================================
    method_values    (n,)   the metric of the claim's ``method`` arm, one value per seed
    baseline_values  (n,)   the ``baseline`` arm on the same seeds (paired), or ``None``
                            when the claim compares with its ``reference`` value
    ===============  =====  ============================================================

    ``extra`` keyword arguments are stored on the verdict (e.g. per-seed curves' summaries) and
    written to the ledger with it.
    """
    m = _as_values(f"{claim.key}: method values", method_values)
    if claim.baseline is not None:
        if baseline_values is None:
            raise ValueError(f"claim {claim.key!r} compares with the arm {claim.baseline!r}: pass baseline_values")
        b = _as_values(f"{claim.key}: baseline values", baseline_values)
        if b.shape != m.shape:
            raise ValueError(f"claim {claim.key!r}: {m.size} method values but {b.size} baseline values; "
                             "a paired comparison needs one of each per seed")
        diffs = m - b
    else:
        if baseline_values is not None:
            raise ValueError(f"claim {claim.key!r} compares with the reference {claim.reference}: "
                             "pass no baseline_values")
        b = None
        diffs = m - float(claim.reference)
    low, high = paired_bootstrap(diffs, alpha=alpha, n_boot=n_boot)
    p = sign_flip_p_value(diffs) if diffs.size > 1 else 1.0  # against "no difference"
    if profile is None:
        profile = os.environ.get("RLCOURSE_PROFILE", "book")
    return Verdict(claim=claim, verdict=decide(claim.kind, claim.margin, low, high, diffs.size),
                   effect=float(diffs.mean()), low=low, high=high, p_value=p, seeds=int(diffs.size),
                   method_values=m.tolist(), baseline_values=None if b is None else b.tolist(), alpha=alpha,
                   seconds=seconds, profile=profile, extra=extra)


# ---------------------------------------------------------------------- the chapter side
def glue_verdict(name: str, verdict: Verdict, *, record_it: bool = True) -> None:
    """Glue a verdict's parts under ``name_*`` for the chapter's prose, and record it in the ledger.

    ===================  =====================================================
    ``name``             the verdict word ("holds", "does not hold", ...)
    ``name_sentence``    :meth:`Verdict.sentence`
    ``name_effect``      the effect, formatted with the claim's unit
    ``name_interval``    ``[lo, hi]``
    ``name_p``           the sign-flip p-value
    ``name_seeds``       the number of seeds
    ``name_method``      the method arm's mean; ``name_baseline`` the baseline's
    ===================  =====================================================
    """
    from myst_nb import glue

    f = verdict.claim.unit.format
    parts = {
        "": verdict.verdict,
        "_sentence": verdict.sentence(),
        "_effect": f(verdict.effect),
        "_interval": verdict.interval(),
        "_p": f"{verdict.p_value:.3g}",
        "_seeds": str(verdict.seeds),
        "_method": f(verdict.method_mean),
        "_baseline": f(verdict.baseline_mean),
    }
    for suffix, text in parts.items():
        glue(name + suffix, text, display=False)
    if record_it:
        record(verdict)


def ledger_dir() -> Path:
    """Where verdicts are written: ``$RLCOURSE_LEDGER``, or ``ledger/<profile>`` in the model cache."""
    from .profiles import cache_dir

    env = os.environ.get("RLCOURSE_LEDGER")
    profile = os.environ.get("RLCOURSE_PROFILE", "book")
    path = Path(env).expanduser() if env else cache_dir() / "ledger" / profile
    path.mkdir(parents=True, exist_ok=True)
    return path


_CLEARED: set[tuple[str, str]] = set()  # (ledger folder, chapter) pairs this process has started afresh


def ledger_file(key: str) -> str:
    """The ledger's file name for a claim key: ``<chapter>__<name>.json``."""
    return key.replace("/", "__") + ".json"


def record(verdict: Verdict, directory: str | Path | None = None, *, replace_chapter: bool = True) -> Path:
    """Write ``verdict`` to the ledger as ``<key with / as __>.json`` (atomically) and return the path.

    With ``replace_chapter`` (the default), the first verdict this process records for a chapter in
    ``directory`` first deletes that chapter's older files there (``<chapter>__*.json``). A chapter
    runs in a kernel of its own, so the ledger then holds exactly what the chapter's latest run
    recorded: a claim it no longer tests, or one whose key changed, leaves no stale row. (Keys name
    their chapter, ``<chapter>/<name>``, and a chapter records only its own keys; the smoke chapter
    test checks both.)
    """
    folder = Path(directory) if directory is not None else ledger_dir()
    folder.mkdir(parents=True, exist_ok=True)
    chapter = verdict.claim.chapter
    token = (str(folder.resolve()), chapter)
    if replace_chapter and token not in _CLEARED:
        for old in folder.glob(glob.escape(chapter) + "__*.json"):
            old.unlink(missing_ok=True)
        _CLEARED.add(token)
    path = folder / ledger_file(verdict.claim.key)
    data = verdict.to_dict()
    data["recorded_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
    return path


def read_ledger(directory: str | Path | None = None) -> list[dict]:
    """Every recorded verdict (as dicts, with ``recorded_at``), sorted by claim key."""
    folder = Path(directory) if directory is not None else ledger_dir()
    rows = []
    for path in sorted(folder.glob("*.json")):
        rows.append(json.loads(path.read_text()))
    return sorted(rows, key=lambda r: r["claim"]["key"])


def ledger_markdown(rows: Sequence[dict], chapter_link=None) -> str:
    """The ledger as a Markdown table: paper, claim, our setting, paper's number, ours with its
    interval, verdict, seeds, seconds. ``chapter_link(stem)`` may turn a chapter's stem into a
    MyST link (e.g. ``{doc}`` to its page); by default the stem is shown as it is."""
    if not rows:
        return "*No claims have been recorded yet: `make book` executes the chapters and records them.*"
    head = ("| chapter | paper | claim as stated | our setting | paper's number | ours (interval) | "
            "verdict | seeds | seconds |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        c = r["claim"]
        f = c.get("unit", "{:.3f}").format
        other = c["baseline"] if c["baseline"] is not None else f"{f(c['reference'])}"
        ours = f"{c['method']} - {other}: {f(r['effect'])} [{f(r['low'])}, {f(r['high'])}]"
        secs = "" if r.get("seconds") is None else f"{r['seconds']:.0f}"
        stem = c["key"].split("/")[0]
        cells = [chapter_link(stem) if chapter_link else stem, c["paper"], c["statement"], c["setting"], c.get("paper_number", ""), ours,
                 f"**{r['verdict']}**", str(r["seeds"]), secs]
        lines.append("| " + " | ".join(str(x).replace("|", "\\|").replace("\n", " ") for x in cells) + " |")
    return "\n".join(lines)
