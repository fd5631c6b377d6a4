"""HeaPA: the signal of a group, the heap pool's invariants, the registered prompt samplers (with an
exact resume), the curriculum task and the toy's censoring rule."""
import copy
import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

import rlcourse
from rlcourse.lm.zoo import load_base_model
from rlcourse.methods import heapa as H
from rlcourse.methods.heapa_pool import HeapPool
from rlcourse.profiles import one_torch_thread
from rlcourse.studies import curriculum_toy as toy
from rlcourse.tasks import get_task
from rlcourse.train import RLConfig, Trainer


# ---------------------------------------------------------------------- the signal of a group
@pytest.mark.parametrize("G", [2, 3, 4, 8, 16])
def test_informative_probability_peaks_at_one_half_and_vanishes_at_the_ends(G):
    p = np.linspace(0, 1, 2001)
    q = H.informative_probability(p, G)
    assert abs(p[np.argmax(q)] - 0.5) < 1e-9
    assert q[0] == 0 and q[-1] == 0
    assert np.allclose(q, q[::-1])  # symmetric about 1/2


def test_zero_variance_share_matches_monte_carlo():
    rng = np.random.default_rng(0)
    G, n = 8, 200_000
    for p in (0.05, 0.3, 0.5, 0.9):
        y = rng.random((n, G)) < p
        zero = (y.all(1) | (~y).all(1)).mean()
        exact = 1 - H.informative_probability(p, G)
        assert abs(zero - exact) < 4 * math.sqrt(exact * (1 - exact) / n) + 1e-4, (p, zero, exact)


def test_expected_logit_step_is_g_minus_one_p_one_minus_p():
    rng = np.random.default_rng(1)
    G, n = 6, 400_000
    for p in (0.1, 0.5, 0.8):
        y = (rng.random((n, G)) < p).astype(float)
        step = ((y - y.mean(1, keepdims=True)) * (y - p)).sum(1)
        se = step.std() / math.sqrt(n)
        assert abs(step.mean() - H.expected_logit_step(p, G)) < 4 * se
    with pytest.raises(ValueError, match="G >= 2"):
        H.expected_logit_step(0.5, 1)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        H.informative_probability(1.5, 4)


def test_shrunk_pass_rate_is_the_beta_posterior_mean():
    for k, n, q, alpha in [(0, 8, 0.4, 4.0), (3, 8, 0.2, 1.0), (8, 8, 0.6, 10.0)]:
        a, b = alpha * q, alpha * (1 - q)
        post = lambda x: x**k * (1 - x) ** (n - k) * stats.beta.pdf(x, a, b)  # noqa: E731
        z = integrate.quad(post, 0, 1, limit=200)[0]
        mean = integrate.quad(lambda x: x * post(x), 0, 1, limit=200)[0] / z
        assert abs(H.shrunk_pass_rate(k, n, q, alpha) - mean) < 1e-6
    with pytest.raises(ValueError, match="alpha"):
        H.shrunk_pass_rate(1, 2, 0.5, 0.0)
    with pytest.raises(ValueError, match="k <= n"):
        H.shrunk_pass_rate(3, 2, 0.5, 1.0)


# ---------------------------------------------------------------------- the pool
def random_pool(seed=0, capacity=30, steps=200):
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    hp = HeapPool(capacity, 0.5)
    for i in range(capacity):
        hp.add(i)
    for t in range(steps):
        ids = hp.draw(4, gen, "medium" if t % 2 else "boundary")
        for r in ids:
            hp.score(r, int(rng.integers(0, 9)), 8)
            if rng.random() < 0.5:
                hp.add(1000 + t, parent=r)
        hp.check()  # sizes add up, <= capacity, low = the low_cap lowest keys
    return hp


def filled_pool(capacity, scores):
    """A pool of ``capacity`` seeds, the first ``len(scores)`` drawn and scored ``k`` of 8."""
    hp = HeapPool(capacity, 0.5)
    for i in range(capacity):
        hp.add(i)
    gen = torch.Generator().manual_seed(0)
    ids = hp.draw(len(scores), gen)
    for r, k in zip(ids, scores):
        hp.score(r, k, 8)
    return hp, ids, gen


def test_pool_invariants_hold_under_random_operations():
    for seed in range(3):
        hp = random_pool(seed)
        assert len(hp) <= hp.capacity and hp.evicted > 0


def test_cold_queue_is_drawn_first_in_order():
    hp, first, gen = filled_pool(10, (0, 2, 4, 8))
    assert first == [0, 1, 2, 3]
    assert hp.draw(6, gen) == [4, 5, 6, 7, 8, 9]  # six cold ones remain: they come before any scored one


def test_boundary_is_the_largest_low_key_and_high_holds_the_rest():
    hp, _, gen = filled_pool(8, range(8))
    hp.check()
    assert sorted(hp.records[r].key for r in hp.low_ids) == [0, 1 / 8, 2 / 8, 3 / 8]
    assert hp.boundary() == 3 / 8
    assert sorted(r.key for r in hp.records.values() if r.where == "high") == [4 / 8, 5 / 8, 6 / 8, 7 / 8]
    # boundary draws take the largest low keys, the boundary first
    assert [hp.records[r].key for r in hp.draw(2, gen, "boundary")] == [3 / 8, 2 / 8]


def test_eviction_removes_the_lowest_key_of_the_high_partition_first():
    hp, _, _ = filled_pool(8, range(8))
    hp.add("new")  # over capacity by one: the high record with key 4/8 goes
    gone = [r for r in hp.records.values() if r.where == "gone"]
    assert len(gone) == 1 and gone[0].key == 4 / 8 and len(hp) == 8


def test_path_key_pools_a_lineage_by_rollouts():
    hp = HeapPool(10, 0.5)
    root = hp.add("root")
    gen = torch.Generator().manual_seed(0)
    hp.draw(1, gen)
    hp.score(root, 2, 8)
    child = hp.add("child", parent=root)
    grand = hp.add("grand", parent=child)
    hp.draw(2, gen)
    hp.score(child, 6, 8)
    hp.score(grand, 4, 4)
    assert hp.records[root].key == pytest.approx((2 + 6 + 4) / 20)
    assert hp.records[child].key == pytest.approx((6 + 4) / 12)
    hp.check()


def test_pool_refuses_bad_input():
    with pytest.raises(ValueError, match="capacity"):
        HeapPool(0)
    with pytest.raises(ValueError, match="low_fraction"):
        HeapPool(4, 1.0)
    hp = HeapPool(4)
    hp.add(0)
    with pytest.raises(ValueError, match="asked for 2 prompts"):
        hp.draw(2, torch.Generator())
    with pytest.raises(ValueError, match="unknown sampling mode"):
        hp.draw(1, torch.Generator(), "hardest")
    with pytest.raises(ValueError, match="0 <= k <= n"):
        hp.score(0, 5, 4)


# ---------------------------------------------------------------------- the toy and its censoring
def test_rollouts_to_target_censors_at_the_budget():
    r, a = np.array([0, 64, 128, 192]), np.array([0.3, 0.5, 0.8, 0.9])
    assert toy.rollouts_to_target(r, a, 0.75, 192) == (128.0, False)
    assert toy.rollouts_to_target(r, a, 0.95, 192) == (192.0, True)
    assert toy.rollouts_to_target(r, a, 0.75, 100) == (100.0, True)  # reached only after the budget
    with pytest.raises(ValueError, match="equal 1-D shapes"):
        toy.rollouts_to_target(r, a[:2], 0.5, 10)


def test_toy_runs_are_deterministic_and_the_oracle_beats_uniform_on_one_seed():
    a = toy.toy_run("heapa", 0, 40)
    b = toy.toy_run("heapa", 0, 40)
    assert np.array_equal(a["accuracy"], b["accuracy"])
    assert a["rollouts"][-1] == 40 * 64
    u, o = toy.toy_run("uniform", 0, 120), toy.toy_run("oracle", 0, 120)
    assert o["zero_var"].mean() < u["zero_var"].mean()
    with pytest.raises(ValueError, match="unknown toy arm"):
        toy.toy_run("greedy", 0, 1)


# ---------------------------------------------------------------------- the task
def test_curriculum_task_levels_and_variants():
    task = get_task("heapa_addition")
    ex = task.examples(300, seed=0)
    assert {e.meta["digits"] for e in ex} == {1, 2, 3, 4}
    for e in ex:
        d = e.meta["digits"]
        assert all(len(str(x)) == d for x in (e.meta["a"], e.meta["b"]))
        assert task.score(e.solution, e).reward == 1.0
    rng = np.random.default_rng(0)
    for e in ex[:50]:
        c = task.variant(e, rng)
        assert c.meta["digits"] == e.meta["digits"] and int(c.answer) == c.meta["a"] + c.meta["b"]
        assert c.meta["a"] == e.meta["a"] or c.meta["b"] == e.meta["b"]
    assert task.variant(get_task("addition").examples(1)[0], rng) is None


# ---------------------------------------------------------------------- the registered parts
@pytest.fixture(scope="module")
def base():
    return load_base_model("addition", prof=rlcourse.profile("smoke"), progress=False)


def trainer(base, tmp=None, prompt_sampler="heapa", sampler="heapa_feedback", task="heapa_addition", steps=4, resume=False):
    model, tok = base
    cfg = RLConfig(num_generations=4, prompts_per_step=3, max_completion_length=5, steps=steps, progress=False,
                   learning_rate=1e-3, seed=0, prompt_sampler=prompt_sampler, sampler=sampler, train_pool_size=30,
                   output_dir=None if tmp is None else str(tmp), save_every=2 if tmp is not None else 0)
    return Trainer(copy.deepcopy(model), tok, task, cfg, eval_examples=get_task(task).examples(4, split="test"),
                   resume=resume)


def test_heapa_sampler_scores_its_prompts_and_logs_the_pool(base):
    with one_torch_thread():
        t = trainer(base)
        t.train()
    hp = t.state["heapa"]
    scored = [r for r in hp.records.values() if r.rate is not None]
    assert len(scored) >= 9 and "heapa_pool" in t.history[-1] and t.history[-1]["heapa_scored"] == 3
    hp.check()


def test_heapa_without_feedback_refuses_at_the_second_step(base):
    with one_torch_thread():
        t = trainer(base, sampler="policy", steps=2)
        t.step()
        with pytest.raises(ValueError, match="heapa_feedback"):
            t.step()


def test_growing_pool_refuses_a_task_without_variants_by_name(base):
    with one_torch_thread():
        with pytest.raises(ValueError, match="heapa_addition"):
            trainer(base, task="addition").step()
        t = trainer(base, prompt_sampler="heapa_fixed", task="addition", steps=2)
        t.train()  # the fixed pool serves any task
    assert t.state["heapa"].children_made == 0


def test_resume_continues_exactly_with_the_pool(base, tmp_path):
    with one_torch_thread():
        full = trainer(base, tmp_path / "a", steps=4)
        full.train()
        half = trainer(base, tmp_path / "b", steps=2)
        half.train()
        resumed = trainer(base, tmp_path / "b", steps=4, resume=True)
        assert resumed.step_count == 2
        resumed.train()
    for p, q in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.equal(p, q)
    a, b = full.state["heapa"], resumed.state["heapa"]
    assert [(r.item.prompt, r.rate, r.where) for r in a.records.values()] == \
        [(r.item.prompt, r.rate, r.where) for r in b.records.values()]


def test_feedback_sampler_reports_group_pass_rates_and_refuses_unknown_inner_keywords(base):
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0])
    ex = get_task("heapa_addition").examples(2)
    rates = H.group_pass_rates(scores, [ex[0], ex[0], ex[1], ex[1]])
    assert rates[ex[1].prompt] == (2.0, 2)
    with pytest.raises(ValueError, match="2 scores for 3 rows"):
        H.group_pass_rates(scores[:2], ex + ex[:1])
    model, tok = base
    cfg = RLConfig(num_generations=2, prompts_per_step=2, max_completion_length=4, steps=1, progress=False,
                   sampler="heapa_feedback", sampler_kwargs={"inner": "policy", "ratio": 2})
    with pytest.raises(ValueError, match="ratio"):
        Trainer(copy.deepcopy(model), tok, "addition", cfg, train_examples=ex, eval_examples=ex).step()


def test_studies_cells_stand_alone():
    """A later cell of each grid, run with the others, equals the same cell run alone; a bad arm is
    refused with the arms named."""
    from rlcourse.studies import heapa as HS
    from rlcourse.studies.runner import run_study

    for study, run in ((toy.toy_study(HS.TOY_ARMS, 2, steps=12), toy.run_toy_cell),
                       (HS.lm_study(rlcourse.profile("smoke"), seeds=2), HS.run_lm_cell)):
        res = run_study(study, jobs=1, cache=False)
        arm, seed = study.cells()[-1]
        assert seed == 1
        alone = run(arm, seed, dict(study.sizes))
        alone.pop("seconds", None), res.metrics[(arm, seed)].pop("seconds", None)
        assert res.metrics[(arm, seed)] == alone
        with pytest.raises(ValueError, match=f"the arms are .*{arm}"):
            run("no such arm", 0, dict(study.sizes))
