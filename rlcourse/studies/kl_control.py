"""The KL-control chapter's studies. The bandit study: KL-regularised REINFORCE
(:func:`rlcourse.bandits.kl.train_kl_bandit`) on :func:`~rlcourse.bandits.kl.kl_bandit` with every
placement of the KL term (``rlcourse.bandits.kl.KL_PLACEMENTS``) at several ``beta``, compared with
the closed-form optimum :math:`\\pi^*_\\beta \\propto \\pi_{\\text{ref}} e^{\\bar r/\\beta}`, the
maximiser of :math:`J - \\beta\\,\\mathrm{KL}(\\pi_{\\text{ref}}\\,\\|\\,\\pi)` and the fixed point of
k3-in-the-loss's clamped expected update; with the claims :data:`KL_CLAIMS` and their verdicts.

An arm is a placement at one ``beta`` (``"k3-loss beta=0.2"``). A cell trains the ``runs`` replicate
runs of its arm together, vectorised on one generator seeded by the beta's index, so the placements of
one ``beta`` share their random numbers (paired runs). The study has one seed; the replicates are the
runs. The exact optima are computed outside the grid (:func:`exact_references`).

The tiny language model's sweep of ``beta`` (:func:`run_kl_beta_sweep_lm`) is a second study,
:func:`lm_study`: an arm is one ``beta`` (``"beta=0.2"``), a seed one GRPO run from the lab's addition
base model, with the claim :data:`KL_LM_CLAIM`; the base model's own accuracy is a one-cell study
(:func:`lm_base_study`).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..bandits.exact import DTYPE
from ..bandits.kl import (KL_PLACEMENTS, exact_ascent, expected_loss_ascent, kl_bandit, kl_categorical,
                          kl_regularised_optimum, regularised_objective, train_kl_bandit)
from ..claims import Claim, Verdict, evaluate
from ..profiles import Profile, one_torch_thread, profile as current_profile
from .runner import Results, Study, run_study


def arm_name(placement: str, beta: float) -> str:
    """The study's arm for ``placement`` at ``beta``, e.g. ``"k3-loss beta=0.2"``."""
    if placement not in KL_PLACEMENTS:
        raise ValueError(f"unknown KL placement {placement!r}; choose one of {KL_PLACEMENTS}")
    return f"{placement} beta={float(beta)!r}"


def arms(betas) -> tuple[str, ...]:
    """Every placement at every beta, placement-major."""
    return tuple(arm_name(p, b) for p in KL_PLACEMENTS for b in betas)


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """The ``sizes["runs"]`` runs of one (placement, beta) arm, their generator seeded with the beta's
    index ``i`` plus ``len(betas) * seed``. End points are means over the last 10% of steps.

    ======== =============== ==============================================================
    J, KL    float           exact reward and KL(pi || ref) at the end, mean over runs
    J_runs   ``(R,)``        the same per run (``KL_runs`` too)
    curve_J  ``(steps+1,)``  exact reward along training, mean over runs (``curve_KL`` too)
    logp     ``(R, K)``      each run's final log-probs
    ======== =============== ==============================================================
    """
    betas = sizes["betas"]
    if arm not in arms(betas):
        raise ValueError(f"unknown arm {arm!r}; the arms are {arms(betas)}")
    placement, _, beta = arm.rpartition(" beta=")
    i = [float(b) for b in betas].index(float(beta))
    steps = sizes["steps"]
    means, logref = kl_bandit()
    res = train_kl_bandit(means, logref, float(beta), placement, steps, sizes["batch"], sizes["lr"], sizes["runs"],
                          seed=i + len(betas) * seed)
    tail = max(1, steps // 10)
    return {"J": float(res["J"][:, -tail:].mean()), "KL": float(res["KL"][:, -tail:].mean()),
            "J_runs": res["J"][:, -tail:].mean(1).tolist(), "KL_runs": res["KL"][:, -tail:].mean(1).tolist(),
            "curve_J": res["J"].mean(0).tolist(), "curve_KL": res["KL"].mean(0).tolist(),
            "logp": res["logp"].tolist()}


def kl_study(P: Profile) -> Study:
    """Every placement at the profile's betas; ``runs`` replicate runs per cell (at least the profile's
    toy seeds), batches of 16, SGD step 0.5."""
    sizes = {"steps": P.pick(smoke=40, book=1500, full=4000),
             "runs": max(P.toy_seeds, P.pick(smoke=2, book=8, full=32)),  # every run is one replicate
             "betas": P.pick(smoke=[0.1, 0.5], book=[0.05, 0.1, 0.2, 0.5], full=[0.02, 0.05, 0.1, 0.2, 0.5, 1.0]),
             "batch": 16, "lr": 0.5}
    return Study(name="kl_control", arms=arms(sizes["betas"]), seeds=(0,), run=run_cell, sizes=sizes,
                 verdicts=study_verdicts, modules=("rlcourse.bandits.kl", "rlcourse.bandits.exact", "rlcourse.losses"))


@one_torch_thread()
def exact_references(betas) -> dict:
    """The exact end points the runs are compared with, per beta: the closed-form optimum (``opt_J``,
    ``opt_KL``), the forward-KL optimum (``fwd_J``, ``fwd_KL``; log-probs ``fwd``), the fixed point of
    k3-in-the-loss's clamped expected update (``k3_fixed_J``, ``k3_fixed_KL``; log-probs ``k3_fixed``),
    and the ``frontier`` (J, KL of pi*_beta on a fine grid of beta)."""
    means, logref = kl_bandit()
    out = {k: [] for k in ("opt_J", "opt_KL", "fwd_J", "fwd_KL", "k3_fixed_J", "k3_fixed_KL", "fwd", "k3_fixed")}

    def record(name, logp):
        out[f"{name}_J"].append(float((logp.exp() * means).sum()))
        out[f"{name}_KL"].append(float(kl_categorical(logp, logref)))

    for beta in betas:
        record("opt", kl_regularised_optimum(logref, means, beta))
        th = exact_ascent(lambda th: regularised_objective(th, logref, means, beta, "forward"), logref,
                          steps=2500, lr=2.0)
        out["fwd"].append(torch.log_softmax(th, -1))
        record("fwd", out["fwd"][-1])
        out["k3_fixed"].append(torch.log_softmax(expected_loss_ascent(logref, means, beta, "k3", steps=2500, lr=2.0),
                                                 -1))
        record("k3_fixed", out["k3_fixed"][-1])
    grid = np.geomspace(0.001, 10.0, 200)
    front = [kl_regularised_optimum(logref, means, float(b)) for b in grid]
    out["frontier"] = {"beta": grid, "J": np.array([float((f.exp() * means).sum()) for f in front]),
                       "KL": np.array([float(kl_categorical(f, logref)) for f in front])}
    return out


def summarise(results: Results) -> dict:
    """The experiment's dict (see :func:`run_kl_experiment`) from a :func:`kl_study`'s results and
    :func:`exact_references`; ``seconds`` is the grid's wall seconds plus the exact references'."""
    t0 = time.perf_counter()
    sizes = results.study.sizes
    betas, seed = list(sizes["betas"]), results.study.seeds[0]
    means, logref = kl_bandit()
    ref = exact_references(betas)
    out = {"betas": betas, "placements": list(KL_PLACEMENTS), "steps": sizes["steps"], "batch": sizes["batch"],
           "lr": sizes["lr"], "runs": sizes["runs"], "ref_J": float((logref.exp() * means).sum()),
           "best": float(means.max())}
    for key in ("J", "KL", "curves_J", "curves_KL", "dist_opt", "dist_fwd", "J_runs", "KL_runs", "dist_opt_runs",
                "dist_fwd_runs"):
        out[key] = {p: [] for p in KL_PLACEMENTS}
    out.update({k: ref[k] for k in ("opt_J", "opt_KL", "fwd_J", "fwd_KL", "k3_fixed_J", "k3_fixed_KL")})
    out["dist_k3_fixed"] = []
    for p in KL_PLACEMENTS:
        for i, beta in enumerate(betas):
            m = results.metrics[(arm_name(p, beta), seed)]
            logp = torch.tensor(m["logp"], dtype=DTYPE)
            out["J"][p].append(m["J"])
            out["KL"][p].append(m["KL"])
            for key, name in (("J_runs", "J_runs"), ("KL_runs", "KL_runs"), ("curves_J", "curve_J"),
                              ("curves_KL", "curve_KL")):
                out[key][p].append(np.asarray(m[name]))
            d_opt = kl_categorical(logp, kl_regularised_optimum(logref, means, beta).expand_as(logp))
            d_fwd = kl_categorical(logp, ref["fwd"][i].expand_as(logp))
            out["dist_opt"][p].append(float(d_opt.mean()))
            out["dist_fwd"][p].append(float(d_fwd.mean()))
            out["dist_opt_runs"][p].append(d_opt.numpy())
            out["dist_fwd_runs"][p].append(d_fwd.numpy())
            if p == "k3-loss":
                out["dist_k3_fixed"].append(float(kl_categorical(logp, ref["k3_fixed"][i].expand_as(logp)).mean()))
    out["frontier"] = ref["frontier"]
    out["seconds"] = results.wall_seconds + time.perf_counter() - t0
    return out


def run_kl_experiment(prof: Profile | None = None) -> dict:
    """Chapter *KL control*: :func:`kl_study` on the study runner (cached per cell), with the exact
    references of :func:`exact_references`.

    Returns a dict: ``betas``, ``placements``, ``steps``, ``batch``, ``lr``, ``runs``;
    ``J[p][i]``, ``KL[p][i]`` final exact reward and KL(pi||ref) (mean over runs and the last
    10% of steps) for placement p and beta i; ``curves_J[p][i]``, ``curves_KL[p][i]`` ``(steps+1,)``
    mean over runs; ``dist_opt[p][i]`` mean KL(pi_final || pi*_beta); ``dist_fwd[p][i]`` mean
    KL(pi_final || forward-KL optimum); ``opt_J[i]``, ``opt_KL[i]``, ``fwd_J[i]``, ``fwd_KL[i]``
    (the two optima); ``k3_fixed_J[i]``, ``k3_fixed_KL[i]`` (the fixed point of k3-in-the-loss's
    exact expected update *with* the clamp of :func:`~rlcourse.losses.kl_penalty`, from
    :func:`~rlcourse.bandits.kl.expected_loss_ascent`) and ``dist_k3_fixed[i]`` (mean KL from the k3
    runs to it); ``frontier`` (J, KL of pi*_beta on a fine grid of beta); ``seconds``.
    """
    return summarise(run_study(kl_study(prof or current_profile())))


def frontier_reward(E: dict, kl) -> np.ndarray:
    """The reward of the closed-form optimum :math:`\\pi^*_\\beta` whose KL to the reference is ``kl``
    (interpolated on ``E["frontier"]``): the most reward any policy can have at that KL."""
    order = np.argsort(E["frontier"]["KL"])
    return np.interp(kl, E["frontier"]["KL"][order], E["frontier"]["J"][order])


_KL_SETTING = ("8-armed Bernoulli bandit (means 0.1..0.9, reference favouring the worse arms), REINFORCE with a "
               "leave-one-out baseline, SGD on the logits, batches of 16, 1500 steps; one seed = one run, the "
               "placements of a beta on the same random numbers; end point = mean of the last 10% of steps")
_PRS = "verl PR #2953; OpenRLHF PRs #1101, #1309 (gradients of the KL estimators)"
_GRADIENTS = dict(paper=_PRS, source="the pull requests' derivations; this chapter's proposition on expected gradients",
                  setting=_KL_SETTING + "; beta = 0.2")  # the two claims on where the gradients lead
KL_CLAIMS = {
    "k2_vs_k3": Claim(
        key="kl_control/k2-reaches-optimum", **_GRADIENTS,
        statement="k2 (and k3+) in the loss has the gradient of KL(pi || ref), so training ends at the "
                  "regularised optimum pi* ~ ref exp(r / beta); k3 in the loss does not",
        metric="KL(pi_final || pi*_beta), per run", method="k2 in the loss", baseline="k3 in the loss",
        kind="less", margin=0.0, unit="{:.4f}"),
    "k3_forward": Claim(
        key="kl_control/k3-forward-optimum", **_GRADIENTS,
        statement="k3 in the loss has the expected gradient of the forward KL(ref || pi), so it ends nearer "
                  "the forward-KL optimum than the reverse-KL one",
        metric="KL from k3's final policy to the forward-KL optimum, per run",
        method="distance to the forward-KL optimum", baseline="distance to pi*_beta",
        kind="less", margin=0.0, unit="{:.4f}"),
    "k3_frontier": Claim(
        key="kl_control/k3-inside-frontier",
        paper=_PRS,
        statement="optimising the wrong divergence (k3 in the loss) ends off the reward-KL frontier of "
                  "KL(pi || ref): the same reverse KL could have bought more reward",
        source="consequence of the forward-KL gradient and of the closed-form optimum (this chapter)",
        setting=_KL_SETTING + "; beta = 0.1",
        metric="expected reward of the final policy, per run",
        method="k3 in the loss", baseline="frontier reward at the same KL", kind="less", margin=0.0),
    "tradeoff": Claim(
        key="kl_control/beta-trades-reward-for-kl",
        paper="Ouyang et al., Training language models to follow instructions with human feedback, 2022, arXiv:2203.02155",
        statement="a per-token KL penalty to the SFT model in the reward keeps the policy near the SFT model; "
                  "beta sets the trade-off",
        source="Ouyang et al. (2022), section 3.5 (the PPO objective with the KL coefficient beta)",
        setting=_KL_SETTING + "; k1 in the reward, largest beta against smallest",
        metric="exact KL(pi || ref) at the end, per run",
        method="largest beta", baseline="smallest beta", kind="less", margin=0.0),
}


def kl_verdicts(E: dict) -> dict[str, Verdict]:
    """The verdicts of :data:`KL_CLAIMS` on :func:`run_kl_experiment`'s output; replicates are runs."""
    b = E["betas"]
    i2 = b.index(0.2) if 0.2 in b else len(b) - 1
    i1 = b.index(0.1) if 0.1 in b else 0
    s = E["seconds"]
    k3_kl = E["KL_runs"]["k3-loss"][i1]
    return {
        "k2_vs_k3": evaluate(KL_CLAIMS["k2_vs_k3"], E["dist_opt_runs"]["k2-loss"][i2],
                             E["dist_opt_runs"]["k3-loss"][i2], seconds=s),
        "k3_forward": evaluate(KL_CLAIMS["k3_forward"], E["dist_fwd_runs"]["k3-loss"][i2],
                               E["dist_opt_runs"]["k3-loss"][i2], seconds=s),
        "k3_frontier": evaluate(KL_CLAIMS["k3_frontier"], E["J_runs"]["k3-loss"][i1], frontier_reward(E, k3_kl),
                                seconds=s),
        "tradeoff": evaluate(KL_CLAIMS["tradeoff"], E["KL_runs"]["k1-reward"][-1], E["KL_runs"]["k1-reward"][0],
                             seconds=s),
    }


def study_verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`kl_verdicts` on a :func:`kl_study`'s results."""
    return kl_verdicts(summarise(results))


# ---------------------------------------------------------------------------- the same trade-off on the tiny LM
LM_BASE = "base model"  # the one arm of the base model's study
LM_MODULES = ("rlcourse.train", "rlcourse.losses", "rlcourse.advantages", "rlcourse.lm.model", "rlcourse.lm.sampling",
              "rlcourse.lm.engine", "rlcourse.lm.zoo", "rlcourse.tasks")

KL_LM_CLAIM = Claim(
    key="kl_control/lm-beta-keeps-near-reference",
    paper="Ouyang et al., Training language models to follow instructions with human feedback, 2022, arXiv:2203.02155",
    statement="a KL penalty to the SFT model keeps the policy near the SFT model; beta sets the trade-off",
    source="Ouyang et al. (2022), section 3.5",
    setting="tiny Llama addition model (the lab's medium base), GRPO with the KL in the loss (the trainer's default "
            "estimator), 8 prompts x 8 samples, 15 steps, learning rate 3e-4; KL on 64 held-out prompts x 4 samples",
    metric="sequence-level KL to the reference after training (mean of the summed per-token k1)",
    method="largest beta", baseline="beta = 0", kind="less", margin=0.0)


def lm_arms(betas) -> tuple[str, ...]:
    """The LM study's arms, one per ``beta``, e.g. ``"beta=0.2"``."""
    return tuple(f"beta={float(b)!r}" for b in betas)


def lm_sizes(prof: Profile, betas=None) -> dict:
    """The sweep's sizes for a profile: the ``betas`` (default the profile's), training ``steps``,
    ``prompts`` per step, ``G`` samples per prompt, learning rate ``lr``, ``n_eval`` held-out prompts,
    and the ``profile`` (it names the base model)."""
    betas = list(betas) if betas is not None else prof.pick(smoke=[0.0, 1.0], book=[0.0, 0.2, 2.0])
    return {"betas": [float(b) for b in betas], "steps": prof.pick(smoke=2, book=15, full=100),
            "prompts": prof.pick(smoke=4, book=8), "G": prof.pick(smoke=4, book=8),
            "lr": prof.pick(smoke=1e-4, book=3e-4), "n_eval": prof.pick(smoke=8, book=64, full=256),
            "profile": prof.as_dict()}


def lm_base_model(sizes: dict):
    """The lab's medium addition base model of ``sizes["profile"]`` and its tokenizer (from the cache)."""
    from ..lm import load_base_model

    return load_base_model("addition", "medium", prof=Profile(**sizes["profile"]), progress=False)


def lm_measure(model, ref, tokenizer, n_eval: int, seed: int) -> tuple[float, float]:
    """``model``'s sampled accuracy (temperature 1) and sequence-level KL to ``ref`` on fresh samples,
    4 for each of ``n_eval`` held-out addition prompts, drawn by a generator seeded ``10_000 + seed``;
    the KL is the mean over samples of :math:`\\sum_t k_1`. Returns (accuracy, KL)."""
    from ..lm import response_logprobs, sample
    from ..tasks import get_task

    task = get_task("addition")
    test = task.examples(n_eval, seed=4321, split="test")
    fresh = sample(model, tokenizer, [e.prompt for e in test], num_generations=4, max_new_tokens=10,
                   generator=torch.Generator().manual_seed(10_000 + seed))
    with torch.no_grad():
        ref_lp = response_logprobs(ref, fresh.input_ids, fresh.attention_mask, fresh.response_len)
    kl = float(((fresh.logprobs - ref_lp) * fresh.response_mask).sum(-1).mean())
    acc = float(task.rewards(fresh.texts, [e for e in test for _ in range(4)]).mean())
    return acc, kl


def run_lm_base_cell(arm: str, seed: int, sizes: dict) -> dict:
    """The base model's sampled accuracy ``reward`` on the held-out prompts (:func:`lm_measure` against
    itself, samples seeded by ``seed``); the only arm is :data:`LM_BASE`."""
    if arm != LM_BASE:
        raise ValueError(f"unknown arm {arm!r}; the arms are {(LM_BASE,)}")
    with one_torch_thread():
        base, tok = lm_base_model(sizes)
        return {"reward": lm_measure(base, base, tok, sizes["n_eval"], seed)[0]}


def run_lm_cell(arm: str, seed: int, sizes: dict) -> dict:
    """GRPO from the base model with the KL in the loss (the trainer's default estimator) at the arm's
    ``beta``, seeded by ``seed``; then :func:`lm_measure` against the base model.

    ======== ====== =====================================================
    reward   float  sampled accuracy after training (held-out prompts)
    kl       float  sequence-level KL to the base model after training
    ======== ====== =====================================================
    """
    from ..train import RLConfig, Trainer

    if arm not in lm_arms(sizes["betas"]):
        raise ValueError(f"unknown arm {arm!r}; the arms are {lm_arms(sizes['betas'])}")
    with one_torch_thread():
        ref, _ = lm_base_model(sizes)
        model, tok = lm_base_model(sizes)  # a second copy, trained
        cfg = RLConfig(beta=float(arm.removeprefix("beta=")), num_generations=sizes["G"], steps=sizes["steps"],
                       prompts_per_step=sizes["prompts"], max_completion_length=10, learning_rate=sizes["lr"],
                       progress=False, train_pool_size=512, eval_prompts=8, seed=seed)
        tr = Trainer(model, tok, "addition", cfg)
        tr.train()
        reward, kl = lm_measure(tr.model, ref, tok, sizes["n_eval"], seed)
    return {"reward": reward, "kl": kl}


def lm_base_study(prof: Profile) -> Study:
    """The base model's accuracy on the sweep's held-out prompts: one cell."""
    sizes = lm_sizes(prof)
    return Study(name="kl_control-lm-base", arms=(LM_BASE,), seeds=(0,), run=run_lm_base_cell,
                 sizes={k: sizes[k] for k in ("n_eval", "profile")}, modules=LM_MODULES)


def lm_study(prof: Profile, betas=None) -> Study:
    """Every ``beta`` of the sweep (default the profile's) on seeds ``0 .. prof.seeds - 1``."""
    sizes = lm_sizes(prof, betas)
    return Study(name="kl_control-lm", arms=lm_arms(sizes["betas"]), seeds=tuple(range(prof.seeds)), run=run_lm_cell,
                 sizes=sizes, verdicts=lm_study_verdicts, modules=LM_MODULES)


def run_kl_beta_sweep_lm(prof: Profile | None = None, betas=None, **run_kw) -> dict:
    """Chapter *KL control*: GRPO with the KL in the loss (the trainer's default estimator) on the
    tiny addition model, for several ``beta`` and ``prof.seeds`` seeds, a small budget each
    (:func:`lm_study` and :func:`lm_base_study` on the study runner; ``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`). After training, on fresh samples of held-out prompts:
    the sampled accuracy (temperature 1) and the sequence-level KL to the reference, the mean over
    samples of :math:`\\sum_t k_1`.

    ============ ======================= ===============================================
    betas        list                    the betas swept
    seeds        int                     seeds per beta
    steps        int                     training steps per run
    reward, kl   ``(len(betas), seeds)`` sampled accuracy and sequence KL after training
    base_reward  float                   the base model's sampled accuracy, same prompts
    seconds      float                   wall seconds of the two grids' cells
    ============ ======================= ===============================================
    """
    prof = prof or current_profile()
    study = lm_study(prof, betas)
    base = run_study(lm_base_study(prof), **run_kw)
    res = run_study(study, **run_kw)
    return {"betas": list(betas) if betas is not None else list(study.sizes["betas"]), "seeds": len(study.seeds),
            "steps": study.sizes["steps"],
            **{k: np.array([res.values(a, k) for a in study.arms], dtype=float) for k in ("reward", "kl")},
            "base_reward": base.metrics[(LM_BASE, 0)]["reward"], "seconds": base.wall_seconds + res.wall_seconds}


def kl_lm_verdict(S: dict) -> Verdict:
    """The verdict of :data:`KL_LM_CLAIM` on :func:`run_kl_beta_sweep_lm`'s output (paired by seed)."""
    return evaluate(KL_LM_CLAIM, S["kl"][-1], S["kl"][0], seconds=S["seconds"])


def lm_study_verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`kl_lm_verdict` on a :func:`lm_study`'s results, under the name ``"lm"``."""
    kl = np.array([results.values(a, "kl") for a in results.study.arms], dtype=float)
    return {"lm": kl_lm_verdict({"kl": kl, "seconds": results.wall_seconds})}
