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

The exact toy (enumerated sequence space) lives in the functions at the top; the language-model
experiment in :func:`attack_run`.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import time
from dataclasses import replace

import numpy as np
import torch

from ..lm.model import build_model, response_logprobs
from ..lm.sampling import RolloutBatch, cat_batches, sample
from ..lm.tokenizer import build_tokenizer
from ..lm.zoo import cached_model, sft_loss
from ..profiles import Profile, cache_dir, profile as current_profile
from ..rewards import register_reward
from ..rollout import register_sampler
from ..tasks import Example, Score, Task, register_task


# ---------------------------------------------------------------------- the exact toy
def all_sequences(vocab: int, length: int) -> np.ndarray:
    """Every sequence of ``length`` tokens over ``vocab`` symbols, in lexicographic order.

    ======= ============== =================================
    returns ``(V**L, L)``  int, row i is the i-th sequence
    ======= ============== =================================
    """
    if vocab < 1 or length < 1:
        raise ValueError(f"vocab and length must be positive, got {vocab}, {length}")
    grids = np.meshgrid(*[np.arange(vocab)] * length, indexing="ij")
    return np.stack([g.reshape(-1) for g in grids], axis=1)


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


def toy_search(prior: np.ndarray, success: np.ndarray, budget: int, per_round: int, tau: float, pseudo: float,
               rng: np.random.Generator, method: str = "banel") -> np.ndarray:
    """Spend ``budget`` reward evaluations on the toy; returns the cumulative successes after each.

    ``method="random"`` evaluates prior samples; ``"banel"`` evaluates posterior samples, adding a
    region fitted on all failures so far after every ``per_round`` evaluations; ``"oracle"`` uses the
    true failure set as its only region from the start (the ideal "never repeat a mistake").
    Successes are counted once per distinct point found. The posterior is drawn exactly from its
    enumeration (the rejection sampler draws the same distribution, at an expected cost of
    ``1 / P_prior(outside)`` prior draws a point, which grows as the regions cover the prior)."""
    if method not in ("random", "banel", "oracle"):
        raise ValueError(f"method must be 'random', 'banel' or 'oracle', got {method!r}")
    success = np.asarray(success, bool)
    regions = [~success] if method == "oracle" else []
    found, failures, curve = set(), [], []
    while len(curve) < budget:
        post = exploration_posterior(prior, np.array(regions) if regions else np.zeros((0, len(prior)), bool))
        xs = rng.choice(len(prior), size=min(per_round, budget - len(curve)), p=post)
        for x in xs:
            if success[x]:
                found.add(int(x))
            else:
                failures.append(int(x))
            curve.append(len(found))
        if method == "banel" and failures:
            phi = fit_categorical_failure_model(np.array(failures), prior, pseudo)
            with np.errstate(divide="ignore"):
                regions.append(rejection_region(np.log(prior), np.log(phi), tau))
            if np.all(np.any(regions, axis=0)):
                regions.pop()  # a region that would leave nothing is not added
    return np.array(curve)


# ---------------------------------------------------------------------- the addition attack
QUERY = re.compile(r"(\d+)\+(\d+)=")
PAPER = ("BaNEL: Exploration Posteriors for Generative Modeling Using Only Negative Rewards, S. Lee, B. Amos, "
         "G. Fanti (2025, arXiv:2510.09596)")


def parse_query(text: str) -> tuple[str, str] | None:
    """The two operands of a valid query ``a+b=`` (as written, leading zeros kept), else None."""
    m = QUERY.fullmatch(text.strip())
    return None if m is None else (m.group(1), m.group(2))


def query_kind(text: str) -> str:
    """What a valid query looks like: ``"one-digit"`` (the target's training set), ``"leading zero"``
    (an operand written with a leading 0, e.g. ``03+4=``), ``"two-digit"`` (an operand >= 10), or
    ``"invalid"``."""
    ops = parse_query(text)
    if ops is None:
        return "invalid"
    if any(len(o) > 1 and o[0] == "0" for o in ops):
        return "leading zero"
    if any(len(o) > 1 for o in ops):
        return "two-digit"
    return "one-digit"


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


def _small(prof: Profile) -> Profile:
    """The attack's model sizes: narrower than the profile's LM (the queries are 4 to 7 characters)."""
    return replace(prof, lm_hidden=prof.pick(smoke=32, book=64), lm_intermediate=prof.pick(smoke=64, book=128),
                   lm_layers=prof.pick(smoke=1, book=2), lm_heads=2, lm_max_positions=32)


def _cached(name: str, recipe: dict, build):
    """Load the model cached under ``recipe``'s hash, or ``build()`` it and cache it (atomically)."""
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / "banel" / f"{name}-{digest}"
    return cached_model(path, build)


def _target_examples() -> list[Example]:
    """All 100 one-digit facts in the addition task's format (reversed sum, ``|``, sum)."""
    return [Example(prompt=f"{a}+{b}=", answer=str(a + b), solution=f"{str(a + b)[::-1]}|{a + b}")
            for a in range(10) for b in range(10)]


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


def load_target(prof: Profile | None = None, seed: int = 0):
    """The target: a tiny adder trained on the 100 one-digit facts until it answers all of them
    (greedy), or the profile's step limit. Cached; ``model.config.rlcourse_target`` records its accuracy."""
    prof = _small(prof or current_profile())
    steps = prof.pick(smoke=40, book=3000)

    def build():
        tok = build_tokenizer()
        model = build_model(tok, prof, seed=seed)
        facts = _target_examples()
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        acc, done = 0.0, 0
        for done in range(1, steps + 1):
            model.train()
            rows = torch.randint(len(facts), (64,), generator=gen).tolist()
            loss = sft_loss(model, tok, [facts[i] for i in rows])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if done % 100 == 0 or done == steps:
                model.eval()
                acc = 1.0 - float(target_wrong(model, tok, [f.prompt for f in facts]).mean())
                if acc == 1.0:
                    break
        model.config.rlcourse_target = {"accuracy_one_digit": acc, "steps": done}
        return model.eval(), tok

    return _cached("target", {"v": 1, "profile": prof.as_dict(), "steps": steps, "seed": seed}, build)


def load_attacker(prof: Profile | None = None, rare: float = 0.02, seed: int = 0):
    """The attacker: the same tiny architecture, SFT on ``addition_attack`` demonstrations (valid
    queries, a share ``rare`` of them with a two-digit operand). Cached."""
    prof = _small(prof or current_profile())
    steps = prof.pick(smoke=30, book=300)

    def build():
        from ..train import sft
        tok = build_tokenizer()
        model = build_model(tok, prof, seed=seed + 1)
        sft(model, tok, AdditionAttack(rare).examples(5000, seed=seed), steps=steps, batch_size=64, lr=2e-3,
            seed=seed)
        return model.eval(), tok

    return _cached("attacker", {"v": 1, "profile": prof.as_dict(), "steps": steps, "rare": rare, "seed": seed}, build)


_TARGETS: dict = {}


def attack_target(task: Task):
    """The target the ``attack_success`` reward attacks: ``task.target`` if set, else the cached
    target of the current profile. Other tasks are refused."""
    if not isinstance(task, AdditionAttack):
        raise ValueError(f"the attack rewards need the addition_attack task, got {task.name!r}")
    if getattr(task, "target", None) is None:
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


def _rebuild(model, weights: dict):
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
    regions = [ratio_region(_rebuild(model, w), tau) for w in mem["regions"]]
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


# ---------------------------------------------------------------------- the experiment
def one_digit_oracle(batch, log_prior) -> torch.Tensor:
    """The oracle region for a target that answers every one-digit query: the true failure set of
    valid one-digit queries (plus malformed text, which never succeeds). ``(B,)`` bool."""
    return torch.tensor([query_kind(t) in ("one-digit", "invalid") for t in batch.texts])


def _final_rate(sampler_batch_texts: list[str], target) -> tuple[float, dict]:
    wrong = target_wrong(*target, sampler_batch_texts)
    kinds = [query_kind(t) for t in sampler_batch_texts]
    return float(wrong.mean()), {k: int(sum(1 for q, w in zip(kinds, wrong) if q == k and w)) for k in set(kinds)}


def attack_run(arm: str, seed: int, budget: int, prof: Profile | None = None, prompts: int = 4, G: int = 8,
               lr: float = 1e-3, n_eval: int = 256, oversample: int = 8, fit_steps: int = 30) -> dict:
    """One arm of the attack under a budget of ``budget`` reward evaluations (NRE), through the
    :class:`~rlcourse.train.Trainer`, ``prompts * G`` evaluations a step:

    ==========  ========================================================================
    random      the attacker's own samples, no update (``learning_rate=0``)
    novelty     GRPO on ``attack_novelty`` (success + count bonus) at ``lr``
    banel       the ``banel`` sampler on ``attack_success``, no policy update
    oracle      positive control: the posterior with the true failure set as its region
    ==========  ========================================================================

    Returns the successes found (``found``, ``distinct``), the NRE of each success (``hits``), the
    final sampler's success rate on ``n_eval`` fresh samples (evaluations outside the budget) with
    the kinds of query it breaks the target with, and the seconds taken."""
    from ..train import RLConfig, Trainer

    prof = prof or current_profile()
    if arm not in ("random", "novelty", "banel", "oracle"):
        raise ValueError(f"unknown arm {arm!r}")
    start = time.perf_counter()
    target = load_target(prof)
    model, tok = load_attacker(prof)
    task = AdditionAttack()
    task.target = target
    gen = torch.Generator().manual_seed(seed)
    pool = task.examples(200, seed=seed)
    tags = [e.prompt for e in pool[:prompts]]
    if arm == "oracle":
        b, _ = draw_posterior(model, tok, [tags[0]], budget, [one_digit_oracle], gen, oversample=oversample,
                              max_draws=64)
        hit = target_wrong(*target, b.texts)
        hits = [(i + 1, b.texts[i]) for i in np.flatnonzero(hit)]
        final_b, _ = draw_posterior(model, tok, tags, n_eval // prompts, [one_digit_oracle], gen,
                                    oversample=oversample, max_draws=64)
    else:
        steps = max(1, budget // (prompts * G))
        cfg = RLConfig(num_generations=G, prompts_per_step=prompts, max_completion_length=8, steps=steps,
                       progress=False, seed=seed, learning_rate=lr if arm == "novelty" else 0.0,
                       reward="attack_novelty" if arm == "novelty" else "attack_success",
                       sampler="banel" if arm == "banel" else "policy",
                       sampler_kwargs={"oversample": oversample, "fit_steps": fit_steps} if arm == "banel" else {})
        trainer = Trainer(model, tok, task, cfg, train_examples=pool, eval_examples=[])
        trainer.train()
        hits = list(trainer.state.get("attack_log", []))
        if arm == "banel":
            regions = [ratio_region(_rebuild(model, w), 1.0) for w in trainer.state["banel"]["regions"]]
            final_b, _ = draw_posterior(model, tok, tags, n_eval // prompts, regions, gen, oversample=oversample)
        else:
            final_b = sample(model, tok, tags, num_generations=n_eval // prompts, max_new_tokens=8, generator=gen)
    rate, kinds = _final_rate(final_b.texts, target)
    return {"arm": arm, "seed": seed, "budget": budget, "found": len(hits), "distinct": len({q for _, q in hits}),
            "hits": hits, "final_rate": rate, "final_kinds": kinds, "seconds": time.perf_counter() - start}


def base_success_rate(prof: Profile | None = None, n: int = 4000, seed: int = 0) -> dict:
    """The attacker's own success rate against the target on ``n`` samples, and the kinds of query
    in them (the prior's mass on each kind)."""
    prof = prof or current_profile()
    target = load_target(prof)
    model, tok = load_attacker(prof)
    b = sample(model, tok, ["q000:"], num_generations=n, max_new_tokens=8, generator=torch.Generator().manual_seed(seed))
    wrong = target_wrong(*target, b.texts)
    kinds = [query_kind(t) for t in b.texts]
    share = {k: kinds.count(k) / n for k in set(kinds)}
    fail = {k: float(np.mean([w for q, w in zip(kinds, wrong) if q == k])) for k in set(kinds)}
    return {"rate": float(wrong.mean()), "n": n, "share": share, "wrong_by_kind": fail,
            "one_digit_accuracy": target[0].config.to_dict().get("rlcourse_target", {}).get("accuracy_one_digit")}


def attack_sizes(prof: Profile) -> dict:
    """The attack experiment's sizes for a profile (NRE budget, batch, evaluation samples, fitting)."""
    return prof.pick(smoke=dict(budget=16, prompts=2, G=4, n_eval=16, oversample=2, fit_steps=2, seeds=1, n_base=64),
                     book=dict(budget=192, prompts=4, G=8, n_eval=128, oversample=32, fit_steps=20, seeds=3,
                               n_base=2000))


ATTACK_SETTING = ("a tiny target adder (2-layer Llama, hidden 64) that answers all 100 one-digit facts; an attacker of "
                  "the same size pre-trained on valid queries, 2% of them with a two-digit operand; reward 1 iff the "
                  "target's answer is wrong; a budget of a few hundred reward evaluations instead of the paper's 7,500")


def attack_claims(budget: int) -> dict:
    """The claims of the attack experiment, fixed before the run."""
    from ..claims import Claim

    common = dict(paper=PAPER, source="abstract and the authors' blog posts", setting=ATTACK_SETTING)
    return {
        "vs_random": Claim(key="banel/more-successes-than-random", statement="BaNEL finds successes where sampling "
                           "the base model does not, under the same number of reward evaluations",
                           metric=f"successful attacks found within {budget} reward evaluations",
                           method="BaNEL", baseline="attacker samples", kind="greater", margin=0.0,
                           paper_number="success rate x278 over the base model (7,500 NRE)", unit="{:.1f}", control="banel/oracle-region-control", **common),
        "vs_novelty": Claim(key="banel/more-successes-than-novelty", statement="BaNEL improves the success rate "
                            "'by up to several orders of magnitude' over novelty-bonus baselines under the same NRE",
                            metric=f"successful attacks found within {budget} reward evaluations",
                            method="BaNEL", baseline="count bonus + GRPO", kind="greater", margin=0.0,
                            paper_number="several orders of magnitude", unit="{:.1f}", control="banel/oracle-region-control", **common),
        "final_rate": Claim(key="banel/posterior-ten-times-prior", statement="the final sampler's success rate is "
                            "far above the base model's (x278 in the addition attack)",
                            metric="final sampler's success rate minus 10 x the attacker's own (fresh samples)",
                            method="BaNEL - 10 x attacker", reference=0.0, kind="greater", margin=0.0,
                            paper_number="x278", unit="{:.3f}", control="banel/oracle-region-control", **common),
        "control": Claim(key="banel/oracle-region-control", role="positive control", statement="positive control (ours): with the true "
                         "failure set as the rejection region the budget finds successes",
                         metric=f"successful attacks found within {budget} reward evaluations",
                         method="oracle posterior", baseline="attacker samples", kind="greater", margin=0.0,
                         unit="{:.1f}", **common),
    }


def attack_experiment(prof: Profile | None = None, seeds: int | None = None) -> dict:
    """Every arm of the attack over ``seeds`` seeds (a seed fixes the sampling and fitting
    randomness; target and attacker are the same), the base rate, and the claims' verdicts."""
    from ..claims import evaluate
    from ..profiles import one_torch_thread

    prof = prof or current_profile()
    sz = attack_sizes(prof)
    seeds = seeds if seeds is not None else sz["seeds"]
    start = time.perf_counter()
    runs: dict[str, list[dict]] = {}
    with one_torch_thread():
        base = base_success_rate(prof, n=sz["n_base"])
        for arm in ("random", "novelty", "banel", "oracle"):
            runs[arm] = [attack_run(arm, s, sz["budget"], prof, prompts=sz["prompts"], G=sz["G"], n_eval=sz["n_eval"],
                                    oversample=sz["oversample"], fit_steps=sz["fit_steps"]) for s in range(seeds)]
    val = lambda arm, key: [r[key] for r in runs[arm]]  # noqa: E731
    claims = attack_claims(sz["budget"])
    seconds = time.perf_counter() - start
    control = evaluate(claims["control"], val("oracle", "distinct"), val("random", "distinct"), seconds=seconds)
    verdicts = {  # the three comparisons rest on the oracle control
        "vs_random": evaluate(claims["vs_random"], val("banel", "distinct"), val("random", "distinct"), seconds=seconds,
                              control=control),
        "vs_novelty": evaluate(claims["vs_novelty"], val("banel", "distinct"), val("novelty", "distinct"),
                               seconds=seconds, control=control),
        "final_rate": evaluate(claims["final_rate"], [b - 10 * r for b, r in zip(val("banel", "final_rate"),
                                                                                 val("random", "final_rate"))],
                               seconds=seconds, control=control),
        "control": control,
    }
    return {"runs": runs, "base": base, "verdicts": verdicts, "sizes": sz, "seeds": seeds, "seconds": seconds}


def toy_experiment(seeds: int, budget: int = 300, per_round: int = 20, tau: float = 1.0, pseudo: float = 5.0,
                   vocab: int = 5, length: int = 3, seed: int = 0) -> dict:
    """The exact toy: an autoregressive prior on ``vocab**length`` sequences, the two least likely
    sequences as the successes; cumulative successes per NRE of random, BaNEL and the oracle."""
    rng = np.random.default_rng(seed)
    first, trans = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab), size=vocab)
    xs = all_sequences(vocab, length)
    prior = first[xs[:, 0]] * np.prod(trans[xs[:, :-1], xs[:, 1:]], axis=1)
    success = np.zeros(len(prior), bool)
    success[np.argsort(prior)[:2]] = True
    curves = {m: np.stack([toy_search(prior, success, budget, per_round, tau, pseudo, np.random.default_rng(100 + s), m)
                           for s in range(seeds)]) for m in ("random", "banel", "oracle")}
    return {"prior": prior, "success": success, "curves": curves, "base_rate": float(prior[success].sum())}
