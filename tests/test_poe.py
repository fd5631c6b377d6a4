"""Product-of-experts steering (rlcourse.control.poe), D4RL-layout data sets and the 2-D navigation task."""
import gymnasium as gym
import h5py
import mujoco  # noqa: F401  (a default dependency: the MuJoCo tests fail, not skip, without it)
import numpy as np
import pytest
import torch

from rlcourse.control import nav2d
from rlcourse.control.offline import D4RL_KEYS, build_dataset, episode_slices, load_d4rl_hdf5, save_d4rl_hdf5
from rlcourse.control.poe import (RandomPrior, additive_compose, alpha_to_beta, classify, compose, gaussian_kl,
                                  kl_budget_alpha, kl_reg_compose, paired_bootstrap, poe_compose, train_bc)


def random_gaussians(rng, shape=(4,)):
    return (rng.normal(size=shape), rng.uniform(0.05, 2.0, size=shape),
            rng.normal(size=shape), rng.uniform(0.05, 2.0, size=shape))


# ---------------------------------------------------------------- the alpha-beta identity


@pytest.mark.parametrize("alpha", [0.1, 0.3, 0.5, 0.9])
def test_poe_equals_klreg_mean(alpha):
    rng = np.random.default_rng(0)
    mu_a, var_a, mu_g, var_g = random_gaussians(rng)
    beta = alpha_to_beta(alpha)
    mu_p, var_p = poe_compose(mu_a, var_a, mu_g, var_g, alpha)
    mu_k, var_k = kl_reg_compose(mu_a, var_a, mu_g, var_g, beta)
    np.testing.assert_allclose(mu_p, mu_k, atol=1e-12, rtol=0)
    np.testing.assert_allclose(var_p / var_k, np.full(4, 1.0 + beta), atol=1e-12, rtol=0)
    # and not the trivial identity: the covariances really differ when alpha > 0
    assert np.all(np.abs(var_p - var_k) > 1e-3)


def test_poe_closed_form_is_the_normalised_product():
    """pi_a^(1-alpha) pi_g^alpha, normalised on a fine grid, has the closed-form mean and variance."""
    rng = np.random.default_rng(1)
    mu_a, var_a, mu_g, var_g = random_gaussians(rng, (1,))
    alpha = 0.37
    x = np.linspace(-15, 15, 400001)
    log_dens = ((1 - alpha) * -(x - mu_a) ** 2 / (2 * var_a) + alpha * -(x - mu_g) ** 2 / (2 * var_g))
    w = np.exp(log_dens - log_dens.max())
    w /= w.sum()
    m = float((w * x).sum())
    v = float((w * (x - m) ** 2).sum())
    mu, var = poe_compose(mu_a, var_a, mu_g, var_g, alpha)
    assert abs(m - mu[0]) < 1e-6 and abs(v - var[0]) < 1e-6


def _gauss_objective(mu, log_sd, mu_a, var_a, mu_g, var_g, beta):
    """KL(N(mu, sd^2) || pi_a) - beta * E[log pi_g], in closed form, summed over dimensions."""
    var = torch.exp(2 * log_sd)
    kl = 0.5 * (var / var_a + (mu - mu_a) ** 2 / var_a - 1 - torch.log(var / var_a))
    e_log_g = -0.5 * torch.log(2 * torch.pi * var_g) - ((mu - mu_g) ** 2 + var) / (2 * var_g)
    return (kl - beta * e_log_g).sum()


@pytest.mark.parametrize("alpha", [0.2, 0.6])
def test_poe_is_argmin(alpha):
    """L-BFGS on the KL-regularised objective lands on the closed form (mean = PoE mean)."""
    rng = np.random.default_rng(2)
    mu_a, var_a, mu_g, var_g = random_gaussians(rng)
    beta = alpha_to_beta(alpha)
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in dict(mu_a=mu_a, var_a=var_a, mu_g=mu_g, var_g=var_g).items()}
    mu = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    log_sd = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([mu, log_sd], lr=1, max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-14,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = _gauss_objective(mu, log_sd, beta=beta, **t)
        loss.backward()
        return loss

    opt.step(closure)
    mu_k, var_k = kl_reg_compose(mu_a, var_a, mu_g, var_g, beta)
    mu_p, _ = poe_compose(mu_a, var_a, mu_g, var_g, alpha)
    np.testing.assert_allclose(mu.detach().numpy(), mu_k, atol=1e-6)
    np.testing.assert_allclose(torch.exp(2 * log_sd).detach().numpy(), var_k, rtol=1e-5)
    np.testing.assert_allclose(mu.detach().numpy(), mu_p, atol=1e-6)


def test_balanced_objective_gives_poe_exactly():
    """argmin (1-alpha) KL(pi||pi_a) + alpha KL(pi||pi_g) is the PoE itself, variance included."""
    rng = np.random.default_rng(3)
    mu_a, var_a, mu_g, var_g = random_gaussians(rng)
    alpha = 0.4
    mu = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    log_sd = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    T = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731

    def kl(m, lv, mq, vq):
        v = torch.exp(lv)
        return 0.5 * (v / vq + (m - mq) ** 2 / vq - 1 - torch.log(v / vq)).sum()

    opt = torch.optim.LBFGS([mu, log_sd], lr=1, max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-14,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = (1 - alpha) * kl(mu, 2 * log_sd, T(mu_a), T(var_a)) + alpha * kl(mu, 2 * log_sd, T(mu_g), T(var_g))
        loss.backward()
        return loss

    opt.step(closure)
    mu_p, var_p = poe_compose(mu_a, var_a, mu_g, var_g, alpha)
    np.testing.assert_allclose(mu.detach().numpy(), mu_p, atol=1e-6)
    np.testing.assert_allclose(torch.exp(2 * log_sd).detach().numpy(), var_p, rtol=1e-5)


# ---------------------------------------------------------------- anchoring and the KL budget


def test_anchor():
    rng = np.random.default_rng(4)
    mu_a, var_a, mu_g, _ = random_gaussians(rng)
    alpha = 0.5
    mu, _ = poe_compose(mu_a, var_a, mu_g, np.full(4, 1e12), alpha)      # sigma_g = 1e6
    np.testing.assert_allclose(mu, mu_a, atol=1e-6)
    mu_add, _ = additive_compose(mu_a, var_a, mu_g, np.full(4, 1e12), alpha)
    np.testing.assert_allclose(mu_add - mu_a, alpha * (mu_g - mu_a), atol=1e-12)


def test_anchor_bound_holds_with_equality():
    rng = np.random.default_rng(5)
    for _ in range(50):
        mu_a, var_a, mu_g, var_g = random_gaussians(rng)
        alpha = rng.uniform(0, 1)
        mu, _ = poe_compose(mu_a, var_a, mu_g, var_g, alpha)
        w = alpha / var_g / ((1 - alpha) / var_a + alpha / var_g)
        np.testing.assert_allclose(np.abs(mu - mu_a), w * np.abs(mu_g - mu_a), atol=1e-12)


def test_gaussian_kl_matches_monte_carlo():
    rng = np.random.default_rng(6)
    mu_p, var_p, mu_q, var_q = random_gaussians(rng, (3,))
    x = mu_p + np.sqrt(var_p) * rng.normal(size=(400_000, 3))
    logp = -0.5 * ((x - mu_p) ** 2 / var_p + np.log(2 * np.pi * var_p))
    logq = -0.5 * ((x - mu_q) ** 2 / var_q + np.log(2 * np.pi * var_q))
    mc = (logp - logq).sum(1)
    exact = gaussian_kl(mu_p, var_p, mu_q, var_q)
    assert abs(mc.mean() - exact) < 4 * mc.std() / np.sqrt(len(mc)) + 1e-9
    # a wrong formula (KL the other way round) is far outside that tolerance
    assert abs(gaussian_kl(mu_q, var_q, mu_p, var_p) - exact) > 10 * mc.std() / np.sqrt(len(mc))


def test_kl_monotone():
    rng = np.random.default_rng(7)
    alphas = np.linspace(0, 1, 201)
    for _ in range(20):
        mu_a, var_a, mu_g, var_g = random_gaussians(rng, (64, 2))
        kls = [gaussian_kl(*poe_compose(mu_a, var_a, mu_g, var_g, a), mu_a, var_a) for a in alphas]
        kls = np.stack(kls)                    # (alphas, states): monotone for every state
        assert np.all(np.diff(kls, axis=0) >= -1e-12)
        assert np.allclose(kls[0], 0.0)


def test_kl_derivative_formula():
    """d/d alpha of the variance part of the KL is alpha (rho-1)^2 / (2 r^2) per dimension."""
    var_a, var_g = np.array([0.3]), np.array([1.7])
    rho = var_a / var_g
    for alpha in (0.2, 0.5, 0.8):
        h = 1e-6

        def var_part(al):
            _, v = poe_compose(np.zeros(1), var_a, np.zeros(1), var_g, al)
            return gaussian_kl(np.zeros(1), v, np.zeros(1), var_a)

        fd = (var_part(alpha + h) - var_part(alpha - h)) / (2 * h)
        r = 1 - alpha + alpha * rho
        assert abs(fd - alpha * (rho[0] - 1) ** 2 / (2 * r[0] ** 2)) < 1e-6


def test_kl_budget_alpha_is_the_largest_feasible():
    rng = np.random.default_rng(8)
    mu_a, var_a, mu_g, var_g = random_gaussians(rng, (100, 2))
    eps = 0.3

    def mean_kl(a):
        return gaussian_kl(*poe_compose(mu_a, var_a, mu_g, var_g, a), mu_a, var_a).mean()

    alpha = kl_budget_alpha(mu_a, var_a, mu_g, var_g, eps, tol=1e-6)
    assert 0 < alpha < 1
    assert mean_kl(alpha) <= eps < mean_kl(alpha + 1e-5)
    # a prior equal to the actor never spends the budget
    assert kl_budget_alpha(mu_a, var_a, mu_a, var_a, eps) == 1.0


def test_bad_inputs_raise():
    mu, var = np.zeros(3), np.ones(3)
    with pytest.raises(ValueError, match="shape"):
        poe_compose(mu, var, np.zeros(2), np.ones(2), 0.5)
    with pytest.raises(ValueError, match="var_g"):
        poe_compose(mu, var, mu, -var, 0.5)
    with pytest.raises(ValueError, match="alpha"):
        poe_compose(mu, var, mu, var, 1.5)
    with pytest.raises(ValueError, match="NaN"):
        poe_compose(mu * np.nan, var, mu, var, 0.5)
    with pytest.raises(ValueError, match="unknown composition rule"):
        compose("mixture", mu, var, mu, var, 0.5)
    with pytest.raises(ValueError, match="beta"):
        kl_reg_compose(mu, var, mu, var, -1.0)
    with pytest.raises(ValueError, match="eps"):
        kl_budget_alpha(mu[None], var[None], mu[None], var[None], 0.0)


def test_compose_rules_end_points():
    rng = np.random.default_rng(9)
    mu_a, var_a, mu_g, var_g = random_gaussians(rng)
    for rule in ("poe", "additive"):
        np.testing.assert_allclose(compose(rule, mu_a, var_a, mu_g, var_g, 0.0)[0], mu_a)
        np.testing.assert_allclose(compose(rule, mu_a, var_a, mu_g, var_g, 1.0)[0], mu_g)
    np.testing.assert_allclose(compose("prior", mu_a, var_a, mu_g, var_g)[1], var_g)
    np.testing.assert_allclose(compose("frozen", mu_a, var_a, mu_g, var_g)[1], var_a)


def test_paired_bootstrap_and_classify():
    assert classify(paired_bootstrap(np.zeros(100))) == "FROZEN"
    assert classify(paired_bootstrap(np.ones(100))) == "HELP"
    assert classify(paired_bootstrap(-np.ones(100))) == "HURT"
    rng = np.random.default_rng(0)
    d = rng.choice([-1.0, 0.0, 1.0], size=2000, p=[0.2, 0.5, 0.3])
    lo, hi = paired_bootstrap(d)
    assert lo < 0.1 < hi and hi - lo < 0.1


# ---------------------------------------------------------------- behaviour cloning


def test_bc_fits_a_known_linear_policy():
    rng = np.random.default_rng(10)
    W = np.array([[0.5, -1.0, 0.3], [0.2, 0.4, -0.6]])
    b = np.array([0.1, -0.2])
    obs = rng.normal(size=(4000, 3)).astype(np.float32)
    act = (obs @ W.T + b + 0.1 * rng.normal(size=(4000, 2))).astype(np.float32)
    model = train_bc(obs, act, steps=1500, batch_size=512, lr=0.1, hidden=(), seed=0, min_std=0.01)
    test = rng.normal(size=(500, 3))
    mu, var = model.predict(test)
    np.testing.assert_allclose(mu, test @ W.T + b, atol=0.03)
    np.testing.assert_allclose(np.sqrt(var).mean(0), [0.1, 0.1], rtol=0.15)


def test_random_prior_is_reproducible_and_broad():
    p = RandomPrior(act_dim=2, std=1.0, seed=3)
    a = p.predict(np.zeros((5, 4)))[0]
    p.reset(3)
    np.testing.assert_array_equal(a, p.predict(np.zeros((5, 4)))[0])
    assert np.all(p.predict(np.zeros((5, 4)))[1] == 1.0)


# ---------------------------------------------------------------- the navigation task


def test_env_transitions_follow_the_dynamics():
    env = nav2d.Nav2DEnv()
    data = build_dataset(env, lambda o, r: r.uniform(-1.5, 1.5, 2), 300, seed=0)
    moved = data["next_observations"][:, :2] - np.clip(
        data["observations"][:, :2] + nav2d.STEP_SIZE * np.clip(data["actions"], -1, 1), -1, 1)
    assert np.abs(moved).max() < 6 * nav2d.PROCESS_NOISE          # only the process noise is left
    for sl in episode_slices(data):                                 # the goal is fixed within an episode
        assert np.all(data["observations"][sl, 2:] == data["observations"][sl.start, 2:])


def test_expert_reaches_every_goal_and_random_almost_never():
    rng = np.random.default_rng(0)
    s, g = nav2d.sample_start_goal(rng, 300)
    noise = nav2d.PROCESS_NOISE * rng.normal(size=(nav2d.MAX_STEPS, 300, 2))
    assert nav2d.rollout_batch(lambda o, t: nav2d.expert_action(o), s, g, noise)["success"].all()
    rand = nav2d.rollout_batch(lambda o, t: rng.uniform(-1, 1, (300, 2)), s, g, noise)["success"].mean()
    assert rand < 0.1
    with pytest.raises(ValueError, match="policy returned shape"):
        nav2d.rollout_batch(lambda o, t: np.zeros((300, 3)), s, g, noise)


# ---------------------------------------------------------------- the D4RL layout


def test_hdf5_round_trip(tmp_path):
    env = nav2d.Nav2DEnv()
    data = build_dataset(env, lambda o, r: nav2d.expert_action(o[None])[0] + 0.3 * r.normal(size=2), 500, seed=1)
    path = save_d4rl_hdf5(data, tmp_path / "nav.hdf5")
    with h5py.File(path) as f:
        assert set(D4RL_KEYS) <= set(f.keys()) and "goal" in f["infos"]
    back = load_d4rl_hdf5(path)
    assert set(back) == set(data)
    want = {"observations": (np.float32, (500, 4)), "actions": (np.float32, (500, 2)),
            "rewards": (np.float32, (500,)), "terminals": (np.bool_, (500,)), "timeouts": (np.bool_, (500,))}
    for key, (dtype, shape) in want.items():
        assert back[key].dtype == dtype and back[key].shape == shape, key
        np.testing.assert_array_equal(back[key], data[key])
    np.testing.assert_array_equal(back["infos/goal"], back["observations"][:, 2:])
    assert back["terminals"].sum() > 0 and back["timeouts"][-1]
    np.testing.assert_array_equal(back["rewards"], back["terminals"].astype(np.float32))   # sparse reward
    ends = [sl.stop - 1 for sl in episode_slices(back)]
    assert np.all(back["terminals"][ends] | back["timeouts"][ends])
    # inside an episode, the next observation is the following row's observation
    inner = ~(back["terminals"] | back["timeouts"])[:-1]
    np.testing.assert_array_equal(back["next_observations"][:-1][inner], back["observations"][1:][inner])


def test_loader_accepts_what_d4rl_get_dataset_accepts(tmp_path):
    # D4RL's get_dataset requires only these four keys, squeezes (N, 1) rewards and terminals,
    # and treats timeouts as optional: a file written that way must load.
    path = tmp_path / "d4rl_style.hdf5"
    with h5py.File(path, "w") as f:
        f["observations"] = np.arange(10, dtype=np.float64).reshape(5, 2)
        f["actions"] = np.zeros((5, 1), np.float64)
        f["rewards"] = np.arange(5, dtype=np.float64).reshape(5, 1)       # (N, 1), float64
        f["terminals"] = np.array([[0], [0], [1], [0], [0]], np.float32)  # (N, 1), floats
    data = load_d4rl_hdf5(path)
    assert data["rewards"].shape == (5,) and data["rewards"].dtype == np.float32
    np.testing.assert_array_equal(data["rewards"], np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(data["terminals"], [False, False, True, False, False])
    # no timeouts in the file: the data's end closes the last episode, and nothing else is cut
    np.testing.assert_array_equal(data["timeouts"], [False, False, False, False, True])
    assert [(sl.start, sl.stop) for sl in episode_slices(data)] == [(0, 3), (3, 5)]


def test_missing_required_key_is_named(tmp_path):
    path = tmp_path / "broken.hdf5"
    with h5py.File(path, "w") as f:
        f["observations"] = np.zeros((3, 2), np.float32)
        f["actions"] = np.zeros((3, 1), np.float32)
        f["rewards"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="terminals"):
        load_d4rl_hdf5(path)
    with h5py.File(path, "a") as f:
        f["terminals"] = np.zeros((3, 2), bool)                           # (N, 2) is not (N, 1)
    with pytest.raises(ValueError, match="terminals has shape"):
        load_d4rl_hdf5(path)


def test_validate_rejects_wrong_dtype_and_length(tmp_path):
    data = build_dataset(nav2d.Nav2DEnv(), lambda o, r: np.zeros(2), 20, seed=0)
    bad = dict(data, terminals=data["terminals"].astype(np.float32))
    with pytest.raises(ValueError, match="terminals"):
        save_d4rl_hdf5(bad, tmp_path / "x.hdf5")
    bad = dict(data, rewards=data["rewards"][:-1])
    with pytest.raises(ValueError, match="rewards"):
        save_d4rl_hdf5(bad, tmp_path / "x.hdf5")


def test_minari_layout_is_flattened(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "main_data.hdf5"
    lengths = [4, 6]
    with h5py.File(path, "w") as f:
        for i, T in enumerate(lengths):
            ep = f.create_group(f"episode_{i}")
            obs = ep.create_group("observations")                # a dict observation, as in goal tasks
            obs["observation"] = rng.normal(size=(T + 1, 3))
            obs["desired_goal"] = rng.normal(size=(T + 1, 2))
            ep["actions"] = rng.normal(size=(T, 2))
            ep["rewards"] = rng.normal(size=T)
            ep["terminations"] = np.r_[np.zeros(T - 1, bool), i == 0]
            ep["truncations"] = np.r_[np.zeros(T - 1, bool), i == 1]
    data = load_d4rl_hdf5(path, obs_keys=("observation", "desired_goal"))
    assert data["observations"].shape == (10, 5) and data["observations"].dtype == np.float32
    assert data["terminals"].sum() == 1 and data["timeouts"].sum() == 1
    np.testing.assert_array_equal(data["next_observations"][:3], data["observations"][1:4])
    with pytest.raises(ValueError, match="no observation key 'achieved_goal'"):
        load_d4rl_hdf5(path, obs_keys=("achieved_goal",))


def test_hopper_dataset_builder():
    env = gym.make("Hopper-v5")
    low, high = env.action_space.low, env.action_space.high
    data = build_dataset(env, lambda o, r: r.uniform(low, high).astype(np.float32), 300, seed=0)
    assert data["observations"].shape == (300, 11) and data["actions"].shape == (300, 3)
    assert data["terminals"].any()           # a random hopper falls over
    inner = ~(data["terminals"] | data["timeouts"])[:-1]
    np.testing.assert_array_equal(data["next_observations"][:-1][inner], data["observations"][1:][inner])
    env.close()


def test_lqr_balances_the_double_pendulum_and_noise_grades_it():
    from rlcourse.control.mujoco_cells import evaluate_policy, idp_state, lqr_gain, lqr_policy, make_envs

    K = lqr_gain("InvertedDoublePendulum-v5")
    assert K.shape == (1, 6)
    env = gym.make("InvertedDoublePendulum-v5")
    obs, _ = env.reset(seed=0)
    u = env.unwrapped
    np.testing.assert_allclose(idp_state(obs[None])[0], np.r_[u.data.qpos, u.data.qvel], atol=1e-6)
    envs = make_envs("InvertedDoublePendulum-v5", 3, 200)
    expert = evaluate_policy(envs, lambda o: -(idp_state(o) @ K.T), seed=0)
    assert np.all(expert > 9.0 * 200 * 0.9)            # alive bonus ~9.3 per step: the LQR never falls
    rng = np.random.default_rng(0)
    medium = lqr_policy(K, 0.3)
    noisy = evaluate_policy(envs, lambda o: np.stack([medium(x, rng) for x in o]), seed=0)
    assert noisy.mean() < 0.75 * expert.mean()         # noise of std 0.3 topples it early: the medium grade


def test_balance_cells_smoke():
    from rlcourse.control.mujoco_cells import BALANCE_RULES
    from rlcourse.studies.poe_steering import run_balance_cells
    from rlcourse.profiles import profile

    out = run_balance_cells(profile("smoke"), n_steps=200, bc_steps=5, episodes=2, max_steps=20, kl_states=50)
    assert set(out["score"]) == {"expert|good", "expert|random", "medium|good", "medium|random",
                                 "random|good", "random|random"}
    for cell, d in out["score"].items():
        assert set(d) == set(BALANCE_RULES) and all(len(v) == out["sizes"]["seeds"] for v in d.values())
        assert 0.0 <= out["alpha_kl"][cell][0] <= 1.0
    # frozen ignores the prior; prior-only ignores the actor
    assert out["score"]["expert|good"]["frozen"] == out["score"]["expert|random"]["frozen"]
    assert out["score"]["expert|good"]["prior"] == out["score"]["medium|good"]["prior"]


def test_mujoco_cells_run_end_to_end():
    from rlcourse.control.poe import run_mujoco_cells

    out = run_mujoco_cells("Hopper-v5", n_steps=200, episodes=1, bc_steps=5, max_episode_steps=40)
    assert out["n_transitions"] == 200
    for prior in ("good", "degraded", "random"):
        assert set(out[prior]) == {"frozen", "poe", "additive", "prior"}
        assert all(np.isfinite(v) for v in out[prior].values())
    assert len({out[p]["frozen"] for p in ("good", "degraded", "random")}) == 1   # the frozen actor ignores the prior


def test_poe_studies_cells_stand_alone():
    """A later cell of each grid, run with the others, equals the same cell run alone; a bad arm is named."""
    from dataclasses import replace

    from rlcourse.profiles import profile
    from rlcourse.studies import poe_steering as ps
    from rlcourse.studies.runner import run_study

    nav = ps.nav2d_study(replace(profile("smoke"), toy_seeds=2))
    nav = replace(nav, sizes={**nav.sizes, "n_steps": 300, "bc_steps": 5, "episodes": 4, "kl_states": 50})
    bal = ps.balance_study(profile("smoke"), seeds=2, n_steps=200, bc_steps=5, episodes=2, max_steps=20,
                           kl_states=50)
    for s, run in ((nav, ps.run_nav2d_cell), (bal, ps.run_balance_cell)):
        res = run_study(s, jobs=1, cache=False)
        arm, seed = s.cells()[-1]
        assert seed == 1 and res.metrics[(arm, seed)] == run(arm, seed, dict(s.sizes))
        with pytest.raises(ValueError, match=f"the arms are .*'{s.arms[0]}'"):
            run("no such arm", 0, dict(s.sizes))
