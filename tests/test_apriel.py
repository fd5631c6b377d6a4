"""Apriel-Reasoner's parts: the domain sampler's fixed point, the Kimi length reward and its
difficulty-aware weight, the bandit's gradient, and the registered parts in the Trainer."""
import copy

import numpy as np
import pytest
import torch

import rlcourse
from rlcourse.advantages import compute_grpo_outcome_advantage
from rlcourse.data import get_prompt_sampler
from rlcourse.lm.zoo import load_base_model
from rlcourse.methods import apriel as A
from rlcourse.profiles import one_torch_thread
from rlcourse.tasks import Example, get_task
from rlcourse.train import RLConfig, Trainer


# ---------------------------------------------------------------------- the sampler's math
def test_fixed_point_gives_the_target_shares_exactly():
    rng = np.random.default_rng(0)
    for _ in range(50):
        w = rng.dirichlet(np.ones(4))
        y = rng.uniform(0.05, 1.0, 4)
        assert np.allclose(A.batch_shares(A.domain_sampling_probs(w, y, floor=0.0), y), w, atol=1e-12)
        # the static mixture q = w gives shares proportional to w * y instead
        assert np.allclose(A.batch_shares(w, y), w * y / (w * y).sum())


def test_simulated_sampler_holds_targets_within_one_percent_after_50_steps():
    w, y = [0.5, 0.25, 0.25], [0.9, 0.3, 0.5]
    for seed in range(3):
        sim = A.simulate_domain_sampling(w, y, 100, seed=seed)
        assert A.share_deviation(sim["usable"], w, start=50) < 0.01
        assert np.allclose(sim["y_hat"][-1], y, atol=0.15)
        static = A.simulate_domain_sampling(w, y, 100, seed=seed, adaptive=False)
        assert A.share_deviation(static["usable"], w, start=50) > 0.1  # the yields differ enough to matter


def test_yield_estimate_is_an_exponential_average_of_the_sampled_domains():
    y = np.array([1.0, 1.0, 0.5])
    out = A.update_yield_estimate(y, sampled=[10, 0, 4], usable=[3, 0, 4], eta=0.25)
    assert np.allclose(out, [0.75 * 1 + 0.25 * 0.3, 1.0, 0.75 * 0.5 + 0.25 * 1.0])
    # with a constant observed yield the error shrinks by (1 - eta) per step
    z = np.array([1.0])
    for t in range(1, 6):
        z = A.update_yield_estimate(z, [10], [4], 0.3)
        assert np.isclose(z[0] - 0.4, 0.6 * 0.7 ** t)
    with pytest.raises(ValueError, match="usable <= sampled"):
        A.update_yield_estimate(y, [1, 1, 1], [2, 0, 0], 0.5)
    with pytest.raises(ValueError, match="eta"):
        A.update_yield_estimate(y, [1, 1, 1], [0, 0, 0], 0.0)


def test_allocate_counts_tracks_the_cumulative_allocation_within_one():
    rng = np.random.default_rng(1)
    carry, total, want = np.zeros(3), np.zeros(3), np.zeros(3)
    for _ in range(200):
        q = rng.dirichlet(np.ones(3))
        counts, carry = A.allocate_counts(7, q, carry)
        assert counts.sum() == 7 and (counts >= 0).all()
        total += counts
        want += 7 * q
        assert np.abs(total - want).max() < 1.0


def test_bad_targets_and_yields_are_refused():
    with pytest.raises(ValueError, match="sum to 1"):
        A.domain_sampling_probs([0.5, 0.4], [0.5, 0.5])
    with pytest.raises(ValueError, match="vector of 2"):
        A.domain_sampling_probs([0.5, 0.5], [0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="\\[0, 1\\]"):
        A.domain_sampling_probs([0.5, 0.5], [0.5, 1.5])


# ---------------------------------------------------------------------- the length reward
def kimi_by_loops(lengths, correct, index):
    out = []
    for i in range(len(lengths)):
        group = [j for j in range(len(lengths)) if index[j] == index[i]]
        lo, hi = min(lengths[j] for j in group), max(lengths[j] for j in group)
        lam = 0.0 if hi == lo else 0.5 - (lengths[i] - lo) / (hi - lo)
        out.append(lam if correct[i] else min(0.0, lam))
    return np.array(out)


def test_kimi_length_reward_matches_its_definition_and_bounds():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        lengths = torch.randint(1, 12, (24,), generator=g)
        correct = torch.rand(24, generator=g) < 0.5
        index = torch.arange(6).repeat_interleave(4)
        lam = A.kimi_length_reward(lengths, correct, index)
        assert torch.allclose(lam, torch.tensor(kimi_by_loops(lengths.tolist(), correct.tolist(), index.tolist()),
                                                dtype=torch.float32), atol=1e-6)
        assert lam.min() >= -0.5 and lam.max() <= 0.5
        assert (lam[~correct] <= 0).all()  # an incorrect response never earns a brevity bonus
    lam = A.kimi_length_reward([3, 5, 9, 4], [True, True, False, True], [0, 0, 0, 0])
    assert lam[0] == 0.5 and lam[2] == -0.5  # the shortest (correct) gets +0.5, the longest -0.5
    assert torch.equal(A.kimi_length_reward([4, 4], [True, False], [0, 0]), torch.zeros(2))


def test_all_correct_group_advantage_is_the_standardised_length_reward_for_any_gamma():
    lengths = torch.tensor([3.0, 7, 5, 4, 10, 6])
    index = torch.zeros(6, dtype=torch.long)
    r_task = torch.ones(6)
    lam = A.kimi_length_reward(lengths, r_task > 0.5, index)
    target = (lam - lam.mean()) / (lam.std() + 1e-6)
    for gamma in (0.01, 0.1, 1.0):
        r = A.length_shaped_reward(r_task, lengths, index, gamma, "uniform")
        adv, _ = compute_grpo_outcome_advantage(r[:, None], torch.ones(6, 1), index)
        # GRPO's std removes gamma: the penalty is at full strength however small it is
        assert torch.allclose(adv[:, 0], target, atol=1e-3)
        adv_dr, _ = compute_grpo_outcome_advantage(r[:, None], torch.ones(6, 1), index, norm_adv_by_std_in_grpo=False)
        assert torch.allclose(adv_dr[:, 0], gamma * (lam - lam.mean()), atol=1e-6)  # Dr. GRPO keeps the scale


def test_zero_weight_at_zero_pass_rate_leaves_hard_prompts_unchanged():
    for weight in ("linear", "gate"):
        assert float(A.difficulty_weight(torch.tensor(0.0), 0.5, weight)) == 0.0
    lengths = torch.tensor([2.0, 9, 5, 3, 8, 8, 1, 4])
    index = torch.arange(2).repeat_interleave(4)
    r_task = torch.tensor([0.0, 0, 0, 0, 1, 0, 0, 0])  # group 0 unsolved, group 1 p_hat = 0.25 <= theta
    r = A.length_shaped_reward(r_task, lengths, index, 0.5, "gate", theta=0.75)
    assert torch.equal(r, r_task)
    r = A.length_shaped_reward(r_task, lengths, index, 0.5, "linear")
    assert torch.equal(r[:4], r_task[:4]) and not torch.equal(r[4:], r_task[4:])
    assert not torch.equal(A.length_shaped_reward(r_task, lengths, index, 0.5, "uniform"), r_task)


def test_truncated_rows_never_earn_the_bonus_and_bad_input_is_refused():
    r = A.length_shaped_reward(torch.ones(4), torch.tensor([2.0, 3, 4, 5]), torch.zeros(4, dtype=torch.long), 1.0,
                               "uniform", truncated=torch.tensor([True, False, False, False]))
    assert r[0] == 1.0 and torch.isclose(r[1], torch.tensor(1 + 1 / 6))  # the shortest row was truncated
    with pytest.raises(ValueError, match="G >= 2"):
        A.kimi_length_reward([1, 2, 3], [1, 1, 1], [0, 0, 1])
    with pytest.raises(ValueError, match="shape"):
        A.kimi_length_reward([1, 2, 3, 4], [1, 1, 1], [0, 0, 1, 1])
    with pytest.raises(ValueError, match="unknown length-penalty weight"):
        A.difficulty_weight(torch.tensor([0.5]), 0.1, "cosine")


def test_numpy_group_versions_equal_the_torch_parts():
    rng = np.random.default_rng(3)
    for weight in A.WEIGHTS:
        r = (rng.random((5, 8)) < 0.6).astype(float)
        ell = rng.integers(1, 16, (5, 8)).astype(float)
        index = torch.arange(5).repeat_interleave(8)
        ref = A.length_shaped_reward(torch.tensor(r.ravel()), torch.tensor(ell.ravel()), index, 0.3, weight)
        got = A.grouped_length_reward(r, ell, 0.3, weight)
        assert np.allclose(got.ravel(), ref.numpy(), atol=1e-6)
        for std in (True, False):
            adv, _ = compute_grpo_outcome_advantage(torch.tensor(got.ravel(), dtype=torch.float32)[:, None],
                                                    torch.ones(40, 1), index, norm_adv_by_std_in_grpo=std)
            assert np.allclose(A.grouped_advantages(got, std).ravel(), adv[:, 0].numpy(), atol=1e-4)


def test_score_gradient_matches_autograd():
    rng = np.random.default_rng(4)
    logits = torch.tensor(rng.normal(size=(3, 6)), requires_grad=True)
    idx = rng.integers(0, 6, (3, 10))
    adv = rng.normal(size=(3, 10))
    logp = torch.log_softmax(logits, 1)
    obj = (torch.tensor(adv) * torch.gather(logp, 1, torch.tensor(idx))).mean(1).sum()
    obj.backward()
    pi = torch.softmax(logits, 1).detach().numpy()
    assert np.allclose(A.softmax_score_gradient(idx, adv, pi), logits.grad.numpy(), atol=1e-10)


def test_budget_bandit_penalty_shortens_and_probabilities_are_checked():
    P = A.budget_success_probs()
    assert P.shape == (3, 16) and np.isclose(P[2].max(), 0.5, atol=0.01) and np.isclose(P[0, 1], 0.5)
    none = A.budget_bandit_run("none", 0, steps=60)
    strong = A.budget_bandit_run("uniform", 0, steps=60, gamma=1.0)
    assert strong["length"].mean() < none["length"].mean() - 2
    with pytest.raises(ValueError, match="unknown weight"):
        A.budget_bandit_run("tanh", 0, steps=1)
    with pytest.raises(ValueError, match="ceilings"):
        A.budget_success_probs(ceilings=(1.0, 1.2, 0.5))


# ---------------------------------------------------------------------- the loop's parts
def test_mix_task_scores_by_domain_and_refuses_an_example_without_one():
    task = get_task("apriel_mix")
    ex = task.examples(30, seed=0)
    assert {e.meta["domain"] for e in ex} == set(task.domains)
    assert all(task.score(e.solution, e).reward == 1.0 for e in ex)
    with pytest.raises(ValueError, match="meta\\['domain'\\]"):
        task.score("12", Example("1+1=", "2", "2|2"))


@pytest.fixture(scope="module")
def base():
    with one_torch_thread():
        return load_base_model("apriel_mix", 0.5, prof=rlcourse.profile("smoke"), progress=False)


def run_trainer(base, steps, sampler="apriel_domains", reward="apriel_task", **kw):
    model, tok = base
    task = get_task("apriel_mix")
    cfg = RLConfig(num_generations=4, prompts_per_step=8, max_completion_length=9, steps=steps, progress=False,
                   prompt_sampler=sampler, reward=reward, seed=0, **kw)
    with one_torch_thread():
        tr = Trainer(copy.deepcopy(model), tok, task, cfg, train_examples=task.examples(200, seed=0),
                     eval_examples=task.examples(4, seed=0, split="test"))
        tr.train()
    return tr


def test_sampler_and_rewards_run_in_the_trainer_and_record_outcomes(base):
    tr = run_trainer(base, 3, reward="apriel_length", reward_kwargs={"gamma": 0.2, "weight": "linear"})
    st = tr.state["apriel"]
    assert sorted(st["outcomes"]) == [1, 2, 3] and len(st["log"]) == 3
    for row, obs in zip(st["log"], (st["outcomes"][s] for s in (1, 2, 3))):
        assert sum(row["counts"]) == 8 and np.allclose(np.array(obs["sampled"]), 4 * np.array(row["counts"]))
        assert all(u <= c <= s for u, c, s in zip(obs["usable"], obs["completed"], obs["sampled"]))
    static = run_trainer(base, 2, sampler="apriel_domains_static", reward="apriel_length_uniform")
    assert static.state["apriel"]["log"][-1]["q"] == get_task("apriel_mix").domain_targets


def test_resumed_run_draws_what_the_uninterrupted_one_did(base, tmp_path):
    whole = run_trainer(base, 3)
    run_trainer(base, 2, output_dir=str(tmp_path), save_every=2)
    model, tok = base
    task = get_task("apriel_mix")
    cfg = RLConfig(num_generations=4, prompts_per_step=8, max_completion_length=9, steps=3, progress=False,
                   prompt_sampler="apriel_domains", reward="apriel_task", seed=0, output_dir=str(tmp_path), save_every=2)
    with one_torch_thread():
        resumed = Trainer(copy.deepcopy(model), tok, task, cfg, train_examples=task.examples(200, seed=0),
                          eval_examples=task.examples(4, seed=0, split="test"), resume=True)
        assert resumed.step_count == 2
        resumed.train()
    assert resumed.state["apriel"]["log"] == whole.state["apriel"]["log"]


def test_adaptive_sampler_refuses_blind_steps_and_tasks_without_domains():
    sampler = get_prompt_sampler("apriel_domains")
    task = get_task("apriel_mix")
    pool = task.examples(60, seed=0)
    state, g = {}, torch.Generator().manual_seed(0)
    first = sampler(pool=pool, n=6, generator=g, state=state, task=task, step=1)
    assert len(first) == 6
    with pytest.raises(ValueError, match="no outcomes of step 1"):  # no reward recorded step 1
        sampler(pool=pool, n=6, generator=g, state=state, task=task, step=2)
    addition = get_task("addition")
    with pytest.raises(ValueError, match="'domain'"):
        sampler(pool=addition.examples(10, seed=0), n=2, generator=g, state={}, task=addition, step=1)


def test_shortening_and_matched_accuracy():
    none = np.array([[10.0, 10.0], [8.0, 12.0]])
    assert np.allclose(A.shortening(none / 2, none), [0.5, 0.5])
    x = np.array([[0.1, 0.3, 0.2], [0.0, 0.2, 0.4]])  # unsorted on purpose
    y = np.array([[0.9, 0.7, 0.8], [1.0, 0.8, 0.6]])
    acc, inside = A.matched_accuracy(np.array([0.25, 0.5]), x, y)
    assert np.allclose(acc, [0.75, 0.6]) and inside.tolist() == [True, False]
    with pytest.raises(ValueError, match="sweep_short"):
        A.matched_accuracy(np.zeros(3), x, y)
    with pytest.raises(ValueError, match="seeds, buckets"):
        A.shortening(np.zeros(3), np.zeros(3))


def test_studies_cell_alone_equals_the_grid_and_bad_arms_are_named():
    """A later cell of the bandit grid and of the language-model grid, run alone, gives the runner's numbers."""
    from rlcourse.studies import apriel as study
    from rlcourse.studies.runner import run_study

    main, sweep = study.budget_studies([100, 101], 20, sweep_gammas=(0.2,), sweep_seeds=[100], match_gammas=(0.1, 0.4))
    assert sweep.seeds == (100,) and sweep.arms == ("uniform 0.2", "linear 0.2", "gate 0.2", "none")
    mix = study.mix_study(rlcourse.profile("smoke"), seeds=[0, 1])
    for grid, run, last, arms in ((main, study.run_budget_cell, ("match 0.4", 101), "'gate_std'"),
                                  (mix, study.run_mix_cell, ("adaptive", 1), "'static'")):
        metrics = run_study(grid, jobs=1, cache=False).metrics
        assert grid.cells()[-1] == last and metrics[last] == run(*last, dict(grid.sizes))
        with pytest.raises(ValueError, match=f"the arms are .*{arms}"):
            run("tanh", 0, dict(grid.sizes))
    assert np.shape(metrics[last]["usable"]) == (mix.sizes["steps"], 3)
