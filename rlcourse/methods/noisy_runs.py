"""The noisy-verifier chapter's runs and claims: the contextual bandit's trainer (many seeds, per-sample
and group-rollout noise, Adam and SGD; its study is :mod:`rlcourse.studies.noisy_verifiers`) and GRPO on
the tiny addition model (the same noise structures, late-window accuracy), with the claims of
:data:`CLAIMS` and the language model's verdicts.

Course material for *An Imperfect Verifier is Good Enough: Learning with Noisy Rewards*, Plesner,
Guzman and Athalye (2026), arXiv:2604.07666. The measure follows the later abstract's protocol: the
mean of two fixed late evaluations of validation reward (accuracy), compared with the clean run of the
same seed.
"""
from __future__ import annotations

import copy
import os
import time

import numpy as np

from ..claims import Claim, Verdict, evaluate
from ..profiles import one_torch_thread
from .noisy import corrupt_rewards, group_advantages, make_noisy_reward, noise_generator

PAPER = ("An Imperfect Verifier is Good Enough: Learning with Noisy Rewards, Plesner, Guzman, Athalye, 2026, "
         "arXiv:2604.07666")
V1 = "abstract, first version (arXiv:2604.07666v1)"
V2 = "abstract, later version (arXiv:2604.07666, as revised)"
_STATED_20 = ("In multi-seed Qwen3 8B experiments on MBPP, mean validation reward over two fixed late evaluations "
              "is within 1 percentage point of the clean baseline at the tested resampled group-rollout noise "
              "rates through 20%")
_STATED_30 = "... and within about 2 points at 30%"


# ---------------------------------------------------------------------------- the bandit
def bandit_init(n_prompts: int, n_answers: int, seed: int) -> np.ndarray:
    """Initial logits of a tabular softmax policy over a contextual bandit, ``(n_prompts, n_answers)``.

    Answer 0 of every prompt is the correct one and answer 1 a "plausible wrong" one (+1 logit). The
    correct answer's offset is spread uniformly over [-1.5, 1.5], so prompts range from hard
    (p(correct) about 0.015) to moderate (about 0.35): a weak base model with a spread of difficulty.
    """
    if n_prompts < 1 or n_answers < 3:
        raise ValueError(f"need n_prompts >= 1 and n_answers >= 3, got {n_prompts}, {n_answers}")
    rng = np.random.default_rng(np.random.SeedSequence([2604, int(seed)]))
    logits = rng.normal(0.0, 0.3, (n_prompts, n_answers))
    logits[:, 0] += np.linspace(-1.5, 1.5, n_prompts)[rng.permutation(n_prompts)]
    logits[:, 1] += 1.0
    return logits


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def train_noisy_bandit(rho0: float, rho1: float, mode: str, optimizer: str, lr: float, steps: int,
                       seeds: list[int], n_prompts: int = 50, n_answers: int = 10, batch: int = 8, G: int = 8,
                       eval_every: int = 25) -> dict:
    """GRPO on the contextual bandit with a noisy verifier, vectorised over seeds.

    Each step draws ``batch`` prompts and ``G`` answers per prompt, corrupts the true rewards with
    :func:`~rlcourse.methods.noisy.corrupt_rewards` (``mode`` ``"sample"`` or ``"group"``), computes GRPO
    advantages and takes one step of the surrogate ``-mean(A * log pi(a | x))`` with Adam (betas 0.9,
    0.999) or plain SGD. A seed fixes the initial logits, the prompts, the sampling uniforms and the
    noise draws, so the runs of one seed under different verifiers are paired (common random numbers).

    ========== ============== ==========================================================
    return     dict
    curve      ``(N, E)``     expected accuracy (validation reward at temperature 1, exact:
                              the mean over prompts of pi(correct | x)) at ``eval_steps``
    eval_steps ``(E,)``       the steps at which ``curve`` was measured (0 included)
    greedy     ``(N,)``       final greedy accuracy (argmax is the correct answer)
    ========== ============== ==========================================================
    """
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    if steps < 1 or eval_every < 1 or G < 2 or batch < 1:
        raise ValueError(f"need steps, eval_every, batch >= 1 and G >= 2; got {steps}, {eval_every}, {batch}, {G}")
    N = len(seeds)
    theta = np.stack([bandit_init(n_prompts, n_answers, s) for s in seeds])  # (N, P, K)
    m, v = np.zeros_like(theta), np.zeros_like(theta)
    rngs = [np.random.default_rng(np.random.SeedSequence([7, int(s)])) for s in seeds]
    eval_steps, curve = [0], [_softmax(theta)[..., 0].mean(-1)]
    rows = np.arange(N)[:, None]
    for t in range(1, steps + 1):
        prompts = np.stack([r.integers(0, n_prompts, batch) for r in rngs])  # (N, B)
        u = np.stack([r.random((batch, G)) for r in rngs])  # (N, B, G) sampling uniforms
        pi = _softmax(theta[rows, prompts])  # (N, B, K)
        answers = (u[..., None] > np.cumsum(pi, -1)[:, :, None, :]).sum(-1).clip(max=n_answers - 1)
        r_true = (answers == 0).astype(np.float64).reshape(-1)
        index = np.repeat(np.arange(N * batch), G)
        # one noise stream per seed and step, so arms of a seed share their draws
        r_obs = np.concatenate([corrupt_rewards(r_true[i * batch * G:(i + 1) * batch * G],
                                                index[i * batch * G:(i + 1) * batch * G], rho0, rho1, mode,
                                                noise_generator(int(s), t)) for i, s in enumerate(seeds)])
        A = group_advantages(r_obs.reshape(N, batch, G))  # (N, B, G)
        onehot = np.eye(n_answers)[answers]  # (N, B, G, K)
        g_rows = -(A[..., None] * (onehot - pi[:, :, None, :])).sum(2) / (batch * G)  # (N, B, K)
        grad = np.zeros_like(theta)
        np.add.at(grad, (np.repeat(rows, batch, 1), prompts), g_rows)
        if optimizer == "sgd":
            theta -= lr * grad
        else:
            m = 0.9 * m + 0.1 * grad
            v = 0.999 * v + 0.001 * grad ** 2
            theta -= lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
        if t % eval_every == 0 or t == steps:
            eval_steps.append(t)
            curve.append(_softmax(theta)[..., 0].mean(-1))
    return {"curve": np.stack(curve, 1), "eval_steps": np.array(eval_steps),
            "greedy": (theta.argmax(-1) == 0).mean(-1)}


# ---------------------------------------------------------------------------- the tiny LM
def _lm_run(job: dict) -> dict:
    """One GRPO run of the tiny addition model with a noisy verifier, evaluated at ``job["evals"]``
    (a top-level function, so worker processes can run it)."""
    from ..lm import load_base_model
    from ..profiles import profile
    from ..tasks import get_task
    from ..train import RLConfig, Trainer

    with one_torch_thread():
        t0 = time.perf_counter()
        prof = profile(job["profile"])
        model, tok = load_base_model(job["task"], job["strength"], prof=prof, progress=False)
        eval_examples = get_task(job["task"]).examples(job["eval_prompts"], seed=job["eval_seed"], split="test")
        reward = make_noisy_reward(job["rho0"], job["rho1"], job["mode"], seed=job["seed"])
        cfg = RLConfig(num_generations=job["G"], prompts_per_step=job["prompts"], steps=max(job["evals"]),
                       learning_rate=job["lr"], max_completion_length=job["max_len"], seed=job["seed"],
                       reward=reward, advantage_estimator="grpo", progress=False)
        trainer = Trainer(copy.deepcopy(model), tok, job["task"], cfg, eval_examples=eval_examples)
        curve = []
        for s in job["evals"]:
            trainer.train(steps=s)
            curve.append(trainer.evaluate())
        log = trainer.state["noisy_verifier"]
        gn = np.array([h["grad_norm"] for h in trainer.history if "grad_norm" in h], dtype=float)
        return {"curve": curve, "true_reward": list(log["true_reward"]), "error_rate": list(log["error_rate"]),
                "grad_norm": gn.tolist(), "seconds": time.perf_counter() - t0}


LM_ARMS = {  # name: (rho0, rho1, mode)
    "clean": (0.0, 0.0, "sample"),
    "group 0.2": (0.2, 0.2, "group"),
    "group 0.3": (0.3, 0.3, "group"),
    "sample 0.2": (0.2, 0.2, "sample"),
    "sample 0.3": (0.3, 0.3, "sample"),
    "sample 0.45": (0.45, 0.45, "sample"),
}


def run_noisy_lm(prof) -> dict:
    """GRPO on the tiny addition model (medium base) against the verifiers of :data:`LM_ARMS`, over
    ``prof.seeds`` paired seeds (a seed fixes the prompts, the sampling and the noise draws).

    ============ =========================== =================================================
    curve        dict[arm] ``(N, E)``         held-out greedy accuracy at ``evals`` steps
    late         dict[arm] ``(N,)``           mean of the two fixed late evaluations
    true_reward  dict[arm] ``(N, steps)``     true mean reward of the training samples per step
    clipped      dict[arm] ``(N,)``           fraction of steps whose gradient norm was clipped
    ============ =========================== =================================================
    """
    from ..lm import load_base_model
    from ..lm.zoo import greedy_accuracy
    from ..tasks import get_task

    seeds = list(range(prof.seeds))
    steps = prof.pick(smoke=4, book=160)
    evals = [steps // 4, steps // 2, 3 * steps // 4, steps]
    base = dict(profile=prof.name, task="addition", strength="medium", evals=evals, G=prof.num_generations,
                prompts=prof.rl_prompts, lr=1e-4, max_len=10, eval_prompts=prof.eval_prompts, eval_seed=1234)
    t0 = time.perf_counter()
    with one_torch_thread():  # build (or load) the base model once, before any worker needs it
        model, tok = load_base_model("addition", "medium", prof=prof, progress=False)
        ex = get_task("addition").examples(base["eval_prompts"], seed=base["eval_seed"], split="test")
        base_acc = greedy_accuracy(model, tok, "addition", ex, max_new_tokens=base["max_len"])
    jobs = {(arm, s): dict(base, rho0=r0, rho1=r1, mode=mode, seed=s)
            for arm, (r0, r1, mode) in LM_ARMS.items() for s in seeds}
    keys = list(jobs)
    workers = prof.pick(smoke=1, book=min(2, os.cpu_count() or 1), full=os.cpu_count() or 1)
    if workers > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            results = dict(zip(keys, pool.map(_lm_run, [jobs[k] for k in keys])))
    else:
        results = {k: _lm_run(jobs[k]) for k in keys}
    arms = list(LM_ARMS)
    curve = {a: np.array([results[(a, s)]["curve"] for s in seeds]) for a in arms}
    return {"arms": arms, "seeds": seeds, "steps": steps, "evals": evals, "late_steps": (evals[2], evals[3]),
            "base_accuracy": float(base_acc), "curve": curve,
            "late": {a: curve[a][:, 2:].mean(1) for a in arms},
            "true_reward": {a: np.array([results[(a, s)]["true_reward"] for s in seeds]) for a in arms},
            "error_rate": {a: np.array([np.mean(results[(a, s)]["error_rate"]) for s in seeds]) for a in arms},
            "clipped": {a: np.array([np.mean(np.array(results[(a, s)]["grad_norm"]) > 1.0) for s in seeds])
                        for a in arms},
            "prompts_per_step": base["prompts"], "G": base["G"], "lr": base["lr"], "workers": workers,
            "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------------------- claims
_BANDIT = ("contextual bandit, 50 prompts x 10 answers, tabular softmax, GRPO with 8 prompts x G = 8 per step, "
           "Adam lr 0.1 (chosen on clean runs of seeds 100-109), symmetric rates; score = mean of the expected "
           "accuracy at two fixed late steps")
_LM = ("tiny addition model (medium base), GRPO 16 prompts x G = 8, AdamW lr 1e-4, 160 steps; score = mean "
       "held-out greedy accuracy at steps 120 and 160")
CLAIMS = {
    "bandit-group-20": Claim(
        key="noisy_verifiers/bandit-group-20", paper=PAPER, statement=_STATED_20, source=V2, paper_number="within 1 point",
        setting=_BANDIT + "; group-rollout noise 20%", metric="late-window expected accuracy",
        method="group noise 20%", baseline="clean", kind="equivalent", margin=0.01,
        control="noisy_verifiers/bandit-control"),
    "bandit-sample-20": Claim(
        key="noisy_verifiers/bandit-sample-20", paper=PAPER,
        statement=_STATED_20 + " [the paper's number is for group-rollout noise; here applied to per-sample noise, "
                               "the other reading of 'resampled group-rollout noise']",
        source=V2, paper_number="within 1 point", setting=_BANDIT + "; per-sample noise 20%",
        metric="late-window expected accuracy", method="per-sample noise 20%", baseline="clean", kind="equivalent",
        margin=0.01, control="noisy_verifiers/bandit-control"),
    "bandit-group-30": Claim(
        key="noisy_verifiers/bandit-group-30", paper=PAPER, statement=_STATED_30, source=V2,
        paper_number="within about 2 points", setting=_BANDIT + "; group-rollout noise 30%",
        metric="late-window expected accuracy", method="group noise 30%", baseline="clean", kind="equivalent",
        margin=0.02, control="noisy_verifiers/bandit-control"),
    "bandit-sample-30": Claim(
        key="noisy_verifiers/bandit-sample-30", paper=PAPER,
        statement=_STATED_30 + " [the paper's number is for group-rollout noise; here applied to per-sample noise]",
        source=V2, paper_number="within about 2 points", setting=_BANDIT + "; per-sample noise 30%",
        metric="late-window expected accuracy", method="per-sample noise 30%", baseline="clean", kind="equivalent",
        margin=0.02, control="noisy_verifiers/bandit-control"),
    "bandit-control": Claim(
        key="noisy_verifiers/bandit-control", role="positive control", paper=PAPER,
        statement="(positive control, not a claim of the paper) a verifier at 40% symmetric per-sample noise "
                  "(J = 0.2) costs more than 2 points of late-window accuracy",
        source="course control", setting=_BANDIT + "; per-sample noise 40%", metric="late-window expected accuracy",
        method="clean", baseline="per-sample noise 40%", kind="greater", margin=0.02),
    "bandit-precision": Claim(
        key="noisy_verifiers/bandit-precision", paper=PAPER,
        statement="a verifier with moderate accuracy but high precision is preferable (few false positives)",
        source=V1 + "; the later version warns against reading its asymmetric sweep as precision vs recall",
        setting=_BANDIT + "; per-sample noise, strict (rho0 = 0, rho1 = 0.4) vs lenient (rho0 = 0.4, rho1 = 0), "
                          "both J = 0.6", metric="late-window expected accuracy",
        method="strict (high precision)", baseline="lenient (low precision)", kind="greater", margin=0.01,
        control="noisy_verifiers/bandit-control"),
    "adam": Claim(
        key="noisy_verifiers/adam-amplifies-noise", paper=PAPER, role="course hypothesis",
        statement="(the course's hypothesis, not the paper's) Adam, which normalises its step size, turns a "
                  "gradient that is mostly noise into full-size steps, so it loses more accuracy to high noise "
                  "than SGD",
        source="course hypothesis", setting=_BANDIT.replace("Adam lr 0.1", "Adam lr 0.1 vs SGD lr 10")
        + "; loss = clean minus per-sample noise 40%, each optimiser against its own clean run",
        metric="late-window accuracy lost to 40% noise", method="Adam", baseline="SGD", kind="greater",
        margin=0.01),
    "lm-group-20": Claim(
        key="noisy_verifiers/lm-group-20", paper=PAPER, statement=_STATED_20, source=V2, paper_number="within 1 point",
        setting=_LM + "; group-rollout noise 20%", metric="late-window held-out greedy accuracy",
        method="group noise 20%", baseline="clean", kind="equivalent", margin=0.01,
        control="noisy_verifiers/lm-control"),
    "lm-group-30": Claim(
        key="noisy_verifiers/lm-group-30", paper=PAPER, statement=_STATED_30, source=V2,
        paper_number="within about 2 points", setting=_LM + "; group-rollout noise 30%",
        metric="late-window held-out greedy accuracy", method="group noise 30%", baseline="clean",
        kind="equivalent", margin=0.02, control="noisy_verifiers/lm-control"),
    "lm-sample-20": Claim(
        key="noisy_verifiers/lm-sample-20", paper=PAPER,
        statement=_STATED_20 + " [the paper's number is for group-rollout noise; here applied to per-sample noise]",
        source=V2, paper_number="within 1 point", setting=_LM + "; per-sample noise 20%",
        metric="late-window held-out greedy accuracy", method="per-sample noise 20%", baseline="clean",
        kind="equivalent", margin=0.01, control="noisy_verifiers/lm-control"),
    "lm-sample-30": Claim(
        key="noisy_verifiers/lm-sample-30", paper=PAPER,
        statement=_STATED_30 + " [the paper's number is for group-rollout noise; here applied to per-sample noise]",
        source=V2, paper_number="within about 2 points", setting=_LM + "; per-sample noise 30%",
        metric="late-window held-out greedy accuracy", method="per-sample noise 30%", baseline="clean",
        kind="equivalent", margin=0.02, control="noisy_verifiers/lm-control"),
    "lm-control": Claim(
        key="noisy_verifiers/lm-control", role="positive control", paper=PAPER,
        statement="(positive control, not a claim of the paper) a verifier at 45% symmetric per-sample noise "
                  "(J = 0.1) costs more than 2 points of late-window accuracy",
        source="course control", setting=_LM + "; per-sample noise 45%", metric="late-window held-out greedy accuracy",
        method="clean", baseline="per-sample noise 45%", kind="greater", margin=0.02),
    "lm-below-base": Claim(
        key="noisy_verifiers/lm-below-base", paper=PAPER, role="course hypothesis",
        statement="(the course's question, not the paper's) at 30% group-rollout noise the tiny model ends below "
                  "the base model it started from", source="course question", setting=_LM + "; group-rollout noise 30%",
        metric="late-window held-out greedy accuracy", method="base model", baseline="group noise 30%",
        kind="greater", margin=0.0),
}


def lm_verdicts(r: dict) -> dict[str, Verdict]:
    """The language-model claims of :data:`CLAIMS`, evaluated on :func:`run_noisy_lm`'s output."""
    L, s = r["late"], r["seconds"]
    base = np.full(len(r["seeds"]), r["base_accuracy"])
    ctl = evaluate(CLAIMS["lm-control"], L["clean"], L["sample 0.45"], seconds=s)
    return {
        "lm-group-20": evaluate(CLAIMS["lm-group-20"], L["group 0.2"], L["clean"], seconds=s, control=ctl),
        "lm-group-30": evaluate(CLAIMS["lm-group-30"], L["group 0.3"], L["clean"], seconds=s, control=ctl),
        "lm-sample-20": evaluate(CLAIMS["lm-sample-20"], L["sample 0.2"], L["clean"], seconds=s, control=ctl),
        "lm-sample-30": evaluate(CLAIMS["lm-sample-30"], L["sample 0.3"], L["clean"], seconds=s, control=ctl),
        "lm-control": ctl,
        "lm-below-base": evaluate(CLAIMS["lm-below-base"], base, L["group 0.3"], seconds=s),
    }
