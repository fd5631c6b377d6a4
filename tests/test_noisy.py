"""Noisy verifiers: the noise model's rates, the closed-form expected advantages (against exact
enumeration and Monte Carlo), the sign facts, and reproducible, resumable noise in the trainer."""
import copy
import itertools
import types

import numpy as np
import pytest
import torch

import rlcourse
import rlcourse.methods.noisy  # noqa: F401  (registers nothing by name, but must import cleanly)
from rlcourse.advantages import compute_grpo_outcome_advantage
from rlcourse.lm import build_model, build_tokenizer
from rlcourse.methods.noisy import (NoisyVerifier, advantage_pmf, binary_group_std, corrupt_rewards,
                                    expected_advantage, group_advantages, make_noisy_reward, mean_ci,
                                    monte_carlo_advantage, noise_generator, youden_j)
from rlcourse.rewards import get_reward
from rlcourse.train import RLConfig, Trainer

RATES = [(0.0, 0.0), (0.1, 0.1), (0.3, 0.05), (0.05, 0.3), (0.4, 0.4), (0.2, 0.0), (0.7, 0.6)]


@pytest.mark.parametrize("mode", ["sample", "group"])
def test_observed_reward_is_affine_in_the_true_reward(mode):
    """E[r~ | r*] = rho0 + J r*: the marginal error rates are (rho0, rho1) in both modes."""
    rho0, rho1, n = 0.15, 0.35, 200_000
    r = np.tile([1.0, 0.0], n // 2)
    idx = np.repeat(np.arange(n // 8), 8)
    obs = corrupt_rewards(r, idx, rho0, rho1, mode, noise_generator(3, 1))
    se = 0.5 / np.sqrt(n / 2)
    assert abs(obs[r == 0].mean() - rho0) < 4 * se * (2 if mode == "group" else 1) * np.sqrt(8)
    assert abs(obs[r == 1].mean() - (rho0 + youden_j(rho0, rho1))) < 4 * se * np.sqrt(8)


def test_policy_gradient_on_noisy_rewards_is_j_times_the_clean_one():
    """Proposition 1 on a 5-armed softmax bandit, by Monte Carlo (4.5 standard errors per component)."""
    n = 300_000
    pi = np.exp([0.3, -0.2, 0.5, 0.0, -0.4])
    pi /= pi.sum()
    r_star = np.array([1.0, 0.0, 0.0, 1.0, 0.0])
    clean = pi * (r_star - pi @ r_star)
    rng = np.random.default_rng(1)
    for rho0, rho1 in [(0.3, 0.3), (0.4, 0.0), (0.0, 0.45)]:
        arms = rng.choice(5, size=n, p=pi)
        r_obs = corrupt_rewards(r_star[arms], np.arange(n), rho0, rho1, "sample", noise_generator(2, 0))
        g = r_obs[:, None] * (np.eye(5)[arms] - pi)
        se = g.std(0, ddof=1) / np.sqrt(n)
        assert np.all(np.abs(g.mean(0) - youden_j(rho0, rho1) * clean) < 4.5 * se)
        # and the clean gradient (J = 1) is rejected whenever J is far from 1
        assert np.any(np.abs(g.mean(0) - clean) > 10 * se)


def test_group_mode_corrupts_whole_groups_and_sample_mode_does_not():
    G, n = 8, 4000
    r = np.tile(np.r_[np.ones(3), np.zeros(5)], n)
    idx = np.repeat(np.arange(n), G)
    grp = corrupt_rewards(r, idx, 0.3, 0.3, "group", noise_generator(0, 0)).reshape(n, G)
    flipped = (grp != r.reshape(n, G))
    assert np.all(flipped.all(1) | (~flipped).all(1))  # symmetric group noise: all or nothing
    assert abs(flipped.all(1).mean() - 0.3) < 0.03
    smp = corrupt_rewards(r, idx, 0.3, 0.3, "sample", noise_generator(0, 0)).reshape(n, G)
    f = (smp != r.reshape(n, G)).astype(float)
    assert abs(np.corrcoef(f[:, 0], f[:, 1])[0, 1]) < 0.06  # independent errors


def test_noise_is_a_function_of_seed_and_step():
    r, idx = np.zeros(64), np.repeat(np.arange(8), 8)
    a = corrupt_rewards(r, idx, 0.5, 0.0, "sample", noise_generator(1, 7))
    b = corrupt_rewards(r, idx, 0.5, 0.0, "sample", noise_generator(1, 7))
    c = corrupt_rewards(r, idx, 0.5, 0.0, "sample", noise_generator(1, 8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_group_advantages_match_the_trainers_grpo():
    rng = np.random.default_rng(0)
    r = rng.integers(0, 2, size=(6, 8)).astype(float)
    mask = torch.ones(48, 3)
    tlr = torch.zeros(48, 3)
    tlr[:, -1] = torch.as_tensor(r.reshape(-1), dtype=torch.float32)
    for scale in (True, False):
        ref, _ = compute_grpo_outcome_advantage(tlr, mask, torch.arange(6).repeat_interleave(8),
                                                norm_adv_by_std_in_grpo=scale)
        assert np.allclose(group_advantages(r, scale).reshape(-1), ref[:, 0].numpy(), atol=1e-5)
    assert np.allclose(binary_group_std(np.arange(9), 8),
                       [np.r_[np.ones(c), np.zeros(8 - c)].std(ddof=1) for c in range(9)])


def test_grpo_advantage_is_odd_under_reward_inversion():
    r = np.random.default_rng(1).integers(0, 2, size=(100, 8)).astype(float)
    for scale in (True, False):
        assert np.allclose(group_advantages(1 - r, scale), -group_advantages(r, scale))


@pytest.mark.parametrize("mode", ["sample", "group"])
@pytest.mark.parametrize("scale", [True, False])
def test_closed_form_equals_exact_enumeration(mode, scale):
    for G, (rho0, rho1) in itertools.product([2, 5, 8], RATES):
        for k in range(G + 1):
            for correct in (True, False):
                if (correct and k == 0) or (not correct and k == G):
                    continue
                v, p = advantage_pmf(G, k, rho0, rho1, correct, mode, scale)
                assert p.sum() == pytest.approx(1.0, abs=1e-12)
                assert float(v @ p) == pytest.approx(expected_advantage(G, k, rho0, rho1, correct, mode, scale),
                                                     abs=1e-9), (G, k, rho0, rho1, correct)


@pytest.mark.parametrize("mode", ["sample", "group"])
def test_closed_form_matches_monte_carlo(mode):
    """1e5 simulated groups through corrupt_rewards; 4.5 standard errors."""
    G = 8
    for k, (rho0, rho1) in [(2, (0.2, 0.2)), (5, (0.3, 0.05)), (1, (0.05, 0.3)), (6, (0.4, 0.4))]:
        mc = monte_carlo_advantage(G, k, rho0, rho1, mode, n=100_000, seed=k)
        for name, correct in (("correct", True), ("incorrect", False)):
            exact = expected_advantage(G, k, rho0, rho1, correct, mode)
            assert abs(mc[name] - exact) < 4.5 * mc[name + "_se"] + 1e-9, (k, rho0, rho1, name, mc[name], exact)


def test_monte_carlo_rejects_the_naive_formula_for_per_sample_grpo():
    """Per-sample noise does NOT simply scale GRPO's advantage by J: the std normalisation changes it,
    and the Monte Carlo is precise enough to tell."""
    G, k, rho = 8, 1, 0.3
    mc = monte_carlo_advantage(G, k, rho, rho, "sample", n=100_000, seed=5)
    naive = youden_j(rho, rho) * float(group_advantages(np.r_[1.0, np.zeros(G - 1)])[0])
    assert abs(mc["correct"] - naive) > 10 * mc["correct_se"]


def test_dr_grpo_and_group_noise_scale_the_clean_advantage_by_j():
    for G, k, (rho0, rho1) in itertools.product([4, 8], range(9), RATES):
        if k > G:
            continue
        J = youden_j(rho0, rho1)
        for correct in (True, False):
            if (correct and k == 0) or (not correct and k == G):
                continue
            clean_dr = expected_advantage(G, k, 0, 0, correct, "sample", scale=False)
            assert expected_advantage(G, k, rho0, rho1, correct, "sample", scale=False) == pytest.approx(J * clean_dr)
            assert expected_advantage(G, k, rho0, rho1, correct, "group", scale=False) == pytest.approx(J * clean_dr)
            clean = expected_advantage(G, k, 0, 0, correct, "sample")
            assert expected_advantage(G, k, rho0, rho1, correct, "group") == pytest.approx(J * clean)
        if 0 < k < G:  # the clean Dr. GRPO advantage of a correct sample is 1 - k/G
            assert expected_advantage(G, k, 0, 0, True, "sample", scale=False) == pytest.approx(1 - k / G)


def test_sign_kept_while_j_positive_and_flipped_by_inversion():
    rng = np.random.default_rng(0)
    for _ in range(200):
        rho0, rho1 = rng.uniform(0, 1, 2)
        G = int(rng.integers(2, 10))
        k = int(rng.integers(1, G))
        J = youden_j(rho0, rho1)
        for mode in ("sample", "group"):
            ec = expected_advantage(G, k, rho0, rho1, True, mode)
            ei = expected_advantage(G, k, rho0, rho1, False, mode)
            assert np.sign(ec) == np.sign(J) and np.sign(ei) == -np.sign(J)
            # the verifier that reports 1 - r~ has rates (1 - rho0, 1 - rho1) and the opposite advantage
            assert expected_advantage(G, k, 1 - rho0, 1 - rho1, True, mode) == pytest.approx(-ec, abs=1e-12)
            # group sums are zero, so the two classes balance
            assert k * ec + (G - k) * ei == pytest.approx(0.0, abs=1e-9)


def test_all_fail_groups_have_zero_mean_advantage():
    for mode in ("sample", "group"):
        assert expected_advantage(8, 0, 0.3, 0.1, False, mode) == 0.0
        v, p = advantage_pmf(8, 0, 0.3, 0.1, False, mode)
        assert float(v @ p) == pytest.approx(0.0, abs=1e-12)
        if mode == "sample":
            assert v.max() > 0  # a lone false positive does get a positive advantage
        else:
            assert np.all(v == 0)  # a group-wide false positive makes the group constant: no signal


def test_mean_ci_is_the_student_t_interval():
    x = np.array([[1.0, 2.0, 3.0]])
    m, h = mean_ci(x)
    assert m[0] == pytest.approx(2.0) and h[0] == pytest.approx(4.302652729911275 * 1.0 / np.sqrt(3))
    assert np.isnan(mean_ci(np.ones((2, 1)))[1]).all()


def test_bad_input_raises():
    idx = np.arange(4)
    with pytest.raises(ValueError, match="rho0"):
        corrupt_rewards(np.zeros(4), idx, 1.5, 0.0, "sample", noise_generator(0, 0))
    with pytest.raises(ValueError, match="mode"):
        corrupt_rewards(np.zeros(4), idx, 0.1, 0.0, "batch", noise_generator(0, 0))
    with pytest.raises(ValueError, match="binary"):
        corrupt_rewards(np.full(4, 0.5), idx, 0.1, 0.0, "sample", noise_generator(0, 0))
    with pytest.raises(ValueError, match=r"\(B,\)"):
        corrupt_rewards(np.zeros(4), np.arange(3), 0.1, 0.0, "sample", noise_generator(0, 0))
    with pytest.raises(ValueError, match="G"):
        expected_advantage(1, 0, 0.1, 0.1, True)
    with pytest.raises(ValueError, match="no correct sample"):
        advantage_pmf(8, 0, 0.1, 0.1, True)
    with pytest.raises(ValueError, match="no incorrect sample"):
        expected_advantage(8, 8, 0.1, 0.1, False)
    with pytest.raises(ValueError, match="rho1"):
        NoisyVerifier(0.1, -0.1)
    with pytest.raises(ValueError, match="seed"):
        noise_generator(-1, 0)


# ------------------------------------------------------------------ the reward in the trainer
def _batch(texts, G):
    return types.SimpleNamespace(texts=texts, index=torch.arange(len(texts) // G).repeat_interleave(G))


def test_noisy_reward_counts_calls_in_state_and_registers_by_name():
    v = make_noisy_reward(0.5, 0.0, "sample", seed=4, name="test_nv_lenient")
    assert get_reward("test_nv_lenient") is v
    task = rlcourse.tasks.get_task("sort")
    ex = task.examples(4)
    rows = [e for e in ex for _ in range(4)]
    batch = _batch(["x"] * 16, 4)  # all wrong: every 1 is a false positive
    s1, s2 = {}, {}
    a = v(batch, rows, task, s1)
    b = v(batch, rows, task, s1)
    assert s1["noisy_verifier"]["calls"] == 2 and not torch.equal(a, b)
    assert torch.equal(v(batch, rows, task, s2), a)  # a fresh state replays call 1
    assert s1["noisy_verifier"]["true_reward"] == [0.0, 0.0]


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return build_model(tok, rlcourse.profile("smoke"), seed=0), tok


def test_noisy_training_resumes_exactly(tiny, tmp_path):
    """The noise is drawn from (seed, call number) kept in the checkpointed state: an interrupted and
    resumed run sees the same noise and ends with bit-identical weights."""
    model, tok = tiny
    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    def make(out, resume=False):
        cfg = RLConfig(num_generations=4, prompts_per_step=2, max_completion_length=4, steps=2, progress=False,
                       learning_rate=1e-3, train_pool_size=20, eval_prompts=4, output_dir=str(out), save_every=1,
                       reward=make_noisy_reward(0.4, 0.2, "group", seed=9))
        return Trainer(copy.deepcopy(model), tok, "sort", cfg, resume=resume)

    try:
        full = make(tmp_path / "full")
        full.train()
        part = make(tmp_path / "part")
        part.train(steps=1)
        resumed = make(tmp_path / "part", resume=True)
        assert resumed.step_count == 1
        resumed.train()
    finally:
        torch.set_num_threads(threads)
    assert resumed.state["noisy_verifier"] == full.state["noisy_verifier"]
    assert full.state["noisy_verifier"]["calls"] == 2
    assert all(torch.equal(p, q) for p, q in zip(full.model.parameters(), resumed.model.parameters()))


# ------------------------------------------------------------------ the chapter's bandit experiment
def test_bandit_init_spreads_difficulty_and_is_seeded():
    from rlcourse.studies.noisy_verifiers import _softmax, bandit_init

    a, b = bandit_init(50, 10, 3), bandit_init(50, 10, 3)
    assert a.shape == (50, 10) and np.array_equal(a, b) and not np.array_equal(a, bandit_init(50, 10, 4))
    p = _softmax(a)[:, 0]
    assert p.min() < 0.03 and p.max() > 0.25  # hard and moderate prompts
    with pytest.raises(ValueError, match="n_answers"):
        bandit_init(5, 2, 0)


def test_noisy_bandit_learns_clean_and_pairs_seeds():
    from rlcourse.studies.noisy_verifiers import late_window, train_noisy_bandit

    clean = train_noisy_bandit(0.0, 0.0, "sample", "adam", 0.1, 300, [0, 1], eval_every=100)
    assert clean["curve"].shape == (2, 4) and list(clean["eval_steps"]) == [0, 100, 200, 300]
    assert np.all(clean["curve"][:, -1] > clean["curve"][:, 0] + 0.5)
    # a seed's run does not depend on the other seeds run beside it (vectorised = one at a time)
    alone = train_noisy_bandit(0.0, 0.0, "sample", "adam", 0.1, 300, [1], eval_every=100)
    assert np.allclose(alone["curve"][0], clean["curve"][1])
    # J = 0: the verifier is a coin, and the policy does not learn (its accuracy stays near the start)
    coin = train_noisy_bandit(0.5, 0.5, "group", "sgd", 10.0, 300, [0, 1], eval_every=100)
    assert np.all(np.abs(coin["curve"][:, -1] - coin["curve"][:, 0]) < 0.15)
    assert np.allclose(late_window(clean["curve"], clean["eval_steps"], (200, 300)), clean["curve"][:, 2:].mean(1))
    with pytest.raises(ValueError, match="late evaluation"):
        late_window(clean["curve"], clean["eval_steps"], (250, 300))
    with pytest.raises(ValueError, match="optimizer"):
        train_noisy_bandit(0.0, 0.0, "sample", "rmsprop", 0.1, 10, [0])


def test_noisy_claims_are_well_formed():
    from rlcourse.studies.noisy_verifiers import CLAIMS

    for c in CLAIMS.values():
        assert c.key.startswith("noisy_verifiers/") and c.paper and c.statement and c.source
    # the paper's tolerances are the margins: 1 point through 20%, about 2 points at 30%
    assert CLAIMS["bandit-group-20"].margin == CLAIMS["lm-group-20"].margin == 0.01
    assert CLAIMS["bandit-group-30"].margin == CLAIMS["lm-group-30"].margin == 0.02
    assert CLAIMS["bandit-sample-20"].margin == 0.01  # per-sample 20% against the same 1-point tolerance
    # the paper's claims rest on their positive controls; the course's hypotheses are marked as such
    for key, c in CLAIMS.items():
        if c.role == "paper claim":
            assert c.control == CLAIMS[("lm" if key.startswith("lm") else "bandit") + "-control"].key, key
    assert CLAIMS["adam"].role == CLAIMS["lm-below-base"].role == "course hypothesis"


def test_learning_rate_rule_runs_clean_arms_on_disjoint_seeds():
    from rlcourse.studies.noisy_verifiers import choose_bandit_lrs
    from rlcourse.profiles import profile

    c = choose_bandit_lrs(profile("smoke"), grids={"adam": (0.01, 0.1), "sgd": (10.0,)})
    assert c["seeds"] == [100]
    assert c["lrs"]["adam"] == (0.01, 0.1)[int(np.argmax(c["quarter"]["adam"]))] and c["lrs"]["sgd"] == 10.0
    assert c["quarter"]["adam"][1] > c["quarter"]["adam"][0]  # a tenfold rate learns faster early
    with pytest.raises(ValueError, match="empty"):
        choose_bandit_lrs(profile("smoke"), grids={"adam": ()})


def test_noisy_bandit_study_cells_do_not_depend_on_order():
    from dataclasses import replace

    from rlcourse.profiles import profile
    from rlcourse.studies import run_study
    from rlcourse.studies.noisy_verifiers import ARMS, noisy_bandit_study, run_cell, train_noisy_bandit

    study = noisy_bandit_study(profile("smoke"), {"adam": 0.1, "sgd": 10.0})
    study = replace(study, seeds=(0, 3), sizes={**study.sizes, "steps": 40, "every": 20, "late": [20, 40]})
    res = run_study(study, jobs=1, cache=False)
    last = ("sgd sample 0.4", 3)
    assert res.metrics[last] == run_cell(*last, dict(study.sizes))  # alone, nothing run before it
    # a cell is its seed's row of the vectorised trainer
    both = train_noisy_bandit(0.4, 0.4, "sample", "sgd", 10.0, 40, [0, 3], eval_every=20)
    assert res.metrics[last]["curve"] == both["curve"][1].tolist()
    assert len(ARMS) == len(study.arms) == 14  # 5 per-sample + 4 group + strict + lenient + 3 SGD
    with pytest.raises(ValueError, match="the arms are .*adam sample 0.0"):
        run_cell("adam sample 0.5", 0, dict(study.sizes))
    with pytest.raises(ValueError, match="no learning rate for"):
        noisy_bandit_study(profile("smoke"), {"adam": 0.1})


def test_lm_study_cells_stand_alone():
    """A later cell of the language model's grid, run with the others, equals the same cell run alone;
    a bad arm is refused with the arms named."""
    from dataclasses import replace

    from rlcourse.profiles import profile
    from rlcourse.studies import run_study
    from rlcourse.studies.noisy_verifiers import LM_ARMS, lm_study, run_lm_cell

    study = lm_study(replace(profile("smoke"), seeds=2))
    assert study.arms == tuple(LM_ARMS) and study.seeds == (0, 1)
    study = replace(study, arms=("clean", "group 0.3"))
    res = run_study(study, jobs=1, cache=False)
    arm, seed = study.cells()[-1]
    assert (arm, seed) == ("group 0.3", 1)
    alone = run_lm_cell(arm, seed, dict(study.sizes))
    assert res.metrics[(arm, seed)] == alone
    assert len(alone["curve"]) == len(study.sizes["evals"]) and len(alone["true_reward"]) == study.sizes["evals"][-1]
    with pytest.raises(ValueError, match="the arms are .*'sample 0.45'"):
        run_lm_cell("sample 0.5", 0, dict(study.sizes))
