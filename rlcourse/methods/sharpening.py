"""Beyond sharpening: the task reward against self-rewards in one KL-regularised loop (Mittal, Gagnon and
Lajoie, 2026, arXiv:2604.16259).

The same RL machinery is run with different rewards. The task reward scores a response with the verifier;
*distribution sharpening* scores it with the frozen base model's log-likelihood, whose KL-regularised
optimum is the power distribution ``pi_base^(1 + 1/beta)``; a *self-referential* reward scores it with the
current policy's own log-likelihood (entropy minimisation), whose every deterministic policy is a maximum.
The exact equations of the paper's method section are not reproduced here: the forms below are the
course's reconstruction, consistent with the abstract.

Parts registered here:

====================== =========== ===========================================================================
``base_loglik``        reward      log pi_base(y | x) under the frozen base (the loop's ``ref_model``, else a
                       copy        of the policy taken at step 1); ``normalize="sum"`` or ``"mean"``
``self_loglik``        reward      log pi_theta(y | x) under the current policy (the -H objective)
``self_certainty``     reward      mean over tokens of KL(U || pi_theta(. | x, y_<t)), a confidence score
                       of          the current policy (the form used by reward-free "self-certainty" RL)
``addition_dropcarry`` task        two-digit addition whose demonstrations drop every carry with
                       probability 1/2 on prompts that have a carry (a systematic error mode)
====================== =========== ===========================================================================

The exact pieces (Gibbs optimum, power distribution, the autoregressive length toy, the covariance form of
the accuracy derivative, the -H gradient, the softmax toy of the three regimes) are the functions at the
top; the language-model experiment is :func:`lm_experiment`.
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import time

import numpy as np
import torch

from ..lm.model import response_logprobs
from ..profiles import Profile, cache_dir, profile as current_profile
from ..rewards import register_reward
from ..tasks import Addition, Example, register_task

PAPER = ("Beyond Distribution Sharpening: The Importance of Task Rewards, S. Mittal, L. Gagnon, G. Lajoie "
         "(2026, arXiv:2604.16259)")
ABSTRACT_CLAIM = ("sharpening yields limited gains, whereas incorporating task-based reward signal can greatly "
                  "help achieve robust performance improvements and stable learning")


# ---------------------------------------------------------------------- exact pieces
def _probs(p, name: str = "pi") -> np.ndarray:
    p = np.asarray(p, dtype=float)
    if p.ndim != 1 or p.size < 1:
        raise ValueError(f"{name} must be a 1-D probability vector, got shape {p.shape}")
    if (p < 0).any() or not np.isclose(p.sum(), 1.0, atol=1e-8):
        raise ValueError(f"{name} must be non-negative and sum to 1 (sum {p.sum():.6g})")
    return p


def softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along ``axis``."""
    z = np.asarray(z, dtype=float)
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def kl_regularized_optimum(pi_ref: np.ndarray, r: np.ndarray, beta: float) -> np.ndarray:
    """The maximiser of ``E_pi[r] - beta KL(pi || pi_ref)``: ``pi_ref exp(r / beta) / Z`` (in log space).

    ======== ======== ==============================================
    pi_ref   ``(N,)`` reference distribution
    r        ``(N,)`` reward of each outcome (``-inf`` is allowed: mass 0)
    beta     float    KL coefficient, > 0
    returns  ``(N,)`` the Gibbs (tilted) distribution
    ======== ======== ==============================================
    """
    pi_ref = _probs(pi_ref, "pi_ref")
    r = np.asarray(r, dtype=float)
    if r.shape != pi_ref.shape:
        raise ValueError(f"r has shape {r.shape}, pi_ref {pi_ref.shape}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    with np.errstate(divide="ignore"):
        logits = np.log(pi_ref) + r / beta
    if not np.isfinite(logits).any():
        raise ValueError("every outcome has zero mass under pi_ref or reward -inf")
    logits = np.where(np.isfinite(logits), logits, -np.inf)
    e = np.exp(logits - logits.max())
    return e / e.sum()


def power_distribution(pi: np.ndarray, alpha: float) -> np.ndarray:
    """``pi^alpha / sum(pi^alpha)``: the sharpening optimum with ``alpha = 1 + 1/beta`` (``alpha > 0``).

    ======= ======== =====================================
    pi      ``(N,)`` base distribution
    returns ``(N,)`` the power (sharpened) distribution
    ======= ======== =====================================
    """
    pi = _probs(pi)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    with np.errstate(divide="ignore"):
        logits = alpha * np.log(pi)
    e = np.exp(logits - logits.max())
    return e / e.sum()


def kl_objective(z: np.ndarray, pi_ref: np.ndarray, r: np.ndarray, beta: float) -> tuple[float, np.ndarray]:
    """``J(z) = E_pi[r] - beta KL(pi || pi_ref)`` for ``pi = softmax(z)``, and its gradient in ``z``:
    ``dJ/dz_j = pi_j (g_j - E_pi g)`` with ``g = r - beta log(pi / pi_ref)``.

    ======= ======== ================================
    z       ``(N,)`` logits of the policy
    returns          (J, ``(N,)`` gradient)
    ======= ======== ================================
    """
    pi, pi_ref, r = softmax(z), _probs(pi_ref, "pi_ref"), np.asarray(r, dtype=float)
    if not (pi.shape == pi_ref.shape == r.shape):
        raise ValueError(f"z {pi.shape}, pi_ref {pi_ref.shape} and r {r.shape} must have one shape")
    g = r - beta * (np.log(pi) - np.log(pi_ref))
    return float(pi @ g), pi * (g - pi @ g)


def neg_entropy_grad(z: np.ndarray) -> tuple[float, np.ndarray]:
    """``-H(softmax(z)) = E_pi[log pi]`` and its gradient ``pi_j (log pi_j + H)``.

    ======= ======== ================================
    z       ``(N,)`` logits
    returns          (-H, ``(N,)`` gradient)
    ======= ======== ================================
    """
    pi = softmax(z)
    logp = np.log(np.maximum(pi, 1e-300))
    h = -float(pi @ logp)
    return -h, pi * (logp + h)


def sharpened_accuracy(pi: np.ndarray, correct: np.ndarray, alpha: float) -> float:
    """Mass of the correct outcomes under the power distribution ``pi^alpha / Z``."""
    correct = np.asarray(correct, bool)
    q = power_distribution(pi, alpha)
    if correct.shape != q.shape:
        raise ValueError(f"correct has shape {correct.shape}, pi {q.shape}")
    return float(q[correct].sum())


def dlog_accuracy_dalpha(pi: np.ndarray, correct: np.ndarray, alpha: float) -> float:
    """``d log acc / d alpha = E_{pi_alpha}[log pi | correct] - E_{pi_alpha}[log pi]`` (a covariance
    divided by the accuracy): positive only where correct outcomes are on average likelier."""
    correct = np.asarray(correct, bool)
    q = power_distribution(pi, alpha)
    if not correct.any():
        raise ValueError("no correct outcome: the accuracy is 0 for every alpha")
    logp = np.log(np.maximum(np.asarray(pi, float), 1e-300))
    return float((q[correct] @ logp[correct]) / q[correct].sum() - q @ logp)


# ---------------------------------------------------------------------- the autoregressive length toy
def ar_sequences(q_stop: float, max_len: int, p_a: float = 0.5) -> tuple[list[str], np.ndarray]:
    """Every sequence of an autoregressive model over ``{a, b, EOS}``: at each step EOS with
    probability ``q_stop``, else ``a`` (prob ``p_a``) or ``b``; at ``max_len`` tokens EOS is forced.
    Returns the sequences (strings without EOS, the empty one included) and their probabilities
    ``(2**(max_len+1) - 1,)``, which sum to 1."""
    if not 0 < q_stop < 1 or not 0 < p_a < 1 or max_len < 1:
        raise ValueError(f"need 0 < q_stop < 1, 0 < p_a < 1, max_len >= 1; got {q_stop}, {p_a}, {max_len}")
    seqs, probs = [], []
    for n in range(max_len + 1):
        stop = q_stop if n < max_len else 1.0
        for letters in itertools.product("ab", repeat=n):
            s = "".join(letters)
            k = s.count("a")
            probs.append(((1 - q_stop) ** n) * (p_a ** k) * ((1 - p_a) ** (n - k)) * stop)
            seqs.append(s)
    return seqs, np.array(probs)


def expected_length(pi: np.ndarray, seqs: list[str]) -> float:
    """``E_pi[len(y)]`` (EOS not counted)."""
    return float(np.asarray(pi, float) @ np.array([len(s) for s in seqs], dtype=float))


# ---------------------------------------------------------------------- the softmax toy of three regimes
def dropped_carry_sum(a: int, b: int) -> int:
    """``a + b`` computed digit by digit with every carry dropped (``47 + 85 -> 22``)."""
    if a < 0 or b < 0:
        raise ValueError(f"operands must be non-negative, got {a}, {b}")
    out, place = 0, 1
    while a or b:
        out += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return out


def toy_prompts(n_prompts: int, seed: int, n_candidates: int = 20, p_drop: float = 0.5) -> dict:
    """The toy's base model: for each two-digit prompt ``a+b`` with a carry, a distribution over
    ``n_candidates`` candidate answers. The base mixes the correct sum and the dropped-carry sum in
    proportions ``1 - p_drop : p_drop`` (jittered per prompt), a short junk answer, and near misses.
    Base probabilities come from per-character confidences, so a longer answer pays for its extra
    characters (the autoregressive length effect).

    Returns ``log_base`` ``(P, N)``, ``correct`` ``(P, N)`` bool, ``length`` ``(P, N)`` characters,
    ``kind`` ``(P, N)`` (0 correct, 1 dropped carry, 2 junk, 3 near miss), and the prompts."""
    rng = np.random.default_rng(seed)
    log_base, correct, length, kind, prompts = [], [], [], [], []
    while len(prompts) < n_prompts:
        a, b = (int(x) for x in rng.integers(10, 100, size=2))
        s, d = a + b, dropped_carry_sum(a, b)
        if s == d:
            continue  # no carry: no systematic error to make
        cands = {s: 0, d: 1}
        junk = int(rng.integers(0, 10))
        if junk not in cands:
            cands[junk] = 2
        while len(cands) < n_candidates:
            c = int(s + rng.integers(-30, 31))
            if c >= 0 and c not in cands:
                cands[c] = 3
        ys = list(cands)
        w = np.empty(len(ys))
        mix = np.clip(rng.normal(p_drop, 0.1), 0.05, 0.95)
        for i, y in enumerate(ys):
            w[i] = {0: (1 - mix) * 0.85, 1: mix * 0.85, 2: 0.05, 3: 0.10 / (len(ys) - 3)}[cands[y]]
        lens = np.array([len(str(y)) for y in ys], dtype=float)
        # a character costs log(0.9) beyond the first two: longer answers are a little less likely
        logit = np.log(w) + np.log(0.9) * np.maximum(lens - 2, 0)
        log_base.append(logit - np.log(np.exp(logit).sum()))
        correct.append(np.array([cands[y] == 0 for y in ys]))
        length.append(lens)
        kind.append(np.array([cands[y] for y in ys]))
        prompts.append(f"{a}+{b}=")
    return {"log_base": np.array(log_base), "correct": np.array(correct), "length": np.array(length),
            "kind": np.array(kind), "prompts": prompts}


TOY_REWARDS = ("task", "base_loglik", "self_loglik")


def toy_train(toy: dict, reward: str, seed: int, steps: int = 300, group: int = 8, lr: float = 0.5,
              beta: float = 0.1, init_noise: float = 0.0) -> dict:
    """Sampled policy-gradient training of per-prompt softmax policies ``pi = softmax(z)`` (one logit
    per candidate), started at the base, with ``group`` samples a prompt and step, advantages
    ``r - mean(r)`` per group, and the exact gradient of ``-beta KL(pi || pi_base)`` added. The group
    mean includes the sample itself, which scales the reward's expected gradient by ``(G - 1) / G``, so
    for the frozen rewards the stationary point is the Gibbs optimum (:func:`kl_regularized_optimum`)
    at the effective ``beta G / (G - 1)``: for ``base_loglik`` with ``beta = 0.1`` and ``G = 8`` that is
    ``pi_base ** 9.75``, not ``** 11``; ``self_loglik`` scores with the current ``log pi``. ``init_noise`` perturbs the
    starting logits (Gaussian, per candidate).

    Returns per-step curves ``accuracy``, ``length``, ``entropy`` (means over prompts, ``(steps+1,)``),
    the final policies ``pi`` ``(P, N)``, and ``final_mode_kind`` ``(P,)``."""
    if reward not in TOY_REWARDS:
        raise ValueError(f"unknown toy reward {reward!r}; choose one of {TOY_REWARDS}")
    if group < 2:
        raise ValueError(f"group must be >= 2 for a group baseline, got {group}")
    rng = np.random.default_rng(seed)
    log_base, correct, length = toy["log_base"], toy["correct"].astype(float), toy["length"]
    P, N = log_base.shape
    z = log_base + init_noise * rng.normal(size=log_base.shape)
    curves = {"accuracy": [], "length": [], "entropy": []}
    rows = np.arange(P)[:, None]

    def log(pi):
        curves["accuracy"].append(float((pi * correct).sum(1).mean()))
        curves["length"].append(float((pi * length).sum(1).mean()))
        curves["entropy"].append(float(-(pi * np.log(np.maximum(pi, 1e-300))).sum(1).mean()))

    for _ in range(steps):
        pi = softmax(z)
        log(pi)
        u = rng.random((P, group, 1))
        ys = (u > np.cumsum(pi, 1)[:, None, :]).sum(-1).clip(max=N - 1)  # (P, G) inverse-CDF draws
        r = {"task": correct[rows, ys], "base_loglik": log_base[rows, ys],
             "self_loglik": np.log(np.maximum(pi[rows, ys], 1e-300))}[reward]
        adv = r - r.mean(1, keepdims=True)
        grad = np.zeros_like(z)
        np.add.at(grad, (np.repeat(np.arange(P), group), ys.reshape(-1)), adv.reshape(-1) / group)
        grad -= pi * adv.sum(1, keepdims=True) / group  # sum_i A_i (e_{y_i} - pi) / G
        if beta > 0:
            g = -beta * (np.log(np.maximum(pi, 1e-300)) - log_base)
            grad += pi * (g - (pi * g).sum(1, keepdims=True))
        z = z + lr * grad
    pi = softmax(z)
    log(pi)
    return {**{k: np.array(v) for k, v in curves.items()}, "pi": pi,
            "final_mode_kind": toy["kind"][np.arange(P), pi.argmax(1)]}


def toy_experiment(P: Profile | None = None, seeds: int | None = None, **kw) -> dict:
    """The three regimes on the same toy prompts, ``seeds`` seeds each (default: the profile's
    ``toy_seeds``). Returns ``runs[reward]`` (a list of :func:`toy_train` results), ``toy``, the
    base's accuracy, length and entropy, ``optimum_accuracy[reward]`` (the accuracy of the Gibbs
    optimum for the frozen rewards at the run's beta), and the sizes used."""
    P = P or current_profile()
    n = seeds or P.toy_seeds
    sizes = dict(n_prompts=P.pick(smoke=16, book=64), steps=P.pick(smoke=60, book=400))
    sizes.update(kw.pop("sizes", {}))
    toy = toy_prompts(sizes["n_prompts"], seed=1234)
    beta = kw.get("beta", 0.1)
    t0 = time.perf_counter()
    runs = {rw: [toy_train(toy, rw, seed=s, steps=sizes["steps"], **kw) for s in range(n)] for rw in TOY_REWARDS}
    base = np.exp(toy["log_base"])
    opt = {"task": float(np.mean([kl_regularized_optimum(b, c.astype(float), beta)[c].sum()
                                  for b, c in zip(base, toy["correct"])])),
           "base_loglik": float(np.mean([power_distribution(b, 1 + 1 / beta)[c].sum()
                                         for b, c in zip(base, toy["correct"])]))}
    return {"runs": runs, "toy": toy, "seeds": n, "beta": beta, "sizes": sizes,
            "base_accuracy": float((base * toy["correct"]).sum(1).mean()),
            "base_length": float((base * toy["length"]).sum(1).mean()),
            "base_entropy": float(-(base * toy["log_base"]).sum(1).mean()),
            "correct_modal": float(np.mean(toy["kind"][np.arange(len(base)), base.argmax(1)] == 0)),
            "optimum_accuracy": opt, "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------------- the loop's self-rewards
def _sequence_logprob(model, batch, temperature: float, normalize: str) -> torch.Tensor:
    """``(B,)`` log-likelihood of each response under ``model``: the sum over its tokens (EOS
    included) or, with ``normalize="mean"``, the mean per token."""
    if normalize not in ("sum", "mean"):
        raise ValueError(f"normalize must be 'sum' or 'mean', got {normalize!r}")
    with torch.no_grad():
        logp = response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_len, temperature)
    mask = batch.response_mask.to(logp.dtype)
    total = (logp * mask).sum(-1)
    return total / mask.sum(-1).clamp(min=1) if normalize == "mean" else total


@register_reward("base_loglik")
def base_loglik(batch, examples, task, state, model, ref_model, step, normalize: str = "sum") -> torch.Tensor:
    """Distribution sharpening: ``log pi_base(y | x)`` under the frozen base model.

    The base is the loop's ``ref_model`` when the KL term is on (``beta > 0``: the policy's weights at the
    start); otherwise a frozen copy of the policy taken at the reward's first call, which must be step 1
    (it is kept in ``state["base_loglik"]`` and saved with a checkpoint). Scored at temperature 1 (the
    base's own distribution).

    ========= ======== ====================================================
    returns   ``(B,)`` float32 sequence log-likelihood (``normalize="sum"``)
                       or mean per-token log-likelihood (``"mean"``)
    ========= ======== ====================================================
    """
    base = ref_model
    if base is None:
        kept = state.get("base_loglik")
        if kept is None:
            if step != 1:
                raise ValueError(f"base_loglik first called at step {step} without a reference model: the policy "
                                 "is no longer the base; set RLConfig.beta > 0 or start the reward at step 1")
            kept = copy.deepcopy(model).eval()
            kept.requires_grad_(False)
            state["base_loglik"] = kept
        base = kept
    return _sequence_logprob(base, batch, 1.0, normalize)


@register_reward("self_loglik")
def self_loglik(batch, examples, task, state, model, normalize: str = "sum") -> torch.Tensor:
    """A self-referential reward: ``log pi_theta(y | x)`` under the *current* policy (the -H objective;
    its every deterministic policy is a maximum). Scored at the sampling temperature.

    ========= ======== =====================================================
    returns   ``(B,)`` float32 sequence (or mean per-token) log-likelihood
    ========= ======== =====================================================
    """
    return _sequence_logprob(model, batch, batch.temperature or 1.0, normalize)


@register_reward("self_certainty")
def self_certainty(batch, examples, task, state, model) -> torch.Tensor:
    """Self-certainty of the current policy: the mean over response tokens of
    ``KL(U || pi_theta(. | x, y_<t)) = -log V - mean_v log pi_theta(v | x, y_<t)`` (``V`` the vocabulary
    size); large when every next-token distribution is peaked. Scored at the sampling temperature.

    ========= ======== ======================================
    returns   ``(B,)`` float32, >= 0, mean over the response
    ========= ======== ======================================
    """
    from ..lm.model import position_ids_from_mask
    T, temp = batch.response_len, batch.temperature or 1.0
    with torch.no_grad():
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=position_ids_from_mask(batch.attention_mask), use_cache=False, logits_to_keep=T + 1)
        logz = torch.log_softmax(out.logits[:, :-1, :].float() / temp, dim=-1)  # (B, T, V)
    V = logz.shape[-1]
    kl = -math.log(V) - logz.mean(-1)
    mask = batch.response_mask.to(kl.dtype)
    return (kl * mask).sum(-1) / mask.sum(-1).clamp(min=1)


# ---------------------------------------------------------------------- a base with a systematic error
class DropCarryAddition(Addition):
    """Two-digit addition whose demonstrations drop every carry (``47+85=`` -> ``22|22``) with
    probability ``p_drop`` on prompts that have a carry; the verifier grades the true sum. A base model
    pre-trained on it makes the error systematically: on a prompt with a carry it is torn between the
    right sum and the dropped-carry one, which is the shorter answer whenever the tens overflow."""

    def __init__(self, p_drop: float = 0.5):
        super().__init__(digits=2)
        if not 0 <= p_drop < 1:
            raise ValueError(f"p_drop must be in [0, 1), got {p_drop}")
        self.p_drop = p_drop
        self.name = "addition_dropcarry"

    def _draw(self, rng):
        ex = super()._draw(rng)
        a, b = ex.meta["a"], ex.meta["b"]
        d = dropped_carry_sum(a, b)
        drop = d != a + b and rng.random() < self.p_drop
        shown = str(d) if drop else ex.answer
        return Example(prompt=ex.prompt, answer=ex.answer, solution=f"{shown[::-1]}|{shown}",
                       meta={"a": a, "b": b, "dropped": str(d), "carry": d != a + b})


register_task("addition_dropcarry")(DropCarryAddition)


def answer_of(text: str) -> str | None:
    """The graded part of an addition completion (after the last ``|``), or None if malformed."""
    if "|" not in text:
        return None
    tail = text.rsplit("|", 1)[1].strip()
    return tail if tail.isdigit() else None


def base_model(P: Profile | None = None, progress: bool = False):
    """The tiny Llama of the profile pre-trained on ``addition_dropcarry`` for a fixed number of SFT steps
    (no accuracy target: the demonstrations cap the greedy accuracy), cached under
    :func:`rlcourse.cache_dir`."""
    from ..lm.model import build_model
    from ..lm.tokenizer import build_tokenizer
    from ..lm.zoo import cached_model, pretrain

    P = P or current_profile()
    steps = P.pick(smoke=40, book=800)
    recipe = {"version": 1, "task": "addition_dropcarry", "p_drop": 0.5, "steps": steps, "profile": P.as_dict()}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / "sharpening" / f"dropcarry-{P.name}-{digest}"

    def build():
        tok = build_tokenizer()
        model = build_model(tok, P, seed=0)
        res = pretrain(model, tok, DropCarryAddition(), max_steps=steps, batch_size=P.pretrain_batch,
                       lr=P.pretrain_lr, eval_every=steps, eval_prompts=64, seed=0, progress=progress)
        model.config.rlcourse_pretrain = {"steps": res.steps, "accuracy": res.accuracy, "seconds": res.seconds}
        return model, tok

    return cached_model(path, build)


def seed_disagreement(modes: np.ndarray) -> np.ndarray:
    """Per seed, the share of prompts whose final answer differs from the majority answer of all seeds
    (ties go to the smallest answer id): 0 when every seed ends in the same place.

    ======= ========== ==============================================
    modes   ``(S, P)`` answer id (any hashable int) per seed and prompt
    returns ``(S,)``   share of prompts off the majority, per seed
    ======= ========== ==============================================
    """
    modes = np.asarray(modes)
    if modes.ndim != 2 or modes.shape[0] < 1:
        raise ValueError(f"modes must be (seeds, prompts), got shape {modes.shape}")
    major = np.empty(modes.shape[1], dtype=modes.dtype)
    for j in range(modes.shape[1]):
        vals, counts = np.unique(modes[:, j], return_counts=True)
        major[j] = vals[np.argmax(counts)]
    return (modes != major[None]).mean(1)


def entropy_ascent(z0: np.ndarray, lr: float = 1.0, steps: int = 2000) -> np.ndarray:
    """Exact gradient ascent on ``-H(softmax(z))`` from ``z0``; returns the final distribution."""
    z = np.array(z0, dtype=float)
    for _ in range(steps):
        z = z + lr * neg_entropy_grad(z)[1]
    return softmax(z)


# ---------------------------------------------------------------------- the experiment, in rlcourse.studies.sharpening
_STUDY_NAMES = frozenset((
    'LM_ARMS', 'LM_SETTING', 'lm_claims', 'lm_experiment', 'lm_measure', 'lm_sizes', 'lm_verdicts',
    'toy_claims', 'toy_verdicts',
))


def __getattr__(name):
    """The chapter's experiment lives in :mod:`rlcourse.studies.sharpening`; its names stay importable here."""
    if name in _STUDY_NAMES:
        from ..studies import sharpening as study

        return getattr(study, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
