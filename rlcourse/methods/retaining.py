"""Retaining by doing: on-policy data and forgetting (Chen, Razin, Narasimhan, Chen, 2025, arXiv:2510.18874).

The chapter's model of forgetting and its on-policy remedy:

1. The two-Gaussian model. The target ``p = w N(old) + (1 - w) N(new)`` holds prior knowledge (the
   old mode) and the target task (the new mode); the policy is a mixture of two Gaussians whose old
   component moves slowly (:class:`TwoModeSetting`). SFT fits the new task's data (forward KL, mode
   covering: :func:`sft_gradient`); RL scores the policy's own new-task samples (reverse KL, mode
   seeking: :func:`rl_gradient`); :func:`mode_overlap` measures how much of each mode the policy keeps.
2. SFT on the policy's own correct samples (:func:`own_correct_samples`), and the registered estimator
   ``"self_sft"``, the same update done on-policy inside the loop (RAFT).

The experiments (both tiers' runs, arms, summaries) are in :mod:`rlcourse.studies.retaining`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..advantages import outcome_scores, register_estimator
from ..tasks import Example, Task, get_task

PAPER = ("Retaining by Doing: The Role of On-Policy Data in Mitigating Forgetting, Chen, Razin, Narasimhan "
         "and Chen, 2025, arXiv:2510.18874")
PARAMS = ("pi1", "mu1", "sigma1", "mu2", "sigma2")  # the mixture policy's parameters, in this order


# ---------------------------------------------------------------------- Gaussians
def normal_pdf(x: np.ndarray, mu: float, sigma: float) -> np.ndarray:
    """Density of ``N(mu, sigma^2)`` at ``x`` (any shape)."""
    if not sigma > 0:
        raise ValueError(f"sigma must be positive, got {sigma}")
    x = np.asarray(x, dtype=float)
    return np.exp(-0.5 * ((x - mu) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))


def gaussian_kl(mu_p: float, sigma_p: float, mu_q: float, sigma_q: float) -> float:
    """``KL(N(mu_p, sigma_p^2) || N(mu_q, sigma_q^2))`` in closed form (nats)."""
    if not (sigma_p > 0 and sigma_q > 0):
        raise ValueError(f"standard deviations must be positive, got {sigma_p}, {sigma_q}")
    return math.log(sigma_q / sigma_p) + (sigma_p ** 2 + (mu_p - mu_q) ** 2) / (2 * sigma_q ** 2) - 0.5


@dataclass(frozen=True)
class TwoModeSetting:
    """The target ``p = old_weight N(old_mu, old_sigma^2) + (1 - old_weight) N(new_mu, new_sigma^2)``, the
    policy's initial parameters ``init`` (:data:`PARAMS`), the slow factor on the old component's
    parameters (``pi1, mu1, sigma1``: prior knowledge is hard to move), and the run's size."""

    old_weight: float = 0.75
    old_mu: float = -3.0
    old_sigma: float = 1.0
    new_mu: float = 3.5
    new_sigma: float = 0.7
    init: tuple = (0.75, -3.5, 1.0, 0.5, 0.7)
    slow_factor: float = 0.005
    iters: int = 1000
    n_samples: int = 1000
    beta: float = 0.1
    family: str = "mixture"  # or "single": one Gaussian (init = (mu, sigma)), no slow component

    def __post_init__(self):
        if self.family not in ("mixture", "single"):
            raise ValueError(f"family must be 'mixture' or 'single', got {self.family!r}")
        if len(self.init) != (5 if self.family == "mixture" else 2):
            raise ValueError(f"a {self.family} policy has {5 if self.family == 'mixture' else 2} parameters, "
                             f"init has {len(self.init)}")
        if not 0 < self.old_weight < 1 or self.iters < 1 or self.n_samples < 2 or not self.beta > 0:
            raise ValueError("need 0 < old_weight < 1, iters >= 1, n_samples >= 2 and beta > 0")

    @property
    def speed(self) -> np.ndarray:
        """Per-parameter multiplier of the learning rate."""
        if self.family == "single":
            return np.ones(2)
        s = self.slow_factor
        return np.array([s, s, s, 1.0, 1.0])


def mixture_score(x: np.ndarray, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Density and score of the policy ``q = pi1 N(mu1, s1^2) + (1 - pi1) N(mu2, s2^2)``.

    ========= ========= ===============================================================
    x         ``(n,)``  points
    theta     ``(5,)``  ``pi1, mu1, sigma1, mu2, sigma2``
    returns             q ``(n,)``, score ``(n, 5)``: ``d log q(x) / d theta``; with the responsibility
                        ``r1 = pi1 N1 / q`` the rows are ``(N1 - N2)/q``, ``r1 (x - mu1)/s1^2``,
                        ``r1 ((x - mu1)^2/s1^3 - 1/s1)``, and the same with ``r2 = 1 - r1`` for component 2
    ========= ========= ===============================================================
    """
    x = np.asarray(x, dtype=float)
    theta = np.asarray(theta, dtype=float)
    if x.ndim != 1 or theta.shape != (5,):
        raise ValueError(f"x must be (n,) and theta (5,), got {x.shape} and {theta.shape}")
    pi1, mu1, s1, mu2, s2 = theta
    n1, n2 = normal_pdf(x, mu1, s1), normal_pdf(x, mu2, s2)
    q = np.maximum(pi1 * n1 + (1 - pi1) * n2, 1e-300)
    r1 = pi1 * n1 / q
    r2 = 1.0 - r1
    score = np.stack([(n1 - n2) / q,
                      r1 * (x - mu1) / s1 ** 2, r1 * ((x - mu1) ** 2 / s1 ** 3 - 1 / s1),
                      r2 * (x - mu2) / s2 ** 2, r2 * ((x - mu2) ** 2 / s2 ** 3 - 1 / s2)], 1)
    return q, score


def single_score(x: np.ndarray, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Density ``(n,)`` and score ``(n, 2)`` of one Gaussian ``N(mu, sigma^2)``, ``theta = (mu, sigma)``."""
    x = np.asarray(x, dtype=float)
    mu, s = np.asarray(theta, dtype=float)
    q = np.maximum(normal_pdf(x, mu, s), 1e-300)
    return q, np.stack([(x - mu) / s ** 2, (x - mu) ** 2 / s ** 3 - 1 / s], 1)


def new_component(theta: np.ndarray, setting: TwoModeSetting) -> tuple[float, float]:
    """Mean and standard deviation of the policy's new-task component."""
    return (float(theta[3]), float(theta[4])) if setting.family == "mixture" else (float(theta[0]), float(theta[1]))


def sft_gradient(x: np.ndarray, theta: np.ndarray, setting: TwoModeSetting) -> np.ndarray:
    """Ascent direction of the SFT objective ``E_{x ~ p_new} log q(x)`` (forward KL to the new task's
    data, minus a constant): the mean score over the data ``x`` ``(n,)``. Returns ``(5,)`` or ``(2,)``."""
    score = (mixture_score if setting.family == "mixture" else single_score)(x, theta)[1]
    return score.mean(0)


def sample_policy(theta: np.ndarray, setting: TwoModeSetting, n: int, rng: np.random.Generator) -> np.ndarray:
    """``(n,)`` draws from the whole policy ``q`` (for a mixture: the component first, then the Gaussian)."""
    if setting.family != "mixture":
        return rng.normal(theta[0], theta[1], n)
    pi1, mu1, s1, mu2, s2 = theta
    old = rng.random(n) < pi1
    return np.where(old, rng.normal(mu1, s1, n), rng.normal(mu2, s2, n))


def rl_gradient(x: np.ndarray, theta: np.ndarray, setting: TwoModeSetting, from_policy: bool = False) -> np.ndarray:
    """REINFORCE estimate of ``grad E_q[r]`` from the policy's own samples.

    By default ``x`` ``(n,)`` are drawn from the policy's new component ``q2`` (the modelling
    assumption that on a new-task prompt the policy samples from its new-task component); the reward is
    ``r(x) = log p_new(x) - log(beta q2(x))`` (reverse KL of the new component to the new task, with an
    offset ``-log beta``); the weight ``q(x)/q2(x)`` turns the average into one over the whole policy,
    so the estimate is ``mean(r w score)``. With ``from_policy`` the ``x`` are drawn from the whole
    policy ``q`` (old mode included) and ``w = 1``. For a single Gaussian ``q = q2`` and ``w = 1``."""
    mu2, s2 = new_component(theta, setting)
    q2 = np.maximum(normal_pdf(x, mu2, s2), 1e-300)
    r = np.log(np.maximum(normal_pdf(x, setting.new_mu, setting.new_sigma), 1e-300)) - np.log(setting.beta * q2)
    q, score = (mixture_score if setting.family == "mixture" else single_score)(x, theta)
    w = 1.0 if from_policy else q / q2
    return ((r * w)[:, None] * score).mean(0)


GRID = np.linspace(-10.0, 10.0, 1001)


def mode_overlap(theta: np.ndarray, setting: TwoModeSetting) -> tuple[float, float]:
    """``(old, new)``: for each mode ``k``, ``int min(p_k, q_k) dx / int p_k dx`` with ``p_k`` the target's
    weighted component and ``q_k`` the policy's (the whole policy for a single Gaussian); 1 = the mode
    is fully kept, 0 = lost. Trapezoid rule on :data:`GRID`."""
    w = setting.old_weight
    p_old = w * normal_pdf(GRID, setting.old_mu, setting.old_sigma)
    p_new = (1 - w) * normal_pdf(GRID, setting.new_mu, setting.new_sigma)
    if setting.family == "mixture":
        pi1, mu1, s1, mu2, s2 = theta
        q_old, q_new = pi1 * normal_pdf(GRID, mu1, s1), (1 - pi1) * normal_pdf(GRID, mu2, s2)
    else:
        q_old = q_new = normal_pdf(GRID, theta[0], theta[1])
    return (float(np.trapezoid(np.minimum(p_old, q_old), GRID) / w),
            float(np.trapezoid(np.minimum(p_new, q_new), GRID) / (1 - w)))


def project(theta: np.ndarray, setting: TwoModeSetting) -> np.ndarray:
    """Keep the parameters valid: ``pi1`` in ``[1e-3, 1 - 1e-3]``, standard deviations >= 0.05."""
    theta = theta.copy()
    if setting.family == "mixture":
        theta[0] = np.clip(theta[0], 1e-3, 1 - 1e-3)
        theta[[2, 4]] = np.maximum(theta[[2, 4]], 0.05)
    else:
        theta[1] = max(theta[1], 0.05)
    return theta


# the KL-tilted optimum ``pi0 exp(r / beta) / Z`` is the sharpening chapter's Gibbs optimum
from .sharpening import kl_regularized_optimum as kl_tilted  # noqa: E402,F401


# ---------------------------------------------------------------------- self-SFT: on-policy data
@register_estimator("self_sft")
def compute_self_sft_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index=None,
                               threshold: float = 1.0):
    """SFT on the policy's own accepted samples, as an advantage: 1 on every token of a response whose
    outcome reward reaches ``threshold`` (a correct one, for a 0/1 verifier), 0 elsewhere. With the
    ``pg`` loss the update is ``-sum_kept log pi(y)`` over the batch's accepted rows: rejection-sampling
    fine-tuning on fresh samples (RAFT), i.e. the self-SFT of the chapter done fully on-policy. No
    baseline, no normalisation, so groups of any size (one included) work.

    =================== ========= ============================================
    token_level_rewards ``(B,T)`` outcome reward on the last valid token
    response_mask       ``(B,T)`` 1 up to and including EOS
    index               ``(B,)``  group ids (unused: each row stands alone)
    returns                       ``(adv, ret)``, both ``(B,T)``; ``ret`` is the 0/1 acceptance
    =================== ========= ============================================
    """
    if token_level_rewards.shape != response_mask.shape:
        raise ValueError(f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
                         f"{tuple(response_mask.shape)} differ")
    scores = outcome_scores(token_level_rewards, response_mask)
    if not torch.isfinite(scores).all():
        raise ValueError("self_sft: non-finite rewards")
    keep = (scores >= threshold).to(response_mask.dtype)
    adv = keep[:, None] * response_mask
    return adv, adv.clone()


def own_correct_samples(model, tokenizer, task: Task | str, examples: list[Example], num_generations: int,
                        max_new_tokens: int, generator: torch.Generator | None = None) -> tuple[list[Example], float]:
    """Self-generated SFT data: ``num_generations`` samples (temperature 1) of ``model`` per example, kept
    when the task's verifier says they are correct; each kept one becomes an :class:`Example` whose
    ``solution`` is the model's own text. Returns ``(data, acceptance rate)``; no correct sample is a
    ValueError (there would be nothing to fine-tune on)."""
    from ..lm.sampling import sample

    task = get_task(task)
    if num_generations < 1 or not examples:
        raise ValueError("own_correct_samples needs examples and num_generations >= 1")
    batch = sample(model, tokenizer, [e.prompt for e in examples], num_generations=num_generations,
                   max_new_tokens=max_new_tokens, generator=generator)
    per_row = [examples[int(i)] for i in batch.index]
    ok = task.rewards(batch.texts, per_row)
    data = [replace(e, solution=t) for e, t, r in zip(per_row, batch.texts, ok) if r >= 1.0]
    if not data:
        raise ValueError(f"none of {len(per_row)} samples was correct on {task.name}: no self-SFT data")
    return data, float(ok.mean())
