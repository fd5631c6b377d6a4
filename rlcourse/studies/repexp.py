"""RepExp's experiments on the ``repexp_divisor`` task: test-time selection (the elliptical order of a pool
of samples against a random order and the planted positive control, :func:`run_inference`) and RL
post-training (GRPO against GRPO with the ``repexp`` sampler's bonus, :func:`run_rl`), with their claims
and verdicts; both run as studies on :mod:`rlcourse.studies.runner`. The method (features, the elliptical
bonus, the greedy order, the registered sampler and task) is :mod:`rlcourse.methods.repexp`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..methods.repexp import (PAPER, Divisor, elliptical_order, mean_response_hidden, planted_features,
                              random_pass_at_k, random_samples_to_first_correct, response_mode,
                              samples_to_first_correct, selected_pass_at_k, sparse_projection)
from ..profiles import Profile
from ..tasks import Example
from .runner import Results, Study, run_study


# ---------------------------------------------------------------------- the chapter's experiments
STRENGTH = 1.0  # unreachable (greedy says "2" whatever n is, right on ~64%): pre-training runs its full length
ORDERS = ("random", "elliptical", "planted", "elliptical uncentred")


def base_model(prof):
    """The chapter's base model: pre-trained on ``repexp_divisor``'s demonstrations (cached)."""
    from ..lm.zoo import load_base_model
    return load_base_model(Divisor.name, STRENGTH, prof=prof, progress=False)


def sample_pool(model, tokenizer, examples: Sequence[Example], M: int, seed: int, dim: int = 16,
                chunk: int = 8) -> dict:
    """``M`` samples per prompt at temperature 1, their correctness, modes and features (the same model's
    mean hidden states, projected to ``dim`` by one fixed sparse projection).

    ======= ============= ==================================
    correct ``(P,M)``     1 where the sample is correct
    phi     ``(P,M,dim)`` float64 projected features
    modes   ``P x M``     each sample's mode (None: malformed)
    texts   ``P x M``     the responses
    ======= ============= ==================================
    """
    from ..lm.sampling import sample
    task, gen = Divisor(), torch.Generator().manual_seed(seed)
    correct, phis, modes, texts = [], [], [], []
    proj = None
    for i in range(0, len(examples), chunk):
        part = list(examples[i:i + chunk])
        batch = sample(model, tokenizer, [e.prompt for e in part], num_generations=M, max_new_tokens=6,
                       temperature=1.0, generator=gen)
        rows = [part[int(j)] for j in batch.index]
        correct.append(task.rewards(batch.texts, rows).reshape(len(part), M))
        h = mean_response_hidden(model, batch)
        if proj is None:
            proj = sparse_projection(h.shape[1], dim, torch.Generator().manual_seed(seed + 1))
        phis.append((h @ proj).double().reshape(len(part), M, dim))
        texts += [batch.texts[j * M:(j + 1) * M] for j in range(len(part))]
    modes = [[response_mode(t) for t in row] for row in texts]
    return {"correct": np.concatenate(correct), "phi": torch.cat(phis), "modes": modes, "texts": texts}


def order_pool(pool: dict, p: int, how: str, lam: float = 0.01) -> list[int] | None:
    """The verifier's order for prompt ``p``: ``"elliptical"`` (hidden features, centred on the pool's
    mean, as in the authors' code), ``"elliptical uncentred"`` (the same features, not centred: an
    exploratory line with no claim, the counterpart of the control's choice), ``"planted"`` (the one-hot
    of the mode, *not* centred: the positive control), ``"random"`` (None: its metrics are exact
    expectations).

    The planted features are left uncentred because centred one-hots are linearly dependent (the
    pool's shares weight them to zero), which sends the pool's commonest mode to the end of the order
    (:func:`~rlcourse.methods.repexp.centred_onehot_limit`); uncentred, the order is "one sample of every
    mode, then repeats", the ideal that the control stands for."""
    if how == "random":
        return None
    if how == "elliptical":
        return elliptical_order(pool["phi"][p], lam, center=True)
    if how == "elliptical uncentred":
        return elliptical_order(pool["phi"][p], lam, center=False)
    if how == "planted":
        return elliptical_order(planted_features(pool["texts"][p], 16), lam, center=False)
    raise ValueError(f"order must be one of {ORDERS}, got {how!r}")


INFERENCE_ARM = "inference"  # the one arm of the test-time study: one pool, every order on it
INFERENCE_MODULES = ("rlcourse.methods.repexp", "rlcourse.lm.sampling")


def inference_sizes(prof) -> dict:
    """The test-time study's sizes: the profile (its base model), the held-out prompts and ``M``."""
    return {"profile": prof.as_dict(), "prompts": prof.pick(smoke=12, book=48), "samples": prof.pick(smoke=16, book=32)}


def inference_examples(sizes: dict, seed: int) -> list[Example]:
    """The held-out prompts of the test-time study (``sizes["prompts"]`` of them, drawn from ``seed``)."""
    return Divisor().examples(sizes["prompts"], seed=seed, split="test")


def run_inference_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Experiment 1's one cell (its only arm is :data:`INFERENCE_ARM`): one pool of ``M`` samples per
    held-out prompt (:func:`sample_pool` from ``seed``), every order of :data:`ORDERS` on it. The ``K``
    kept prompts are those with at least one correct sample among the ``P``; ``o`` is an order.

    ==========  ======================  ==========================================================
    ks          ``(len(ks),)``          the k of pass@k, those of 1, 2, 4, ..., 32 up to ``M``
    keep        ``(K,)``                the kept prompts' indices
    hard        ``(K,)`` bool           odd ``n``: the likeliest mode (``2``) is wrong
    calls       ``{o: (K,)}``           verifier calls to the first correct sample (random: exact)
    passk       ``{o: (len(ks), K)}``   pass@k of the first k picked, per k of ``ks``
    distinct8   ``{o: (K,)}``           distinct modes among the first 8 picked, for ``"random"``
                                        (the mean over 200 shuffles) and ``"elliptical"``
    correct     ``(P,M)``               the pool's correctness (:func:`sample_pool`)
    phi         ``(P,M,16)``            the pool's features
    modes       ``P x M``               the pool's modes (None: malformed)
    texts       ``P x M``               the pool's responses
    ==========  ======================  ==========================================================
    """
    from ..profiles import one_torch_thread
    if arm != INFERENCE_ARM:
        raise ValueError(f"unknown arm {arm!r}; the arms are {(INFERENCE_ARM,)}")
    with one_torch_thread():
        model, tok = base_model(Profile(**sizes["profile"]))
        examples = inference_examples(sizes, seed)
        M = sizes["samples"]
        pool = sample_pool(model, tok, examples, M, seed)
        ks = [k for k in (1, 2, 4, 8, 16, 32) if k <= M]
        keep = [p for p in range(len(examples)) if pool["correct"][p].sum() > 0]
        calls = {o: [] for o in ORDERS}
        passk = {o: {k: [] for k in ks} for o in ORDERS}
        for p in keep:
            c = pool["correct"][p]
            for o in ORDERS:
                order = order_pool(pool, p, o)
                if order is None:
                    calls[o].append(random_samples_to_first_correct(M, int(c.sum())))
                    got = random_pass_at_k(c, ks)
                else:
                    calls[o].append(samples_to_first_correct(order, c))
                    got = selected_pass_at_k(order, c, ks)
                for k in ks:
                    passk[o][k].append(got[k])
        distinct = {o: [] for o in ("random", "elliptical")}
        for p in keep:  # distinct modes among the first 8 picked (random: expected, by 200 shuffles)
            k8 = min(8, M)
            el = order_pool(pool, p, "elliptical")[:k8]
            distinct["elliptical"].append(len({pool["modes"][p][i] for i in el}))
            rng = np.random.default_rng(p)
            distinct["random"].append(np.mean([len({pool["modes"][p][i] for i in rng.permutation(M)[:k8]})
                                               for _ in range(200)]))
    return {"ks": ks, "keep": keep, "hard": [examples[p].meta["n"] % 2 == 1 for p in keep], "calls": calls,
            "passk": {o: [d[k] for k in ks] for o, d in passk.items()}, "distinct8": distinct,
            "correct": pool["correct"].tolist(), "phi": pool["phi"].tolist(), "modes": pool["modes"],
            "texts": pool["texts"]}


def inference_study(prof, seed: int = 0) -> Study:
    """Experiment 1 as a study: one arm, one seed (the pool's); its replicates are the held-out prompts."""
    return Study(name="repexp-inference", arms=(INFERENCE_ARM,), seeds=(seed,), run=run_inference_cell,
                 sizes=inference_sizes(prof), verdicts=inference_study_verdicts, modules=INFERENCE_MODULES)


def inference_output(results: Results) -> dict:
    """The chapter's dict from an :func:`inference_study`'s results (``K`` kept prompts of ``P``).

    ==============  ==============  ==========================================================
    M               int             samples per prompt
    ks              list            the k of pass@k
    prompts         int             ``P``, the held-out prompts
    kept            int             ``K``, those with a correct sample
    hard            ``(K,)`` bool   odd ``n`` (the likeliest mode wrong)
    calls           ``(K,)``        per order: verifier calls to the first correct sample
    passk           ``(K,)``        ``passk[order][k]``: pass@k of the first k picked
    distinct8       ``(K,)``        ``"random"`` and ``"elliptical"``: distinct modes in the first 8
    mode_share      dict            each mode's share of all samples (None: malformed)
    correct_share   float           the share of correct samples
    seconds         float           wall seconds of the cell
    pool            dict            :func:`sample_pool`'s dict
    examples        list            the held-out prompts (:func:`inference_examples`)
    ==============  ==============  ==========================================================
    """
    sizes, seed = results.study.sizes, results.study.seeds[0]
    m = results.metrics[(INFERENCE_ARM, seed)]
    ks = m["ks"]
    pool = {"correct": np.array(m["correct"], dtype=np.float32), "phi": torch.tensor(m["phi"], dtype=torch.float64),
            "modes": m["modes"], "texts": m["texts"]}
    return {"M": sizes["samples"], "ks": ks, "prompts": sizes["prompts"], "kept": len(m["keep"]),
            "hard": np.array(m["hard"]), "calls": {o: np.array(v) for o, v in m["calls"].items()},
            "passk": {o: {k: np.array(v) for k, v in zip(ks, rows)} for o, rows in m["passk"].items()},
            "distinct8": {o: np.array(v) for o, v in m["distinct8"].items()},
            "mode_share": _mode_share(pool), "correct_share": float(pool["correct"].mean()),
            "seconds": results.wall_seconds, "pool": pool, "examples": inference_examples(sizes, seed)}


def inference_study_verdicts(results: Results) -> dict:
    """:func:`inference_verdicts` on an :func:`inference_study`'s results."""
    return inference_verdicts(inference_output(results))


def run_inference(prof, seed: int = 0, **run_kw) -> dict:
    """Experiment 1: test-time selection on held-out prompts (the replicates, not seeds: one pool,
    sampled from ``seed``). For each prompt with at least one correct sample among ``M``: verifier calls
    to the first correct sample and pass@k of the first ``k`` picked, for the random order (exact
    expectations), the elliptical order and the planted positive control. ``hard`` marks the prompts
    whose most likely mode (``2``) is wrong (odd ``n``). :func:`inference_study` on the study runner
    (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`), as :func:`inference_output`'s dict."""
    return inference_output(run_study(inference_study(prof, seed), **run_kw))


def _mode_share(pool: dict) -> dict:
    flat = [m for row in pool["modes"] for m in row]
    return {m: flat.count(m) / len(flat) for m in sorted(set(flat), key=lambda x: (x is None, x))}


def inference_verdicts(out: dict) -> dict:
    """The test-time claims, over prompts (the paired replicates), margins fixed before the run: fewer
    verifier calls to the first correct sample (kind ``less``, margin 0) for all prompts and for the hard
    ones, each with its planted control (``control``, ``control_hard``); a higher pass@4 of the selected
    samples (``greater``, margin 0)."""
    from ..claims import Claim, evaluate
    c, h = out["calls"], out["hard"]
    setting = (f"tiny LM pre-trained on repexp_divisor (4 modes, the likeliest wrong on odd n); "
               f"{out['kept']} held-out prompts with a correct sample among M={out['M']}; features: mean "
               "last-layer hidden state of the same model, sparse projection to 16 dims, lam 0.01")
    common = dict(paper=PAPER, source="abstract", setting=setting, replicate="prompt", unit="{:.2f}")
    stmt = ("exploration with representation-based diversity improves verifier efficiency "
            "('over 50% improvement in verifier efficiency on almost all tasks' for Qwen-2.5-14b-Instruct)")
    claims = {
        "calls": Claim(key="repexp/fewer-verifier-calls", statement=stmt, paper_number=">50% (Qwen-2.5-14b)",
                       metric="verifier calls to the first correct sample", method="elliptical order",
                       baseline="random order", kind="less", control="repexp/planted-control", **common),
        "calls_hard": Claim(key="repexp/fewer-calls-hard-prompts", statement=stmt + "; gains largest on harder "
                            "questions", metric="verifier calls to the first correct sample, odd n",
                            method="elliptical order", baseline="random order", kind="less",
                            control="repexp/planted-control-hard-prompts", **common),
        "control": Claim(key="repexp/planted-control", role="positive control", statement="positive control (ours): features that separate "
                         "the modes exactly, not centred", metric="verifier calls to the first correct sample",
                         method="planted elliptical order", baseline="random order", kind="less", **common),
        "control_hard": Claim(key="repexp/planted-control-hard-prompts", role="positive control", statement="positive control (ours): "
                              "features that separate the modes exactly, not centred, on the prompts whose "
                              "likeliest mode is wrong", metric="verifier calls to the first correct sample, odd n",
                              method="planted elliptical order", baseline="random order", kind="less", **common),
        "pass4": Claim(key="repexp/selected-pass-at-4", statement="representation-based diversity consistently "
                       "improves pass@k rates", metric="pass@4 of the first 4 samples verified",
                       method="elliptical order", baseline="random order", kind="greater",
                       control="repexp/planted-control", **common),
    }
    sel = {"calls": (c["elliptical"], c["random"]), "calls_hard": (c["elliptical"][h], c["random"][h]),
           "control": (c["planted"], c["random"]), "control_hard": (c["planted"][h], c["random"][h]),
           "pass4": (out["passk"]["elliptical"][4], out["passk"]["random"][4])}
    v = {}
    for k in ("control", "control_hard", "calls", "calls_hard", "pass4"):  # the controls first
        ctrl = next((v[j] for j in v if claims[j].key == claims[k].control), None)
        v[k] = evaluate(claims[k], *sel[k], seconds=out["seconds"], control=ctrl)
    return v


RL_ARMS = ("GRPO", "GRPO+RepExp", "GRPO+RepExp (planted)")
BETA = 0.01  # the authors' GSM8K/MATH command (train_elliptical.sh ... 0.01), fixed before any run
# GRPO's budget in the book profile: 90 steps at 3e-4, the regime where plain GRPO narrows the distinct
# correct modes below the base model's (a sweep of steps {30, 90} x lr {1e-4, 3e-4} on seeds 10-12, GRPO and
# the planted arm only, after 30 steps at 1e-4 left GRPO's diversity where it started; see the chapter).
# That sweep was scored on the reported held-out prompts; a re-run on the prompts kept for choosing is
#   for steps, lr in ((30, 1e-4), (30, 3e-4), (90, 1e-4), (90, 3e-4)):
#       run_rl(P, first_seed=10, arms=("GRPO", "GRPO+RepExp (planted)"), steps=steps, lr=lr, prompts="choose")
RL_STEPS, RL_LR = 90, 3e-4


def rl_config(prof, arm: str, seed: int, steps: int | None = None, lr: float = RL_LR):
    """The trainer's config for one arm: GRPO, or GRPO with the ``repexp`` sampler (hidden or planted
    features); everything else equal."""
    from ..train import RLConfig
    kw = dict(num_generations=8, prompts_per_step=prof.pick(smoke=4, book=16),
              steps=steps or prof.pick(smoke=3, book=RL_STEPS), learning_rate=lr, max_completion_length=6,
              temperature=1.0, seed=seed, progress=False)
    if arm == "GRPO":
        return RLConfig(**kw)
    if arm not in RL_ARMS:
        raise ValueError(f"arm must be one of {RL_ARMS}, got {arm!r}")
    feats = "planted" if "planted" in arm else "hidden"
    return RLConfig(sampler="repexp", sampler_kwargs=dict(beta=BETA, features=feats), **kw)


def diversity_eval(model, tok, examples: Sequence[Example], n: int, seed: int, ks: Sequence[int]) -> dict:
    """pass@k (unbiased, from ``n`` samples a prompt), mean distinct correct modes and the sampled
    accuracy on ``examples``."""
    from ..metrics import distinct_correct, mean_pass_at_k
    pool = sample_pool(model, tok, examples, n, seed)
    correct = pool["correct"]
    return {"passk": mean_pass_at_k(correct, ks),
            "distinct": float(np.mean([distinct_correct(m, c) for m, c in zip(pool["modes"], correct)])),
            "accuracy": float(correct.mean())}


RL_BASE = "base model"  # the one arm of the base model's study
MODULES = ("rlcourse.methods.repexp", "rlcourse.train", "rlcourse.lm.sampling", "rlcourse.metrics")


def rl_eval_prompts(prof, prompt_set: str) -> list[Example]:
    """The held-out prompts the RL runs are scored on: ``"report"`` the reported ones, ``"choose"`` as
    many others kept for choosing settings (:func:`rlcourse.tasks.held_out_splits`)."""
    from ..tasks import held_out_splits
    n_prompts = prof.pick(smoke=8, book=32)
    return dict(zip(("report", "choose"), held_out_splits(Divisor(), n_prompts, n_prompts, seed=1)))[prompt_set]


def _diversity_metrics(model, tok, sizes: dict, seed: int) -> dict:
    """:func:`diversity_eval` on the study's held-out prompts, pass@k as a list in ``sizes["ks"]``'s order."""
    evals = rl_eval_prompts(Profile(**sizes["profile"]), sizes["prompts"])
    got = diversity_eval(model, tok, evals, 32, seed=seed, ks=sizes["ks"])
    return {"passk": [got["passk"][k] for k in sizes["ks"]], "distinct": got["distinct"], "accuracy": got["accuracy"]}


def run_rl_base_cell(arm: str, seed: int, sizes: dict) -> dict:
    """The base model's pass@k (``(len(ks),)``), distinct correct modes and sampled accuracy on the
    held-out prompts (its only arm is :data:`RL_BASE`; the sampling seed is fixed, so ``seed`` only
    names the cell)."""
    from ..profiles import one_torch_thread
    if arm != RL_BASE:
        raise ValueError(f"unknown arm {arm!r}; the arms are {(RL_BASE,)}")
    with one_torch_thread():
        model, tok = base_model(Profile(**sizes["profile"]))
        return _diversity_metrics(model, tok, sizes, seed=99)


def run_rl_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train the base model with arm ``arm`` of :data:`RL_ARMS` from ``seed`` (:func:`rl_config`,
    ``T`` steps) and score it on the held-out prompts, 32 samples each.

    ========  ==============  ==============================================================
    passk     ``(len(ks),)``  unbiased pass@k for each k of ``sizes["ks"]``
    distinct  scalar          mean distinct correct modes per prompt
    accuracy  scalar          sampled accuracy
    curve     ``(T,)``        training reward per step (the task's reward, without the bonus)
    ========  ==============  ==============================================================
    """
    from ..profiles import one_torch_thread
    from ..train import Trainer
    if arm not in RL_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {RL_ARMS}")
    prof = Profile(**sizes["profile"])
    with one_torch_thread():
        model, tok = base_model(prof)
        tr = Trainer(model, tok, Divisor.name, rl_config(prof, arm, seed, sizes["steps"], sizes["lr"]))
        tr.train()
        key = "repexp_task_reward" if arm != "GRPO" else "reward"
        return {**_diversity_metrics(tr.model, tok, sizes, seed=100 + seed), "curve": [m[key] for m in tr.history]}


def rl_sizes(prof, steps: int | None = None, lr: float = RL_LR, prompts: str = "report") -> dict:
    """The RL studies' sizes: the profile, the budget and the held-out prompt set."""
    if prompts not in ("report", "choose"):
        raise ValueError(f"prompts must be 'report' or 'choose', got {prompts!r}")
    return {"profile": prof.as_dict(), "steps": steps or prof.pick(smoke=3, book=RL_STEPS), "lr": lr,
            "prompts": prompts, "ks": [1, 2, 4, 8, 16, 32]}


def rl_base_study(prof, prompts: str = "report") -> Study:
    """The base model's held-out measurements: one cell."""
    return Study(name="repexp-rl-base", arms=(RL_BASE,), seeds=(0,), run=run_rl_base_cell,
                 sizes={k: v for k, v in rl_sizes(prof, prompts=prompts).items() if k not in ("steps", "lr")},
                 modules=MODULES)


def rl_study(prof, first_seed: int = 0, arms: Sequence[str] = RL_ARMS, steps: int | None = None,
             lr: float = RL_LR, prompts: str = "report") -> Study:
    """Every arm of ``arms`` (which must include ``"GRPO"``) on the seeds ``first_seed, ...,
    first_seed + prof.seeds - 1``."""
    unknown = set(arms) - set(RL_ARMS)
    if unknown or "GRPO" not in arms:
        raise ValueError(f"arms must include 'GRPO' and come from {RL_ARMS}, got {tuple(arms)}")
    sizes = rl_sizes(prof, steps, lr, prompts)
    return Study(name="repexp-rl", arms=tuple(arms), seeds=tuple(range(first_seed, first_seed + prof.seeds)),
                 run=run_rl_cell, sizes=sizes, verdicts=rl_study_verdicts, modules=MODULES)


def rl_output(results: Results, base: dict | None = None) -> dict:
    """The chapter's dict from an :func:`rl_study`'s results (``n`` seeds, ``T`` steps) and the base
    model's cell (``base``, or ``None``).

    ==========  =========  =====================================================
    passk       ``(n,)``   ``passk[arm][k]``: held-out pass@k per seed
    distinct    ``(n,)``   per arm: distinct correct modes per prompt
    accuracy    ``(n,)``   per arm: sampled held-out accuracy
    curves      ``(n,T)``  per arm: training reward per step
    base        dict       the base model's ``passk`` (``{k: float}``), ``distinct``, ``accuracy``
    seconds     float      wall seconds of the grid's cells
    ==========  =========  =====================================================
    """
    study, sz = results.study, results.study.sizes
    arms, ks = study.arms, sz["ks"]
    out = {"arms": arms, "seeds": len(study.seeds), "first_seed": study.seeds[0], "ks": ks, "beta": BETA,
           "prompt_set": sz["prompts"]}
    if base is not None:
        out["base"] = {**base, "passk": dict(zip(ks, base["passk"]))}
    out["passk"] = {a: {k: np.array([p[i] for p in results.values(a, "passk")]) for i, k in enumerate(ks)}
                    for a in arms}
    out["distinct"] = {a: np.array(results.values(a, "distinct")) for a in arms}
    out["accuracy"] = {a: np.array(results.values(a, "accuracy")) for a in arms}
    out["curves"] = {a: np.array(results.values(a, "curve")) for a in arms}
    out["steps"], out["lr"] = sz["steps"], sz["lr"]
    out["eval_prompts"] = len(rl_eval_prompts(Profile(**sz["profile"]), sz["prompts"]))
    out["seconds"] = results.wall_seconds
    return out


def rl_study_verdicts(results: Results) -> dict:
    """:func:`rl_verdicts` on an :func:`rl_study`'s results (the grid's seconds only)."""
    return rl_verdicts(rl_output(results))


def run_rl(prof, first_seed: int = 0, arms: Sequence[str] = RL_ARMS, steps: int | None = None, lr: float = RL_LR,
           prompts: str = "report", **run_kw) -> dict:
    """Experiment 2: GRPO against GRPO + beta * bonus (and the planted control) from the same base
    model, ``prof.seeds`` seeds each (from ``first_seed``; the chapter's are 0, 1, 2, and other seeds are
    for choosing settings); then pass@k (k up to 32), distinct correct modes and sampled accuracy on
    held-out prompts, 32 samples each: ``prompts="report"`` the reported ones, ``"choose"`` as many
    others kept for choosing settings (:func:`rl_eval_prompts`). :func:`rl_study` and
    :func:`rl_base_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`), as :func:`rl_output`'s dict (the base cell's seconds
    count in ``seconds``)."""
    study = rl_study(prof, first_seed, arms, steps, lr, prompts)  # checks the arms and prompts first
    base = run_study(rl_base_study(prof, prompts), **run_kw)
    out = rl_output(run_study(study, **run_kw), base.metrics[(RL_BASE, 0)])
    out["seconds"] += base.wall_seconds
    return out


def rl_verdicts(out: dict) -> dict:
    """The post-training claims over seeds (margins fixed before the run): pass@32 and distinct
    correct modes higher with the bonus (``greater``, margin 0); pass@1 within 0.05 of GRPO's
    (``equivalent``: the bonus should not cost accuracy); the planted control's distinct modes
    above GRPO's."""
    from ..claims import Claim, evaluate
    setting = (f"tiny LM on repexp_divisor, GRPO {out['steps']} steps x 16 prompts x 8 samples, beta "
               f"{out['beta']}, lam 0.01, 16-dim sparse projection of the frozen base model's mean hidden "
               f"states; {out['eval_prompts']} held-out prompts x 32 samples")
    common = dict(paper=PAPER, source="abstract", setting=setting, baseline="GRPO")
    stmt = ("integrating this exploration strategy into an RL pipeline improves reasoning performance over "
            "that of the initial model and over standard RL post-training (AIME 2024: RepExp's pass@80 "
            "matches GRPO's pass@256)")
    claims = {
        "pass32": Claim(key="repexp/rl-pass-at-32", statement=stmt, paper_number="pass@80 = GRPO's pass@256",
                        metric="held-out pass@32 (unbiased, 32 samples)", method="GRPO+RepExp",
                        control="repexp/rl-planted-control", **common),
        "pass1": Claim(key="repexp/rl-pass-at-1", statement="similar pass@1 (our expectation, not the abstract's: no "
                       "accuracy cost)", metric="held-out pass@1", method="GRPO+RepExp", kind="equivalent",
                       margin=0.05, role="course hypothesis", **common),
        "distinct": Claim(key="repexp/rl-distinct-correct", statement="exploration with a representation-based "
                          "bonus significantly improves diversity", metric="distinct correct modes per prompt "
                          "(of 32 samples)", method="GRPO+RepExp", control="repexp/rl-planted-control", **common),
        "control": Claim(key="repexp/rl-planted-control", role="positive control", statement="positive control (ours): the bonus on "
                         "features that separate the modes exactly", metric="distinct correct modes per prompt",
                         method="GRPO+RepExp (planted)", **common),
    }
    sel = {"control": ("distinct", None, "GRPO+RepExp (planted)"), "pass32": ("passk", 32, "GRPO+RepExp"),
           "pass1": ("passk", 1, "GRPO+RepExp"), "distinct": ("distinct", None, "GRPO+RepExp")}
    v = {}
    for name, (what, k, arm) in sel.items():  # the control first: two claims rest on it
        if arm not in out[what]:
            continue
        get = (lambda a: out[what][a][k]) if k is not None else (lambda a: out[what][a])
        ctrl = v.get("control") if claims[name].control else None
        if claims[name].control and ctrl is None:
            continue
        v[name] = evaluate(claims[name], get(arm), get("GRPO"), seconds=out["seconds"], control=ctrl)
    return v
