"""Replay of past rollouts: a sum-tree, freshness-aware priorities and a registered replay sampler.

*Freshness-Aware Prioritized Experience Replay for LLM/VLM Reinforcement Learning*, Weiyu Ma,
Yongcheng Zeng, Yan Song, Xinyu Cui, Jian Zhao, Xuhui Liu, Mohamed Elhoseiny (2026, arXiv:2604.16918).
Prioritised experience replay (PER) samples a stored item ``i`` with probability
``P(i) = p_i^alpha / sum_j p_j^alpha``; the paper multiplies any base priority by an age decay,

    p_i = p_base_i * exp(-a_i / tau),     a_i = t_now - t_stored_i  (gradient steps),

refreshed for *every* stored item at every step, and corrects the sampling bias with the usual PER
importance weights ``w_i = (N P(i))^(-beta) / max_j (N P(j))^(-beta)``, which lie in ``(0, 1]``.

This module holds the pieces, each used by the chapter's tabular experiment and by the loop alike:

===================================== ==========================================================
:class:`SumTree`                      O(log N) proportional sampling (stratified, as PER does)
:func:`age_decay`, :func:`half_life`, :func:`sampling_probabilities`, :func:`importance_weights`,
:func:`kish_ess`                      the formulas above, and Kish's effective sample size
:class:`ReplayBuffer`                 capacity, FIFO eviction, base priorities, ages, refresh, sampling
``"replay"`` sampler                  fresh groups from a base sampler plus replayed groups from the
                                      buffer kept in the sampler's ``state``; per-token extras
                                      ``is_weight`` and ``age``
``"ppo_is"`` policy loss              PPO's clip times the per-token ``is_weight``
===================================== ==========================================================
"""
from __future__ import annotations

import inspect
import math
from dataclasses import replace
from typing import Any, Sequence

import numpy as np
import torch

from .losses import compute_policy_loss, get_policy_loss, register_policy_loss
from .lm.sampling import RolloutBatch, cat_batches
from .parts import call_base_sampler
from .rollout import register_sampler

PRIORITIES = ("reward", "advantage", "uniform")


# ---------------------------------------------------------------------- formulas
def age_decay(age, tau: float | None) -> np.ndarray:
    """``exp(-age / tau)`` elementwise; ``tau=None`` (standard PER) gives 1 for every age.

    ======  =====  ==========================================
    age     (N,)   ages in gradient steps, >= 0
    tau     float  decay constant (> 0) or None (no decay)
    return  (N,)   freshness factor in (0, 1]
    ======  =====  ==========================================
    """
    age = np.asarray(age, dtype=float)
    if (age < 0).any():
        raise ValueError(f"ages must be >= 0, got min {age.min()}")
    if tau is None:
        return np.ones_like(age)
    if not tau > 0:
        raise ValueError(f"tau must be > 0 (or None for no decay), got {tau}")
    return np.exp(-age / tau)


def half_life(tau: float, alpha: float = 1.0) -> float:
    """Age at which a priority halves (``alpha=1``: ``tau ln 2``), or at which the *sampling weight*
    ``p^alpha`` halves (``tau ln 2 / alpha``)."""
    if not (tau > 0 and alpha > 0):
        raise ValueError(f"tau and alpha must be > 0, got tau={tau}, alpha={alpha}")
    return tau * math.log(2.0) / alpha


def sampling_probabilities(priorities, alpha: float) -> np.ndarray:
    """``P(i) = p_i^alpha / sum_j p_j^alpha`` over the ``(N,)`` positive priorities."""
    p = np.asarray(priorities, dtype=float)
    if p.ndim != 1 or p.size == 0 or not (p > 0).all() or not np.isfinite(p).all():
        raise ValueError("priorities must be a non-empty (N,) array of finite positive numbers")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    q = p ** alpha
    return q / q.sum()


def importance_weights(probs, beta: float) -> np.ndarray:
    """PER's weights ``w_i = (N P(i))^(-beta) / max_j (N P(j))^(-beta)`` for every item.

    ======  =====  ==================================================================
    probs   (N,)   sampling probabilities of all N stored items (sum 1)
    beta    float  correction exponent in [0, 1] (0: none, 1: full)
    return  (N,)   weights in (0, 1]; 1 for the least likely item
    ======  =====  ==================================================================
    """
    P = np.asarray(probs, dtype=float)
    if P.ndim != 1 or P.size == 0 or not (P > 0).all():
        raise ValueError("probs must be a non-empty (N,) array of positive probabilities")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    # (N P_i)^-beta / (N P_min)^-beta = (P_min / P_i)^beta, computed without overflow
    return (P.min() / P) ** beta


def kish_ess(w) -> float:
    """Kish's effective sample size ``(sum w)^2 / sum w^2`` of ``(N,)`` non-negative weights."""
    w = np.asarray(w, dtype=float)
    if w.ndim != 1 or w.size == 0 or (w < 0).any() or not np.isfinite(w).all() or w.sum() == 0:
        raise ValueError("kish_ess needs a non-empty (N,) array of finite non-negative weights, not all 0")
    return float(w.sum() ** 2 / (w ** 2).sum())


# ---------------------------------------------------------------------- the sum-tree
class SumTree:
    """A binary tree over ``capacity`` leaves whose inner nodes hold the sums of their children.

    Leaf ``i`` (value ``v_i >= 0``) is found from a mass ``m in [0, total)`` by walking down: the
    leaf whose prefix-sum interval ``[v_0 + ... + v_{i-1}, ... + v_i)`` holds ``m``. Setting one leaf
    costs O(log N), all leaves O(N), a draw O(log N). The array ``nodes`` (``2 * size`` floats,
    ``size`` the next power of two, root at 1, leaves at ``size + i``) is the whole state.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.size = 1 << max(0, (self.capacity - 1).bit_length())
        self.nodes = np.zeros(2 * self.size)

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    @property
    def leaves(self) -> np.ndarray:
        return self.nodes[self.size:self.size + self.capacity]

    def update(self, i: int, value: float) -> None:
        if not 0 <= i < self.capacity:
            raise IndexError(f"leaf {i} outside [0, {self.capacity})")
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"leaf values must be finite and >= 0, got {value}")
        j = self.size + i
        self.nodes[j] = value
        j //= 2
        while j >= 1:
            self.nodes[j] = self.nodes[2 * j] + self.nodes[2 * j + 1]
            j //= 2

    def set_all(self, values) -> None:
        """Replace every leaf (``(capacity,)`` values) and rebuild the sums bottom-up in O(N)."""
        v = np.asarray(values, dtype=float)
        if v.shape != (self.capacity,) or (v < 0).any() or not np.isfinite(v).all():
            raise ValueError(f"set_all needs ({self.capacity},) finite values >= 0, got shape {v.shape}")
        self.nodes[:] = 0.0
        self.nodes[self.size:self.size + self.capacity] = v
        level = self.size
        while level > 1:
            half = level // 2
            self.nodes[half:level] = self.nodes[level:2 * level:2] + self.nodes[level + 1:2 * level:2]
            level = half

    def find(self, mass: float) -> int:
        """The leaf whose prefix-sum interval holds ``mass`` (``0 <= mass < total``)."""
        if self.total <= 0:
            raise ValueError("the tree is empty (total 0): nothing to sample")
        mass = min(max(float(mass), 0.0), np.nextafter(self.total, 0.0))
        j = 1
        while j < self.size:
            left = self.nodes[2 * j]
            if mass < left:
                j = 2 * j
            else:
                mass -= left
                j = 2 * j + 1
        i = j - self.size
        while self.nodes[self.size + i] == 0 and i > 0:  # float round-off landed on an empty leaf
            i -= 1
        return i

    def sample(self, uniforms, stratified: bool = True) -> np.ndarray:
        """Leaves drawn with probability ``v_i / total``, one per uniform in ``[0, 1)``.

        Stratified (PER's rule): draw ``k`` of ``n`` falls in the ``k``-th of ``n`` equal slices of the
        total mass, so every draw is still marginally proportional when ``k`` is uniform over the
        slices, and a batch covers the mass evenly."""
        u = np.asarray(uniforms, dtype=float).reshape(-1)
        n = len(u)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        if ((u < 0) | (u >= 1)).any():
            raise ValueError("uniforms must lie in [0, 1)")
        masses = ((np.arange(n) + u) / n if stratified else u) * self.total
        return np.array([self.find(m) for m in masses], dtype=np.int64)


# ---------------------------------------------------------------------- the buffer
class ReplayBuffer:
    """A FIFO ring of ``capacity`` stored items with base priorities, storage steps and a sum-tree.

    ================  ===============================================================
    items             ``capacity`` payloads (None where empty)
    base              ``(capacity,)`` base priorities (``|R| + eps`` for critic-free RL)
    stored_at         ``(capacity,)`` the gradient step at which each item was stored
    tree              :class:`SumTree` of ``(base * exp(-age / tau))^alpha`` after :meth:`refresh`
    alpha, tau        priority exponent; age decay (None: standard PER, no decay)
    ================  ===============================================================

    The whole object is plain data (NumPy arrays and Python objects), so ``torch.save`` of a
    trainer's state stores it and ``torch.load`` restores it exactly.
    """

    def __init__(self, capacity: int, alpha: float = 0.6, tau: float | None = None):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if tau is not None and not tau > 0:
            raise ValueError(f"tau must be > 0 or None, got {tau}")
        self.capacity, self.alpha, self.tau = int(capacity), float(alpha), tau
        self.items: list[Any] = [None] * self.capacity
        self.base = np.zeros(self.capacity)
        self.stored_at = np.zeros(self.capacity, dtype=np.int64)
        self.valid = np.zeros(self.capacity, dtype=bool)
        self.next_slot = 0
        self.now = 0
        self.tree = SumTree(self.capacity)

    def __len__(self) -> int:
        return int(self.valid.sum())

    def settings(self) -> tuple:
        return (self.capacity, self.alpha, self.tau)

    def add(self, item: Any, base_priority: float, step: int) -> int:
        """Store ``item`` (evicting the oldest when full) and return its slot. Until the next
        :meth:`refresh` it carries the largest current leaf value (PER: new items get max priority)."""
        if not (base_priority > 0 and math.isfinite(base_priority)):
            raise ValueError(f"base priorities must be finite and > 0, got {base_priority}")
        slot = self.next_slot
        self.items[slot], self.base[slot], self.stored_at[slot], self.valid[slot] = item, base_priority, step, True
        self.next_slot = (slot + 1) % self.capacity
        self.tree.update(slot, max(float(self.tree.leaves.max()), base_priority ** self.alpha))
        return slot

    def ages(self, step: int | None = None) -> np.ndarray:
        """``(capacity,)`` ages ``step - stored_at`` (0 on empty slots)."""
        now = self.now if step is None else step
        return np.where(self.valid, now - self.stored_at, 0)

    def priorities(self, step: int) -> np.ndarray:
        """``(capacity,)`` effective priorities ``base * exp(-age / tau)`` (0 on empty slots)."""
        ages = self.ages(step)
        if (ages < 0).any():
            raise ValueError(f"step {step} is before an item's storage step {int(self.stored_at[self.valid].max())}")
        return np.where(self.valid, self.base * age_decay(ages, self.tau), 0.0)

    def refresh(self, step: int) -> None:
        """Recompute every leaf from its base priority and its age at ``step`` (O(N), all items: the
        authors' code notes that decaying only the items just sampled leaves stale priorities)."""
        self.now = int(step)
        p = self.priorities(step)
        self.tree.set_all(np.where(self.valid, p ** self.alpha, 0.0))

    def probabilities(self) -> np.ndarray:
        """``(capacity,)`` sampling probabilities of the tree's current leaves."""
        if self.tree.total <= 0:
            raise ValueError("the replay buffer is empty")
        return self.tree.leaves / self.tree.total

    def sample(self, n: int, uniforms, beta: float = 0.4) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` slots (stratified, with replacement) and their PER weights.

        ========  ======  ==========================================================
        n         int     number of draws, <= number of stored items (else ValueError)
        uniforms  (n,)    uniforms in [0, 1) (from the caller's seeded generator)
        beta      float   importance-weight exponent
        return    2       ``(slots (n,), weights (n,) in (0, 1])``
        ========  ======  ==========================================================
        """
        if n > len(self):
            raise ValueError(f"a replay of {n} items was requested but the buffer holds {len(self)}")
        slots = self.tree.sample(uniforms)
        probs = self.probabilities()
        w_all = np.zeros(self.capacity)
        w_all[self.valid] = importance_weights(probs[self.valid], beta)
        return slots, w_all[slots]


# ---------------------------------------------------------------------- the registered sampler
def group_priority(scores: torch.Tensor, kind: str, epsilon: float = 1e-6) -> float:
    """The base priority of a stored group of ``G`` rows from its ``(G,)`` rewards: ``"reward"``
    mean ``|R|`` (the authors' critic-free rule, per trajectory), ``"advantage"`` mean ``|R - mean R|``
    (a group whose rewards are all equal teaches nothing), ``"uniform"`` 1; plus ``epsilon``."""
    r = torch.as_tensor(scores, dtype=torch.float64).reshape(-1)
    if kind == "reward":
        return float(r.abs().mean()) + epsilon
    if kind == "advantage":
        return float((r - r.mean()).abs().mean()) + epsilon
    if kind == "uniform":
        return 1.0
    raise ValueError(f"unknown priority {kind!r}; choose one of {PRIORITIES}")


def _with_extras(batch: RolloutBatch, is_weight: torch.Tensor, age: torch.Tensor) -> RolloutBatch:
    mask = torch.ones_like(batch.response_mask)
    return replace(batch, extras={**batch.extras, "is_weight": is_weight[:, None] * mask, "age": age[:, None] * mask})


@register_sampler("replay")
def replay_sampler(model, tokenizer, prompts, config, generator, state, examples, pool, task, reward, step,
                   base: str = "policy", replay_groups: int = 4, capacity: int = 256, alpha: float = 0.6,
                   tau: float | None = None, beta: float = 0.4, beta_final: float | None = None,
                   priority: str = "reward", epsilon: float = 1e-6, base_kwargs: dict | None = None) -> RolloutBatch:
    """Fresh groups from the ``base`` sampler plus ``replay_groups`` groups replayed from a buffer of
    past steps' groups (Freshness-Aware PER with ``tau``, standard PER with ``tau=None``, uniform
    replay with ``priority="uniform"``).

    Each step: refresh every stored priority to this step's ages; if the buffer holds at least
    ``replay_groups`` groups, draw that many (stratified, by ``P(i) ~ p_i^alpha``) with their PER
    weights; then store this step's fresh groups (so replayed groups are at least one step old, and
    replay starts at the step after the buffer first holds ``replay_groups`` groups: a documented
    rule, not an error). ``replay_groups > capacity`` is a ValueError. ``beta`` is the PER weights'
    exponent; with ``beta_final`` it is annealed linearly from ``beta`` at step 1 to ``beta_final`` at
    ``config.steps`` (the authors anneal 0.4 to 1). ``base_kwargs`` configures the base sampler (e.g.
    ``{"lag": 2}`` for ``base="multiturn"``); a keyword it does not take is a ValueError.

    The PER weights reach the update only through a policy loss that names ``is_weight`` (``"ppo_is"``).
    With another loss they would be dropped, so that combination is a ValueError whenever the weights
    can differ from 1 (``beta`` or ``beta_final`` above 0, ``priority`` not ``"uniform"``, and
    ``replay_groups`` above 0): use ``policy_loss="ppo_is"``, or ``beta=0`` to replay without the
    correction (the paper authors' buffer computes the weights only on request).

    ============ ========= ==============================================================
    returns      batch     fresh rows, then replayed rows; ``index`` offset by
                           :func:`~rlcourse.lm.sampling.cat_batches` so that no replayed group
                           joins a fresh one; ``logprobs`` of replayed rows are the stored
                           behaviour log-probs (the policy loss's ``old_log_prob``), ``scores``
                           the stored rewards
    extras       ``(B,T)`` ``is_weight`` (1 on fresh rows, the PER weight on replayed ones) and
                           ``age`` (0 fresh, steps since storage replayed)
    ============ ========= ==============================================================

    The buffer lives in ``state["replay_buffer"]`` (saved in trainer checkpoints). Every row carries
    its example in ``batch.examples`` (a replayed group's is the one it was sampled for).
    """
    if replay_groups < 0 or replay_groups > capacity:
        raise ValueError(f"replay_groups must lie in [0, capacity={capacity}], got {replay_groups}")
    if priority not in PRIORITIES:
        raise ValueError(f"unknown priority {priority!r}; choose one of {PRIORITIES}")
    weighted = replay_groups > 0 and priority != "uniform" and (beta > 0 or bool(beta_final))
    loss = get_policy_loss(config.policy_loss)
    if weighted and "is_weight" not in inspect.signature(loss).parameters:
        name = config.policy_loss if isinstance(config.policy_loss, str) else getattr(loss, "__name__", repr(loss))
        raise ValueError(f"the replay sampler's PER importance weights (beta={beta}, beta_final={beta_final}) reach "
                         f"only a policy loss that takes is_weight, and policy_loss={name!r} does not: use "
                         "policy_loss='ppo_is', or sampler_kwargs beta=0 (and no beta_final) to replay without the "
                         "correction")
    if beta_final is not None:
        beta = beta + (beta_final - beta) * min(1.0, (step - 1) / max(1, config.steps - 1))
    buf: ReplayBuffer = state.setdefault("replay_buffer", ReplayBuffer(capacity, alpha, tau))
    if buf.settings() != (capacity, float(alpha), tau):
        raise ValueError(f"state['replay_buffer'] was built with (capacity, alpha, tau) = {buf.settings()}, "
                         f"not {(capacity, float(alpha), tau)}")
    fresh = call_base_sampler("replay", replay_sampler, base, base_kwargs, locals())
    if {"is_weight", "age"} & set(fresh.extras):
        raise ValueError("the base sampler already records extras 'is_weight'/'age'; the replay sampler sets them")
    per_row = fresh.examples if fresh.examples is not None else [examples[int(i)] for i in fresh.index]
    scores = fresh.scores if fresh.scores is not None else \
        torch.as_tensor(reward(fresh, per_row, task, state), dtype=torch.float32)
    scores = scores.reshape(-1).float()
    groups = [(g, (fresh.index == g).nonzero().squeeze(-1)) for g in torch.unique(fresh.index).tolist()]
    n_fresh = len(fresh)
    parts, weights, ages = [replace(fresh, scores=scores, examples=per_row)], [torch.ones(n_fresh)], [torch.zeros(n_fresh)]
    buf.refresh(step)
    if replay_groups and len(buf) >= replay_groups:
        u = torch.rand(replay_groups, generator=generator, dtype=torch.float64).numpy()
        slots, w = buf.sample(replay_groups, u, beta)
        for slot, wi in zip(slots.tolist(), w.tolist()):
            rows, example = buf.items[slot]
            parts.append(replace(rows, examples=[example] * len(rows)))
            weights.append(torch.full((len(rows),), float(wi)))
            ages.append(torch.full((len(rows),), float(step - buf.stored_at[slot])))
    for g, rows in groups:
        sub = fresh.select(rows)
        stored = replace(sub, index=torch.zeros_like(sub.index), scores=scores[rows].clone(),
                         extras={k: v.clone() for k, v in sub.extras.items()})
        buf.add((stored, per_row[int(rows[0])]), group_priority(scores[rows], priority, epsilon), step)
    for p in parts[1:]:
        if set(p.extras) != set(fresh.extras):
            raise ValueError("a replayed group records other extras than the base sampler's batch: "
                             f"{sorted(p.extras)} vs {sorted(fresh.extras)}")
    batch = cat_batches(parts, tokenizer.pad_token_id)  # each row carries its example (batch.examples)
    return _with_extras(batch, torch.cat(weights), torch.cat(ages))


# ---------------------------------------------------------------------- the registered loss
@register_policy_loss("ppo_is")
def compute_ppo_is_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                        response_mask: torch.Tensor, is_weight: torch.Tensor | None = None,
                        clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2, clip_ratio_c: float | None = None,
                        loss_agg_mode: str = "token-mean", *, global_tokens: float | None = None,
                        global_seqs: float | None = None, max_len: int | None = None):
    """PPO's clipped surrogate with each token's loss multiplied by its PER weight ``is_weight``
    (a sampler's extra; None: weight 1, the ``"vanilla"`` loss).

    For ``w >= 0``, ``max(-A w rho, -A w clip(rho)) = w max(-A rho, -A clip(rho))`` (and the dual
    clip's cap scales the same way), so the weighted loss is the vanilla loss with advantages
    ``w * A``; the clip metrics are those of the unweighted tokens.

    ==============  =========  =================================================
    is_weight       ``(B,T)``  weights in [0, 1] (``replay`` sampler), or None
    others          ``(B,T)``  as in ``compute_policy_loss`` (``"vanilla"``)
    ==============  =========  =================================================
    """
    if is_weight is not None:
        if tuple(is_weight.shape) != tuple(advantages.shape):
            raise ValueError(f"is_weight has shape {tuple(is_weight.shape)}, advantages {tuple(advantages.shape)}")
        if (is_weight < 0).any() or not torch.isfinite(is_weight).all():
            raise ValueError("is_weight must be finite and >= 0")
        advantages = advantages * is_weight.to(advantages.dtype)
    return compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low=clip_ratio_low,
                               clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
                               loss_agg_mode=loss_agg_mode, global_tokens=global_tokens,
                               global_seqs=global_seqs, max_len=max_len)


compute_ppo_is_loss.zero_at_zero_advantage = True


def staleness_fraction(ages: Sequence[float], threshold: float) -> float:
    """Share of replay draws whose age exceeds ``threshold`` steps."""
    a = np.asarray(ages, dtype=float)
    if a.size == 0:
        raise ValueError("staleness_fraction needs at least one age")
    return float((a > threshold).mean())
