"""EVPO: gate between a learned critic and the group-mean baseline by the batch's explained variance.

Pan et al. (2026), *EVPO: Explained Variance Policy Optimization for Adaptive Critic Utilization in
LLM Post-Training*, arXiv:2604.19485. The equations below are the course's reconstruction from the
paper's abstract (see ``book/evpo.md``): the critic baseline (PPO, Kalman gain 1) and the mean
baseline (GRPO, gain 0) are the two ends of :math:`b_K = \\bar R + K (V - \\bar R)`, and
:math:`\\mathrm{EV} = 1 - \\mathrm{Var}(R - V) / \\mathrm{Var}(R) > 0` says exactly when the critic's
end has the smaller variance.

Registers the advantage estimator ``"evpo"`` (it reads ``values``, so the trainer builds a critic).
Also here: the closed forms the chapter derives (:func:`kalman_variance`, :func:`kalman_gain`), the toy
trainer on a multi-prompt bandit (:func:`run_evpo_bandit`; the chapter's grid over it, its claims and
verdicts are in :mod:`rlcourse.studies.evpo`), an out-of-sample check of the gate and one trainer run.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..advantages import compute_gae_advantage_return, compute_grpo_outcome_advantage, register_estimator
from ..ops import check_finite, check_same_shape, masked_var
from ..profiles import Profile, one_torch_thread

__all__ = ["explained_variance_batch", "kalman_variance", "kalman_gain", "reward_to_go", "evpo_advantage",
           "run_evpo_bandit", "ev_out_of_sample", "run_evpo_lm"]


# ---------------------------------------------------------------------- closed forms
def explained_variance_batch(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """Explained variance of a critic on one batch, with empirical (1/n) variances.

    ========= ======================= ==========================================
    returns   ``(n,)`` or ``(B,T)``   targets R (Monte-Carlo returns)
    values    same shape              critic predictions V
    mask      same shape or None      1 where the position counts
    returns   float                   :math:`1 - \\widehat{\\mathrm{Var}}(R-V) / \\widehat{\\mathrm{Var}}(R)`
    ========= ======================= ==========================================

    Raises ValueError when the returns do not vary (EV is then undefined).
    """
    mask = torch.ones_like(returns) if mask is None else mask
    check_same_shape(returns=returns, values=values, mask=mask)
    check_finite("returns", returns)
    check_finite("values", values)
    r, v, m = returns.double(), values.double(), mask.double()
    var_r = masked_var(r, m, unbiased=False)
    if var_r <= 0:
        raise ValueError("explained variance is undefined: the returns have zero variance on this batch")
    return float(1.0 - masked_var(r - v, m, unbiased=False) / var_r)


def kalman_variance(returns: torch.Tensor, values: torch.Tensor, K: float | torch.Tensor) -> torch.Tensor:
    """Empirical variance of the advantage :math:`R - b_K` with :math:`b_K = \\bar R + K (V - \\bar R)`.

    ======= ================== =============================================
    returns ``(n,)``           returns R of one batch
    values  ``(n,)``           critic values V
    K       scalar or ``(k,)`` Kalman gain(s); 0 is the mean baseline, 1 the critic
    returns                    scalar or ``(k,)`` :math:`\\widehat{\\mathrm{Var}}(R - b_K)` (1/n)
    ======= ================== =============================================
    """
    if returns.ndim != 1:
        raise ValueError(f"returns must be 1-D (n,), got shape {tuple(returns.shape)}")
    check_same_shape(returns=returns, values=values)
    K = torch.as_tensor(K, dtype=torch.float64)
    r, v = returns.double(), values.double()
    b = r.mean() + K[..., None] * (v - r.mean())
    adv = r - b
    return ((adv - adv.mean(-1, keepdim=True)) ** 2).mean(-1)


def kalman_gain(returns: torch.Tensor, values: torch.Tensor) -> float:
    """The variance-minimising gain :math:`K^\\star = \\widehat{\\mathrm{Cov}}(R, V) / \\widehat{\\mathrm{Var}}(V)`.

    ======= ======== ========================
    returns ``(n,)`` returns R
    values  ``(n,)`` critic values V (must vary)
    returns float    :math:`K^\\star`
    ======= ======== ========================
    """
    if returns.ndim != 1:
        raise ValueError(f"returns must be 1-D (n,), got shape {tuple(returns.shape)}")
    check_same_shape(returns=returns, values=values)
    r, v = returns.double() - returns.double().mean(), values.double() - values.double().mean()
    var_v = (v * v).mean()
    if var_v <= 0:
        raise ValueError("the Kalman gain is undefined: the critic's values do not vary on this batch")
    return float((r * v).mean() / var_v)


def reward_to_go(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Monte-Carlo returns :math:`G_t = \\sum_{j \\ge t} \\gamma^{j-t} r_j m_j` over the response.

    =================== ========= ======================================
    token_level_rewards ``(B,T)`` rewards (outcome on the last valid token)
    response_mask       ``(B,T)`` 1 on response tokens
    returns             ``(B,T)`` reward-to-go, zero where masked
    =================== ========= ======================================
    """
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    mask = response_mask.to(token_level_rewards.dtype)
    out = torch.zeros_like(token_level_rewards)
    running = torch.zeros(token_level_rewards.shape[0], dtype=token_level_rewards.dtype)
    for t in reversed(range(token_level_rewards.shape[1])):
        m = mask[:, t]
        # a masked position carries the running sum through unchanged (as GAE does)
        running = m * (token_level_rewards[:, t] + gamma * running) + (1 - m) * running
        out[:, t] = running * m
    return out


# ---------------------------------------------------------------------- the estimator
@register_estimator("evpo")
def evpo_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, values: torch.Tensor,
                   gamma: float = 1.0, lam: float = 1.0, norm_adv_by_std_in_grpo: bool = True,
                   state: dict | None = None, step: int | None = None, threshold: float = 0.0,
                   ev_ema: float = 0.0):
    """EVPO's advantage: GAE with the critic when the batch's explained variance exceeds
    ``threshold`` (0), else GRPO's group-relative advantage. The critic's regression targets (the
    GAE returns) are returned in both branches, so the critic keeps learning while it is not used.

    =================== ========= ===========================================================
    token_level_rewards ``(B,T)`` reward on the last valid token (plus any per-token terms)
    response_mask       ``(B,T)`` 1 up to and including EOS
    index               ``(B,)``  group (prompt) id of each row; G >= 2 for the mean branch
    values              ``(B,T)`` critic values V(s_t)
    state               dict      if given: ``state["evpo"]`` gets ``ev``, ``ev_used``, ``use_critic``
                                  and appends ``(step, ev, use_critic)`` to ``state["evpo_history"]``
    threshold           float     the gate's boundary (0 in the paper)
    ev_ema              float     in [0, 1): smooth EV across steps with this EMA weight (0 = off)
    returns                       ``(adv, ret)``, both ``(B,T)``; ``ret`` are the GAE returns (critic targets)
    =================== ========= ===========================================================

    EV is computed over all valid tokens, with Monte-Carlo reward-to-go as the target (for an
    outcome reward and ``gamma = 1`` that is the sequence's reward at every token). If the returns
    do not vary on the batch, EV is undefined and the mean branch is used.
    """
    if values is None:
        raise ValueError("the 'evpo' estimator needs values from a critic")
    check_same_shape(token_level_rewards=token_level_rewards, values=values, response_mask=response_mask)
    if not 0.0 <= ev_ema < 1.0:
        raise ValueError(f"ev_ema must be in [0, 1), got {ev_ema}")
    gae_adv, gae_ret = compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam)
    mc = reward_to_go(token_level_rewards, response_mask, gamma)
    try:
        ev = explained_variance_batch(mc, values, response_mask)
    except ValueError:  # the returns do not vary: nothing to explain
        ev = float("nan")
    ev_used = ev
    if state is not None and ev_ema > 0 and ev == ev:
        prev = state.get("evpo", {}).get("ev_used")
        ev_used = ev if prev is None or prev != prev else ev_ema * prev + (1 - ev_ema) * ev
    use_critic = bool(ev_used == ev_used and ev_used > threshold)
    if use_critic:
        adv = gae_adv
    else:
        adv, _ = compute_grpo_outcome_advantage(token_level_rewards, response_mask, index,
                                                norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    if state is not None:
        state["evpo"] = {"ev": ev, "ev_used": ev_used, "use_critic": use_critic}
        state.setdefault("evpo_history", []).append((step, ev, use_critic))
    return adv, gae_ret


# ---------------------------------------------------------------------- the toy trainer
def run_evpo_bandit(method: str, critic: str, *, seed: int = 0, steps: int = 200, n_prompts: int = 200,
                    n_answers: int = 10, prompts_per_step: int = 64, group_size: int = 4, lr: float = 0.1,
                    critic_lr: float = 0.1, critic_init_std: float = 0.5) -> dict:
    """One run of the multi-prompt Bernoulli bandit with a tabular softmax policy.

    Prompt ``x`` has ``n_answers`` answers, one of them correct (reward 1); the initial probability
    of the correct answer is spread evenly over [0.05, 0.95] across prompts. Each step draws
    ``prompts_per_step`` prompts and ``group_size`` answers for each, computes advantages with
    ``method`` (``"ppo"``: critic baseline, ``"grpo"``: group mean, ``"evpo"``: the gate of
    :func:`evpo_advantage`), whitens them over the batch (as the trainer does), and takes one
    policy-gradient step on the logits. The critic is a table of values started at
    ``0.5 + critic_init_std * noise`` and moved towards each observed reward with rate
    ``critic_lr``; with ``critic="informative"`` it is indexed by the prompt, with ``critic="noise"``
    by a random bucket drawn afresh for every sample (it never learns anything about the prompt).

    ============= =============== ==========================================================
    key           shape           meaning
    ============= =============== ==========================================================
    reward        ``(steps,)``    expected reward of the policy, averaged over all prompts
    adv_var       ``(steps,)``    batch variance of R - b with b the baseline the method used
                                  (the leave-one-out group mean for the mean branch)
    var_critic    ``(steps,)``    batch variance of R - V
    var_mean      ``(steps,)``    batch variance of R - (leave-one-out group mean)
    ev            ``(steps,)``    the critic's explained variance on the batch
    use_critic    ``(steps,)``    1 where the advantage came from the critic
    ============= =============== ==========================================================
    """
    if method not in ("ppo", "grpo", "evpo"):
        raise ValueError(f"method must be 'ppo', 'grpo' or 'evpo', got {method!r}")
    if critic not in ("informative", "noise"):
        raise ValueError(f"critic must be 'informative' or 'noise', got {critic!r}")
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 for a group-mean baseline, got {group_size}")
    rng = np.random.default_rng(seed)
    S, K, G, N = n_prompts, n_answers, group_size, prompts_per_step
    p0 = np.linspace(0.05, 0.95, S)
    theta = np.zeros((S, K))
    theta[:, 0] = np.log((K - 1) * p0 / (1 - p0))  # softmax prob of answer 0 is p0
    table = 0.5 + critic_init_std * rng.standard_normal(S)
    index = torch.arange(N).repeat_interleave(G)
    mask = torch.ones(N * G, 1)
    log = {k: np.zeros(steps) for k in ("reward", "adv_var", "var_critic", "var_mean", "ev", "use_critic")}
    state: dict = {}
    for t in range(steps):
        x = np.repeat(rng.integers(0, S, N), G)
        logits = theta[x]
        pi = np.exp(logits - logits.max(1, keepdims=True))
        pi /= pi.sum(1, keepdims=True)
        a = (pi.cumsum(1) > rng.random((len(x), 1))).argmax(1)
        R = (a == 0).astype(float)
        key = x if critic == "informative" else rng.integers(0, S, len(x))
        V = table[key]
        rewards = torch.tensor(R, dtype=torch.float32)[:, None]
        values = torch.tensor(V, dtype=torch.float32)[:, None]
        if method == "evpo":
            adv, _ = evpo_advantage(rewards, mask, index, values, state=state, step=t + 1,
                                    norm_adv_by_std_in_grpo=False)
            use = state["evpo"]["use_critic"]
        elif method == "ppo":
            adv, _ = compute_gae_advantage_return(rewards, values, mask)
            use = True
        else:
            adv, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
            use = False
        A = adv[:, 0].double().numpy()
        loo = (R.reshape(-1, G).sum(1).repeat(G) - R) / (G - 1)
        log["var_critic"][t] = np.var(R - V)
        log["var_mean"][t] = np.var(R - loo)
        log["adv_var"][t] = log["var_critic"][t] if use else log["var_mean"][t]
        log["ev"][t] = 1 - np.var(R - V) / np.var(R) if np.var(R) > 0 else np.nan
        log["use_critic"][t] = float(use)
        A = (A - A.mean()) / (A.std() + 1e-8)
        score = -pi
        score[np.arange(len(x)), a] += 1.0  # d log pi(a) / d logits = e_a - pi
        np.add.at(theta, x, lr * A[:, None] * score / G)
        np.add.at(table, key, critic_lr * (R - V) / G)  # the critic learns in every branch
        pt = np.exp(theta - theta.max(1, keepdims=True))
        log["reward"][t] = float((pt[:, 0] / pt.sum(1)).mean())
    return log


# ---------------------------------------------------------------------- a check of the gate that can fail
def ev_out_of_sample(sigmas, *, n_prompts: int = 200, batch: int = 256, trials: int = 400, seed: int = 0) -> dict:
    """Does the sign of EV on one batch predict which baseline has the smaller advantage variance on a
    *fresh* batch from the same prompts and the same critic?

    Each trial draws a critic :math:`V(s) = m(s) + \\varepsilon(s)` (one fixed error per prompt,
    :math:`\\varepsilon \\sim N(0, \\sigma^2)`) over prompts with success rates :math:`m(s)` evenly spread on
    [0.05, 0.95], then two independent batches of ``batch`` (prompt, 0/1 reward) pairs. The gate's
    decision is ``EV > 0`` on the first batch; the truth is ``Var(R - V) < Var(R - R_bar)`` on the
    second. Unlike the in-batch identity (which holds by construction), the agreement can fail: EV is
    an estimate, and near the population boundary :math:`\\sigma^2 = \\mathrm{Var}(m)` it is a coin flip.

    ========== ============ ===============================================================
    sigmas     ``(k,)``     critic noise levels
    returns    dict         ``sigma (k,)``, ``use_critic (k,)`` (fraction of trials with EV > 0),
                            ``critic_better (k,)`` (fraction where the critic wins on the fresh
                            batch), ``agree (k,)`` (fraction where the two coincide),
                            ``sigma_star`` (the population boundary :math:`\\sqrt{\\mathrm{Var}(m)}`)
    ========== ============ ===============================================================
    """
    sig = np.asarray(sigmas, dtype=float)
    if sig.ndim != 1 or (sig < 0).any():
        raise ValueError(f"sigmas must be a 1-D array of non-negative noise levels, got {sigmas!r}")
    if batch < 2 or trials < 1:
        raise ValueError(f"batch must be >= 2 and trials >= 1, got batch={batch}, trials={trials}")
    rng = np.random.default_rng(seed)
    m = np.linspace(0.05, 0.95, n_prompts)
    use, better, agree = np.zeros(len(sig)), np.zeros(len(sig)), np.zeros(len(sig))
    for k, s in enumerate(sig):
        for _ in range(trials):
            V = m + s * rng.standard_normal(n_prompts)
            out = []
            for _half in range(2):
                x = rng.integers(0, n_prompts, batch)
                R = (rng.random(batch) < m[x]).astype(float)
                if R.var() == 0:
                    R[0] = 1 - R[0]
                out.append((np.var(R - V[x]), np.var(R)))
            gate = out[0][0] < out[0][1]  # EV > 0 on the first batch
            truth = out[1][0] < out[1][1]  # the critic wins on the fresh batch
            use[k] += gate
            better[k] += truth
            agree[k] += gate == truth
    return {"sigma": sig, "use_critic": use / trials, "critic_better": better / trials, "agree": agree / trials,
            "sigma_star": float(np.sqrt(m.var()))}


# ---------------------------------------------------------------------- the estimator in the trainer
def run_evpo_lm(prof: Profile, *, critic_learning_rate: float | None = None, seed: int = 0) -> dict:
    """One Trainer run of the ``"evpo"`` estimator on the tiny addition model (a critic is built from
    the policy's trunk with a zero head). Returns ``history`` (the trainer's per-step metrics),
    ``ev``, ``use_critic`` (per step, from ``state["evpo_history"]``), the final greedy accuracy and
    ``seconds``.
    """
    import copy

    from ..lm import load_base_model
    from ..train import RLConfig, Trainer
    steps = prof.pick(smoke=2, book=30, full=150)
    cfg = RLConfig(num_generations=prof.pick(smoke=4, book=8, full=8), prompts_per_step=prof.pick(smoke=2, book=8,
                   full=32), max_completion_length=10, steps=steps, learning_rate=prof.rl_lr,
                   critic_learning_rate=critic_learning_rate, advantage_estimator="evpo", seed=seed,
                   progress=False, eval_every=steps, eval_prompts=prof.pick(smoke=8, book=128, full=512))
    t0 = time.perf_counter()
    with one_torch_thread():
        base, tok = load_base_model("addition", "medium", progress=False)
        tr = Trainer(copy.deepcopy(base), tok, "addition", cfg)
        hist = tr.train()
    h = tr.state["evpo_history"]
    return {"history": hist, "ev": np.array([e for _, e, _ in h], dtype=float),
            "use_critic": np.array([u for _, _, u in h], dtype=float),
            "trainer_ev": np.array([x.get("explained_variance", np.nan) for x in hist], dtype=float),
            "reward": np.array([x["reward"] for x in hist]), "eval": hist[-1].get("eval_greedy_accuracy"),
            "steps": steps, "seconds": time.perf_counter() - t0}
