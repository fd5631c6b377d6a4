import numpy as np
import pytest
import torch

from rlcourse.advantages import (ESTIMATORS, compute_gae_advantage_return, compute_grpo_outcome_advantage,
                                 compute_reinforce_advantage, compute_reinforce_baseline_advantage,
                                 compute_rloo_outcome_advantage, get_estimator, place_on_last_token,
                                 register_estimator)


def batch(scores, lengths, T=5):
    mask = torch.zeros(len(scores), T)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return place_on_last_token(torch.tensor(scores, dtype=torch.float32), mask), mask


def test_reward_sits_on_last_valid_token():
    rewards, mask = batch([1.0, 2.0], [2, 5])
    assert rewards.tolist() == [[0, 1, 0, 0, 0], [0, 0, 0, 0, 2]]
    with pytest.raises(ValueError, match="empty response mask"):
        place_on_last_token(torch.ones(2), torch.tensor([[1.0, 0], [0, 0]]))


def test_grpo_hand_computed():
    rewards, mask = batch([1, 0, 0, 0, 1, 1, 1, 0], [3, 2, 5, 1, 4, 4, 4, 4])
    index = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv, ret = compute_grpo_outcome_advantage(rewards, mask, index, epsilon=0.0)
    # group 0: mean 0.25, unbiased std sqrt(0.25) = 0.5 -> (1-0.25)/0.5 = 1.5, (0-0.25)/0.5 = -0.5
    expected0 = [1.5, -0.5, -0.5, -0.5]
    expected1 = [0.5, 0.5, 0.5, -1.5]
    per_row = (adv * mask).sum(1) / mask.sum(1)
    assert torch.allclose(per_row, torch.tensor(expected0 + expected1))
    assert ((adv != 0) <= (mask == 1)).all()  # zero on padding
    assert torch.equal(ret.sum(1), rewards.sum(1) * torch.tensor([3, 2, 5, 1, 4, 4, 4, 4.0]))


def test_grpo_without_std_is_dr_grpo_and_registry():
    rewards, mask = batch([3, 1, 0, 2], [2, 2, 2, 2])
    index = [0, 0, 1, 1]
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert torch.allclose(adv[:, 0], torch.tensor([1.0, -1.0, -1.0, 1.0]))
    adv2, _ = get_estimator("dr_grpo")(rewards, mask, index)
    assert torch.equal(adv, adv2)
    assert {"reinforce", "reinforce_baseline", "rloo", "grpo", "dr_grpo", "gae"} <= set(ESTIMATORS.names())


def test_rloo_is_leave_one_out_and_scaled_centering():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=12).tolist()
    rewards, mask = batch(scores, [3] * 12)
    index = np.repeat(np.arange(3), 4)
    adv, _ = compute_rloo_outcome_advantage(rewards, mask, index)
    s = np.array(scores).reshape(3, 4)
    loo = np.array([[s[g, i] - np.delete(s[g], i).mean() for i in range(4)] for g in range(3)]).ravel()
    assert np.allclose(adv[:, 0].numpy(), loo, atol=1e-5)
    centred = (s - s.mean(1, keepdims=True)).ravel() * 4 / 3
    assert np.allclose(adv[:, 0].numpy(), centred, atol=1e-5)


def test_group_estimators_refuse_groups_of_one():
    rewards, mask = batch([1, 0, 1], [1, 1, 1])
    for fn in (compute_grpo_outcome_advantage, compute_rloo_outcome_advantage):
        with pytest.raises(ValueError, match=r"group 2 has 1 sample\(s\).*G >= 2"):
            fn(rewards, mask, [0, 0, 2])
    with pytest.raises(ValueError, match="index has 2 entries but the batch has 3 rows"):
        compute_grpo_outcome_advantage(rewards, mask, [0, 0])


def test_string_uids_as_index():
    rewards, mask = batch([1, 0, 0, 1], [1, 1, 1, 1])
    a, _ = compute_grpo_outcome_advantage(rewards, mask, np.array(["a", "b", "a", "b"]))
    b, _ = compute_grpo_outcome_advantage(rewards, mask, [0, 1, 0, 1])
    assert torch.equal(a, b)


def test_reinforce_and_batch_baseline():
    rewards, mask = batch([1, 0, 3], [2, 1, 3])
    adv, _ = compute_reinforce_advantage(rewards, mask)
    assert adv[:, 0].tolist() == [1, 0, 3]
    adv, _ = compute_reinforce_baseline_advantage(rewards, mask)
    assert torch.allclose(adv[:, 0], torch.tensor([-1 / 3, -4 / 3, 5 / 3]))


def test_nan_rewards_raise():
    rewards, mask = batch([1, 0], [1, 1])
    rewards[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="token_level_rewards"):
        compute_grpo_outcome_advantage(rewards, mask, [0, 0])
    with pytest.raises(ValueError, match="shape mismatch"):
        compute_grpo_outcome_advantage(rewards, mask[:, :3], [0, 0])


def test_gae_gamma_lambda_one_is_return_minus_value():
    torch.manual_seed(0)
    B, T = 4, 6
    mask = torch.ones(B, T)
    mask[1, 4:] = 0
    mask[2, 2] = 0  # a tool token inside the response: skipped
    rewards = torch.randn(B, T) * mask
    values = torch.randn(B, T) * mask
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    reward_to_go = (rewards * mask).flip(1).cumsum(1).flip(1)
    assert torch.allclose(adv, (reward_to_go - values) * mask, atol=1e-6)
    assert torch.allclose(ret, reward_to_go * mask, atol=1e-6)


def test_gae_hand_computed_with_discount():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.2, 0.4]])
    mask = torch.ones(1, 3)
    g, l = 0.9, 0.8
    d2 = 1.0 - 0.4
    d1 = 0.0 + g * 0.4 - 0.2
    d0 = 0.0 + g * 0.2 - 0.5
    a2, a1 = d2, d1 + g * l * d2
    a0 = d0 + g * l * a1
    adv, ret = compute_gae_advantage_return(rewards, values, mask, g, l)
    assert torch.allclose(adv, torch.tensor([[a0, a1, a2]]))
    assert torch.allclose(ret, torch.tensor([[a0 + 0.5, a1 + 0.2, a2 + 0.4]]))
    # with lam = 1 the returns are the discounted reward-to-go, whatever the critic says
    _, ret1 = compute_gae_advantage_return(rewards, values, mask, g, 1.0)
    assert torch.allclose(ret1, torch.tensor([[g * g, g, 1.0]]))
    with pytest.raises(ValueError, match="values from a critic"):
        get_estimator("gae")(rewards, mask)


def test_lambda_zero_is_one_step_td():
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    values = torch.tensor([[0.3, 0.6, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv, _ = compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=0.0)
    assert torch.allclose(adv, torch.tensor([[0.6 - 0.3, 1.0 - 0.6, 0.0]]))


def test_register_a_new_estimator():
    @register_estimator("test_constant_one")
    def constant(token_level_rewards, response_mask, index):
        return response_mask.clone(), response_mask.clone()

    assert get_estimator("test_constant_one") is constant
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("test_constant_one")(constant)
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        get_estimator("nope")


def test_group_stats_is_the_one_group_statistic_bessel_by_default():
    from rlcourse.ops import group_stats

    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 4.0], [1.0, 6.0]])
    idx = torch.tensor([0, 0, 1, 1])
    count, mean, std = group_stats(x[:, 0], idx)
    assert torch.equal(count, torch.full((4,), 2.0)) and torch.allclose(mean, torch.tensor([0.5, 0.5, 1.0, 1.0]))
    assert torch.allclose(std, torch.tensor([0.5 ** 0.5] * 2 + [0.0] * 2))  # unbiased, as torch.std
    _, mean2, pop = group_stats(x, idx, unbiased=False)  # (B, R): each column on its own; population std
    assert torch.allclose(mean2[:, 1], torch.tensor([1.0, 1.0, 5.0, 5.0]))
    assert torch.allclose(pop[:, 1], torch.ones(4)) and torch.allclose(pop[:, 0], torch.tensor([0.5, 0.5, 0, 0]))
    with pytest.raises(ValueError, match="G >= 2"):
        group_stats(x[:3, 0], torch.tensor([0, 0, 1]), min_size=2)


def test_advantage_race_in_two_processes_equals_one():
    """The race's (estimator, seed) runs are independent: spread over two worker processes they give
    exactly what one process gives (each run on one torch thread either way)."""
    import rlcourse
    from rlcourse.studies.advantages import run_advantage_race

    P = rlcourse.profile("smoke")
    one = run_advantage_race(P, estimators=("rloo", "grpo"), seeds=[0, 1], workers=1, cache=False)
    two = run_advantage_race(P, estimators=("rloo", "grpo"), seeds=[0, 1], workers=2, cache=False)
    for s in (0, 1):
        for est in ("rloo", "grpo"):
            a, b = one["runs"][s][est], two["runs"][s][est]
            assert a["final_accuracy"] == b["final_accuracy"]
            assert [h["loss"] for h in a["history"]] == [h["loss"] for h in b["history"]]


def _untimed(metrics: dict) -> dict:
    timing = {"time_rollout", "time_reward", "time_reference", "time_update", "sample_seconds", "step_seconds"}
    return {k: [{j: x for j, x in h.items() if j not in timing} for h in v] if k == "history" else v
            for k, v in metrics.items()}


def test_advantage_studies_cell_alone_equals_the_grid_and_bad_arms_are_named():
    import rlcourse
    from rlcourse.studies.advantages import length_bias_study, race_study, run_length_cell, run_race_cell
    from rlcourse.studies.runner import run_study

    P = rlcourse.profile("smoke")
    race = race_study(P, estimators=("rloo", "grpo"), seeds=[0, 1])
    res = run_study(race, jobs=1, cache=False)
    arm, seed = race.cells()[-1]  # a later cell: GRPO on seed 1
    assert _untimed(res.metrics[(arm, seed)]) == _untimed(run_race_cell(arm, seed, race.sizes))
    lb = length_bias_study(P, seeds=[0, 1])
    res = run_study(lb, jobs=1, cache=False)
    assert res.metrics[("dapo", 1)] == run_length_cell("dapo", 1, lb.sizes)
    with pytest.raises(ValueError, match="rloo"):
        run_race_cell("no such estimator", 0, race.sizes)
    with pytest.raises(ValueError, match="dapo"):
        run_length_cell("no such loss", 0, lb.sizes)
