"""Evidence: a paper's claim, tested over seeds, with a computed verdict.

A chapter's experiment is evidence only if its verdict could have come out the other way. So the
verdict is not written by hand: a :class:`Claim` records what the paper says (in its own terms, with
its protocol and numbers), what we measure, the decision rule and the claim's role; :func:`evaluate`
turns the measurements of several seeds into a :class:`Verdict` (``"holds"``, ``"does not hold"``,
``"inconclusive"``, or ``"uninformative"`` when the positive control the claim rests on did not hold);
the chapter glues the verdict's sentence and numbers (:func:`glue_verdict`), and :func:`record` writes
it to the reproduction ledger, from which ``make book`` builds the "Reproduction status" page.

The statistics. With ``n`` paired seeds the per-seed differences ``d_i`` (method minus baseline, or
minus a reference value) have mean ``d``, standard deviation ``s`` and standard error ``s / sqrt(n)``.
The verdict is decided on Student-t intervals, whose coverage is exact for normal differences at any
``n`` (and close to it for heavy-tailed ones; ``tests/test_evidence.py`` simulates both):

============  ================================  ======================================  ============================
kind          the claim                         holds when                              does not hold when
============  ================================  ======================================  ============================
greater       method exceeds baseline by > m    the 95% interval lies above ``m``       it lies at or below ``m``
less          method is below baseline by > m   the 95% interval lies below ``-m``      it lies at or above ``-m``
not worse     method is not below baseline      the 95% interval lies above ``-m``      it lies at or below ``-m``
              by more than m (non-inferiority)
equivalent    method within +-m of baseline     the 90% interval lies within ``+-m``    the 95% one lies outside
============  ================================  ======================================  ============================

(95% is ``1 - alpha`` and 90% is ``1 - 2 alpha`` at the default ``alpha = 0.05``; the equivalence rule is
the two one-sided tests, TOST, at ``alpha``.)

So a directional claim whose true effect sits exactly on its margin "holds" with probability
``alpha / 2`` (2.5%), and an equivalence claim on its margin with probability at most ``alpha`` (5%).
Anything else is ``"inconclusive"``, and so are a single seed (one run has no interval) and seeds whose
differences are all equal (no spread, so no interval: e.g. two deterministic arms). The margin ``m``
belongs to the claim (the paper's own number where it gives one, e.g. "within 2 points"), fixed before
the run; it is never tuned to the result.

Power: every verdict carries the smallest effect its run could have detected,
``(t_{1-alpha/2} + t_{power}) * s / sqrt(n)`` beyond the margin (80% power by default; for an
equivalence claim, the narrowest margin it could have confirmed), so an inconclusive verdict says what
the run could not see; :func:`seeds_needed` turns a pilot's spread into a seed count, fixed before the
reported run.

A verdict is refused, with an error naming what is wrong, when a claim is evaluated with fewer seeds
than its profile's minimum (``Profile.min_seeds``), with unpaired or non-finite values, or without the
verdict of the positive control its claim names.
"""
from __future__ import annotations

import glob
import itertools
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy import stats

KINDS = ("greater", "less", "equivalent", "not worse")
VERDICTS = ("holds", "does not hold", "inconclusive", "uninformative")
ROLES = ("paper claim", "positive control", "negative control", "course hypothesis")
POWER = 0.8  # the power at which a verdict's smallest detectable effect is quoted


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
    kind          ``greater``, ``less``, ``equivalent`` or ``not worse`` (see the module docstring)
    margin        the effect size that counts (``>= 0``), fixed before the run
    reference     the constant compared with when ``baseline`` is ``None`` (e.g. 0.9 for "90%")
    unit          how numbers are written: ``"{:.3f}"``-style format of the effect and values
    replicate     what one paired value is (``"seed"`` by default; e.g. ``"instance"``)
    role          ``"paper claim"`` (default), ``"positive control"`` (the set-up can show an effect
                  of the kind the claim is about), ``"negative control"`` (an effect that must not
                  appear), or ``"course hypothesis"`` (the book's own conjecture, not the paper's)
    control       key of the positive control this claim rests on, or ``None``: when that control did
                  not hold, the claim's verdict is ``"uninformative"`` (see :func:`evaluate`)
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
    role: str = "paper claim"
    control: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.key!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if not (isinstance(self.margin, (int, float)) and math.isfinite(self.margin) and self.margin >= 0):
            raise ValueError(f"claim {self.key!r}: margin must be a finite number >= 0, got {self.margin!r}")
        if self.baseline is None and self.reference is None:
            raise ValueError(f"claim {self.key!r}: give a baseline arm or a reference value to compare with")
        if "/" not in self.key:
            raise ValueError(f"claim key {self.key!r} must read '<chapter>/<name>'")
        if self.role not in ROLES:
            raise ValueError(f"claim {self.key!r}: role must be one of {ROLES}, got {self.role!r}")
        if self.control is not None and (self.role.endswith("control") or self.control == self.key):
            raise ValueError(f"claim {self.key!r}: a {self.role} cannot rest on another control ({self.control!r})")

    @property
    def chapter(self) -> str:
        return self.key.split("/", 1)[0]

    def rule(self) -> str:
        """The decision rule in words."""
        other = self.baseline if self.baseline is not None else self.unit.format(self.reference)
        m = self.unit.format(self.margin)
        return {
            "greater": f"holds if the 95% t-interval of {self.method} - {other} lies above {m}; "
                       f"does not hold if it lies at or below {m}",
            "less": f"holds if the 95% t-interval of {self.method} - {other} lies below -{m}; "
                    f"does not hold if it lies at or above -{m}",
            "not worse": f"holds if the 95% t-interval of {self.method} - {other} lies above -{m}; "
                         f"does not hold if it lies at or below -{m}",
            "equivalent": f"holds if the 90% t-interval of {self.method} - {other} lies within +-{m} "
                          f"(two one-sided tests at 5%); does not hold if the 95% interval lies wholly outside",
        }[self.kind]


@dataclass
class Verdict:
    """The outcome of :func:`evaluate`: the effect, its interval, the verdict and the raw values.

    ============== =====================================================================
    claim          the :class:`Claim`
    verdict        ``"holds"``, ``"does not hold"``, ``"inconclusive"`` or ``"uninformative"``
    effect         mean over seeds of ``method - baseline`` (or ``method - reference``)
    low, high      the Student-t interval of the effect at ``level`` (0.95; 0.90 for
                   an equivalence claim, whose test is TOST at 5%)
    p_value        one-sided t-test p-value of the claim's null at its margin (for an
                   equivalence claim, the larger of TOST's two); 1.0 without spread
    seeds          number of seeds (paired replicates)
    detectable     the smallest effect beyond the margin this run would have detected with
                   80% power (for an equivalence claim, the narrowest margin it could have
                   confirmed); ``None`` with one seed or no spread
    reason         why a verdict is inconclusive or uninformative, when it is not the interval
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
    level: float = 0.95
    detectable: float | None = None
    reason: str = ""
    control_verdict: str | None = None

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

    def interval_name(self) -> str:
        """What the interval is, in words (e.g. "95% t-interval")."""
        return f"{round(100 * self.level)}% t-interval"

    def sentence(self) -> str:
        """One sentence with the verdict and its numbers, for a chapter to glue."""
        c, f = self.claim, self.claim.unit.format
        other = c.baseline if c.baseline is not None else f(c.reference)
        nums = (f"{c.method} {f(self.method_mean)} against {other} {f(self.baseline_mean)}"
                if c.baseline is not None else f"{c.method} {f(self.method_mean)} against {other}")
        rep = f"{c.replicate}{'s' if self.seeds != 1 else ''}"
        if self.seeds < 2 or self.detectable is None:
            stat = f"a difference of {f(self.effect)}"
        else:
            test = " (two one-sided tests)" if c.kind == "equivalent" else ""
            stat = (f"a difference of {f(self.effect)}, {self.interval_name()}{test} {self.interval()} of the "
                    f"paired differences, one-sided p = {self.p_value:.2g} at the margin "
                    f"{f(-c.margin if c.kind == 'not worse' else c.margin)}")
        why = {
            "holds": "the claim holds",
            "does not hold": "the claim does not hold",
            "inconclusive": "the result is inconclusive",
            "uninformative": "the verdict is uninformative",
        }[self.verdict]
        if self.reason:
            why += f" ({self.reason})"
        elif self.verdict == "inconclusive" and self.detectable is not None:
            what = ("could have confirmed equivalence only within +-" if c.kind == "equivalent"
                    else "could detect, 80% of the time, only effects beyond the margin by at least ")
            why += f" (this run {what}{f(self.detectable).lstrip('+')})"
        return f"Over {self.seeds} {rep}, {nums}: {stat}; {why}."

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
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def _as_values(name: str, values) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of per-seed values, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} holds non-finite values: {arr.tolist()}")
    return arr


def t_interval(diffs, level: float = 0.95) -> tuple:
    """Student-t interval of the mean of paired differences, along the last axis.

    ====== ========= ==========================================================
    diffs  (..., n)  per-seed differences method - baseline, ``n >= 2``
    level  float     coverage of the interval, in (0, 1)
    return           ``(low, high)``, each of shape ``(...)`` (floats for 1-D)
    ====== ========= ==========================================================

    ``mean +- t_{n-1, (1+level)/2} * s / sqrt(n)``: exact coverage for normal differences at any ``n``.
    """
    d = np.asarray(diffs, dtype=float)
    n = d.shape[-1]
    if n < 2:
        raise ValueError(f"a t-interval needs at least 2 paired values, got {n}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    half = stats.t.ppf((1 + level) / 2, n - 1) * d.std(-1, ddof=1) / math.sqrt(n)
    mean = d.mean(-1)
    lo, hi = mean - half, mean + half
    return (float(lo), float(hi)) if d.ndim == 1 else (lo, hi)


def decide(kind: str, margin: float, diffs, *, alpha: float = 0.05):
    """The verdict of the module docstring's table for paired differences, along the last axis.

    ====== ========= ==============================================================
    diffs  (..., n)  per-seed differences (method - baseline, or - reference)
    return           a verdict string (1-D ``diffs``) or an array of them
    ====== ========= ==============================================================

    One seed, or differences with no spread, give ``"inconclusive"``. This is the whole rule; the
    calibration test simulates it under its null.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    d = np.asarray(diffs, dtype=float)
    one = d.ndim == 1
    d = d.reshape(-1, d.shape[-1])
    out = np.full(d.shape[0], "inconclusive", dtype=object)
    if d.shape[-1] >= 2:
        spread = d.std(-1, ddof=1) > 1e-12 * np.maximum(1.0, np.abs(d).max(-1))
        lo, hi = t_interval(d, 1 - alpha)
        if kind == "greater":
            out[lo > margin] = "holds"
            out[hi <= margin] = "does not hold"
        elif kind == "less":
            out[hi < -margin] = "holds"
            out[lo >= -margin] = "does not hold"
        elif kind == "not worse":
            out[lo > -margin] = "holds"
            out[hi <= -margin] = "does not hold"
        else:
            lo2, hi2 = t_interval(d, 1 - 2 * alpha)
            out[(lo > margin) | (hi < -margin)] = "does not hold"
            out[(-margin <= lo2) & (hi2 <= margin)] = "holds"
        out[~spread] = "inconclusive"
    return out[0] if one else out.reshape(np.asarray(diffs).shape[:-1])


def _t_quantiles(n: int, alpha: float, kind: str, power: float) -> float:
    a = alpha if kind == "equivalent" else alpha / 2
    b = (1 + power) / 2 if kind == "equivalent" else power
    return float(stats.t.ppf(1 - a, n - 1) + stats.t.ppf(b, n - 1))


def detectable_effect(sd: float, n: int, *, kind: str = "greater", alpha: float = 0.05, power: float = POWER) -> float:
    """The smallest effect beyond the margin that ``n`` seeds with per-seed spread ``sd`` would detect with
    probability ``power`` (for ``kind="equivalent"``, the narrowest margin within which a true effect of
    zero would be confirmed). A normal approximation with t quantiles: ``(t_{1-a} + t_{power}) sd / sqrt(n)``."""
    if n < 2:
        raise ValueError(f"a detectable effect needs at least 2 seeds, got {n}")
    if not (sd >= 0 and math.isfinite(sd)):
        raise ValueError(f"sd must be a finite number >= 0, got {sd!r}")
    return _t_quantiles(n, alpha, kind, power) * sd / math.sqrt(n)


def seeds_needed(sd: float, effect: float, *, margin: float = 0.0, kind: str = "greater", alpha: float = 0.05,
                 power: float = POWER, minimum: int = 3, maximum: int = 1000) -> int:
    """How many seeds a claim needs to detect ``effect`` with probability ``power``, from a pilot's per-seed
    spread ``sd`` of the paired differences: the smallest ``n >= minimum`` whose detectable effect is at
    most ``|effect| - margin`` (``margin - |effect|`` for an equivalence claim, ``effect + margin`` for a
    non-inferiority one). Choose it before the
    reported run, from seeds the run does not use; raises when even ``maximum`` seeds would not do."""
    gap = {"equivalent": margin - abs(effect), "not worse": effect + margin}.get(kind, abs(effect) - margin)
    if gap <= 0:
        raise ValueError(f"an effect of {effect} cannot be told from the margin {margin} ({kind}) at any seed count")
    for n in range(max(2, minimum), maximum + 1):
        if detectable_effect(sd, n, kind=kind, alpha=alpha, power=power) <= gap:
            return n
    raise ValueError(f"more than {maximum} seeds would be needed to detect {effect} with sd {sd}")


def _p_value(kind: str, margin: float, d: np.ndarray) -> float:
    """One-sided t-test p-value of the claim's null at its margin (TOST's larger one for equivalence)."""
    n, se = d.size, d.std(ddof=1) / math.sqrt(d.size)
    mean = d.mean()
    above = stats.t.sf((mean - margin) / se, n - 1)  # H0: effect <= margin
    below = stats.t.cdf((mean + margin) / se, n - 1)  # H0: effect >= -margin
    if kind == "greater":
        return float(above)
    if kind == "less":
        return float(below)
    if kind == "not worse":
        return float(stats.t.sf((mean + margin) / se, n - 1))  # H0: effect <= -margin
    return float(max(stats.t.sf((mean + margin) / se, n - 1), stats.t.cdf((mean - margin) / se, n - 1)))


def paired_bootstrap(diffs: Sequence[float], *, alpha: float = 0.05, n_boot: int = 10_000,
                     seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of paired differences (resampling seeds). Not used for
    verdicts: at a few seeds it is far narrower than its level (3 seeds give ``[min, max]``, which covers
    the mean about 75% of the time); kept to show that in the calibration test.

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
    stats_ = np.abs((signs * d).mean(1))
    return float(np.mean(stats_ >= observed - 1e-12))


def min_seeds_for(profile: str | None) -> int:
    """The fewest seeds a verdict may rest on in ``profile`` (``Profile.min_seeds``; 2 for an unknown name)."""
    from .profiles import PROFILE_NAMES
    from .profiles import profile as get_profile

    name = (profile or "").strip().lower()
    return get_profile(name).min_seeds if name in PROFILE_NAMES else 2


def evaluate(claim: Claim, method_values: Sequence[float], baseline_values: Sequence[float] | None = None, *,
             alpha: float = 0.05, n_boot: int | None = None, seconds: float | None = None,
             profile: str | None = None, control: Verdict | None = None, min_seeds: int | None = None,
             **extra) -> Verdict:
    """Test ``claim`` on per-seed measurements and return its :class:`Verdict`.

    ===============  =====  ============================================================
    method_values    (n,)   the metric of the claim's ``method`` arm, one value per seed
    baseline_values  (n,)   the ``baseline`` arm on the same seeds (paired), or ``None``
                            when the claim compares with its ``reference`` value
    ===============  =====  ============================================================

    ``control`` is the verdict of the positive control named by ``claim.control`` (required then):
    unless it holds, this verdict is ``"uninformative"``. ``min_seeds`` defaults to the profile's
    minimum; fewer seeds (but one, which is always inconclusive) is an error, not a verdict.
    ``extra`` keyword arguments are stored on the verdict (e.g. per-seed curves' summaries) and
    written to the ledger with it. (``n_boot`` is accepted for old callers and ignored.)
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
    if profile is None:
        profile = os.environ.get("RLCOURSE_PROFILE", "book")
    need = min_seeds_for(profile) if min_seeds is None else int(min_seeds)
    n = diffs.size
    if 1 < n < need:
        raise ValueError(f"claim {claim.key!r}: {n} {claim.replicate}s, but a verdict in the {profile!r} profile "
                         f"needs at least {need}; run more {claim.replicate}s")
    if claim.control is not None:
        if control is None:
            raise ValueError(f"claim {claim.key!r} rests on the positive control {claim.control!r}: "
                             "pass its verdict as control=")
        if control.claim.key != claim.control:
            raise ValueError(f"claim {claim.key!r} rests on {claim.control!r}, but control= is the verdict of "
                             f"{control.claim.key!r}")
    elif control is not None:
        raise ValueError(f"claim {claim.key!r} names no positive control, but control= was given")
    level = 1 - 2 * alpha if claim.kind == "equivalent" else 1 - alpha
    effect = float(diffs.mean())
    spread = n >= 2 and diffs.std(ddof=1) > 1e-12 * max(1.0, float(np.abs(diffs).max()))
    reason = ""
    if n >= 2 and spread:
        low, high = t_interval(diffs, level)
        p = _p_value(claim.kind, claim.margin, diffs)
        detectable = detectable_effect(float(diffs.std(ddof=1)), n, kind=claim.kind, alpha=alpha)
    else:
        low = high = effect
        p, detectable = 1.0, None
        reason = ("one seed has no interval" if n < 2 else
                  f"every {claim.replicate} gave the same difference, so there is no spread to form an interval")
    verdict = decide(claim.kind, claim.margin, diffs, alpha=alpha)
    control_verdict = None
    if control is not None:
        control_verdict = control.verdict
        if control.verdict != "holds":
            reason = (f"its positive control {claim.control} came out {control.verdict!r}, so the set-up was not "
                      f"shown able to detect the effect; the interval alone would say {verdict!r}")
            verdict = "uninformative"
    return Verdict(claim=claim, verdict=verdict, effect=effect, low=float(low), high=float(high), p_value=float(p),
                   seeds=int(n), method_values=m.tolist(), baseline_values=None if b is None else b.tolist(),
                   alpha=alpha, seconds=seconds, profile=profile, extra=extra, level=level,
                   detectable=detectable, reason=reason, control_verdict=control_verdict)


# ---------------------------------------------------------------------- the chapter side
def glue_verdict(name: str, verdict: Verdict, *, record_it: bool = True) -> None:
    """Glue a verdict's parts under ``name_*`` for the chapter's prose, and record it in the ledger.

    ===================  =====================================================
    ``name``             the verdict word ("holds", "does not hold", ...)
    ``name_sentence``    :meth:`Verdict.sentence`
    ``name_effect``      the effect, formatted with the claim's unit
    ``name_interval``    ``[lo, hi]``; ``name_interval_name`` what it is ("95% t-interval")
    ``name_p``           the one-sided p-value at the claim's margin
    ``name_detectable``  the smallest effect beyond the margin the run could detect ("n/a")
    ``name_role``        the claim's role ("paper claim", "positive control", ...)
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
        "_p": f"{verdict.p_value:.2g}",
        "_interval_name": verdict.interval_name(),
        "_detectable": "n/a" if verdict.detectable is None else f(verdict.detectable).lstrip("+"),
        "_role": verdict.claim.role,
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


def role_of(row: dict) -> str:
    """A ledger row's role (rows recorded before roles existed are paper claims)."""
    return row["claim"].get("role", "paper claim")


def ledger_counts(rows: Sequence[dict]) -> dict[str, dict[str, int]]:
    """``{role: {verdict: count}}`` over ledger rows, every role and verdict present (zeros included)."""
    counts = {role: {v: 0 for v in VERDICTS} for role in ROLES}
    for r in rows:
        counts[role_of(r)][r["verdict"]] += 1
    return counts


def ledger_markdown(rows: Sequence[dict], chapter_link=None, *, role: str | None = None) -> str:
    """The ledger as a Markdown table: chapter, paper, claim, our setting, paper's number, ours with its
    interval, one-sided p, seeds, the smallest detectable effect, verdict, and when it was recorded (with
    the profile and seconds). ``role`` keeps only the rows of one role. ``chapter_link(stem)`` may turn a
    chapter's stem into a MyST link (e.g. ``{doc}`` to its page); by default the stem is shown as it is."""
    if role is not None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        rows = [r for r in rows if role_of(r) == role]
    if not rows:
        return "*No claims have been recorded yet: `make book` executes the chapters and records them.*"
    head = ("| chapter | paper | claim as stated | our setting | paper's number | ours (interval) | p | seeds | "
            "detectable | verdict | recorded |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        c = r["claim"]
        f = c.get("unit", "{:.3f}").format
        other = c["baseline"] if c["baseline"] is not None else f"{f(c['reference'])}"
        level = r.get("level")
        what = f"{round(100 * level)}% t" if level else "bootstrap"
        ours = f"{c['method']} - {other}: {f(r['effect'])} [{f(r['low'])}, {f(r['high'])}] ({what})"
        det = r.get("detectable")
        secs = "" if r.get("seconds") is None else f", {r['seconds']:.0f} s"
        when = f"{r.get('recorded_at', '?')} ({r.get('profile', '') or '?'}{secs})"
        verdict = f"**{r['verdict']}**" + (f": {r['reason']}" if r.get("reason") else "")
        stem = c["key"].split("/")[0]
        cells = [chapter_link(stem) if chapter_link else stem, c["paper"], c["statement"], c["setting"],
                 c.get("paper_number", ""), ours, f"{r['p_value']:.2g}", str(r["seeds"]),
                 "" if det is None else f(det).lstrip("+"), verdict, when]
        lines.append("| " + " | ".join(str(x).replace("|", "\\|").replace("\n", " ") for x in cells) + " |")
    return "\n".join(lines)
