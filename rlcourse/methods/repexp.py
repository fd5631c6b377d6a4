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
mode that is wrong on about 40% of prompts; :func:`run_inference` and :func:`run_rl` are the chapter's
experiments.
"""
from __future__ import annotations

import copy
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


# ---------------------------------------------------------------------- the chapter's experiments
STRENGTH = 1.0  # unreachable (greedy says "2" whatever n is, right on ~64%): pre-training runs its full length
PAPER = ("Representation-Based Exploration for Language Models: From Test-Time to Post-Training, "
         "Tuyls, Foster, Krishnamurthy, Ash, 2025, arXiv:2510.11686")
ORDERS = ("random", "elliptical", "planted", "elliptical uncentred")


def base_model(prof):
    """The chapter's base model: pre-trained on ``repexp_divisor``'s demonstrations (cached)."""
    from ..lm.zoo import load_base_model
    return load_base_model(Divisor.name, STRENGTH, prof=prof, progress=False)


def sample_pool(model, tokenizer, examples: Sequence[Example], M: int, seed: int, dim: int = 16,
                chunk: int = 8) -> dict:
    """``M`` samples per prompt at temperature 1, their correctness, modes and features (the same model's
    mean hidden states, projected to ``dim`` by one fixed sparse projection).

    ======= ============= ==================================
    correct ``(P,M)``     1 where the sample is correct
    phi     ``(P,M,dim)`` float64 projected features
    modes   ``P x M``     each sample's mode (None: malformed)
    texts   ``P x M``     the responses
    ======= ============= ==================================
    """
    from ..lm.sampling import sample
    task, gen = Divisor(), torch.Generator().manual_seed(seed)
    correct, phis, modes, texts = [], [], [], []
    proj = None
    for i in range(0, len(examples), chunk):
        part = list(examples[i:i + chunk])
        batch = sample(model, tokenizer, [e.prompt for e in part], num_generations=M, max_new_tokens=6,
                       temperature=1.0, generator=gen)
        rows = [part[int(j)] for j in batch.index]
        correct.append(task.rewards(batch.texts, rows).reshape(len(part), M))
        h = mean_response_hidden(model, batch)
        if proj is None:
            proj = sparse_projection(h.shape[1], dim, torch.Generator().manual_seed(seed + 1))
        phis.append((h @ proj).double().reshape(len(part), M, dim))
        texts += [batch.texts[j * M:(j + 1) * M] for j in range(len(part))]
    modes = [[response_mode(t) for t in row] for row in texts]
    return {"correct": np.concatenate(correct), "phi": torch.cat(phis), "modes": modes, "texts": texts}


def order_pool(pool: dict, p: int, how: str, lam: float = 0.01) -> list[int] | None:
    """The verifier's order for prompt ``p``: ``"elliptical"`` (hidden features, centred on the pool's
    mean, as in the authors' code), ``"elliptical uncentred"`` (the same features, not centred: an
    exploratory line with no claim, the counterpart of the control's choice), ``"planted"`` (the one-hot of the mode, *not* centred: the positive control), ``"random"``
    (None: its metrics are exact expectations).

    The planted features are left uncentred because centred one-hots are linearly dependent (the
    pool's shares weight them to zero), which sends the pool's commonest mode to the end of the order
    (:func:`centred_onehot_limit`); uncentred, the order is "one sample of every mode, then repeats",
    the ideal that the control stands for."""
    if how == "random":
        return None
    if how == "elliptical":
        return elliptical_order(pool["phi"][p], lam, center=True)
    if how == "elliptical uncentred":
        return elliptical_order(pool["phi"][p], lam, center=False)
    if how == "planted":
        return elliptical_order(planted_features(pool["texts"][p], 16), lam, center=False)
    raise ValueError(f"order must be one of {ORDERS}, got {how!r}")


def run_inference(prof, seed: int = 0) -> dict:
    """Experiment 1: test-time selection on held-out prompts (the replicates). For each prompt with at
    least one correct sample among ``M``: verifier calls to the first correct sample and pass@k of the
    first ``k`` picked, for the random order (exact expectations), the elliptical order and the planted
    positive control. ``hard`` marks the prompts whose most likely mode (``2``) is wrong (odd ``n``)."""
    import time
    from ..profiles import one_torch_thread
    t0 = time.perf_counter()
    with one_torch_thread():
        model, tok = base_model(prof)
        examples = Divisor().examples(prof.pick(smoke=12, book=48), seed=seed, split="test")
        M = prof.pick(smoke=16, book=32)
        pool = sample_pool(model, tok, examples, M, seed)
        ks = [k for k in (1, 2, 4, 8, 16, 32) if k <= M]
        keep = [p for p in range(len(examples)) if pool["correct"][p].sum() > 0]
        calls = {o: [] for o in ORDERS}
        passk = {o: {k: [] for k in ks} for o in ORDERS}
        for p in keep:
            c = pool["correct"][p]
            for o in ORDERS:
                order = order_pool(pool, p, o)
                if order is None:
                    calls[o].append(random_samples_to_first_correct(M, int(c.sum())))
                    got = random_pass_at_k(c, ks)
                else:
                    calls[o].append(samples_to_first_correct(order, c))
                    got = selected_pass_at_k(order, c, ks)
                for k in ks:
                    passk[o][k].append(got[k])
        distinct = {o: [] for o in ("random", "elliptical")}
        for p in keep:  # distinct modes among the first 8 picked (random: expected, by 200 shuffles)
            k8 = min(8, M)
            el = order_pool(pool, p, "elliptical")[:k8]
            distinct["elliptical"].append(len({pool["modes"][p][i] for i in el}))
            rng = np.random.default_rng(p)
            distinct["random"].append(np.mean([len({pool["modes"][p][i] for i in rng.permutation(M)[:k8]})
                                               for _ in range(200)]))
    hard = np.array([examples[p].meta["n"] % 2 == 1 for p in keep])
    return {"M": M, "ks": ks, "prompts": len(examples), "kept": len(keep), "hard": hard,
            "calls": {o: np.array(v) for o, v in calls.items()},
            "passk": {o: {k: np.array(v) for k, v in d.items()} for o, d in passk.items()},
            "distinct8": {o: np.array(v) for o, v in distinct.items()},
            "mode_share": _mode_share(pool), "correct_share": float(pool["correct"].mean()),
            "seconds": time.perf_counter() - t0, "pool": pool, "examples": examples}


def _mode_share(pool: dict) -> dict:
    flat = [m for row in pool["modes"] for m in row]
    return {m: flat.count(m) / len(flat) for m in sorted(set(flat), key=lambda x: (x is None, x))}


def inference_verdicts(out: dict) -> dict:
    """The test-time claims, over prompts (the paired replicates), margins fixed before the run: fewer
    verifier calls to the first correct sample (kind ``less``, margin 0) for all prompts and for the hard
    ones, each with its planted control (``control``, ``control_hard``); a higher pass@4 of the selected
    samples (``greater``, margin 0)."""
    from ..claims import Claim, evaluate
    c, h = out["calls"], out["hard"]
    setting = (f"tiny LM pre-trained on repexp_divisor (4 modes, the likeliest wrong on odd n); "
               f"{out['kept']} held-out prompts with a correct sample among M={out['M']}; features: mean "
               "last-layer hidden state of the same model, sparse projection to 16 dims, lam 0.01")
    common = dict(paper=PAPER, source="abstract", setting=setting, replicate="prompt", unit="{:.2f}")
    stmt = ("exploration with representation-based diversity improves verifier efficiency "
            "('over 50% improvement in verifier efficiency on almost all tasks' for Qwen-2.5-14b-Instruct)")
    claims = {
        "calls": Claim(key="repexp/fewer-verifier-calls", statement=stmt, paper_number=">50% (Qwen-2.5-14b)",
                       metric="verifier calls to the first correct sample", method="elliptical order",
                       baseline="random order", kind="less", control="repexp/planted-control", **common),
        "calls_hard": Claim(key="repexp/fewer-calls-hard-prompts", statement=stmt + "; gains largest on harder "
                            "questions", metric="verifier calls to the first correct sample, odd n",
                            method="elliptical order", baseline="random order", kind="less",
                            control="repexp/planted-control-hard-prompts", **common),
        "control": Claim(key="repexp/planted-control", role="positive control", statement="positive control (ours): features that separate "
                         "the modes exactly, not centred", metric="verifier calls to the first correct sample",
                         method="planted elliptical order", baseline="random order", kind="less", **common),
        "control_hard": Claim(key="repexp/planted-control-hard-prompts", role="positive control", statement="positive control (ours): "
                              "features that separate the modes exactly, not centred, on the prompts whose "
                              "likeliest mode is wrong", metric="verifier calls to the first correct sample, odd n",
                              method="planted elliptical order", baseline="random order", kind="less", **common),
        "pass4": Claim(key="repexp/selected-pass-at-4", statement="representation-based diversity consistently "
                       "improves pass@k rates", metric="pass@4 of the first 4 samples verified",
                       method="elliptical order", baseline="random order", kind="greater",
                       control="repexp/planted-control", **common),
    }
    sel = {"calls": (c["elliptical"], c["random"]), "calls_hard": (c["elliptical"][h], c["random"][h]),
           "control": (c["planted"], c["random"]), "control_hard": (c["planted"][h], c["random"][h]),
           "pass4": (out["passk"]["elliptical"][4], out["passk"]["random"][4])}
    v = {}
    for k in ("control", "control_hard", "calls", "calls_hard", "pass4"):  # the controls first
        ctrl = next((v[j] for j in v if claims[j].key == claims[k].control), None)
        v[k] = evaluate(claims[k], *sel[k], seconds=out["seconds"], control=ctrl)
    return v


RL_ARMS = ("GRPO", "GRPO+RepExp", "GRPO+RepExp (planted)")
BETA = 0.01  # the authors' GSM8K/MATH command (train_elliptical.sh ... 0.01), fixed before any run
# GRPO's budget in the book profile: 90 steps at 3e-4, the regime where plain GRPO narrows the distinct
# correct modes below the base model's (a sweep of steps {30, 90} x lr {1e-4, 3e-4} on seeds 10-12, GRPO and
# the planted arm only, after 30 steps at 1e-4 left GRPO's diversity where it started; see the chapter).
# That sweep was scored on the reported held-out prompts; a re-run on the prompts kept for choosing is
#   for steps, lr in ((30, 1e-4), (30, 3e-4), (90, 1e-4), (90, 3e-4)):
#       run_rl(P, first_seed=10, arms=("GRPO", "GRPO+RepExp (planted)"), steps=steps, lr=lr, prompts="choose")
RL_STEPS, RL_LR = 90, 3e-4


def rl_config(prof, arm: str, seed: int, steps: int | None = None, lr: float = RL_LR):
    """The trainer's config for one arm: GRPO, or GRPO with the ``repexp`` sampler (hidden or planted
    features); everything else equal."""
    from ..train import RLConfig
    kw = dict(num_generations=8, prompts_per_step=prof.pick(smoke=4, book=16),
              steps=steps or prof.pick(smoke=3, book=RL_STEPS), learning_rate=lr, max_completion_length=6,
              temperature=1.0, seed=seed, progress=False)
    if arm == "GRPO":
        return RLConfig(**kw)
    if arm not in RL_ARMS:
        raise ValueError(f"arm must be one of {RL_ARMS}, got {arm!r}")
    feats = "planted" if "planted" in arm else "hidden"
    return RLConfig(sampler="repexp", sampler_kwargs=dict(beta=BETA, features=feats), **kw)


def diversity_eval(model, tok, examples: Sequence[Example], n: int, seed: int, ks: Sequence[int]) -> dict:
    """pass@k (unbiased, from ``n`` samples a prompt), mean distinct correct modes and the sampled
    accuracy on ``examples``."""
    from ..metrics import distinct_correct, mean_pass_at_k
    pool = sample_pool(model, tok, examples, n, seed)
    correct = pool["correct"]
    return {"passk": mean_pass_at_k(correct, ks),
            "distinct": float(np.mean([distinct_correct(m, c) for m, c in zip(pool["modes"], correct)])),
            "accuracy": float(correct.mean())}


def run_rl(prof, first_seed: int = 0, arms: Sequence[str] = RL_ARMS, steps: int | None = None, lr: float = RL_LR,
           prompts: str = "report") -> dict:
    """Experiment 2: GRPO against GRPO + beta * bonus (and the planted control) from the same base
    model, ``prof.seeds`` seeds each (from ``first_seed``; the chapter's are 0, 1, 2, and other seeds are
    for choosing settings); then pass@k (k up to 32), distinct correct modes and sampled accuracy on
    held-out prompts, 32 samples each: ``prompts="report"`` the reported ones, ``"choose"`` as many
    others kept for choosing settings (:func:`rlcourse.tasks.held_out_splits`)."""
    import time
    from ..profiles import one_torch_thread
    from ..train import Trainer
    t0 = time.perf_counter()
    from ..tasks import held_out_splits
    if prompts not in ("report", "choose"):
        raise ValueError(f"prompts must be 'report' or 'choose', got {prompts!r}")
    unknown = set(arms) - set(RL_ARMS)
    if unknown or "GRPO" not in arms:
        raise ValueError(f"arms must include 'GRPO' and come from {RL_ARMS}, got {tuple(arms)}")
    arms = tuple(arms)
    seeds = list(range(first_seed, first_seed + prof.seeds))
    ks = [1, 2, 4, 8, 16, 32]
    out = {"arms": arms, "seeds": len(seeds), "first_seed": first_seed, "ks": ks, "beta": BETA, "prompt_set": prompts}
    with one_torch_thread():
        model, tok = base_model(prof)
        n_prompts = prof.pick(smoke=8, book=32)
        evals = dict(zip(("report", "choose"), held_out_splits(Divisor(), n_prompts, n_prompts, seed=1)))[prompts]
        out["base"] = diversity_eval(model, tok, evals, 32, seed=99, ks=ks)
        res = {a: [] for a in arms}
        curves = {a: [] for a in arms}
        for a in arms:
            for s in seeds:
                cfg = rl_config(prof, a, s, steps, lr)
                tr = Trainer(copy.deepcopy(model), tok, Divisor.name, cfg)
                tr.train()
                key = "repexp_task_reward" if a != "GRPO" else "reward"
                curves[a].append([m[key] for m in tr.history])
                res[a].append(diversity_eval(tr.model, tok, evals, 32, seed=100 + s, ks=ks))
    out["passk"] = {a: {k: np.array([r["passk"][k] for r in res[a]]) for k in ks} for a in arms}
    out["distinct"] = {a: np.array([r["distinct"] for r in res[a]]) for a in arms}
    out["accuracy"] = {a: np.array([r["accuracy"] for r in res[a]]) for a in arms}
    out["curves"] = {a: np.array(c) for a, c in curves.items()}
    out["steps"], out["lr"], out["eval_prompts"] = cfg.steps, lr, len(evals)
    out["seconds"] = time.perf_counter() - t0
    return out


def rl_verdicts(out: dict) -> dict:
    """The post-training claims over seeds (margins fixed before the run): pass@32 and distinct
    correct modes higher with the bonus (``greater``, margin 0); pass@1 within 0.05 of GRPO's
    (``equivalent``: the bonus should not cost accuracy); the planted control's distinct modes
    above GRPO's."""
    from ..claims import Claim, evaluate
    setting = (f"tiny LM on repexp_divisor, GRPO {out['steps']} steps x 16 prompts x 8 samples, beta "
               f"{out['beta']}, lam 0.01, 16-dim sparse projection of the frozen base model's mean hidden "
               f"states; {out['eval_prompts']} held-out prompts x 32 samples")
    common = dict(paper=PAPER, source="abstract", setting=setting, baseline="GRPO")
    stmt = ("integrating this exploration strategy into an RL pipeline improves reasoning performance over "
            "that of the initial model and over standard RL post-training (AIME 2024: RepExp's pass@80 "
            "matches GRPO's pass@256)")
    claims = {
        "pass32": Claim(key="repexp/rl-pass-at-32", statement=stmt, paper_number="pass@80 = GRPO's pass@256",
                        metric="held-out pass@32 (unbiased, 32 samples)", method="GRPO+RepExp",
                        control="repexp/rl-planted-control", **common),
        "pass1": Claim(key="repexp/rl-pass-at-1", statement="similar pass@1 (our expectation, not the abstract's: no "
                       "accuracy cost)", metric="held-out pass@1", method="GRPO+RepExp", kind="equivalent",
                       margin=0.05, role="course hypothesis", **common),
        "distinct": Claim(key="repexp/rl-distinct-correct", statement="exploration with a representation-based "
                          "bonus significantly improves diversity", metric="distinct correct modes per prompt "
                          "(of 32 samples)", method="GRPO+RepExp", control="repexp/rl-planted-control", **common),
        "control": Claim(key="repexp/rl-planted-control", role="positive control", statement="positive control (ours): the bonus on "
                         "features that separate the modes exactly", metric="distinct correct modes per prompt",
                         method="GRPO+RepExp (planted)", **common),
    }
    sel = {"control": ("distinct", None, "GRPO+RepExp (planted)"), "pass32": ("passk", 32, "GRPO+RepExp"),
           "pass1": ("passk", 1, "GRPO+RepExp"), "distinct": ("distinct", None, "GRPO+RepExp")}
    v = {}
    for name, (what, k, arm) in sel.items():  # the control first: two claims rest on it
        if arm not in out[what]:
            continue
        get = (lambda a: out[what][a][k]) if k is not None else (lambda a: out[what][a])
        ctrl = v.get("control") if claims[name].control else None
        if claims[name].control and ctrl is None:
            continue
        v[name] = evaluate(claims[name], get(arm), get("GRPO"), seconds=out["seconds"], control=ctrl)
    return v
