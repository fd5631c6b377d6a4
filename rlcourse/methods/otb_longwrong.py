"""OTB on a testbed built for it: long, high-entropy wrong answers and short, confident right ones.

Companion of :mod:`rlcourse.methods.otb` (Li et al., 2026, *The Optimal Token Baseline*, arXiv:2602.07078).
On the tabular policy of that module no baseline can make N = 4 match N = 32 (see
:func:`~rlcourse.methods.otb.tabular_oracle_nsr`), so a negative result there says nothing about OTB.
:class:`LongWrongTask` is a tabular testbed where a response's gradient energy correlates with failure,
the regime the paper's abstract describes; the chapter's claims about OTB are tested on it
(:data:`CLAIMS`, :func:`otb_verdicts`), with an oracle baseline as the positive control.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ..claims import Claim, evaluate
from ..profiles import Profile
from .otb import otb_advantage

__all__ = ["LongWrongTask", "longwrong_value", "longwrong_true_gradient", "longwrong_oracle_baseline",
           "longwrong_sample", "longwrong_advantages", "longwrong_gradient", "longwrong_nsr", "run_longwrong",
           "choose_longwrong_lr", "run_longwrong_experiment", "CLAIMS", "otb_verdicts"]


# ---------------------------------------------------------------------- a testbed where loud answers are wrong
class LongWrongTask:
    """A tabular testbed in which a response's gradient energy correlates with failure.

    Tokens are ``0 = C`` (give the right answer and stop, reward 1), ``1 = S`` (a wrong answer, stop,
    reward 0) and ``n_fillers`` filler tokens (keep going; a response that reaches ``max_len``
    tokens gets reward 0). The logits are a table ``theta[x, t]`` per prompt ``x`` and position
    ``t`` (the prefix of a live response is always fillers, so ``(x, t)`` is its context). At the
    start, ``P(C)`` at ``t = 0`` is spread over ``p_first`` across prompts: right answers are short
    and, on easy prompts, confident (small energy :math:`w = 1 - 2\\pi_C + \\sum\\pi^2`); later
    positions are near-uniform over the fillers with ``P(C) = P(S) = p_late``, so wrong answers are
    long, high-entropy and loud.

    ============== ============ ===============================================
    attribute      shape        meaning
    ============== ============ ===============================================
    theta          ``(K,L,V)``  initial logits (V = 2 + n_fillers)
    ============== ============ ===============================================
    """

    def __init__(self, n_prompts: int = 8, max_len: int = 16, n_fillers: int = 6, p_first=(0.25, 0.75),
                 p_late: float = 0.06):
        if n_prompts < 1 or max_len < 2 or n_fillers < 1:
            raise ValueError(f"need n_prompts >= 1, max_len >= 2, n_fillers >= 1; got {n_prompts}, {max_len}, "
                             f"{n_fillers}")
        if not 0 < p_late < 0.5:
            raise ValueError(f"p_late must be in (0, 0.5), got {p_late}")
        K, L, V = n_prompts, max_len, 2 + n_fillers
        self.K, self.L, self.V = K, L, V
        probs = np.zeros((K, L, V))
        pc = np.linspace(p_first[0], p_first[1], K)
        probs[:, 0, 0], probs[:, 0, 1] = pc, p_late
        probs[:, 0, 2:] = ((1 - pc - p_late) / n_fillers)[:, None]
        probs[:, 1:, 0] = probs[:, 1:, 1] = p_late
        probs[:, 1:, 2:] = (1 - 2 * p_late) / n_fillers
        self.theta = np.log(probs)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def longwrong_value(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact quantities of the :class:`LongWrongTask` policy ``theta`` ``(K,L,V)``.

    Returns ``J (K,)`` expected reward per prompt, ``alive (K,L)`` probability that a response is
    still going at position ``t``, and ``v (K,L+1)`` the value :math:`\\mathbb E[R \\mid \\text{alive at } t]`
    (``v[:, L] = 0``).
    """
    p = _softmax(theta)
    K, L, _ = theta.shape
    v = np.zeros((K, L + 1))
    for t in reversed(range(L)):
        v[:, t] = p[:, t, 0] + p[:, t, 2:].sum(-1) * v[:, t + 1]
    alive = np.concatenate([np.ones((K, 1)), np.cumprod(p[:, :-1, 2:].sum(-1), 1)], 1)
    return v[:, 0], alive, v


def longwrong_true_gradient(theta: np.ndarray) -> np.ndarray:
    """Exact :math:`\\nabla_\\theta` of the mean over prompts of the expected reward, ``(K,L,V)``."""
    p = _softmax(theta)
    _, alive, v = longwrong_value(theta)
    K, L, V = theta.shape
    g_tok = np.zeros((K, L, V))  # expected return after choosing each token at (x, t)
    g_tok[..., 0] = 1.0
    g_tok[..., 2:] = v[:, 1:, None]
    q = (p * g_tok).sum(-1, keepdims=True)  # = v[:, t]
    return alive[..., None] * p * (g_tok - q) / K


def longwrong_oracle_baseline(theta: np.ndarray) -> np.ndarray:
    """The exact variance-optimal baseline of each context ``(x, t)``,
    :math:`\\mathbb E[w_t G_t \\mid x, t] / \\mathbb E[w_t \\mid x, t]`, ``(K,L)`` (scores of different
    contexts are orthogonal, so each context's baseline is optimised on its own)."""
    p = _softmax(theta)
    _, _, v = longwrong_value(theta)
    w = 1.0 - 2.0 * p + (p * p).sum(-1, keepdims=True)  # energy of each token choice
    g_tok = np.zeros_like(p)
    g_tok[..., 0] = 1.0
    g_tok[..., 2:] = v[:, 1:, None]
    # E[w (G - b)^2]: for a filler G is random with mean v[t+1]; the optimum only needs E[w G]
    return (p * w * g_tok).sum(-1) / (p * w).sum(-1)


def longwrong_sample(theta: np.ndarray, group_size: int, rng: np.random.Generator) -> dict:
    """Sample ``group_size`` responses for every prompt (rows of a prompt are contiguous).

    ======== ========== ===========================================
    key      shape      meaning
    ======== ========== ===========================================
    x        ``(B,)``   prompt of each row, B = K * group_size
    tokens   ``(B,L)``  sampled tokens (-1 past the end)
    mask     ``(B,L)``  1 on the response's tokens
    reward   ``(B,)``   1 if the response ends with C
    logp     ``(B,L)``  log pi(y_t); ``sumsq`` ``(B,L)`` sum_v pi_v^2 (0 past the end)
    ======== ========== ===========================================
    """
    K, L, V = theta.shape
    p = _softmax(theta)
    x = np.repeat(np.arange(K), group_size)
    B = len(x)
    tokens = -np.ones((B, L), dtype=int)
    mask, logp, sumsq = np.zeros((B, L)), np.zeros((B, L)), np.zeros((B, L))
    alive = np.ones(B, dtype=bool)
    reward = np.zeros(B)
    for t in range(L):
        pt = p[x, t]
        a = (pt.cumsum(1) > rng.random((B, 1))).argmax(1)
        a = np.minimum(a, V - 1)
        tokens[alive, t] = a[alive]
        mask[alive, t] = 1.0
        logp[alive, t] = np.log(pt[alive, a[alive]])
        sumsq[alive, t] = (pt[alive] ** 2).sum(1)
        reward[alive & (a == 0)] = 1.0
        alive &= a >= 2
    return {"x": x, "tokens": tokens, "mask": mask, "reward": reward, "logp": logp, "sumsq": sumsq}


def longwrong_advantages(theta: np.ndarray, s: dict, group_size: int, baseline: str) -> np.ndarray:
    """Per-token advantages ``(B,L)`` of a sample from :func:`longwrong_sample`: ``"mean"`` (the group
    mean, Dr. GRPO), ``"otb"`` (:func:`otb_advantage`, verl's single-turn default: no zero-tail rule),
    ``"otb_tail"`` (with it), ``"oracle"`` (:func:`longwrong_oracle_baseline`) or ``"none"``."""
    R, mask = s["reward"], s["mask"]
    if baseline == "mean":
        if group_size < 2:
            raise ValueError("the group-mean baseline needs group_size >= 2")
        b = np.repeat(R.reshape(-1, group_size).mean(1), group_size)
        return (R - b)[:, None] * mask
    if baseline in ("otb", "otb_tail"):
        last = mask.sum(1).astype(int) - 1
        tlr = np.zeros_like(mask)
        tlr[np.arange(len(R)), last] = R
        adv, _ = otb_advantage(torch.tensor(tlr), torch.tensor(mask), torch.tensor(s["x"]),
                               logprobs=torch.tensor(s["logp"]), sum_pi_sq=torch.tensor(s["sumsq"]),
                               handle_zero_tail=baseline == "otb_tail")
        return adv.double().numpy()
    if baseline == "oracle":
        # G_t = R for every valid position of a response (outcome reward)
        b = longwrong_oracle_baseline(theta)[s["x"]]
        return (R[:, None] - b) * mask
    if baseline == "none":
        return R[:, None] * mask
    raise ValueError(f"baseline must be 'mean', 'otb', 'otb_tail', 'oracle' or 'none', got {baseline!r}")


def longwrong_gradient(theta: np.ndarray, s: dict, adv: np.ndarray) -> np.ndarray:
    """The policy-gradient estimate :math:`\\frac{1}{B}\\sum_i\\sum_t A_{it}(e_{y_{it}} - \\pi_{x_i t})`, ``(K,L,V)``
    (averaged over the rows, so it estimates :func:`longwrong_true_gradient`)."""
    K, L, V = theta.shape
    p = _softmax(theta)
    B = len(s["x"])
    grad = np.zeros((K, L, V))
    rows, ts = np.nonzero(s["mask"])
    a = adv[rows, ts]
    np.add.at(grad, (s["x"][rows], ts), -a[:, None] * p[s["x"][rows], ts])
    np.add.at(grad, (s["x"][rows], ts, s["tokens"][rows, ts]), a)
    return grad / B


def longwrong_nsr(task: LongWrongTask, group_size: int, baseline: str, n_draws: int = 2000, seed: int = 0) -> dict:
    """Noise-to-signal ratio of one step's gradient (all prompts, ``group_size`` responses each) at the
    initial policy, by Monte Carlo over ``n_draws`` steps: ``nsr`` is
    :math:`\\mathrm{tr\\,Cov}(\\hat g) / \\|\\mathbb E\\hat g\\|^2` (unchanged if the advantages are rescaled, as
    :func:`~rlcourse.methods.otb.tabular_gradient_variance` defines it), ``nsr_true`` divides by
    :math:`\\|\\nabla J\\|^2` instead, and ``cos`` is the cosine between the average estimate and the exact
    gradient."""
    rng = np.random.default_rng(seed)
    theta = task.theta
    true = longwrong_true_gradient(theta).ravel()
    gs = np.stack([longwrong_gradient(theta, s, longwrong_advantages(theta, s, group_size, baseline)).ravel()
                   for s in (longwrong_sample(theta, group_size, rng) for _ in range(n_draws))])
    mean = gs.mean(0)
    var = float(((gs - mean) ** 2).sum(1).mean())
    return {"nsr": var / float(mean @ mean), "nsr_true": var / float(true @ true),
            "cos": float(mean @ true / np.linalg.norm(mean) / np.linalg.norm(true))}


def run_longwrong(task: LongWrongTask, baseline: str, group_size: int, steps: int, lr: float, seed: int,
                  optimizer: str = "adam", betas: tuple = (0.9, 0.999), eps: float = 1e-8) -> dict:
    """Policy-gradient ascent on the logits of :class:`LongWrongTask` (no gradient clipping), with Adam
    (default; bias-corrected, ``betas``, ``eps``), as the paper trains, or plain SGD (``optimizer="sgd"``).

    Adam divides each coordinate's step by its running gradient scale, so a baseline that only shrinks
    the expected gradient by a constant (the group mean's :math:`(N-1)/N`) does not shorten the step; with
    SGD at one learning rate it does, and a comparison of baselines then mixes step length with noise.

    ============ =============== ===========================================
    key          shape           meaning
    ============ =============== ===========================================
    reward       ``(steps+1,)``  exact expected reward (mean over prompts), before each step and at the end
    tokens       ``(steps+1,)``  tokens generated so far (0 first)
    grad_norm    ``(steps,)``    norm of each step's gradient estimate
    ============ =============== ===========================================
    """
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    if not (lr > 0 and np.isfinite(lr)):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    rng = np.random.default_rng(seed)
    theta = task.theta.copy()
    m1, m2 = np.zeros_like(theta), np.zeros_like(theta)
    reward, tokens, gnorm = [float(longwrong_value(theta)[0].mean())], [0.0], []
    for k in range(1, steps + 1):
        s = longwrong_sample(theta, group_size, rng)
        g = longwrong_gradient(theta, s, longwrong_advantages(theta, s, group_size, baseline))
        gnorm.append(float(np.linalg.norm(g)))
        if optimizer == "sgd":
            theta += lr * g
        else:
            m1 = betas[0] * m1 + (1 - betas[0]) * g
            m2 = betas[1] * m2 + (1 - betas[1]) * g * g
            theta += lr * (m1 / (1 - betas[0] ** k)) / (np.sqrt(m2 / (1 - betas[1] ** k)) + eps)
        tokens.append(tokens[-1] + float(s["mask"].sum()))
        reward.append(float(longwrong_value(theta)[0].mean()))
    return {"reward": np.array(reward), "tokens": np.array(tokens), "grad_norm": np.array(gnorm)}


LR_GRID = (0.03, 0.05, 0.07, 0.1, 0.15, 0.2)  # Adam learning rates the rule below chooses from
SELECTION_SEEDS = 100  # the learning rate is chosen on seeds 100, 101, ...; the reported runs use 0, 1, ...


def choose_longwrong_lr(task: LongWrongTask, steps: int, n_seeds: int, grid=LR_GRID, margin: float = 0.02,
                        first_seed: int = SELECTION_SEEDS) -> dict:
    """The rule that fixes the Adam learning rate before the reported runs, on seeds disjoint from them.

    The smallest rate of ``grid`` at which the positive control can work: the oracle baseline with
    N = 4 ends ``steps`` steps within ``margin`` of the group mean with N = 32, on average over the
    ``n_seeds`` selection seeds ``first_seed, first_seed + 1, ...`` (the largest rate if none does). A larger
    rate saturates every arm near reward 1, where no baseline can be told from another, so the
    smallest qualifying rate is the one that leaves the most room to see a difference.

    ======== ==================== ============================================
    key      shape                meaning
    ======== ==================== ============================================
    lr       float                the chosen rate
    gaps     ``(len(grid),)``     oracle-4 minus mean-32 at ``steps``, per rate
    seeds    list                 the selection seeds
    grid     tuple                the rates tried
    ======== ==================== ============================================
    """
    if n_seeds < 1 or steps < 1:
        raise ValueError(f"need n_seeds >= 1 and steps >= 1, got {n_seeds}, {steps}")
    seeds = list(range(first_seed, first_seed + n_seeds))
    gaps = []
    for lr in grid:
        at = {b: np.mean([run_longwrong(task, b, N, steps, lr, sd)["reward"][steps] for sd in seeds])
              for b, N in (("oracle", 4), ("mean", 32))}
        gaps.append(float(at["oracle"] - at["mean"]))
    ok = [lr for lr, gap in zip(grid, gaps) if abs(gap) <= margin]
    return {"lr": float(ok[0] if ok else grid[-1]), "gaps": np.array(gaps), "seeds": seeds, "grid": tuple(grid)}


def run_longwrong_experiment(prof: Profile, sgd_lr: float = 3.0) -> dict:
    """OTB against the group mean on :class:`LongWrongTask`, over ``prof.toy_seeds`` seeds (0, 1, ...).

    1. ``nsr``: noise-to-signal ratio and cosine of one step's gradient at the initial policy for the
       group mean (N = 4, 32), OTB (N = 4, with and without the zero-tail rule), the exact
       variance-optimal per-context baseline (``oracle``, N = 4) and no baseline.
    2. ``choice``: :func:`choose_longwrong_lr` on seeds 100, 101, ... (as many as the reported ones).
    3. ``runs``: Adam on the logits at the chosen rate, no gradient clipping: the group mean with
       N = 32 for ``steps`` steps; the group mean, OTB and the oracle with N = 4 for ``8 * steps``
       steps (about the same tokens as N = 32). Per arm ``(seeds, ...)`` arrays of
       :func:`run_longwrong`'s keys.
    4. ``sgd``: the earlier protocol, plain SGD at ``sgd_lr`` for ``steps`` steps (mean-32, mean-4,
       OTB-4, oracle-4), kept to show what a fixed SGD step does to the comparison, and
       ``"mean-4 rescaled"``: the group mean at N = 4 with the rate multiplied by (31/32) / (3/4), which
       equalises its expected step with N = 32's.
    5. ``per_seed``: the claims' metrics (see :func:`otb_verdicts`).
    """
    import time
    task = LongWrongTask()
    seeds = prof.toy_seeds
    steps = prof.pick(smoke=5, book=40, full=80)
    t0 = time.perf_counter()
    n_draws = prof.pick(smoke=50, book=500, full=4000)
    nsr = {f"{b}-{N}": longwrong_nsr(task, N, b, n_draws=n_draws, seed=1)
           for b, N in [("mean", 4), ("otb", 4), ("otb_tail", 4), ("oracle", 4), ("none", 4), ("mean", 32)]}
    choice = choose_longwrong_lr(task, steps, seeds)
    lr = choice["lr"]
    arms = {"mean-32": ("mean", 32, steps), "mean-4": ("mean", 4, 8 * steps), "otb-4": ("otb", 4, 8 * steps),
            "oracle-4": ("oracle", 4, 8 * steps)}
    runs, sgd = {}, {}
    for name, (b, N, S) in arms.items():
        logs = [run_longwrong(task, b, N, S, lr, seed) for seed in range(seeds)]
        runs[name] = {k: np.stack([lg[k] for lg in logs]) for k in logs[0]}
        sgd[name] = np.array([run_longwrong(task, b, N, steps, sgd_lr, seed, optimizer="sgd")["reward"][steps]
                              for seed in range(seeds)])
    sgd["mean-4 rescaled"] = np.array([run_longwrong(task, "mean", 4, steps, sgd_lr * (31 / 32) / (3 / 4), seed,
                                                     optimizer="sgd")["reward"][steps] for seed in range(seeds)])
    per_seed = {"at_steps": {n: runs[n]["reward"][:, steps] for n in arms}, "auc": {}}
    budget = np.minimum(runs["mean-4"]["tokens"][:, -1], runs["otb-4"]["tokens"][:, -1])
    grid = np.linspace(0, 1, 201)
    for n in ("mean-4", "otb-4", "oracle-4"):
        r = runs[n]
        per_seed["auc"][n] = np.array([np.interp(grid * budget[i], r["tokens"][i], r["reward"][i]).mean()
                                       for i in range(seeds)])
    return {"nsr": nsr, "runs": runs, "sgd": sgd, "choice": choice, "per_seed": per_seed,
            "seconds": time.perf_counter() - t0,
            "config": {"steps": steps, "lr": lr, "sgd_lr": sgd_lr, "seeds": seeds, "n_draws": n_draws, "K": task.K,
                       "L": task.L, "V": task.V, "budget": budget}}


# ---------------------------------------------------------------------- the claims
PAPER = "OTB (Li et al., 2026, arXiv:2602.07078)"
_SETTING = ("LongWrongTask: 8 prompts, tabular logits per (prompt, position), up to 16 tokens; right answers short "
            "and confident, wrong ones long and high-entropy; Adam on the logits at a learning rate chosen on seeds "
            "100+ by a rule fixed in advance, no gradient clipping; the logit-gradient proxy is exact here")
_MATCH = ("Our method achieves training stability and matches the performance of large group sizes (N=32) with only "
          "N=4, reducing token consumption by over 65%")
_AT_STEPS = "exact expected reward after the same number of steps (8 prompts per step)"
_AUC = "expected reward averaged over a common token budget (area under reward vs tokens / budget)"


# what the two controls of the headline share: a baseline with N = 4 within 0.02 of the group mean with N = 32
_VS_N32 = dict(paper=PAPER, setting=_SETTING, metric=_AT_STEPS, baseline="group mean, N=32", kind="equivalent",
               margin=0.02, paper_number="-")
CLAIMS = {
    "match": Claim(key="otb/n4-matches-n32", paper=PAPER, source="abstract (arXiv v1)", statement=_MATCH,
                   setting=_SETTING, metric=_AT_STEPS, method="OTB, N=4", baseline="group mean, N=32",
                   kind="equivalent", margin=0.02, control="otb/control-oracle-n4-matches-n32",
                   paper_number="matches N=32 (single-turn and tool-integrated reasoning)"),
    "control": Claim(key="otb/control-oracle-n4-matches-n32", role="positive control", method="oracle baseline, N=4",
                     source="positive control for the abstract's claim (not a claim of the paper)",
                     statement="an unbiased baseline with N=4 can match N=32 on this testbed (the exact "
                               "variance-optimal per-context baseline, an oracle)", **_VS_N32),
    "negative": Claim(key="otb/negative-control-mean-n4-matches-n32", role="negative control", method="group mean, N=4",
                      source="negative control for the abstract's claim (not a claim of the paper)",
                      statement="the plain group mean with N=4 matches N=32 (it must not: otherwise any N=4 baseline "
                                "matches and a 'matches' says nothing about OTB)", **_VS_N32),
    "tokens-control": Claim(key="otb/control-oracle-beats-mean-equal-tokens", role="positive control", paper=PAPER,
                            source="positive control for the token claim (not a claim of the paper)",
                            statement="a better baseline learns faster than the group mean at equal N and equal tokens "
                                      "on this testbed (the oracle)",
                            setting=_SETTING, metric=_AUC, method="oracle baseline, N=4", baseline="group mean, N=4",
                            kind="greater", margin=0.0, paper_number="-"),
    "tokens": Claim(key="otb/equal-tokens", paper=PAPER, source="abstract (arXiv v1)",
                    statement="reducing token consumption by over 65% (at equal tokens, OTB should learn faster "
                              "than the group mean with the same N)",
                    setting=_SETTING, metric=_AUC, method="OTB, N=4", baseline="group mean, N=4", kind="greater",
                    margin=0.0, control="otb/control-oracle-beats-mean-equal-tokens",
                    paper_number="> 65% fewer tokens"),
}


def otb_verdicts(out: dict) -> dict:
    """Evaluate :data:`CLAIMS` on the output of :func:`run_longwrong_experiment`.

    ``match`` rests on both controls: on the oracle's (``control`` must hold) through ``evaluate``, and on
    the negative control (``negative`` must *not* hold: the plain mean at N = 4 must be shown not to match
    N = 32); when the negative control's verdict is anything but "does not hold", ``match`` is
    "uninformative" too, with the reason.
    """
    ps, s = out["per_seed"], out["seconds"]
    a, auc = ps["at_steps"], ps["auc"]
    v = {"control": evaluate(CLAIMS["control"], a["oracle-4"], a["mean-32"], seconds=s),
         "negative": evaluate(CLAIMS["negative"], a["mean-4"], a["mean-32"], seconds=s),
         "tokens-control": evaluate(CLAIMS["tokens-control"], auc["oracle-4"], auc["mean-4"], seconds=s)}
    v["match"] = evaluate(CLAIMS["match"], a["otb-4"], a["mean-32"], seconds=s, control=v["control"])
    if v["match"].verdict != "uninformative" and v["negative"].verdict != "does not hold":
        v["match"] = replace(v["match"], verdict="uninformative", reason=(
            f"its negative control {CLAIMS['negative'].key} came out {v['negative'].verdict!r}, not 'does not hold', "
            f"so a plain N=4 baseline was not shown to fall short; the interval alone would say "
            f"{v['match'].verdict!r}"))
    v["tokens"] = evaluate(CLAIMS["tokens"], auc["otb-4"], auc["mean-4"], seconds=s, control=v["tokens-control"])
    return v
