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
``cot_cir``     reward      outcome reward + ``weight`` x CIR (the authors' training-time CIR:
                            truncation at 0, 20, 40, 60, 80% of the think part), scored with the
                            current policy's log-probs
==============  ==========  =====================================================================
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Sequence

import numpy as np
import torch

from ..claims import Claim, evaluate
from ..lm.model import build_model, response_logprobs
from ..lm.sampling import encode_prompts, sample
from ..lm.tokenizer import build_tokenizer
from ..profiles import Profile, cache_dir, one_torch_thread, profile as current_profile
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


def sr_scores(prompts: Sequence[str], texts: Sequence[str]) -> torch.Tensor:
    """Our rule-based SR for ``cot_sum`` (a stand-in for the paper's LLM verifier).

    The answer is stripped (everything from the last ``|``). A reader of the think alone answers
    with its last partial sum, ``y(t)``, if the think is a string of digits, and has no answer
    otherwise; a reader who also has the question answers ``y(q, t)``, the digit sum of ``q`` mod 10.
    SR = 1 when the two agree: the reasoning alone reaches the answer the question determines.

    ======= ====== =======================
    prompts N      ``cot_sum`` questions
    texts   N      responses
    return  (N,)   float32 in {0, 1}
    ======= ====== =======================
    """
    if len(prompts) != len(texts):
        raise ValueError(f"sr_scores: {len(prompts)} prompts but {len(texts)} texts")
    out = []
    for q, text in zip(prompts, texts):
        digits = q.rstrip("=")
        if not digits.isdigit():
            raise ValueError(f"sr_scores reads cot_sum questions such as '3725=', got {q!r}")
        think = text.rsplit("|", 1)[0] if "|" in text else text
        y_t = think[-1] if think.isdigit() else None
        out.append(float(y_t is not None and int(y_t) == sum(map(int, digits)) % 10))
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


def faithful_examples(examples: Sequence[Example]) -> list[Example]:
    """The same prompts with the faithful scratchpad as the demonstration (the SFT warm-up's data)."""
    return [replace(e, solution=f"{e.meta['faithful']}|{e.answer}") for e in examples]


# ---------------------------------------------------------------------- the auxiliary reward
@register_reward("cot_cir")
def cot_cir_reward(batch, examples, task, state, model=None, tokenizer=None, weight: float = 0.5,
                   gate: bool = False) -> torch.Tensor:
    """``r_outcome + weight * CIR`` (``gate=True``: CIR counts only on correct answers), CIR from the
    current policy at the authors' five truncation fractions. Malformed responses get CIR 0. ``(B,)``"""
    if not isinstance(task, CotSum):
        raise ValueError(f"the cot_cir reward reads think|answer responses of the cot_sum task, got {task.name!r}")
    if model is None or tokenizer is None:
        raise ValueError("the cot_cir reward scores with the policy: the loop must pass model and tokenizer")
    if weight < 0:
        raise ValueError(f"weight must be >= 0, got {weight}")
    r = torch.as_tensor(task.rewards(batch.texts, examples), dtype=torch.float32)
    with one_torch_thread():
        c = cir_scores(model, tokenizer, batch.prompts, batch.texts, REWARD_LEVELS).nan_to_num(0.0).float()
    if gate:
        c = c * r
    batch.metrics["cir_reward"] = float(c.mean())
    return r + weight * c


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


# ---------------------------------------------------------------------- the experiment
def _sizes(prof: Profile) -> dict:
    return dict(
        lm=replace(prof, lm_hidden=prof.pick(smoke=32, book=64), lm_intermediate=prof.pick(smoke=64, book=256),
                   lm_layers=prof.pick(smoke=1, book=2), lm_heads=prof.pick(smoke=2, book=4), lm_max_positions=32),
        pretrain_steps=prof.pick(smoke=40, book=500), sft_steps=prof.pick(smoke=5, book=60),
        rl_steps=prof.pick(smoke=2, book=30), prompts=prof.pick(smoke=2, book=8), G=prof.pick(smoke=4, book=8),
        eval_prompts=prof.pick(smoke=8, book=96), eval_samples=prof.pick(smoke=2, book=4), rl_lr=3e-4, weight=0.5)


def load_mixed_base(prof: Profile | None = None, seed: int = 0, progress: bool = False):
    """The base model: the tiny LM SFT'd on ``cot_sum`` demonstrations, half faithful, half filler.
    Deterministic for ``seed``; cached under :func:`rlcourse.cache_dir` (``cot_influence/``)."""
    from ..lm.zoo import cached_model
    from ..train import sft

    prof = prof or current_profile()
    S = _sizes(prof)
    recipe = {"v": 1, "lm": S["lm"].as_dict(), "steps": S["pretrain_steps"], "seed": seed, "filler": 0.5}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / "cot_influence" / f"base-{prof.name}-seed{seed}-{digest}"

    def build():
        tok = build_tokenizer()
        model = build_model(tok, S["lm"], seed=seed)
        pool = CotSum().examples(20000, seed=seed, split="train")
        with one_torch_thread():
            sft(model, tok, pool, steps=S["pretrain_steps"], batch_size=64, lr=1e-3, seed=seed, progress=progress)
        return model, tok

    return cached_model(path, build)


@torch.no_grad()
def measure(model, tokenizer, examples: Sequence[Example], samples: int, seed: int) -> dict:
    """Sampled (temperature 1) accuracy, CIR (metric cuts k = 1..T), SR, the share of faithful-looking
    thinks (all digits) and of malformed responses, on ``examples`` with ``samples`` each."""
    task = CotSum()
    with one_torch_thread():
        batch = sample(model, tokenizer, [e.prompt for e in examples], num_generations=samples,
                       max_new_tokens=task.digits + 3, temperature=1.0, generator=torch.Generator().manual_seed(seed))
        per_row = [examples[int(i)] for i in batch.index]
        cir = cir_scores(model, tokenizer, batch.prompts, batch.texts)
    acc = task.rewards(batch.texts, per_row)
    sr = sr_scores(batch.prompts, batch.texts)
    ok = ~torch.isnan(cir)
    digits = [t.rsplit("|", 1)[0].isdigit() for t in batch.texts]
    return {"accuracy": float(acc.mean()), "cir": float(cir[ok].mean()) if ok.any() else 0.0,
            "sr": float(sr.mean()), "faithful_share": float(np.mean(digits)), "malformed": float((~ok).float().mean())}


@torch.no_grad()
def path_accuracy(model, tokenizer, examples: Sequence[Example]) -> dict:
    """Greedy accuracy of the answer when the think is forced: the faithful running sums, or filler.
    It says how good each of the base model's two ways of answering is (the shortcut's worth)."""
    out = {}
    with one_torch_thread():
        for path in ("faithful", "filler"):
            ctx = [e.prompt + (e.meta["faithful"] if path == "faithful" else "." * len(e.meta["faithful"])) + "|"
                   for e in examples]
            batch = sample(model, tokenizer, ctx, temperature=0.0, max_new_tokens=2)
            out[path] = float(np.mean([t.strip() == e.answer for t, e in zip(batch.texts, examples)]))
    return out


ARMS = ("GRPO", "SFT+GRPO", "GRPO+CIR")


def run_arm(arm: str, prof: Profile | None = None, seed: int = 0) -> dict:
    """One arm from the mixed base: ``GRPO`` (outcome reward), ``SFT+GRPO`` (a short SFT on faithful
    scratchpads first) or ``GRPO+CIR`` (reward ``cot_cir``). Returns the metrics before and after."""
    import copy

    from ..train import RLConfig, Trainer, sft

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; arms: {ARMS}")
    prof = prof or current_profile()
    S = _sizes(prof)
    base, tok = load_mixed_base(prof, seed=0)
    model = copy.deepcopy(base)
    task = CotSum()
    held = task.examples(S["eval_prompts"], seed=0, split="test")
    torch.manual_seed(seed)
    with one_torch_thread():
        if arm == "SFT+GRPO":
            warm = faithful_examples(task.examples(2000, seed=100 + seed, split="train"))
            sft(model, tok, warm, steps=S["sft_steps"], batch_size=32, lr=1e-3, seed=seed)
        cfg = RLConfig(num_generations=S["G"], prompts_per_step=S["prompts"], steps=S["rl_steps"],
                       learning_rate=S["rl_lr"], max_completion_length=task.digits + 3, seed=seed, progress=False,
                       reward="cot_cir" if arm == "GRPO+CIR" else "task",
                       reward_kwargs={"weight": S["weight"]} if arm == "GRPO+CIR" else {})
        trainer = Trainer(model, tok, task, cfg, train_examples=task.examples(2000, seed=seed, split="train"),
                          eval_examples=held)
        trainer.train()
    after = measure(model, tok, held, S["eval_samples"], seed=1000 + seed)
    return {"arm": arm, "seed": seed, "after": after, "reward": [h["reward"] for h in trainer.history]}


def run_experiment(prof: Profile | None = None) -> dict:
    """Every arm on ``prof.seeds`` seeds, plus the base model measured with the same seeds' samples."""
    prof = prof or current_profile()
    S = _sizes(prof)
    t0 = time.perf_counter()
    base, tok = load_mixed_base(prof, seed=0)
    t_base = time.perf_counter() - t0
    held = CotSum().examples(S["eval_prompts"], seed=0, split="test")
    seeds = list(range(prof.seeds))
    before = [measure(base, tok, held, S["eval_samples"], seed=1000 + s) for s in seeds]
    paths = path_accuracy(base, tok, held)
    runs = {arm: [run_arm(arm, prof, s) for s in seeds] for arm in ARMS}
    return {"before": before, "runs": runs, "seeds": len(seeds), "sizes": S, "profile": prof, "base_seconds": t_base, "paths": paths,
            "seconds": time.perf_counter() - t0}


def setting(S: dict) -> str:
    """Our setting in words, from the sizes of :func:`_sizes`."""
    lm = S["lm"]
    return (f"tiny Llama ({lm.lm_layers} layers, width {lm.lm_hidden}) on cot_sum (digit sum of 4 digits mod 10), base "
            f"SFT'd {S['pretrain_steps']} steps on 50% faithful running-sum scratchpads and 50% filler; {S['rl_steps']} "
            f"GRPO steps of {S['prompts']} prompts x {S['G']} samples; metrics from {S['eval_samples']} samples at "
            f"temperature 1 on {S['eval_prompts']} held-out prompts")


def claims(prof: Profile | None = None) -> dict[str, Claim]:
    """The chapter's claims, margins fixed before the run."""
    c = dict(paper=PAPER, setting=setting(_sizes(prof or current_profile())))
    return {
        "grpo_accuracy": Claim(key="cot_influence/grpo-raises-accuracy", statement="while RLVR does improve task accuracy",
                               source="abstract", metric="sampled accuracy on held-out prompts", method="GRPO",
                               baseline="base model", kind="greater", margin=0.02, **c),
        "grpo_cir": Claim(key="cot_influence/grpo-lowers-cir",
                          statement="it does not reliably improve CIR or SR; 19/40 tasks show decreased CIR after RLVR",
                          source="abstract; authors' README", paper_number="19/40 tasks with lower CIR",
                          metric="mean CIR (nats) of sampled responses", method="GRPO", baseline="base model",
                          kind="less", margin=0.0, unit="{:.4f}", **c),
        "sft_cir": Claim(key="cot_influence/sft-warmup-raises-cir",
                         statement="a small amount of SFT before RLVR can be a remedy for low CIR and SR", source="abstract",
                         metric="mean CIR (nats) of sampled responses", method="SFT+GRPO", baseline="GRPO",
                         kind="greater", margin=0.02, unit="{:.4f}", **c),
        "aux_cir": Claim(key="cot_influence/cir-reward-raises-cir",
                         statement="CIR and SR can be improved even without SFT by applying auxiliary CIR/SR rewards",
                         source="abstract", metric="mean CIR (nats) of sampled responses", method="GRPO+CIR",
                         baseline="GRPO", kind="greater", margin=0.02, unit="{:.4f}", **c),
        "aux_sr": Claim(key="cot_influence/cir-reward-raises-sr",
                        statement="CIR and SR can be improved even without SFT by applying auxiliary CIR/SR rewards",
                        source="abstract", metric="rule-based SR of sampled responses", method="GRPO+CIR",
                        baseline="GRPO", kind="greater", margin=0.02, **c),
        "aux_accuracy": Claim(key="cot_influence/cir-reward-matches-accuracy",
                              statement="This joint reward matches the accuracy of RLVR", source="abstract",
                              metric="sampled accuracy on held-out prompts", method="GRPO+CIR", baseline="GRPO",
                              kind="equivalent", margin=0.05, **c),
    }


def verdicts(result: dict) -> dict:
    """The claims evaluated on :func:`run_experiment`'s result."""
    C = claims(result.get("profile"))

    def arm(name, key):
        return [r["after"][key] for r in result["runs"][name]]

    base = {key: [b[key] for b in result["before"]] for key in ("accuracy", "cir", "sr")}
    s = result["seconds"]
    return {
        "grpo_accuracy": evaluate(C["grpo_accuracy"], arm("GRPO", "accuracy"), base["accuracy"], seconds=s),
        "grpo_cir": evaluate(C["grpo_cir"], arm("GRPO", "cir"), base["cir"], seconds=s),
        "sft_cir": evaluate(C["sft_cir"], arm("SFT+GRPO", "cir"), arm("GRPO", "cir"), seconds=s),
        "aux_cir": evaluate(C["aux_cir"], arm("GRPO+CIR", "cir"), arm("GRPO", "cir"), seconds=s),
        "aux_sr": evaluate(C["aux_sr"], arm("GRPO+CIR", "sr"), arm("GRPO", "sr"), seconds=s),
        "aux_accuracy": evaluate(C["aux_accuracy"], arm("GRPO+CIR", "accuracy"), arm("GRPO", "accuracy"), seconds=s),
    }
