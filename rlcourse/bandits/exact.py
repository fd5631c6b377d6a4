"""Softmax bandits, exactly: the checks, the exact gradient and estimator moments, Monte Carlo
draws, and the sequence bandit whose estimators can be enumerated.

A softmax bandit has ``K`` arms, a policy :math:`\\pi_\\theta = \\mathrm{softmax}(\\theta)` over them
and a reward whose mean given arm ``a`` is ``means[a]``: a Bernoulli outcome (``reward_noise=
"bernoulli"``, the 0/1 reward of a verifier) or the mean itself (``"none"``). Because there are only
``K`` actions, the exact gradient and the exact mean and variance of any per-sample estimator are
finite sums, against which Monte Carlo estimators are checked. All tensors are float64.
"""
from __future__ import annotations

import itertools

import torch

DTYPE = torch.float64


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
