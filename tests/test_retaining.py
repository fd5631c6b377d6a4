"""Unit tests of the retaining-by-doing chapter's math and parts (rlcourse.methods.retaining) and of its
experiments' pieces (rlcourse.studies.retaining)."""
import math

import numpy as np
import pytest
import torch

import rlcourse
from rlcourse.advantages import get_estimator
from rlcourse.losses import get_policy_loss
from rlcourse.methods import retaining as R
from rlcourse.studies import retaining as RS
from rlcourse.tasks import Addition, Example, Sort, Task


def test_gaussian_kl_closed_form_against_monte_carlo():
    rng = np.random.default_rng(0)
    for mp, sp, mq, sq in [(0.0, 1.0, 1.0, 2.0), (-3.0, 1.0, 3.5, 0.7), (0.5, 0.7, 3.5, 0.7)]:
        x = rng.normal(mp, sp, 400_000)
        mc = np.mean(np.log(R.normal_pdf(x, mp, sp)) - np.log(R.normal_pdf(x, mq, sq)))
        exact = R.gaussian_kl(mp, sp, mq, sq)
        assert abs(mc - exact) < 0.02 * max(1.0, exact)
    assert R.gaussian_kl(1.0, 2.0, 1.0, 2.0) == pytest.approx(0.0)
    # forward and reverse KL differ: the asymmetry behind mode covering vs mode seeking
    assert R.gaussian_kl(0, 1, 0, 3) != pytest.approx(R.gaussian_kl(0, 3, 0, 1))


def _torch_mixture_logq(x, th):
    pi1, mu1, s1, mu2, s2 = th
    n = lambda m, s: torch.exp(-0.5 * ((x - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))  # noqa: E731
    return torch.log(pi1 * n(mu1, s1) + (1 - pi1) * n(mu2, s2)), n(mu2, s2)


def test_mixture_score_matches_autograd():
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, 3.0, 50)
    theta = np.array([0.6, -2.0, 1.2, 1.5, 0.8])
    th = torch.tensor(theta, dtype=torch.float64, requires_grad=True)
    logq, _ = _torch_mixture_logq(torch.tensor(x), th)
    logq.mean().backward()
    setting = R.TwoModeSetting()
    assert np.allclose(R.sft_gradient(x, theta, setting), th.grad.numpy(), atol=1e-6)
    q, score = R.mixture_score(x, theta)
    assert np.allclose(q, np.exp(logq.detach().numpy()), rtol=1e-10)


def test_rl_gradient_is_the_gradient_of_the_importance_weighted_reward():
    setting = R.TwoModeSetting()
    theta = np.array([0.7, -3.2, 1.1, 1.0, 0.9])
    x = np.random.default_rng(2).normal(theta[3], theta[4], 64)
    th = torch.tensor(theta, dtype=torch.float64, requires_grad=True)
    xt = torch.tensor(x)
    logq, q2 = _torch_mixture_logq(xt, th)
    q2d = q2.detach()
    r = (torch.log(torch.tensor(R.normal_pdf(x, setting.new_mu, setting.new_sigma))) - torch.log(setting.beta * q2d))
    (r * torch.exp(logq) / q2d).mean().backward()  # d/dtheta of mean(r q / q2), r and q2 fixed
    assert np.allclose(R.rl_gradient(x, theta, setting), th.grad.numpy(), atol=1e-6)


def test_single_gaussian_score_matches_autograd():
    x = np.random.default_rng(3).normal(0, 2, 30)
    th = torch.tensor([0.3, 1.4], dtype=torch.float64, requires_grad=True)
    logq = -0.5 * ((torch.tensor(x) - th[0]) / th[1]) ** 2 - torch.log(th[1])
    logq.mean().backward()
    assert np.allclose(R.sft_gradient(x, th.detach().numpy(), RS.SINGLE_MODE), th.grad.numpy(), atol=1e-8)


def test_sft_lowers_the_old_weight_on_new_data():
    # the mixture-weight derivative (N1 - N2)/q is negative wherever N2 > N1: SFT on new data shrinks pi1
    setting = R.TwoModeSetting()
    x = np.random.default_rng(4).normal(setting.new_mu, setting.new_sigma, 2000)
    g = R.sft_gradient(x, np.asarray(setting.init), setting)
    assert g[0] < -3.0  # about -1/(1 - pi1) = -4 while the new component explains the data alone


def test_overlap_is_one_for_the_target_and_in_unit_interval():
    s = R.TwoModeSetting()
    target = np.array([s.old_weight, s.old_mu, s.old_sigma, s.new_mu, s.new_sigma])
    old, new = R.mode_overlap(target, s)
    assert old == pytest.approx(1.0, abs=1e-3) and new == pytest.approx(1.0, abs=1e-3)
    old, new = R.mode_overlap(np.asarray(s.init), s)
    assert old == pytest.approx(2 * 0.5 * math.erfc(0.25 / math.sqrt(2)), abs=2e-3)  # two unit Gaussians 0.5 apart
    assert 0 <= new < 0.1


def test_rl_forgets_less_than_sft_at_matched_gain_in_the_two_mode_toy():
    s = R.TwoModeSetting()
    drops = {}
    for name, (method, lr) in RS.TOY_ARMS.items():
        drop, reached = RS.drop_at_gain(RS.simulate(s, method, lr, seed=0), 0.9)
        assert reached, name
        drops[name] = drop
    # recorded 2026-12-02: SFT lr 0.15 0.122, SFT lr 0.01 0.052, RL 0.022
    assert drops["RL, lr 0.01"] < drops["SFT, lr 0.01"] < drops["SFT, lr 0.15"]


def test_drop_at_gain_reads_the_first_crossing():
    run = {"old": np.array([0.8, 0.7, 0.6, 0.5]), "new": np.array([0.0, 0.5, 0.95, 0.99])}
    assert RS.drop_at_gain(run, 0.9) == (pytest.approx(0.2), True)
    assert RS.drop_at_gain(run, 1.5) == (pytest.approx(0.3), False)


def test_kl_tilted_keeps_ratios_among_equally_rewarded_answers():
    rng = np.random.default_rng(5)
    pi0 = rng.dirichlet(np.ones(6))
    r = np.array([1, 1, 0, 1, 0, 0], float)
    for beta in (0.05, 0.5, 5.0):
        pi = R.kl_tilted(pi0, r, beta)
        assert pi.sum() == pytest.approx(1.0)
        assert pi[0] / pi[1] == pytest.approx(pi0[0] / pi0[1]) and pi[3] / pi[0] == pytest.approx(pi0[3] / pi0[0])
        # and it maximises E[r] - beta KL: no random distribution does better
        obj = lambda p: p @ r - beta * np.sum(p * np.log(p / pi0))  # noqa: E731
        assert all(obj(pi) >= obj(rng.dirichlet(np.ones(6))) - 1e-12 for _ in range(200))
    with pytest.raises(ValueError, match="beta"):
        R.kl_tilted(pi0, r, 0.0)


def test_self_sft_estimator_values_and_errors():
    est = get_estimator("self_sft")
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)
    tlr = torch.zeros(3, 3)
    tlr[0, 1], tlr[1, 2], tlr[2, 0] = 1.0, 0.0, 1.0
    adv, ret = est(tlr, mask, torch.tensor([0, 0, 1]))
    assert torch.equal(adv, torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.float32))
    with pytest.raises(ValueError, match="differ"):
        est(tlr[:, :2], mask)


def test_self_sft_with_pg_is_sft_on_the_accepted_rows():
    """The proposition of the chapter: pg loss with self_sft advantages (seq-mean-token-mean) has the
    gradient of (accepted / B) times the SFT loss (seq-mean-token-mean) of the accepted rows."""
    torch.manual_seed(0)
    B, T, V = 6, 4, 5
    logits = torch.randn(B, T, V, requires_grad=True)
    ids = torch.randint(V, (B, T))
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]],
                        dtype=torch.float32)
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    last = mask.sum(1).long() - 1
    tlr = torch.zeros(B, T)
    tlr[torch.arange(B), last] = scores
    adv, _ = get_estimator("self_sft")(tlr, mask)
    logp = torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1)
    loss, _ = get_policy_loss("pg")(logp.detach(), logp, adv, mask, loss_agg_mode="seq-mean-token-mean")
    g1, = torch.autograd.grad(loss, logits, retain_graph=True)
    keep = scores == 1
    sft = (-(logp * mask).sum(1) / mask.sum(1))[keep].mean() * keep.float().mean()
    g2, = torch.autograd.grad(sft, logits)
    assert torch.allclose(g1, g2, atol=1e-7)


def test_external_labels_keep_the_graded_answer():
    ex = Addition().examples(20, seed=0)
    ext = RS.external_labels(ex)
    task = Addition()
    for e, x in zip(ex, ext):
        assert task.score(x.solution, x).reward == 1.0 and x.solution != e.solution or len(e.answer) == 1
        assert x.solution.replace(" ", "") == e.solution
    with pytest.raises(ValueError, match="addition demonstrations"):
        RS.external_labels(Sort().examples(2, seed=0))


class _AlwaysRight(Task):
    name = "always_right_test"

    def _draw(self, rng):
        return Addition()._draw(rng)

    def score(self, completion, example):
        from rlcourse.tasks import Score
        return Score(1.0, "correct")


class _NeverRight(_AlwaysRight):
    def score(self, completion, example):
        from rlcourse.tasks import Score
        return Score(0.0, "wrong")


def test_own_correct_samples_keeps_the_models_text(smoke_addition_model=None):
    from rlcourse.lm.zoo import load_base_model

    model, tok = load_base_model("addition", prof=rlcourse.profile("smoke"), progress=False)
    ex = Addition().examples(3, seed=0)
    data, rate = R.own_correct_samples(model, tok, _AlwaysRight(), ex, 2, 6, torch.Generator().manual_seed(0))
    assert rate == 1.0 and len(data) == 6 and [d.prompt for d in data] == [e.prompt for e in ex for _ in range(2)]
    with pytest.raises(ValueError, match="no self-SFT data"):
        R.own_correct_samples(model, tok, _NeverRight(), ex, 2, 6)


def test_drop_at_matched_gain_interpolates_and_flags():
    base = {"add": 0.2, "sort": 0.9}
    run = {"add": np.array([0.2, 0.3, 0.5]), "sort": np.array([0.9, 0.8, 0.4])}
    d, ok = RS.drop_at_matched_gain(0.2, [run], base)  # gain 0.2 lies halfway from 0.1 to 0.3
    assert ok and d == pytest.approx(0.3)
    other = {"add": np.array([0.2, 0.5, 0.5]), "sort": np.array([0.9, 0.85, 0.8])}
    assert RS.drop_at_matched_gain(0.2, [run, other], base)[0] == pytest.approx(0.9 - (0.9 + 2 / 3 * (0.85 - 0.9)))
    assert RS.drop_at_matched_gain(0.9, [run], base) == (pytest.approx(0.5), False)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="method"):
        RS.simulate(R.TwoModeSetting(), "dpo", 0.1)
    with pytest.raises(ValueError, match="family"):
        R.TwoModeSetting(family="three")
    with pytest.raises(ValueError, match="parameters"):
        R.TwoModeSetting(init=(0.5, 0.0))
    with pytest.raises(ValueError, match=r"\(5,\)"):
        R.mixture_score(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="unknown arms"):
        RS.run_lm_experiment(rlcourse.profile("smoke"), arms=("PPO",))


def test_lm_experiment_runs_in_smoke():
    res = RS.run_lm_experiment(rlcourse.profile("smoke"), arms=("SFT, high lr", "Self-SFT, low lr", "GRPO"))
    E = len(res["steps"])
    for a, c in res["curves"].items():
        assert c["add"].shape == c["sort"].shape == (1, E)
    t = RS.matched_gain_table({**res, "curves": {**res["curves"]}})
    assert t["grpo"].shape == (1,)


def test_studies_cells_stand_alone():
    """A later cell of each grid, run with the others, equals the same cell run alone; a bad arm is
    refused with the arms named."""
    from rlcourse.studies.runner import run_study

    for study, run in ((RS.toy_study(2, R.TwoModeSetting(iters=20, n_samples=50)), RS.run_toy_cell),
                       (RS.lm_study(rlcourse.profile("smoke"), arms=("SFT, high lr", "GRPO"), seeds=2), RS.run_lm_cell)):
        res = run_study(study, jobs=1, cache=False)
        arm, seed = study.cells()[-1]
        assert seed == 1
        assert res.metrics[(arm, seed)] == run(arm, seed, dict(study.sizes))
        with pytest.raises(ValueError, match=f"the arms are .*{arm}"):
            run("no such arm", 0, dict(study.sizes))
    with pytest.raises(ValueError, match="the arms are .*'base model'"):
        RS.run_lm_base_cell("GRPO", 0, dict(RS.lm_base_study(rlcourse.profile("smoke")).sizes))
