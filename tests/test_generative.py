"""Unit tests of rlcourse.generative: the flow model's math, ParetoSlider's advantages, FDFO's targets."""
import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import rlcourse
from rlcourse.generative import flow as F
from rlcourse.generative import paretoslider as PS
from rlcourse.profiles import one_torch_thread
from rlcourse.studies import paretoslider as PSS


@pytest.fixture(autouse=True)
def _one_thread():
    """These tensors are tiny; one intra-op thread is fastest (and robust on a busy machine)."""
    with one_torch_thread():
        yield


# ------------------------------------------------------------------ flow matching and samplers
def test_linear_path_endpoints_and_velocity():
    g = torch.Generator().manual_seed(0)
    x0, x1 = torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)
    a, u = F.linear_path(x0, x1, torch.zeros(5))
    b, _ = F.linear_path(x0, x1, torch.ones(5))
    assert torch.allclose(a, x0) and torch.allclose(b, x1)
    t, h = torch.full((5,), 0.3), 1e-3
    fd = (F.linear_path(x0, x1, t + h)[0] - F.linear_path(x0, x1, t - h)[0]) / (2 * h)
    assert torch.allclose(fd, u, atol=1e-3)
    with pytest.raises(ValueError):
        F.linear_path(x0, x1[:4], t)
    with pytest.raises(ValueError):
        F.linear_path(x0, x1, torch.full((5,), 1.5))


def test_gaussian_velocity_is_the_regression_of_u_on_xt():
    """E[x1 - x0 | x_t] is linear for Gaussian data; least squares recovers the closed form."""
    g = torch.Generator().manual_seed(1)
    n, mu, s, t = 200_000, torch.tensor([1.5, -0.5]), 0.4, 0.35
    x0 = torch.randn(n, 2, generator=g, dtype=torch.float64)
    x1 = mu.double() + s * torch.randn(n, 2, generator=g, dtype=torch.float64)
    xt, u = F.linear_path(x0, x1, torch.full((n,), t, dtype=torch.float64))
    X = torch.cat([xt, torch.ones(n, 1, dtype=torch.float64)], 1)
    coef = torch.linalg.lstsq(X, u).solution  # (3, 2)
    probe = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    pred = torch.cat([probe, torch.ones(3, 1, dtype=torch.float64)], 1) @ coef
    exact = F.gaussian_velocity(probe, torch.full((3,), t, dtype=torch.float64), mu.double(), s)
    assert torch.allclose(pred, exact, atol=0.02), (pred, exact)


def test_euler_on_constant_and_linear_fields_is_exact():
    x0 = torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.float64)
    c = torch.tensor([0.7, -1.1], dtype=torch.float64)
    out = F.euler_integrate(lambda x, t: c.expand_as(x), x0, steps=7)
    assert torch.allclose(out, x0 + c)
    a, N = -0.8, 10
    out = F.euler_integrate(lambda x, t: a * x, x0, steps=N)
    assert torch.allclose(out, (1 + a / N) ** N * x0)
    # and Euler converges to exp(a) as the grid refines (first order)
    e1 = (F.euler_integrate(lambda x, t: a * x, x0, 50) - math.exp(a) * x0).abs().max()
    e2 = (F.euler_integrate(lambda x, t: a * x, x0, 100) - math.exp(a) * x0).abs().max()
    assert 1.8 < float(e1 / e2) < 2.2
    with pytest.raises(ValueError):
        F.euler_integrate(lambda x, t: x, x0, 0)


def test_exact_gaussian_flow_maps_noise_to_data():
    """Integrating the optimal Gaussian velocity sends x0 to mu + s x0 (the straight OT map)."""
    mu, s = torch.tensor([2.0, -1.0], dtype=torch.float64), 0.5
    x0 = torch.randn(100, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out = F.euler_integrate(lambda x, t: F.gaussian_velocity(x, t, mu, s), x0, steps=1000)
    assert torch.allclose(out, mu + s * x0, atol=5e-3)


def test_score_from_velocity_matches_the_gaussian_score():
    mu, s, t = torch.tensor([1.0, 0.5]), 0.6, 0.4
    x = torch.randn(8, 2, generator=torch.Generator().manual_seed(3))
    tt = torch.full((8,), t)
    v = F.gaussian_velocity(x, tt, mu, s)
    var = (1 - t) ** 2 + t**2 * s**2
    assert torch.allclose(F.score_from_velocity(x, v, tt), -(x - t * mu) / var, atol=1e-5)


def test_sde_sampler_preserves_the_marginals():
    """Euler-Maruyama with the score correction ends at N(mu, s^2) like the ODE does."""
    mu, s = torch.tensor([1.0, -1.0]), 0.5
    field = lambda x, t, c=None: F.gaussian_velocity(x, t, mu, s)  # noqa: E731
    x0 = torch.randn(20_000, 2, generator=torch.Generator().manual_seed(4))
    traj = F.sample_sde(field, x0, steps=100, noise=1.2, generator=torch.Generator().manual_seed(5))
    x = traj.xs[-1]
    assert torch.allclose(x.mean(0), mu, atol=0.03)
    assert torch.allclose(x.std(0), torch.full((2,), s), atol=0.03)
    # the noise really is there: the SDE path is not the ODE path
    ode = F.euler_integrate(lambda x, t: field(x, t), x0, 100)
    assert (x - ode).abs().mean() > 0.1


def test_gaussian_step_logprob_matches_torch_distributions():
    g = torch.Generator().manual_seed(6)
    mean, x = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    std = torch.rand(4, 1, generator=g) + 0.1
    ref = torch.distributions.Normal(mean, std.expand_as(mean)).log_prob(x).sum(1)
    assert torch.allclose(F.gaussian_step_logprob(x, mean, std), ref, atol=1e-5)
    with pytest.raises(ValueError):
        F.gaussian_step_logprob(x, mean, std[:, 0])
    with pytest.raises(ValueError):
        F.gaussian_step_logprob(x, mean, -std)


def test_recorded_logprob_is_the_density_of_the_recorded_step():
    model = F.VelocityMLP(2, 16, 2)
    x0 = torch.randn(6, 2, generator=torch.Generator().manual_seed(7))
    traj = F.sample_sde(model, x0, 5, noise=0.7, generator=torch.Generator().manual_seed(8))
    k = 2
    with torch.no_grad():
        v = model(traj.xs[k], traj.ts[k].expand(6))
        mean, std = F.sde_step_moments(v, traj.xs[k], traj.ts[k].expand(6), 0.2, 0.7)
    assert torch.allclose(traj.logp[k], F.gaussian_step_logprob(traj.xs[k + 1], mean, std), atol=1e-5)
    assert torch.allclose(traj.vs[k], v)


def test_conditioning_is_ignored_at_initialisation_and_shapes_are_checked():
    model = F.VelocityMLP(2, 16, 3, cond_dim=1)
    x, t = torch.randn(4, 2), torch.rand(4)
    assert torch.allclose(model(x, t, torch.rand(4, 1)), model(x, t))
    with pytest.raises(ValueError):
        model(x, t, torch.rand(4, 2))
    with pytest.raises(ValueError):
        model(x, t[:3])
    with pytest.raises(ValueError):
        F.VelocityMLP(2, 16, 3)(x, t, torch.rand(4, 1))


def test_load_flow_survives_two_processes_building_the_same_model(tmp_path, monkeypatch):
    """Two study workers that build one flow model at once each save and rename their own file: here the
    second process (a different pid) saves and renames between the first one's save and its rename, the
    interleaving that once made a book-profile grid fail with FileNotFoundError."""
    monkeypatch.setenv("RLCOURSE_CACHE", str(tmp_path))
    recipe_prof = rlcourse.profile("smoke")
    untrained = lambda recipe: (F.VelocityMLP(2, recipe.hidden, recipe.layers, recipe.cond_dim), [0.0])
    monkeypatch.setattr(F, "pretrain_flow", untrained)
    real_save, calls = torch.save, []

    def save_then_let_the_other_process_finish(obj, path):
        real_save(obj, path)
        calls.append(str(path))
        if len(calls) == 1:  # the other worker, whose whole build happens now
            with monkeypatch.context() as m:
                m.setattr(F.os, "getpid", lambda: 999_999)
                F.load_flow("ring", recipe_prof)

    monkeypatch.setattr(F.torch, "save", save_then_let_the_other_process_finish)
    model, info = F.load_flow("ring", recipe_prof)
    assert len(calls) == 2 and calls[0] != calls[1]
    assert [p.name for p in (tmp_path / "flows").iterdir()] == [Path(info["path"]).name]


# ------------------------------------------------------------------ ParetoSlider
def test_preference_sampler_simplex_and_frequencies():
    g = torch.Generator().manual_seed(0)
    w = PS.sample_preferences(100_000, 3, g)
    assert (w >= 0).all() and torch.allclose(w.sum(1), torch.ones(len(w)))
    nonzero = (w > 0).sum(1)
    freq = [float((nonzero == k).float().mean()) for k in (1, 2, 3)]
    assert abs(freq[0] - 0.50) < 0.02 and abs(freq[1] - 0.35) < 0.02 and abs(freq[2] - 0.15) < 0.02, freq
    w2 = PS.sample_preferences(50_000, 2, g, min_weight=0.1)
    assert torch.allclose(w2.sum(1), torch.ones(len(w2))) and w2.min() >= 0.1 - 1e-7
    assert abs(float(w2[:, 0].mean()) - 0.5) < 0.01
    with pytest.raises(ValueError):
        PS.sample_preferences(10, 1)


def _group_z(r, index, eps=1e-4):
    out = torch.empty_like(r)
    for gid in torch.unique(index):
        m = index == gid
        out[m] = (r[m] - r[m].mean(0)) / (r[m].std(0, unbiased=False) + eps)
    return out


def test_late_scalarisation_definition_scale_invariance_and_vertices():
    g = torch.Generator().manual_seed(1)
    index = torch.arange(3).repeat_interleave(6)
    r = torch.randn(18, 2, generator=g)
    w = PS.sample_preferences(3, 2, g).repeat_interleave(6, 0)
    a = PS.late_scalarised_advantages(r, w, index, batch_norm=False)
    assert torch.allclose(a, (_group_z(r, index) * w).sum(1), atol=1e-5)
    # scaling one reward by any c > 0 changes nothing (up to the eps in the denominator)
    scaled = r * torch.tensor([1.0, 37.0])
    assert torch.allclose(PS.late_scalarised_advantages(scaled, w, index), PS.late_scalarised_advantages(r, w, index),
                          atol=1e-3)
    # early scalarisation is not scale invariant
    assert not torch.allclose(PS.early_scalarised_advantages(scaled, w, index),
                              PS.early_scalarised_advantages(r, w, index), atol=1e-2)
    # omega = e_1: the advantage of objective 1 alone, batch-normalised
    e1 = torch.tensor([[1.0, 0.0]]).expand(18, 2)
    z1 = _group_z(r, index)[:, 0]
    ref = (z1 - z1.mean()) / (z1.std(unbiased=False) + 1e-4)
    assert torch.allclose(PS.late_scalarised_advantages(r, e1, index), ref, atol=1e-4)


def test_late_scalarisation_is_monotone_in_the_weight():
    """Before batch normalisation, dA_i / d omega_1 = z_i1 - z_i2 (linear in the weight)."""
    g = torch.Generator().manual_seed(2)
    index = torch.zeros(8, dtype=torch.long)
    r = torch.randn(8, 2, generator=g)
    z = _group_z(r, index)
    grid = torch.linspace(0, 1, 11)
    A = torch.stack([PS.late_scalarised_advantages(r, torch.tensor([[w, 1 - w]]).expand(8, 2), index,
                                                   batch_norm=False) for w in grid])
    slope = (A[1:] - A[:-1]) / 0.1
    assert torch.allclose(slope, (z[:, 0] - z[:, 1]).expand_as(slope), atol=1e-4)


def test_advantage_inputs_are_checked():
    r, index = torch.randn(4, 2), torch.tensor([0, 0, 1, 1])
    w = torch.tensor([[0.3, 0.7], [0.3, 0.7], [0.5, 0.5], [0.5, 0.5]])
    with pytest.raises(ValueError, match="mixes"):
        PS.late_scalarised_advantages(r, torch.tensor([[0.3, 0.7], [0.4, 0.6], [0.5, 0.5], [0.5, 0.5]]), index)
    with pytest.raises(ValueError, match="sum to 1"):
        PS.late_scalarised_advantages(r, w * 2, index)
    with pytest.raises(ValueError, match="G >= 2"):
        PS.late_scalarised_advantages(r, w, torch.tensor([0, 1, 2, 2]))
    with pytest.raises(ValueError, match="NaN"):
        PS.late_scalarised_advantages(r.index_put((torch.tensor([0]),), torch.tensor([float("nan")])), w, index)


def test_amortised_gaussian_policy_recovers_the_per_weight_optimum():
    """max_phi E_omega[omega_1 J1 + omega_2 J2] with J_j = -||mu - a_j||^2 gives mu(omega) = omega_1 a + omega_2 b."""
    torch.manual_seed(0)
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([-1.0, 0.5])
    net = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(800):
        w = PS.sample_preferences(64, 2, g)
        mu = net(w[:, :1])
        J = -w[:, 0] * ((mu - a) ** 2).sum(1) - w[:, 1] * ((mu - b) ** 2).sum(1)
        opt.zero_grad()
        (-J.mean()).backward()
        opt.step()
    grid = torch.linspace(0, 1, 9)[:, None]
    with torch.no_grad():
        assert torch.allclose(net(grid), grid * a + (1 - grid) * b, atol=0.05)


def test_hypervolume_2d_closed_forms():
    assert PS.hypervolume_2d(np.array([[2.0, 3.0]]), (0.0, 0.0)) == pytest.approx(6.0)
    pts = np.array([[2.0, 1.0], [1.0, 2.0]])
    assert PS.hypervolume_2d(pts, (0.0, 0.0)) == pytest.approx(3.0)
    assert PS.hypervolume_2d(np.vstack([pts, [[0.5, 0.5]]]), (0.0, 0.0)) == pytest.approx(3.0)
    # Monte Carlo: fraction of the box [0,3]^2 dominated by the front
    rng = np.random.default_rng(0)
    front = np.array([[2.5, 0.5], [2.0, 1.5], [1.0, 2.2], [0.3, 2.9]])
    u = rng.uniform(0, 3, size=(200_000, 2))
    dom = ((u[:, None, :] <= front[None]).all(-1)).any(1)
    assert PS.hypervolume_2d(front, (0.0, 0.0)) == pytest.approx(9 * dom.mean(), abs=0.05)
    with pytest.raises(ValueError):
        PS.hypervolume_2d(np.zeros(3), (0.0, 0.0))


def test_nft_optimum_zeroes_the_gradient_and_loss_reduces_to_flow_matching():
    g = torch.Generator().manual_seed(3)
    u, v_old, r, beta = torch.randn(50, 2, generator=g), torch.randn(2, generator=g), torch.rand(50, generator=g), 0.7
    v = PS.nft_optimum(u, v_old, r, beta).clone().requires_grad_(True)
    vp, vn = (1 - beta) * v_old + beta * v, (1 + beta) * v_old - beta * v
    loss = (r[:, None] * (vp - u) ** 2 + (1 - r[:, None]) * (vn - u) ** 2).mean()
    (grad,) = torch.autograd.grad(loss, v)
    assert grad.abs().max() < 1e-5
    # with theta = old, the NFT loss is the flow-matching loss of the samples divided by beta
    model = F.VelocityMLP(2, 16, 2, cond_dim=1)
    x1, adv, cond = torch.randn(32, 2, generator=g), torch.randn(32, generator=g), torch.rand(32, 1, generator=g)
    nft = PS.nft_loss(model, copy.deepcopy(model), x1, adv, cond, beta=beta, generator=torch.Generator().manual_seed(9))
    fm = F.flow_matching_loss(model, x1, cond, generator=torch.Generator().manual_seed(9))
    assert torch.allclose(nft, fm / beta, atol=1e-5)


# ------------------------------------------------------------------ FDFO
from rlcourse.generative import fdfo as FD  # noqa: E402


def test_fd_targets_match_their_definition():
    g = torch.Generator().manual_seed(0)
    x1, x2 = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    R1, R2 = torch.randn(4, generator=g), torch.randn(4, generator=g)
    dR, u = FD.fd_flow_targets(x1, x2, R1, R2)
    for p in range(4):
        dx = (x1[p] - x2[p]) / 2
        up = dx / ((dx**2).mean() + 1e-6)
        assert torch.allclose(dR[p], (R1[p] - R2[p]) / 2) and torch.allclose(dR[4 + p], -(R1[p] - R2[p]) / 2)
        assert torch.allclose(u[p], up) and torch.allclose(u[4 + p], -up)
    with pytest.raises(ValueError):
        FD.fd_flow_targets(x1, x2[:3], R1, R2)
    with pytest.raises(ValueError):
        FD.fd_flow_targets(x1, x2, R1, R2.index_put((torch.tensor([0]),), torch.tensor(float("nan"))))


def test_pair_estimator_is_unbiased_for_a_linear_reward():
    """E[dR u] = w for R(x) = w.x and isotropic pair differences, in any dimension."""
    for D in (2, 5):
        g = torch.Generator().manual_seed(D)
        w = torch.randn(D, generator=g, dtype=torch.float64)
        x1 = torch.randn(200_000, D, generator=g, dtype=torch.float64)
        x2 = torch.randn(200_000, D, generator=g, dtype=torch.float64)
        dR, u = FD.fd_flow_targets(x1, x2, x1 @ w, x2 @ w, eps=0.0)
        est = (dR[:, None] * u).mean(0)
        assert torch.allclose(est, w, atol=0.02 * float(w.norm()) + 0.01), (est, w)


def test_pairing_reduces_the_variance_of_the_reward_difference():
    """Proposition fd-prop-pairing on the sampler: two runs from the same initial noise (independent
    sampler noise) have positively correlated rewards, so Var[R1 - R2] is smaller than for two
    independent runs, by the factor 1 - c of the proposition."""
    model = F.VelocityMLP(2, 32, 2)
    z = torch.randn(4000, 2, generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        paired = F.sample_sde(model, torch.cat([z, z]), 8, 0.5, generator=gen).xs[-1]
        indep = F.sample_sde(model, torch.randn(8000, 2, generator=gen), 8, 0.5, generator=gen).xs[-1]
    Rp, Ri = FD.ring_reward(paired), FD.ring_reward(indep)
    c = float(np.corrcoef(Rp[:4000], Rp[4000:])[0, 1])
    var_p, var_i = float((Rp[:4000] - Rp[4000:]).var()), float((Ri[:4000] - Ri[4000:]).var())
    assert c > 0.3, c
    assert var_p < 0.8 * var_i, (var_p, var_i)
    assert var_p == pytest.approx(2 * float(Rp.var()) * (1 - c), rel=0.1)


def test_spo_surrogate_optimum():
    rho = torch.linspace(0.9, 1.1, 20001, dtype=torch.float64)
    for dR, eps in [(0.7, 0.03), (-0.2, 0.05), (2.0, 0.01)]:
        f = FD.spo_surrogate(torch.full_like(rho, dR), rho, eps)
        best = float(rho[torch.argmin(f)])
        assert abs(best - (1 + eps * np.sign(dR))) < 2e-5


def test_fdfo_loss_is_the_spo_surrogate_of_the_pseudo_ratio():
    g = torch.Generator().manual_seed(1)
    model = F.VelocityMLP(3, 16, 2)
    x, t = torch.randn(6, 3, generator=g), torch.rand(6, generator=g)
    v_ref, u, dR = torch.randn(6, 3, generator=g), torch.randn(6, 3, generator=g), torch.randn(6, generator=g)
    with torch.no_grad():
        v = model(x, t)
        v_tgt = v_ref + u
        rho = torch.exp(-((v - v_tgt) ** 2).mean(1) + (u**2).mean(1))
        ref = (-dR * rho + dR.abs() / (2 * 0.03) * (rho - 1) ** 2).mean()
        assert torch.allclose(FD.fdfo_loss(model, x, t, v_ref, u, dR, 0.03), ref, atol=1e-5)
        # at v_theta = v_ref the pseudo-ratio is exactly 1
        assert torch.allclose(FD.fdfo_loss(lambda a, b, c=None: v_ref, x, t, v_ref, u, dR, 0.03), -dR.mean())


class _ConstantField(torch.nn.Module):
    """v_theta(x, t) = theta: the Euler endpoint is x0 + theta (+ noise)."""
    def __init__(self, dim):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(dim))
        self.dim = dim

    def forward(self, x, t, cond=None):
        return self.theta.expand_as(x)


def test_one_fdfo_step_moves_the_endpoint_towards_the_better_sample():
    model = _ConstantField(2)
    x_better, x_worse = torch.tensor([[1.0, 0.5]]), torch.tensor([[-0.5, 0.2]])
    dR, u = FD.fd_flow_targets(x_better, x_worse, torch.tensor([1.0]), torch.tensor([0.0]))
    K = 4
    xs, ts = torch.zeros(2 * K, 2), torch.arange(K).float().div(K).repeat_interleave(2)
    loss = FD.fdfo_loss(model, xs, ts, torch.zeros(2 * K, 2), u.repeat(K, 1), dR.repeat(K), 0.03)
    loss.backward()
    before = F.euler_integrate(lambda x, t: model(x, t), torch.zeros(1, 2), K).detach()
    with torch.no_grad():
        model.theta -= 0.01 * model.theta.grad
    after = F.euler_integrate(lambda x, t: model(x, t), torch.zeros(1, 2), K).detach()
    assert float(((after - before) * (x_better - x_worse)).sum()) > 0


def test_ddpo_ratio_is_one_at_the_sampling_policy_and_gradient_matches_reinforce():
    model = F.VelocityMLP(2, 16, 2)
    traj = F.sample_sde(model, torch.randn(8, 2, generator=torch.Generator().manual_seed(2)), 4, noise=0.8,
                        generator=torch.Generator().manual_seed(3))
    x, t, _, x_next, old = FD._rows(traj)
    with torch.no_grad():
        assert torch.allclose(FD.step_logprob(model, x, t, x_next, 0.25, 0.8), old, atol=1e-5)
    adv = torch.randn(len(x), generator=torch.Generator().manual_seed(4))
    loss = FD.ddpo_loss(model, x, t, x_next, old, adv, 0.25, 0.8)
    g1 = torch.autograd.grad(loss, model.out.weight)[0]
    reinforce = -(adv * FD.step_logprob(model, x, t, x_next, 0.25, 0.8)).mean()
    g2 = torch.autograd.grad(reinforce, model.out.weight)[0]
    assert torch.allclose(g1, g2, atol=1e-5)


def test_digits_classifier_is_a_calibrated_probability_model():
    clf = F.digits_classifier()
    X, y = F.digits_data()
    p = clf.predict_proba(X.numpy())
    assert p.shape == (len(y), 10) and np.allclose(p.sum(1), 1.0)
    assert (p.argmax(1) == y).mean() > 0.95
    with pytest.raises(ValueError):
        clf.predict_proba(np.zeros((3, 63)))


def test_verdict_functions_pair_the_arms_by_seed():
    hv = {"hv_cond": np.array([1.0, 1.1, 1.2, 1.0, 1.05]), "hv_fixed": np.array([1.0, 1.0, 1.1, 1.0, 1.0]),
          "hv_fixed_eq": np.array([0.5, 0.6, 0.55, 0.5, 0.6]), "hv_early": np.array([0.9, 1.0, 1.1, 0.9, 1.0])}
    v = PSS.paretoslider_verdicts(hv)
    assert v["matches"].method_values == pytest.approx((hv["hv_cond"] / hv["hv_fixed"]).tolist())
    assert v["matches"].verdict == "holds" and v["equal-calls"].verdict == "holds"
    assert v["late-vs-early"].effect == pytest.approx(0.09) and v["late-vs-early"].verdict == "holds"
    res = {t: {"fdfo": {"auc": np.array([0.5, 0.6, 0.7, 0.6, 0.5])},
               "pg": {"auc": np.array([0.6, 0.71, 0.79, 0.7, 0.6])}} for t in ("digits", "ring")}
    fv = FD.fdfo_verdicts(res)
    assert fv["ring"].verdict == "does not hold" and fv["ring"].effect == pytest.approx(-0.1)
