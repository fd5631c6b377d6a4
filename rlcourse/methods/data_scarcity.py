"""RL under data scarcity: the survey's taxonomy as a map of the book, the arithmetic of wasted
rollouts, and one comparison of the book's data-centric prompt choosers at one rollout budget.

*A Survey of Reinforcement Learning for Large Language Models under Data Scarcity: Challenges and
Solutions*, Zhiyin Yu, Yuchen Mou, Juncheng Yan et al. (2026, arXiv:2604.17312). The top level of the
taxonomy (data-, training-, framework-centric) is the abstract's; the leaves come from secondary
summaries; the formulas here are the book's teaching material, not the survey's.

Parts registered here:

=========================  ==============  =================================================
``"pass_filter"``          prompt sampler  uniform over prompts whose last group pass rate
                                           lay strictly inside ``(lo, hi)`` (or was never
                                           measured, or is older than ``passes`` passes over
                                           the pool); reads ``state["prompt_feedback"]``,
                                           which the ``"heapa_feedback"`` sampler writes
``"synth_easier"``         prompt sampler  the same filter over a growing pool: a prompt whose
                                           whole group failed spawns ``task.easier(example,
                                           rng)`` (one level down)
``"scarcity_addition"``    task            HeaPA's 1- to 4-digit addition with ``easier``
=========================  ==============  =================================================

The exact toy (:func:`toy_run`) uses the same pure choosers (:func:`eligible`, :func:`filtered_draw`)
as the prompt samplers, on HeaPA's curriculum of Bernoulli-logit prompts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..data import register_prompt_sampler
from ..tasks import Example, register_task
from .heapa import FEEDBACK_KEY, CurriculumAddition, informative_probability

PAPER = ("A Survey of Reinforcement Learning for Large Language Models under Data Scarcity: Challenges and "
         "Solutions, Zhiyin Yu et al., 2026, arXiv:2604.17312")

# ---------------------------------------------------------------------- the map
BRANCHES = {  # top level: [abstract]; leaves: [secondary summary]
    "data-centric": ("pruning and selection", "synthesis and augmentation", "compression"),
    "training-centric": ("trajectory generation and reuse", "reward engineering", "policy optimisation"),
    "framework-centric": ("self-evolving systems", "asymmetric co-evolution"),
}
OUTSIDE = "outside the taxonomy"


@dataclass(frozen=True)
class Placement:
    """Where one chapter sits: ``branch`` (a key of :data:`BRANCHES` or :data:`OUTSIDE`), ``leaf``
    (one of the branch's leaves, ``""`` outside) and one sentence ``why``."""

    branch: str
    leaf: str
    why: str


_D, _T, _O = "data-centric", "training-centric", OUTSIDE
PLACEMENTS = {
    "book/lab": Placement(_O, "", "the tokenizer, tiny models and tasks every experiment runs on; no remedy for scarcity"),
    "book/policy_gradients": Placement(_O, "", "the gradient that every branch changes, derived on a bandit"),
    "book/advantages": Placement(_O, "", "the baselines (RLOO, GRPO, GAE) whose zero-variance groups are the waste this chapter counts"),
    "book/ppo": Placement(_T, "trajectory generation and reuse", "the clipped surrogate lets one batch of rollouts serve several updates"),
    "book/kl_control": Placement(_O, "", "a leash to the reference model; it spends no data and saves none"),
    "book/reward_models": Placement(_T, "reward engineering", "a learned reward stands in for a verifier where labels are scarce"),
    "book/test_time_scaling": Placement(_O, "", "evaluation yardsticks (pass@k, majority vote), not training"),
    "book/evpo": Placement(_T, "policy optimisation", "chooses critic or group baseline by explained variance: less noise per rollout"),
    "book/otb": Placement(_T, "policy optimisation", "a per-token baseline that matches large groups with small ones"),
    "book/p_grpo": Placement(_T, "policy optimisation", "advantages normalised by each preference group's history, not the batch"),
    "book/s_grpo": Placement(_T, "trajectory generation and reuse", "injects the reference demonstration into a group that failed entirely (cold start)"),
    "book/noisy_verifiers": Placement(_T, "reward engineering", "how much verifier error the reward tolerates: cheaper labels"),
    "book/poe_steering": Placement(_O, "", "steers a frozen offline control policy without retraining; not language-model RL"),
    "book/paretoslider": Placement(_O, "", "multi-reward control of a diffusion model; not about scarce data"),
    "book/flow_pairs": Placement(_O, "", "variance reduction for image flow models; the taxonomy is about language models"),
    "book/drest": Placement(_O, "", "rewards for a safety property (neutrality about length), not for scarce supervision"),
    "book/jigsawrl": Placement(_O, "", "a systems scheduler: it makes rollouts cheaper in time, not fewer"),
    "book/gipo": Placement(_T, "policy optimisation", "a soft trust weight that keeps stale replayed data usable"),
    "book/sorl": Placement(_T, "policy optimisation", "turn-level importance sampling for off-policy multi-turn data"),
    "book/freshper": Placement(_T, "trajectory generation and reuse", "replays past groups with priorities that decay with age"),
    "book/thinking_seeds": Placement(_T, "trajectory generation and reuse", "reuses historical prefixes and continues them on-policy"),
    "book/pipo": Placement(_T, "policy optimisation", "weights each update by whether the previous one measurably helped"),
    "book/cuts": Placement(_T, "trajectory generation and reuse", "explores inside the group when saturated data gives all-correct groups"),
    "book/poly_epo": Placement(_T, "policy optimisation", "a set-level objective that rewards exploratory groups"),
    "book/sps": Placement(_T, "policy optimisation", "inverse-RL phases against probability squeezing"),
    "book/repexp": Placement(_T, "trajectory generation and reuse", "an exploration bonus from the model's own representations"),
    "book/r2po": Placement(_T, "trajectory generation and reuse", "a rollout head that explores for training and is dropped at inference"),
    "book/banel": Placement(_T, "trajectory generation and reuse", "learns where not to sample from failures alone (sparse rewards)"),
    "book/sharpening": Placement(_T, "reward engineering", "label-free self-rewards against the task reward"),
    "book/retaining": Placement(_O, "", "what training costs (forgetting) under SFT and RL, not how to stretch data"),
    "book/cot_influence": Placement(_T, "reward engineering", "a process signal (causal importance of the reasoning) beside the outcome"),
    "book/compute_aligned": Placement(_T, "policy optimisation", "losses aligned with pass@k, best-of-N and majority vote"),
    "book/tcrm": Placement(_T, "reward engineering", "a reward model read as a value function gives dense token rewards"),
    "book/apriel": Placement(_D, "pruning and selection", "adaptive domain sampling keeps the mix of usable rollouts on target"),
    "book/heapa": Placement(_D, "pruning and selection", "frontier sampling from a heap of pass rates (its pool growth is synthesis too)"),
    "book/epm_rl": Placement(_T, "reward engineering", "a composite reward (format, label, judge) after parameter-efficient SFT"),
    "book/data_scarcity": Placement(_O, "", "this map, and the comparison of the data-centric choosers"),
}


def check_map(toc_stems: list[str], placements: dict | None = None) -> None:
    """Raise ValueError unless every ``book/`` chapter of ``toc_stems`` is placed exactly once, every
    placed stem is a chapter, and every placement names a real branch and leaf."""
    placements = PLACEMENTS if placements is None else placements
    chapters = [s for s in toc_stems if s.startswith("book/")]
    dup = sorted({s for s in chapters if chapters.count(s) > 1})
    if dup:
        raise ValueError(f"chapters listed twice in the table of contents: {dup}")
    missing = sorted(set(chapters) - set(placements))
    if missing:
        raise ValueError(f"chapters not placed in the data-scarcity map: {missing} (add them to PLACEMENTS)")
    extra = sorted(set(placements) - set(chapters))
    if extra:
        raise ValueError(f"the map places stems that are no chapter of the table of contents: {extra}")
    for stem, p in placements.items():
        if p.branch == OUTSIDE:
            if p.leaf or not p.why:
                raise ValueError(f"{stem}: a chapter outside the taxonomy has no leaf and needs a reason")
        elif p.branch not in BRANCHES or p.leaf not in BRANCHES[p.branch]:
            raise ValueError(f"{stem}: unknown branch/leaf {p.branch!r}/{p.leaf!r}; branches are {BRANCHES}")


def map_rows() -> list[dict]:
    """One row per chapter of the table of contents (``book/`` only, in its order): stem, label,
    title, part (the table of contents' caption), branch, leaf, why. Checks the map first."""
    from .. import catalogue

    stems = catalogue.toc_stems()
    check_map(stems)
    part_of = {s: cap for cap, ss in catalogue.toc_parts() for s in ss}
    titles = {e.stem: e.title for e in catalogue.catalogue()}
    return [{"stem": s, "label": "ch-" + s.split("/", 1)[1].replace("_", "-"), "title": titles.get(s, ""),
             "part": part_of.get(s, ""), **PLACEMENTS[s].__dict__} for s in stems if s.startswith("book/")]


def map_grid(rows: list[dict]) -> tuple[list[tuple[str, str]], list[str], np.ndarray]:
    """Counts of chapters per (branch, leaf) row and book part column.

    ======  ========  ==========================================================
    rows    list      :func:`map_rows`
    return  tuple     ``(leaves, parts, counts)``; ``leaves`` every (branch, leaf) of
                      :data:`BRANCHES` then ``(OUTSIDE, "")``; ``counts`` ``(L, P)`` ints
    ======  ========  ==========================================================
    """
    leaves = [(b, lf) for b, ls in BRANCHES.items() for lf in ls] + [(OUTSIDE, "")]
    parts = list(dict.fromkeys(r["part"] for r in rows))
    counts = np.zeros((len(leaves), len(parts)), dtype=int)
    for r in rows:
        counts[leaves.index((r["branch"], r["leaf"])), parts.index(r["part"])] += 1
    return leaves, parts, counts


# ---------------------------------------------------------------------- the arithmetic of a group
def _check_group(k, G: int, ddof: int = 0):
    if G < 2:
        raise ValueError(f"a group needs G >= 2 samples, got G={G}")
    if ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 (population std) or 1 (Bessel's, as TRL and verl), got {ddof}")
    k = np.asarray(k, dtype=float)
    if ((k < 0) | (k > G) | (k != np.round(k))).any():
        raise ValueError(f"successes k must be integers in [0, G={G}]")
    return k


def abs_advantage_sum(k, G: int, ddof: int = 0):
    """Closed form of ``sum_i |A_i|`` for a group of ``G`` binary rewards with ``k`` successes, GRPO's
    std-normalised advantage (``epsilon = 0``): ``2 sqrt(G (G - ddof)) sqrt(p (1 - p))`` with
    ``p = k / G`` (0 for an all-equal group).

    ======  =========  ================================================
    k       any shape  successes, integers in ``[0, G]``
    ddof    int        0: std with divisor G; 1: divisor G - 1 (Bessel)
    return  same       the sum of absolute advantages
    ======  =========  ================================================
    """
    k = _check_group(k, G, ddof)
    p = k / G
    return 2.0 * math.sqrt(G * (G - ddof)) * np.sqrt(p * (1 - p))


def abs_centred_sum(k, G: int):
    """``sum_i |r_i - mean(r)| = 2 G p (1 - p)`` (the advantage without std scaling), ``p = k / G``.

    ======  =========  ======================================
    k       any shape  successes, integers in ``[0, G]``
    return  same       the sum of absolute centred rewards
    ======  =========  ======================================
    """
    k = _check_group(k, G)
    p = k / G
    return 2.0 * G * p * (1 - p)


def zero_variance_probability(p, G: int):
    """``P(all G rewards equal) = p**G + (1 - p)**G`` for Bernoulli(``p``) rewards.

    ======  =========  ==============================
    p       any shape  pass rates in [0, 1]
    return  same       probability of a zero-variance group
    ======  =========  ==============================
    """
    return 1.0 - informative_probability(p, G)


def _binomial_weights(p, G: int) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(p, dtype=float)
    if ((p < 0) | (p > 1)).any():
        raise ValueError("pass rates must lie in [0, 1]")
    k = np.arange(G + 1)
    w = np.array([math.comb(G, int(j)) for j in k]) * p[..., None] ** k * (1 - p[..., None]) ** (G - k)
    return k, w


def expected_grpo_logit_step(p, G: int, ddof: int = 0):
    """Exact expected GRPO step on the logit ``theta`` of a two-armed softmax bandit (``p =
    sigmoid(theta)``, reward 1 on the good arm): ``E[sum_i A_i d log pi(y_i) / d theta] =
    sqrt(G (G - ddof)) E[sqrt(p_hat (1 - p_hat))]``, the expectation over ``k ~ Binomial(G, p)``.

    ======  =========  ================================================
    p       any shape  pass rates in [0, 1]
    return  same       the expected step (sum over the group, not divided by G)
    ======  =========  ================================================
    """
    _check_group(0, G, ddof)
    k, w = _binomial_weights(p, G)
    return (w * abs_advantage_sum(k, G, ddof) / 2.0).sum(-1)


def grpo_surrogate(theta_eval: float, theta: float, G: int, ddof: int = 0) -> float:
    """``E_{y ~ pi_theta}[sum_i A_i log pi_{theta_eval}(y_i)]`` for the two-armed bandit, exact
    (groups enumerated by their success count); its derivative in ``theta_eval`` at ``theta`` is
    :func:`expected_grpo_logit_step` (the chapter checks it by finite differences).

    ==========  =====  ==========================================
    theta_eval  float  logit at which the log-probabilities are taken
    theta       float  logit of the sampling policy (fixes the advantages)
    return      float  the surrogate's value
    ==========  =====  ==========================================
    """
    _check_group(0, G, ddof)
    p = 1.0 / (1.0 + math.exp(-theta))
    k, w = _binomial_weights(p, G)
    ph = k / G
    sd = np.sqrt(G * ph * (1 - ph) / (G - ddof))
    safe = np.where(sd > 0, sd, 1.0)
    a1, a0 = np.where(sd > 0, (1 - ph) / safe, 0.0), np.where(sd > 0, -ph / safe, 0.0)
    lp1 = -math.log1p(math.exp(-theta_eval))
    lp0 = -math.log1p(math.exp(theta_eval))
    return float((w * (k * a1 * lp1 + (G - k) * a0 * lp0)).sum())


# ---------------------------------------------------------------------- the choosers (pure)
def eligible(rates, measured_at, step: int, lo: float = 0.0, hi: float = 1.0, cooldown: int = 8) -> np.ndarray:
    """Which prompts the pass-rate filter lets through at ``step``.

    ============  =====  ==============================================================
    rates         (N,)   each prompt's last group pass rate, NaN if never measured
    measured_at   (N,)   the step it was measured at (ignored where NaN)
    cooldown      int    a prompt filtered out comes back ``cooldown`` steps after its
                         measurement (its estimate is stale by then): hysteresis
    return        (N,)   bool: never measured, or ``lo < rate < hi``, or stale
    ============  =====  ==============================================================
    """
    rates, measured_at = np.asarray(rates, dtype=float), np.asarray(measured_at, dtype=float)
    if rates.shape != measured_at.shape or rates.ndim != 1:
        raise ValueError(f"rates {rates.shape} and measured_at {measured_at.shape} must be equal 1-D shapes")
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"the band needs 0 <= lo < hi <= 1, got ({lo}, {hi})")
    if cooldown < 1:
        raise ValueError(f"cooldown must be >= 1 step, got {cooldown}")
    fresh = np.isnan(rates)
    inside = (rates > lo) & (rates < hi)
    stale = ~fresh & (step - measured_at >= cooldown)
    return fresh | inside | stale


def filtered_draw(mask, n: int, generator: torch.Generator) -> list[int]:
    """``n`` distinct indices: uniformly among the ``True`` entries of ``mask``, then, if there are
    fewer than ``n``, uniformly among the others (a step never trains on fewer prompts).

    ======  =====  ===========================
    mask    (N,)   bool, from :func:`eligible`
    return  n      distinct indices into ``mask``
    ======  =====  ===========================
    """
    mask = np.asarray(mask, dtype=bool)
    if n > mask.size:
        raise ValueError(f"asked for {n} prompts from a pool of {mask.size}")
    ok, rest = np.flatnonzero(mask), np.flatnonzero(~mask)
    pick = ok[torch.randperm(len(ok), generator=generator)[:n].numpy()].tolist()
    if len(pick) < n:
        pick += rest[torch.randperm(len(rest), generator=generator)[: n - len(pick)].numpy()].tolist()
    return pick


# ---------------------------------------------------------------------- the registered prompt samplers
MEMORY_KEY = "pass_memory"


def _memory(state: dict, pool: list[Example], step: int, name: str) -> dict:
    """The samplers' memory in ``state["pass_memory"]``: the (growing) pool, each prompt's last pass
    rate and step, and the children made; last step's feedback folded in."""
    mem = state.get(MEMORY_KEY)
    if mem is None:
        seen, items = set(), []
        for e in pool:
            if e.prompt not in seen:
                seen.add(e.prompt)
                items.append(e)
        mem = {"items": items, "seeds": list(items), "index": {e.prompt: i for i, e in enumerate(items)},
               "rates": [math.nan] * len(items), "at": [0] * len(items), "children": [0] * len(items),
               "drawn": [], "read": 0}
        state[MEMORY_KEY] = mem
    if mem["drawn"]:
        fb = state.get(FEEDBACK_KEY)
        if fb is None or fb.get("step") != step - 1:
            raise ValueError(f"prompt sampler {name!r} drew prompts at step {step - 1} but found no pass rates for "
                             f"them in state[{FEEDBACK_KEY!r}]: run it with sampler='heapa_feedback'")
        for prompt, (k, m) in fb["rates"].items():
            i = mem["index"].get(prompt)
            if i is not None and m > 0:
                mem["rates"][i], mem["at"][i] = k / m, fb["step"]
        mem["read"] = fb["step"]
    return mem


def _draw(mem: dict, n: int, generator: torch.Generator, step: int, lo: float, hi: float, cooldown: int,
          state: dict, extra: dict) -> list[Example]:
    mask = eligible(mem["rates"], mem["at"], step, lo, hi, cooldown)
    ids = filtered_draw(mask, n, generator)
    mem["drawn"] = ids
    state["heapa_metrics"] = {"filter_eligible": float(mask.mean()), "filter_pool": len(mem["items"]), **extra}
    return [mem["items"][i] for i in ids]


def cooldown_steps(pool_size: int, n: int, passes: float = 2.0) -> int:
    """The filter's cooldown in steps: ``passes`` passes over a pool of ``pool_size`` prompts drawn
    ``n`` a step (a prompt is drawn about once a pass, so a shorter cooldown re-admits every prompt
    before its next draw and the filter does nothing)."""
    if passes <= 0 or n < 1 or pool_size < 1:
        raise ValueError(f"need passes > 0, n >= 1 and pool_size >= 1, got {passes}, {n}, {pool_size}")
    return max(1, math.ceil(passes * pool_size / n))


def pass_filter_prompts(pool, n, generator, state, task, step, *, lo: float = 0.0, hi: float = 1.0,
                        passes: float = 2.0) -> list[Example]:
    """Uniform draws among prompts whose last pass rate lay in ``(lo, hi)`` (see :func:`eligible`).

    =========  ================================================================================
    pool       the trainer's training examples (duplicates merged)
    state      holds the memory under ``state["pass_memory"]``; step k > 1 reads the pass rates
               of step k - 1 from ``state["prompt_feedback"]`` (the ``heapa_feedback`` sampler)
    returns    ``n`` distinct examples
    =========  ================================================================================
    """
    mem = _memory(state, pool, step, "pass_filter")
    cooldown = cooldown_steps(len(mem["seeds"]), n, passes)
    return _draw(mem, n, generator, step, lo, hi, cooldown, state, {})


def synth_easier_prompts(pool, n, generator, state, task, step, *, lo: float = 0.0, hi: float = 1.0,
                         passes: float = 2.0, max_children: int = 2) -> list[Example]:
    """:func:`pass_filter_prompts` over a growing pool: each prompt whose last group failed entirely
    (pass rate 0) gets up to ``max_children`` easier variants ``task.easier(example, rng)``, new
    prompts that enter the pool unmeasured (so they are drawn soon). Needs a task with ``easier``."""
    if not callable(getattr(task, "easier", None)):
        raise ValueError(f"prompt sampler 'synth_easier' needs a task with an easier(example, rng) method, such as "
                         f"scarcity_addition; {getattr(task, 'name', task)!r} has none")
    mem = _memory(state, pool, step, "synth_easier")
    rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))
    made = 0
    for i in list(mem["drawn"]):
        if mem["rates"][i] == 0.0 and mem["children"][i] < max_children:
            child = task.easier(mem["items"][i], rng)
            mem["children"][i] += 1
            if child is not None and child.prompt not in mem["index"]:
                mem["index"][child.prompt] = len(mem["items"])
                mem["items"].append(child)
                for key, v in (("rates", math.nan), ("at", 0), ("children", 0)):
                    mem[key].append(v)
                made += 1
    cooldown = cooldown_steps(len(mem["seeds"]), n, passes)
    return _draw(mem, n, generator, step, lo, hi, cooldown, state, {"synth_children": made})


register_prompt_sampler("pass_filter")(pass_filter_prompts)
register_prompt_sampler("synth_easier")(synth_easier_prompts)


class ScarcityAddition(CurriculumAddition):
    """HeaPA's curriculum addition (1 to 4 digits, ``meta["digits"]`` the level) with an easier
    variant: :meth:`easier` drops the leading digit of both operands (level ``d - 1``)."""

    name = "scarcity_addition"

    def easier(self, example: Example, rng: np.random.Generator | None = None) -> Example | None:
        """The same sum one level down: both operands without their leading digit; None at level 1
        or for an example without ``meta['digits']``."""
        d = example.meta.get("digits")
        if d is None or d <= 1:
            return None
        a, b = (int(str(example.meta[x])[1:]) for x in ("a", "b"))
        lo = 10 ** (d - 2) if d > 2 else 0
        a, b = max(a, lo), max(b, lo)  # keep d - 1 digits when the dropped digit left a leading zero
        return self._make(a, b, d - 1)


register_task("scarcity_addition")(ScarcityAddition)


# ---------------------------------------------------------------------- the experiment, in rlcourse.studies.data_scarcity
_STUDY_NAMES = frozenset((
    'REPLAY', 'rollouts_to_target', 'toy_run',
    'LM_ARMS', 'TOY_ARMS', 'lm_claims', 'lm_experiment', 'lm_sizes', 'run_lm_cell', 'toy_claims',
    'toy_experiment',
))


def __getattr__(name):
    """The chapter's experiment lives in :mod:`rlcourse.studies.data_scarcity`; its names stay importable here."""
    if name in _STUDY_NAMES:
        from ..studies import data_scarcity as study

        return getattr(study, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
