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

import copy
import hashlib
import json
import math
import re
import time
from dataclasses import replace
from typing import Sequence

import numpy as np
import torch

from ..claims import Claim, evaluate
from ..lm.model import build_model
from ..lm.sampling import sample
from ..lm.tokenizer import build_tokenizer
from ..profiles import Profile, cache_dir, one_torch_thread, profile as current_profile
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


# ---------------------------------------------------------------------- the experiment
def sizes(prof: Profile | None = None) -> dict:
    """Every size of the experiment, from the profile (fixed before the book run)."""
    prof = prof or current_profile()
    lm = replace(prof, lm_hidden=prof.pick(smoke=32, book=64), lm_intermediate=prof.pick(smoke=64, book=192),
                 lm_layers=prof.pick(smoke=1, book=2), lm_heads=prof.pick(smoke=2, book=4), lm_max_positions=96)
    return dict(lm=lm, base_steps=prof.pick(smoke=20, book=500), base_lr=2e-3, lora_r=8, lora_alpha=16,
                sft_steps=prof.pick(smoke=4, book=100), sft_batch=prof.pick(smoke=8, book=32), sft_lr=3e-3,
                full_lr=1e-3, control_sft_steps=prof.pick(smoke=2, book=10), control_seed_offset=10, deficit=1.0,
                rl_steps=prof.pick(smoke=2, book=80), prompts=prof.pick(smoke=2, book=8),
                G=prof.pick(smoke=4, book=8), rl_lr=3e-4, noises=(0.2, 0.7),
                eval_prompts=prof.pick(smoke=16, book=256), weights={"w_format": 0.2, "w_label": 1.0, "w_judge": 0.5})


def load_base(prof: Profile | None = None, seed: int = 0, progress: bool = False):
    """The "general" base: the tiny LM fully fine-tuned on clean (noise 0) pairs with rationales,
    before it meets promotional noise. Deterministic for ``seed``; cached (``epm_rl/``)."""
    from ..lm.zoo import cached_model
    from ..train import sft

    prof = prof or current_profile()
    S = sizes(prof)
    recipe = {"v": 1, "lm": S["lm"].as_dict(), "steps": S["base_steps"], "lr": S["base_lr"], "seed": seed}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / "epm_rl" / f"base-{prof.name}-seed{seed}-{digest}"

    def build():
        tok = build_tokenizer()
        model = build_model(tok, S["lm"], seed=seed)
        pool = ProductPairs(0.0).examples(20000, seed=seed, split="train")
        with one_torch_thread():
            sft(model, tok, pool, steps=S["base_steps"], batch_size=64, lr=S["base_lr"], seed=seed, progress=progress)
        return model, tok

    return cached_model(path, build)


@torch.no_grad()
def measure(model, tokenizer, examples: Sequence[Example]) -> dict:
    """Greedy decoding on held-out pairs: balanced accuracy (mean of the recall on matches and on
    non-matches), faithfulness (share with judge score 1), format rate, and tokens per pair."""
    with one_torch_thread():
        batch = sample(model, tokenizer, [e.prompt for e in examples], temperature=0.0, max_new_tokens=16)
    parts = reward_parts(batch.texts, examples)
    y = np.array([e.answer == "Y" for e in examples])
    lab = parts["label"].numpy()
    recall = [float(lab[y].mean()) if y.any() else 0.0, float(lab[~y].mean()) if (~y).any() else 0.0]
    return {"accuracy": float(np.mean(recall)), "faithful": float((parts["judge"] == 1).float().mean()),
            "format": float(parts["format"].mean()), "label_acc": float(lab.mean()),
            "infer_tokens": float(batch.prompt_mask.sum() + batch.response_mask.sum()) / len(examples),
            "new_tokens": float(batch.response_mask.sum()) / len(examples)}


def count_parameters(model) -> tuple[int, int]:
    """``(trainable, total)`` parameters (tied embeddings counted once)."""
    seen, total, train = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        train += p.numel() if p.requires_grad else 0
    return train, total


def _train_flops(tokens: float, n_total: int, n_train: int) -> float:
    """Training FLOPs of ``tokens`` through a model: 2N forward + 2N for the activations' gradients
    + 2 N_trainable for the weights' gradients (a frozen weight needs no weight gradient)."""
    return tokens * (4 * n_total + 2 * n_train)


def plant_label_deficit(examples: Sequence[Example], share: float = 1.0, seed: int = 0) -> list[Example]:
    """Demonstrations with a class-conditional label error: on a ``share`` of the pairs whose brands
    agree but whose model ids differ (true label ``N``), the shown label is ``Y``; the rationale still
    cites the true fields and every other pair is untouched. An adapter SFT'd on them learns "same brand,
    so Y": a systematic deficit of its labels that the label reward sees, while its grammar is intact.
    ``Example.answer`` (what is graded) stays the true label."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be a probability in [0, 1], got {share}")
    rng = np.random.default_rng(seed)
    out = []
    for e in examples:
        b, m = e.meta["brands"], e.meta["models"]
        if b[0] == b[1] and m[0] != m[1] and rng.random() < share:
            e = replace(e, solution=e.solution[:-1] + "Y")
        out.append(e)
    return out


def sft_stage(model, tokenizer, task: ProductPairs, steps: int, S: dict, seed: int, lr: float,
              deficit: float = 0.0) -> dict:
    """SFT on teacher rationales of noisy pairs (with :func:`plant_label_deficit` at ``deficit`` when it
    is above 0); returns seconds, tokens and FLOPs."""
    from ..train import sft

    pool = task.examples(4000, seed=100 + seed, split="train")
    if deficit > 0:
        pool = plant_label_deficit(pool, deficit, seed)
    t0 = time.perf_counter()
    with one_torch_thread():
        sft(model, tokenizer, pool, steps=steps, batch_size=S["sft_batch"], lr=lr, seed=seed)
    per = np.mean([len(e.prompt) + len(e.solution) + 1 for e in pool])
    tokens = steps * S["sft_batch"] * per
    n_train, n_total = count_parameters(model)
    return {"seconds": time.perf_counter() - t0, "train_tokens": tokens, "flops": _train_flops(tokens, n_total, n_train)}


def rl_stage(model, tokenizer, task: ProductPairs, S: dict, seed: int, reward: str = "epm_composite",
             reward_kwargs: dict | None = None) -> dict:
    """GRPO on the LoRA adapter with ``reward``; returns seconds, tokens, FLOPs and the reward curve."""
    from ..train import RLConfig, Trainer

    cfg = RLConfig(num_generations=S["G"], prompts_per_step=S["prompts"], steps=S["rl_steps"], learning_rate=S["rl_lr"],
                   max_completion_length=16, seed=seed, progress=False, reward=reward,
                   reward_kwargs=dict(reward_kwargs or {}))
    trainer = Trainer(model, tokenizer, task, cfg, train_examples=task.examples(2000, seed=200 + seed, split="train"),
                      eval_examples=task.examples(8, seed=0, split="test"))
    t0 = time.perf_counter()
    with one_torch_thread():
        trainer.train()
    sampled = sum(h["prompt_tokens"] + h["response_tokens"] for h in trainer.history)
    trained = sum((h["prompt_tokens"] + h["response_tokens"]) * h["frac_rows_trained"] for h in trainer.history)
    n_train, n_total = count_parameters(model)
    return {"seconds": time.perf_counter() - t0, "train_tokens": sampled + trained,
            "flops": sampled * 2 * n_total + _train_flops(trained, n_total, n_train),
            "reward": [h["reward"] for h in trainer.history]}


def run_seed(noise: float, seed: int, prof: Profile | None = None, ablation: bool = False) -> dict:
    """One seed at one noise level: LoRA SFT, then RL with the full reward. With ``ablation`` also RL
    without the judge, a full fine-tune with the same SFT budget, the format-channel sanity check (the
    same RL stage and reward from an adapter SFT'd for only ``control_sft_steps`` steps), and the
    label-channel control (the full SFT budget on demonstrations with a planted class-conditional label
    error, then the same RL stage), the latter on the disjoint seed ``control_seed_offset + seed``.
    Every arm is measured on the same held-out pairs."""
    from ..capstone.models import add_lora

    prof = prof or current_profile()
    S = sizes(prof)
    base, tok = load_base(prof)
    task = ProductPairs(noise)
    held = task.examples(S["eval_prompts"], seed=0, split="test")
    torch.manual_seed(seed)
    out: dict = {"noise": noise, "seed": seed, "base": measure(base, tok, held)}
    out["base"].update(trainable=0, seconds=0.0, flops=0.0, train_tokens=0.0)
    lora = add_lora(copy.deepcopy(base), r=S["lora_r"], alpha=S["lora_alpha"], seed=seed)
    cost = sft_stage(lora, tok, task, S["sft_steps"], S, seed, S["sft_lr"])
    n_train = count_parameters(lora)[0]
    out["SFT-LoRA"] = {**measure(lora, tok, held), "trainable": n_train, **cost}
    arms = [("SFT-LoRA+RL", S["weights"])] + ([("SFT-LoRA+RL (no judge)", {**S["weights"], "w_judge": 0.0})]
                                               if ablation else [])
    for name, w in arms:
        m = copy.deepcopy(lora)
        rl = rl_stage(m, tok, task, S, seed, reward_kwargs=w)
        out[name] = {**measure(m, tok, held), "trainable": n_train, "seconds": cost["seconds"] + rl["seconds"],
                     "flops": cost["flops"] + rl["flops"], "train_tokens": cost["train_tokens"] + rl["train_tokens"],
                     "reward": rl["reward"]}
    if ablation:
        full = copy.deepcopy(base)
        fcost = sft_stage(full, tok, task, S["sft_steps"], S, seed, S["full_lr"])
        out["SFT-full"] = {**measure(full, tok, held), "trainable": count_parameters(full)[0], **fcost}
        weak = add_lora(copy.deepcopy(base), r=S["lora_r"], alpha=S["lora_alpha"], seed=seed)
        sft_stage(weak, tok, task, S["control_sft_steps"], S, seed, S["sft_lr"])
        out["weak SFT"] = measure(weak, tok, held)
        rl_stage(weak, tok, task, S, seed, reward_kwargs=S["weights"])
        out["weak SFT+RL"] = measure(weak, tok, held)
        cseed = S["control_seed_offset"] + seed
        torch.manual_seed(cseed)
        planted = add_lora(copy.deepcopy(base), r=S["lora_r"], alpha=S["lora_alpha"], seed=cseed)
        sft_stage(planted, tok, task, S["sft_steps"], S, cseed, S["sft_lr"], deficit=S["deficit"])
        out["planted SFT"] = measure(planted, tok, held)
        rl_stage(planted, tok, task, S, cseed, reward_kwargs=S["weights"])
        out["planted SFT+RL"] = measure(planted, tok, held)
    return out


def run_experiment(prof: Profile | None = None) -> dict:
    """Every noise level on ``prof.seeds`` seeds; the ablation and controls at the highest noise."""
    prof = prof or current_profile()
    S = sizes(prof)
    t0 = time.perf_counter()
    load_base(prof)
    t_base = time.perf_counter() - t0
    seeds = list(range(prof.seeds))
    hi = max(S["noises"])
    runs = {nz: [run_seed(nz, s, prof, ablation=nz == hi) for s in seeds] for nz in S["noises"]}
    return {"runs": runs, "seeds": len(seeds), "sizes": S, "profile": prof, "base_seconds": t_base,
            "seconds": time.perf_counter() - t0}


def setting(S: dict) -> str:
    """Our setting in words, from :func:`sizes`."""
    lm = S["lm"]
    return (f"tiny Llama ({lm.lm_layers} layers, width {lm.lm_hidden}) SFT'd {S['base_steps']} steps on clean pairs; "
            f"LoRA r={S['lora_r']} SFT {S['sft_steps']} steps x {S['sft_batch']} on noisy pairs; GRPO {S['rl_steps']} "
            f"steps of {S['prompts']} prompts x {S['G']} samples on the adapter, no KL term; rule judge; greedy "
            f"balanced accuracy on {S['eval_prompts']} held-out pairs")


def claims(prof: Profile | None = None) -> dict[str, Claim]:
    """The chapter's claims, margins fixed before the run."""
    S = sizes(prof or current_profile())
    c = dict(paper=PAPER, setting=setting(S), source="abstract")
    out = {}
    for nz in S["noises"]:
        out[f"rl_{nz:g}"] = Claim(
            key=f"epm_rl/rl-over-peft-noise{nz:g}", statement="EPM-RL consistently improves over PEFT-only training",
            metric=f"greedy balanced accuracy, noise {nz:g}", method="SFT-LoRA+RL", baseline="SFT-LoRA",
            kind="greater", margin=0.02, **c)
    hi = max(S["noises"])
    out["ablation_accuracy"] = Claim(
        key="epm_rl/no-judge-keeps-accuracy", statement="[ours] dropping the judge term keeps accuracy",
        metric=f"greedy balanced accuracy, noise {hi:g}", method="SFT-LoRA+RL (no judge)", baseline="SFT-LoRA+RL",
        kind="equivalent", margin=0.03, **c)
    out["ablation_faithful"] = Claim(
        key="epm_rl/no-judge-loses-faithfulness",
        statement="[ours] dropping the judge term lowers rationale faithfulness",
        metric=f"share of faithful rationales (judge = 1), noise {hi:g}", method="SFT-LoRA+RL (no judge)",
        baseline="SFT-LoRA+RL", kind="less", margin=0.01, **c)
    out["control"] = Claim(
        key="epm_rl/control-rl-lifts-weak-sft", role="positive control",
        statement=f"pipeline sanity check (format channel): the same RL stage lifts an adapter SFT'd for only "
        f"{S['control_sft_steps']} steps, which has the grammar still to learn",
        metric=f"greedy balanced accuracy, noise {hi:g}", method="weak SFT+RL", baseline="weak SFT",
        kind="greater", margin=0.02, **c)
    out["label_control"] = Claim(
        key="epm_rl/control-rl-repairs-planted-labels", role="positive control",
        statement="label-channel control: the same RL stage lifts the balanced accuracy of a fully SFT'd adapter "
        "whose demonstrations said Y on every same-brand, different-model pair (a planted class-conditional "
        "label error), on seeds disjoint from the reported ones",
        metric=f"greedy balanced accuracy, noise {hi:g}", method="planted SFT+RL", baseline="planted SFT",
        kind="greater", margin=0.02, **c)
    out[f"rl_{hi:g}"] = replace(out[f"rl_{hi:g}"], control=out["label_control"].key)
    return out


def verdicts(result: dict) -> dict:
    """The claims evaluated on :func:`run_experiment`'s result."""
    C = claims(result.get("profile"))
    runs, s = result["runs"], result["seconds"]
    hi = max(runs)

    def arm(nz, name, key="accuracy"):
        return [r[name][key] for r in runs[nz]]

    label_control = evaluate(C["label_control"], arm(hi, "planted SFT+RL"), arm(hi, "planted SFT"), seconds=s)
    V = {f"rl_{nz:g}": evaluate(C[f"rl_{nz:g}"], arm(nz, "SFT-LoRA+RL"), arm(nz, "SFT-LoRA"), seconds=s,
                                control=label_control if C[f"rl_{nz:g}"].control else None)
         for nz in runs}
    V["label_control"] = label_control
    V["ablation_accuracy"] = evaluate(C["ablation_accuracy"], arm(hi, "SFT-LoRA+RL (no judge)"),
                                      arm(hi, "SFT-LoRA+RL"), seconds=s)
    V["ablation_faithful"] = evaluate(C["ablation_faithful"], arm(hi, "SFT-LoRA+RL (no judge)", "faithful"),
                                      arm(hi, "SFT-LoRA+RL", "faithful"), seconds=s)
    V["control"] = evaluate(C["control"], arm(hi, "weak SFT+RL"), arm(hi, "weak SFT"), seconds=s)
    return V


def cost_table(result: dict) -> list[dict]:
    """Quality against cost at the highest noise, means over seeds (measured, not typed)."""
    runs = result["runs"][max(result["runs"])]
    rows = []
    for name in ("base", "SFT-LoRA", "SFT-LoRA+RL", "SFT-LoRA+RL (no judge)", "SFT-full"):
        ds = [r[name] for r in runs]
        rows.append({"arm": name, **{k: float(np.mean([d[k] for d in ds]))
                                     for k in ("accuracy", "faithful", "trainable", "seconds", "flops", "train_tokens",
                                               "infer_tokens")}})
    return rows
