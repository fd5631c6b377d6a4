"""REINFORCE with baselines on a softmax bandit: the training runs and the experiment of the chapter
*Policy gradients* (:func:`run_baseline_experiment`), with its claims (:func:`pg_verdicts`).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..claims import Claim, evaluate
from ..profiles import Profile, one_torch_thread, profile as current_profile
from .exact import DTYPE, _logits, _means, _second_moments, batch_baselines, expected_reward

BASELINES = ("none", "batch_mean", "loo", "optimal", "value")


def _batched_moments(theta: torch.Tensor, m: torch.Tensor, m2: torch.Tensor, b: torch.Tensor):
    """Rows of :func:`estimator_moments` for ``R`` logit vectors at once: returns ``(R,)`` total
    variances and ``(R,)`` optimal baselines (``theta`` ``(R,K)``, ``b`` ``(R,)``)."""
    pi = torch.softmax(theta, -1)
    sq = 1 - 2 * pi + (pi**2).sum(-1, keepdim=True)  # ||e_a - pi||^2, (R, K)
    grad = pi * (m - (pi * m).sum(-1, keepdim=True))
    second = (pi * (m2 - 2 * b.unsqueeze(-1) * m + b.unsqueeze(-1) ** 2) * sq).sum(-1)
    w = pi * sq
    return second - (grad**2).sum(-1), (w * m).sum(-1) / w.sum(-1)


@one_torch_thread()
def train_bandit(means: torch.Tensor, theta0: torch.Tensor, baseline: str, steps: int, batch: int, lr: float,
                 runs: int, seed: int = 0, reward_noise: str = "bernoulli") -> dict:
    """REINFORCE with SGD on the logits of a softmax bandit, ``runs`` independent runs at once
    (all drawn from one generator seeded with ``seed``).

    Each step draws ``batch`` arms per run, forms the batch-mean REINFORCE estimate with the
    chosen baseline (``none``, ``batch_mean``, ``loo``, or the oracle constants ``optimal``
    (:func:`~rlcourse.bandits.exact.optimal_baseline`) and ``value`` (:math:`J(\\theta)`)) and takes a step ``lr`` along it.

    ======== ============== ========================================================
    means    ``(K,)``       mean reward of each arm
    theta0   ``(K,)``       initial logits (the same for every run)
    returns                 dict: ``J`` ``(R, steps+1)`` exact expected reward along each run;
                            ``var`` ``(R, steps)`` exact one-sample variance (trace of the covariance)
                            at each step's parameters with the constant baseline used (``none``: 0;
                            ``optimal``/``value``: the oracle; ``nan`` for the batch baselines);
                            ``est_var`` ``(R, steps)`` empirical trace variance of the per-sample estimates;
                            ``theta`` ``(R, K)`` final logits
    ======== ============== ========================================================
    """
    if baseline not in BASELINES:
        raise ValueError(f"unknown baseline {baseline!r}; choose one of {BASELINES}")
    if batch < 2 or runs < 1:
        raise ValueError(f"need batch >= 2 and runs >= 1, got batch={batch}, runs={runs}")
    theta0 = _logits(theta0)
    K = theta0.shape[0]
    m = _means(means, K)
    m2 = _second_moments(m, reward_noise)
    gen = torch.Generator().manual_seed(int(seed))
    theta = theta0.unsqueeze(0).repeat(runs, 1)
    J = torch.zeros(runs, steps + 1, dtype=DTYPE)
    var = torch.full((runs, steps), float("nan"), dtype=DTYPE)
    est_var = torch.zeros(runs, steps, dtype=DTYPE)
    for t in range(steps):
        pi = torch.softmax(theta, -1)
        J[:, t] = (pi * m).sum(-1)
        acts = torch.multinomial(pi, batch, replacement=True, generator=gen)  # (R, N)
        u = torch.rand(runs, batch, dtype=DTYPE, generator=gen)
        r = (u < m[acts]).to(DTYPE) if reward_noise == "bernoulli" else m[acts]
        if baseline in ("none", "batch_mean", "loo"):
            b = batch_baselines(r, baseline)
            if baseline == "none":
                var[:, t] = _batched_moments(theta, m, m2, torch.zeros(runs, dtype=DTYPE))[0]
        else:
            const = _batched_moments(theta, m, m2, torch.zeros(runs, dtype=DTYPE))[1] if baseline == "optimal" \
                else J[:, t].clone()
            var[:, t] = _batched_moments(theta, m, m2, const)[0]
            b = const.unsqueeze(-1).expand_as(r)
        scores = torch.nn.functional.one_hot(acts, K).to(DTYPE) - pi.unsqueeze(1)  # (R, N, K)
        g = (r - b).unsqueeze(-1) * scores
        est_var[:, t] = ((g - g.mean(1, keepdim=True)) ** 2).sum(-1).sum(1) / (batch - 1)
        theta = theta + lr * g.mean(1)
    J[:, steps] = (torch.softmax(theta, -1) * m).sum(-1)
    return {"J": J, "var": var, "est_var": est_var, "theta": theta}


# ---------------------------------------------------------------------------- the chapters' experiments
def baseline_bandit(K: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """The bandit of the baseline experiment: Bernoulli arms with means evenly spaced in
    [0.5, 0.9] (every arm pays often, so rewards are mostly positive), and initial logits that
    favour the worst arms (the best arm starts with the least probability). Returns (means, theta0)."""
    means = torch.linspace(0.5, 0.9, K, dtype=DTYPE)
    theta0 = torch.linspace(1.5, -1.5, K, dtype=DTYPE)
    return means, theta0


def run_baseline_experiment(prof: Profile | None = None) -> dict:
    """Chapter *Policy gradients*: REINFORCE on :func:`baseline_bandit` with five baselines (none,
    batch mean, leave-one-out, and the oracle constants: the variance-optimal :math:`b^*` and the
    value :math:`J`), the same batch, ``prof.toy_seeds`` seeds of ``runs`` independent runs each;
    learning curves at one step size, and a sweep of the step size for none, leave-one-out and
    :math:`b^*`. Every baseline sees the same random numbers for a seed (common random numbers), so
    the arms are paired by seed.

    Returns a dict: ``steps``, ``batch``, ``lr`` (of the curves), ``lrs`` (the sweep), ``seeds``,
    ``runs`` (per seed), ``optimum`` (best arm's mean), ``initial`` (J at the start);
    ``curves[b]`` ``(steps+1,)`` mean J over all runs and ``curves_se[b]`` its standard error;
    ``final[b]``, ``final_sd[b]`` (mean and standard deviation over all runs of the final J);
    ``final_seed[b]`` ``(seeds,)`` mean final J of each seed; ``auc[b]`` mean J over the run;
    ``est_var[b]`` mean empirical one-sample variance; ``var_none``, ``var_optimal`` ``(steps,)`` exact
    one-sample variance along those runs, ``var_seed[b]`` ``(seeds,)`` its mean per seed (b in none,
    optimal); ``var_ratio`` (none / optimal, averaged over steps); ``sweep[b]`` list over ``lrs`` of
    the mean final J, ``sweep_se[b]`` its standard errors over seeds, ``sweep_seed[b]``
    ``(seeds, len(lrs))``; ``best_lr[b]``, ``best_final[b]`` (of the mean), ``best_final_seed[b]``
    ``(seeds,)`` (the best step size of each seed); ``seconds``.
    """
    prof = prof or current_profile()
    t0 = time.perf_counter()
    steps = prof.pick(smoke=20, book=200, full=500)
    runs = prof.pick(smoke=4, book=16, full=64)
    seeds = list(range(prof.toy_seeds))
    lrs = prof.pick(smoke=[1.0, 4.0], book=[0.5, 1.0, 2.0, 4.0, 8.0, 16.0], full=[0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    batch, lr = 8, 4.0
    means, theta0 = baseline_bandit()
    out = {"steps": steps, "batch": batch, "lr": lr, "lrs": list(lrs), "runs": runs, "seeds": len(seeds),
           "optimum": float(means.max()), "initial": float(expected_reward(theta0, means)),
           "baselines": list(BASELINES), "curves": {}, "curves_se": {}, "final": {}, "final_sd": {},
           "final_seed": {}, "auc": {}, "est_var": {}, "var_seed": {}, "sweep": {}, "sweep_se": {},
           "sweep_seed": {}, "best_lr": {}, "best_final": {}, "best_final_seed": {}}
    with one_torch_thread():
        for b in BASELINES:
            res = [train_bandit(means, theta0, b, steps, batch, lr, runs, seed=s) for s in seeds]
            J = np.concatenate([r["J"].numpy() for r in res])  # (seeds * runs, steps + 1)
            out["curves"][b] = J.mean(0)
            out["curves_se"][b] = J.std(0, ddof=1) / np.sqrt(len(J))
            out["final"][b] = float(J[:, -1].mean())
            out["final_sd"][b] = float(J[:, -1].std(ddof=1))
            out["final_seed"][b] = np.array([float(r["J"][:, -1].mean()) for r in res])
            out["auc"][b] = float(J.mean())
            out["est_var"][b] = float(np.mean([float(r["est_var"].mean()) for r in res]))
            if b in ("none", "optimal"):
                out[f"var_{b}"] = np.concatenate([r["var"].numpy() for r in res]).mean(0)
                out["var_seed"][b] = np.array([float(r["var"].mean()) for r in res])
        for b in ("none", "loo", "optimal"):
            finals = np.array([[float(train_bandit(means, theta0, b, steps, batch, step, runs, seed=1000 + s)
                                      ["J"][:, -1].mean()) for step in lrs] for s in seeds])  # (seeds, lrs)
            out["sweep_seed"][b] = finals
            out["sweep"][b] = [float(x) for x in finals.mean(0)]
            out["sweep_se"][b] = [float(x) for x in (finals.std(0, ddof=1) / np.sqrt(len(seeds))
                                                     if len(seeds) > 1 else np.zeros(len(lrs)))]
            i = int(np.argmax(out["sweep"][b]))
            out["best_lr"][b], out["best_final"][b] = float(lrs[i]), out["sweep"][b][i]
            out["best_final_seed"][b] = finals.max(1)
    out["var_ratio"] = float(np.mean(out["var_none"]) / np.mean(out["var_optimal"]))
    out["seconds"] = time.perf_counter() - t0
    return out


_PG_SETTING = ("10-armed Bernoulli bandit (means 0.5..0.9, initial policy favouring the worst arms), plain "
               "SGD on the logits, batches of 8 pulls, 200 steps; one seed = 16 independent runs, all "
               "baselines on the same random numbers")
PG_CLAIMS = {
    "reward": Claim(
        key="policy_gradients/baseline-raises-reward",
        paper="Williams, Simple Statistical Gradient-Following Algorithms, 1992; Greensmith et al., JMLR 2004",
        statement="subtracting a reinforcement baseline that does not depend on the action leaves the expected "
                  "update unchanged and lowers its variance, which speeds learning (no number given)",
        source="Williams (1992), section 4 (reinforcement baselines); Greensmith, Bartlett and Baxter (2004)",
        setting=_PG_SETTING + "; step size 4",
        metric="exact expected reward J after 200 steps, mean over the seed's runs",
        method="leave-one-out baseline", baseline="no baseline", kind="greater", margin=0.0),
    "variance": Claim(
        key="policy_gradients/baseline-reduces-variance",
        paper="Greensmith, Bartlett and Baxter, Variance Reduction Techniques for Gradient Estimates in RL, JMLR 2004",
        statement="the variance-optimal constant baseline E[r |s|^2] / E[|s|^2] minimises the variance of the "
                  "one-sample estimator among constant baselines, so it has less variance than none",
        source="Greensmith et al. (2004), the optimal constant baseline",
        setting=_PG_SETTING + "; step size 4",
        metric="exact one-sample total variance at the policies along the runs, mean over steps and runs",
        method="oracle b*", baseline="no baseline", kind="less", margin=0.0, unit="{:.4f}",
        role="course hypothesis"),  # holds by construction (b* is the minimiser): a check, not evidence
    "best_step": Claim(
        key="policy_gradients/baseline-allows-larger-steps",
        paper="Williams, Simple Statistical Gradient-Following Algorithms, 1992",
        statement="a baseline does not change the expected update, only its noise, so its gain is that larger "
                  "steps pay off (our reading of the variance result; no number given)",
        source="Williams (1992), section 4; this chapter's step-size sweep",
        setting=_PG_SETTING + "; step sizes 0.5 to 16, the best one per seed and arm",
        metric="expected reward J after 200 steps at the best step size of the sweep",
        method="leave-one-out baseline", baseline="no baseline", kind="greater", margin=0.0,
        role="course hypothesis"),
}


def pg_verdicts(out: dict) -> dict:
    """The verdicts of :data:`PG_CLAIMS` on :func:`run_baseline_experiment`'s output (paired by seed)."""
    s = out["seconds"]
    return {
        "reward": evaluate(PG_CLAIMS["reward"], out["final_seed"]["loo"], out["final_seed"]["none"], seconds=s),
        "variance": evaluate(PG_CLAIMS["variance"], out["var_seed"]["optimal"], out["var_seed"]["none"], seconds=s),
        "best_step": evaluate(PG_CLAIMS["best_step"], out["best_final_seed"]["loo"], out["best_final_seed"]["none"],
                              seconds=s),
    }
