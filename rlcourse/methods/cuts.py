"""CUTS and Mixed-CUTS: exploratory rollouts inside GRPO groups on saturated data.

*Too Correct to Learn: Reinforcement Learning on Saturated Reasoning Data*, Zhenwen Liang, Yujun Zhou,
Sidi Lu, Xiangliang Zhang, Haitao Mi, Dong Yu (2026, arXiv:2604.18493). The abstract: when a strong
model saturates its training data, GRPO's groups are all correct and its advantage vanishes; CUTS
(Constrained Uniform Top-K Sampling) samples *uniformly* among constrained high-confidence candidate
tokens, and Mixed-CUTS mixes exploitative (ordinary) and exploratory (CUTS) rollouts in each group
"to amplify intra-group advantage variance". No code is public: the candidate-set rule, the
off-policy handling and every equation here are the course's reconstruction.

=================== ============= ==============================================================
``mixed_cuts``      sampler       per group, ``G - n_explore`` rows from the policy and
                                  ``n_explore`` rows from CUTS (``rlcourse.lm.sample(proposal=)``);
                                  scores the rows and logs each sub-group's reward
``cuts_is``         policy loss   PPO-clip with each token's advantage weighted by the truncated
                                  importance ratio ``min(pi_old / q, 2)``: an alias of the shared
                                  ``behaviour_is`` loss (:mod:`rlcourse.methods.behaviour_is`)
``addition_short``  task          two-digit sums with one single-digit operand (``86+3=``): the
                                  harder held-out variant of the chapter's experiment
=================== ============= ==============================================================

The chapter's experiment (GRPO against Mixed-CUTS from a saturated tiny model) and its claims are a
study in :mod:`rlcourse.studies.cuts`.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ..metrics import frac_mixed_groups
from ..ops import masked_mean
from ..rollout import register_sampler
from ..lm.sampling import sample
from .behaviour_is import behaviour_is_alias
from ..tasks import Addition, register_task

PAPER = ("Too Correct to Learn: Reinforcement Learning on Saturated Reasoning Data, Z. Liang, Y. Zhou, S. Lu, "
         "X. Zhang, H. Mi, D. Yu (2026, arXiv:2604.18493)")
RULES = ("typical", "top_k")


# ---------------------------------------------------------------------- the candidate set and CUTS
def candidate_mask(logits: torch.Tensor, rule: str = "typical", top_k: int = 0) -> torch.Tensor:
    """The candidate set ``C_t`` of each row, as a boolean mask.

    ``"typical"`` (parameter-free): ``C_t = {v : p_t(v) >= exp(-H(p_t))}``, the tokens at least as
    probable as one over the distribution's perplexity; ``top_k > 0`` then keeps at most the ``top_k``
    most probable of them. ``"top_k"``: the ``top_k`` most probable tokens (``top_k >= 1`` needed).
    The most probable token is always in ``C_t`` (for ``typical`` this is a theorem; the mask also
    adds it explicitly, against rounding when ``p_t`` is uniform).

    ======= ========= ==========================================
    logits  ``(B,V)`` next-token scores (already tempered)
    returns ``(B,V)`` bool, True on the candidates
    ======= ========= ==========================================
    """
    if rule not in RULES:
        raise ValueError(f"unknown CUTS candidate rule {rule!r}; choose one of {RULES}")
    if logits.ndim != 2:
        raise ValueError(f"logits must be (B, V), got shape {tuple(logits.shape)}")
    if int(top_k) != top_k or top_k < 0:
        raise ValueError(f"top_k must be a non-negative integer, got {top_k!r}")
    if rule == "top_k" and top_k < 1:
        raise ValueError("the 'top_k' rule needs top_k >= 1")
    V = logits.shape[-1]
    logp = torch.log_softmax(logits.double(), dim=-1)
    order = torch.argsort(logp, dim=-1, descending=True)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(V).expand_as(order))
    if rule == "typical":
        H = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1, keepdim=True)
        mask = logp >= -H - 1e-9
        if top_k:
            mask &= rank < top_k
    else:
        mask = rank < min(int(top_k), V)
    return mask | (rank == 0)


def cuts_probs(logits: torch.Tensor, rule: str = "typical", top_k: int = 0) -> torch.Tensor:
    """CUTS's proposal ``q_t(v) = 1[v in C_t] / |C_t|``, uniform over the candidate set.

    ======= ========= ==========================================
    logits  ``(B,V)`` next-token scores (already tempered)
    returns ``(B,V)`` float32, rows summing to 1
    ======= ========= ==========================================
    """
    mask = candidate_mask(logits, rule, top_k).float()
    return mask / mask.sum(-1, keepdim=True)


def explore_rows(batch_size: int, G: int, n_explore: int) -> torch.Tensor:
    """``(B,)`` bool: the exploratory rows, the last ``n_explore`` of each contiguous group of ``G``."""
    if G < 1 or batch_size % G:
        raise ValueError(f"the batch of {batch_size} rows is not made of groups of G={G}")
    if int(n_explore) != n_explore or not 0 <= n_explore <= G:
        raise ValueError(f"n_explore must be an integer in [0, G={G}], got {n_explore!r}")
    return torch.arange(batch_size) % G >= G - n_explore


def mixed_proposal(G: int, n_explore: int, rule: str = "typical", top_k: int = 0):
    """A ``proposal`` for :func:`rlcourse.lm.sample`: the policy's own softmax on the first ``G -
    n_explore`` rows of each group, CUTS on the last ``n_explore``. Maps ``(B,V)`` tempered logits to
    ``(B,V)`` sampling probabilities."""
    candidate_mask(torch.zeros(1, 2), rule, top_k)  # validates rule and top_k now, not at the first token

    def proposal(logits: torch.Tensor) -> torch.Tensor:
        rows = explore_rows(logits.shape[0], G, n_explore).to(logits.device)
        q = torch.softmax(logits.float(), dim=-1)
        if rows.any():
            q[rows] = cuts_probs(logits[rows], rule, top_k).to(q.dtype)
        return q

    return proposal


def importance_ratio(policy_logprob: torch.Tensor, n_candidates: torch.Tensor) -> torch.Tensor:
    """``pi(y_t) / q_t(y_t) = |C_t| pi(y_t)`` for a token drawn by CUTS (any matching shapes)."""
    if policy_logprob.shape != n_candidates.shape:
        raise ValueError(f"shapes differ: {tuple(policy_logprob.shape)} and {tuple(n_candidates.shape)}")
    if (n_candidates < 1).any():
        raise ValueError("a candidate set holds at least one token")
    return n_candidates * policy_logprob.exp()


# ---------------------------------------------------------------------- closed forms
def zero_variance_share(p: float, G: int) -> float:
    """Expected share of GRPO groups with no gradient: ``p^G + (1 - p)^G`` for i.i.d. Bernoulli(p)."""
    return nondegenerate_probability(p, p, G, 0, complement=True)


def nondegenerate_probability(p_e, p_x, G_e: int, G_x: int, complement: bool = False):
    """Probability that a group of ``G_e`` Bernoulli(``p_e``) and ``G_x`` Bernoulli(``p_x``) rewards
    (independent) is not constant: ``1 - p_e^G_e p_x^G_x - (1-p_e)^G_e (1-p_x)^G_x``
    (``complement=True``: the probability that it is constant). Floats or arrays."""
    if G_e < 0 or G_x < 0 or G_e + G_x < 1:
        raise ValueError(f"need G_e, G_x >= 0 with G_e + G_x >= 1, got {G_e}, {G_x}")
    p_e, p_x = np.asarray(p_e, float), np.asarray(p_x, float)
    if ((p_e < 0) | (p_e > 1) | (p_x < 0) | (p_x > 1)).any():
        raise ValueError("success probabilities must be in [0, 1]")
    const = p_e**G_e * p_x**G_x + (1 - p_e) ** G_e * (1 - p_x) ** G_x
    out = const if complement else 1 - const
    return float(out) if out.ndim == 0 else out


def mixed_reward_variance(p_e, p_x, G_e: int, G_x: int, ddof: int = 0):
    """Expected within-group variance of the rewards of a mixed group (two Bernoulli sub-groups):

    ``E[S^2] = (G - 1) / (G - ddof) * vbar + G_e G_x / (G (G - ddof)) * (p_e - p_x)^2``, with
    ``vbar = (G_e p_e (1-p_e) + G_x p_x (1-p_x)) / G``; ``ddof=0`` is the population variance
    (``torch.std(unbiased=False)``), ``ddof=1`` the sample variance (GRPO's ``std``). The second
    term, the spread *between* the sub-groups, is what mixing adds."""
    G = G_e + G_x
    if G_e < 0 or G_x < 0 or G < 2 or ddof not in (0, 1):
        raise ValueError(f"need G_e, G_x >= 0, G >= 2 and ddof in (0, 1), got {G_e}, {G_x}, {ddof}")
    p_e, p_x = np.asarray(p_e, float), np.asarray(p_x, float)
    vbar = (G_e * p_e * (1 - p_e) + G_x * p_x * (1 - p_x)) / G
    out = (G - 1) / (G - ddof) * vbar + G_e * G_x / (G * (G - ddof)) * (p_e - p_x) ** 2
    return float(out) if out.ndim == 0 else out


def best_split(p_e: float, p_x: float, G: int) -> int:
    """The number of exploratory rows ``G_x`` in ``0..G`` that maximises the non-degeneracy
    probability of a group of ``G`` (the smallest, on ties)."""
    probs = [nondegenerate_probability(p_e, p_x, G - g, g) for g in range(G + 1)]
    return int(np.argmax(np.round(probs, 15)))


def softmax_pg_direction(pi: np.ndarray, q: np.ndarray, r: np.ndarray, weighted: bool = False) -> np.ndarray:
    """Expected REINFORCE direction on the logits of a one-step softmax policy ``pi`` when the action is
    drawn from ``q`` and the baseline is the mean reward under ``q``:
    ``E_{a~q}[w(a) (r(a) - b) grad_logits log pi(a)]`` with ``grad log pi(a) = e_a - pi``.

    ``weighted=False`` (``w = 1``, the rollouts treated as on-policy, ``b = E_q r``): ``q * (r - E_q r)``.
    ``weighted=True`` (``w = pi / q``, ``b = E_pi r``): ``pi * (r - E_pi r)``, the true gradient.

    ======= ====== ========================================
    pi, q   (K,)   the policy and the proposal (sum to 1)
    r       (K,)   reward of each action
    returns (K,)   the expected direction on the logits
    ======= ====== ========================================
    """
    pi, q, r = (np.asarray(x, float) for x in (pi, q, r))
    if pi.shape != q.shape or pi.shape != r.shape or pi.ndim != 1:
        raise ValueError(f"pi, q and r must be (K,) of one shape, got {pi.shape}, {q.shape}, {r.shape}")
    if weighted and ((q == 0) & (pi > 0)).any():
        raise ValueError("importance weighting needs q > 0 wherever pi > 0")
    w = np.divide(pi, q, out=np.zeros_like(pi), where=q > 0) if weighted else np.ones_like(pi)
    b = pi @ r if weighted else q @ r
    return sum(q[a] * w[a] * (r[a] - b) * (np.eye(len(pi))[a] - pi) for a in range(len(pi)))


# ---------------------------------------------------------------------- the registered parts
@register_sampler("mixed_cuts")
def mixed_cuts_sampler(model, tokenizer, prompts, config, generator, examples, task, reward, state,
                       n_explore: int | None = None, rule: str = "typical", top_k: int = 0):
    """Mixed-CUTS rollouts: each group of ``G = config.num_generations`` has ``G - n_explore`` rows
    sampled from the policy and ``n_explore`` rows (the last ones, default ``G // 2``) from CUTS with the
    candidate ``rule`` (``"typical"`` or ``"top_k"``, capped by ``top_k``). The rows are scored with the
    loop's reward (``batch.scores``), so the sampler can log what each sub-group earned.

    ``batch.logprobs`` stay the policy's; ``batch.extras["behaviour_logprob"]`` holds ``log q(y_t)``
    (``-log |C_t|`` on CUTS rows, ``log pi`` on the others), which the ``cuts_is`` loss reads.
    ``batch.metrics``: ``cuts_exploit_reward``, ``cuts_explore_reward`` (mean reward of each sub-group),
    ``cuts_mixed_groups`` (share of groups whose rewards differ), ``cuts_candidates`` (mean ``|C_t|``
    over the CUTS tokens), ``cuts_greedy_share`` (share of CUTS tokens with ``|C_t| = 1``) and
    ``cuts_exploit_entropy`` (policy entropy on the exploitative rows' tokens).
    """
    G = config.num_generations
    n_explore = G // 2 if n_explore is None else n_explore
    explore_rows(G, G, n_explore)  # validates n_explore against G
    if config.temperature == 0:
        raise ValueError("the mixed_cuts sampler needs config.temperature > 0 (temperature 0 is greedy decoding)")
    if config.top_k or config.top_p != 1.0:
        raise ValueError("the mixed_cuts sampler replaces filtering: set config.top_k=0 and config.top_p=1.0 "
                         f"(got top_k={config.top_k}, top_p={config.top_p})")
    batch = sample(model, tokenizer, prompts, num_generations=G, max_new_tokens=config.max_completion_length,
                   temperature=config.temperature, generator=generator,
                   proposal=mixed_proposal(G, n_explore, rule, top_k))
    rows = explore_rows(len(batch), G, n_explore).to(batch.response_mask.device)
    per_row = [examples[int(i)] for i in batch.index]
    scores = torch.as_tensor(reward(batch, per_row, task, state), dtype=torch.float32).reshape(-1)
    mask = batch.response_mask
    x_mask = mask * rows[:, None]
    n_cand = torch.exp(-batch.extras["behaviour_logprob"]).round()
    metrics = {"cuts_mixed_groups": frac_mixed_groups(scores, G)}  # a sub-group's metrics only when it exists
    if rows.any():
        metrics.update(cuts_explore_reward=float(scores[rows].mean()),
                       cuts_candidates=float(masked_mean(n_cand, x_mask)),
                       cuts_greedy_share=float(masked_mean((n_cand == 1).float(), x_mask)))
    if (~rows).any():
        metrics.update(cuts_exploit_reward=float(scores[~rows].mean()),
                       cuts_exploit_entropy=float(masked_mean(batch.entropy, mask * (~rows)[:, None])))
    return replace(batch, scores=scores, metrics={**batch.metrics, **metrics})


# the off-policy weight min(pi_old / q, 2) on CUTS rows: the shared behaviour-IS loss with the chapter's cap
compute_cuts_is_loss = behaviour_is_alias("cuts_is", is_cap=2.0)


@register_task("addition_short")
class ShortOperandAddition(Addition):
    """Two-digit addition where exactly one operand has a single digit, e.g. ``86+3=`` -> ``98|89``: the
    same format and distribution family as ``addition`` (a fifth of its prompts are such), and the
    corner where the chapter's saturated model makes most of its mistakes (the columns do not line up)."""

    def __init__(self):
        super().__init__(digits=2)
        self.name = "addition_short"

    def _draw(self, rng):
        while True:
            ex = super()._draw(rng)
            if (ex.meta["a"] < 10) != (ex.meta["b"] < 10):
                return ex
