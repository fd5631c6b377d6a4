"""Softmax bandits: the policy gradient and KL control where every expectation can be enumerated.

A softmax bandit has ``K`` arms, a policy :math:`\\pi_\\theta = \\mathrm{softmax}(\\theta)` over them
and a reward whose mean given arm ``a`` is ``means[a]``: a Bernoulli outcome (``reward_noise=
"bernoulli"``, the 0/1 reward of a verifier) or the mean itself (``"none"``). Because there are only
``K`` actions, the exact gradient, the exact mean and variance of any per-sample estimator, and the
KL-regularised optimum are finite sums; Monte Carlo estimators can be checked against them.

The foundations chapters use it twice: :func:`run_baseline_experiment` (REINFORCE with and
without baselines) and :func:`run_kl_experiment` (KL to a reference in the reward or in the loss,
with the four estimators of :func:`rlcourse.losses.kl_penalty`). All tensors are float64.
"""
from __future__ import annotations

import itertools
import time

import numpy as np
import torch

from .claims import Claim, evaluate
from .losses import kl_penalty
from .profiles import Profile, one_torch_thread, profile as current_profile

DTYPE = torch.float64
BASELINES = ("none", "batch_mean", "loo", "optimal", "value")
KL_PLACEMENTS = ("k1-reward", "k1-loss", "k2-loss", "k3-loss", "k3+-loss")


# ---------------------------------------------------------------------------- checks
def _logits(theta, name: str = "theta") -> torch.Tensor:
    if not isinstance(theta, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(theta).__name__}")
    if theta.ndim != 1 or theta.shape[0] < 2:
        raise ValueError(f"{name} must be a vector of K >= 2 logits, got shape {tuple(theta.shape)}")
    if not torch.isfinite(theta).all():
        raise ValueError(f"{name} contains NaN or inf")
    return theta.to(DTYPE)


def _means(means, K: int) -> torch.Tensor:
    if not isinstance(means, torch.Tensor):
        raise TypeError(f"means must be a torch.Tensor, got {type(means).__name__}")
    if tuple(means.shape) != (K,):
        raise ValueError(f"means must have shape ({K},) to match the logits, got {tuple(means.shape)}")
    return means.to(DTYPE)


def _second_moments(means: torch.Tensor, reward_noise: str) -> torch.Tensor:
    """E[r^2 | a]: ``means`` for Bernoulli rewards (r^2 = r), ``means**2`` for deterministic ones."""
    if reward_noise == "bernoulli":
        if ((means < 0) | (means > 1)).any():
            raise ValueError("Bernoulli rewards need means in [0, 1]")
        return means
    if reward_noise == "none":
        return means**2
    raise ValueError(f"unknown reward_noise {reward_noise!r}; choose 'bernoulli' or 'none'")


# ---------------------------------------------------------------------------- exact quantities
def expected_reward(theta: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
    """:math:`J(\\theta) = \\sum_a \\pi_\\theta(a)\\, \\bar r(a)`, exactly (differentiable).

    ======= ======== ===========================
    theta   ``(K,)`` logits of the policy
    means   ``(K,)`` mean reward of each arm
    returns scalar   expected reward
    ======= ======== ===========================
    """
    theta = _logits(theta)
    return (torch.softmax(theta, -1) * _means(means, theta.shape[0])).sum()


def exact_policy_gradient(theta: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
    """:math:`\\nabla_\\theta J = \\pi \\odot (\\bar r - J)`, the gradient of :func:`expected_reward`
    with respect to the logits, in closed form.

    ======= ======== ===========================
    theta   ``(K,)`` logits
    means   ``(K,)`` mean reward of each arm
    returns ``(K,)`` exact gradient
    ======= ======== ===========================
    """
    theta = _logits(theta)
    pi, m = torch.softmax(theta, -1), _means(means, theta.shape[0])
    return pi * (m - (pi * m).sum())


def score_vectors(theta: torch.Tensor) -> torch.Tensor:
    """The score :math:`\\nabla_\\theta\\log\\pi_\\theta(a) = e_a - \\pi` of every arm (row ``a``).

    ======= ========== =====================================
    theta   ``(K,)``   logits
    returns ``(K,K)``  row a: gradient of log pi(a) wrt theta
    ======= ========== =====================================
    """
    theta = _logits(theta)
    pi = torch.softmax(theta, -1)
    return torch.eye(theta.shape[0], dtype=DTYPE) - pi.unsqueeze(0)


def optimal_baseline(theta: torch.Tensor, means: torch.Tensor) -> float:
    """The constant baseline that minimises the total variance of the one-sample REINFORCE
    estimator: :math:`b^* = \\mathbb{E}[\\bar r(a)\\,\\|s(a)\\|^2] / \\mathbb{E}[\\|s(a)\\|^2]`, with
    :math:`s(a) = e_a - \\pi` (the same for Bernoulli and deterministic rewards).

    ======= ======== ===========================
    theta   ``(K,)`` logits
    means   ``(K,)`` mean reward of each arm
    returns float    b*
    ======= ======== ===========================
    """
    theta = _logits(theta)
    pi, m = torch.softmax(theta, -1), _means(means, theta.shape[0])
    w = pi * (score_vectors(theta) ** 2).sum(-1)
    return float((w * m).sum() / w.sum())


def estimator_moments(theta: torch.Tensor, means: torch.Tensor, baseline: float = 0.0,
                      reward_noise: str = "bernoulli") -> tuple[torch.Tensor, float]:
    """Exact mean and total variance (trace of the covariance) of the one-sample estimator
    :math:`g = (r - b)\\, s(a)`, :math:`a \\sim \\pi_\\theta`, by enumeration over the arms.

    ============ ======== ===================================================
    theta        ``(K,)`` logits
    means        ``(K,)`` mean reward of each arm
    baseline     float    constant b (does not depend on the sampled arm)
    reward_noise str      ``"bernoulli"`` (r in {0,1}) or ``"none"`` (r = mean)
    returns               (``(K,)`` mean, float total variance)
    ============ ======== ===================================================
    """
    theta = _logits(theta)
    pi, m = torch.softmax(theta, -1), _means(means, theta.shape[0])
    m2 = _second_moments(m, reward_noise)
    b = float(baseline)
    S = score_vectors(theta)
    mean = (pi * (m - b)).unsqueeze(-1).mul(S).sum(0)
    second = (pi * (m2 - 2 * b * m + b * b) * (S**2).sum(-1)).sum()
    return mean, float(second - (mean**2).sum())


# ---------------------------------------------------------------------------- Monte Carlo
def sample_bandit(theta: torch.Tensor, means: torch.Tensor, n: int, generator: torch.Generator,
                  reward_noise: str = "bernoulli") -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``n`` arms from :math:`\\pi_\\theta` and their rewards.

    ========= ======== ==================================
    theta     ``(K,)`` logits
    means     ``(K,)`` mean reward of each arm
    n         int      number of samples
    returns            (``(n,)`` long arms, ``(n,)`` float64 rewards)
    ========= ======== ==================================
    """
    theta = _logits(theta)
    m = _means(means, theta.shape[0])
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    actions = torch.multinomial(torch.softmax(theta, -1), n, replacement=True, generator=generator)
    _second_moments(m, reward_noise)  # validates reward_noise
    if reward_noise == "bernoulli":
        rewards = (torch.rand(n, dtype=DTYPE, generator=generator) < m[actions]).to(DTYPE)
    else:
        rewards = m[actions].clone()
    return actions, rewards


def batch_baselines(rewards: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-sample baselines computed from the batch itself.

    ``batch_mean`` includes the sample's own reward (as the ``reinforce_baseline`` estimator does);
    ``loo`` (leave-one-out, RLOO) averages the *other* samples, so it does not depend on the sample.

    ======= =========== =============================================
    rewards ``(...,N)`` rewards of one batch (last dim); N >= 2 for loo
    kind    str         ``none``, ``batch_mean`` or ``loo``
    returns             ``(...,N)`` baseline of each sample
    ======= =========== =============================================
    """
    N = rewards.shape[-1]
    if kind == "none":
        return torch.zeros_like(rewards)
    if kind == "batch_mean":
        return rewards.mean(-1, keepdim=True).expand_as(rewards)
    if kind == "loo":
        if N < 2:
            raise ValueError("the leave-one-out baseline needs N >= 2 samples per batch")
        return (rewards.sum(-1, keepdim=True) - rewards) / (N - 1)
    raise ValueError(f"unknown batch baseline {kind!r}; choose none, batch_mean or loo")


def reinforce_estimates(theta: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor,
                        baseline: torch.Tensor | float = 0.0) -> torch.Tensor:
    """Per-sample REINFORCE estimates :math:`g_i = (r_i - b_i)(e_{a_i} - \\pi)`; their mean over
    the batch is the batch estimate of :math:`\\nabla_\\theta J`.

    ========= ============== ===========================================
    theta     ``(K,)``       logits
    actions   ``(N,)``       sampled arms
    rewards   ``(N,)``       their rewards
    baseline  float/``(N,)`` constant or per-sample baseline
    returns   ``(N,K)``      one gradient estimate per sample
    ========= ============== ===========================================
    """
    theta = _logits(theta)
    if actions.ndim != 1 or rewards.shape != actions.shape:
        raise ValueError(f"actions {tuple(actions.shape)} and rewards {tuple(rewards.shape)} must both be (N,)")
    b = torch.as_tensor(baseline, dtype=DTYPE)
    if b.ndim not in (0, 1) or (b.ndim == 1 and b.shape != rewards.shape):
        raise ValueError(f"baseline must be a scalar or have shape {tuple(rewards.shape)}, got {tuple(b.shape)}")
    return (rewards.to(DTYPE) - b).unsqueeze(-1) * score_vectors(theta)[actions]


# ---------------------------------------------------------------------------- sequences
def enumerate_sequences(vocab: int, length: int) -> torch.Tensor:
    """All ``vocab**length`` token sequences, one per row (``(S, L)`` long)."""
    if vocab < 2 or length < 1:
        raise ValueError(f"need vocab >= 2 and length >= 1, got {vocab}, {length}")
    return torch.tensor(list(itertools.product(range(vocab), repeat=length)), dtype=torch.long)


def markov_token_scores(theta: torch.Tensor, seqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs and token scores of a tabular autoregressive policy
    :math:`\\pi(y_t \\mid y_{t-1}) = \\mathrm{softmax}(\\theta[t, y_{t-1}])` (with :math:`y_0 := 0`).

    ======= =============== ==========================================================
    theta   ``(L,V,V)``     logits: position, previous token, next token
    seqs    ``(S,L)``       token sequences
    returns                 (``(S,L)`` log pi(y_t | y_{t-1}),
                            ``(S,L,D)`` gradient of each token's log-prob wrt theta, D = L*V*V)
    ======= =============== ==========================================================
    """
    if theta.ndim != 3 or theta.shape[1] != theta.shape[2]:
        raise ValueError(f"theta must be (L, V, V), got {tuple(theta.shape)}")
    L, V, _ = theta.shape
    if seqs.ndim != 2 or seqs.shape[1] != L:
        raise ValueError(f"seqs must be (S, {L}), got {tuple(seqs.shape)}")
    S = seqs.shape[0]
    prev = torch.cat([torch.zeros(S, 1, dtype=torch.long), seqs[:, :-1]], 1)
    logp_table = torch.log_softmax(theta.to(DTYPE), -1)
    pos = torch.arange(L).expand(S, L)
    logp = logp_table[pos, prev, seqs]
    grads = torch.zeros(S, L, L, V, V, dtype=DTYPE)
    probs = logp_table.exp()
    for t in range(L):
        g = -probs[t, prev[:, t]]  # (S, V)
        g[torch.arange(S), seqs[:, t]] += 1.0
        grads[torch.arange(S), t, t, prev[:, t]] = g
    return logp, grads.reshape(S, L, -1)


def sequence_estimator_moments(theta: torch.Tensor, token_rewards: torch.Tensor) -> dict:
    """Exact mean and total variance of two REINFORCE estimators for a sequence policy with
    per-token rewards, by enumeration over all sequences:

    * ``full``: :math:`(\\sum_t r_t) \\sum_s \\nabla\\log\\pi(y_s\\mid\\cdot)`;
    * ``reward_to_go``: :math:`\\sum_s (\\sum_{t \\ge s} r_t)\\, \\nabla\\log\\pi(y_s\\mid\\cdot)`.

    ============== =========== ======================================================
    theta          ``(L,V,V)`` logits of the tabular policy (:func:`markov_token_scores`)
    token_rewards  ``(S,L)``   r_t of every enumerated sequence (rows in the order of
                               :func:`enumerate_sequences`); r_t may depend on y_<=t only
    returns                    dict name -> (``(D,)`` mean, float total variance), plus ``"exact"``:
                               the gradient of E[sum_t r_t] by autograd
    ============== =========== ======================================================
    """
    L, V, _ = theta.shape
    seqs = enumerate_sequences(V, L)
    if token_rewards.shape != seqs.shape:
        raise ValueError(f"token_rewards must be {tuple(seqs.shape)} (one row per sequence), got "
                         f"{tuple(token_rewards.shape)}")
    logp, grads = markov_token_scores(theta, seqs)
    w = logp.sum(-1).exp()  # probability of each sequence
    r = token_rewards.to(DTYPE)
    est = {"full": r.sum(-1, keepdim=True) * grads.sum(1),
           "reward_to_go": (r.flip(-1).cumsum(-1).flip(-1).unsqueeze(-1) * grads).sum(1)}
    out = {}
    for name, g in est.items():
        mean = (w.unsqueeze(-1) * g).sum(0)
        out[name] = (mean, float((w * ((g - mean) ** 2).sum(-1)).sum()))
    th = theta.detach().to(DTYPE).clone().requires_grad_()
    lp, _ = markov_token_scores(th, seqs)
    objective = (lp.sum(-1).exp() * r.sum(-1)).sum()
    (exact,) = torch.autograd.grad(objective, th)
    out["exact"] = exact.reshape(-1)
    return out


# ---------------------------------------------------------------------------- KL
def kl_categorical(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """:math:`\\mathrm{KL}(p\\,\\|\\,q) = \\sum_a p_a(\\log p_a - \\log q_a)` over the last dimension.

    ======= =========== ==============================
    logp    ``(...,K)`` normalised log-probs of p
    logq    ``(...,K)`` normalised log-probs of q
    returns ``(...)``   the KL divergence
    ======= =========== ==============================
    """
    if logp.shape != logq.shape:
        raise ValueError(f"shape mismatch: logp {tuple(logp.shape)}, logq {tuple(logq.shape)}")
    return (logp.exp() * (logp - logq)).sum(-1)


def kl_estimator_moments(logp: torch.Tensor, logref: torch.Tensor) -> dict:
    """Exact mean and variance under :math:`a \\sim \\pi` of the per-sample KL estimators of
    :func:`rlcourse.losses.kl_penalty` (k1, k2, k3), by enumeration.

    ======= ======== =====================================
    logp    ``(K,)`` log pi (normalised)
    logref  ``(K,)`` log pi_ref (normalised)
    returns          dict kind -> (mean, variance), floats, for k1, k2, k3 and
                     ``k3_unclamped`` (k3 without the clamp at 10); plus ``"kl"``: the exact KL(pi || ref)
    ======= ======== =====================================
    """
    logp, logref = _logits(logp, "logp"), _logits(logref, "logref")
    if logp.shape != logref.shape:
        raise ValueError(f"shape mismatch: logp {tuple(logp.shape)}, logref {tuple(logref.shape)}")
    p = logp.exp()
    out = {"kl": float(kl_categorical(logp, logref))}
    delta = logp - logref
    values = {kind: kl_penalty(logp, logref, kind).to(DTYPE) for kind in ("k1", "k2", "k3")}
    values["k3_unclamped"] = torch.exp(-delta) + delta - 1  # kl_penalty clamps k3 at 10, as verl does
    for kind, v in values.items():
        mean = (p * v).sum()
        out[kind] = (float(mean), float((p * (v - mean) ** 2).sum()))
    return out


def kl_regularised_optimum(logref: torch.Tensor, means: torch.Tensor, beta: float) -> torch.Tensor:
    """Log-probs of :math:`\\pi^*_\\beta \\propto \\pi_{\\text{ref}}\\exp(\\bar r/\\beta)`, the
    maximiser of :math:`\\mathbb{E}_\\pi[\\bar r] - \\beta\\,\\mathrm{KL}(\\pi\\,\\|\\,\\pi_{\\text{ref}})`.

    ======= ======== =====================================
    logref  ``(K,)`` log pi_ref
    means   ``(K,)`` mean reward of each arm
    beta    float    KL coefficient, > 0
    returns ``(K,)`` log pi*_beta
    ======= ======== =====================================
    """
    logref = _logits(logref, "logref")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    return torch.log_softmax(logref + _means(means, logref.shape[0]) / beta, -1)


def regularised_objective(theta: torch.Tensor, logref: torch.Tensor, means: torch.Tensor, beta: float,
                          direction: str = "reverse") -> torch.Tensor:
    """:math:`J(\\theta) - \\beta\\,\\mathrm{KL}`, with the reverse KL(pi || ref) (``"reverse"``, what
    RLHF penalises) or the forward KL(ref || pi) (``"forward"``, what k3's gradient descends).
    Differentiable in ``theta`` ``(K,)``; returns a scalar."""
    theta = _logits(theta)
    logp = torch.log_softmax(theta, -1)
    if direction == "reverse":
        kl = kl_categorical(logp, logref)
    elif direction == "forward":
        kl = kl_categorical(logref, logp)
    else:
        raise ValueError(f"direction must be 'reverse' or 'forward', got {direction!r}")
    return expected_reward(theta, means) - beta * kl


@one_torch_thread()
def exact_ascent(objective, theta0: torch.Tensor, steps: int = 5000, lr: float = 1.0) -> torch.Tensor:
    """Plain gradient ascent on the logits with the exact gradient of ``objective(theta)``
    (autograd); returns the final logits ``(K,)``."""
    theta = _logits(theta0).detach().clone().requires_grad_()
    for _ in range(steps):
        (g,) = torch.autograd.grad(objective(theta), theta)
        with torch.no_grad():
            theta += lr * g
    return theta.detach()


@one_torch_thread()
def expected_loss_ascent(logref: torch.Tensor, means: torch.Tensor, beta: float, kind: str, steps: int = 5000,
                         lr: float = 2.0) -> torch.Tensor:
    """The mean-field dynamics of a KL *loss*: gradient ascent on the logits along the exact expected
    update :math:`\\nabla J - \\beta \\sum_a \\pi(a)\\nabla k(a)` (samples held fixed, as autograd sees
    a loss), with ``k`` from :func:`~rlcourse.losses.kl_penalty` (clamps included). Starts at the
    reference; returns the final logits ``(K,)``, a fixed point when converged."""
    logref = _logits(logref, "logref")
    m = _means(means, logref.shape[0])
    theta = logref.detach().clone().requires_grad_()
    for _ in range(steps):
        lp = torch.log_softmax(theta, -1)
        obj = (lp.exp() * m).sum() - beta * (lp.exp().detach() * kl_penalty(lp, logref, kind).to(DTYPE)).sum()
        (g,) = torch.autograd.grad(obj, theta)
        with torch.no_grad():
            theta += lr * g
    return theta.detach()


# ---------------------------------------------------------------------------- training runs
def _gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return x.gather(-1, idx)


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
    (:func:`optimal_baseline`) and ``value`` (:math:`J(\\theta)`)) and takes a step ``lr`` along it.

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


@one_torch_thread()
def train_kl_bandit(means: torch.Tensor, logref: torch.Tensor, beta: float, placement: str, steps: int, batch: int,
                    lr: float, runs: int, seed: int = 0) -> dict:
    """KL-regularised REINFORCE on a softmax bandit (Bernoulli rewards), starting at the reference,
    ``runs`` independent runs at once (one generator seeded with ``seed``), with the KL term placed
    as ``placement``:

    * ``k1-reward``: the per-sample reward becomes :math:`r - \\beta\\,k_1` with :math:`k_1` detached
      (as ``RLConfig(kl_in_reward=True)`` does), and enters the advantage;
    * ``kX-loss``: :math:`\\beta\\,\\mathrm{mean}(k_X)` (from :func:`~rlcourse.losses.kl_penalty`, with
      gradient) is added to the policy-gradient loss, for ``k1``, ``k2``, ``k3``, ``k3+``.

    The advantage uses the leave-one-out baseline. SGD on the logits with step ``lr``.

    ======== ======== ==========================================================
    means    ``(K,)`` mean reward of each arm
    logref   ``(K,)`` log pi_ref (also the initial logits)
    returns           dict: ``J`` and ``KL`` ``(R, steps+1)`` exact reward and KL(pi || ref) along
                      each run; ``logp`` ``(R, K)`` final log-probs
    ======== ======== ==========================================================
    """
    if placement not in KL_PLACEMENTS:
        raise ValueError(f"unknown KL placement {placement!r}; choose one of {KL_PLACEMENTS}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    logref = _logits(logref, "logref")
    K = logref.shape[0]
    m = _means(means, K)
    R = runs
    gen = torch.Generator().manual_seed(int(seed))
    theta = logref.unsqueeze(0).repeat(R, 1).requires_grad_()
    J = torch.zeros(R, steps + 1, dtype=DTYPE)
    KL = torch.zeros(R, steps + 1, dtype=DTYPE)
    kind = placement.split("-")[0]
    for t in range(steps + 1):
        logp_all = torch.log_softmax(theta, -1)
        with torch.no_grad():
            J[:, t] = (logp_all.exp() * m).sum(-1)
            KL[:, t] = kl_categorical(logp_all, logref.expand_as(logp_all))
        if t == steps:
            break
        with torch.no_grad():
            pi = logp_all.exp()
            acts = torch.multinomial(pi, batch, replacement=True, generator=gen)
            u = torch.rand(R, batch, dtype=DTYPE, generator=gen)
            r = (u < m[acts]).to(DTYPE)
        logp = _gather(logp_all, acts)  # (R, N), with gradient
        lref = logref[acts]
        if placement == "k1-reward":
            shaped = r - beta * kl_penalty(logp.detach(), lref, "k1")
            adv = shaped - batch_baselines(shaped, "loo")
            loss = -(adv * logp).mean(-1)
        else:
            adv = r - batch_baselines(r, "loo")
            loss = -(adv * logp).mean(-1) + beta * kl_penalty(logp, lref, kind).mean(-1)
        (grad,) = torch.autograd.grad(loss.sum(), theta)  # runs are independent: the sum separates
        with torch.no_grad():
            theta -= lr * grad
    return {"J": J, "KL": KL, "logp": torch.log_softmax(theta.detach(), -1)}


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


def kl_bandit(K: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """The bandit of the KL experiment: Bernoulli arms with means evenly spaced in [0.1, 0.9],
    and a reference policy that prefers the worse arms (log-probs ``log_softmax(linspace(1, -1))``).
    Returns (means, logref)."""
    means = torch.linspace(0.1, 0.9, K, dtype=DTYPE)
    logref = torch.log_softmax(torch.linspace(1.0, -1.0, K, dtype=DTYPE), -1)
    return means, logref


def run_kl_experiment(prof: Profile | None = None) -> dict:
    """Chapter *KL control*: KL-regularised REINFORCE on :func:`kl_bandit` for several ``beta`` and
    every placement of the KL term (:data:`KL_PLACEMENTS`), several runs, compared with the closed
    form :math:`\\pi^*_\\beta \\propto \\pi_{\\text{ref}} e^{\\bar r/\\beta}` and (for k3 in the loss)
    with the maximiser of :math:`J - \\beta\\,\\mathrm{KL}(\\pi_{\\text{ref}}\\,\\|\\,\\pi)`.

    Returns a dict: ``betas``, ``placements``, ``steps``, ``batch``, ``lr``, ``runs``;
    ``J[p][i]``, ``KL[p][i]`` final exact reward and KL(pi||ref) (mean over runs and the last
    10% of steps) for placement p and beta i; ``curves_J[p][i]``, ``curves_KL[p][i]`` ``(steps+1,)``
    mean over runs; ``dist_opt[p][i]`` mean KL(pi_final || pi*_beta); ``dist_fwd[p][i]`` mean
    KL(pi_final || forward-KL optimum); ``opt_J[i]``, ``opt_KL[i]``, ``fwd_J[i]``, ``fwd_KL[i]``
    (the two optima); ``k3_fixed_J[i]``, ``k3_fixed_KL[i]`` (the fixed point of k3-in-the-loss's
    exact expected update *with* the clamp of :func:`~rlcourse.losses.kl_penalty`, from
    :func:`expected_loss_ascent`) and ``dist_k3_fixed[i]`` (mean KL from the k3 runs to it);
    ``frontier`` (J, KL of pi*_beta on a fine grid of beta); ``seconds``.
    """
    prof = prof or current_profile()
    t0 = time.perf_counter()
    steps = prof.pick(smoke=40, book=1500, full=4000)
    runs = max(prof.toy_seeds, prof.pick(smoke=2, book=8, full=32))  # every run is one replicate (seed)
    betas = prof.pick(smoke=[0.1, 0.5], book=[0.05, 0.1, 0.2, 0.5], full=[0.02, 0.05, 0.1, 0.2, 0.5, 1.0])
    batch, lr = 16, 0.5
    means, logref = kl_bandit()
    tail = max(1, steps // 10)
    out = {"betas": list(betas), "placements": list(KL_PLACEMENTS), "steps": steps, "batch": batch, "lr": lr,
           "runs": runs, "ref_J": float((logref.exp() * means).sum()), "best": float(means.max())}
    for key in ("J", "KL", "curves_J", "curves_KL", "dist_opt", "dist_fwd", "J_runs", "KL_runs", "dist_opt_runs",
                "dist_fwd_runs"):
        out[key] = {p: [] for p in KL_PLACEMENTS}
    out.update({"opt_J": [], "opt_KL": [], "fwd_J": [], "fwd_KL": [], "k3_fixed_J": [], "k3_fixed_KL": [],
                "dist_k3_fixed": []})
    with one_torch_thread():
        fwd, k3_fixed = [], []
        for beta in betas:
            lo = kl_regularised_optimum(logref, means, beta)
            out["opt_J"].append(float((lo.exp() * means).sum()))
            out["opt_KL"].append(float(kl_categorical(lo, logref)))
            th = exact_ascent(lambda th: regularised_objective(th, logref, means, beta, "forward"), logref,
                              steps=2500, lr=2.0)
            lf = torch.log_softmax(th, -1)
            fwd.append(lf)
            out["fwd_J"].append(float((lf.exp() * means).sum()))
            out["fwd_KL"].append(float(kl_categorical(lf, logref)))
            lc = torch.log_softmax(expected_loss_ascent(logref, means, beta, "k3", steps=2500, lr=2.0), -1)
            k3_fixed.append(lc)
            out["k3_fixed_J"].append(float((lc.exp() * means).sum()))
            out["k3_fixed_KL"].append(float(kl_categorical(lc, logref)))
        for p in KL_PLACEMENTS:
            for i, beta in enumerate(betas):
                res = train_kl_bandit(means, logref, beta, p, steps, batch, lr, runs, seed=i)
                out["J"][p].append(float(res["J"][:, -tail:].mean()))
                out["KL"][p].append(float(res["KL"][:, -tail:].mean()))
                out["J_runs"][p].append(res["J"][:, -tail:].mean(1).numpy())
                out["KL_runs"][p].append(res["KL"][:, -tail:].mean(1).numpy())
                out["curves_J"][p].append(res["J"].mean(0).numpy())
                out["curves_KL"][p].append(res["KL"].mean(0).numpy())
                lo = kl_regularised_optimum(logref, means, beta).expand_as(res["logp"])
                d_opt = kl_categorical(res["logp"], lo)
                d_fwd = kl_categorical(res["logp"], fwd[i].expand_as(res["logp"]))
                out["dist_opt"][p].append(float(d_opt.mean()))
                out["dist_fwd"][p].append(float(d_fwd.mean()))
                out["dist_opt_runs"][p].append(d_opt.numpy())
                out["dist_fwd_runs"][p].append(d_fwd.numpy())
                if p == "k3-loss":
                    out["dist_k3_fixed"].append(
                        float(kl_categorical(res["logp"], k3_fixed[i].expand_as(res["logp"])).mean()))
    grid = np.geomspace(0.001, 10.0, 200)
    front = [kl_regularised_optimum(logref, means, float(b)) for b in grid]
    out["frontier"] = {"beta": grid, "J": np.array([float((f.exp() * means).sum()) for f in front]),
                       "KL": np.array([float(kl_categorical(f, logref)) for f in front])}
    out["seconds"] = time.perf_counter() - t0
    return out


def frontier_reward(E: dict, kl) -> np.ndarray:
    """The reward of the closed-form optimum :math:`\\pi^*_\\beta` whose KL to the reference is ``kl``
    (interpolated on ``E["frontier"]``): the most reward any policy can have at that KL."""
    order = np.argsort(E["frontier"]["KL"])
    return np.interp(kl, E["frontier"]["KL"][order], E["frontier"]["J"][order])


_KL_SETTING = ("8-armed Bernoulli bandit (means 0.1..0.9, reference favouring the worse arms), REINFORCE with a "
               "leave-one-out baseline, SGD on the logits, batches of 16, 1500 steps; one seed = one run, the "
               "placements of a beta on the same random numbers; end point = mean of the last 10% of steps")
KL_CLAIMS = {
    "k2_vs_k3": Claim(
        key="kl_control/k2-reaches-optimum",
        paper="verl PR #2953; OpenRLHF PRs #1101, #1309 (gradients of the KL estimators)",
        statement="k2 (and k3+) in the loss has the gradient of KL(pi || ref), so training ends at the "
                  "regularised optimum pi* ~ ref exp(r / beta); k3 in the loss does not",
        source="the pull requests' derivations; this chapter's proposition on expected gradients",
        setting=_KL_SETTING + "; beta = 0.2",
        metric="KL(pi_final || pi*_beta), per run", method="k2 in the loss", baseline="k3 in the loss",
        kind="less", margin=0.0, unit="{:.4f}"),
    "k3_forward": Claim(
        key="kl_control/k3-forward-optimum",
        paper="verl PR #2953; OpenRLHF PRs #1101, #1309 (gradients of the KL estimators)",
        statement="k3 in the loss has the expected gradient of the forward KL(ref || pi), so it ends nearer "
                  "the forward-KL optimum than the reverse-KL one",
        source="the pull requests' derivations; this chapter's proposition on expected gradients",
        setting=_KL_SETTING + "; beta = 0.2",
        metric="KL from k3's final policy to the forward-KL optimum, per run",
        method="distance to the forward-KL optimum", baseline="distance to pi*_beta",
        kind="less", margin=0.0, unit="{:.4f}"),
    "k3_frontier": Claim(
        key="kl_control/k3-inside-frontier",
        paper="verl PR #2953; OpenRLHF PRs #1101, #1309 (gradients of the KL estimators)",
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


def kl_verdicts(E: dict) -> dict:
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


KL_LM_CLAIM = Claim(
    key="kl_control/lm-beta-keeps-near-reference",
    paper="Ouyang et al., Training language models to follow instructions with human feedback, 2022, arXiv:2203.02155",
    statement="a KL penalty to the SFT model keeps the policy near the SFT model; beta sets the trade-off",
    source="Ouyang et al. (2022), section 3.5",
    setting="tiny Llama addition model (the lab's medium base), GRPO with the KL in the loss (the trainer's default "
            "estimator), 8 prompts x 8 samples, 15 steps, learning rate 3e-4; KL on 64 held-out prompts x 4 samples",
    metric="sequence-level KL to the reference after training (mean of the summed per-token k1)",
    method="largest beta", baseline="beta = 0", kind="less", margin=0.0)


def kl_lm_verdict(S: dict):
    """The verdict of :data:`KL_LM_CLAIM` on :func:`run_kl_beta_sweep_lm`'s output (paired by seed)."""
    return evaluate(KL_LM_CLAIM, S["kl"][-1], S["kl"][0], seconds=S["seconds"])


# ---------------------------------------------------------------------------- the same trade-off on the tiny LM
def run_kl_beta_sweep_lm(prof: Profile | None = None, betas=None) -> dict:
    """Chapter *KL control*: GRPO with the KL in the loss (the trainer's default estimator) on the
    tiny addition model, for several ``beta`` and ``prof.seeds`` seeds, a small budget each. After
    training, on fresh samples of held-out prompts: the sampled accuracy (temperature 1) and the
    sequence-level KL to the reference, the mean over samples of :math:`\\sum_t k_1`.

    Returns a dict: ``betas``, ``seeds``, ``steps``; ``reward`` and ``kl`` ``(len(betas), seeds)``;
    ``base_reward`` (the base model's sampled accuracy on the same prompts); ``seconds``.
    """
    from .lm import load_base_model, response_logprobs, sample
    from .tasks import get_task
    from .train import RLConfig, Trainer

    prof = prof or current_profile()
    t0 = time.perf_counter()
    betas = list(betas) if betas is not None else prof.pick(smoke=[0.0, 1.0], book=[0.0, 0.2, 2.0])
    steps = prof.pick(smoke=2, book=15, full=100)
    n_eval = prof.pick(smoke=8, book=64, full=256)
    seeds = list(range(prof.seeds))
    task = get_task("addition")
    test = task.examples(n_eval, seed=4321, split="test")
    prompts = [e.prompt for e in test]

    def measure(model, ref, seed):
        fresh = sample(model, tok, prompts, num_generations=4, max_new_tokens=10,
                       generator=torch.Generator().manual_seed(10_000 + seed))
        with torch.no_grad():
            ref_lp = response_logprobs(ref, fresh.input_ids, fresh.attention_mask, fresh.response_len)
        kl = float(((fresh.logprobs - ref_lp) * fresh.response_mask).sum(-1).mean())
        acc = float(task.rewards(fresh.texts, [e for e in test for _ in range(4)]).mean())
        return acc, kl

    reward = np.zeros((len(betas), len(seeds)))
    kl = np.zeros((len(betas), len(seeds)))
    with one_torch_thread():
        base, tok = load_base_model("addition", "medium", prof=prof, progress=False)
        base_reward = measure(base, base, 0)[0]
        for i, beta in enumerate(betas):
            for j, seed in enumerate(seeds):
                model, tok = load_base_model("addition", "medium", prof=prof, progress=False)
                cfg = RLConfig(beta=float(beta), num_generations=prof.pick(smoke=4, book=8), steps=steps,
                               prompts_per_step=prof.pick(smoke=4, book=8), max_completion_length=10,
                               learning_rate=prof.pick(smoke=1e-4, book=3e-4), progress=False, train_pool_size=512,
                               eval_prompts=8, seed=seed)
                tr = Trainer(model, tok, "addition", cfg)
                tr.train()
                reward[i, j], kl[i, j] = measure(tr.model, base, seed)
    return {"betas": betas, "seeds": len(seeds), "steps": steps, "reward": reward, "kl": kl,
            "base_reward": base_reward, "seconds": time.perf_counter() - t0}
