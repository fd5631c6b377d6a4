"""Thinking Seeds (SOUP): past checkpoints write prefixes, the current policy continues, token ratios
against the true behaviour policy.

Course material for *SOUP: Token-level Single-sample Mix-policy Reinforcement Learning for Large
Language Models*, Lei Yang, Wei Bi, Chenxi Sun, Renren Jin, Deyi Xiong (2026, arXiv:2601.21476),
whose abstract names the method Thinking Seeds. No code is public: the samplers and the objective
below are a reconstruction from the abstract (the chapter says so).

Two registered samplers, built on :mod:`rlcourse.bank`: ``"soup_prefix"`` (half of each group starts
from a bank policy's prefix of 25-50% of its response, the current policy continues) and
``"bank_sequence_mix"`` (half of each group is written wholly by a bank policy: sequence-level
mixing). Both record the true behaviour log-prob of every token in ``batch.logprobs``, so any policy
loss of the loop (PPO-clip ``"vanilla"`` by default) computes token-level ratios against it.

Also here: the exact gradient bias of token-level ratios on a tabular three-token language model
(:func:`expected_gradient`, :func:`bias_experiment`), and the chapter's experiment on two-digit
addition (:func:`run_soup_experiment`) with its claims.
"""
from __future__ import annotations

import copy
import itertools
import time
from typing import Sequence

import numpy as np
import torch

from ..bank import bank_mixed_batch
from ..claims import Claim, Verdict, evaluate
from ..profiles import Profile, one_torch_thread
from ..rollout import register_sampler

PAPER = ("SOUP: Token-level Single-sample Mix-policy Reinforcement Learning for Large Language Models, L. Yang, "
         "W. Bi, C. Sun, R. Jin, D. Xiong (2026, arXiv:2601.21476)")


@register_sampler("soup_prefix")
def soup_prefix_sampler(model, tokenizer, prompts, config, generator, state, step, every: int = 5,
                        max_snapshots: int = 2, which: str = "oldest", seeded: int | None = None,
                        prefix_frac: Sequence[float] = (0.25, 0.5)):
    """Thinking Seeds: ``seeded`` (default ``G // 2``) rows of each group start from a prefix of
    ``prefix_frac`` of a bank policy's response; the current policy continues. See
    :func:`rlcourse.bank.bank_mixed_batch` for the batch it returns."""
    return bank_mixed_batch(model, tokenizer, prompts, config, generator, state, step, every=every,
                            max_snapshots=max_snapshots, which=which, seeded=seeded, prefix_frac=prefix_frac)


@register_sampler("bank_sequence_mix")
def sequence_mix_sampler(model, tokenizer, prompts, config, generator, state, step, every: int = 5,
                         max_snapshots: int = 2, which: str = "oldest", seeded: int | None = None):
    """Sequence-level mixing: ``seeded`` (default ``G // 2``) rows of each group are written wholly by a
    bank policy (``prefix_frac = (1, 1)`` of :func:`rlcourse.bank.bank_mixed_batch`)."""
    return bank_mixed_batch(model, tokenizer, prompts, config, generator, state, step, every=every,
                            max_snapshots=max_snapshots, which=which, seeded=seeded, prefix_frac=(1.0, 1.0))


# ---------------------------------------------------------------------- the tabular three-token model
V, T3 = 3, 3  # vocabulary and length of the tabular model
SEQS = np.array(list(itertools.product(range(V), repeat=T3)))  # (27, 3) every sequence


def _context_index(prefix: Sequence[int]) -> int:
    """Contexts are the prefixes of length 0, 1, 2: index 0, then ``1 + a``, then ``1 + V + a V + b``."""
    return int(sum(V**i for i in range(len(prefix))) + sum(a * V**(len(prefix) - 1 - i) for i, a in enumerate(prefix)))


N_CTX = sum(V**i for i in range(T3))  # 13
CTX = np.array([[_context_index(y[:t]) for t in range(T3)] for y in SEQS])  # (27, 3)


def softmax(theta: np.ndarray) -> np.ndarray:
    z = np.exp(theta - theta.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def token_probs(theta: np.ndarray) -> np.ndarray:
    """``(27, 3)``: ``pi(y_t | y_<t)`` of every token of every sequence, for logits ``theta`` ``(13, V)``."""
    if theta.shape != (N_CTX, V):
        raise ValueError(f"theta must have shape {(N_CTX, V)}, got {theta.shape}")
    return softmax(theta)[CTX, SEQS]


def score_functions(theta: np.ndarray) -> np.ndarray:
    """``(27, 3, 13, V)``: ``grad_theta log pi(y_t | y_<t)`` = ``e_ctx (e_{y_t} - pi(.|ctx))``."""
    p = softmax(theta)
    out = np.zeros((len(SEQS), T3, N_CTX, V))
    for i, y in enumerate(SEQS):
        for t in range(T3):
            c = CTX[i, t]
            out[i, t, c] = -p[c]
            out[i, t, c, y[t]] += 1.0
    return out


def expected_gradient(theta: np.ndarray, theta_hist: np.ndarray, reward: np.ndarray, cut: int,
                      weighting: str = "token") -> np.ndarray:
    """Exact expectation of the importance-weighted policy gradient when the first ``cut`` tokens come
    from ``pi_hist`` and the rest from ``pi_theta``.

    The estimator is ``sum_t w_t R(y) grad log pi_theta(y_t | y_<t)`` with ``w_t = rho_t`` on prefix
    tokens and 1 after (``weighting="token"``: Thinking Seeds' token-level ratios), or ``w_t =
    prod_{j<cut} rho_j`` for every token (``"sequence"``: the exact correction), ``rho = pi_theta / pi_hist``.

    ========== ============ ============================================
    theta      ``(13, V)``  current logits (one row per context)
    theta_hist ``(13, V)``  the historical policy's logits
    reward     ``(27,)``    reward of every sequence (``SEQS`` order)
    cut        int          prefix length, 0 (on-policy) to 3 (whole sequence)
    returns    ``(13, V)``  the expected gradient
    ========== ============ ============================================
    """
    if not 0 <= cut <= T3:
        raise ValueError(f"cut must be in [0, {T3}], got {cut}")
    if weighting not in ("token", "sequence"):
        raise ValueError(f"weighting must be 'token' or 'sequence', got {weighting!r}")
    reward = np.asarray(reward, dtype=float)
    if reward.shape != (len(SEQS),):
        raise ValueError(f"reward must have shape ({len(SEQS)},), got {reward.shape}")
    pi, h = token_probs(theta), token_probs(theta_hist)
    pre = np.arange(T3) < cut
    mu = np.where(pre, h, pi).prod(1)  # behaviour probability of each sequence
    rho = np.where(pre, pi / h, 1.0)
    w = rho if weighting == "token" else np.repeat(rho.prod(1, keepdims=True), T3, 1)
    return np.einsum("i,i,it,itcv->cv", mu, reward, w, score_functions(theta))


def bias_bound(theta: np.ndarray, theta_hist: np.ndarray, reward: np.ndarray, cut: int) -> float:
    """The bound of the chapter's proposition on ``||E[g_token] - grad J||``:
    ``2 delta sum_t G_t n_t``, with ``delta`` the largest total-variation distance between ``pi_hist``
    and ``pi_theta`` over contexts of the prefix, ``G_t = max_y |R(y)| ||grad log pi(y_t|y_<t)||``,
    ``n_t = cut - 1`` for a prefix token and ``cut`` for a continuation token."""
    p, q = softmax(theta), softmax(theta_hist)
    prefix_ctx = [c for c in range(N_CTX) if c < sum(V**i for i in range(cut))]
    delta = max((0.5 * np.abs(p[c] - q[c]).sum() for c in prefix_ctx), default=0.0)
    norms = np.sqrt((score_functions(theta) ** 2).sum((2, 3)))  # (27, 3)
    G = (np.abs(np.asarray(reward))[:, None] * norms).max(0)
    n = np.where(np.arange(T3) < cut, cut - 1, cut)
    return float(2 * delta * (G * n).sum())


def ascent_trajectory(reward: np.ndarray, steps: int, lr: float, seed: int) -> np.ndarray:
    """``(steps + 1, 13, V)``: logits of exact policy-gradient ascent on ``J = E_pi[R]`` from random
    logits (``N(0, 1)``): the checkpoints a bank would hold, one per step."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=(N_CTX, V))
    out = [theta]
    for _ in range(steps):
        theta = theta + lr * expected_gradient(theta, theta, reward, 0)
        out.append(theta)
    return np.stack(out)


def monte_carlo_gradient(theta: np.ndarray, theta_hist: np.ndarray, reward: np.ndarray, cut: int, n: int,
                         seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The token-level gradient estimated from ``n`` sampled sequences *through the loop's own policy
    loss* (``"pg"``, the unclipped surrogate ``-rho A``, aggregated ``seq-mean-token-sum``), with the
    behaviour log-probs recorded at sampling time; returns the mean and its standard error per entry."""
    from ..losses import get_policy_loss

    rng = np.random.default_rng(seed)
    p_cur, p_hist = softmax(theta), softmax(theta_hist)
    ys = np.zeros((n, T3), dtype=int)
    for t in range(T3):
        ctx = np.array([_context_index(y[:t]) for y in ys])
        probs = (p_hist if t < cut else p_cur)[ctx]
        ys[:, t] = (rng.random((n, 1)) > probs.cumsum(1)).sum(1).clip(max=V - 1)
    rows = np.array([int(np.ravel_multi_index(tuple(y), (V,) * T3)) for y in ys])
    ctx = torch.as_tensor(CTX[rows])
    tok = torch.as_tensor(ys)
    behaviour = torch.as_tensor(np.log(np.where(np.arange(T3) < cut, token_probs(theta_hist), token_probs(theta))[rows]))
    logits = torch.tensor(theta, requires_grad=True)
    logp = torch.log_softmax(logits, -1)[ctx, tok]
    adv = torch.as_tensor(reward[rows], dtype=torch.float64)[:, None].expand(n, T3)
    loss, _ = get_policy_loss("pg")(old_log_prob=behaviour, log_prob=logp, advantages=adv,
                                    response_mask=torch.ones(n, T3, dtype=torch.float64),
                                    loss_agg_mode="seq-mean-token-sum")
    (g,) = torch.autograd.grad(-loss, logits)
    # per-sample values for the standard error (the same estimator, written out)
    pre = np.arange(T3) < cut
    rho = np.where(pre, token_probs(theta)[rows] / token_probs(theta_hist)[rows], 1.0)
    per = np.einsum("i,it,itcv->icv", reward[rows], rho, score_functions(theta)[rows])
    return g.numpy(), per.std(0, ddof=1) / np.sqrt(n)


def bias_experiment(prof: Profile) -> dict:
    """Relative bias ``||E[g] - grad J|| / ||grad J||`` of the token-level gradient against the lag of the
    historical policy, for prefix lengths 0 to 3 (3 = sequence-level mixing), on random instances
    (rewards ``U[0, 1]``, a fresh ascent trajectory each), plus the exact sequence-level correction and
    the proposition's bound.

    ============ ================== =================================================
    lags         ``(L,)``           checkpoint lags (steps of the ascent)
    bias[cut]    ``(N, L)``         relative bias of token-level ratios, cut = 0..3
    seq_bias     ``(N, L)``         relative bias with the full prefix product (cut 3)
    bound_ok     bool               every bias below its bound (cut 1..3, every lag)
    ============ ================== =================================================
    """
    n = prof.pick(smoke=3, book=20)
    steps, lr = 30, 2.0
    lags = list(range(0, steps + 1, 3))
    t0 = time.perf_counter()
    bias = {cut: np.zeros((n, len(lags))) for cut in range(T3 + 1)}
    seq_bias = np.zeros((n, len(lags)))
    bound_ok = True
    for i in range(n):
        reward = np.random.default_rng(1000 + i).random(len(SEQS))
        traj = ascent_trajectory(reward, steps, lr, seed=i)
        cur = traj[-1]
        g = expected_gradient(cur, cur, reward, 0)
        for j, lag in enumerate(lags):
            hist = traj[steps - lag]
            for cut in range(T3 + 1):
                err = np.linalg.norm(expected_gradient(cur, hist, reward, cut) - g)
                bias[cut][i, j] = err / np.linalg.norm(g)
                if cut and err > bias_bound(cur, hist, reward, cut) + 1e-12:
                    bound_ok = False
            seq_bias[i, j] = np.linalg.norm(expected_gradient(cur, hist, reward, T3, "sequence") - g) / np.linalg.norm(g)
    return {"lags": np.array(lags), "bias": bias, "seq_bias": seq_bias, "bound_ok": bound_ok, "instances": n,
            "steps": steps, "lr": lr, "seconds": time.perf_counter() - t0}


TABULAR_LAG = 15  # the lag at which the tabular claim is read (half the ascent), fixed before the run

BIAS_CLAIM = Claim(
    key="thinking_seeds/prefix-bias-below-sequence", paper=PAPER,
    statement="existing methods mix entire trajectories at the sequence level, introducing severe policy mismatch "
              "... the critical continuation is generated on-policy to preserve gradient quality",
    source="abstract (the bias computation is the course's reconstruction)",
    setting=f"tabular 3-token LM (V = 3), exact expectations; current policy after 30 steps of exact ascent, the "
            f"historical one {TABULAR_LAG} steps behind",
    metric="relative bias of the token-level gradient, ||E g - grad J|| / ||grad J||",
    method="prefix of 1 token (Thinking Seeds)", baseline="whole sequence historical (sequence-level mixing)",
    kind="less", margin=0.0, replicate="instance")


def bias_verdict(res: dict) -> Verdict:
    j = int(np.searchsorted(res["lags"], TABULAR_LAG))
    return evaluate(BIAS_CLAIM, res["bias"][1][:, j], res["bias"][T3][:, j], seconds=res["seconds"])


# ---------------------------------------------------------------------- the language-model experiment
ARMS = {"GRPO": "policy", "sequence mixing": "bank_sequence_mix", "Thinking Seeds": "soup_prefix"}


def experiment_sizes(prof: Profile) -> dict:
    """The experiment's sizes: the bank keeps a snapshot every 5 steps, at most 2, and the oldest
    writes (a lag of 5 to 9 steps once it is full)."""
    return prof.pick(
        smoke=dict(steps=3, prompts_per_step=4, num_generations=4, eval_prompts=8, n=4, ks=[1, 2, 4],
                   seeds=[0], lr=1e-4, every=1, max_snapshots=2),
        book=dict(steps=40, prompts_per_step=16, num_generations=8, eval_prompts=64, n=16, ks=[1, 2, 4, 8, 16],
                  seeds=list(range(prof.seeds)), lr=1e-4, every=5, max_snapshots=2))


CURVES = ("passk", "held_entropy", "entropy", "clipfrac", "reward", "bank_share", "log_ratio")


def held_out_entropy(model, tokenizer, examples, seed: int, n: int = 4) -> float:
    """Mean token entropy of ``model``'s own samples (``n`` per prompt, temperature 1) on ``examples``:
    the policy's effective entropy where every arm is measured alike."""
    from ..lm.sampling import sample

    b = sample(model, tokenizer, [e.prompt for e in examples], num_generations=n, max_new_tokens=10,
               generator=torch.Generator().manual_seed(10_000 + seed))
    return float(b.entropy.sum() / b.response_mask.sum())


def run_soup_experiment(prof: Profile) -> dict:
    """GRPO, sequence-level mixing and Thinking Seeds from the same ``addition`` base model, same
    optimiser, learning rate, steps and prompts, over paired seeds; after training, pass@k on
    held-out prompts (``n`` samples each, temperature 1) and the training curves.

    ================== ============= ==============================================================
    passk[arm]         ``(N, K)``    pass@k for k in ``ks`` per seed
    base_passk         ``(K,)``      the base model's
    held_entropy[arm]  ``(N,)``      mean token entropy of the trained policy's own held-out samples
    entropy[arm]       ``(N, S)``    the current policy's mean token entropy at each step
    clipfrac[arm]      ``(N, S)``    PPO's clipped share of tokens at each step
    reward[arm]        ``(N, S)``    mean training reward at each step
    bank_share[arm]    ``(N, S)``    share of tokens written by the bank (0 for GRPO)
    log_ratio[arm]     ``(N, S)``    mean log pi_current - log pi_writer on bank tokens, at sampling
    ================== ============= ==============================================================
    """
    from ..lm.zoo import load_base_model
    from ..tasks import get_task
    from ..testtime import evaluate_samples, pass_at_k_curve
    from ..train import RLConfig, Trainer

    z = experiment_sizes(prof)
    t0 = time.perf_counter()
    with one_torch_thread():
        base, tok = load_base_model("addition", "medium", prof=prof, progress=False)
        task = get_task("addition")
        held = task.examples(z["eval_prompts"], seed=2000, split="test")
        ev = evaluate_samples(base, tok, held, z["n"], 10, torch.Generator().manual_seed(0))
        out = {"ks": z["ks"], "sizes": z, "base_passk": pass_at_k_curve(ev["correct"], z["ks"]),
               **{key: {arm: [] for arm in ARMS} for key in CURVES}}
        for seed in z["seeds"]:
            pool = task.examples(4000, seed=seed, split="train")
            for arm, sampler in ARMS.items():
                torch.manual_seed(seed)
                kw = {} if sampler == "policy" else {"every": z["every"], "max_snapshots": z["max_snapshots"]}
                cfg = RLConfig(num_generations=z["num_generations"], prompts_per_step=z["prompts_per_step"],
                               max_completion_length=10, steps=z["steps"], learning_rate=z["lr"], seed=seed,
                               progress=False, sampler=sampler, sampler_kwargs=kw)
                tr = Trainer(copy.deepcopy(base), tok, task, cfg, train_examples=pool, eval_examples=held[:8])
                tr.train()
                ev = evaluate_samples(tr.model, tok, held, z["n"], 10, torch.Generator().manual_seed(1 + seed))
                out["passk"][arm].append(pass_at_k_curve(ev["correct"], z["ks"]))
                out["held_entropy"][arm].append(held_out_entropy(tr.model, tok, held, seed))
                h = tr.history
                out["entropy"][arm].append([m["entropy"] for m in h])
                out["clipfrac"][arm].append([m.get("pg_clipfrac", 0.0) for m in h])
                out["reward"][arm].append([m["reward"] for m in h])
                # the bank samplers log their per-step measurements in the trainer's history (batch.metrics)
                out["bank_share"][arm].append([m.get("bank_token_share", 0.0) for m in h])
                out["log_ratio"][arm].append([m.get("bank_prefix_log_ratio", 0.0) for m in h])
    for key in CURVES:
        out[key] = {arm: np.asarray(v, dtype=float) for arm, v in out[key].items()}
    out["seeds"] = len(z["seeds"])
    out["seconds"] = time.perf_counter() - t0
    return out


_SETTING = ("tiny LM (0.6M) on 2-digit addition from the 'medium' base model; G = 8 (4 seeded), 16 prompts x 40 "
            "steps, AdamW lr 1e-4, PPO-clip 0.2, one pass per batch; bank: a snapshot every 5 steps, 2 kept, the "
            "oldest writes; prefixes 25-50% of the writer's response; 64 held-out prompts x 16 samples")


CONTROL_KEY = "thinking_seeds/control-grpo-learns"


def _claim(name, statement, metric, method, baseline, kind="greater", control=CONTROL_KEY):
    return Claim(key=f"thinking_seeds/lm-{name}", paper=PAPER, statement=statement, source="abstract",
                 setting=_SETTING, metric=metric, method=method, baseline=baseline, kind=kind, margin=0.0,
                 control=control)


_OUTPERFORMS = "Thinking Seeds consistently outperforms standard on-policy training and existing off-policy extensions"
LM_CLAIMS = {
    "vs-grpo": _claim("beats-grpo", _OUTPERFORMS, "held-out pass@1 after training", "Thinking Seeds", "GRPO"),
    "vs-sequence": _claim("beats-sequence-mixing", _OUTPERFORMS, "held-out pass@1 after training", "Thinking Seeds",
                          "sequence mixing"),
    "entropy": _claim("higher-entropy", "the method maintains higher effective entropy",
                      "mean token entropy of the trained policy's own samples on the held-out prompts",
                      "Thinking Seeds", "GRPO"),
    "clipping": _claim("less-clipping", "[the method] reduces gradient loss from clipping",
                       "share of clipped tokens, mean over training", "Thinking Seeds", "sequence mixing", kind="less",
                       control=None),
    "pass-at-k": _claim("expands-solution-space", "[the method] expands the explorable solution space",
                        "held-out pass@16 after training", "Thinking Seeds", "GRPO"),
    "control": Claim(key="thinking_seeds/control-grpo-learns", role="positive control", paper=PAPER,
                     statement="(control, not a claim of the paper) GRPO raises pass@1 over the base model",
                     source="positive control of the experiment", setting=_SETTING,
                     metric="held-out pass@1 after training", method="GRPO", baseline="base model",
                     kind="greater", margin=0.0),
}


def soup_verdicts(res: dict) -> dict[str, Verdict]:
    """The claims of :data:`LM_CLAIMS`, evaluated on :func:`run_soup_experiment`'s output. The
    performance claims rest on the control that GRPO learns at all (uninformative otherwise); the
    clipping claim, a count of clipped tokens, does not."""
    ks, s = list(res["ks"]), res["seconds"]
    p1, pk = ks.index(1), len(ks) - 1
    pa, ts, sq, gr = res["passk"], "Thinking Seeds", "sequence mixing", "GRPO"
    control = evaluate(LM_CLAIMS["control"], pa[gr][:, p1], np.full(res["seeds"], res["base_passk"][p1]), seconds=s)
    c = {"control": control}
    return {
        "vs-grpo": evaluate(LM_CLAIMS["vs-grpo"], pa[ts][:, p1], pa[gr][:, p1], seconds=s, **c),
        "vs-sequence": evaluate(LM_CLAIMS["vs-sequence"], pa[ts][:, p1], pa[sq][:, p1], seconds=s, **c),
        "entropy": evaluate(LM_CLAIMS["entropy"], res["held_entropy"][ts], res["held_entropy"][gr], seconds=s, **c),
        "clipping": evaluate(LM_CLAIMS["clipping"], res["clipfrac"][ts].mean(1), res["clipfrac"][sq].mean(1), seconds=s),
        "pass-at-k": evaluate(LM_CLAIMS["pass-at-k"], pa[ts][:, pk], pa[gr][:, pk], seconds=s, **c),
        "control": control,
    }
