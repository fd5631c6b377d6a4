"""Does the reasoning matter? Causal Importance of Reasoning (CIR) and Sufficiency of Reasoning (SR).

Yu, Tartaglini, Hase, Guestrin and Potts (2026), *Outcome Rewards Do Not Guarantee Verifiable or
Causally Important Reasoning*, arXiv:2604.22074. A response is ``<think>|<answer>``; CIR measures how
much truncating the think part moves the probability of the model's own answer, SR whether a reader
of the think part alone reaches an unambiguous answer.

Parts registered here:

==============  ==========  =====================================================================
name            kind        what it is
==============  ==========  =====================================================================
``cot_sum``     task        ``3725=`` -> ``3027|7``: running sums mod 10, then ``|`` and the answer;
                            the demonstrations mix faithful scratchpads with filler ``....``
``cot_first``   task        ``3725=`` -> ``5273|3``: the answer is the question's first digit, the
                            faithful scratchpad the question reversed; 30% of the faithful
                            demonstrations end in a wrong digit that the shown answer copies, so a
                            shortcut (answer from the question, filler think) competes with it
``cot_cir``     reward      outcome reward + ``weight`` x CIR (the authors' training-time CIR:
                            truncation at 0, 20, 40, 60, 80% of the think part), scored with the
                            current policy's log-probs, + ``sr_weight`` x our rule-based SR
==============  ==========  =====================================================================

The experiment that uses them is the study :mod:`rlcourse.studies.cot_influence`.
"""
from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace
from typing import Sequence

import numpy as np
import torch

from ..lm.model import response_logprobs
from ..lm.sampling import encode_prompts
from ..profiles import one_torch_thread
from ..rewards import register_reward
from ..tasks import Example, Score, Task, register_task

PAPER = "Outcome Rewards Do Not Guarantee Verifiable or Causally Important Reasoning, Yu et al., 2026, arXiv:2604.22074"
REWARD_LEVELS = (0.0, 0.2, 0.4, 0.6, 0.8)  # the authors' training-time truncation fractions


# ---------------------------------------------------------------------- the two metrics, exact
def js_bern(p, q, eps: float = 1e-12):
    """Jensen-Shannon divergence (nats) between Bernoulli(p) and Bernoulli(q), elementwise.

    ====== ====== =========================================
    p, q   (...)  probabilities (tensor or array), same shape
    return (...)  JS in [0, log 2]
    ====== ====== =========================================
    """
    p, q = torch.as_tensor(p, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64)
    if p.shape != q.shape:
        raise ValueError(f"js_bern: p {tuple(p.shape)} and q {tuple(q.shape)} differ")
    if bool(((p < 0) | (p > 1) | (q < 0) | (q > 1)).any()) or not bool(torch.isfinite(p).all() & torch.isfinite(q).all()):
        raise ValueError("js_bern: probabilities must lie in [0, 1]")
    p, q = p.clamp(eps, 1 - eps), q.clamp(eps, 1 - eps)
    m = (p + q) / 2

    def kl(a, b):
        return a * (a.log() - b.log()) + (1 - a) * ((1 - a).log() - (1 - b).log())

    return (0.5 * kl(p, m) + 0.5 * kl(q, m)).clamp(0.0, math.log(2))


def cir_from_probs(p_trunc, p_full):
    """CIR of each response from its answer probabilities: ``mean_k JS(Bern(p_k) || Bern(p_full))``.

    ======= ====== ===========================================================
    p_trunc (N,K)  answer probability after each of K truncations of the think
    p_full  (N,)   answer probability after the whole think
    return  (N,)   float64 CIR in [0, log 2]
    ======= ====== ===========================================================
    """
    p_trunc, p_full = torch.as_tensor(p_trunc, dtype=torch.float64), torch.as_tensor(p_full, dtype=torch.float64)
    if p_trunc.ndim != 2 or p_full.shape != p_trunc.shape[:1]:
        raise ValueError(f"cir_from_probs: p_trunc must be (N,K) and p_full (N,), got {tuple(p_trunc.shape)}, "
                         f"{tuple(p_full.shape)}")
    if p_trunc.shape[1] == 0:
        raise ValueError("cir_from_probs: no truncation levels")
    return js_bern(p_trunc, p_full[:, None].expand_as(p_trunc)).mean(1)


def split_response(text: str) -> tuple[str, str] | None:
    """``"3027|7"`` -> ``("3027", "7")``; None when there is no ``|`` or no answer after it."""
    if "|" not in text:
        return None
    think, answer = text.rsplit("|", 1)
    answer = answer.strip()
    return (think, answer) if answer else None


def truncation_points(T: int, levels: Sequence[float] | None = None) -> list[int]:
    """Where to cut a think of ``T`` characters: ``levels=None`` gives the metric's ``k = 1..T``
    (the paper's definition, one cut per unit); fractions give ``floor(f T)`` (the training reward)."""
    if T < 0:
        raise ValueError(f"T must be >= 0, got {T}")
    if levels is None:
        return list(range(1, T + 1)) if T > 0 else [0]
    if any(not 0 <= f < 1 for f in levels):
        raise ValueError(f"truncation fractions must lie in [0, 1), got {list(levels)}")
    return [int(math.floor(f * T)) for f in levels]


@torch.no_grad()
def answer_logprob(model, tokenizer, contexts: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
    """``log pi(answer | context)`` summed over the answer's tokens, one forward pass for all rows.

    ======== ====== ================================================
    contexts N      prompt + truncated think + ``|``
    answers  N      the answer strings (no EOS)
    return   (N,)   float32 log-probabilities
    ======== ====== ================================================
    """
    if len(contexts) != len(answers) or not contexts:
        raise ValueError(f"answer_logprob: {len(contexts)} contexts and {len(answers)} answers")
    if any(not a for a in answers):
        raise ValueError("answer_logprob: an answer is empty")
    p_ids, p_mask = encode_prompts(tokenizer, list(contexts))
    enc = tokenizer(list(answers), return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    ids, mask = torch.cat([p_ids, enc["input_ids"]], 1), torch.cat([p_mask, enc["attention_mask"]], 1)
    logp = response_logprobs(model, ids, mask, enc["input_ids"].shape[1])
    return (logp * enc["attention_mask"]).sum(-1)


def cir_scores(model, tokenizer, prompts: Sequence[str], texts: Sequence[str],
               levels: Sequence[float] | None = None) -> torch.Tensor:
    """CIR of each response ``prompt -> text``, exact from the model's log-probs.

    ``p_k = pi(a | q, t[:k] + "|")`` for the cuts of :func:`truncation_points`; NaN where the
    response has no answer (malformed).

    ======= ====== ==========================================
    prompts N      the questions q
    texts   N      responses ``think|answer``
    return  (N,)   float64 CIR, NaN for malformed responses
    ======= ====== ==========================================
    """
    if len(prompts) != len(texts):
        raise ValueError(f"cir_scores: {len(prompts)} prompts but {len(texts)} texts")
    out = torch.full((len(texts),), float("nan"), dtype=torch.float64)
    rows, ctx, ans, owner, cut_count = [], [], [], [], []
    for i, (q, text) in enumerate(zip(prompts, texts)):
        parts = split_response(text)
        if parts is None:
            continue
        think, a = parts
        cuts = truncation_points(len(think), levels)
        rows.append(i)
        cut_count.append(len(cuts))
        for k in [len(think)] + cuts:  # the full think first
            ctx.append(q + think[:k] + "|")
            ans.append(a)
            owner.append(len(rows) - 1)
    if not rows:
        return out
    p = answer_logprob(model, tokenizer, ctx, ans).double().exp()
    start = 0
    for j, i in enumerate(rows):
        n = cut_count[j] + 1
        chunk = p[start:start + n]
        out[i] = cir_from_probs(chunk[1:][None], chunk[:1])[0]
        start += n
    return out


def sr_scores(prompts: Sequence[str], texts: Sequence[str], task: "CotSum | None" = None) -> torch.Tensor:
    """Our rule-based SR for ``cot_sum`` and ``cot_first`` (a stand-in for the paper's LLM verifier).

    The answer is stripped (everything from the last ``|``). A reader of the think alone answers
    with its last character, ``y(t)``, if the think is a string of digits (the last partial sum, or
    the last digit of the reversed question), and has no answer otherwise; a reader who also has the
    question answers ``y(q, t) = task.truth(q)``. SR = 1 when the two agree: the reasoning alone
    reaches the answer the question determines. ``task`` defaults to :class:`CotSum`.

    ======= ====== =======================
    prompts N      the task's questions
    texts   N      responses
    return  (N,)   float32 in {0, 1}
    ======= ====== =======================
    """
    if len(prompts) != len(texts):
        raise ValueError(f"sr_scores: {len(prompts)} prompts but {len(texts)} texts")
    task = task if task is not None else CotSum()
    out = []
    for q, text in zip(prompts, texts):
        think = text.rsplit("|", 1)[0] if "|" in text else text
        y_t = think[-1] if think.isdigit() else None
        out.append(float(y_t is not None and y_t == task.truth(q)))
    return torch.tensor(out, dtype=torch.float32)


# ---------------------------------------------------------------------- the task
class CotSum(Task):
    """``3725=`` -> ``3027|7``: the think is the running sum of the digits mod 10 (faithful: its last
    digit is the answer) or, with probability ``filler``, ``....`` (uninformative). Only the part after
    the last ``|`` is graded."""

    test_fraction = 0.1

    def __init__(self, digits: int = 4, filler: float = 0.5):
        if not 2 <= digits <= 8:
            raise ValueError(f"digits must be between 2 and 8, got {digits}")
        if not 0 <= filler <= 1:
            raise ValueError(f"filler must be in [0, 1], got {filler}")
        self.digits, self.filler = digits, filler
        self.name = "cot_sum"

    def truth(self, question: str) -> str:
        """The answer the question determines: ``"3725="`` -> ``"7"`` (digit sum mod 10)."""
        digits = question.rstrip("=")
        if not digits.isdigit():
            raise ValueError(f"{self.name} questions read like '3725=', got {question!r}")
        return str(sum(map(int, digits)) % 10)

    def _draw(self, rng):
        d = [int(x) for x in rng.integers(0, 10, size=self.digits)]
        sums = "".join(str(s) for s in np.cumsum(d) % 10)
        fill = rng.random() < self.filler
        think = "." * self.digits if fill else sums
        return Example(prompt="".join(map(str, d)) + "=", answer=sums[-1], solution=f"{think}|{sums[-1]}",
                       meta={"faithful": sums, "filler": bool(fill)})

    def score(self, completion, example):
        parts = split_response(completion)
        if parts is None:
            return Score(0.0, "malformed: no answer after '|'")
        ok = parts[1] == example.answer
        return Score(float(ok), "correct" if ok else f"wrong: {parts[1]!r} != {example.answer}")


register_task("cot_sum")(CotSum)


class CotFirst(CotSum):
    """``3725=`` -> ``5273|3``: the graded answer is the question's **first** digit, a shortcut a model
    can copy from the question. The faithful think is the question reversed, whose last character is
    the answer; with probability ``corrupt`` a faithful demonstration ends in a wrong digit and its
    shown answer copies that digit. A filler demonstration (probability ``filler``) is ``....`` and the
    right answer. So, sampled, the faithful path is the *less* accurate one: a shortcut competes."""

    def __init__(self, digits: int = 4, filler: float = 0.5, corrupt: float = 0.3):
        super().__init__(digits, filler)
        if not 0 <= corrupt < 1:
            raise ValueError(f"corrupt must be in [0, 1), got {corrupt}")
        self.corrupt = corrupt
        self.name = "cot_first"

    def truth(self, question: str) -> str:
        """``"3725="`` -> ``"3"``, the question's first digit."""
        digits = question.rstrip("=")
        if not digits.isdigit():
            raise ValueError(f"{self.name} questions read like '3725=', got {question!r}")
        return digits[0]

    def _draw(self, rng):
        q = "".join(str(int(x)) for x in rng.integers(0, 10, size=self.digits))
        faithful, answer = q[::-1], q[0]
        think, shown = faithful, answer
        fill = rng.random() < self.filler
        if fill:
            think = "." * self.digits
        elif rng.random() < self.corrupt:
            shown = str((int(answer) + int(rng.integers(1, 10))) % 10)
            think = faithful[:-1] + shown
        return Example(prompt=q + "=", answer=answer, solution=f"{think}|{shown}",
                       meta={"faithful": faithful, "filler": bool(fill)})


register_task("cot_first")(CotFirst)


def faithful_examples(examples: Sequence[Example]) -> list[Example]:
    """The same prompts with the faithful scratchpad as the demonstration (the SFT warm-up's data)."""
    return [replace(e, solution=f"{e.meta['faithful']}|{e.answer}") for e in examples]


# ---------------------------------------------------------------------- the auxiliary reward
@register_reward("cot_cir")
def cot_cir_reward(batch, examples, task, state, model=None, tokenizer=None, weight: float = 0.5,
                   gate: bool = False, sr_weight: float = 0.0) -> torch.Tensor:
    """``r_outcome + weight * CIR + sr_weight * SR`` (``gate=True``: CIR counts only on correct
    answers), CIR from the current policy at the authors' five truncation fractions, SR from
    :func:`sr_scores`. Malformed responses get CIR 0. ``(B,)``"""
    if not isinstance(task, CotSum):
        raise ValueError(f"the cot_cir reward reads think|answer responses of the cot_sum or cot_first task, "
                         f"got {task.name!r}")
    if model is None or tokenizer is None:
        raise ValueError("the cot_cir reward scores with the policy: the loop must pass model and tokenizer")
    if weight < 0 or sr_weight < 0:
        raise ValueError(f"weight and sr_weight must be >= 0, got {weight}, {sr_weight}")
    r = torch.as_tensor(task.rewards(batch.texts, examples), dtype=torch.float32)
    with one_torch_thread():
        c = cir_scores(model, tokenizer, batch.prompts, batch.texts, REWARD_LEVELS).nan_to_num(0.0).float()
    if gate:
        c = c * r
    batch.metrics["cir_reward"] = float(c.mean())
    out = r + weight * c
    if sr_weight:
        sr = sr_scores(batch.prompts, batch.texts, task)
        batch.metrics["sr_reward"] = float(sr.mean())
        out = out + sr_weight * sr
    return out


# ---------------------------------------------------------------------- planted models for tests
class PlantedAnswerModel(torch.nn.Module):
    """A hand-written "model" for checking the metrics: after a ``|`` it puts probability ``sharp`` on
    one digit, chosen by ``rule``: ``"ignore"`` answers the digit sum of the question mod 10 whatever
    the think says; ``"copy"`` answers the character just before ``|`` (0 if it is not a digit).
    Elsewhere it is uniform. Call it like a ``transformers`` causal LM."""

    def __init__(self, tokenizer, rule: str, sharp: float = 0.9):
        super().__init__()
        if rule not in ("ignore", "copy"):
            raise ValueError(f"rule must be 'ignore' or 'copy', got {rule!r}")
        self.tok, self.rule, self.sharp = tokenizer, rule, sharp
        self.bar = tokenizer.convert_tokens_to_ids("|")
        self.digit_ids = tokenizer.convert_tokens_to_ids([str(i) for i in range(10)])

    def forward(self, input_ids, attention_mask=None, logits_to_keep=0, **_):
        B, L = input_ids.shape
        V = len(self.tok)
        logits = torch.zeros(B, L, V)
        for b in range(B):
            toks = self.tok.convert_ids_to_tokens(input_ids[b].tolist())
            for t in range(L):
                if input_ids[b, t] != self.bar:
                    continue
                real = [x for x in toks[:t] if len(x) == 1]
                q = "".join(real).split("=")[0]
                if self.rule == "ignore":
                    d = sum(int(c) for c in q if c.isdigit()) % 10
                else:
                    d = int(real[-1]) if real and real[-1].isdigit() else 0
                logp = torch.full((V,), math.log((1 - self.sharp) / (V - 1)))
                logp[self.digit_ids[d]] = math.log(self.sharp)
                logits[b, t] = logp
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)
