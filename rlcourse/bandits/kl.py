"""KL control on a softmax bandit: the KL estimators' exact moments, the KL-regularised optimum, and
training with the KL term in the reward or in the loss. The experiments of the chapter *KL control*
(the bandit study and the tiny language model's sweep of ``beta``) are in
:mod:`rlcourse.studies.kl_control`. The four estimators are those of :func:`rlcourse.losses.kl_penalty`.
"""
from __future__ import annotations

import torch

from ..losses import kl_penalty
from ..profiles import one_torch_thread
from .exact import DTYPE, _logits, _means, batch_baselines, expected_reward

KL_PLACEMENTS = ("k1-reward", "k1-loss", "k2-loss", "k3-loss", "k3+-loss")


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


def _gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return x.gather(-1, idx)


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


def kl_bandit(K: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """The bandit of the KL experiment: Bernoulli arms with means evenly spaced in [0.1, 0.9],
    and a reference policy that prefers the worse arms (log-probs ``log_softmax(linspace(1, -1))``).
    Returns (means, logref)."""
    means = torch.linspace(0.1, 0.9, K, dtype=DTYPE)
    logref = torch.log_softmax(torch.linspace(1.0, -1.0, K, dtype=DTYPE), -1)
    return means, logref
