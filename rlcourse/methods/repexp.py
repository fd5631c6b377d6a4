"""RepExp: representation-based exploration (Tuyls, Foster, Krishnamurthy, Ash, 2025, arXiv:2510.11686).

A response's *feature* is the mean of a frozen pre-trained model's last-layer hidden states over the
response tokens, passed through a fixed sparse random projection and cast to float64. Among the
responses to one prompt, the *elliptical bonus* of ``phi`` is

    b(phi) = phi^T (lam I + sum_j phi_j phi_j^T)^{-1} phi

("leverage": ``phi`` itself is in the sum; "loo": leave it out). It is small for a response whose
direction the others already cover (a repeat) and large for a new one. Two uses:

* at test time, :func:`elliptical_order` picks, from a pool of ``M`` samples, the one of largest bonus
  under the ones already picked (greedy log-det, D-optimal design), and the verifier is called in that
  order (:func:`samples_to_first_correct`, :func:`selected_pass_at_k`);
* in RL, the registered sampler ``"repexp"`` scores each row with the loop's reward plus
  ``beta * bonus`` within its group (the authors' ``alpha * extrinsic + beta * intrinsic``), so it
  combines with any registered estimator and loss by name.

The task ``"repexp_divisor"`` has several modes (which small prime the answer names) and a most likely
mode that is wrong on about 40% of prompts. The chapter's experiments on it (test-time selection and RL
post-training, with their claims) are :mod:`rlcourse.studies.repexp`.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Sequence

import numpy as np
import torch

from ..lm.model import position_ids_from_mask
from ..lm.sampling import RolloutBatch
from ..metrics import pass_at_k
from ..rollout import register_sampler
from ..tasks import Example, Score, Task, register_task

PAPER = ("Representation-Based Exploration for Language Models: From Test-Time to Post-Training, "
         "Tuyls, Foster, Krishnamurthy, Ash, 2025, arXiv:2510.11686")
STATE_KEY = "repexp"
KINDS = ("leverage", "loo")
NORMALIZATIONS = ("none", "rnd", "z_score")


# ---------------------------------------------------------------------- the task: several modes
MODE_PRIOR = {2: 0.5, 3: 0.22, 5: 0.16, 7: 0.12}  # the demonstrations' mode, independent of n
SCRATCH = "xyz"


class Divisor(Task):
    """``div 91:`` -> ``7:zx``: name a prime factor ``d`` of ``n`` (``1 < d < n``), then a free
    "scratch" of 0 to 3 letters that the verifier ignores (surface variation, as two wordings of one
    solution differ). ``n`` runs over 10..999 with a prime factor in {2, 3, 5, 7}, not prime itself.

    The demonstrations name ``d`` from :data:`MODE_PRIOR` *whatever n is* (they are often wrong), so a
    pre-trained model has four modes, one per prime, the most likely (``2``) wrong on every odd ``n``.
    ``answer`` is the smallest prime factor; ``meta['divisors']`` lists the correct modes.
    """

    name = "repexp_divisor"
    test_fraction = 0.4  # 771 numbers: about 300 held out, enough for 256 distinct evaluation prompts
    NUMBERS = tuple(n for n in range(10, 1000) if any(n % p == 0 for p in MODE_PRIOR))

    def _draw(self, rng):
        n = int(self.NUMBERS[int(rng.integers(len(self.NUMBERS)))])
        d = int(rng.choice(list(MODE_PRIOR), p=list(MODE_PRIOR.values())))
        scratch = "".join(rng.choice(list(SCRATCH), size=int(rng.integers(0, 4))))
        divisors = [p for p in MODE_PRIOR if n % p == 0]
        return Example(prompt=f"div {n}:", answer=str(divisors[0]), solution=f"{d}:{scratch}",
                       meta={"n": n, "divisors": divisors})

    def score(self, completion, example):
        m = re.fullmatch(r"(\d+):([a-z]*)", completion.strip())
        if m is None:
            return Score(0.0, "malformed: not 'd:letters'")
        n = example.meta.get("n")
        if n is None:
            raise ValueError("repexp_divisor: the example has no meta['n'] (not a repexp_divisor prompt)")
        d = int(m.group(1))
        ok = 1 < d < n and n % d == 0
        return Score(float(ok), "correct" if ok else f"wrong: {d} is not a proper divisor of {n}")


register_task("repexp_divisor")(Divisor)


def response_mode(text: str) -> str | None:
    """The mode of a ``repexp_divisor`` response: the number before ``:`` (None if malformed)."""
    m = re.fullmatch(r"(\d+):([a-z]*)", text.strip())
    return m.group(1) if m else None


# ---------------------------------------------------------------------- features
def sparse_projection(d: int, k: int, generator: torch.Generator, density: float | None = None) -> torch.Tensor:
    """A sparse random projection matrix ``(d, k)`` as scikit-learn's ``SparseRandomProjection`` draws
    it (Li, Hastie and Church's very sparse projections): each entry is ``+-sqrt(1/density)/sqrt(k)``
    with probability ``density/2`` each and 0 otherwise, ``density = 1/sqrt(d)`` by default ("auto").
    ``E[P P^T] = I_d``: inner products are preserved in expectation.

    ====== ======= ====================================
    return         ``(d,k)`` float32 projection, ``phi = h @ P``
    ====== ======= ====================================
    """
    if d < 1 or k < 1:
        raise ValueError(f"sparse_projection needs d >= 1 and k >= 1, got d={d}, k={k}")
    density = 1.0 / math.sqrt(d) if density is None else float(density)
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density}")
    u = torch.rand(d, k, generator=generator)
    sign = torch.where(u < density / 2, -1.0, torch.where(u < density, 1.0, 0.0))
    return sign * math.sqrt(1.0 / density) / math.sqrt(k)


def mean_response_hidden(model, batch: RolloutBatch, weights: dict | None = None) -> torch.Tensor:
    """Mean of the last layer's hidden states over each row's response tokens (those of
    ``response_mask``, EOS included), as the authors' reward worker computes it (``last_hidden_state``,
    after the final norm). ``weights`` (a state dict) runs the same architecture with other weights
    (the frozen pre-trained copy) without building a second model.

    ======= ========= ===================================================
    return  ``(B,d)`` float32 mean hidden state of each response (d: hidden size)
    ======= ========= ===================================================
    """
    ids, mask = batch.input_ids, batch.attention_mask
    kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                  use_cache=False, output_hidden_states=True)
    with torch.no_grad():
        if weights is None:
            out = model(**kwargs)
        else:
            out = torch.func.functional_call(model, weights, args=(), kwargs=kwargs, tie_weights=False)
    T = batch.response_len
    h = out.hidden_states[-1][:, -T:, :].float()  # (B,T,d): the response tokens' states
    m = batch.response_mask.float()
    if bool((m.sum(-1) == 0).any()):
        raise ValueError("mean_response_hidden: a row has no response token to average")
    return (h * m[..., None]).sum(1) / m.sum(-1, keepdim=True)


# ---------------------------------------------------------------------- the elliptical bonus
def _check_phi(phi: torch.Tensor, lam: float) -> torch.Tensor:
    if not isinstance(phi, torch.Tensor) or phi.ndim != 2 or phi.shape[0] < 1:
        raise ValueError(f"phi must be a (n, k) tensor with n >= 1, got "
                         f"{tuple(phi.shape) if isinstance(phi, torch.Tensor) else type(phi).__name__}")
    if not lam > 0:
        raise ValueError(f"lam (the ridge) must be > 0, got {lam}")
    if not torch.isfinite(phi).all():
        raise ValueError("phi holds non-finite values")
    return phi.double()


def sherman_morrison(inv: torch.Tensor, phi: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
    """``(A + sign * phi phi^T)^{-1}`` from ``inv = A^{-1}`` in O(k^2) (Sherman-Morrison):
    ``A^{-1} - sign * A^{-1} phi phi^T A^{-1} / (1 + sign * phi^T A^{-1} phi)``.

    ====== ========= ===========================
    inv    ``(k,k)`` symmetric ``A^{-1}``
    phi    ``(k,)``  the rank-one direction
    return           ``(k,k)`` the updated inverse
    ====== ========= ===========================
    """
    if inv.ndim != 2 or inv.shape[0] != inv.shape[1] or phi.shape != inv.shape[:1]:
        raise ValueError(f"sherman_morrison: inv {tuple(inv.shape)} must be (k,k) and phi {tuple(phi.shape)} (k,)")
    u = inv @ phi
    denom = 1.0 + sign * (phi @ u)
    if abs(float(denom)) < 1e-12:
        raise ValueError("sherman_morrison: A + sign * phi phi^T is singular")
    return inv - sign * torch.outer(u, u) / denom


def covariance_inverse(phi: torch.Tensor, lam: float) -> torch.Tensor:
    """``(lam I + sum_j phi_j phi_j^T)^{-1}`` by one Sherman-Morrison update per row, from ``I/lam``, in
    float64 (the authors' worker does the same).

    ====== ========= ===========================
    phi    ``(n,k)`` features
    return           ``(k,k)`` float64 inverse
    ====== ========= ===========================
    """
    phi = _check_phi(phi, lam)
    inv = torch.eye(phi.shape[1], dtype=torch.float64) / lam
    for row in phi:
        inv = sherman_morrison(inv, row)
    return inv


def elliptical_bonus(phi: torch.Tensor, lam: float = 0.01, kind: str = "leverage", center: bool = True) -> torch.Tensor:
    """The elliptical bonus of each of ``n`` responses to one prompt, against the group's own
    covariance ``Sigma = lam I + sum_j phi_j phi_j^T``. ``center`` first subtracts the group mean (the
    authors' non-persistent setting).

    ============ =============== ==========================================================
    phi          ``(n,k)``       the group's features
    kind         ``"leverage"``: ``phi_i^T Sigma^{-1} phi_i`` (in [0, 1)); ``"loo"``: against
                                 ``Sigma - phi_i phi_i^T`` (= leverage / (1 - leverage))
    return       ``(n,)``        float64 bonuses
    ============ =============== ==========================================================
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    phi = _check_phi(phi, lam)
    if center:
        phi = phi - phi.mean(0, keepdim=True)
    inv = covariance_inverse(phi, lam)
    lev = ((phi @ inv) * phi).sum(-1)
    if kind == "leverage":
        return lev
    return lev / (1.0 - lev)


def group_bonus(phi: torch.Tensor, index: torch.Tensor, lam: float = 0.01, kind: str = "leverage",
                center: bool = True) -> torch.Tensor:
    """:func:`elliptical_bonus` within each group of rows that share an ``index`` (one prompt's samples).

    ====== ========= ====================================
    phi    ``(B,k)`` features of every row
    index  ``(B,)``  group (prompt) id of each row
    return ``(B,)``  float64 bonus of each row in its group
    ====== ========= ====================================
    """
    if index.ndim != 1 or index.shape[0] != phi.shape[0]:
        raise ValueError(f"index {tuple(index.shape)} must be (B,) for phi {tuple(phi.shape)}")
    out = torch.zeros(phi.shape[0], dtype=torch.float64)
    for g in torch.unique(index):
        rows = (index == g).nonzero().flatten()
        out[rows] = elliptical_bonus(phi[rows], lam, kind, center)
    return out


def normalize_bonus(bonus: torch.Tensor, mode: str = "none") -> torch.Tensor:
    """The authors' normalisations of a group's bonuses: ``"none"``; ``"rnd"``, divide by their std;
    ``"z_score"``, subtract the mean and divide by the std (a zero std divides by nothing)."""
    if mode not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {mode!r}")
    if mode == "none" or bonus.numel() < 2:
        return bonus
    std = bonus.std()
    if mode == "rnd":
        return bonus / std if std > 0 else bonus
    return (bonus - bonus.mean()) / std if std > 0 else bonus - bonus.mean()


# ---------------------------------------------------------------------- test-time selection
def elliptical_order(phi: torch.Tensor, lam: float = 0.01, k: int | None = None, center: bool = False) -> list[int]:
    """Greedy elliptical selection from a pool: repeatedly pick the unpicked sample of largest bonus
    ``phi^T Sigma^{-1} phi`` under ``Sigma = lam I + sum_{picked} phi phi^T``, then add it to
    ``Sigma``. By the matrix determinant lemma this is greedy maximisation of
    ``log det(Sigma)`` (D-optimal design). Ties go to the lower index.

    ====== ========= ====================================================
    phi    ``(M,k)`` the pool's features
    k      int       how many to pick (default: all ``M``, an ordering)
    return ``k``     indices in the order picked
    ====== ========= ====================================================
    """
    phi = _check_phi(phi, lam)
    if center:
        phi = phi - phi.mean(0, keepdim=True)
    M = phi.shape[0]
    k = M if k is None else int(k)
    if not 1 <= k <= M:
        raise ValueError(f"k must be in [1, {M}], got {k}")
    inv = torch.eye(phi.shape[1], dtype=torch.float64) / lam
    free = torch.ones(M, dtype=torch.bool)
    order: list[int] = []
    for _ in range(k):
        bonus = ((phi @ inv) * phi).sum(-1)
        bonus[~free] = -math.inf
        i = int(torch.argmax(bonus))  # first maximum: the lower index on a tie
        order.append(i)
        free[i] = False
        inv = sherman_morrison(inv, phi[i])
    return order


def samples_to_first_correct(order: Sequence[int], correct: Sequence[float]) -> float:
    """Verifier calls, following ``order``, until the first correct sample (1-based); ``inf`` if the
    order holds none."""
    correct = np.asarray(correct, dtype=float)
    for j, i in enumerate(order):
        if correct[int(i)] > 0:
            return float(j + 1)
    return math.inf


def random_samples_to_first_correct(M: int, c: int) -> float:
    """Expected verifier calls until the first correct sample in a uniformly random order of ``M``
    samples of which ``c >= 1`` are correct: ``(M + 1) / (c + 1)``."""
    if not 1 <= c <= M:
        raise ValueError(f"need 1 <= c <= M, got M={M}, c={c}")
    return (M + 1) / (c + 1)


def selected_pass_at_k(order: Sequence[int], correct: Sequence[float], ks: Sequence[int]) -> dict[int, float]:
    """pass@k of the first ``k`` samples of ``order`` (1 if any is correct), for each ``k``; the random
    order's counterpart is the unbiased :func:`rlcourse.metrics.pass_at_k` of the pool."""
    correct = np.asarray(correct, dtype=float)
    hits = np.cumsum(correct[np.asarray(order, dtype=int)] > 0)
    if max(ks) > len(order) or min(ks) < 1:
        raise ValueError(f"ks must be in [1, {len(order)}], got {list(ks)}")
    return {int(k): float(hits[k - 1] > 0) for k in ks}


def random_pass_at_k(correct: Sequence[float], ks: Sequence[int]) -> dict[int, float]:
    """Exact pass@k of the first ``k`` samples of a uniformly random order of the pool."""
    correct = np.asarray(correct, dtype=float)
    n, c = len(correct), int((correct > 0).sum())
    return {int(k): pass_at_k(n, c, int(k)) for k in ks}


# ---------------------------------------------------------------------- the RL part: a sampler that scores
def planted_features(texts: Sequence[str], dim: int = 16) -> torch.Tensor:
    """The positive control's features for ``repexp_divisor``: a one-hot of the response's mode (its
    prime; one more slot for malformed responses), padded to ``dim``. They separate the modes exactly
    and ignore the scratch, the ideal the hidden states are measured against."""
    slots = {str(p): i for i, p in enumerate(MODE_PRIOR)}
    if dim < len(slots) + 1:
        raise ValueError(f"planted features need dim >= {len(slots) + 1}, got {dim}")
    phi = torch.zeros(len(texts), dim, dtype=torch.float64)
    for i, t in enumerate(texts):
        phi[i, slots.get(response_mode(t), len(slots))] = 1.0
    return phi


def centred_onehot_limit(shares: Sequence[float], last: int) -> float:
    """The bonus, as ``lam -> 0``, of a sample of mode ``last`` under the elliptical order on *centred*
    one-hot features, once one sample of every other mode has been picked:
    ``sum_{j != last} s_j^2 / s_last^2`` for the pool's mode shares ``s`` (positive, summing to 1). A
    second sample of a picked mode has bonus 1 in the same limit, so when this is below 1 every
    repeat is verified before the remaining mode (the chapter's proposition)."""
    s = np.asarray(shares, dtype=float)
    if s.ndim != 1 or len(s) < 2 or np.any(s <= 0) or not np.isclose(s.sum(), 1.0):
        raise ValueError(f"shares must be >= 2 positive numbers summing to 1, got {list(s)}")
    if not 0 <= last < len(s):
        raise ValueError(f"last must index shares (0..{len(s) - 1}), got {last}")
    return float((np.delete(s, last) ** 2).sum() / s[last] ** 2)


def projection_generator(seed: int, step: int, randomize: bool) -> torch.Generator:
    """The projection's generator: a new matrix every step (the authors' ``randomize_sparse_matrix``)
    or one for the run, from the config's seed alone, so a resumed run draws the same matrices."""
    return torch.Generator().manual_seed(int(seed) * 1_000_003 + (int(step) if randomize else 0) + 17)


@register_sampler("repexp")
def repexp_sampler(model, tokenizer, prompts, config, generator, state, examples, pool, task, reward, step,
                   base: str = "policy", beta: float = 0.01, lam: float = 0.01, dim: int = 16,
                   kind: str = "leverage", normalization: str = "none", center: bool = True,
                   randomize_projection: bool = True, off_if_none_correct: bool = True,
                   features: str = "hidden", base_kwargs: dict | None = None) -> RolloutBatch:
    """RepExp's RL reward as a sampler: the base sampler's batch, each row scored with the loop's
    reward plus ``beta`` times its elliptical bonus within its group (its prompt's ``G`` samples):

        score_i = r_i + beta * normalize(b(phi_i)),  phi_i = P^T mean_t h_frozen(x, y_i)_t

    ``h_frozen`` is the model as it was at the sampler's first call (the pre-trained base), kept in
    ``state["repexp"]["frozen"]`` (saved in checkpoints, so a resumed run uses the same features), and
    ``P`` a sparse random projection to ``dim`` dimensions, drawn anew each step from the config's
    seed (``randomize_projection``, as in the authors' script). Defaults follow the authors' GSM8K
    command: leverage bonus, ``lam = 0.01``, group-centred features, no normalisation, ``beta = 0.01``,
    and no bonus in a group where no row has a positive reward (``off_if_none_correct``). The scores go
    in ``batch.scores``, so any registered estimator and loss use them.
    ``features="planted"`` (task ``repexp_divisor`` only) replaces the hidden states by the one-hot of
    the response's mode, the chapter's positive control. ``base_kwargs`` configures the base sampler;
    a keyword it does not take is a ValueError.

    Metrics logged with the step: ``repexp_task_reward`` (mean of the loop's reward, before the bonus),
    ``repexp_bonus`` (mean raw bonus) and ``repexp_bonus_on`` (share of groups with the bonus on).
    """
    from ..parts import call_base_sampler

    G = config.num_generations
    if G < 2:
        raise ValueError(f"the repexp sampler needs num_generations >= 2 (a bonus within a group), got {G}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if features not in ("hidden", "planted"):
        raise ValueError(f"features must be 'hidden' or 'planted', got {features!r}")
    if features == "planted" and getattr(task, "name", None) != Divisor.name:
        raise ValueError(f"features='planted' needs the task {Divisor.name!r} (its modes), got {task!r}")
    normalize_bonus(torch.zeros(2), normalization)  # an unknown mode fails before sampling
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    batch = call_base_sampler("repexp", repexp_sampler, base, base_kwargs, locals())
    per_row = batch.examples if batch.examples is not None else [examples[int(i)] for i in batch.index]
    scores = batch.scores if batch.scores is not None else reward(batch, per_row, task, state)
    scores = torch.as_tensor(scores, dtype=torch.float32).reshape(-1)
    if scores.shape[0] != len(batch) or not torch.isfinite(scores).all():
        raise ValueError(f"the reward gave {tuple(scores.shape)} scores (finite?) for {len(batch)} rows")
    st = state.setdefault(STATE_KEY, {})
    if "frozen" not in st:
        st["frozen"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    elif set(st["frozen"]) != set(model.state_dict()):
        raise ValueError("state['repexp']['frozen'] holds weights of another architecture than the model")
    if features == "planted":
        phi = planted_features(batch.texts, dim)
    else:
        h = mean_response_hidden(model, batch, weights=st["frozen"])
        proj = sparse_projection(h.shape[1], dim, projection_generator(config.seed, step, randomize_projection))
        phi = (h @ proj).double()
    raw = torch.zeros(len(batch), dtype=torch.float64)
    on = 0
    groups = torch.unique(batch.index)
    for g in groups:
        rows = (batch.index == g).nonzero().flatten()
        if off_if_none_correct and float(scores[rows].sum()) <= 0:
            continue
        raw[rows] = normalize_bonus(elliptical_bonus(phi[rows], lam, kind, center), normalization)
        on += 1
    ours = {"repexp_task_reward": float(scores.mean()), "repexp_bonus": float(raw.mean()),
            "repexp_bonus_on": on / max(1, len(groups))}
    clash = sorted(set(batch.metrics) & set(ours))
    if clash:
        raise ValueError(f"the base sampler {base!r} reports metrics {clash} that the repexp sampler reports too")
    return replace(batch, scores=(scores.double() + beta * raw).float(), metrics={**batch.metrics, **ours})
