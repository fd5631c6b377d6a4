"""SPS: alternating RL and inverse-RL phases against probability squeezing.

*SPS: Steering Probability Squeezing for Better Exploration in Reinforcement Learning for Large
Language Models*, Yifu Huo, Chenglong Wang, Ziming Zhu, Shunjie Xing, Peinan Feng, Tongran Liu,
Qiaozhi He, Tianhua Zhou, Xiaojia Chang, Jingbo Zhu, Zhengtao Yu and Tong Xiao (2026,
arXiv:2604.16995). The abstract attributes RLVR's narrow exploration to a *squeezing effect*
(probability mass concentrating on a few high-reward trajectories) and alternates RL phases with
inverse-RL phases that treat the policy's own correct rollouts as demonstrations. No code is
public: the IRL phase below (a MaxEnt / AIRL reward fitted to the de-duplicated demonstrations,
and the alternation schedule) is the course's **reconstruction**.

This module holds

* the pure functions of the derivation: the softmax policy gradient, the shared-strategy model of
  squeezing, tabular MaxEnt IRL, pass@k from a per-prompt success rate, the IRL-phase reward;
* the registered reward ``"sps"`` (and :func:`make_sps_reward` for other schedules): it runs the
  alternation inside the unchanged trainer, keeping its phase counter and the demonstration set in
  ``state["sps"]`` (saved in checkpoints);
* the shared-strategy contextual bandit and its per-seed trainer :func:`train_bandit` (GRPO against
  GRPO + IRL).

The chapter's experiments (the bandit's grid and the tiny language model on countdown, where many
different expressions are correct) and their claims are studies in :mod:`rlcourse.studies.sps`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..rewards import get_reward, register_reward
from .noisy import group_advantages

PAPER = ("SPS: Steering Probability Squeezing for Better Exploration in Reinforcement Learning for Large Language "
         "Models, Y. Huo, C. Wang, Z. Zhu, S. Xing, P. Feng, T. Liu, Q. He, T. Zhou, X. Chang, J. Zhu, Z. Yu, T. Xiao, "
         "2026, arXiv:2604.16995")


# ---------------------------------------------------------------------- the derivation
def softmax(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis (float64)."""
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def softmax_pg(z: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Exact gradient of ``J(z) = sum_j softmax(z)_j r_j``: ``dJ/dz_j = pi_j (r_j - J)``.

    ====== ======== ===============================
    z      ``(K,)`` logits of K trajectories
    r      ``(K,)`` their rewards
    return ``(K,)`` dJ/dz
    ====== ======== ===============================
    """
    z, r = np.asarray(z, dtype=np.float64), np.asarray(r, dtype=np.float64)
    if z.shape != r.shape or z.ndim != 1:
        raise ValueError(f"z and r must be 1-D of the same shape, got {z.shape} and {r.shape}")
    pi = softmax(z)
    return pi * (r - pi @ r)


def shared_strategy_objective(z: np.ndarray, c1: float) -> tuple[float, np.ndarray]:
    """Expected reward of one strategy softmax ``pi = softmax(z)`` over ``{s1, s2}`` shared by all prompts,
    where ``s1`` solves a share ``c1`` of the prompts and ``s2`` the rest: ``J = pi_1 c1 + pi_2 (1 - c1)``.

    ====== ======== ====================================================
    z      ``(2,)`` shared logits
    return          ``(J, dJ/dz)``; ``dJ/dz_1 = pi_1 pi_2 (c1 - c2) = -dJ/dz_2``
    ====== ======== ====================================================
    """
    if not 0.0 <= c1 <= 1.0:
        raise ValueError(f"c1 must be a share in [0, 1], got {c1}")
    r = np.array([c1, 1.0 - c1])
    pi = softmax(z)
    return float(pi @ r), softmax_pg(z, r)


def shared_strategy_flow(c1: float, lr: float, steps: int, z0=(0.0, 0.0)) -> np.ndarray:
    """Gradient ascent on :func:`shared_strategy_objective`; returns ``pi_2`` after each step ``(steps + 1,)``."""
    z, out = np.array(z0, dtype=np.float64), []
    for _ in range(steps + 1):
        out.append(softmax(z)[1])
        z = z + lr * shared_strategy_objective(z, c1)[1]
    return np.array(out)


def pass_at_k_from_q(q: np.ndarray, k: int) -> np.ndarray:
    """pass@k of prompts each solved by one sample with probability ``q``: ``1 - (1 - q)^k`` (same shape as q)."""
    q = np.asarray(q, dtype=np.float64)
    if k < 1 or np.any((q < 0) | (q > 1)):
        raise ValueError(f"need k >= 1 and q in [0, 1], got k={k}")
    return 1.0 - (1.0 - q) ** k


def maxent_irl_tabular(counts: np.ndarray, steps: int = 2000, lr: float = 1.0) -> np.ndarray:
    """Tabular MaxEnt IRL: gradient ascent from 0 on ``L(phi) = E_D[phi] - log sum_tau exp(phi_tau)``.

    ====== ======== =============================================================
    counts ``(K,)`` how often each trajectory occurs in the demonstrations D (>= 0)
    return ``(K,)`` the fitted reward phi; ``softmax(phi)`` tends to ``counts / counts.sum()``
    ====== ======== =============================================================

    The gradient is ``p_D - softmax(phi)``: it vanishes exactly when the model distribution matches
    the empirical demonstration histogram. With de-duplicated demonstrations (each count 0 or 1) the
    optimum is uniform over the discovered trajectories.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 1 or np.any(counts < 0) or counts.sum() <= 0:
        raise ValueError("counts must be a 1-D array of non-negative counts with a positive total")
    p_d, phi = counts / counts.sum(), np.zeros_like(counts)
    for _ in range(steps):
        phi += lr * (p_d - softmax(phi))
    return phi


def irl_reward(logp: torch.Tensor, in_demos: torch.Tensor, n_demos: torch.Tensor, r_min: float = -3.0,
               r_max: float = 3.0) -> torch.Tensor:
    """The IRL phase's reward [reconstruction]: the AIRL reward ``log D - log(1 - D)`` at the optimal
    discriminator ``D = p_D / (p_D + pi)`` of the de-duplicated demonstration distribution
    ``p_D = uniform over the n distinct correct responses found for the prompt``, which is
    ``log p_D(y) - log pi(y)``, clipped to ``[r_min, r_max]`` (a response outside the demonstrations,
    where ``log p_D = -inf``, gets ``r_min``).

    ======== ======== ==========================================================
    logp     ``(B,)`` log pi(y | x) of each response (summed over its tokens)
    in_demos ``(B,)`` bool, the response is one of its prompt's demonstrations
    n_demos  ``(B,)`` number of distinct demonstrations of the row's prompt (>= 1 where in_demos)
    return   ``(B,)`` the reward
    ======== ======== ==========================================================
    """
    if not (logp.shape == in_demos.shape == n_demos.shape) or logp.dim() != 1:
        raise ValueError(f"logp, in_demos and n_demos must be (B,), got {tuple(logp.shape)}, "
                         f"{tuple(in_demos.shape)}, {tuple(n_demos.shape)}")
    if r_min >= r_max:
        raise ValueError(f"need r_min < r_max, got {r_min} and {r_max}")
    if bool((in_demos & (n_demos < 1)).any()):
        raise ValueError("a row marked in_demos has n_demos < 1")
    inside = -torch.log(n_demos.clamp(min=1).double()) - logp.double()
    r = torch.where(in_demos, inside, torch.full_like(inside, r_min))
    return r.clamp(r_min, r_max).float()


# ---------------------------------------------------------------------- the registered reward
def phase_of(call: int, n_rl: int, n_irl: int) -> str:
    """``"rl"`` or ``"irl"`` for the ``call``-th step (0-based): ``n_rl`` RL steps, then ``n_irl`` IRL steps."""
    if n_rl < 1 or n_irl < 0:
        raise ValueError(f"need n_rl >= 1 and n_irl >= 0, got {n_rl} and {n_irl}")
    return "rl" if call % (n_rl + n_irl) < n_rl else "irl"


class SPSReward:
    """The SPS schedule as a reward of the loop (signature ``(batch, examples, task, state)``).

    Every step scores the rows with ``base`` (the verifier) and adds each correct response to its
    prompt's demonstration set, once (de-duplicated by text). Steps ``0 .. n_rl - 1`` of each period
    return the verifier's reward (ordinary RL, e.g. GRPO); the next ``n_irl`` steps return
    :func:`irl_reward` (the IRL phase), with which the loop's estimator and loss take an
    entropy-regularised step towards the uniform distribution over the discovered correct responses.

    Everything lives in ``state["sps"]``: ``calls`` (steps scored so far) and ``demos``
    (``{prompt: [distinct correct responses]}``), so a resumed run continues exactly. The reward also
    reports ``sps_irl_phase``, ``sps_verifier_reward`` and ``sps_demos`` in ``batch.metrics``.
    """

    def __init__(self, n_rl: int = 10, n_irl: int = 10, r_min: float = -3.0, r_max: float = 3.0,
                 base="task", correct_at: float = 1.0):
        phase_of(0, n_rl, n_irl)
        if r_min >= r_max:
            raise ValueError(f"need r_min < r_max, got {r_min} and {r_max}")
        self.n_rl, self.n_irl, self.r_min, self.r_max = n_rl, n_irl, r_min, r_max
        self.base, self.correct_at = base, correct_at
        self.__name__ = f"sps(n_rl={n_rl}, n_irl={n_irl})"

    def __call__(self, batch, examples, task, state):
        st = state.setdefault("sps", {"calls": 0, "demos": {}})
        base = get_reward(self.base) if isinstance(self.base, str) else self.base
        verifier = torch.as_tensor(base(batch, examples, task, state), dtype=torch.float32).reshape(-1)
        if verifier.shape[0] != len(batch):
            raise ValueError(f"the base reward returned {verifier.shape[0]} scores for {len(batch)} rows")
        demos = st["demos"]
        for ex, text, ok in zip(examples, batch.texts, verifier.tolist()):
            if ok >= self.correct_at and text not in demos.setdefault(ex.prompt, []):
                demos[ex.prompt].append(text)
        phase = phase_of(st["calls"], self.n_rl, self.n_irl)
        st["calls"] += 1
        batch.metrics.update(sps_irl_phase=float(phase == "irl"), sps_verifier_reward=float(verifier.mean()),
                             sps_demos=float(sum(len(v) for v in demos.values())))
        if phase == "rl":
            return verifier
        logp = (batch.logprobs * batch.response_mask).sum(1)
        in_demos = torch.tensor([t in demos.get(ex.prompt, ()) for ex, t in zip(examples, batch.texts)])
        n_demos = torch.tensor([len(demos.get(ex.prompt, ())) for ex in examples])
        return irl_reward(logp, in_demos, n_demos, self.r_min, self.r_max)


def make_sps_reward(n_rl: int = 10, n_irl: int = 10, r_min: float = -3.0, r_max: float = 3.0, base="task",
                    name: str | None = None) -> SPSReward:
    """An :class:`SPSReward` with this schedule; pass it as ``RLConfig(reward=...)``, or give a ``name``
    to also register it so that ``RLConfig(reward=name)`` finds it."""
    reward = SPSReward(n_rl, n_irl, r_min, r_max, base)
    if name is not None:
        register_reward(name)(reward)
    return reward


register_reward("sps")(SPSReward())


# ---------------------------------------------------------------------- the shared-strategy bandit
@dataclass(frozen=True)
class BanditConfig:
    """The shared-strategy contextual bandit and its training run.

    Each prompt has a type: with probability ``c1`` strategy ``s1`` solves it, otherwise only ``s2``
    does. The policy's logits are ``b + W f(x)``: a shared bias ``b`` (learning rate ``lr``) and a
    prompt-conditional head ``W`` on ``d`` noisy features of the type (learning rate ``lr * head_scale``,
    slow). One step samples ``prompts_per_step`` training prompts with ``group`` strategies each.
    SPS: ``n_rl`` GRPO steps, then ``n_irl`` IRL steps (``irl_fit_steps`` ascent steps of MaxEnt IRL on the
    de-duplicated correct (prompt, strategy) pairs with a reward model of the policy's form, then a GRPO
    step on ``r_phi(x, s) - alpha log pi(s | x)``), repeated.
    """

    n_train: int = 100
    n_test: int = 100
    c1: float = 0.8
    d: int = 8
    feature_noise: float = 1.0
    steps: int = 300
    prompts_per_step: int = 16
    group: int = 8
    lr: float = 0.3
    head_scale: float = 0.02
    n_rl: int = 10
    n_irl: int = 10
    irl_fit_steps: int = 5
    irl_lr: float = 1.0
    alpha: float = 1.0
    eval_every: int = 10
    k: int = 16


def make_bandit(cfg: BanditConfig, seed: int) -> dict:
    """Types ``(n,)`` (0: s1 solves, 1: s2 solves) and features ``(n, d)`` of the training and held-out prompts."""
    rng = np.random.default_rng([seed, 13])
    means = rng.normal(size=(2, cfg.d)) / np.sqrt(cfg.d)
    out = {}
    for split, n in (("train", cfg.n_train), ("test", cfg.n_test)):
        t = (rng.random(n) >= cfg.c1).astype(int)
        out[split] = (t, means[t] + cfg.feature_noise * rng.normal(size=(n, cfg.d)) / np.sqrt(cfg.d))
    return out


def bandit_logits(params: tuple[np.ndarray, np.ndarray], f: np.ndarray) -> np.ndarray:
    """``b + W f`` for prompts with features ``f`` ``(n, d)``: logits ``(n, 2)``."""
    b, W = params
    return b[None, :] + f @ W.T


def bandit_metrics(params, t: np.ndarray, f: np.ndarray, k: int) -> dict:
    """Exact pass@1, pass@k (:func:`pass_at_k_from_q`), mean strategy entropy and mean pi(s2) on prompts ``(t, f)``."""
    pi = softmax(bandit_logits(params, f))
    q = pi[np.arange(len(t)), t]
    return {"pass1": float(q.mean()), "passk": float(pass_at_k_from_q(q, k).mean()),
            "entropy": float(-(pi * np.log(pi + 1e-300)).sum(1).mean()), "pi2": float(pi[:, 1].mean())}


def _pg_step(params, f, s, adv, lr, head_scale):
    """One SGD ascent step of sum_i adv_i log pi(s_i | x_i) / n over rows ``(f (n,d), s (n,), adv (n,))``."""
    b, W = params
    pi = softmax(bandit_logits(params, f))
    g = -pi * adv[:, None]
    g[np.arange(len(s)), s] += adv
    g /= len(s)
    return b + lr * g.sum(0), W + lr * head_scale * g.T @ f


def fit_irl_reward(phi, demos: np.ndarray, f: np.ndarray, steps: int, lr: float, head_scale: float):
    """MaxEnt IRL with the exact partition over the two strategies: ascent on
    ``mean_{(x, s) in D} [r_phi(x, s) - log sum_s' exp r_phi(x, s')]`` for ``steps`` steps.

    ====== ========== ====================================================
    phi    ``(b, W)``  reward model of the policy's form, ``(2,)`` and ``(2, d)``; its head
                       learns at ``lr * head_scale``, as slowly as the policy's
    demos  ``(m, 2)``  de-duplicated (prompt index, strategy) pairs
    f      ``(n, d)``  features of the training prompts
    ====== ========== ====================================================
    """
    fx, s = f[demos[:, 0]], demos[:, 1]
    for _ in range(steps):
        phi = _pg_step(phi, fx, s, np.ones(len(s)), lr, head_scale)
    return phi


def train_bandit(method: str, cfg: BanditConfig, seed: int) -> dict:
    """GRPO (``method="grpo"``) or GRPO + IRL phases (``"sps"``) on the shared-strategy bandit.

    Returns ``steps`` ``(E,)`` (evaluation points), held-out ``pass1``, ``passk``, ``entropy``, ``pi2``
    ``(E,)``, the same on the training prompts (``train_pass1``, ``train_passk``), ``demos`` (distinct
    correct pairs found) and ``irl`` ``(steps,)`` (1 on IRL steps).
    """
    if method not in ("grpo", "sps"):
        raise ValueError(f"method must be 'grpo' or 'sps', got {method!r}")
    data = make_bandit(cfg, seed)
    (t_tr, f_tr), (t_te, f_te) = data["train"], data["test"]
    rng = np.random.default_rng([seed, 7])
    params = (np.zeros(2), np.zeros((2, cfg.d)))
    phi = (np.zeros(2), np.zeros((2, cfg.d)))
    found = np.zeros((cfg.n_train, 2), dtype=bool)
    hist = {key: [] for key in ("steps", "pass1", "passk", "entropy", "pi2", "train_pass1", "train_passk")}
    irl = np.zeros(cfg.steps)

    def log(step):
        te, tr = bandit_metrics(params, t_te, f_te, cfg.k), bandit_metrics(params, t_tr, f_tr, cfg.k)
        hist["steps"].append(step)
        for key in ("pass1", "passk", "entropy", "pi2"):
            hist[key].append(te[key])
        hist["train_pass1"].append(tr["pass1"])
        hist["train_passk"].append(tr["passk"])

    log(0)
    for step in range(cfg.steps):
        x = rng.choice(cfg.n_train, size=cfg.prompts_per_step, replace=False)
        pi = softmax(bandit_logits(params, f_tr[x]))
        s = (rng.random((len(x), cfg.group)) >= pi[:, :1]).astype(int)  # (prompts, G): 0 = s1, 1 = s2
        correct = (s == t_tr[x][:, None]).astype(float)
        found[np.repeat(x, cfg.group)[correct.reshape(-1) == 1], s.reshape(-1)[correct.reshape(-1) == 1]] = True
        phase = phase_of(step, cfg.n_rl, cfg.n_irl) if method == "sps" else "rl"
        if phase == "rl":
            r = correct
        else:
            irl[step] = 1
            demos = np.argwhere(found)
            phi = fit_irl_reward(phi, demos, f_tr, cfg.irl_fit_steps, cfg.irl_lr, cfg.head_scale)
            rphi = bandit_logits(phi, f_tr[x])
            r = np.take_along_axis(rphi, s, 1) - cfg.alpha * np.log(np.take_along_axis(pi, s, 1))
        adv = group_advantages(r)
        params = _pg_step(params, np.repeat(f_tr[x], cfg.group, 0), s.reshape(-1), adv.reshape(-1), cfg.lr,
                          cfg.head_scale)
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            log(step + 1)
    out = {key: np.array(v) for key, v in hist.items()}
    out.update(demos=int(found.sum()), irl=irl)
    return out
