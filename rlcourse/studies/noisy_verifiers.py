"""The noisy-verifier chapter's experiments and claims: GRPO on a contextual bandit
(:func:`train_noisy_bandit`) and on the tiny addition model, under verifiers with per-sample and
group-rollout noise, each scored by the mean of two fixed late evaluations (:func:`late_window`),
compared with the clean run of the same seed.

Course material for *An Imperfect Verifier is Good Enough: Learning with Noisy Rewards*, Plesner,
Guzman and Athalye (2026), arXiv:2604.07666. The measure follows the later abstract's protocol.

Three grids on the runner. First the bandit's learning-rate rule (:func:`choose_bandit_lrs`): the
*clean* verifier at each rate of :data:`LR_GRIDS`, on selection seeds disjoint from the reported ones
(:data:`SELECTION_SEEDS` upward). Then the reported bandit grid (:func:`noisy_bandit_study`): every
verifier of :data:`ARMS` on the seeds 0, 1, ... at the chosen rates, with Adam and SGD, each run to a
plateau. Last the language model (:func:`lm_study`): every verifier of :data:`LM_ARMS` on the
profile's seeds. A cell is one verifier on one seed; a seed fixes the initial policy, the prompts,
the sampling and the noise draws, so the cells of one seed differ only in the verifier (common random
numbers). :data:`CLAIMS` holds the claims, :func:`bandit_verdicts` and :func:`lm_verdicts` their verdicts.
"""
from __future__ import annotations

import copy
import time

import numpy as np

from ..claims import Claim, Verdict, evaluate
from ..methods.noisy import corrupt_rewards, group_advantages, make_noisy_reward, noise_generator
from ..profiles import Profile, one_torch_thread
from .runner import Results, Study, default_jobs, run_study

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


RATES = (0.0, 0.1, 0.2, 0.3, 0.4)
LR_GRIDS = {"adam": (0.02, 0.05, 0.1), "sgd": (1.0, 3.0, 10.0)}  # the rates the rule chooses from
SELECTION_SEEDS = 100  # the rule runs on seeds 100, 101, ...; the reported runs use 0, 1, ...
MODULES = ("rlcourse.methods.noisy",)


def _arms() -> dict[str, tuple[str, str, float, float, float]]:
    verifiers = [("adam", mode, rho, rho, rho) for mode in ("sample", "group") for rho in RATES
                 if not (mode == "group" and rho == 0.0)]  # the clean run is shared by both modes
    verifiers += [("adam", "strict", 0.4, 0.0, 0.4), ("adam", "lenient", 0.4, 0.4, 0.0)]
    verifiers += [("sgd", "sample", rho, rho, rho) for rho in (0.0, 0.2, 0.4)]
    return {f"{opt} {structure} {rho}": (opt, structure, rho, r0, r1) for opt, structure, rho, r0, r1 in verifiers}


ARMS = _arms()
"""The bandit's arms, ``"<optimizer> <structure> <rho>"`` -> ``(optimizer, structure, rho, rho0, rho1)``:
Adam under symmetric per-sample and group noise at every rate of :data:`RATES`, strict (false negatives
only) and lenient (false positives only) verifiers at 0.4, and SGD under per-sample noise at 0, 0.2 and
0.4 (for the Adam question)."""


def late_window(curve: np.ndarray, eval_steps: np.ndarray, late: tuple[int, int]) -> np.ndarray:
    """Mean of the two fixed late evaluations ``late`` (steps) of each seed's curve, ``(N,)``."""
    cols = [int(np.flatnonzero(eval_steps == s)[0]) if np.any(eval_steps == s) else None for s in late]
    if None in cols:
        raise ValueError(f"late evaluation steps {late} are not among the evaluation steps {eval_steps.tolist()}")
    return curve[:, cols].mean(1)


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """One verifier of :data:`ARMS` on one seed at its optimiser's rate ``sizes["lrs"][optimizer]``.

    ========== ======== =======================================================
    curve      ``(E,)`` expected accuracy at ``eval_steps``
    eval_steps ``(E,)`` the evaluation steps (0 included)
    late       float    mean of the two late evaluations ``sizes["late"]``
    greedy     float    final greedy accuracy
    ========== ======== =======================================================
    """
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(ARMS)}")
    opt, structure, _, rho0, rho1 = ARMS[arm]
    mode = "group" if structure == "group" else "sample"
    out = train_noisy_bandit(rho0, rho1, mode, opt, sizes["lrs"][opt], sizes["steps"], [seed],
                             eval_every=sizes["every"])
    return {"curve": out["curve"][0].tolist(), "eval_steps": out["eval_steps"].tolist(),
            "late": float(late_window(out["curve"], out["eval_steps"], tuple(sizes["late"]))[0]),
            "greedy": float(out["greedy"][0])}


def _schedule(P: Profile) -> dict:
    """Steps, evaluation interval and the two late evaluations of the profile."""
    steps = P.pick(smoke=100, book=2000)
    return {"steps": steps, "every": P.pick(smoke=25, book=100), "late": [P.pick(smoke=75, book=1500), steps]}


def noisy_bandit_study(P: Profile, lrs: dict) -> Study:
    """Every verifier of :data:`ARMS` on the profile's seeds (at least 20 in the book), at the rates
    ``lrs`` (optimizer -> learning rate, from :func:`choose_bandit_lrs`)."""
    missing = {opt for opt, *_ in ARMS.values()} - set(lrs)
    if missing:
        raise ValueError(f"lrs has no learning rate for {sorted(missing)}; got {lrs!r}")
    seeds = tuple(range(P.pick(smoke=P.toy_seeds, book=max(20, P.toy_seeds))))
    sizes = {**_schedule(P), "lrs": {k: float(v) for k, v in lrs.items()}}
    return Study(name="noisy_verifiers", arms=tuple(ARMS), seeds=seeds, run=run_cell, sizes=sizes,
                 verdicts=study_verdicts, modules=MODULES)


# ---------------------------------------------------------------------------- the learning-rate rule
def lr_arm(opt: str, lr: float) -> str:
    """The learning-rate study's arm for optimiser ``opt`` at rate ``lr``, e.g. ``"adam lr=0.1"``."""
    return f"{opt} lr={float(lr)!r}"


def run_lr_cell(arm: str, seed: int, sizes: dict) -> dict:
    """The clean verifier with one optimiser at one rate on one selection seed: ``quarter``, the
    expected accuracy after a quarter of the steps."""
    arms = tuple(lr_arm(o, x) for o, grid in sizes["grids"].items() for x in grid)
    if arm not in arms:
        raise ValueError(f"unknown arm {arm!r}; the arms are {arms}")
    opt, _, lr = arm.partition(" lr=")
    steps = sizes["steps"]
    out = train_noisy_bandit(0.0, 0.0, "sample", opt, float(lr), steps, [seed], eval_every=sizes["every"])
    return {"quarter": float(out["curve"][0, np.searchsorted(out["eval_steps"], steps // 4)])}


def choose_bandit_lrs(prof: Profile, grids=None, **run_kw) -> dict:
    """The rule that fixes each optimiser's learning rate before the reported bandit runs.

    On selection seeds ``100, 101, ...`` (10 in the book profile, disjoint from the reported seeds
    0-19), run the *clean* verifier only (no noisy arm is looked at) at each rate of the optimiser's grid
    for the experiment's number of steps, and take the rate whose seed-mean expected accuracy after a
    quarter of the steps is highest: the one that reaches its plateau soonest. ``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`.

    ======== ============================ ============================================
    key      shape                        meaning
    ======== ============================ ============================================
    lrs      dict                         optimiser -> chosen rate
    quarter  dict                         optimiser -> ``(len(grid),)`` accuracy after a quarter
    seeds    list                         the selection seeds
    grids    dict                         optimiser -> the rates tried
    ======== ============================ ============================================
    """
    grids = {k: tuple(v) for k, v in (LR_GRIDS if grids is None else grids).items()}
    for opt, grid in grids.items():
        if not grid:
            raise ValueError(f"the grid of {opt!r} is empty")
    seeds = list(range(SELECTION_SEEDS, SELECTION_SEEDS + prof.pick(smoke=1, book=10)))
    sched = _schedule(prof)
    study = Study(name="noisy_verifiers-lr", arms=tuple(lr_arm(o, lr) for o, grid in grids.items() for lr in grid),
                  seeds=tuple(seeds), run=run_lr_cell, modules=MODULES,
                  sizes={"steps": sched["steps"], "every": sched["every"], "grids": grids})
    res = run_study(study, **run_kw)
    lrs, quarter = {}, {}
    for opt, grid in grids.items():
        q = [float(np.mean(res.values(lr_arm(opt, lr), "quarter"))) for lr in grid]
        quarter[opt], lrs[opt] = np.array(q), float(grid[int(np.argmax(q))])
    return {"lrs": lrs, "quarter": quarter, "seeds": seeds, "grids": grids}


# ---------------------------------------------------------------------------- the bandit experiment
def summarise(results: Results) -> dict:
    """``late_acc``, ``curves`` and ``greedy`` keyed by ``(optimizer, structure, rho)`` (per-seed
    ``(N,)`` and ``(N, E)`` arrays; the clean run also under ``"group"``), ``eval_steps`` and ``seconds``
    (the grid's wall seconds), from a :func:`noisy_bandit_study`'s results."""
    late_acc, curves, greedy = {}, {}, {}
    for arm, (opt, structure, rho, _, _) in ARMS.items():
        late_acc[(opt, structure, rho)] = np.asarray(results.values(arm, "late"))
        curves[(opt, structure, rho)] = np.asarray(results.values(arm, "curve"))
        greedy[(opt, structure, rho)] = np.asarray(results.values(arm, "greedy"))
    for opt in {opt for opt, *_ in ARMS.values()}:
        for d in (late_acc, curves, greedy):
            d[(opt, "group", 0.0)] = d[(opt, "sample", 0.0)]
    first = (results.study.arms[0], results.study.seeds[0])
    return {"late_acc": late_acc, "curves": curves, "greedy": greedy,
            "eval_steps": np.asarray(results.metrics[first]["eval_steps"]), "seconds": results.wall_seconds}


def run_noisy_bandit(prof: Profile, **run_kw) -> dict:
    """The bandit sweep of :data:`ARMS` over ``seeds`` paired seeds, each run to a plateau, on the study
    runner (cached per cell; ``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`); the score is
    the mean of two fixed late evaluations. The clean run (rho = 0) is shared by both modes.

    ============ ============================== ==============================================
    late_acc     dict[(opt, structure, rho)]    ``(N,)`` late-window expected accuracy per seed
    curves       dict[(opt, structure, rho)]    ``(N, E)`` expected-accuracy curves
    eval_steps   ``(E,)``                       the evaluation steps
    ============ ============================== ==============================================
    """
    t0 = time.perf_counter()
    choice = choose_bandit_lrs(prof, **run_kw)
    study = noisy_bandit_study(prof, choice["lrs"])
    out = summarise(run_study(study, **run_kw))
    seeds = list(study.seeds)
    return {"seeds": seeds, "steps": study.sizes["steps"], "late": tuple(study.sizes["late"]), "rates": list(RATES),
            "lrs": choice["lrs"], "lr_choice": choice, **out,
            "base": float(np.mean([_softmax(bandit_init(50, 10, s))[:, 0].mean() for s in seeds])),
            "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------------------- the tiny LM
LM_ARMS = {  # name: (rho0, rho1, mode)
    "clean": (0.0, 0.0, "sample"),
    "group 0.2": (0.2, 0.2, "group"),
    "group 0.3": (0.3, 0.3, "group"),
    "sample 0.2": (0.2, 0.2, "sample"),
    "sample 0.3": (0.3, 0.3, "sample"),
    "sample 0.45": (0.45, 0.45, "sample"),
}
LM_MODULES = (*MODULES, "rlcourse.train", "rlcourse.lm.engine", "rlcourse.lm.sampling", "rlcourse.lm.zoo")


def run_lm_cell(arm: str, seed: int, sizes: dict) -> dict:
    """One GRPO run of the tiny addition model against verifier ``arm`` of :data:`LM_ARMS` from ``seed``,
    evaluated after each number of steps of ``sizes["evals"]`` (``E`` evaluations, ``S`` steps).

    =========== ======== ==========================================================
    curve       ``(E,)`` held-out greedy accuracy at ``evals`` steps
    true_reward ``(S,)`` true mean reward of the training samples per step
    error_rate  ``(S,)`` the verifier's realised error rate per step
    grad_norm   ``(S,)`` gradient norm per step (before clipping)
    =========== ======== ==========================================================
    """
    from ..lm import load_base_model
    from ..tasks import get_task
    from ..train import RLConfig, Trainer

    if arm not in LM_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(LM_ARMS)}")
    rho0, rho1, mode = LM_ARMS[arm]
    sz = sizes
    with one_torch_thread():
        model, tok = load_base_model(sz["task"], sz["strength"], prof=Profile(**sz["profile"]), progress=False)
        eval_examples = get_task(sz["task"]).examples(sz["eval_prompts"], seed=sz["eval_seed"], split="test")
        reward = make_noisy_reward(rho0, rho1, mode, seed=seed)
        cfg = RLConfig(num_generations=sz["G"], prompts_per_step=sz["prompts"], steps=max(sz["evals"]),
                       learning_rate=sz["lr"], max_completion_length=sz["max_len"], seed=seed,
                       reward=reward, advantage_estimator="grpo", progress=False)
        trainer = Trainer(copy.deepcopy(model), tok, sz["task"], cfg, eval_examples=eval_examples)
        curve = []
        for s in sz["evals"]:
            trainer.train(steps=s)
            curve.append(trainer.evaluate())
        log = trainer.state["noisy_verifier"]
        gn = np.array([h["grad_norm"] for h in trainer.history if "grad_norm" in h], dtype=float)
        return {"curve": curve, "true_reward": list(log["true_reward"]), "error_rate": list(log["error_rate"]),
                "grad_norm": gn.tolist()}


def lm_study(prof: Profile) -> Study:
    """Every verifier of :data:`LM_ARMS` on seeds ``0 .. prof.seeds - 1``: GRPO from the medium addition
    base model, evaluated at a quarter, half, three quarters and all of the steps."""
    steps = prof.pick(smoke=4, book=160)
    sizes = dict(profile=prof.as_dict(), task="addition", strength="medium",
                 evals=[steps // 4, steps // 2, 3 * steps // 4, steps], G=prof.num_generations,
                 prompts=prof.rl_prompts, lr=1e-4, max_len=10, eval_prompts=prof.eval_prompts, eval_seed=1234)
    return Study(name="noisy_verifiers-lm", arms=tuple(LM_ARMS), seeds=tuple(range(prof.seeds)), run=run_lm_cell,
                 sizes=sizes, modules=LM_MODULES)


def run_noisy_lm(prof: Profile, **run_kw) -> dict:
    """GRPO on the tiny addition model (medium base) against the verifiers of :data:`LM_ARMS`, over
    ``prof.seeds`` paired seeds: :func:`lm_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`, whose ``jobs`` defaults to ``$RLCOURSE_JOBS``).

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

    study = lm_study(prof)
    sz, seeds, arms = study.sizes, list(study.seeds), list(study.arms)
    t0 = time.perf_counter()
    with one_torch_thread():  # build (or load) the base model once, before any worker needs it
        model, tok = load_base_model(sz["task"], sz["strength"], prof=prof, progress=False)
        ex = get_task(sz["task"]).examples(sz["eval_prompts"], seed=sz["eval_seed"], split="test")
        base_acc = greedy_accuracy(model, tok, sz["task"], ex, max_new_tokens=sz["max_len"])
    base_seconds = time.perf_counter() - t0
    jobs = run_kw.pop("jobs", None) or default_jobs()
    res = run_study(study, jobs=jobs, **run_kw)

    def per_seed(a, metric):
        return np.array(res.values(a, metric))

    evals = list(sz["evals"])
    curve = {a: per_seed(a, "curve") for a in arms}
    return {"arms": arms, "seeds": seeds, "steps": evals[-1], "evals": evals, "late_steps": (evals[2], evals[3]),
            "base_accuracy": float(base_acc), "curve": curve,
            "late": {a: curve[a][:, 2:].mean(1) for a in arms},
            "true_reward": {a: per_seed(a, "true_reward") for a in arms},
            "error_rate": {a: np.array([np.mean(e) for e in res.values(a, "error_rate")]) for a in arms},
            "clipped": {a: np.array([np.mean(np.array(g) > 1.0) for g in res.values(a, "grad_norm")]) for a in arms},
            "prompts_per_step": sz["prompts"], "G": sz["G"], "lr": sz["lr"], "workers": jobs,
            "seconds": base_seconds + res.wall_seconds}


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


def bandit_verdicts(b: dict) -> dict[str, Verdict]:
    """The bandit claims of :data:`CLAIMS`, evaluated on
    :func:`run_noisy_bandit`'s output (or :func:`summarise`'s)."""
    L, s = b["late_acc"], b["seconds"]
    clean = L[("adam", "sample", 0.0)]
    drop = {o: L[(o, "sample", 0.0)] - L[(o, "sample", 0.4)] for o in ("adam", "sgd")}
    ctl = evaluate(CLAIMS["bandit-control"], clean, L[("adam", "sample", 0.4)], seconds=s)

    def near_clean(name, key):
        return evaluate(CLAIMS[name], L[key], clean, seconds=s, control=ctl)

    return {
        "bandit-group-20": near_clean("bandit-group-20", ("adam", "group", 0.2)),
        "bandit-sample-20": near_clean("bandit-sample-20", ("adam", "sample", 0.2)),
        "bandit-group-30": near_clean("bandit-group-30", ("adam", "group", 0.3)),
        "bandit-sample-30": near_clean("bandit-sample-30", ("adam", "sample", 0.3)),
        "bandit-control": ctl,
        "bandit-precision": evaluate(CLAIMS["bandit-precision"], L[("adam", "strict", 0.4)],
                                     L[("adam", "lenient", 0.4)], seconds=s, control=ctl),
        "adam": evaluate(CLAIMS["adam"], drop["adam"], drop["sgd"], seconds=s),
    }


def study_verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`bandit_verdicts` on a :func:`noisy_bandit_study`'s results."""
    return bandit_verdicts(summarise(results))


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
