"""BaNEL: the exploration posterior, its rejection sampler, and the registered parts.

The exact checks run on an enumerated space (sequences of length 3 over 5 symbols, 125 points, a
known autoregressive prior and a success set of two sequences)."""
import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

import rlcourse
from rlcourse.advantages import get_estimator
from rlcourse.methods import banel as B
from rlcourse.studies import banel as S
from rlcourse.profiles import one_torch_thread
from rlcourse.train import RLConfig, Trainer

V, L = 5, 3


def toy_prior(seed=0):
    """An autoregressive prior on V**L sequences: p(x) = p(x1) p(x2|x1) p(x3|x2), random tables."""
    rng = np.random.default_rng(seed)
    first = rng.dirichlet(np.ones(V))
    trans = rng.dirichlet(np.ones(V), size=V)
    xs = S.all_sequences(V, L)
    p = first[xs[:, 0]] * trans[xs[:, 0], xs[:, 1]] * trans[xs[:, 1], xs[:, 2]]
    return xs, p


def test_all_sequences_enumerates_in_order():
    xs = S.all_sequences(V, L)
    assert xs.shape == (125, 3)
    assert [tuple(r) for r in xs] == list(itertools.product(range(V), repeat=L))
    _, p = toy_prior()
    assert np.isclose(p.sum(), 1.0)


def test_rejection_sampler_matches_the_enumerated_posterior_chi_square():
    xs, p = toy_prior(1)
    rng = np.random.default_rng(0)
    phi = rng.dirichlet(np.ones(len(p)))  # some failure model
    regions = np.stack([B.rejection_region(np.log(p), np.log(phi), 1.0),
                        B.rejection_region(np.log(p), np.log(rng.dirichlet(np.ones(len(p)))), 0.5)])
    post = B.exploration_posterior(p, regions)
    assert np.all(post[regions.any(0)] == 0)
    # outside the regions the posterior keeps the prior's relative probabilities
    out = ~regions.any(0)
    assert np.allclose(post[out] / post[out].sum(), p[out] / p[out].sum())
    n = 40_000
    draws, total = B.rejection_sample(p, regions, n, rng)
    counts = np.bincount(draws, minlength=len(p))
    assert counts[regions.any(0)].sum() == 0
    cells = post * n >= 5  # the chi-square approximation needs expected counts of 5 or more
    rest = ~cells & out
    obs = np.append(counts[cells], counts[rest].sum())
    exp = np.append(post[cells] * n, post[rest].sum() * n)
    keep = exp > 0
    p_value = stats.chisquare(obs[keep], exp[keep]).pvalue
    assert p_value > 1e-3, p_value  # a correct sampler fails this one time in 1000
    # the reward-free cost: n / P(outside) prior draws on average (within 5 standard errors)
    acc = p[out].sum()
    assert abs(n / total - acc) < 5 * math.sqrt(acc * (1 - acc) / total)


def test_true_failure_model_recovers_the_failure_set_and_success_rate_one():
    xs, p = toy_prior(2)
    success = np.zeros(len(p), bool)
    success[[7, 93]] = True
    R = ~success
    PR = p[R].sum()
    phi = np.where(R, p / PR, 0.0)  # p_theta(. | R), the ideal failure model
    with np.errstate(divide="ignore"):
        ratio = np.log(p) - np.log(phi)  # log P(R) on R, +inf off R
    assert np.allclose(ratio[R], math.log(PR))
    region = B.rejection_region(np.log(p), np.log(np.maximum(phi, 1e-300)), tau=PR * 1.001)
    assert np.array_equal(region, R)
    post = B.exploration_posterior(p, region[None])
    assert np.isclose(post[success].sum(), 1.0)
    # a threshold below P(R) rejects nothing
    assert not B.rejection_region(np.log(p), np.log(np.maximum(phi, 1e-300)), tau=PR * 0.999).any()


def test_posterior_success_rate_formula_matches_enumeration():
    xs, p = toy_prior(3)
    rng = np.random.default_rng(3)
    for _ in range(20):
        success = rng.random(len(p)) < 0.05
        region = rng.random(len(p)) < 0.4
        s, f, m = p[success].sum(), p[region & ~success].sum(), p[region & success].sum()
        post = B.exploration_posterior(p, region[None])
        assert np.isclose(post[success].sum(), B.posterior_success_rate(s, f, m))
        # it rises above s exactly when the region is failure-enriched: m / s < f / (1 - s)
        assert (post[success].sum() > s) == (m / s < f / (1 - s))


def test_likelihood_ratio_region_is_neyman_pearson_optimal():
    rng = np.random.default_rng(4)
    N = 8
    p, phi = rng.dirichlet(np.ones(N)), rng.dirichlet(np.ones(N))
    for tau in (0.3, 0.8, 1.0, 2.0):
        lr = B.rejection_region(np.log(p), np.log(phi), tau)
        for bits in itertools.product([False, True], repeat=N):
            other = np.array(bits)
            if p[other].sum() <= p[lr].sum() + 1e-12:  # no more prior mass than the ratio region
                assert phi[other].sum() <= phi[lr].sum() + 1e-12


def test_zero_rewards_give_policy_gradient_nothing_to_learn_from():
    """Every group all failures: the group-relative advantage is zero, so is the gradient."""
    grpo = get_estimator("grpo")
    mask = torch.ones(8, 5)
    adv, _ = grpo(token_level_rewards=torch.zeros(8, 5), response_mask=mask, index=torch.arange(8) // 4)
    assert torch.count_nonzero(adv) == 0


def test_toy_search_oracle_and_banel_find_more_than_random():
    xs, p = toy_prior(5)
    success = np.zeros(len(p), bool)
    success[np.argsort(p)[:2]] = True  # the two least likely sequences
    found = {}
    for method in ("random", "banel", "oracle"):
        found[method] = np.mean([S.toy_search(p, success, 300, 20, 1.0, 5.0, np.random.default_rng(s), method)[-1]
                                 for s in range(5)])
    assert found["oracle"] == 2.0
    assert found["banel"] > found["random"]


def test_categorical_failure_model_and_bad_inputs():
    prior = np.array([0.5, 0.25, 0.25])
    assert np.allclose(B.fit_categorical_failure_model(np.array([0, 0, 1]), prior, 0.0), [2 / 3, 1 / 3, 0])
    assert np.allclose(B.fit_categorical_failure_model(np.array([], int), prior, 2.0), prior)
    with pytest.raises(ValueError, match="pseudo"):
        B.fit_categorical_failure_model(np.array([0]), prior, -1.0)
    with pytest.raises(ValueError, match="tau"):
        B.rejection_region(np.zeros(3), np.zeros(3), 0.0)
    with pytest.raises(ValueError, match="differ"):
        B.rejection_region(np.zeros(3), np.zeros(2), 1.0)
    with pytest.raises(ValueError, match="cover"):
        B.exploration_posterior(prior, np.ones((1, 3), bool))
    with pytest.raises(ValueError):
        B.posterior_success_rate(0.1, 0.95, 0.0)


def test_queries_and_the_count_bonus():
    assert B.parse_query("07+3=") == ("07", "3")
    assert B.parse_query("7+3") is None
    assert [S.query_kind(q) for q in ("7+3=", "07+3=", "7+12=", "7+")] == \
        ["one-digit", "leading zero", "two-digit", "invalid"]
    counts = {}
    bonus = B.count_bonus(["a", "b", "a", "a"], counts, 0.5)
    assert torch.allclose(bonus, torch.tensor([0.5, 0.5, 0.5 / math.sqrt(2), 0.5 / math.sqrt(3)]))
    assert counts == {"a": 3, "b": 1}
    with pytest.raises(ValueError, match="beta"):
        B.count_bonus(["a"], {}, -1.0)
    task = B.AdditionAttack()
    ex = task.examples(300, seed=0)
    assert all(B.parse_query(e.solution) for e in ex)
    assert task.score("3+4=", ex[0]).reward == 1.0 and task.score("3+", ex[0]).reward == 0.0


@pytest.fixture(scope="module")
def attacker():
    with one_torch_thread():
        return S.load_attacker(rlcourse.profile("smoke"))


def test_fit_failure_model_raises_the_failures_likelihood(attacker):
    model, tok = attacker
    with one_torch_thread():
        b = rlcourse.lm.sample(model, tok, ["q001:"], num_generations=16, max_new_tokens=8,
                               generator=torch.Generator().manual_seed(0))
        before = B.sequence_logprob(model, b)
        assert torch.allclose(before, (b.logprobs * b.response_mask).sum(1), atol=1e-4)
        phi = B.fit_failure_model(model, tok, list(zip(b.prompts, b.texts)), steps=20, lr=3e-3)
        after = B.sequence_logprob(phi, b)
    assert after.mean() > before.mean()
    with pytest.raises(ValueError, match="at least one failure"):
        B.fit_failure_model(model, tok, [], steps=1)


def test_draw_posterior_keeps_only_accepted_rows(attacker):
    model, tok = attacker
    starts_with_digit_one = lambda batch, lp: torch.tensor([t.startswith("1") for t in batch.texts])  # noqa: E731
    with one_torch_thread():
        b, st = B.draw_posterior(model, tok, ["q001:", "q002:"], 4, [starts_with_digit_one],
                                 torch.Generator().manual_seed(0), oversample=8, max_draws=4)
    assert len(b) == 8 and b.index.tolist() == [0] * 4 + [1] * 4
    kept = [t for t in b.texts if not t.startswith("1")]
    assert len(b) - len(kept) <= st["fallback"]
    assert b.prompts == ["q001:"] * 4 + ["q002:"] * 4


def test_banel_sampler_in_the_trainer_counts_nre_and_resumes_its_regions(attacker, tmp_path):
    model, tok = attacker
    cfg = RLConfig(num_generations=4, prompts_per_step=2, max_completion_length=8, steps=2, progress=False,
                   learning_rate=0.0, sampler="banel", reward="task", sampler_kwargs={"fit_steps": 2},
                   train_pool_size=40)
    with one_torch_thread():
        tr = Trainer(model, tok, "addition_attack", cfg, eval_examples=[])
        hist = tr.train()
    assert [h["banel_nre"] for h in hist] == [8.0, 16.0]
    mem = tr.state["banel"]
    assert hist[-1]["banel_successes"] + len(mem["failures"]) == 16
    torch.save(tr.state, tmp_path / "s.pt")
    back = torch.load(tmp_path / "s.pt", weights_only=False)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(mem["regions"], back["banel"]["regions"]) for k in a)
    with pytest.raises(ValueError, match="temperature 1.0"):
        Trainer(model, tok, "addition_attack", RLConfig(**{**cfg.to_dict(), "temperature": 0.7}),
                eval_examples=[]).step()


def test_attack_rewards_refuse_other_tasks(attacker):
    model, tok = attacker
    b = rlcourse.lm.sample(model, tok, ["1+2="], num_generations=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="addition_attack"):
        B.attack_success(b, [None, None], rlcourse.tasks.get_task("addition"), {})


def test_studies_cells_stand_alone():
    """A later cell of the toy grid and of the attack grid, run with the others, equals the same cell run
    alone; a bad arm is refused with the arms named."""
    from rlcourse.studies.runner import run_study

    base, attack = S.attack_studies(rlcourse.profile("smoke"), seeds=2)
    for study, run in ((S.toy_study(2, budget=40), S.run_toy_cell), (attack, S.run_attack_cell)):
        res = run_study(study, jobs=1, cache=False)
        arm, seed = study.cells()[-1]
        assert (arm, seed) == ("oracle", 1)
        assert res.metrics[(arm, seed)] == run(arm, seed, dict(study.sizes))
        with pytest.raises(ValueError, match="the arms are .*'banel'"):
            run("no such arm", 0, dict(study.sizes))
    with pytest.raises(ValueError, match="the arms are .*'attacker samples'"):
        S.run_attack_base_cell("banel", 0, dict(base.sizes))


def test_distil_run_fine_tunes_a_copy_on_accepted_posterior_samples():
    """The distillation exercise: the attacker itself is not changed (a copy is fine-tuned), the samples
    distilled are accepted ones, the reward evaluations are the BaNEL run's alone, and every rate is a
    share of the fresh samples."""
    P = rlcourse.profile("smoke")
    before = {k: v.clone() for k, v in S.load_attacker(P)[0].state_dict().items()}
    r = S.distil_run(0, P, n_distil=16, sft_steps=3)
    after = S.load_attacker(P)[0].state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    sz = S.attack_sizes(P)
    assert r["nre"] == max(1, sz["budget"] // (sz["prompts"] * sz["G"])) * sz["prompts"] * sz["G"]
    assert 0 < r["distilled"] <= 16 and len(r["sft_losses"]) == 3
    assert set(r["rates"]) == {"attacker", "posterior", "distilled"}
    assert all(0 <= v <= 1 and v * r["samples"] == round(v * r["samples"]) for v in r["rates"].values())
