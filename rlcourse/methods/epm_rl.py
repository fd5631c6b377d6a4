"""EPM-RL: product mapping by a small in-house model, LoRA SFT on rationales, then RL with a composite reward.

Yu and Seo (2026), *EPM-RL: Reinforcement Learning for On-Premise Product Mapping in E-Commerce*,
arXiv:2604.23993. A pair of listings is the same product or not; the student writes a structured
rationale (which fields agree) and a label; RL scores format, label and a judge of the rationale.
The reward weights, the RL algorithm and the judge are the course's reconstruction.

Parts registered here:

==================  ==========  =====================================================================
name                kind        what it is
==================  ==========  =====================================================================
``epm_pairs``       task        ``A:kio m4 SALE;B:2pk kio m4=`` -> ``kio/kio 4/4>Y``: the two brands,
                                the two model ids, then the label ``Y``/``N``;
                                promotional noise words and swapped field order with probability
                                ``noise`` (``epm_pairs`` is noise 0.5; :class:`ProductPairs` any)
``epm_format``      reward      1 if the completion parses (:func:`parse_rationale`), else 0
``epm_label``       reward      1 if the label is right (a malformed completion scores 0)
``epm_judge``       reward      the rule judge: share of the two cited field pairs that are the true
                                ones, times 1 if the label follows from them (0 if malformed)
``epm_composite``   reward      ``gate * (w_format fmt + w_label label + w_judge judge)``, weights by
                                ``reward_kwargs``; ``gate`` = format when ``format_gate``
==================  ==========  =====================================================================
"""
from __future__ import annotations

import math
import re
import time
from typing import Sequence

import numpy as np
import torch

from ..rewards import register_reward
from ..tasks import Example, Score, Task, register_task

PAPER = ("EPM-RL: Reinforcement Learning for On-Premise Product Mapping in E-Commerce, Yu and Seo, 2026, "
         "arXiv:2604.23993")
BRANDS = ("kio", "sul", "vex", "dor", "mab", "tun", "rel", "gax", "pim", "zor", "nak", "bey")
NOISE_WORDS = ("SALE", "NEW", "HOT", "2pk", "3pk", "x2", "FREE", "mx")  # "x2", "mx" look like model ids
RATIONALE = re.compile(r"([a-z]{3})/([a-z]{3}) (\d+)/(\d+)>([YN])")


# ---------------------------------------------------------------------- the task
def listing(brand: str, model_id: str, noise: float, rng: np.random.Generator) -> str:
    """One seller's title: brand and model id (``m`` + digits), swapped with probability ``noise``,
    and a promotional word in each of the three slots (before, between, after) with probability
    ``noise``."""
    fields = [brand, model_id] if rng.random() >= noise else [model_id, brand]
    words = []
    for slot in range(3):
        if rng.random() < noise:
            words.append(str(rng.choice(NOISE_WORDS)))
        if slot < 2:
            words.append(fields[slot])
    return " ".join(words)


def rationale(brands: tuple[str, str], models: tuple[str, str]) -> str:
    """The templated teacher rationale and label: the two brands, the two model ids (digits), then
    ``Y`` iff both pairs agree, e.g. ``kio/kio 4/5>N``."""
    label = "Y" if brands[0] == brands[1] and models[0] == models[1] else "N"
    return f"{brands[0]}/{brands[1]} {models[0]}/{models[1]}>{label}"


class ProductPairs(Task):
    """Two listings; the label is ``Y`` iff brand and model id agree. Half the pairs match; a quarter
    differ in brand only, a quarter in model id only (one digit changed: the hard case)."""

    def __init__(self, noise: float = 0.5, digits: int = 1):
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"noise must be a probability in [0, 1], got {noise}")
        if digits not in (1, 2):
            raise ValueError(f"digits (of the model id) must be 1 or 2, got {digits}")
        self.noise, self.digits = float(noise), digits
        self.name = f"epm_pairs{noise:g}" + ("" if digits == 1 else f"d{digits}")

    def _draw(self, rng):
        kind = rng.choice(["match", "match", "brand", "model"])
        b1 = str(rng.choice(BRANDS))
        m1 = [int(d) for d in rng.integers(0, 10, size=self.digits)]
        b2, m2 = b1, list(m1)
        if kind == "brand":
            b2 = str(rng.choice([b for b in BRANDS if b != b1]))
        elif kind == "model":  # change one digit (the others kept: the hard case)
            i = int(rng.integers(self.digits))
            m2[i] = int(rng.choice([d for d in range(10) if d != m1[i]]))
        ma, mb = "".join(map(str, m1)), "".join(map(str, m2))
        a = listing(b1, "m" + ma, self.noise, rng)
        b = listing(b2, "m" + mb, self.noise, rng)
        sol = rationale((b1, b2), (ma, mb))
        return Example(prompt=f"A:{a};B:{b}=", answer=sol[-1], solution=sol,
                       meta={"brands": (b1, b2), "models": (ma, mb)})

    def score(self, completion, example):
        got = parse_rationale(completion)
        if got is None:
            return Score(0.0, "malformed: not '<brand>/<brand> <id>/<id>><Y|N>'")
        ok = got[2] == example.answer
        return Score(float(ok), "correct label" if ok else f"wrong label {got[2]} != {example.answer}")


register_task("epm_pairs")(ProductPairs)


def parse_rationale(text) -> tuple[tuple[str, str], tuple[str, str], str] | None:
    """``((brand_a, brand_b), (id_a, id_b), label)`` of a completion in the grammar
    ``<brand>/<brand> <id>/<id>><Y|N>`` (brands: 3 lowercase letters; ids: digits; surrounding
    whitespace allowed), or ``None`` for anything else. Never raises on a string."""
    if not isinstance(text, str):
        raise TypeError(f"parse_rationale needs a string, got {type(text).__name__}")
    m = RATIONALE.fullmatch(text.strip())
    if m is None:
        return None
    return (m.group(1), m.group(2)), (m.group(3), m.group(4)), m.group(5)


def judge_score(text: str, brands: tuple[str, str], models: tuple[str, str]) -> float:
    """The rule judge (a stand-in for the paper's judge models): the share of the rationale's two
    citations (the brand pair, the model-id pair) that are the listings' true fields, times 1 if its
    label follows from what it cited (``Y`` iff both cited pairs agree). 0 for a malformed
    completion; 1 exactly when the rationale is faithful."""
    got = parse_rationale(text)
    if got is None:
        return 0.0
    b, m, label = got
    consistent = (label == "Y") == (b[0] == b[1] and m[0] == m[1])
    return float(consistent) * ((tuple(b) == tuple(brands)) + (tuple(m) == tuple(models))) / 2


def reward_parts(texts: Sequence[str], examples: Sequence[Example]) -> dict[str, torch.Tensor]:
    """The three reward components of every completion.

    ========  =====  ============================================
    texts     ``B``  decoded completions
    examples  ``B``  the example each completion answers
    format    (B,)   1 if the completion parses
    label     (B,)   1 if its label is the example's
    judge     (B,)   :func:`judge_score` in [0, 1]
    ========  =====  ============================================
    """
    if len(texts) != len(examples):
        raise ValueError(f"{len(texts)} completions but {len(examples)} examples")
    for e in examples:
        if "brands" not in e.meta or "models" not in e.meta:
            raise ValueError(f"example {e.prompt!r} has no brand/model facts; the EPM rewards need epm_pairs examples")
    parsed = [parse_rationale(t) for t in texts]
    fmt = [p is not None for p in parsed]
    label = [p is not None and p[2] == e.answer for p, e in zip(parsed, examples)]
    judge = [judge_score(t, e.meta["brands"], e.meta["models"]) for t, e in zip(texts, examples)]
    return {key: torch.tensor(v, dtype=torch.float32) for key, v in
            (("format", fmt), ("label", label), ("judge", judge))}


def composite_reward(parts: dict[str, torch.Tensor], w_format: float = 0.2, w_label: float = 1.0,
                     w_judge: float = 0.5, format_gate: bool = True) -> torch.Tensor:
    """``R = g * (w_format fmt + w_label label + w_judge judge)`` with ``g = fmt`` when ``format_gate``
    (an unparsable completion scores 0), else ``g = 1``. Weights are [reconstruction].

    ======  =====  ==========================================
    parts   dict   ``format``, ``label``, ``judge``, each (B,)
    return  (B,)   the composite reward
    ======  =====  ==========================================
    """
    for key in ("format", "label", "judge"):
        if key not in parts:
            raise ValueError(f"composite_reward needs the component {key!r}; got {sorted(parts)}")
    weights = {"w_format": w_format, "w_label": w_label, "w_judge": w_judge}
    for key, w in weights.items():
        if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
            raise ValueError(f"{key} must be a finite weight >= 0, got {w!r}")
    r = w_format * parts["format"] + w_label * parts["label"] + w_judge * parts["judge"]
    return r * parts["format"] if format_gate else r


@register_reward("epm_format")
def epm_format_reward(batch, examples, task, state) -> torch.Tensor:
    """1 for a completion in the rationale grammar, else 0."""
    return reward_parts(batch.texts, examples)["format"]


@register_reward("epm_label")
def epm_label_reward(batch, examples, task, state) -> torch.Tensor:
    """1 for the right label (0 for a malformed completion)."""
    return reward_parts(batch.texts, examples)["label"]


@register_reward("epm_judge")
def epm_judge_reward(batch, examples, task, state) -> torch.Tensor:
    """The rule judge's faithfulness score in [0, 1]."""
    return reward_parts(batch.texts, examples)["judge"]


@register_reward("epm_composite")
def epm_composite_reward(batch, examples, task, state, w_format: float = 0.2, w_label: float = 1.0,
                         w_judge: float = 0.5, format_gate: bool = True) -> torch.Tensor:
    """EPM-RL's agent-based reward (reconstructed): :func:`composite_reward` of :func:`reward_parts`."""
    return composite_reward(reward_parts(batch.texts, examples), w_format, w_label, w_judge, format_gate)


# ---------------------------------------------------------------------- the math the chapter checks
def lora_parameter_count(d_in: int, d_out: int, r: int) -> int:
    """Trainable parameters of one LoRA adapter ``W0 + (alpha / r) B A`` on a ``d_out x d_in`` map:
    ``A`` is ``r x d_in`` and ``B`` is ``d_out x r``, so ``r (d_in + d_out)``."""
    if min(d_in, d_out, r) < 1:
        raise ValueError(f"d_in, d_out and r must be positive, got {d_in}, {d_out}, {r}")
    return r * (d_in + d_out)


def lora_grads(G: torch.Tensor, X: torch.Tensor, A: torch.Tensor, B: torch.Tensor, scale: float):
    """Closed-form gradients of a loss through ``Y = X W0^T + scale X A^T B^T`` w.r.t. ``A`` and ``B``.

    =======  ============  ==================================================
    G        (n, d_out)    upstream gradient dL/dY
    X        (n, d_in)     inputs
    A        (r, d_in)     down-projection
    B        (d_out, r)    up-projection (zero at initialisation)
    returns  (dA, dB)      ``scale B^T G^T X`` (r, d_in), ``scale G^T X A^T`` (d_out, r)
    =======  ============  ==================================================
    """
    if G.ndim != 2 or X.ndim != 2 or G.shape[0] != X.shape[0]:
        raise ValueError(f"G {tuple(G.shape)} and X {tuple(X.shape)} must be (n, d_out) and (n, d_in)")
    if A.shape != (B.shape[1], X.shape[1]) or B.shape[0] != G.shape[1]:
        raise ValueError(f"A {tuple(A.shape)} and B {tuple(B.shape)} do not fit X {tuple(X.shape)}, G {tuple(G.shape)}")
    return scale * B.T @ G.T @ X, scale * G.T @ X @ A.T


def judge_shift_bound(kl: float, j_sup: float = 1.0) -> float:
    """Pinsker's bound on how far any policy within ``KL(pi || pi0) <= kl`` can move the expected
    score of a judge with values in ``[0, j_sup]``: ``|E_pi J - E_pi0 J| <= TV j_sup <= sqrt(kl / 2) j_sup``."""
    if not (kl >= 0 and j_sup >= 0):
        raise ValueError(f"kl and j_sup must be >= 0, got {kl}, {j_sup}")
    return math.sqrt(kl / 2) * j_sup


# ---------------------------------------------------------------------- the experiment, in rlcourse.studies.epm_rl
_STUDY_NAMES = frozenset((
    '_train_flops', 'claims', 'cost_table', 'count_parameters', 'load_base', 'measure', 'plant_label_deficit',
    'rl_stage', 'run_experiment', 'run_seed', 'setting', 'sft_stage', 'sizes', 'verdicts',
))


def __getattr__(name):
    """The chapter's experiment lives in :mod:`rlcourse.studies.epm_rl`; its names stay importable here."""
    if name in _STUDY_NAMES:
        from ..studies import epm_rl as study

        return getattr(study, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
