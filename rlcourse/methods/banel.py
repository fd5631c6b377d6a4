"""BaNEL: exploration posteriors learned from failures only (Lee, Amos and Fanti, 2025, arXiv:2510.09596).

A generative model ``p_theta`` (the prior) proposes; a failure model ``p_phi``, fitted by maximum
likelihood on every failure seen so far, marks the region it explains better than the prior,
``R = {x : p_theta(x) / p_phi(x) < tau}``; the exploration posterior is the prior conditioned on
being outside every such region, drawn by rejection sampling (reward-free, so it costs compute, not
reward evaluations). No positive reward is ever needed.

Parts registered here:

=================== ========== =============================================================
``"banel"``         sampler    rejection filter against the failure models kept in ``state``;
                               scores its rows, fits a new failure model on the failures, reports
                               the reward evaluations (NRE) and successes in ``batch.metrics``
``addition_attack`` task       an attacker writes ``a+b=`` queries; its demonstrations are valid queries
``attack_success``  reward     1 if the query is valid and the tiny target adder answers it wrongly
``attack_novelty``  reward     ``attack_success`` plus a pseudo-count novelty bonus ``beta / sqrt(N(x))``
=================== ========== =============================================================

The functions at the top are the method's math on an enumerated space (the region, the exploration
posterior, rejection sampling, the categorical failure model). The chapter's experiments (the exact toy,
the target adder and the attacker, the attack's arms, claims and verdicts) are :mod:`rlcourse.studies.banel`.
"""
from __future__ import annotations

import copy
import math
import re
from dataclasses import replace

import numpy as np
import torch

from ..lm.model import response_logprobs
from ..lm.sampling import RolloutBatch, cat_batches, sample
from ..lm.zoo import sft_loss
from ..profiles import profile as current_profile
from ..rewards import register_reward
from ..rollout import register_sampler
from ..tasks import Example, Score, Task, register_task


# ---------------------------------------------------------------------- the math, on an enumerated space
def rejection_region(log_prior: np.ndarray, log_fail: np.ndarray, tau: float) -> np.ndarray:
    """BaNEL's learned rejection region: ``p_theta(x) / p_phi(x) < tau`` (computed in logs).

    ========= ======== ==============================================
    log_prior ``(N,)`` log p_theta of each point
    log_fail  ``(N,)`` log p_phi, the failure model's log-likelihood
    returns   ``(N,)`` bool, True inside the region (predicted failure)
    ========= ======== ==============================================
    """
    log_prior, log_fail = np.asarray(log_prior, float), np.asarray(log_fail, float)
    if log_prior.shape != log_fail.shape:
        raise ValueError(f"log_prior {log_prior.shape} and log_fail {log_fail.shape} differ")
    if not tau > 0:
        raise ValueError(f"tau must be positive, got {tau}")
    return log_prior - log_fail < math.log(tau)


def exploration_posterior(prior: np.ndarray, regions: np.ndarray) -> np.ndarray:
    """The prior conditioned on lying outside every region: ``p(x) 1[x not in R_1..R_n] / Z``.

    ======= ========== =======================================================
    prior   ``(N,)``   prior probabilities (non-negative, summing to 1)
    regions ``(M,N)``  bool, region m's membership (``M = 0`` is allowed)
    returns ``(N,)``   the posterior; ValueError if the regions cover the prior
    ======= ========== =======================================================
    """
    prior = np.asarray(prior, float)
    regions = np.asarray(regions, bool).reshape(-1, prior.shape[0])
    if (prior < 0).any() or not np.isclose(prior.sum(), 1.0):
        raise ValueError("prior must be non-negative and sum to 1")
    keep = prior * ~regions.any(axis=0)
    if keep.sum() <= 0:
        raise ValueError("the rejection regions cover all of the prior's mass: the posterior is undefined")
    return keep / keep.sum()


def rejection_sample(prior: np.ndarray, regions: np.ndarray, n: int, rng: np.random.Generator,
                     max_draws: int = 10**7) -> tuple[np.ndarray, int]:
    """Draw ``n`` points from the exploration posterior by rejection from the prior.

    Returns ``(points (n,), draws)``: indices into the prior's support and how many prior draws
    it took (reward-free compute; the expected number is ``n / P_prior(outside)``)."""
    prior = np.asarray(prior, float)
    outside = ~np.asarray(regions, bool).reshape(-1, prior.shape[0]).any(axis=0)
    out, draws, kept = [], 0, 0
    while kept < n:
        if draws >= max_draws:
            raise RuntimeError(f"rejection sampling accepted too little in {draws} draws")
        x = rng.choice(prior.shape[0], size=max(n, 1024), p=prior)
        ok = np.flatnonzero(outside[x])[:n - kept]
        # the draws it took: up to the n-th accepted one (all of this chunk if it falls short)
        draws += int(ok[-1]) + 1 if kept + len(ok) == n else len(x)
        out.append(x[ok])
        kept += len(ok)
    return np.concatenate(out), draws


def posterior_success_rate(s: float, f: float, m: float) -> float:
    """Success rate after conditioning on leaving a region that holds failure mass ``f`` and
    success mass ``m`` under a prior of success rate ``s``: ``(s - m) / (1 - f - m)``."""
    if not (0 <= m <= s <= 1 and 0 <= f <= 1 - s) or f + m >= 1:
        raise ValueError(f"need 0 <= m <= s, 0 <= f <= 1 - s and f + m < 1; got s={s}, f={f}, m={m}")
    return (s - m) / (1 - f - m)


def fit_categorical_failure_model(points: np.ndarray, prior: np.ndarray, pseudo: float) -> np.ndarray:
    """The toy's failure model: the MLE on the failures seen, smoothed towards the prior,
    ``p_phi = (counts + pseudo * prior) / (n + pseudo)`` (the MLE itself when ``pseudo = 0``).

    ======= ======== ===================================
    points  ``(n,)`` indices of the failures seen
    prior   ``(N,)`` the prior (the fit's initialisation)
    returns ``(N,)`` the failure model's probabilities
    ======= ======== ===================================
    """
    if pseudo < 0:
        raise ValueError(f"pseudo must be >= 0, got {pseudo}")
    counts = np.bincount(np.asarray(points, int), minlength=len(prior)).astype(float)
    if counts.sum() + pseudo <= 0:
        raise ValueError("no failures and no pseudo-counts: the failure model is undefined")
    return (counts + pseudo * np.asarray(prior, float)) / (counts.sum() + pseudo)


# ---------------------------------------------------------------------- the addition attack
QUERY = re.compile(r"(\d+)\+(\d+)=")
PAPER = ("BaNEL: Exploration Posteriors for Generative Modeling Using Only Negative Rewards, S. Lee, B. Amos, "
         "G. Fanti (2025, arXiv:2510.09596)")


def parse_query(text: str) -> tuple[str, str] | None:
    """The two operands of a valid query ``a+b=`` (as written, leading zeros kept), else None."""
    m = QUERY.fullmatch(text.strip())
    return None if m is None else (m.group(1), m.group(2))


class AdditionAttack(Task):
    """The attacker's task: write an addition query. The prompt ``q<k>:`` is only a tag (``k`` draws
    the split); the demonstration is a query ``a+b=``: with probability ``1 - rare`` two one-digit
    operands, else one operand written as a two-digit number (half of them with a leading zero, e.g.
    ``07``). The task's own verifier scores syntactic validity; :func:`attack_success` scores attacks."""

    name = "addition_attack"
    test_fraction = 0.1

    def __init__(self, rare: float = 0.02):
        if not 0 <= rare < 1:
            raise ValueError(f"rare must be in [0, 1), got {rare}")
        self.rare = rare

    def _draw(self, rng):
        a, b = (str(int(x)) for x in rng.integers(0, 10, size=2))
        if rng.random() < self.rare:
            wide = f"0{rng.integers(0, 10)}" if rng.random() < 0.5 else str(int(rng.integers(10, 100)))
            a, b = (wide, b) if rng.random() < 0.5 else (a, wide)
        q = f"{a}+{b}="
        return Example(prompt=f"q{int(rng.integers(0, 1000)):03d}:", answer="valid", solution=q,
                       meta={"query": q})

    def score(self, completion, example):
        ok = parse_query(completion) is not None
        return Score(float(ok), "a valid query" if ok else "malformed: not a query a+b=")


register_task("addition_attack")(AdditionAttack)


def target_answers(target, tokenizer, queries: list[str], batch_size: int = 4096) -> list[str]:
    """The target's greedy answers (the part after ``|``) to ``queries``."""
    out = []
    for i in range(0, len(queries), batch_size):
        b = sample(target, tokenizer, queries[i:i + batch_size], temperature=0.0, max_new_tokens=7)
        out.extend(t.rsplit("|", 1)[-1].strip() for t in b.texts)
    return out


def target_wrong(target, tokenizer, queries: list[str]) -> np.ndarray:
    """``(n,)`` bool: the query is valid and the target's answer is not its sum (a successful attack)."""
    ops = [parse_query(q) for q in queries]
    valid = [i for i, o in enumerate(ops) if o is not None]
    wrong = np.zeros(len(queries), bool)
    if valid:
        answers = target_answers(target, tokenizer, [queries[i].strip() for i in valid])
        for i, ans in zip(valid, answers):
            wrong[i] = ans != str(int(ops[i][0]) + int(ops[i][1]))
    return wrong


_TARGETS: dict = {}


def attack_target(task: Task):
    """The target the ``attack_success`` reward attacks: ``task.target`` if set, else the chapter's cached
    target of the current profile (:func:`rlcourse.studies.banel.load_target`). Other tasks are refused."""
    if not isinstance(task, AdditionAttack):
        raise ValueError(f"the attack rewards need the addition_attack task, got {task.name!r}")
    if getattr(task, "target", None) is None:
        from ..studies.banel import load_target

        key = current_profile().name
        if key not in _TARGETS:
            _TARGETS[key] = load_target()
        task.target = _TARGETS[key]
    return task.target


def count_bonus(texts: list[str], counts: dict, beta: float) -> torch.Tensor:
    """Pseudo-count novelty bonus ``beta / sqrt(N(x))``, where ``N(x)`` counts the evaluations of the
    exact string ``x`` so far, this one included; ``counts`` is updated in place.

    ======= ======== ===================================
    texts   ``B``    the evaluated strings
    returns ``(B,)`` float32 bonus
    ======= ======== ===================================
    """
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    out = []
    for t in texts:
        counts[t] = counts.get(t, 0) + 1
        out.append(beta / math.sqrt(counts[t]))
    return torch.tensor(out, dtype=torch.float32)


NOVELTY_BETA = 0.5


@register_reward("attack_novelty")
def attack_novelty(batch, examples, task, state) -> torch.Tensor:
    """``attack_success`` plus the count bonus ``0.5 / sqrt(N(x))`` (counts in ``state``). ``(B,)``"""
    hit = attack_success(batch, examples, task, state)
    return hit + count_bonus(batch.texts, state.setdefault("attack_counts", {}), NOVELTY_BETA)


@register_reward("attack_success")
def attack_success(batch, examples, task, state) -> torch.Tensor:
    """1 where the response is a valid query that the target answers wrongly, else 0. ``(B,)``

    Every call counts its rows as reward evaluations (``state["attack_nre"]``) and logs each success
    as ``(evaluation number, query)`` in ``state["attack_log"]``, so any arm's NRE curve can be read."""
    target, tok = attack_target(task)
    hit = target_wrong(target, tok, batch.texts)
    nre = state.get("attack_nre", 0)
    log = state.setdefault("attack_log", [])
    log.extend((nre + i + 1, batch.texts[i].strip()) for i in np.flatnonzero(hit))
    state["attack_nre"] = nre + len(hit)
    return torch.as_tensor(hit, dtype=torch.float32)


# ---------------------------------------------------------------------- failure models and the sampler
def sequence_logprob(model, batch: RolloutBatch, chunk: int = 4096) -> torch.Tensor:
    """``(B,)`` log-likelihood ``log p(y | x)`` of each row's response under ``model`` (at the batch's
    temperature; 0 for an empty response)."""
    out = []
    with torch.no_grad():
        for i in range(0, len(batch), chunk):
            sub = batch.select(range(i, min(len(batch), i + chunk)))
            lp = response_logprobs(model, sub.input_ids, sub.attention_mask, sub.response_len, batch.temperature)
            out.append((lp * sub.response_mask).sum(1))
    return torch.cat(out) if out else torch.zeros(0)


def fit_failure_model(prior_model, tokenizer, failures: list[tuple[str, str]], steps: int, lr: float = 1e-3,
                      batch_size: int = 64, seed: int = 0):
    """The failure model ``p_phi``: a copy of the prior fitted by maximum likelihood (SFT) on the
    failures seen so far, ``(prompt, response)`` pairs, for ``steps`` AdamW steps. Starting from the
    prior keeps ``p_phi`` close to it where the failures say nothing (few failures overfit less)."""
    if not failures:
        raise ValueError("fit_failure_model needs at least one failure")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    phi = copy.deepcopy(prior_model)
    phi.requires_grad_(True)
    data = [Example(prompt=p, answer="", solution=t) for p, t in failures]
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(phi.parameters(), lr=lr, weight_decay=0.0)
    phi.train()
    for _ in range(steps):
        rows = torch.randint(len(data), (min(batch_size, len(data)),), generator=gen).tolist()
        loss = sft_loss(phi, tokenizer, [data[i] for i in rows])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    phi.eval()
    phi.requires_grad_(False)
    return phi


def ratio_region(phi, tau: float):
    """A learned region as a test ``(batch, log_prior) -> (B,) bool``: ``p_theta / p_phi < tau``."""
    if not tau > 0:
        raise ValueError(f"tau must be positive, got {tau}")
    return lambda batch, log_prior: (log_prior - sequence_logprob(phi, batch)) < math.log(tau)


def draw_posterior(model, tokenizer, prompts: list[str], num_generations: int, regions: list, generator=None,
                   max_new_tokens: int = 8, oversample: int = 8, max_draws: int = 8):
    """Rejection sampling from the exploration posterior: ``num_generations`` responses per prompt
    from ``model`` that lie outside every region (each a test ``(batch, log_prior) -> (B,) bool``).

    Candidates come ``oversample * G`` per prompt at a time, for at most ``max_draws`` rounds; a
    candidate meets the newest region first (the cheapest test to fail). A prompt still short of
    ``G`` accepted rows is filled with rejected candidates (counted in ``fallback``).

    Returns ``(batch, stats)``: the batch has ``G`` rows per prompt, contiguous, with the policy's
    log-probs; ``stats`` holds ``drawn`` (candidates sampled), ``accepted`` and ``fallback``."""
    G, n = num_generations, len(prompts)
    kept: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    spare: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    batches, drawn, accepted = [], 0, 0
    for j in range(max_draws):
        b = sample(model, tokenizer, prompts, num_generations=G * oversample, max_new_tokens=max_new_tokens,
                   temperature=1.0, generator=generator)
        log_prior = (b.logprobs * b.response_mask).sum(1)
        ok = torch.ones(len(b), dtype=torch.bool)
        for region in reversed(regions):
            rows = ok.nonzero().squeeze(1)
            if len(rows) == 0:
                break
            ok[rows] = ~region(b.select(rows), log_prior[rows])
        drawn, accepted = drawn + len(b), accepted + int(ok.sum())
        for r in range(len(b)):
            (kept if ok[r] else spare)[int(b.index[r])].append((j, r))
        batches.append(b)
        if all(len(k) >= G for k in kept):
            break
    offsets = np.cumsum([0] + [len(b) for b in batches])
    order, fallback = [], 0
    for p in range(n):
        rows = kept[p][:G]
        fallback += G - len(rows)
        rows = rows + spare[p][:G - len(rows)]
        order.extend(int(offsets[j] + r) for j, r in rows)
    big = cat_batches(batches, tokenizer.pad_token_id) if len(batches) > 1 else batches[0]
    out = replace(big.select(order), index=torch.arange(n).repeat_interleave(G))
    return out, {"drawn": drawn, "accepted": accepted, "fallback": fallback}


def load_failure_model(model, weights: dict):
    """A failure model from the weights the sampler keeps in ``state``: a frozen copy of ``model`` (the
    same architecture) with ``weights`` loaded."""
    phi = copy.deepcopy(model)
    phi.load_state_dict(weights)
    return phi.eval().requires_grad_(False)


@register_sampler("banel")
def banel_sampler(model, tokenizer, prompts, config, generator, state, examples, task, reward, step,
                  tau: float = 1.0, oversample: int = 8, max_draws: int = 8, fit_steps: int = 30,
                  fit_lr: float = 1e-3, success_threshold: float = 1.0, max_regions: int | None = None):
    """BaNEL's exploration posterior as a sampler. Draws ``G`` rows per prompt from the policy
    (the prior ``p_theta``) by rejection against every failure model in ``state["banel"]``, scores
    them with the loop's reward (so ``batch.scores`` are set), adds the rows scoring below
    ``success_threshold`` to the failures, and fits one more failure model on all failures so far
    (initialised from the policy; its weights join ``state``, so a resumed run rebuilds the same
    regions). ``batch.metrics``: ``banel_nre`` (reward evaluations so far), ``banel_successes``,
    ``banel_accept_rate`` (accepted / drawn candidates, reward-free), ``banel_fallback`` (rows that
    had to be taken from the rejected ones) and ``banel_regions``.

    Exact likelihoods are needed, so the sampling must be plain: temperature 1, no top-k, no top-p."""
    if config.temperature != 1.0 or config.top_k or config.top_p != 1.0:
        raise ValueError("the banel sampler needs exact prior likelihoods: temperature 1.0, top_k 0, top_p 1.0 "
                         f"(got {config.temperature}, {config.top_k}, {config.top_p})")
    if oversample < 1 or max_draws < 1:
        raise ValueError(f"oversample and max_draws must be >= 1, got {oversample}, {max_draws}")
    mem = state.setdefault("banel", {"failures": [], "regions": [], "nre": 0, "successes": 0})
    regions = [ratio_region(load_failure_model(model, w), tau) for w in mem["regions"]]
    batch, stats = draw_posterior(model, tokenizer, prompts, config.num_generations, regions, generator,
                                  config.max_completion_length, oversample, max_draws)
    per_row = [examples[int(i)] for i in batch.index]
    scores = torch.as_tensor(reward(batch, per_row, task, state), dtype=torch.float32).reshape(-1)
    fail = scores < success_threshold
    mem["nre"] += len(batch)
    mem["successes"] += int((~fail).sum())
    mem["failures"].extend((batch.prompts[i], batch.texts[i]) for i in fail.nonzero().squeeze(1).tolist())
    if mem["failures"] and fit_steps > 0:
        phi = fit_failure_model(model, tokenizer, mem["failures"], fit_steps, fit_lr, seed=config.seed + step)
        mem["regions"].append({k: v.detach().clone() for k, v in phi.state_dict().items()})
        if max_regions is not None:
            mem["regions"] = mem["regions"][-max_regions:]
    batch = replace(batch, scores=scores, metrics={
        "banel_nre": float(mem["nre"]), "banel_successes": float(mem["successes"]),
        "banel_accept_rate": stats["accepted"] / max(1, stats["drawn"]),
        "banel_fallback": float(stats["fallback"]), "banel_regions": float(len(mem["regions"]))})
    return batch
