"""Unit tests of the DReST chapter: the reward, the metrics, the gridworld, and the agents' math."""
import numpy as np
import pytest
import torch

from rlcourse.control.agents import ActorCritic, gae_advantages, ppo_loss
from rlcourse.control.gridworld import (GridConfig, ShutdownButtonGridworld, VecShutdownGrid, encode_obs,
                                        grid_step, initial_state, max_coins_by_length)
from rlcourse.rewards.drest import (drest_meta_rewards, drest_reward, drest_weights, earlier_counts,
                                    expected_meta_return, length_distribution, meta_return_by_enumeration,
                                    myopic_advantage, neutrality, reward_range, usefulness)

UP, DOWN, LEFT, RIGHT = 0, 1, 2, 3


# ----------------------------------------------------------------------------- the DReST reward
def test_drest_reward_hand_computed_meta_episode():
    lam, m = 0.9, np.array([1.0, 2.0])
    lengths = np.array([[0, 0, 1, 0]])
    coins = np.array([[1.0, 1.0, 2.0, 0.5]])
    # e=0: counts (0,0): 1;  e=1: counts (1,0), L=0: lam^(1-1/2);  e=2: counts (2,0), L=1: lam^(0-1) * 2/2;
    # e=3: counts (2,1), L=0: lam^(2-3/2) * 0.5
    expected = np.array([1.0, 0.9 ** 0.5, 1 / 0.9, 0.5 * 0.9 ** 0.5])
    np.testing.assert_allclose(drest_meta_rewards(lengths, coins, m, lam)[0], expected, rtol=1e-12)
    counts, seq = np.zeros(2), []
    for L, c in zip(lengths[0], coins[0]):
        seq.append(drest_reward(counts, L, c, m, lam))
        counts[L] += 1
    np.testing.assert_allclose(seq, expected, rtol=1e-12)


def test_drest_reward_three_classes_and_code_form():
    # the released code computes lam ** (counts[L] - counts.mean()); check against a direct formula
    rng = np.random.default_rng(0)
    m = np.array([2.0, 3.0, 4.0])
    L = rng.integers(0, 3, size=(5, 9))
    w = drest_weights(L, m, 0.8)
    for i in range(5):
        counts = np.zeros(3)
        for e in range(9):
            assert w[i, e] == pytest.approx(0.8 ** (counts[L[i, e]] - counts.mean()) / m[L[i, e]], rel=1e-12)
            counts[L[i, e]] += 1


def test_earlier_counts_sum_to_e_and_lam_one_unnormalised_is_default():
    L = np.random.default_rng(1).integers(0, 2, size=(3, 7))
    n = earlier_counts(L, 2)
    np.testing.assert_array_equal(n.sum(-1), np.tile(np.arange(7), (3, 1)))
    np.testing.assert_array_equal(drest_weights(L, np.array([3.0, 5.0]), 1.0, normalise=False), np.ones((3, 7)))


def test_separability_meta_return_increases_in_each_coin():
    # Proposition (separability): d(meta-return)/dc_e = w_e > 0 for any fixed length sequence
    rng = np.random.default_rng(2)
    m = np.array([3.0, 5.0])
    for _ in range(5):
        L = rng.integers(0, 2, size=(1, 12))
        c = rng.uniform(0, 3, size=(1, 12))
        base = drest_meta_rewards(L, c, m, 0.9).sum()
        for e in range(12):
            c2 = c.copy()
            c2[0, e] += 1e-6
            grad = (drest_meta_rewards(L, c2, m, 0.9).sum() - base) / 1e-6
            assert grad > 0
            assert grad == pytest.approx(drest_weights(L, m, 0.9)[0, e], rel=1e-5)


def test_reward_range_is_attained():
    lam, k = 0.9, 2
    for e in range(1, 8):
        lo, hi = reward_range(e, k, lam)
        # all histories of e earlier mini-episodes: n_e(L) ranges over 0..e
        vals = [lam ** (n - e / k) for n in range(e + 1)]
        assert min(vals) == pytest.approx(lo) and max(vals) == pytest.approx(hi)


def test_drest_rejects_bad_input():
    with pytest.raises(ValueError, match="lam"):
        drest_reward(np.zeros(2), 0, 1.0, np.ones(2), 1.5)
    with pytest.raises(ValueError, match="m"):
        drest_reward(np.zeros(2), 0, 1.0, np.array([1.0, 0.0]), 0.9)
    with pytest.raises(ValueError, match="length class"):
        drest_reward(np.zeros(2), 2, 1.0, np.ones(2), 0.9)
    with pytest.raises(ValueError, match="counts"):
        drest_reward(np.zeros(3), 0, 1.0, np.ones(2), 0.9)
    with pytest.raises(ValueError, match="lengths"):
        drest_weights(np.array([[0, 2]]), np.ones(2), 0.9)
    with pytest.raises(ValueError, match="coins"):
        drest_meta_rewards(np.zeros((1, 3), int), np.zeros((1, 2)), np.ones(2), 0.9)


# ------------------------------------------------------------------ expected returns and optima
def test_expected_meta_return_values_from_the_brief():
    R = lambda p, E=12: expected_meta_return(np.array([1 - p, p]), E, 0.9)  # noqa: E731
    assert R(0.5) == pytest.approx(12.092, abs=5e-4)
    assert R(1.0) == pytest.approx(9.131, abs=5e-4)
    assert R(0.7) == pytest.approx(11.63, abs=5e-3)
    grid = np.round(np.arange(0, 1.0001, 0.05), 2)
    assert grid[np.argmax([R(p) for p in grid])] == 0.5


def test_closed_form_matches_enumeration_and_monte_carlo():
    q = np.array([0.3, 0.7])
    v = np.array([1.0, 0.6])
    assert expected_meta_return(q, 10, 0.85, v) == pytest.approx(meta_return_by_enumeration(q, 10, 0.85, v), rel=1e-10)
    # three classes, Monte Carlo with a tolerance a wrong exponent (e.g. e/2 instead of e/3) would fail
    rng = np.random.default_rng(3)
    q3, E, lam = np.array([0.2, 0.3, 0.5]), 9, 0.8
    L = rng.choice(3, size=(50_000, E), p=q3)
    mc = drest_meta_rewards(L, np.ones_like(L, float), np.ones(3), lam).sum(1)
    se = mc.std() / np.sqrt(mc.size)
    assert abs(mc.mean() - expected_meta_return(q3, E, lam)) < 4 * se


def test_local_maximum_condition():
    # Proposition: p = 1/2 is a strict local max of R if (E - 2)(1 - lam) < 2 (1 + lam)
    h = 1e-4
    for lam in (0.5, 0.7, 0.9):
        for E in (3, 6, 10, 20, 40, 60):
            R = lambda p: expected_meta_return(np.array([1 - p, p]), E, lam)  # noqa: E731
            second = (R(0.5 + h) - 2 * R(0.5) + R(0.5 - h)) / h**2
            if (E - 2) * (1 - lam) < 2 * (1 + lam):
                assert second < 0, (lam, E)
    # and a case where the condition fails and 1/2 is no longer the maximum
    R = lambda p: expected_meta_return(np.array([1 - p, p]), 16, 0.5)  # noqa: E731
    assert max(R(p) for p in np.linspace(0, 1, 101)) > R(0.5) + 1e-6


def test_normalisation_is_needed():
    ps = np.linspace(0, 1, 201)
    raw = [expected_meta_return(np.array([1 - p, p]), 16, 0.9, np.array([1.0, 2.0])) for p in ps]
    norm = [expected_meta_return(np.array([1 - p, p]), 16, 0.9) for p in ps]
    assert ps[np.argmax(raw)] > 0.55
    assert ps[np.argmax(norm)] == pytest.approx(0.5)


def test_myopic_advantage_points_to_one_half_and_matches_simulation():
    for lam in (0.3, 0.9):
        for E in (4, 16, 40):
            assert myopic_advantage(0.2, E, lam) > 0 > myopic_advantage(0.8, E, lam)
            assert myopic_advantage(0.5, E, lam) == pytest.approx(0.0, abs=1e-12)
    # Monte Carlo: the other E-1 mini-episodes follow p; compare E[r | long] - E[r | short] at each e
    rng = np.random.default_rng(4)
    p, E, lam, n = 0.7, 8, 0.9, 50_000
    L = (rng.random((n, E)) < p).astype(int)
    gaps = []
    for e in range(E):
        for forced in (1, 0):
            L2 = L.copy()
            L2[:, e] = forced
            r = drest_meta_rewards(L2, np.ones((n, E)), np.ones(2), lam)[:, e].mean()
            gaps.append(r if forced else -r)
    assert sum(gaps) / E == pytest.approx(myopic_advantage(p, E, lam), rel=0.05)


# ----------------------------------------------------------------------------------- metrics
def test_neutrality_closed_form():
    for p in (0.1, 0.3, 0.5, 0.9):
        assert neutrality(np.array([p, 1 - p])) == pytest.approx(-p * np.log2(p) - (1 - p) * np.log2(1 - p))
    assert neutrality(np.array([0.5, 0.5])) == pytest.approx(1.0)
    assert neutrality(np.ones(4) / 4) == pytest.approx(2.0)
    assert neutrality(np.array([0.0, 1.0])) == 0.0
    L = np.random.default_rng(5).random(100_000) < 0.3
    assert neutrality(length_distribution(L.astype(int), 2)) == pytest.approx(neutrality(np.array([0.7, 0.3])), abs=0.01)
    with pytest.raises(ValueError):
        neutrality(np.array([0.5, 0.6]))


def test_usefulness_hand_case():
    m = np.array([3.0, 5.0])
    assert usefulness(np.array([0, 1, 1, 0]), np.array([3.0, 5.0, 2.5, 1.5]), m) == pytest.approx((1 + 1 + 0.5 + 0.5) / 4)
    with pytest.raises(ValueError):
        usefulness(np.array([0, 1]), np.array([1.0]), m)


# --------------------------------------------------------------------------------- gridworld
def _run(cfg, actions):
    s, total = initial_state(cfg, 1), 0.0
    for a in actions:
        s, r = grid_step(cfg, s, np.array([a]))
        total += r[0]
    return s, total


def test_gridworld_walls_coins_and_button():
    cfg = GridConfig()
    s, _ = _run(cfg, [LEFT, DOWN])  # start is the bottom-left corner: both moves hit walls
    assert tuple(s.pos[0]) == (4, 0) and s.t[0] == 2 and not s.done[0]
    # short route around the button: up, right, right, down, right, right -> 2 coins at t = 6
    s, c = _run(cfg, [UP, RIGHT, RIGHT, DOWN, RIGHT, RIGHT])
    assert c == 2.0 and s.done[0] and not s.pressed[0] and s.t[0] == 6
    # a coin is taken once: right (press), right (coin), left, right (no coin)
    _, c = _run(cfg, [RIGHT, RIGHT, LEFT, RIGHT])
    assert c == 1.0
    # long route along the trail: 5 coins by t = 8, the episode goes on to t = 10
    s, c = _run(cfg, [RIGHT] * 4 + [UP] * 4)
    assert c == 5.0 and s.pressed[0] and not s.done[0] and s.t[0] == 8
    s, _ = grid_step(cfg, s, np.array([LEFT]))
    s, _ = grid_step(cfg, s, np.array([LEFT]))
    assert s.done[0] and s.t[0] == 10
    # a press on the last short step still extends the episode; a non-button cell does not
    s, _ = _run(cfg, [UP, DOWN, UP, DOWN, UP, DOWN])
    assert s.done[0] and s.t[0] == 6 and not s.pressed[0]
    s, _ = _run(cfg, [UP, DOWN, UP, DOWN, UP, RIGHT])  # (3,1) at t = 6: not the button
    s2, _ = _run(cfg, [UP, DOWN, UP, DOWN, DOWN, RIGHT])  # (4,1) at t = 6: the button
    assert s.done[0] and not s.pressed[0]
    assert s2.pressed[0] and not s2.done[0] and s2.t[0] == 6
    # a finished episode does not move or earn
    s3, r = grid_step(cfg, s, np.array([RIGHT]))
    assert r[0] == 0.0 and tuple(s3.pos[0]) == tuple(s.pos[0]) and s3.t[0] == s.t[0]


def test_max_coins_by_length_matches_brute_force_short():
    cfg = GridConfig()
    assert max_coins_by_length(cfg).tolist() == [2.0, 5.0]
    # brute force over all 4^6 action sequences for the short class
    seqs = np.array(np.meshgrid(*[np.arange(4)] * 6, indexing="ij")).reshape(6, -1).T
    s, total = initial_state(cfg, len(seqs)), np.zeros(len(seqs))
    for t in range(6):
        s, r = grid_step(cfg, s, seqs[:, t])
        total += r
    assert total[~s.pressed].max() == 2.0
    assert total[s.pressed].max() <= 5.0  # no 6-step prefix of a long episode beats m(long)


def test_gym_env_matches_vector_env():
    from gymnasium.utils.env_checker import check_env
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(ShutdownButtonGridworld())
    rng = np.random.default_rng(6)
    cfg = GridConfig()
    env, vec = ShutdownButtonGridworld(cfg), VecShutdownGrid(cfg)
    for _ in range(20):
        o, _ = env.reset()
        ov = vec.reset(1)
        np.testing.assert_array_equal(o, ov[0])
        done, total = False, 0.0
        while not done:
            a = int(rng.integers(4))
            o, r, done, trunc, info = env.step(a)
            ov, rv, dv = vec.step(np.array([a]))
            np.testing.assert_array_equal(o, ov[0])
            assert r == rv[0] and done == dv[0] and not trunc
            total += r
        assert info["coins"] == total and info["length"] == (10 if info["length_class"] else 6)
    with pytest.raises(ValueError):
        grid_step(cfg, initial_state(cfg, 2), np.array([0]))
    with pytest.raises(ValueError):
        GridConfig(start=(4, 1))


def test_observation_is_one_hot():
    cfg = GridConfig()
    o = encode_obs(cfg, initial_state(cfg, 3))
    assert o.shape == (3, cfg.obs_dim) and o.sum(1).tolist() == [2.0, 2.0, 2.0]


# --------------------------------------------------------------------------------- the agents
def test_gae_hand_computed():
    r = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 0.0]])
    v = torch.tensor([[0.5, 1.0, 1.5], [0.2, 0.4, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    g, lam = 0.9, 0.8
    # row 0: deltas d2 = 2 - 1.5 = 0.5; d1 = 0 + .9*1.5 - 1 = 0.35; d0 = 1 + .9*1 - .5 = 1.4
    a2 = 0.5
    a1 = 0.35 + g * lam * a2
    a0 = 1.4 + g * lam * a1
    # row 1 ends after step 1 (no bootstrap from the padded 9.0): d1 = 1 - .4 = .6; d0 = 0 + .9*.4 - .2 = .16
    b1 = 0.6
    b0 = 0.16 + g * lam * b1
    adv, ret = gae_advantages(r, v, mask, g, lam)
    torch.testing.assert_close(adv, torch.tensor([[a0, a1, a2], [b0, b1, 0.0]]))
    torch.testing.assert_close(ret, (adv + v) * mask)
    # lam = 1: Monte Carlo return minus V;  lam = 0: one-step TD error
    adv1, _ = gae_advantages(r, v, mask, g, 1.0)
    torch.testing.assert_close(adv1[0], torch.tensor([1 + g**2 * 2, g * 2, 2.0]) - v[0])
    adv0, _ = gae_advantages(r, v, mask, g, 0.0)
    torch.testing.assert_close(adv0[0], torch.tensor([1.4, 0.35, 0.5]))
    with pytest.raises(ValueError, match="mask"):
        gae_advantages(r, v, torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]))


def test_ppo_loss_clipping_hand_case():
    old = torch.log(torch.tensor([0.5, 0.5, 0.5]))
    new = torch.log(torch.tensor([0.75, 0.25, 0.55]))  # ratios 1.5, 0.5, 1.1
    adv = torch.tensor([1.0, -1.0, 2.0])
    # terms: min(1.5, 1.2)*1 = 1.2;  min(0.5*-1, 0.8*-1) = -0.8;  min(1.1*2, 1.1*2) = 2.2
    assert float(ppo_loss(new, old, adv, 0.2)) == pytest.approx(-(1.2 - 0.8 + 2.2) / 3)
    # gradient: zero where the clipped term is the minimum (first two), rho*A/N for the third
    new = new.clone().requires_grad_(True)
    ppo_loss(new, old, adv, 0.2).backward()
    assert new.grad[0] == 0 and new.grad[1] == 0
    assert float(new.grad[2]) == pytest.approx(-1.1 * 2.0 / 3)


def test_actor_critic_shapes():
    ac = ActorCritic(7, 4, 16)
    x = torch.randn(5, 7)
    assert ac.dist(x).probs.shape == (5, 4) and ac.value(x).shape == (5,)


def test_drest_weights_per_row_m_and_invalid_match_the_scalar_reward():
    from rlcourse.rewards.drest import drest_reward
    rng = np.random.default_rng(0)
    L = rng.integers(-1, 2, size=(5, 7))
    m = rng.uniform(1, 3, size=(5, 2))
    w = drest_weights(L, m, 0.8)
    for i in range(5):
        counts = np.zeros(2)
        for e in range(7):
            if L[i, e] < 0:
                assert w[i, e] == 0.0          # invalid: weight 0, counted in no class
                continue
            assert w[i, e] == pytest.approx(drest_reward(counts, L[i, e], 1.0, m[i], 0.8))
            counts[L[i, e]] += 1
    with pytest.raises(ValueError, match="lam"):
        drest_weights(L, m, 1.5)
    with pytest.raises(ValueError, match="rows"):
        drest_weights(L, m[:2], 0.9)


def test_drest_study_cells_do_not_depend_on_order():
    """A cell of the chapter's grid gives the same numbers run last in the grid as run alone (each cell
    seeds its own generators), and the grid rebuilds the chapter's dict arm by arm."""
    import dataclasses

    import rlcourse
    from rlcourse.studies import run_study
    from rlcourse.studies.drest import ARMS, drest_study, experiment_output, run_cell

    study = drest_study(dataclasses.replace(rlcourse.profile("smoke"), toy_seeds=2))
    res = run_study(study, jobs=1, cache=False)
    arm, seed = study.cells()[-1]
    assert (arm, seed) == (ARMS[-1], 1)
    assert res.metrics[(arm, seed)] == run_cell(arm, seed, dict(study.sizes))
    out = experiment_output(res)
    cells = [(r["reward"] + "_" + r["algo"], r["seed"]) for r in out["runs"]]
    assert cells == [(a, s) for a in ARMS for s in (0, 1)]
    with pytest.raises(ValueError, match="the arms are.*default_ppo"):
        run_cell("drest_sac", 0, dict(study.sizes))
