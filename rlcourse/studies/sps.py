"""The SPS chapter's studies: GRPO against GRPO + IRL phases (SPS) on the shared-strategy bandit of
:func:`rlcourse.methods.sps.train_bandit`, and on the tiny countdown model with the registered reward
:class:`~rlcourse.methods.sps.SPSReward`; then the paper's claims and their verdicts on the grids.

The bandit's arms are ``"GRPO"`` and ``"SPS"``; its seeds are the profile's ``toy_seeds``, and one cell
trains one policy on the bandit of its seed, from generators seeded by that seed alone
(:func:`run_cell`), so a cell's numbers do not depend on which cells ran before it.
:func:`run_bandit_experiment` runs the grid on the study runner (cached per cell) and rebuilds the
dict the chapter reads; :func:`bandit_verdicts` evaluates :func:`bandit_claims` on it.

The language-model grid (:func:`lm_study`) has a third arm, ``"base model"``: its cell measures the
untrained model with the seed's own sampling seed. Every cell loads the profile's base model itself.
"""
from __future__ import annotations

from dataclasses import asdict

import numpy as np
import torch

from ..claims import Claim, Verdict, evaluate
from ..methods.sps import PAPER, BanditConfig, make_sps_reward, train_bandit
from ..metrics import mean_pass_at_k
from ..profiles import Profile, one_torch_thread
from .runner import Results, Study, run_study

BANDIT_ARMS = {"GRPO": "grpo", "SPS": "sps"}  # arm -> train_bandit's method
BANDIT_MODULES = ("rlcourse.methods.sps", "rlcourse.methods.noisy")


# ---------------------------------------------------------------------- the shared-strategy bandit
def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train arm ``arm`` of :data:`BANDIT_ARMS` on the bandit of ``seed`` with the
    :class:`~rlcourse.methods.sps.BanditConfig` in ``sizes["config"]``: :func:`train_bandit`'s output
    as lists (``E`` evaluation points, ``T`` steps).

    ==========================  ========  ==================================================
    steps                       ``(E,)``  the evaluation points
    pass1, passk, entropy, pi2  ``(E,)``  held-out exact pass@1, pass@k, entropy, pi(s2)
    train_pass1, train_passk    ``(E,)``  the same on the training prompts
    demos                       scalar    distinct correct (prompt, strategy) pairs found
    irl                         ``(T,)``  1 on IRL steps
    ==========================  ========  ==================================================
    """
    if arm not in BANDIT_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(BANDIT_ARMS)}")
    r = train_bandit(BANDIT_ARMS[arm], BanditConfig(**sizes["config"]), seed)
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in r.items()}


def bandit_study(P: Profile, cfg: BanditConfig | None = None, seeds: int | None = None) -> Study:
    """Both arms on bandits ``0 .. n-1`` (``n`` = ``seeds`` or ``P.toy_seeds``), with ``cfg`` (default:
    the profile's steps)."""
    cfg = cfg or BanditConfig(steps=P.pick(smoke=30, book=300))
    return Study(name="sps-bandit", arms=tuple(BANDIT_ARMS), seeds=tuple(range(seeds or P.toy_seeds)), run=run_cell,
                 sizes={"config": asdict(cfg)}, verdicts=verdicts, modules=BANDIT_MODULES)


def bandit_output(results: Results) -> dict:
    """The chapter's dict from a :func:`bandit_study`'s results: ``runs[arm]`` (a list of
    :func:`train_bandit` outputs, one per seed, with arrays), ``cfg``, ``seeds``, ``seconds``."""
    study = results.study
    runs = {arm: [{k: np.array(v) if isinstance(v, list) else v for k, v in results.metrics[(arm, s)].items()}
                  for s in study.seeds] for arm in study.arms}
    return {"runs": runs, "cfg": BanditConfig(**study.sizes["config"]), "seeds": len(study.seeds),
            "seconds": results.wall_seconds}


def run_bandit_experiment(P: Profile, cfg: BanditConfig | None = None, seeds: int | None = None, **run_kw) -> dict:
    """GRPO and GRPO + IRL (SPS) on the shared-strategy bandit over ``P.toy_seeds`` paired seeds:
    :func:`bandit_study` on the study runner (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`),
    as :func:`bandit_output`'s dict."""
    return bandit_output(run_study(bandit_study(P, cfg, seeds), **run_kw))


BANDIT_SETTING = ("shared-strategy contextual bandit: 100 training and 100 held-out prompts, c1 = 0.8, shared "
                  "strategy bias (lr 0.3) plus a slow prompt-conditional head (lr 0.006), 16 prompts x 8 samples per "
                  "step, 300 steps; SPS: 10 GRPO steps then 10 IRL steps (MaxEnt reward on de-duplicated correct "
                  "pairs, entropy-regularised GRPO step), repeated")


def common_fields(setting: str) -> dict:
    """The fields every claim of the chapter shares: the paper, its abstract, and ``setting``."""
    return dict(paper=PAPER, source="abstract", setting=setting,
                paper_number="five reasoning benchmarks (not reproduced)")


def bandit_claims() -> dict[str, Claim]:
    """The bandit's claims: GRPO's squeeze (the control), SPS's pass@k and its pass@1."""
    common = common_fields(BANDIT_SETTING)
    return {
        "squeeze": Claim(key="sps/bandit-grpo-squeezes", statement="RL (GRPO) squeezes probability onto the dominant "
                         "strategy: its pass@k for large k falls during training", metric="held-out pass@16 (exact), "
                         "end of training against step 0", method="GRPO (end)", baseline="GRPO (step 0)", kind="less",
                         margin=0.02, **common),
        "passk": Claim(key="sps/bandit-passk", statement="SPS improves pass@k over RL alone", metric="held-out pass@16 "
                       "(exact) at the end of training", method="SPS", baseline="GRPO", kind="greater", margin=0.02,
                       control="sps/bandit-grpo-squeezes", **common),
        "pass1": Claim(key="sps/bandit-pass1", role="course hypothesis",
                       statement="SPS keeps pass@1 (our reading: within 0.05 of RL alone)",
                       metric="held-out pass@1 (exact) at the end of training", method="SPS", baseline="GRPO",
                       kind="equivalent", margin=0.05, **common),
    }


def bandit_verdicts(out: dict) -> dict[str, Verdict]:
    """The bandit's claims on :func:`run_bandit_experiment`'s output; SPS's pass@k gain rests on GRPO's
    squeeze (without a squeeze there is nothing for SPS to recover, and the comparison is uninformative)."""
    g, s, sec = out["runs"]["GRPO"], out["runs"]["SPS"], out["seconds"]
    c = bandit_claims()
    squeeze = evaluate(c["squeeze"], [r["passk"][-1] for r in g], [r["passk"][0] for r in g], seconds=sec)
    return {"squeeze": squeeze,
            "passk": evaluate(c["passk"], [r["passk"][-1] for r in s], [r["passk"][-1] for r in g], seconds=sec,
                              control=squeeze),
            "pass1": evaluate(c["pass1"], [r["pass1"][-1] for r in s], [r["pass1"][-1] for r in g], seconds=sec)}


def verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`bandit_verdicts` on a :func:`bandit_study`'s results."""
    return bandit_verdicts(bandit_output(results))


# ---------------------------------------------------------------------- the tiny language model
LM_ARMS = ("base model", "GRPO", "SPS")
LM_MODULES = ("rlcourse.methods.sps", "rlcourse.train", "rlcourse.metrics")


def sample_correctness(model, tokenizer, task, examples, n: int, max_new_tokens: int, seed: int) -> dict:
    """Draw ``n`` samples per example at temperature 1; returns ``correct`` ``(P, n)`` and ``texts`` (P lists)."""
    from ..lm import sample
    gen = torch.Generator().manual_seed(seed)
    batch = sample(model, tokenizer, [e.prompt for e in examples], num_generations=n, max_new_tokens=max_new_tokens,
                   generator=gen)
    per_row = [e for e in examples for _ in range(n)]
    correct = task.rewards(batch.texts, per_row).reshape(len(examples), n)
    texts = [batch.texts[i * n:(i + 1) * n] for i in range(len(examples))]
    return {"correct": correct, "texts": texts}


def lm_diversity(correct: np.ndarray, texts, ks=(1, 16)) -> dict:
    """pass@k (unbiased, :func:`~rlcourse.metrics.mean_pass_at_k`) and the mean number of distinct correct
    responses per prompt."""
    from ..metrics import distinct_correct
    out = {f"pass{k}": float(v) for k, v in mean_pass_at_k(correct, ks).items()}
    out["distinct_correct"] = float(np.mean([distinct_correct(t, c) for t, c in zip(texts, correct)]))
    return out


def run_lm_cell(arm: str, seed: int, sizes: dict) -> dict:
    """One arm of :data:`LM_ARMS` from the profile's countdown base model (loaded by the cell).

    ``"base model"``: the untrained model measured with sampling seed ``200 + seed`` (``diversity``) and
    with the shared seed 99 (``before``, the same in every seed's cell: a few hundred samples).
    ``"GRPO"``, ``"SPS"``: trained on the pool with training seed ``seed``, then measured with sampling
    seed ``100 + seed`` (``diversity``); ``history`` is the loop's per-step metrics and ``demos`` SPS's
    final number of demonstrations (0 for GRPO). A ``diversity`` is an :func:`lm_diversity` dict.
    """
    from ..lm import load_base_model
    from ..tasks import get_task
    from ..train import RLConfig, Trainer

    if arm not in LM_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {LM_ARMS}")
    prof, ks, n = Profile(**sizes["profile"]), tuple(sizes["ks"]), sizes["n_samples"]
    task = get_task("countdown")
    pool = task.examples(sizes["n_prompts"], seed=5, split="train", distinct=True)
    with one_torch_thread():
        model, tok = load_base_model(task, "weak", prof=prof, progress=False)

        def measure(m, sampling_seed):
            return lm_diversity(**sample_correctness(m, tok, task, pool, n, 10, seed=sampling_seed), ks=ks)

        if arm == "base model":
            return {"before": measure(model, 99), "diversity": measure(model, 200 + seed)}
        reward = "task" if arm == "GRPO" else make_sps_reward(n_rl=10, n_irl=10)
        cfg = RLConfig(num_generations=sizes["num_generations"], prompts_per_step=sizes["prompts_per_step"],
                       steps=sizes["steps"], learning_rate=sizes["lr"], max_completion_length=10, seed=seed,
                       reward=reward, progress=False)
        tr = Trainer(model, tok, task, cfg, train_examples=pool, eval_examples=pool[:1])
        tr.train()
        demos = sum(len(v) for v in tr.state["sps"]["demos"].values()) if arm == "SPS" else 0
        return {"diversity": measure(tr.model, 100 + seed), "history": tr.history, "demos": demos}


def lm_study(P: Profile, seeds: int | None = None, steps: int | None = None, lr: float = 3e-4) -> Study:
    """The language-model grid: :data:`LM_ARMS` on ``seeds`` (default ``P.seeds``) seeds, ``steps``
    (default: the profile's) steps at learning rate ``lr``."""
    sizes = {"profile": P.as_dict(), "steps": steps or P.pick(smoke=3, book=40), "lr": lr,
             "n_samples": P.pick(smoke=4, book=32), "ks": [1, P.pick(smoke=4, book=16)],
             "n_prompts": P.pick(smoke=4, book=16), "num_generations": P.pick(smoke=4, book=8),
             "prompts_per_step": P.pick(smoke=2, book=8)}
    return Study(name="sps-lm", arms=LM_ARMS, seeds=tuple(range(seeds or P.seeds)), run=run_lm_cell, sizes=sizes,
                 verdicts=lm_study_verdicts, modules=LM_MODULES)


def lm_output(results: Results) -> dict:
    """The chapter's dict from an :func:`lm_study`'s results (``n`` seeds).

    ===============  =========================================================================
    before           the base model's :func:`lm_diversity` dict (shared sampling seed 99)
    before_per_seed  ``n`` of them, the base measured again with each seed's own sampling seed
    after[arm]       ``n`` of them, one per seed, for ``"GRPO"`` and ``"SPS"``
    demos            SPS's demonstration count per seed
    history[arm]     per-seed lists of the loop's metrics
    seeds, steps     the grid's seeds and steps; also ``lr``, ``ks``, ``n_prompts``, ``n_samples``
    seconds          wall seconds of the grid's cells
    ===============  =========================================================================
    """
    study, sz = results.study, results.study.sizes
    base = results.values("base model", "diversity")
    out = {"after": {arm: results.values(arm, "diversity") for arm in ("GRPO", "SPS")},
           "demos": results.values("SPS", "demos"),
           "history": {arm: results.values(arm, "history") for arm in ("GRPO", "SPS")},
           "before": results.values("base model", "before")[0], "before_per_seed": base}
    out.update(seeds=len(study.seeds), steps=sz["steps"], lr=sz["lr"], ks=tuple(sz["ks"]), n_prompts=sz["n_prompts"],
               n_samples=sz["n_samples"], seconds=results.wall_seconds)
    return out


def run_lm_experiment(P: Profile, seeds: int | None = None, steps: int | None = None, lr: float = 3e-4,
                      **run_kw) -> dict:
    """GRPO against GRPO + SPS (the reward :class:`~rlcourse.methods.sps.SPSReward`) on the tiny
    countdown model: :func:`lm_study` on the study runner, as :func:`lm_output`'s dict.

    Training draws from a fixed pool of distinct training prompts (so that each prompt is met often
    and its demonstration set fills); pass@1, pass@16 and distinct correct expressions are measured
    on the same prompts with 32 samples each, before and after training."""
    return lm_output(run_study(lm_study(P, seeds, steps, lr), **run_kw))


LM_SETTING = ("tiny Llama (book profile) pre-trained on countdown (3 numbers up to 9, + - *) to about 20% greedy "
              "accuracy; 16 training prompts, 8 prompts x 8 samples a step, lr 3e-4, 40 steps; SPS: 10 GRPO steps, "
              "then 10 steps on the IRL reward, repeated; 32 samples per prompt for pass@k")


def lm_claims() -> dict[str, Claim]:
    """The language model's claims: GRPO's squeeze (the control), SPS's pass@k and distinct paths."""
    common = common_fields(LM_SETTING)
    return {
        "squeeze": Claim(key="sps/lm-grpo-squeezes", statement="RL narrows the set of correct reasoning paths it "
                         "explores (squeezing)", metric="distinct correct expressions per prompt in 32 samples",
                         method="GRPO", baseline="base model", kind="less", **common),
        "passk": Claim(key="sps/lm-passk", statement="SPS improves pass@k over RL alone", metric="pass@16 (unbiased, "
                       "32 samples per training prompt) after training", method="SPS", baseline="GRPO",
                       kind="greater", **common),
        "distinct": Claim(key="sps/lm-distinct", statement="SPS explores more distinct reasoning paths than RL alone",
                          metric="distinct correct expressions per prompt in 32 samples", method="SPS",
                          baseline="GRPO", kind="greater", control="sps/lm-grpo-squeezes", **common),
    }


def lm_verdicts(out: dict) -> dict[str, Verdict]:
    """:func:`lm_claims` on :func:`run_lm_experiment`'s output; the distinct-paths claim rests on the squeeze."""
    c, sec, n = lm_claims(), out["seconds"], out["seeds"]
    after = {arm: {key: [d[key] for d in runs] for key in runs[0]} for arm, runs in out["after"].items()}
    k = f"pass{out['ks'][1]}"
    base = out.get("before_per_seed")  # older runs measured the base once
    base = [d["distinct_correct"] for d in base] if base else [out["before"]["distinct_correct"]] * n
    squeeze = evaluate(c["squeeze"], after["GRPO"]["distinct_correct"], base, seconds=sec)
    return {"squeeze": squeeze,
            "passk": evaluate(c["passk"], after["SPS"][k], after["GRPO"][k], seconds=sec),
            "distinct": evaluate(c["distinct"], after["SPS"]["distinct_correct"], after["GRPO"]["distinct_correct"],
                                 seconds=sec, control=squeeze)}


def lm_study_verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`lm_verdicts` on an :func:`lm_study`'s results."""
    return lm_verdicts(lm_output(results))
