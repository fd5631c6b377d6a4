"""SPS: the softmax policy gradient by finite differences, the shared-strategy squeezing gradient
against autograd and its flow, tabular MaxEnt IRL's fixed point (the demonstration histogram; uniform
over de-duplicated demonstrations), pass@k from a success rate against the unbiased estimator by Monte
Carlo, the IRL reward and its fixed point, the schedule, and the registered reward in the Trainer
(phases, de-duplicated demonstrations in the state, exact resume); the studies' cells stand alone."""
import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlcourse.metrics import pass_at_k
from rlcourse.methods.sps import (BanditConfig, SPSReward, irl_reward, make_sps_reward, maxent_irl_tabular,
                                  pass_at_k_from_q, phase_of, shared_strategy_flow, shared_strategy_objective,
                                  softmax, softmax_pg, train_bandit)
from rlcourse.rewards import REWARDS
from rlcourse.tasks import Example


def test_softmax_pg_matches_finite_differences():
    rng = np.random.default_rng(0)
    z, r = rng.normal(size=6), rng.random(6)
    J = lambda z: softmax(z) @ r  # noqa: E731
    h = 1e-6
    fd = np.array([(J(z + h * e) - J(z - h * e)) / (2 * h) for e in np.eye(6)])
    np.testing.assert_allclose(softmax_pg(z, r), fd, atol=1e-6)
    with pytest.raises(ValueError, match="same shape"):
        softmax_pg(z, r[:3])


def test_rich_get_richer_between_two_correct_trajectories():
    # d/dt (z_i - z_j) = (pi_i - pi_j)(1 - J) for two correct trajectories i, j
    z, r = np.array([0.5, 0.0, -1.0]), np.array([1.0, 1.0, 0.0])
    g, pi = softmax_pg(z, r), softmax(z)
    assert abs((g[0] - g[1]) - (pi[0] - pi[1]) * (1 - pi @ r)) < 1e-12 and g[0] > g[1]


@pytest.mark.parametrize("c1", [0.8, 0.5, 0.3])
def test_shared_strategy_gradient_against_autograd(c1):
    z = torch.tensor([0.3, -0.2], dtype=torch.float64, requires_grad=True)
    pi = torch.softmax(z, 0)
    (pi[0] * c1 + pi[1] * (1 - c1)).backward()
    J, g = shared_strategy_objective(z.detach().numpy(), c1)
    np.testing.assert_allclose(g, z.grad.numpy(), atol=1e-12)
    p = pi.detach().numpy()
    assert abs(g[0] - p[0] * p[1] * (2 * c1 - 1)) < 1e-12 and abs(g[0] + g[1]) < 1e-12
    with pytest.raises(ValueError, match="c1"):
        shared_strategy_objective(z.detach().numpy(), 1.5)


def test_shared_strategy_flow_squeezes_the_minority_strategy():
    pi2 = shared_strategy_flow(0.8, lr=5.0, steps=2000)
    assert np.all(np.diff(pi2) < 0) and pi2[-1] < 1e-3
    # pass@16 on the c2 prompts (solved by s2 alone) falls to ~0 while pass@1 over all prompts rises
    p16_c2 = pass_at_k_from_q(pi2, 16)
    pass1 = 0.8 * (1 - pi2) + 0.2 * pi2
    assert p16_c2[0] > 0.99 and p16_c2[-1] < 0.02 and pass1[-1] > pass1[0] + 0.29


def test_maxent_irl_recovers_the_histogram_and_dedup_gives_uniform():
    counts = np.array([5.0, 1.0, 0.0, 2.0])
    phi = maxent_irl_tabular(counts, steps=4000, lr=2.0)
    assert np.abs(softmax(phi) - counts / counts.sum()).sum() < 1e-3
    dedup = (counts > 0).astype(float)
    p = softmax(maxent_irl_tabular(dedup, steps=4000, lr=2.0))
    assert np.abs(p - dedup / dedup.sum()).sum() < 1e-3
    with pytest.raises(ValueError):
        maxent_irl_tabular(np.zeros(3))


@pytest.mark.parametrize("q,k", [(0.1, 8), (0.3, 4), (0.05, 16)])
def test_pass_at_k_from_q_matches_the_unbiased_estimator(q, k):
    rng = np.random.default_rng(1)
    n, trials = 32, 4000
    est = np.array([pass_at_k(n, int(c), k) for c in rng.binomial(n, q, size=trials)])
    # the unbiased estimator's mean is 1 - (1 - q)^k; five standard errors of the Monte Carlo mean
    assert abs(est.mean() - pass_at_k_from_q(q, k)) < 5 * est.std() / math.sqrt(trials)
    with pytest.raises(ValueError):
        pass_at_k_from_q(1.2, 2)


def test_irl_reward_values_and_fixed_point():
    logp = torch.tensor([math.log(0.5), math.log(0.25), math.log(0.25), -1.0])
    in_d = torch.tensor([True, True, True, False])
    n = torch.tensor([3, 3, 3, 3])
    r = irl_reward(logp, in_d, n, r_min=-3.0, r_max=3.0)
    expected = torch.tensor([-math.log(3) - math.log(0.5), -math.log(3) - math.log(0.25),
                             -math.log(3) - math.log(0.25), -3.0])
    torch.testing.assert_close(r, expected.float())
    # at pi = p_D (uniform over the 3 demos) every demonstration's reward is 0
    torch.testing.assert_close(irl_reward(torch.full((3,), -math.log(3)), in_d[:3], n[:3]), torch.zeros(3),
                               atol=1e-6, rtol=0)
    # the clipped objective f(m) = -m log m + r_min (1 - m) over the mass m on D peaks at m = 1 iff r_min < -1
    m = np.linspace(1e-6, 1, 10001)
    for r_min, at_one in ((-3.0, True), (-0.5, False)):
        f = -m * np.log(m) + r_min * (1 - m)
        assert (np.argmax(f) == len(m) - 1) == at_one
    with pytest.raises(ValueError, match="in_demos"):
        irl_reward(logp, in_d, torch.tensor([0, 3, 3, 3]))
    with pytest.raises(ValueError, match="r_min"):
        irl_reward(logp, in_d, n, r_min=1.0, r_max=0.0)
    with pytest.raises(ValueError, match=r"\(B,\)"):
        irl_reward(logp[:2], in_d, n)


def test_phase_schedule():
    assert [phase_of(i, 2, 3) for i in range(6)] == ["rl", "rl", "irl", "irl", "irl", "rl"]
    assert all(phase_of(i, 4, 0) == "rl" for i in range(9))
    with pytest.raises(ValueError):
        phase_of(0, 0, 1)


class _Batch(SimpleNamespace):
    def __len__(self):
        return len(self.texts)


def test_sps_reward_phases_and_dedup():
    ex = Example(prompt="1 2 3>6:", answer="6", solution="1+2+3")
    reward = SPSReward(n_rl=1, n_irl=1, r_min=-3.0, r_max=3.0)
    state = {}
    texts = ["1+2+3", "1+2+3", "3+2+1", "1*2"]
    logp = [math.log(0.4), math.log(0.4), math.log(0.1), -2.0]
    b = _Batch(texts=texts, logprobs=torch.tensor(logp)[:, None], response_mask=torch.ones(4, 1), metrics={})
    r1 = reward(b, [ex] * 4, _task(), state)
    torch.testing.assert_close(r1, torch.tensor([1.0, 1.0, 1.0, 0.0]))
    assert state["sps"]["demos"] == {ex.prompt: ["1+2+3", "3+2+1"]} and b.metrics["sps_irl_phase"] == 0.0
    b.metrics = {}
    r2 = reward(b, [ex] * 4, _task(), state)  # the IRL phase: log(1/2) - log pi for demos, r_min otherwise
    torch.testing.assert_close(r2, torch.tensor([-math.log(2) - math.log(0.4)] * 2 + [-math.log(2) - math.log(0.1),
                                                                                      -3.0]))
    assert b.metrics["sps_irl_phase"] == 1.0 and b.metrics["sps_demos"] == 2.0 and state["sps"]["calls"] == 2
    assert "sps" in REWARDS.names()
    with pytest.raises(ValueError):
        SPSReward(n_rl=0)


def _task():
    from rlcourse.tasks import get_task
    return get_task("countdown")


@pytest.fixture(scope="module")
def smoke_model():
    from rlcourse.lm.zoo import load_base_model
    from rlcourse.profiles import profile
    return load_base_model("addition", prof=profile("smoke"), progress=False)


def _trainer(model, tok, steps, **kw):
    from rlcourse.train import RLConfig, Trainer

    cfg = RLConfig(num_generations=4, prompts_per_step=2, max_completion_length=6, steps=steps, progress=False,
                   seed=3, learning_rate=1e-3, reward=make_sps_reward(n_rl=2, n_irl=1), **kw)
    from rlcourse.tasks import get_task
    pool = get_task("addition").examples(3, seed=0, split="train", distinct=True)
    return Trainer(copy.deepcopy(model), tok, "addition", cfg, train_examples=pool)


def test_sps_reward_in_the_trainer_resumes_exactly(smoke_model, tmp_path):
    model, tok = smoke_model
    from rlcourse.profiles import one_torch_thread
    with one_torch_thread():
        a = _trainer(model, tok, 5, output_dir=str(tmp_path / "a"), save_every=2)
        a.train(steps=2)
        b = _trainer(model, tok, 5, output_dir=str(tmp_path / "a"), save_every=2)
        b.__init__(b.model, tok, "addition", b.config, train_examples=b.train_pool, resume=True)
        b.train()
        ref = _trainer(model, tok, 5)
        ref.train()
    assert [m["sps_irl_phase"] for m in ref.history] == [0.0, 0.0, 1.0, 0.0, 0.0]
    for p, q in zip(b.model.parameters(), ref.model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert b.state["sps"] == ref.state["sps"] and b.state["sps"]["calls"] == 5
    assert [m["reward"] for m in b.history] == [m["reward"] for m in ref.history]


def test_bandit_grpo_squeezes_and_irl_keeps_the_minority_strategy():
    cfg = BanditConfig(steps=120, eval_every=40)
    g, s = train_bandit("grpo", cfg, 0), train_bandit("sps", cfg, 0)
    assert g["pi2"][-1] < 0.05 and g["passk"][-1] < g["passk"][0] - 0.05 and g["pass1"][-1] > g["pass1"][0] + 0.2
    assert s["pi2"][-1] > g["pi2"][-1] and s["irl"].sum() == 60 and g["irl"].sum() == 0
    with pytest.raises(ValueError, match="method"):
        train_bandit("ppo", cfg, 0)


def test_bandit_study_cells_stand_alone():
    """A later cell of the bandit's grid, run with the others, equals the same cell run alone; a bad arm
    is named."""
    import rlcourse
    from rlcourse.studies import sps as study
    from rlcourse.studies.runner import run_study

    s = study.bandit_study(rlcourse.profile("smoke"), BanditConfig(steps=20, eval_every=10), seeds=3)
    res = run_study(s, jobs=1, cache=False)
    arm, seed = s.cells()[-1]
    assert (arm, seed) == ("SPS", 2)
    assert res.metrics[(arm, seed)] == study.run_cell(arm, seed, dict(s.sizes))
    assert res.metrics[(arm, seed)]["steps"] == [0, 10, 20]
    with pytest.raises(ValueError, match="the arms are .*'SPS'"):
        study.run_cell("no such arm", 0, dict(s.sizes))


def test_lm_study_cells_stand_alone():
    """A later cell of the language-model grid equals the same cell run alone (the loop's timings aside);
    a bad arm is named."""
    import rlcourse
    from rlcourse.studies import sps as study
    from rlcourse.studies.runner import run_study

    def untimed(m):
        return {**m, "history": [{k: v for k, v in h.items() if not (k.startswith("time_") or k.endswith("seconds"))}
                                 for h in m.get("history", [])]}

    s = study.lm_study(rlcourse.profile("smoke"), seeds=2, steps=2)
    res = run_study(s, jobs=1, cache=False)
    arm, seed = s.cells()[-1]
    assert (arm, seed) == ("SPS", 1)
    assert untimed(res.metrics[(arm, seed)]) == untimed(study.run_lm_cell(arm, seed, dict(s.sizes)))
    assert res.metrics[("base model", 0)]["before"] == res.metrics[("base model", 1)]["before"]
    with pytest.raises(ValueError, match="the arms are .*'base model'"):
        study.run_lm_cell("no such arm", 0, dict(s.sizes))
