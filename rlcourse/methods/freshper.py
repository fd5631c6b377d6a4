"""Freshness-aware prioritised replay on FrozenLake with a tabular softmax policy (the chapter's toy).

*Freshness-Aware Prioritized Experience Replay for LLM/VLM Reinforcement Learning*, Weiyu Ma et al.
(2026, arXiv:2604.16918). The replay pieces (:class:`~rlcourse.replay.ReplayBuffer`, its sum-tree,
the priorities and importance weights) live in :mod:`rlcourse.replay`, where the registered
``"replay"`` sampler uses them in the language-model loop; this module runs the *same* buffer on
Gymnasium's deterministic FrozenLake (maps of :func:`rlcourse.envs.frozenlake.make_map`), with a
tabular softmax policy trained by a REINFORCE++-style clipped surrogate (the authors' backbone):
advantages are the episode returns normalised over the whole batch (fresh and replayed), each
replayed trajectory's loss is multiplied by its PER weight, and its ratio is taken against the
behaviour log-probs stored with it. Success is measured exactly (dynamic programming over the
horizon), so the curves carry no evaluation noise.

Arms: on-policy (no replay), uniform replay, standard PER as in the authors' buffer (``|R| + eps``, no
decay, a new item at the maximum priority until it is sampled), the same PER with every priority
refreshed each step, and Freshness-Aware PER (``|R| + eps`` times ``exp(-age / tau)``, refreshed each
step), each at the same number of fresh episodes per step. No PER importance weights by default (the
authors' buffer computes them only on request); ``LakeConfig(beta=WEIGHTED_BETA)`` is the weighted
ablation. The chapter's experiments on this toy, and the paper's claims, are the study
:mod:`rlcourse.studies.freshper`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

from ..envs.frozenlake import make_map
from ..replay import ReplayBuffer, kish_ess


# ---------------------------------------------------------------------- the lake
def lake_tables(desc: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gymnasium's deterministic FrozenLake as arrays, read from the environment's own table ``P``.

    ======  =======  ==========================================
    next    (S, A)   next state of action a in state s
    reward  (S, A)   reward of the transition (1 into the goal)
    done    (S, A)   True if the transition ends the episode
    ======  =======  ==========================================
    """
    env = FrozenLakeEnv(desc=desc, is_slippery=False)
    S, A = env.observation_space.n, env.action_space.n
    nxt, rew, done = np.zeros((S, A), np.int64), np.zeros((S, A)), np.zeros((S, A), bool)
    for s in range(S):
        for a in range(A):
            (prob, s2, r, d), = env.P[s][a]
            nxt[s, a], rew[s, a], done[s, a] = s2, r, d
    return nxt, rew, done


def success_probability(pi: np.ndarray, tables, horizon: int, start: int = 0) -> float:
    """Exact probability that the ``(S, A)`` policy ``pi`` reaches the goal within ``horizon`` moves
    (backward induction ``v_h(s) = sum_a pi(a|s) [r(s,a) + (1 - done) v_{h-1}(s')]``)."""
    nxt, rew, done = tables
    v = np.zeros(pi.shape[0])
    for _ in range(horizon):
        v = (pi * (rew + (~done) * v[nxt])).sum(1)
    return float(v[start])


def rollout(logits: torch.Tensor, tables, horizon: int, episodes: int, gen: torch.Generator) -> dict:
    """``episodes`` episodes of the softmax policy, vectorised.

    ========  =========  ==========================================================
    states    (E, H)     state before each move (0 after the episode ended)
    actions   (E, H)     moves taken
    logp      (E, H)     behaviour log-probs of the moves (float32)
    mask      (E, H)     1 on the moves of the episode
    R         (E,)       return: 1 if the goal was reached within ``horizon`` moves
    ========  =========  ==========================================================
    """
    nxt, rew, done = (torch.as_tensor(x) for x in tables)
    logp_all = torch.log_softmax(logits.detach(), -1)
    E, H = episodes, horizon
    s = torch.zeros(E, dtype=torch.long)
    alive = torch.ones(E, dtype=torch.bool)
    out = {k: torch.zeros(E, H, dtype=dt) for k, dt in
           (("states", torch.long), ("actions", torch.long), ("logp", torch.float32), ("mask", torch.float32))}
    R = torch.zeros(E)
    for t in range(H):
        a = torch.multinomial(logp_all[s].exp(), 1, generator=gen).squeeze(-1)
        out["states"][:, t], out["actions"][:, t] = s * alive, a * alive
        out["logp"][:, t] = logp_all[s, a] * alive
        out["mask"][:, t] = alive.float()
        R += alive * rew[s, a].float()
        alive = alive & ~done[s, a]
        s = nxt[s, a]
    out["R"] = R
    return out


# ---------------------------------------------------------------------- training
@dataclass(frozen=True)
class LakeConfig:
    size: int = 5  # the map is size x size
    max_turns: int = 12  # horizon
    episodes: int = 16  # fresh episodes per step (the environment budget)
    replay: int = 16  # replayed trajectories per step (0: on-policy)
    steps: int = 150
    lr: float = 0.05  # Adam on the logits
    clip: float = 0.2  # PPO clip of the REINFORCE++-style surrogate
    capacity: int = 4000  # trajectories
    alpha: float = 0.6  # priority exponent (the authors' default)
    beta: tuple[float, float] | None = None  # IS exponent annealed linearly over training; None: no IS
    # weights, the default of the authors' buffer (sample_for_training(compute_importance_weights=False))
    epsilon: float = 1e-6  # added to |R| (the authors' reward priority)
    switch_at: int | None = None  # a planted control: from this step on, the lake is another map


ARMS = {  # name -> (priority: "reward" | "uniform", tau or None, replayed trajectories: None = cfg.replay,
    #          refresh: recompute every priority each step (False: the authors' standard PER, below))
    "on-policy": ("uniform", None, 0, True),
    "uniform replay": ("uniform", None, None, True),
    "PER": ("reward", None, None, False),
    "PER (refreshed)": ("reward", None, None, True),
    "FreshPER": ("reward", 25.0, None, True),
}
WEIGHTED_BETA = (0.4, 1.0)  # the opt-in PER importance weights (the labelled ablation)
MAX_PRIORITY = 1.0  # the priority a new item enters with in the authors' standard PER (before it is sampled)


def lazy_per_add(buf: ReplayBuffer, item, base: float, step: int, max_priority: float) -> int:
    """Store ``item`` as the authors' standard PER does: its leaf is ``max_priority ** alpha`` (the
    largest priority seen so far), whatever its own ``base``, until it is sampled. Returns its slot."""
    slot = buf.add(item, base, step)
    buf.tree.update(slot, max_priority ** buf.alpha)
    return slot


def lazy_per_sampled(buf: ReplayBuffer, slots, max_priority: float) -> float:
    """After a draw of ``slots`` in the authors' standard PER: each drawn item's leaf becomes its own
    ``base ** alpha``; returns the updated running maximum priority."""
    for i in np.unique(np.asarray(slots, dtype=np.int64)):
        buf.tree.update(int(i), float(buf.base[i]) ** buf.alpha)
        max_priority = max(max_priority, float(buf.base[i]))
    return max_priority


def train_lake(arm: tuple, cfg: LakeConfig, seed: int) -> dict:
    """Train a tabular softmax policy on map ``seed`` with one arm ``(priority, tau, replay)``.

    Each step: ``cfg.episodes`` fresh episodes; with ``refresh`` (FreshPER, uniform, the refreshed
    PER), recompute every priority from its base and this step's age; draw ``replay`` stored
    trajectories, with PER weights when ``cfg.beta`` is set (else, and for uniform replay, weight 1);
    store the fresh ones; one Adam step of the registered ``"ppo_is"`` loss, the token-mean over all
    moves of ``w_i * max(-A_i rho_t, -A_i clip(rho_t, 1 - eps, 1 + eps))`` with ``A_i`` the return
    normalised over the batch and ``rho_t = pi_theta / mu`` against the stored behaviour log-probs.

    Without ``refresh`` (``arm[3] = False``) the priorities follow the authors' standard PER: a new item
    enters with the running maximum priority (:data:`MAX_PRIORITY` at first) and gets its own
    ``|R| + eps`` only once it has been sampled, so a failure nobody drew keeps the maximum priority.

    Returns per step ``success`` (exact, on the current map), and over all draws ``ages``, and per
    step ``ess`` (Kish ESS of the drawn trajectories' PER weights over their number),
    ``replay_weight`` (their mean weight), ``success_weight`` (the mean weight of the drawn
    trajectories that reached the goal, at the steps that drew one) and ``replayed_success`` (share
    of drawn trajectories that reached the goal), and per step ``kl``, the KL divergence of the
    policy before the update from the policy after it, averaged over the fresh episodes' moves (the
    drift rate kappa of the ESS argument). With ``cfg.switch_at``, the map changes at that step (a planted control in
    which old trajectories are harmful).
    """
    from ..losses import get_policy_loss

    priority, tau, n_replay, refresh = (tuple(arm) + (True,))[:4]
    if not refresh and tau is not None:
        raise ValueError(f"arm {arm!r}: an age decay needs the priorities refreshed every step (refresh=True)")
    n_replay = cfg.replay if n_replay is None else n_replay
    loss_fn = get_policy_loss("ppo_is")
    max_priority = MAX_PRIORITY
    tables = lake_tables(make_map(seed, cfg.size, max_turns=cfg.max_turns))
    gen = torch.Generator().manual_seed(seed)
    logits = torch.zeros(tables[0].shape, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=cfg.lr)
    buf = ReplayBuffer(cfg.capacity, cfg.alpha, tau)
    out = {"success": [], "ages": [], "ess": [], "replayed_success": [], "replay_weight": [], "success_weight": [],
           "kl": []}
    for step in range(1, cfg.steps + 1):
        if cfg.switch_at is not None and step == cfg.switch_at:  # old successes now lead astray
            tables = lake_tables(make_map(10_000 + seed, cfg.size, max_turns=cfg.max_turns))
        fresh = rollout(logits, tables, cfg.max_turns, cfg.episodes, gen)
        if refresh:
            buf.refresh(step)
        parts, weights = [fresh], [torch.ones(cfg.episodes)]
        if n_replay and len(buf) >= n_replay:
            u = torch.rand(n_replay, generator=gen, dtype=torch.float64).numpy()
            beta = 0.0 if cfg.beta is None else cfg.beta[0] + (cfg.beta[1] - cfg.beta[0]) * (step - 1) / max(1, cfg.steps - 1)
            slots, w = buf.sample(n_replay, u, beta)
            if priority == "uniform" or cfg.beta is None:
                w = np.ones_like(w)  # uniform sampling needs no correction; beta None: no IS weights
            if not refresh:  # the authors' standard PER: a sampled item gets its own priority
                max_priority = lazy_per_sampled(buf, slots, max_priority)
            items = [buf.items[i] for i in slots]
            parts.append({k: torch.stack([it[k] for it in items]) for k in fresh})
            weights.append(torch.as_tensor(w, dtype=torch.float32))
            out["ages"].extend((step - buf.stored_at[slots]).tolist())
            out["ess"].append(kish_ess(w) / len(w))
            out["replay_weight"].append(float(np.mean(w)))
            out["replayed_success"].append(float(parts[-1]["R"].mean()))
            won = parts[-1]["R"].numpy() > 0
            if won.any():
                out["success_weight"].append(float(np.mean(w[won])))
        for e in range(cfg.episodes):
            item = {k: v[e] for k, v in fresh.items()}
            base = 1.0 if priority == "uniform" else abs(float(item["R"])) + cfg.epsilon
            if refresh:
                buf.add(item, base, step)
            else:
                lazy_per_add(buf, item, base, step, max_priority)
        batch = {k: torch.cat([p[k] for p in parts]) for k in fresh}
        w = torch.cat(weights)
        R = batch["R"]
        adv = (R - R.mean()) / (R.std() + 1e-6) if len(R) > 1 else torch.zeros_like(R)
        logp = torch.log_softmax(logits, -1)[batch["states"], batch["actions"]]
        mask = batch["mask"].to(logp.dtype)
        loss, _ = loss_fn(old_log_prob=batch["logp"], log_prob=logp, advantages=adv[:, None].expand_as(logp),
                          response_mask=mask, is_weight=w[:, None].expand_as(logp), clip_ratio_low=cfg.clip,
                          clip_ratio_high=cfg.clip)
        opt.zero_grad()
        loss.backward()
        before = torch.log_softmax(logits.detach(), -1)
        opt.step()
        with torch.no_grad():  # KL(pi_before || pi_after) over the moves of the fresh episodes
            after = torch.log_softmax(logits, -1)
            kl_s = (before.exp() * (before - after)).sum(-1)[fresh["states"]]
            out["kl"].append(float((kl_s * fresh["mask"]).sum() / fresh["mask"].sum()))
        with torch.no_grad():
            out["success"].append(success_probability(torch.softmax(logits, -1).numpy(), tables, cfg.max_turns))
    return {k: np.asarray(v, dtype=float) for k, v in out.items()}
