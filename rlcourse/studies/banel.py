"""BaNEL's experiments: the exact toy (an autoregressive prior on an enumerated sequence space, random
sampling against BaNEL against the oracle region), and the addition attack (a tiny target adder, an attacker
pre-trained on valid queries, the arms run under a budget of reward evaluations, their claims and
verdicts). The method (the region, the exploration posterior, the failure models, the registered ``banel``
sampler, the ``addition_attack`` task and the attack rewards) is :mod:`rlcourse.methods.banel`.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace

import numpy as np
import torch

from ..lm.model import build_model
from ..lm.sampling import sample
from ..lm.tokenizer import build_tokenizer
from ..lm.zoo import cached_model, sft_loss
from ..methods.banel import (PAPER, AdditionAttack, draw_posterior, exploration_posterior,
                             fit_categorical_failure_model, load_failure_model, parse_query, ratio_region,
                             rejection_region, target_wrong)
from ..profiles import Profile, cache_dir, profile as current_profile
from ..tasks import Example
from .runner import Results, Study, run_study


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


TOY_ARMS = ("random", "banel", "oracle")


def toy_problem(vocab: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The toy's autoregressive prior (first-token and transition probabilities drawn from ``seed``) on
    the ``vocab**length`` sequences of :func:`all_sequences`, and its successes, the two least likely
    sequences: ``(prior, success)``, each ``(vocab**length,)``."""
    rng = np.random.default_rng(seed)
    first, trans = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab), size=vocab)
    xs = all_sequences(vocab, length)
    prior = first[xs[:, 0]] * np.prod(trans[xs[:, :-1], xs[:, 1:]], axis=1)
    success = np.zeros(len(prior), bool)
    success[np.argsort(prior)[:2]] = True
    return prior, success


def run_toy_cell(arm: str, seed: int, sizes: dict) -> dict:
    """:func:`toy_search` with method ``arm`` (one of :data:`TOY_ARMS`) on the toy of ``sizes``, its
    sampling seeded by ``100 + seed``: ``curve`` ``(budget,)``, the cumulative successes per NRE."""
    if arm not in TOY_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {TOY_ARMS}")
    prior, success = toy_problem(sizes["vocab"], sizes["length"], sizes["seed"])
    curve = toy_search(prior, success, sizes["budget"], sizes["per_round"], sizes["tau"], sizes["pseudo"],
                       np.random.default_rng(100 + seed), arm)
    return {"curve": curve.tolist()}


def toy_study(seeds: int, budget: int = 300, per_round: int = 20, tau: float = 1.0, pseudo: float = 5.0,
              vocab: int = 5, length: int = 3, seed: int = 0) -> Study:
    """Random, BaNEL and the oracle on seeds ``0 .. seeds - 1`` of the toy whose prior ``seed`` draws."""
    sizes = dict(budget=budget, per_round=per_round, tau=tau, pseudo=pseudo, vocab=vocab, length=length, seed=seed)
    return Study(name="banel-toy", arms=TOY_ARMS, seeds=tuple(range(seeds)), run=run_toy_cell, sizes=sizes,
                 modules=("rlcourse.methods.banel",))


def toy_experiment(seeds: int, budget: int = 300, per_round: int = 20, tau: float = 1.0, pseudo: float = 5.0,
                   vocab: int = 5, length: int = 3, seed: int = 0, **run_kw) -> dict:
    """The exact toy: an autoregressive prior on ``vocab**length`` sequences, the two least likely
    sequences as the successes; cumulative successes per NRE of random, BaNEL and the oracle
    (``curves[arm]`` ``(seeds, budget)``): :func:`toy_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`)."""
    res = run_study(toy_study(seeds, budget, per_round, tau, pseudo, vocab, length, seed), **run_kw)
    prior, success = toy_problem(vocab, length, seed)
    curves = {m: np.array(res.values(m, "curve")) for m in TOY_ARMS}
    return {"prior": prior, "success": success, "curves": curves, "base_rate": float(prior[success].sum())}


# ---------------------------------------------------------------------- the addition attack
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


# ---------------------------------------------------------------------- the experiment
def one_digit_oracle(batch, log_prior) -> torch.Tensor:
    """The oracle region for a target that answers every one-digit query: the true failure set of
    valid one-digit queries (plus malformed text, which never succeeds). ``(B,)`` bool."""
    return torch.tensor([query_kind(t) in ("one-digit", "invalid") for t in batch.texts])


def _final_rate(sampler_batch_texts: list[str], target) -> tuple[float, dict]:
    wrong = target_wrong(*target, sampler_batch_texts)
    kinds = [query_kind(t) for t in sampler_batch_texts]
    return float(wrong.mean()), {k: int(sum(1 for q, w in zip(kinds, wrong) if q == k and w)) for k in set(kinds)}


def _attack_setup(prof: Profile, seed: int):
    """The target, a fresh copy of the attacker, the attack task aimed at the target, and its prompt pool
    for ``seed``: what every arm of the attack starts from."""
    target = load_target(prof)
    model, tok = load_attacker(prof)
    task = AdditionAttack()
    task.target = target
    return target, model, tok, task, task.examples(200, seed=seed)


def _train_attacker(arm: str, model, tok, task, pool, seed: int, steps: int, prompts: int, G: int, lr: float,
                    oversample: int, fit_steps: int):
    """Run the :class:`~rlcourse.train.Trainer` of the ``random``, ``novelty`` or ``banel`` arm for ``steps``
    steps of ``prompts * G`` reward evaluations; returns the trainer (its state holds the attack log and,
    for ``banel``, the learned regions)."""
    from ..train import RLConfig, Trainer

    cfg = RLConfig(num_generations=G, prompts_per_step=prompts, max_completion_length=8, steps=steps,
                   progress=False, seed=seed, learning_rate=lr if arm == "novelty" else 0.0,
                   reward="attack_novelty" if arm == "novelty" else "attack_success",
                   sampler="banel" if arm == "banel" else "policy",
                   sampler_kwargs={"oversample": oversample, "fit_steps": fit_steps} if arm == "banel" else {})
    trainer = Trainer(model, tok, task, cfg, train_examples=pool, eval_examples=[])
    trainer.train()
    return trainer


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
    prof = prof or current_profile()
    if arm not in ("random", "novelty", "banel", "oracle"):
        raise ValueError(f"unknown arm {arm!r}")
    start = time.perf_counter()
    target, model, tok, task, pool = _attack_setup(prof, seed)
    tags = [e.prompt for e in pool[:prompts]]
    gen = torch.Generator().manual_seed(seed)
    if arm == "oracle":
        b, _ = draw_posterior(model, tok, [tags[0]], budget, [one_digit_oracle], gen, oversample=oversample,
                              max_draws=64)
        hit = target_wrong(*target, b.texts)
        hits = [(i + 1, b.texts[i]) for i in np.flatnonzero(hit)]
        final_b, _ = draw_posterior(model, tok, tags, n_eval // prompts, [one_digit_oracle], gen,
                                    oversample=oversample, max_draws=64)
    else:
        trainer = _train_attacker(arm, model, tok, task, pool, seed, max(1, budget // (prompts * G)), prompts, G,
                                  lr, oversample, fit_steps)
        hits = list(trainer.state.get("attack_log", []))
        if arm == "banel":
            regions = learned_regions(model, trainer.state)
            final_b, _ = draw_posterior(model, tok, tags, n_eval // prompts, regions, gen, oversample=oversample)
        else:
            final_b = sample(model, tok, tags, num_generations=n_eval // prompts, max_new_tokens=8, generator=gen)
    rate, kinds = _final_rate(final_b.texts, target)
    return {"arm": arm, "seed": seed, "budget": budget, "found": len(hits), "distinct": len({q for _, q in hits}),
            "hits": hits, "final_rate": rate, "final_kinds": kinds, "seconds": time.perf_counter() - start}


def learned_regions(model, state: dict, tau: float = 1.0) -> list:
    """The rejection regions a ``banel`` sampler run learned (one per round, from ``state["banel"]``), as
    tests ``(batch, log_prior) -> (B,) bool`` for :func:`~rlcourse.methods.banel.draw_posterior`."""
    return [ratio_region(load_failure_model(model, w), tau) for w in state["banel"]["regions"]]


def distil_run(seed: int, prof: Profile | None = None, n_distil: int = 256, sft_steps: int = 100,
               lr: float = 1e-3) -> dict:
    """Exercise: post-train the attacker on its own exploration posterior, as the abstract's BaNEL does.

    Runs the ``banel`` arm of :func:`attack_run` (the profile's budget of reward evaluations), draws
    ``n_distil`` responses from the posterior it learned (acceptance reads only the failure models: no
    reward evaluation), fine-tunes a copy of the attacker on the accepted ones with
    :func:`rlcourse.supervised.sft`, and measures three samplers on fresh draws against the target:

    ==========  ===================================================================
    attacker    the attacker's plain samples (no update)
    posterior   rejection sampling from the learned posterior (the chapter's BaNEL)
    distilled   the fine-tuned copy's plain samples (no rejection)
    ==========  ===================================================================

    Returns the three success rates (``rates``), the number of accepted samples distilled, the reward
    evaluations the run spent (``nre``; the distillation adds none) and the SFT losses."""
    import copy

    from ..supervised import sft

    prof = prof or current_profile()
    sz = attack_sizes(prof)
    prompts, G, n_eval = sz["prompts"], sz["G"], sz["n_eval"]
    target, model, tok, task, pool = _attack_setup(prof, seed)
    tags = [e.prompt for e in pool[:prompts]]
    steps = max(1, sz["budget"] // (prompts * G))
    trainer = _train_attacker("banel", model, tok, task, pool, seed, steps, prompts, G, 0.0, sz["oversample"],
                              sz["fit_steps"])
    regions = learned_regions(model, trainer.state)
    gen = torch.Generator().manual_seed(seed + 10_000)
    drawn, stats = draw_posterior(model, tok, tags, max(1, n_distil // prompts), regions, gen,
                                  oversample=sz["oversample"])
    accepted = torch.ones(len(drawn), dtype=torch.bool)
    for region in regions:  # the fallback rows (rejected candidates filling a short prompt) are left out
        accepted &= ~region(drawn, (drawn.logprobs * drawn.response_mask).sum(1))
    demos = [Example(prompt=p, answer="", solution=t)
             for p, t, ok in zip(drawn.prompts, drawn.texts, accepted.tolist()) if ok]
    if not demos:
        raise RuntimeError("the posterior accepted no sample to distil; raise n_distil or the budget")
    student = copy.deepcopy(model)
    losses = sft(student, tok, demos, steps=sft_steps, batch_size=32, lr=lr, seed=seed)
    per_prompt = max(1, n_eval // prompts)
    post_b, _ = draw_posterior(model, tok, tags, per_prompt, regions, gen, oversample=sz["oversample"])
    rates = {"attacker": _final_rate(sample(model, tok, tags, num_generations=per_prompt, max_new_tokens=8,
                                            generator=gen).texts, target)[0],
             "posterior": _final_rate(post_b.texts, target)[0],
             "distilled": _final_rate(sample(student, tok, tags, num_generations=per_prompt, max_new_tokens=8,
                                             generator=gen).texts, target)[0]}
    return {"rates": rates, "distilled": len(demos), "nre": steps * prompts * G, "sft_losses": losses,
            "samples": per_prompt * prompts, "seed": seed}


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
    """The attack experiment's sizes for a profile (NRE budget, batch, evaluation samples, fitting); its
    seeds are the profile's language-model seeds."""
    sizes = prof.pick(smoke=dict(budget=16, prompts=2, G=4, n_eval=16, oversample=2, fit_steps=2, n_base=64),
                      book=dict(budget=192, prompts=4, G=8, n_eval=128, oversample=32, fit_steps=20, n_base=2000))
    return {**sizes, "seeds": prof.seeds}


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


ATTACK_ARMS = ("random", "novelty", "banel", "oracle")
ATTACK_BASE = "attacker samples"  # the one arm of the base rate's study
ATTACK_MODULES = ("rlcourse.methods.banel", "rlcourse.train", "rlcourse.lm.sampling", "rlcourse.lm.zoo")


def run_attack_cell(arm: str, seed: int, sizes: dict) -> dict:
    """:func:`attack_run` of arm ``arm`` (one of :data:`ATTACK_ARMS`) from ``seed`` with the sizes of
    :func:`attack_sizes` and the profile in ``sizes``, less its ``seconds`` (``hits`` as ``[NRE, query]``
    pairs)."""
    from ..profiles import one_torch_thread

    if arm not in ATTACK_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {ATTACK_ARMS}")
    with one_torch_thread():
        out = attack_run(arm, seed, sizes["budget"], Profile(**sizes["profile"]), prompts=sizes["prompts"],
                         G=sizes["G"], n_eval=sizes["n_eval"], oversample=sizes["oversample"],
                         fit_steps=sizes["fit_steps"])
    out["hits"] = [[int(nre), query] for nre, query in out["hits"]]
    return {k: v for k, v in out.items() if k != "seconds"}


def run_attack_base_cell(arm: str, seed: int, sizes: dict) -> dict:
    """:func:`base_success_rate` on ``sizes["n_base"]`` samples (its only arm is :data:`ATTACK_BASE`; the
    sampling seed is fixed, so ``seed`` only names the cell)."""
    from ..profiles import one_torch_thread

    if arm != ATTACK_BASE:
        raise ValueError(f"unknown arm {arm!r}; the arms are {(ATTACK_BASE,)}")
    with one_torch_thread():
        return base_success_rate(Profile(**sizes["profile"]), n=sizes["n_base"])


def attack_studies(prof: Profile, seeds: int | None = None) -> tuple[Study, Study]:
    """The base rate (one cell) and every arm of :data:`ATTACK_ARMS` on seeds ``0 .. seeds - 1``
    (default: the profile's language-model seeds)."""
    sz = attack_sizes(prof)
    sizes = {**{k: v for k, v in sz.items() if k != "seeds"}, "profile": prof.as_dict()}
    base = Study(name="banel-attack-base", arms=(ATTACK_BASE,), seeds=(0,), run=run_attack_base_cell, sizes=sizes,
                 modules=ATTACK_MODULES)
    grid = Study(name="banel-attack", arms=ATTACK_ARMS, seeds=tuple(range(sz["seeds"] if seeds is None else seeds)),
                 run=run_attack_cell, sizes=sizes, verdicts=attack_study_verdicts, modules=ATTACK_MODULES)
    return base, grid


def attack_runs(results: Results) -> dict[str, list[dict]]:
    """``{arm: [attack_run's dict per seed]}`` from the attack grid's results (``hits`` as tuples,
    ``seconds`` the cell's)."""
    return {arm: [{**results.metrics[(arm, s)], "hits": [tuple(h) for h in results.metrics[(arm, s)]["hits"]],
                   "seconds": results.seconds[(arm, s)]} for s in results.study.seeds] for arm in results.study.arms}


def attack_verdicts(runs: dict, budget: int, seconds: float) -> dict:
    """The verdicts of :func:`attack_claims` on ``runs`` (``{arm: [attack_run's dict per seed]}``);
    the three comparisons rest on the oracle control."""
    from ..claims import evaluate

    val = lambda arm, key: [r[key] for r in runs[arm]]  # noqa: E731
    claims = attack_claims(budget)
    control = evaluate(claims["control"], val("oracle", "distinct"), val("random", "distinct"), seconds=seconds)
    return {
        "vs_random": evaluate(claims["vs_random"], val("banel", "distinct"), val("random", "distinct"), seconds=seconds,
                              control=control),
        "vs_novelty": evaluate(claims["vs_novelty"], val("banel", "distinct"), val("novelty", "distinct"),
                               seconds=seconds, control=control),
        "final_rate": evaluate(claims["final_rate"], [b - 10 * r for b, r in zip(val("banel", "final_rate"),
                                                                                 val("random", "final_rate"))],
                               seconds=seconds, control=control),
        "control": control,
    }


def attack_study_verdicts(results: Results) -> dict:
    """:func:`attack_verdicts` on the attack grid's results (the grid's seconds only)."""
    return attack_verdicts(attack_runs(results), results.study.sizes["budget"], results.wall_seconds)


def attack_experiment(prof: Profile | None = None, seeds: int | None = None, **run_kw) -> dict:
    """Every arm of the attack over ``seeds`` seeds (a seed fixes the sampling and fitting
    randomness; target and attacker are the same), the base rate, and the claims' verdicts:
    :func:`attack_studies` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`)."""
    prof = prof or current_profile()
    base_study, grid = attack_studies(prof, seeds)
    base = run_study(base_study, **run_kw)
    res = run_study(grid, **run_kw)
    runs, seconds = attack_runs(res), base.wall_seconds + res.wall_seconds
    sz = attack_sizes(prof)
    return {"runs": runs, "base": base.metrics[(ATTACK_BASE, 0)], "verdicts": attack_verdicts(runs, sz["budget"], seconds),
            "sizes": sz, "seeds": len(grid.seeds), "seconds": seconds}
