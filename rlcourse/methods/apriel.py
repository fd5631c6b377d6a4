"""Apriel-Reasoner's multi-domain recipe: adaptive domain sampling and a difficulty-aware length
penalty (Pardinas, Kamalloo, Vazquez and Drouin, 2026, arXiv:2604.02007).

The paper's equations are not public in a form this book could read, so both parts are
reconstructions consistent with its abstract (the chapter says so):

* adaptive domain sampling draws domain ``d`` with probability ``q_d ~ w_d / y_hat_d``, where ``w_d``
  is the target share of *usable* rollouts and ``y_hat_d`` a running estimate of the share of a
  domain's rollouts that are usable (completed within the budget, in a group whose verifier rewards
  vary); at the fixed point the usable batch holds the shares ``w`` exactly;
* the difficulty-aware length penalty is Kimi k1.5's group length reward ``lambda_i`` scaled by a
  weight ``w(p_hat)`` that grows with the group's pass rate, so prompts the policy solves are pushed
  to be short and prompts it rarely solves keep their length.

Parts registered here:

==========================  ==============  ====================================================
``apriel_mix``              task            ``sort`` / ``addition`` / ``addition3`` prompts mixed,
                                            each example's domain in ``meta['domain']``
``apriel_domains``          prompt sampler  adaptive: ``q ~ w / y_hat``, state in ``state['apriel']``
``apriel_domains_static``   prompt sampler  the same bookkeeping, ``q = w`` (the static mixture)
``apriel_task``             reward          the verifier; records each domain's usable rollouts
``apriel_length``           reward          verifier + ``w(p_hat) * lambda`` (difficulty-aware)
``apriel_length_uniform``   reward          verifier + ``gamma * lambda`` (the standard penalty)
==========================  ==============  ====================================================

The "thinking-budget" bandit of the chapter (exact accuracies, sampled groups) is at the end.
"""
from __future__ import annotations


import numpy as np
import torch

from ..data import register_prompt_sampler
from ..rewards import register_reward
from ..tasks import Addition, Example, Sort, Task, register_task

STATE_KEY = "apriel"


# ---------------------------------------------------------------------- (a) adaptive domain sampling
def _vector(name: str, x, D: int | None = None) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    if x.ndim != 1 or (D is not None and x.shape[0] != D):
        raise ValueError(f"{name} must be a vector of {D if D is not None else 'D'} domains, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} holds non-finite values: {x.tolist()}")
    return x


def check_targets(targets) -> np.ndarray:
    """The target shares ``w`` as a probability vector (positive, summing to 1), else a ValueError."""
    w = _vector("targets", targets)
    if (w <= 0).any() or abs(w.sum() - 1.0) > 1e-6:
        raise ValueError(f"targets must be positive and sum to 1, got {w.tolist()}")
    return w


def domain_sampling_probs(targets, yields, floor: float = 0.02) -> np.ndarray:
    """The adaptive sampler's domain probabilities ``q_d = (w_d / y_d) / sum_j (w_j / y_j)``.

    ======== ======== =============================================================
    targets  ``(D,)`` target shares ``w`` of usable rollouts (sum to 1)
    yields            ``(D,)``  estimated usable fraction ``y_hat`` of each domain, in [0, 1]
    floor    float    yields below it count as ``floor`` (a domain that yielded nothing
                      yet is not sampled with infinite weight)
    returns           ``(D,)``  ``q``, a probability vector
    ======== ======== =============================================================
    """
    w = check_targets(targets)
    y = _vector("yields", yields, len(w))
    if (y < 0).any() or (y > 1).any():
        raise ValueError(f"yields must lie in [0, 1], got {y.tolist()}")
    q = w / np.maximum(y, floor)
    return q / q.sum()


def batch_shares(q, yields) -> np.ndarray:
    """Expected share of each domain among usable rollouts when domains are drawn with ``q``:
    ``q_d y_d / sum_j q_j y_j`` (shapes as in :func:`domain_sampling_probs`)."""
    q = _vector("q", q)
    y = _vector("yields", yields, len(q))
    total = float((q * y).sum())
    if total <= 0:
        raise ValueError("no domain yields usable rollouts (sum of q * y is 0)")
    return q * y / total


def update_yield_estimate(y_hat, sampled, usable, eta: float) -> np.ndarray:
    """One step of the yield tracker: ``y_hat_d <- (1 - eta) y_hat_d + eta usable_d / sampled_d``
    for every domain that was sampled this step (the others keep their estimate).

    ======== ======== =====================================================
    y_hat    ``(D,)`` current estimates
    sampled  ``(D,)`` rollouts drawn per domain this step (>= 0)
    usable   ``(D,)`` of those, the usable ones (``0 <= usable <= sampled``)
    returns           ``(D,)``  the new estimates
    ======== ======== =====================================================
    """
    y_hat = _vector("y_hat", y_hat)
    s, u = _vector("sampled", sampled, len(y_hat)), _vector("usable", usable, len(y_hat))
    if not 0 < eta <= 1:
        raise ValueError(f"eta must be in (0, 1], got {eta}")
    if (s < 0).any() or (u < 0).any() or (u > s).any():
        raise ValueError(f"need 0 <= usable <= sampled, got sampled {s.tolist()}, usable {u.tolist()}")
    seen = s > 0
    out = y_hat.copy()
    out[seen] = (1 - eta) * y_hat[seen] + eta * u[seen] / s[seen]
    return out


def allocate_counts(n: int, q, carry) -> tuple[np.ndarray, np.ndarray]:
    """Split ``n`` prompts among domains in proportion ``q`` with carried remainders (systematic
    rounding): ``a = carry + n q``; each domain gets ``floor(a_d)``, the prompts left over go to the
    largest remainders, and ``carry = a - counts`` moves on. Over ``t`` steps domain ``d`` gets
    ``sum_t n q_d(t)`` prompts up to less than 1 (no sampling noise in the mixture).

    ======== ======== ==============================
    q        ``(D,)`` domain probabilities
    carry    ``(D,)`` remainders from the last step
    returns           ``(counts (D,) int, carry (D,))``
    ======== ======== ==============================
    """
    q = _vector("q", q)
    c = _vector("carry", carry, len(q))
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    a = c + n * q
    counts = np.floor(a).astype(int)
    left = n - int(counts.sum())
    if left > 0:
        counts[np.argsort(-(a - counts), kind="stable")[:left]] += 1
    elif left < 0:  # carries summed above 1 (cannot happen for q summing to 1; kept safe)
        counts[np.argsort(a - counts, kind="stable")[:-left]] -= 1
    return counts, a - counts


def simulate_domain_sampling(targets, true_yields, steps: int, prompts_per_step: int = 64, group: int = 8,
                             eta: float = 0.2, adaptive: bool = True, seed: int = 0) -> dict:
    """The sampler on simulated domains: each drawn prompt's group of ``group`` rollouts is usable
    with probability ``true_yields[d]`` (a Bernoulli per group). Returns per-step ``shares`` of usable
    rollouts ``(steps, D)``, the probabilities ``q`` ``(steps, D)`` and the estimates ``y_hat``.
    ``true_yields`` may be ``(D,)`` or ``(steps, D)`` (yields that drift as a policy learns)."""
    w = check_targets(targets)
    y_true = np.asarray(true_yields, float)
    y_true = np.broadcast_to(y_true, (steps, len(w))) if y_true.ndim == 1 else y_true
    if y_true.shape != (steps, len(w)):
        raise ValueError(f"true_yields must be (D,) or (steps, D) = ({steps}, {len(w)}), got {y_true.shape}")
    rng = np.random.default_rng(seed)
    y_hat, carry = np.ones(len(w)), np.zeros(len(w))
    out = {"shares": [], "q": [], "y_hat": [], "usable": []}
    for t in range(steps):
        q = domain_sampling_probs(w, y_hat) if adaptive else w
        counts, carry = allocate_counts(prompts_per_step, q, carry)
        usable_groups = rng.binomial(counts, y_true[t])
        usable = usable_groups * group
        out["shares"].append(usable / max(1, usable.sum()))
        out["q"].append(q)
        out["usable"].append(usable)
        y_hat = update_yield_estimate(y_hat, counts * group, usable, eta)
        out["y_hat"].append(y_hat)
    return {k: np.array(v) for k, v in out.items()}


# ---------------------------------------------------------------------- (b) the length penalty
def _groups(index: torch.Tensor, B: int) -> tuple[torch.Tensor, int]:
    index = torch.as_tensor(index)
    if index.shape != (B,):
        raise ValueError(f"index must have shape ({B},), got {tuple(index.shape)}")
    _, inverse = torch.unique(index, return_inverse=True)
    n = int(inverse.max()) + 1 if B else 0
    sizes = torch.bincount(inverse, minlength=n)
    if B and int(sizes.min()) < 2:
        raise ValueError("a length reward compares the samples of a prompt: every group needs G >= 2")
    return inverse, n


def kimi_length_reward(lengths, correct, index) -> torch.Tensor:
    """Kimi k1.5's group length reward: ``lambda_i = 0.5 - (l_i - l_min) / (l_max - l_min)`` within
    the group of prompt ``index[i]``; correct responses get ``lambda_i``, incorrect ones
    ``min(0, lambda_i)``; a group whose responses all have one length gets 0.

    ======== ======== ==============================================
    lengths  ``(B,)`` response lengths in tokens
    correct  ``(B,)`` bool (or 0/1), the verifier's verdict
    index    ``(B,)`` group (prompt) id of each row; groups of >= 2
    returns           ``(B,)``  float32, in [-0.5, 0.5]
    ======== ======== ==============================================
    """
    lengths = torch.as_tensor(lengths, dtype=torch.float32)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must be (B,), got shape {tuple(lengths.shape)}")
    B = lengths.shape[0]
    correct = torch.as_tensor(correct)
    if correct.shape != (B,):
        raise ValueError(f"correct must have shape ({B},), got {tuple(correct.shape)}")
    inverse, n = _groups(index, B)
    lo = torch.full((n,), float("inf")).scatter_reduce(0, inverse, lengths, "amin")
    hi = torch.full((n,), -float("inf")).scatter_reduce(0, inverse, lengths, "amax")
    span = (hi - lo)[inverse]
    lam = torch.where(span > 0, 0.5 - (lengths - lo[inverse]) / span.clamp_min(1e-12), torch.zeros_like(lengths))
    return torch.where(correct.bool(), lam, lam.clamp(max=0.0))


def group_pass_rate(correct, index) -> torch.Tensor:
    """``(B,)`` the pass rate ``p_hat`` of each row's group (shapes as in :func:`kimi_length_reward`)."""
    c = torch.as_tensor(correct, dtype=torch.float32)
    inverse, n = _groups(index, c.shape[0])
    sums = torch.zeros(n).index_add(0, inverse, c)
    return (sums / torch.bincount(inverse, minlength=n).float())[inverse]


WEIGHTS = ("uniform", "linear", "gate")


def difficulty_weight(p_hat, gamma: float, weight: str = "gate", theta: float = 0.75) -> torch.Tensor:
    """The weight of the length reward as a function of the group pass rate ``p_hat`` in [0, 1]:
    ``uniform``: ``gamma`` (the standard penalty); ``linear``: ``gamma p_hat``; ``gate``:
    ``gamma 1[p_hat > theta]`` (only prompts the policy mostly solves are pushed to be short)."""
    p = torch.as_tensor(p_hat, dtype=torch.float32)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if weight == "uniform":
        return torch.full_like(p, float(gamma))
    if weight == "linear":
        return gamma * p
    if weight == "gate":
        return gamma * (p > theta).float()
    raise ValueError(f"unknown length-penalty weight {weight!r}; choose one of {WEIGHTS}")


def length_shaped_reward(task_reward, lengths, index, gamma: float, weight: str = "gate", theta: float = 0.75,
                         truncated=None) -> torch.Tensor:
    """``r_i = r_task_i + w(p_hat_g) lambda_i``: the task reward plus the weighted Kimi length reward.
    A row counts as correct when its task reward is above 0.5 and it was not truncated (a truncated
    response never earns a brevity bonus).

    =========== ======== ===========================================
    task_reward ``(B,)`` verifier reward in [0, 1]
    lengths     ``(B,)`` response lengths
    index       ``(B,)`` group ids
    truncated   ``(B,)`` bool, or None (no row truncated)
    returns              ``(B,)``  float32 shaped reward
    =========== ======== ===========================================
    """
    r = torch.as_tensor(task_reward, dtype=torch.float32)
    correct = r > 0.5
    if truncated is not None:
        truncated = torch.as_tensor(truncated, dtype=torch.bool)
        if truncated.shape != r.shape:
            raise ValueError(f"truncated must have shape {tuple(r.shape)}, got {tuple(truncated.shape)}")
        correct = correct & ~truncated
    lam = kimi_length_reward(lengths, correct, index)
    return r + difficulty_weight(group_pass_rate(correct, index), gamma, weight, theta) * lam


# ---------------------------------------------------------------------- the loop's parts
class DomainMix(Task):
    """Prompts of several book tasks mixed; ``meta['domain']`` names each example's task. The default
    domains differ in response length: ``sort`` answers in 5 tokens, ``addition`` in up to 8 and
    ``addition3`` in up to 10 (with EOS). ``domain_targets`` are the shares of usable rollouts the
    recipe asks for (read by the ``apriel_domains`` samplers)."""

    name = "apriel_mix"

    def __init__(self, domains: dict[str, Task] | None = None, targets=(0.25, 0.25, 0.5)):
        self.tasks = dict(domains) if domains is not None else \
            {"sort": Sort(), "addition": Addition(2), "addition3": Addition(3)}
        self.domains = list(self.tasks)
        self.domain_targets = check_targets(targets).tolist()
        if len(self.domain_targets) != len(self.domains):
            raise ValueError(f"{len(self.domains)} domains but {len(self.domain_targets)} targets")

    def _draw(self, rng):
        name = self.domains[int(rng.integers(len(self.domains)))]
        ex = self.tasks[name]._draw(rng)
        return Example(ex.prompt, ex.answer, ex.solution, meta={**ex.meta, "domain": name})

    def score(self, completion, example):
        name = example.meta.get("domain")
        if name not in self.tasks:
            raise ValueError(f"example {example.prompt!r} has meta['domain'] = {name!r}, not one of {self.domains}")
        return self.tasks[name].score(completion, example)


register_task("apriel_mix")(DomainMix)


def _domains_of(task, examples) -> list[str] | None:
    names = getattr(task, "domains", None)
    if names is not None:
        return list(names)
    if all("domain" in e.meta for e in examples):
        return sorted({e.meta["domain"] for e in examples})
    return None


def record_domain_outcomes(state: dict, batch, examples, task_rewards, step: int | None, task=None) -> dict | None:
    """Count, per domain, the rows drawn, completed (EOS within the budget) and usable (completed, in
    a group whose verifier rewards are not all equal: a group with no spread gives GRPO no gradient,
    and the recipe filters it) and the tokens of completed rows; store them in
    ``state['apriel']['outcomes'][step]``. The ``apriel_domains`` samplers read them at the next step.
    Rows of examples without ``meta['domain']`` are not counted (None is returned)."""
    names = _domains_of(task, examples)
    if names is None or step is None:
        return None
    r = torch.as_tensor(task_rewards, dtype=torch.float32).reshape(-1)
    _, inverse = torch.unique(torch.as_tensor(batch.index), return_inverse=True)
    n = int(inverse.max()) + 1
    lo = torch.full((n,), float("inf")).scatter_reduce(0, inverse, r, "amin")
    hi = torch.full((n,), -float("inf")).scatter_reduce(0, inverse, r, "amax")
    spread = (hi > lo)[inverse]
    done = ~batch.truncated.bool()
    usable = done & spread
    lengths = batch.lengths.float()
    D = len(names)
    out = {k: [0.0] * D for k in ("sampled", "completed", "usable", "correct", "tokens")}
    for i, ex in enumerate(examples):
        d = names.index(ex.meta["domain"])
        out["sampled"][d] += 1
        out["completed"][d] += float(done[i])
        out["usable"][d] += float(usable[i])
        out["correct"][d] += float(r[i] > 0.5)
        out["tokens"][d] += float(lengths[i])
    st = state.setdefault(STATE_KEY, {})
    st.setdefault("outcomes", {})[int(step)] = out
    st.setdefault("domains", names)
    return out


def make_domain_sampler(adaptive: bool = True, eta: float = 0.3, floor: float = 0.02, targets=None):
    """A prompt sampler over the domains of ``task.domains`` (examples carry ``meta['domain']``).

    Each step it splits the ``n`` prompts among domains with :func:`allocate_counts`, in proportion
    ``q = w / y_hat`` (adaptive) or ``q = w`` (static), and draws each domain's prompts without
    replacement from that domain's part of the pool. The adaptive one first updates ``y_hat`` from
    the outcomes a reward of this module recorded for its previous step (:func:`record_domain_outcomes`);
    if none were recorded it stops with a ValueError rather than sample blind. Everything it keeps
    (targets, ``y_hat``, carried remainders, the log) is in ``state['apriel']``, which the trainer
    checkpoints, so a resumed run draws what the uninterrupted one did."""

    def sampler(pool, n, generator, state, task, step):
        missing = next((e for e in pool if "domain" not in e.meta), None)
        if missing is not None:
            raise ValueError(f"example {missing.prompt!r} has no meta['domain']: the apriel domain samplers "
                             "draw by domain (task apriel_mix, or any task whose examples carry it)")
        names = list(getattr(task, "domains", None) or sorted({e.meta["domain"] for e in pool}))
        st = state.setdefault(STATE_KEY, {})
        if "y_hat" not in st:
            w = targets if targets is not None else getattr(task, "domain_targets", [1 / len(names)] * len(names))
            st.update(domains=names, targets=check_targets(w).tolist(), y_hat=[1.0] * len(names),
                      carry=[0.0] * len(names), log=[], outcomes=st.get("outcomes", {}))
            if len(st["targets"]) != len(names):
                raise ValueError(f"{len(names)} domains {names} but {len(st['targets'])} targets")
        last = st["log"][-1] if st["log"] else None
        if last is not None:
            obs = st["outcomes"].get(last["step"])
            if obs is None and adaptive:
                raise ValueError(f"step {step}: the adaptive domain sampler found no outcomes of step {last['step']}; "
                                 "use a reward that records them (apriel_task, apriel_length, apriel_length_uniform "
                                 "or one that calls record_domain_outcomes)")
            if obs is not None:
                st["y_hat"] = update_yield_estimate(st["y_hat"], obs["sampled"], obs["usable"], eta).tolist()
        q = domain_sampling_probs(st["targets"], st["y_hat"], floor) if adaptive else np.asarray(st["targets"])
        counts, carry = allocate_counts(n, q, st["carry"])
        st["carry"] = carry.tolist()
        chosen = []
        for d, name in enumerate(names):
            rows = [i for i, e in enumerate(pool) if e.meta["domain"] == name]
            if counts[d] > len(rows):
                raise ValueError(f"asked for {counts[d]} prompts of domain {name!r}, the pool holds {len(rows)}")
            perm = torch.randperm(len(rows), generator=generator)[: int(counts[d])].tolist()
            chosen += [pool[rows[i]] for i in perm]
        order = torch.randperm(len(chosen), generator=generator).tolist()
        st["log"].append({"step": int(step), "q": q.tolist(), "counts": counts.tolist(), "y_hat": list(st["y_hat"])})
        return [chosen[i] for i in order]

    sampler.__name__ = "apriel_domains" if adaptive else "apriel_domains_static"
    return sampler


register_prompt_sampler("apriel_domains")(make_domain_sampler(adaptive=True))
register_prompt_sampler("apriel_domains_static")(make_domain_sampler(adaptive=False))


def _verifier(batch, examples, task) -> torch.Tensor:
    return torch.as_tensor(task.rewards(batch.texts, examples), dtype=torch.float32)


@register_reward("apriel_task")
def apriel_task_reward(batch, examples, task, state, step=None) -> torch.Tensor:
    """The task's verifier; also records each domain's usable rollouts (:func:`record_domain_outcomes`)."""
    r = _verifier(batch, examples, task)
    record_domain_outcomes(state, batch, examples, r, step, task)
    return r


@register_reward("apriel_length")
def apriel_length_reward(batch, examples, task, state, step=None, gamma: float = 0.1, weight: str = "gate",
                         theta: float = 0.75) -> torch.Tensor:
    """Verifier + ``w(p_hat) * lambda`` (:func:`length_shaped_reward`), the difficulty-aware penalty by
    default; ``reward_kwargs`` set ``gamma``, ``weight`` and ``theta``. Records domain outcomes."""
    if weight not in WEIGHTS:
        raise ValueError(f"unknown length-penalty weight {weight!r}; choose one of {WEIGHTS}")
    r = _verifier(batch, examples, task)
    record_domain_outcomes(state, batch, examples, r, step, task)
    return length_shaped_reward(r, batch.lengths, batch.index, gamma, weight, theta, batch.truncated)


@register_reward("apriel_length_uniform")
def apriel_length_uniform_reward(batch, examples, task, state, step=None, gamma: float = 0.1) -> torch.Tensor:
    """Verifier + ``gamma * lambda``: the standard (uniform) Kimi length penalty."""
    return apriel_length_reward(batch, examples, task, state, step, gamma=gamma, weight="uniform")


# ---------------------------------------------------------------------- the experiment, in rlcourse.studies.apriel
_STUDY_NAMES = frozenset((
    'ACC_MARGIN', 'CLAIMS', 'MATCH_GAMMAS', 'PAPER', 'SOURCE', '_BUDGET', '_PENALTY', '_SAMPLING', '_claim',
    'budget_bandit_run', 'budget_experiment', 'budget_success_probs', 'evaluate_claims', 'grouped_advantages',
    'grouped_length_reward', 'matched_accuracy', 'matched_values', 'mix_experiment', 'mix_run',
    'share_deviation', 'shortening', 'softmax_score_gradient', 'toy_sampling_values', 'uniform_on',
))


def __getattr__(name):
    """The chapter's experiment lives in :mod:`rlcourse.studies.apriel`; its names stay importable here."""
    if name in _STUDY_NAMES:
        from ..studies import apriel as study

        return getattr(study, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
