"""Experiments of the foundations chapters that run the whole loop; each returns measured numbers. (The
advantages chapter's accuracy race and length-bias run are a study: :mod:`rlcourse.studies.advantages`.)"""
from __future__ import annotations

import time

import torch

from .advantages import place_on_last_token
from .losses import agg_loss
from .lm import load_base_model, sample
from .profiles import Profile, profile as current_profile
from .tasks import get_task


def token_weights_by_mode(response_mask: torch.Tensor, modes, max_len: int | None = None) -> dict:
    """The weight each aggregation mode gives one token of each sequence: the gradient of the
    aggregated loss with respect to a per-token loss of 1, ``(B,)`` per mode."""
    out = {}
    for mode in modes:
        loss_mat = torch.ones_like(response_mask, dtype=torch.float32, requires_grad=True)
        (grad,) = torch.autograd.grad(agg_loss(loss_mat, response_mask, mode, max_len=max_len), loss_mat)
        out[mode] = grad[:, 0]
    return out


def rollout_lengths(prof: Profile | None = None, task: str = "countdown", n_prompts: int = 64, seed: int = 0):
    """Sampled rollouts of a base model, for the aggregation analysis: ``(batch, rewards)``."""
    prof = prof or current_profile()
    model, tok = load_base_model(task, "weak", prof=prof, progress=False)
    t = get_task(task)
    ex = t.examples(n_prompts, seed=seed, split="test")
    batch = sample(model, tok, [e.prompt for e in ex], num_generations=4, max_new_tokens=12, temperature=1.2,
                   generator=torch.Generator().manual_seed(seed))
    rewards = torch.as_tensor(t.rewards(batch.texts, [e for e in ex for _ in range(4)]))
    return batch, rewards


# ---------------------------------------------------------------------- the advantages chapter's evidence
SNR_ESTIMATORS = ("reinforce_shifted", "reinforce", "reinforce_baseline", "rloo", "grpo", "dr_grpo")
PAPERS = {
    "reinforce": "Williams 1992, Simple Statistical Gradient-Following Algorithms (REINFORCE)",
    "rloo": "Kool, van Hoof, Welling 2019, Buy 4 REINFORCE Samples, Get a Baseline for Free! (RLOO)",
    "grpo": "Shao et al. 2024, DeepSeekMath, arXiv:2402.03300 (GRPO)",
    "dr_grpo": "Liu et al. 2025, Understanding R1-Zero-Like Training, arXiv:2503.20783 (Dr. GRPO)",
}


def _flat_grad(loss: torch.Tensor, params) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def gradient_snr(prof: Profile | None = None, estimators=SNR_ESTIMATORS, n_batches: int | None = None,
                 prompts: int | None = None, num_generations: int = 8, seed: int = 0) -> dict:
    """Signal-to-noise ratio of each estimator's policy gradient at *fixed* weights (the addition base
    model), over ``n_batches`` independent batches of ``prompts x num_generations`` rollouts.

    Every estimator sees the same batches. For estimator ``e`` with per-batch gradient ``g_k``
    (token-mean loss ``-A * log pi``, all parameters), with ``K`` batches,
    ``v = K/(K-1) * (mean_k |g_k|^2 - |g_bar|^2)`` (the per-batch total variance, trace of the
    covariance) and ``s = |g_bar|^2 - v/K`` (an unbiased estimate of ``|E g|^2``); ``snr = s / v``.
    The SNR does not change when an estimator's advantages are multiplied by a constant, so
    estimators of different scale (GRPO's 1/std) compare fairly. The name ``"reinforce_shifted"`` is
    REINFORCE on rewards shifted by +1 (same expected gradient, larger variance): a positive control
    showing that the measurement can see what a baseline removes.

    Returns ``{est: {"snr", "signal", "variance"}}`` and ``"seconds"``.
    """
    from .advantages import get_estimator
    from .lm.model import response_logprobs

    prof = prof or current_profile()
    n_batches = n_batches or prof.pick(smoke=3, book=24)
    prompts = prompts or prof.pick(smoke=4, book=16)
    if n_batches < 2:
        raise ValueError(f"gradient_snr needs n_batches >= 2 to estimate a variance, got {n_batches}")
    model, tok = load_base_model("addition", "medium", prof=prof, progress=False)
    model.eval()
    task = get_task("addition")
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(seed)
    sums = {e: None for e in estimators}
    sq = {e: 0.0 for e in estimators}
    start = time.perf_counter()
    for k in range(n_batches):
        ex = task.examples(prompts, seed=10_000 * (seed + 1) + k, split="train")
        with torch.no_grad():
            batch = sample(model, tok, [e.prompt for e in ex], num_generations=num_generations,
                           max_new_tokens=10, generator=gen)
        per_row = [ex[int(i)] for i in batch.index]
        scores = torch.as_tensor(task.rewards(batch.texts, per_row), dtype=torch.float32)
        mask = batch.response_mask.float()
        rewards = place_on_last_token(scores, mask)
        logp = response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_len, batch.temperature)
        for e in estimators:
            if e == "reinforce_shifted":  # positive control: every reward + 1, no baseline
                adv, _ = get_estimator("reinforce")(place_on_last_token(scores + 1.0, mask), mask, batch.index)
            else:
                adv, _ = get_estimator(e)(rewards, mask, batch.index)
            g = _flat_grad(agg_loss(-adv.detach() * logp, mask, "token-mean"), params)
            sums[e] = g if sums[e] is None else sums[e] + g
            sq[e] += float(g.pow(2).sum())
    out = {}
    K = n_batches
    for e in estimators:
        gbar2 = float((sums[e] / K).pow(2).sum())
        var = K / (K - 1) * (sq[e] / K - gbar2)
        signal = gbar2 - var / K
        out[e] = {"snr": signal / var if var > 0 else 0.0, "signal": signal, "variance": var}
    out["seconds"] = time.perf_counter() - start
    return out


def snr_claim():
    """RLOO's leave-one-out baseline raises the gradient's signal-to-noise ratio over REINFORCE's."""
    from .claims import Claim

    return Claim(
        key="advantages/rloo-snr-above-reinforce", paper=PAPERS["rloo"],
        statement="using the other samples of the same input as a baseline reduces the variance of the REINFORCE "
                  "estimator without adding bias (paraphrase of the paper's section 2)",
        source="Kool et al. 2019, ICLR Deep RL Meets Structured Prediction workshop, sec. 2 (paraphrase)",
        setting="addition base model at fixed weights, 16 prompts x 8 samples per batch, 24 batches per seed, "
                "gradient of the token-mean loss over all parameters",
        metric="log10 of the gradient signal-to-noise ratio, per seed", method="rloo", baseline="reinforce",
        kind="greater", margin=0.0, unit="{:.2f}", control="advantages/control-shift-lowers-snr")


def snr_control_claim():
    """The SNR measurement's positive control: rewards shifted by +1 with no baseline lower the SNR."""
    from .claims import Claim

    return Claim(
        key="advantages/control-shift-lowers-snr", paper=PAPERS["rloo"], role="positive control",
        statement="(not a claim of the paper) adding a constant to every reward, with no baseline, lowers the "
                  "gradient's signal-to-noise ratio, so the measurement can show what a baseline changes",
        source="positive control of the measurement", setting=snr_claim().setting,
        metric="log10 of the gradient signal-to-noise ratio, per seed", method="reinforce",
        baseline="reinforce_shifted", kind="greater", margin=0.0, unit="{:.2f}")


def _log_snr(per_seed: list[dict], est: str) -> list[float]:
    import math

    return [math.log10(max(r[est]["snr"], 1e-12)) for r in per_seed]


def snr_control_verdict(per_seed: list[dict]):
    """The verdict of :func:`snr_control_claim` on a list of :func:`gradient_snr` outputs (one per seed)."""
    from .claims import evaluate

    return evaluate(snr_control_claim(), _log_snr(per_seed, "reinforce"), _log_snr(per_seed, "reinforce_shifted"),
                    seconds=sum(r["seconds"] for r in per_seed))


def snr_verdict(per_seed: list[dict]):
    """The verdict of :func:`snr_claim` on a list of :func:`gradient_snr` outputs (one per seed), gated on
    :func:`snr_control_verdict`."""
    from .claims import evaluate

    return evaluate(snr_claim(), _log_snr(per_seed, "rloo"), _log_snr(per_seed, "reinforce"),
                    seconds=sum(r["seconds"] for r in per_seed), control=snr_control_verdict(per_seed))


def grpo_weight_prediction(p, G: int) -> tuple:
    """GRPO's factor 1/std on a group of ``G`` binary rewards with success probability ``p`` (unbiased std,
    as in :func:`rlcourse.advantages.compute_grpo_outcome_advantage`): the exact expectation over the
    groups that are not constant, and the large-G form ``1/sqrt(p(1-p))``. Arrays of ``p``'s shape."""
    import numpy as np
    from scipy.stats import binom

    p = np.asarray(p, dtype=float)
    k = np.arange(1, G)
    inv_std = 1.0 / np.sqrt(k * (G - k) / (G * (G - 1)))  # (G-1,)
    pmf = binom.pmf(k[None, :], G, p.reshape(-1, 1))  # (n, G-1)
    exact = (pmf * inv_std).sum(1) / np.clip(pmf.sum(1), 1e-300, None)
    return exact.reshape(p.shape), 1.0 / np.sqrt(np.clip(p * (1 - p), 1e-12, None))


def difficulty_weights(prof: Profile | None = None, n_prompts: int | None = None, n_groups: int = 8,
                       num_generations: int = 8, seed: int = 0) -> dict:
    """Measure GRPO's per-prompt weight against Dr. GRPO's on the addition base model.

    Each prompt gets ``n_groups`` groups of ``num_generations`` samples. Its success probability ``p``
    is estimated from all ``n_groups * G`` samples; its measured weight is the mean, over its groups
    that are not constant, of ``|GRPO advantage| / |Dr. GRPO advantage|`` (= 1/std of the group).
    Returns arrays ``p``, ``measured`` (NaN where every group was constant), ``exact``, ``asymptotic``.
    """
    import numpy as np

    from .advantages import compute_dr_grpo_outcome_advantage, compute_grpo_outcome_advantage

    prof = prof or current_profile()
    n_prompts = n_prompts or prof.pick(smoke=6, book=64)
    model, tok = load_base_model("addition", "medium", prof=prof, progress=False)
    task = get_task("addition")
    ex = task.examples(n_prompts, seed=seed, split="test")
    G = num_generations
    with torch.no_grad():
        batch = sample(model, tok, [e.prompt for e in ex for _ in range(n_groups)], num_generations=G,
                       max_new_tokens=10, generator=torch.Generator().manual_seed(seed))
    per_row = [ex[int(i) // n_groups] for i in batch.index]
    scores = torch.as_tensor(task.rewards(batch.texts, per_row), dtype=torch.float32)
    mask = batch.response_mask.float()
    rewards = place_on_last_token(scores, mask)
    grpo, _ = compute_grpo_outcome_advantage(rewards, mask, batch.index)
    drg, _ = compute_dr_grpo_outcome_advantage(rewards, mask, batch.index)
    a, b = grpo[:, 0].abs().reshape(n_prompts, n_groups, G), drg[:, 0].abs().reshape(n_prompts, n_groups, G)
    live = b.sum(-1) > 0  # (n_prompts, n_groups): groups with both outcomes
    ratio = (a.sum(-1) / b.sum(-1).clamp(min=1e-12))
    measured = np.array([float(ratio[i][live[i]].mean()) if live[i].any() else np.nan for i in range(n_prompts)])
    p = scores.reshape(n_prompts, n_groups * G).mean(1).numpy()
    exact, asymptotic = grpo_weight_prediction(p, G)
    return {"p": p, "measured": measured, "exact": exact, "asymptotic": asymptotic}
