"""The CIR/SR chapter's experiment as a study: two settings (with and without a competing shortcut),
the base model and the recipes on each, and the claims with their path controls.

Settings (one base model each, SFT'd on half faithful, half filler demonstrations):

==========  ==============  ==========================================================================
setting     task            the two ways of answering
==========  ==============  ==========================================================================
plain       ``cot_sum``     the faithful running sums answer well; the filler path is near chance,
                            so by the path proposition an outcome reward must *raise* CIR
shortcut    ``cot_first``   the answer can be read off the question; 30% of faithful demonstrations
                            end wrong, so the filler path is the more accurate one and an outcome
                            reward should *lower* CIR
==========  ==============  ==========================================================================

Arms are ``"<setting>/<recipe>"``; the recipe ``base`` only measures the base model with the seed's
samples. Each setting's positive control is the premise of the path proposition, measured on the
base's own samples: which path (all-digit think or other) answers more accurately.
"""
from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import replace
from typing import Sequence

import numpy as np
import torch

from ..claims import Claim, evaluate
from ..lm.model import build_model
from ..lm.sampling import sample
from ..lm.tokenizer import build_tokenizer
from ..methods.cot_influence import PAPER, CotFirst, CotSum, cir_scores, faithful_examples, sr_scores
from ..profiles import Profile, cache_dir, one_torch_thread, profile as get_profile
from .runner import Results, Study

SETTINGS = {"plain": CotSum, "shortcut": CotFirst}
RECIPES = {"plain": ("base", "GRPO", "GRPO+CIR"),
           "shortcut": ("base", "GRPO", "SFT+GRPO", "GRPO+CIR", "GRPO+CIR+SR")}
ARMS = tuple(f"{s}/{r}" for s, rs in RECIPES.items() for r in rs)


def sizes_for(prof: Profile) -> dict:
    """The budget of one profile, JSON-serialisable (it keys the study's cache)."""
    return dict(profile=prof.name, hidden=prof.pick(smoke=32, book=64), intermediate=prof.pick(smoke=64, book=256),
                layers=prof.pick(smoke=1, book=2), heads=prof.pick(smoke=2, book=4),
                pretrain_steps=prof.pick(smoke=40, book=500), sft_steps=prof.pick(smoke=5, book=60),
                rl_steps=prof.pick(smoke=2, book=30), prompts=prof.pick(smoke=2, book=8), G=prof.pick(smoke=4, book=8),
                eval_prompts=prof.pick(smoke=8, book=96), eval_samples=prof.pick(smoke=2, book=4), rl_lr=3e-4,
                weight=0.5, sr_weight=0.5)


def _lm(S: dict) -> Profile:
    return replace(get_profile(S["profile"]), lm_hidden=S["hidden"], lm_intermediate=S["intermediate"],
                   lm_layers=S["layers"], lm_heads=S["heads"], lm_max_positions=32)


def load_mixed_base(prof: Profile | None = None, seed: int = 0, setting: str = "plain", progress: bool = False):
    """The base model of ``setting``: the tiny LM SFT'd on its task's demonstrations, half faithful,
    half filler. Deterministic for ``seed``; cached under :func:`rlcourse.cache_dir` (``cot_influence/``)."""
    from ..lm.zoo import cached_model
    from ..train import sft

    if setting not in SETTINGS:
        raise ValueError(f"unknown setting {setting!r}; settings: {tuple(SETTINGS)}")
    prof = prof or get_profile()
    S = sizes_for(prof)
    lm = _lm(S)
    recipe = {"v": 1, "lm": lm.as_dict(), "steps": S["pretrain_steps"], "seed": seed, "filler": 0.5}
    if setting != "plain":
        recipe |= {"task": "cot_first", "corrupt": 0.3}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / "cot_influence" / f"base-{prof.name}-seed{seed}-{digest}"

    def build():
        tok = build_tokenizer()
        model = build_model(tok, lm, seed=seed)
        pool = SETTINGS[setting]().examples(20000, seed=seed, split="train")
        with one_torch_thread():
            sft(model, tok, pool, steps=S["pretrain_steps"], batch_size=64, lr=1e-3, seed=seed, progress=progress)
        return model, tok

    return cached_model(path, build)


def _mean_or_none(values: np.ndarray, keep: np.ndarray):
    return float(values[keep].mean()) if keep.any() else None


@torch.no_grad()
def measure(model, tokenizer, examples: Sequence, samples: int, seed: int, task: CotSum | None = None) -> dict:
    """Sampled (temperature 1) accuracy, CIR (metric cuts k = 1..T), SR, the share of faithful-looking
    thinks (all digits) and of malformed responses, on ``examples`` with ``samples`` each; and accuracy
    and CIR split by think type (``*_digit``: all-digit thinks; ``*_other``: the rest), ``None`` where a
    type was not sampled."""
    task = task or CotSum()
    with one_torch_thread():
        batch = sample(model, tokenizer, [e.prompt for e in examples], num_generations=samples,
                       max_new_tokens=task.digits + 3, temperature=1.0, generator=torch.Generator().manual_seed(seed))
        per_row = [examples[int(i)] for i in batch.index]
        cir = cir_scores(model, tokenizer, batch.prompts, batch.texts).numpy()
    acc = np.asarray(task.rewards(batch.texts, per_row), dtype=float)
    sr = sr_scores(batch.prompts, batch.texts, task).numpy()
    ok = ~np.isnan(cir)
    digit = np.array([t.rsplit("|", 1)[0].isdigit() for t in batch.texts])
    return {"accuracy": float(acc.mean()), "cir": float(cir[ok].mean()) if ok.any() else 0.0, "sr": float(sr.mean()),
            "faithful_share": float(digit.mean()), "malformed": float((~ok).mean()),
            "acc_digit": _mean_or_none(acc, digit), "acc_other": _mean_or_none(acc, ~digit),
            "cir_digit": _mean_or_none(cir, ok & digit), "cir_other": _mean_or_none(cir, ok & ~digit)}


@torch.no_grad()
def path_accuracy(model, tokenizer, examples: Sequence) -> dict:
    """Greedy accuracy of the answer when the think is forced: the faithful scratchpad, or filler."""
    out = {}
    with one_torch_thread():
        for path in ("faithful", "filler"):
            ctx = [e.prompt + (e.meta["faithful"] if path == "faithful" else "." * len(e.meta["faithful"])) + "|"
                   for e in examples]
            batch = sample(model, tokenizer, ctx, temperature=0.0, max_new_tokens=2)
            out[path] = float(np.mean([t.strip() == e.answer for t, e in zip(batch.texts, examples)]))
    return out


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """One (setting/recipe, seed): ``base`` measures the base model with this seed's samples (and the
    forced-path accuracies); ``GRPO`` (outcome reward), ``SFT+GRPO`` (a short SFT on faithful scratchpads
    of other prompts first), ``GRPO+CIR`` (reward ``cot_cir``) and ``GRPO+CIR+SR`` (``cot_cir`` with the
    rule-based SR term too) train from the base and are measured after."""
    from ..train import RLConfig, Trainer, sft

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; arms: {ARMS}")
    setting, recipe = arm.split("/")
    S = sizes
    prof = get_profile(S["profile"])
    task = SETTINGS[setting]()
    base, tok = load_mixed_base(prof, seed=0, setting=setting)
    held = task.examples(S["eval_prompts"], seed=0, split="test")
    if recipe == "base":
        return measure(base, tok, held, S["eval_samples"], seed=1000 + seed, task=task) | {
            "path_" + k: v for k, v in path_accuracy(base, tok, held).items()}
    model = copy.deepcopy(base)
    torch.manual_seed(seed)
    kwargs = {"GRPO+CIR": {"weight": S["weight"]}, "GRPO+CIR+SR": {"weight": S["weight"], "sr_weight": S["sr_weight"]}}
    with one_torch_thread():
        if recipe == "SFT+GRPO":
            warm = faithful_examples(task.examples(2000, seed=100 + seed, split="train"))
            sft(model, tok, warm, steps=S["sft_steps"], batch_size=32, lr=1e-3, seed=seed)
        cfg = RLConfig(num_generations=S["G"], prompts_per_step=S["prompts"], steps=S["rl_steps"],
                       learning_rate=S["rl_lr"], max_completion_length=task.digits + 3, seed=seed, progress=False,
                       reward="cot_cir" if recipe in kwargs else "task", reward_kwargs=kwargs.get(recipe, {}))
        trainer = Trainer(model, tok, task, cfg, train_examples=task.examples(2000, seed=seed, split="train"),
                          eval_examples=held)
        trainer.train()
    return measure(model, tok, held, S["eval_samples"], seed=1000 + seed, task=task) | {
        "reward": [float(h["reward"]) for h in trainer.history]}


def study(prof: Profile | None = None) -> Study:
    """The chapter's grid on ``prof.seeds`` seeds."""
    prof = prof or get_profile()
    return Study(name="cot_influence", arms=ARMS, seeds=tuple(range(prof.seeds)), run=run_cell,
                 sizes=sizes_for(prof), verdicts=verdicts, modules=("rlcourse.methods.cot_influence",))


def setting_text(S: dict, setting: str) -> str:
    """Our setting in words, from the sizes of :func:`sizes_for`."""
    task = {"plain": "cot_sum (digit sum of 4 digits mod 10; the filler path near chance)",
            "shortcut": "cot_first (first digit of 4; faithful think = the question reversed, 30% of faithful "
                        "demonstrations end wrong, so a filler shortcut is the more accurate path)"}[setting]
    return (f"tiny Llama ({S['layers']} layers, width {S['hidden']}) on {task}, base SFT'd {S['pretrain_steps']} "
            f"steps on 50% faithful and 50% filler scratchpads; {S['rl_steps']} GRPO steps of {S['prompts']} prompts "
            f"x {S['G']} samples; metrics from {S['eval_samples']} samples at temperature 1 on {S['eval_prompts']} "
            "held-out prompts")


CIR_UNIT = "{:.4f}"
CONTROL_SHORTCUT = "cot_influence/shortcut-competes"
CONTROL_FAITHFUL = "cot_influence/faithful-path-wins"


def claims(prof: Profile | None = None) -> dict[str, Claim]:
    """The chapter's claims, margins fixed before the run."""
    S = sizes_for(prof or get_profile())
    plain, short = (dict(paper=PAPER, setting=setting_text(S, s)) for s in ("plain", "shortcut"))
    premise = "the base model's sampled answers are more accurate after {} thinks than after {} ones"
    return {
        "control_shortcut": Claim(
            key="cot_influence/shortcut-competes", role="positive control", statement="premise of the path proposition: a shortcut "
            "competes (" + premise.format("non-digit", "all-digit") + ")", source="this chapter (prop-cir-paths)",
            metric="base model: accuracy after non-digit thinks minus after all-digit thinks (0 if a type is unsampled)",
            method="filler path", reference=0.0, kind="greater", margin=0.0, **short),
        "control_faithful": Claim(
            key="cot_influence/faithful-path-wins", role="positive control", statement="premise of the path proposition: the faithful "
            "path wins (" + premise.format("all-digit", "non-digit") + ")", source="this chapter (prop-cir-paths)",
            metric="base model: accuracy after all-digit thinks minus after non-digit thinks (0 if a type is unsampled)",
            method="faithful path", reference=0.0, kind="greater", margin=0.0, **plain),
        "grpo_accuracy": Claim(key="cot_influence/grpo-raises-accuracy", statement="while RLVR does improve task accuracy",
                               source="abstract", metric="sampled accuracy on held-out prompts", method="GRPO",
                               baseline="base model", kind="greater", margin=0.02, **plain),
        "grpo_cir": Claim(key="cot_influence/grpo-lowers-cir-with-shortcut", control=CONTROL_SHORTCUT,
                          statement="it does not reliably improve CIR or SR; 19/40 tasks show decreased CIR after "
                          "RLVR (tested here as: where a shortcut competes, GRPO lowers CIR)",
                          source="abstract; authors' README", paper_number="19/40 tasks with lower CIR",
                          metric="mean CIR (nats) of sampled responses", method="GRPO", baseline="base model",
                          kind="less", margin=0.0, unit=CIR_UNIT, **short),
        "grpo_cir_plain": Claim(key="cot_influence/grpo-raises-cir-without-shortcut", control=CONTROL_FAITHFUL,
                                role="course hypothesis", statement="where the faithful path is the more accurate, "
                                "the outcome reward raises CIR (the path proposition's prediction)",
                                source="this chapter (prop-cir-paths)", metric="mean CIR (nats) of sampled responses",
                                method="GRPO", baseline="base model", kind="greater", margin=0.0, unit=CIR_UNIT,
                                **plain),
        "sft_cir": Claim(key="cot_influence/sft-warmup-raises-cir", control=CONTROL_SHORTCUT,
                         statement="a small amount of SFT before RLVR can be a remedy for low CIR and SR",
                         source="abstract", metric="mean CIR (nats) of sampled responses", method="SFT+GRPO",
                         baseline="GRPO", kind="greater", margin=0.02, unit=CIR_UNIT, **short),
        "aux_cir": Claim(key="cot_influence/cir-reward-raises-cir", control=CONTROL_SHORTCUT,
                         statement="CIR and SR can be improved even without SFT by applying auxiliary CIR/SR rewards",
                         source="abstract", metric="mean CIR (nats) of sampled responses", method="GRPO+CIR",
                         baseline="GRPO", kind="greater", margin=0.02, unit=CIR_UNIT, **short),
        "aux_sr": Claim(key="cot_influence/cir-sr-reward-raises-sr", control=CONTROL_SHORTCUT,
                        statement="CIR and SR can be improved even without SFT by applying auxiliary CIR/SR rewards",
                        source="abstract", metric="rule-based SR of sampled responses", method="GRPO+CIR+SR",
                        baseline="GRPO", kind="greater", margin=0.02, **short),
        "aux_accuracy": Claim(key="cot_influence/joint-reward-matches-accuracy", statement="This joint reward matches "
                              "the accuracy of RLVR", source="abstract", metric="sampled accuracy on held-out prompts",
                              method="GRPO+CIR+SR", baseline="GRPO", kind="equivalent", margin=0.05, **short),
    }


def path_gap(m: dict, first: str, second: str) -> float:
    """``m["acc_<first>"] - m["acc_<second>"]``, 0 when either think type was not sampled."""
    a, b = m[f"acc_{first}"], m[f"acc_{second}"]
    return 0.0 if a is None or b is None else float(a - b)


def verdicts(results: Results) -> dict:
    """The claims evaluated on the study's grid."""
    prof = get_profile(results.study.sizes["profile"])
    C = claims(prof)
    s = results.wall_seconds

    def v(arm, key):
        return results.values(arm, key)

    def gaps(setting, first, second):
        return [path_gap(results.metrics[(f"{setting}/base", seed)], first, second) for seed in results.study.seeds]

    out = {"control_shortcut": evaluate(C["control_shortcut"], gaps("shortcut", "other", "digit"), seconds=s),
           "control_faithful": evaluate(C["control_faithful"], gaps("plain", "digit", "other"), seconds=s)}
    cs, cf = out["control_shortcut"], out["control_faithful"]
    out |= {
        "grpo_accuracy": evaluate(C["grpo_accuracy"], v("plain/GRPO", "accuracy"), v("plain/base", "accuracy"), seconds=s),
        "grpo_cir": evaluate(C["grpo_cir"], v("shortcut/GRPO", "cir"), v("shortcut/base", "cir"), seconds=s, control=cs),
        "grpo_cir_plain": evaluate(C["grpo_cir_plain"], v("plain/GRPO", "cir"), v("plain/base", "cir"), seconds=s,
                                   control=cf),
        "sft_cir": evaluate(C["sft_cir"], v("shortcut/SFT+GRPO", "cir"), v("shortcut/GRPO", "cir"), seconds=s, control=cs),
        "aux_cir": evaluate(C["aux_cir"], v("shortcut/GRPO+CIR", "cir"), v("shortcut/GRPO", "cir"), seconds=s, control=cs),
        "aux_sr": evaluate(C["aux_sr"], v("shortcut/GRPO+CIR+SR", "sr"), v("shortcut/GRPO", "sr"), seconds=s, control=cs),
        "aux_accuracy": evaluate(C["aux_accuracy"], v("shortcut/GRPO+CIR+SR", "accuracy"), v("shortcut/GRPO", "accuracy"),
                                 seconds=s),
    }
    return out


def not_reliably(V: dict) -> str:
    """The abstract's "does not reliably improve CIR", read off the two settings' GRPO verdicts."""
    down, up = V["grpo_cir"], V["grpo_cir_plain"]
    if down.verdict == "holds" and up.verdict == "holds":
        return ("CIR fell under GRPO where a shortcut competes and rose where it does not: the outcome reward did not "
                "reliably improve CIR, as the abstract says, and the direction followed which path was more accurate.")
    if "uninformative" in (down.verdict, up.verdict):
        return ("At least one setting's path premise was not shown on the base model, so this run cannot say whether "
                "the direction of CIR under GRPO depends on the setting.")
    return (f"The two settings did not both move as the path proposition predicts (with a shortcut: {down.verdict}; "
            f"without: {up.verdict}), so this run does not show the abstract's inconsistency across tasks.")
