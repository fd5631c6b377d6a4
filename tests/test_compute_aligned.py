"""Compute-aligned training: the operators, their gradients and the unbiased per-sample weights.

Identities are checked against closed forms and finite differences (float64), the operators against
Monte Carlo with tolerances that can fail, and the estimators' expectations by enumerating every
group of samples (``M**N`` sequences).
"""
import itertools
import re
from math import comb

import numpy as np
import pytest
import torch

import rlcourse
from rlcourse.claims import evaluate
from scipy import stats

from rlcourse.advantages import get_estimator, place_on_last_token
from rlcourse.metrics import best_of_k, maj_at_k, pass_at_k
from rlcourse.methods import compute_aligned as C
from rlcourse.methods import poly_epo
from rlcourse.testtime import exact_best_of_k


def test_passk_grad_fd():
    """Autograd gradient of 1-(1-p)^k on a softmax bandit (correct set S) equals central differences,
    and equals k(1-p)^(k-1) grad p."""
    torch.manual_seed(0)
    z = torch.randn(7, dtype=torch.float64, requires_grad=True)
    S = torch.tensor([0, 3])
    k = 5
    J = lambda z: C.passk_objective(torch.softmax(z, 0)[S].sum(), k)  # noqa: E731
    (g,) = torch.autograd.grad(J(z), z)
    h, fd = 1e-6, torch.zeros(7, dtype=torch.float64)
    for i in range(7):
        e = torch.zeros(7, dtype=torch.float64)
        e[i] = h
        fd[i] = (J(z.detach() + e) - J(z.detach() - e)) / (2 * h)
    assert torch.allclose(g, fd, rtol=1e-5, atol=1e-10)
    zz = z.detach().clone().requires_grad_(True)
    p = torch.softmax(zz, 0)[S].sum()
    (gp,) = torch.autograd.grad(p, zz)
    assert torch.allclose(g, C.passk_weight(p.detach(), k) * gp, rtol=1e-10)


def test_passk_estimator_unbiased():
    """The mean of 1 - C(n-c,k)/C(n,k) over 1e5 simulated groups equals 1-(1-p)^k within 3 standard
    errors; its exact expectation (binomial sum) equals it to 1e-12; the plug-in estimator is biased."""
    rng = np.random.default_rng(0)
    n, k, p = 16, 8, 0.1
    c = rng.binomial(n, p, size=100_000)
    table = np.array([pass_at_k(n, int(ci), k) for ci in range(n + 1)])
    est = table[c]
    truth = C.passk_objective(p, k)
    assert abs(est.mean() - truth) < 3 * est.std() / np.sqrt(len(est))
    exact = sum(stats.binom.pmf(ci, n, p) * table[ci] for ci in range(n + 1))
    assert abs(exact - truth) < 1e-12
    plug = sum(stats.binom.pmf(ci, n, p) * (1 - (1 - ci / n) ** k) for ci in range(n + 1))
    assert truth - plug > 0.05  # the test can tell a biased estimator


def test_grpo_implicit_weight():
    """E[(r - p)/sqrt(p(1-p)) grad log pi] = grad p / sqrt(p(1-p)) on a softmax bandit (exact sums)."""
    z = torch.tensor([0.3, -1.0, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    r = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    pi = torch.softmax(z, 0)
    p = float((pi * r).sum().detach())
    A = (r - p) / np.sqrt(p * (1 - p))
    (g,) = torch.autograd.grad((pi.detach() * A * torch.log_softmax(z, 0)).sum(), z)
    (gp,) = torch.autograd.grad((torch.softmax(z, 0) * r).sum(), z)
    assert torch.allclose(g, gp * C.grpo_weight(p), rtol=1e-10)


def test_bon_operator_sums_to_one():
    """The best-of-N operator is a distribution, equals exact_best_of_k with distinct scores, puts
    tied outcomes in proportion to their probability, and matches a 1e6-draw histogram."""
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(6))
    scores = np.array([0.2, 1.0, 0.5, 1.0, -0.3, 0.7])  # outcomes 1 and 3 tie
    N = 4
    T = C.bon_operator(probs, scores, N)
    assert abs(T.sum() - 1) < 1e-12 and (T >= 0).all()
    assert abs(T[1] / T[3] - probs[1] / probs[3]) < 1e-12
    distinct = np.array([0.2, 1.0, 0.5, 1.1, -0.3, 0.7])
    for y in range(6):
        onehot = (np.arange(6) == y).astype(float)
        assert abs(C.bon_operator(probs, distinct, N)[y] - exact_best_of_k(distinct, onehot, probs, N)) < 1e-12
    draws = rng.choice(6, size=(1_000_000, N), p=probs)
    s = scores[draws]
    best = s.max(1, keepdims=True)
    first_best = np.argmax(s == best, axis=1)  # ties by position: uniform over tied draws
    counts = np.bincount(draws[np.arange(len(draws)), first_best], minlength=6)
    assert stats.chisquare(counts, T * len(draws)).pvalue > 0.01
    with pytest.raises(ValueError, match="same length"):
        C.bon_operator(probs, scores[:3], N)


def test_majority_operator():
    """The exact plurality distribution (enumerated compositions, N <= 9, uniform ties) is a
    distribution and matches Monte Carlo; maj_objective picks its correct-answer entry."""
    rng = np.random.default_rng(2)
    q = torch.tensor(rng.dirichlet(np.ones(4) * 2))
    for N in (1, 2, 5, 9):
        T = C.majority_operator(q, N)
        assert abs(float(T.sum()) - 1) < 1e-12
        draws = rng.choice(4, size=(200_000, N), p=q.numpy())
        counts = np.stack([(draws == a).sum(1) for a in range(4)], 1)
        win = counts == counts.max(1, keepdims=True)
        mc = (win / win.sum(1, keepdims=True)).mean(0)
        se = np.sqrt(T.numpy() * (1 - T.numpy()) / len(draws)) + 1e-12
        assert np.all(np.abs(mc - T.numpy()) < 4 * se + 1e-9), (N, mc, T)
        assert abs(float(C.maj_objective(q[None], [2], N)[0]) - float(T[2])) < 1e-12
    assert len(C.compositions(9, 4)) == comb(12, 3)
    with pytest.raises(ValueError, match="sum to 1"):
        C.majority_operator(torch.tensor([0.5, 0.6]), 3)


def test_maj_partials_match_autograd_and_pivot_structure():
    """dJ/dq_a = N E f(N'+e_a) equals autograd of the maj@N polynomial; wrong answers lose only
    through the pivotal event, so the correct answer's partial is the largest and a wrong answer that
    is never within one vote of the correct one has the partial N E f(N')."""
    q = torch.tensor([0.35, 0.3, 0.2, 0.15], dtype=torch.float64, requires_grad=True)
    for N in (3, 4, 7):
        J = C.maj_objective(q[None], [0], N)[0]
        (g,) = torch.autograd.grad(J, q)
        part = C.maj_partials(q.detach(), 0, N)
        assert np.allclose(g.numpy(), part, rtol=1e-9, atol=1e-12)
        assert part[0] >= part[1:].max() - 1e-12
        assert part[1] <= part[3] + 1e-12  # the stronger wrong answer is penalised more
    # an answer of probability ~0 is never pivotal: its partial is N * maj@(N-1)
    q0 = torch.tensor([0.5, 0.5 - 1e-15, 1e-15], dtype=torch.float64)
    N = 5
    part = C.maj_partials(q0, 0, N)
    assert abs(part[2] - N * float(C.maj_objective(q0[None], [0], N - 1)[0])) < 1e-9


def test_bon_marginals_match_enumerated_subsets():
    """The closed form of the best-of-k marginals equals the mean over enumerated subsets, for real
    rewards and a separate selector, and for 0/1 rewards with the reward as selector it is N/k times
    PKPO's weights; k = 1 gives the rewards (and the loo estimator RLOO)."""
    torch.manual_seed(3)
    G, N = 3, 7
    r = torch.rand(G, N, dtype=torch.float64)
    s = torch.rand(G, N, dtype=torch.float64)
    for k in (1, 2, 3, 6):
        m = C.bon_marginals(r, s, k)
        members = poly_epo.subsets(N, k)
        top = s[:, members].argmax(-1)                          # (G, C)
        vals = torch.gather(r[:, members], 2, top[..., None])[..., 0]
        inside = torch.zeros(len(members), N, dtype=torch.float64).scatter_(1, members, 1.0)
        assert torch.allclose(m, vals @ inside / comb(N - 1, k - 1), atol=1e-12)
    correct = (torch.rand(G, N) < 0.4).double()
    k = 3
    assert torch.allclose(C.bon_marginals(correct, correct, k) * k / N,
                          poly_epo.pkpo_effective_rewards(correct, k), atol=1e-12)
    assert torch.allclose(C.bon_marginals(r, s, 1), r)


def test_best_of_n_estimator_equals_set_max_and_rloo():
    """The registered best_of_n (selector = reward, loo) equals Poly-EPO's set_max with the loo baseline
    unnormalised, and with k = 1 it equals RLOO times (N-1)/N ... exactly RLOO's r_i - mean_others."""
    torch.manual_seed(4)
    B, N = 12, 6
    mask = torch.ones(B, 3)
    r = torch.rand(B)
    tlr = place_on_last_token(r, mask)
    index = torch.arange(B) // N
    ours, _ = get_estimator("best_of_n")(tlr, mask, index, subset_size=3)
    theirs, _ = get_estimator("set_max")(tlr, mask, index, subset_size=3, baseline="loo", normalize=False)
    assert torch.allclose(ours, theirs, atol=1e-6)
    k1, _ = get_estimator("best_of_n")(tlr, mask, index, subset_size=1)
    rloo, _ = get_estimator("rloo")(tlr, mask, index)
    assert torch.allclose(k1, rloo, atol=1e-6)


def _expected_gradient(estimator, probs_logits, rewards_of, answers_of, N, k, **kw):
    """Exact E[(1/N) sum_i A_i grad log pi(y_i)] of a registered estimator over all M**N groups."""
    z = probs_logits
    pi = torch.softmax(z, 0)
    M = len(z)
    total = torch.zeros(M, dtype=torch.float64)
    mask = torch.ones(N, 1)
    for seq in itertools.product(range(M), repeat=N):
        seq = list(seq)
        w = float(torch.prod(pi[seq]))
        tlr = place_on_last_token(torch.tensor([rewards_of[y] for y in seq], dtype=torch.float32), mask)
        batch = type("B", (), {"texts": [answers_of[y] for y in seq]})()
        adv, _ = get_estimator(estimator)(tlr, mask, torch.zeros(N, dtype=torch.long), batch=batch,
                                          subset_size=k, **kw)
        for i, y in enumerate(seq):
            total += w * float(adv[i, 0]) * ((torch.arange(M) == y).double() - pi) / N
    return total


def test_aligned_estimators_are_unbiased():
    """Enumerating every group of N samples of a 3-outcome softmax: best_of_n's expected update is
    grad J_k / k with J_k = E[max of k rewards] (exact_best_of_k), and maj_at_k's is grad maj@k / k,
    both with the leave-one-out baseline; the 'all' baseline is biased (a test that can fail)."""
    z = torch.tensor([0.2, -0.4, 0.6], dtype=torch.float64)
    N, k = 4, 2
    rewards = [1.0, 0.0, 0.5]
    zz = z.clone().requires_grad_(True)
    pi = torch.softmax(zz, 0)
    order = np.argsort(rewards)
    srt = torch.tensor(np.array(rewards)[order])
    cdf = torch.cumsum(pi[order], 0)
    Jk = ((cdf**k - (cdf - pi[order])**k) * srt).sum()          # E max of k rewards
    assert abs(float(Jk) - exact_best_of_k(rewards, rewards, pi.detach().numpy(), k)) < 1e-12
    (gJ,) = torch.autograd.grad(Jk, zz)
    got = _expected_gradient("best_of_n", z, rewards, ["a", "b", "c"], N, k)
    assert torch.allclose(got, gJ / k, atol=2e-7), (got, gJ / k)
    # majority vote: outcomes 0 and 2 give the same (correct) answer "7", outcome 1 a wrong "3"
    rewards_v, answers = [1.0, 0.0, 1.0], ["7", "3", "7"]
    zz = z.clone().requires_grad_(True)
    pi = torch.softmax(zz, 0)
    q = torch.stack([pi[0] + pi[2], pi[1]])[None]
    (gM,) = torch.autograd.grad(C.maj_objective(q, [0], k)[0], zz)
    got = _expected_gradient("maj_at_k", z, rewards_v, answers, N, k)
    assert torch.allclose(got, gM / k, atol=2e-7), (got, gM / k)
    biased = _expected_gradient("maj_at_k", z, rewards_v, answers, N, k, baseline="all")
    assert not torch.allclose(biased, gM / k, atol=1e-4)


def test_majority_marginals_and_vote_values():
    """vote_values: the plurality answer's reward, ties averaged; the marginals agree with metrics.maj_at_k
    (the mean of the marginals over i is the U-statistic maj@k of the group)."""
    r = torch.tensor([[1.0, 0.0, 1.0, 0.0, 0.0, 1.0]])
    codes = torch.tensor([[0, 1, 0, 2, 1, 0]])
    members = torch.tensor([[0, 1], [1, 4], [0, 3], [1, 3]])
    assert torch.allclose(C.vote_values(r, codes, members), torch.tensor([[0.5, 0.0, 0.5, 0.0]], dtype=torch.float64))
    k = 3
    m = C.majority_marginals(r, codes, k, baseline="none")
    answers = ["7", "3", "7", "5", "3", "7"]
    # metrics.maj_at_k breaks ties by first appearance; averaged over subsets of an exchangeable
    # sample the two conventions agree in expectation, and here no 3-subset ties between 7 and another
    assert abs(float(m.mean()) - maj_at_k(answers, "7", k)) < 0.2
    exact = float(C.vote_values(r, codes, poly_epo.subsets(6, k)).mean())
    assert abs(float(m.mean()) - exact) < 1e-12


def test_final_answer_and_refusals():
    assert C.final_answer(" 31|13 ") == "13" and C.final_answer("abc ") == "abc"
    mask = torch.ones(4, 2)
    tlr = place_on_last_token(torch.tensor([1.0, 0.0, 1.0, 0.0]), mask)
    batch = type("B", (), {"texts": ["1|1", "2|2", "1|1", "3|3"]})()
    with pytest.raises(ValueError, match="subset_size"):
        get_estimator("maj_at_k")(tlr, mask, torch.zeros(4, dtype=torch.long), batch=batch, subset_size=4)
    with pytest.raises(ValueError, match="texts"):
        get_estimator("maj_at_k")(tlr, mask, torch.zeros(4, dtype=torch.long), batch=type("B", (), {"texts": ["a"]})())
    with pytest.raises(ValueError, match="selector"):
        get_estimator("best_of_n")(tlr, mask, torch.zeros(4, dtype=torch.long), selector="oracle")
    with pytest.raises(ValueError, match="num_generations"):
        get_estimator("best_of_n")(tlr, mask, torch.arange(4))
    with pytest.raises(ValueError, match="max_subsets"):
        C.majority_marginals(torch.zeros(1, 30), torch.zeros(1, 30, dtype=torch.long), 15)
    with pytest.raises(ValueError, match="arm"):
        C.bandit_objective("sft", torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), 2)


def test_normalised_passk_is_grpo_for_binary_rewards():
    """With 0/1 rewards, pass@k advantages divided by the group std are GRPO's up to the mean shift:
    the per-prompt weight, the whole effect of pass@k training, is what normalisation removes."""
    mask = torch.ones(12, 1)
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    tlr = place_on_last_token(r, mask)
    index = torch.arange(12) // 4
    a, _ = get_estimator("best_of_n")(tlr, mask, index, subset_size=2, normalize=True)
    g, _ = get_estimator("grpo")(tlr, mask, index)
    for rows in (slice(0, 4), slice(4, 8)):
        da, dg = a[rows, 0] - a[rows, 0].mean(), g[rows, 0]
        assert torch.allclose(da / da.std(), dg / dg.std(), atol=1e-5)
    # a group that pass@2 already solves from any 3 of its 4 samples is switched off (GRPO's is not)
    assert torch.all(a[8:, 0] == 0) and torch.any(g[8:, 0] != 0)


def test_bandit_step_runs_and_metrics_are_exact():
    cfg = C.BanditConfig(prompts=5, steps=3, budget=0.3, every=1)
    out = C.train_bandit("maj@k", cfg, 0)
    logits, correct = C.make_bandit(cfg, 0)
    p = torch.softmax(logits, -1)[torch.arange(5), correct]
    assert np.allclose(out["start"]["pass"][C.PASS_KS.index(8)], float((1 - (1 - p) ** 8).mean()))
    assert out["curve"].shape == (4, 4)
    for arm in C.BANDIT_ARMS:
        assert C.train_bandit(arm, cfg, 1)["final"]["pass"].shape == (len(C.PASS_KS),)


def test_select_hard_keeps_rarely_solved_prompts():
    correct = np.array([[0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 0, 0]])
    assert C.select_hard(correct, 0.25).tolist() == [1, 4]
    assert C.select_hard(correct, 0.5).tolist() == [1, 2, 4]
    with pytest.raises(ValueError, match="hi"):
        C.select_hard(correct, 1.0)
    with pytest.raises(ValueError, match="prompts, samples"):
        C.select_hard(np.zeros(3))


def test_lm_pass_claim_is_gated_on_the_difference_control():
    sz = C.lm_sizes(rlcourse.profile("smoke"))
    ctrl = C.lm_control_claim(sz, 1e-4)
    assert ctrl.role == "positive control" and ctrl.key == C.LM_CONTROL_KEY
    out = {"sizes": sz, "seconds": 0.0, "lr": 1e-4, "base": {"pass": [0.1] * 4, "maj": [0.1] * 3},
           "curves": {a: [{"pass": [0.2, 0.3, 0.4, 0.5], "maj": [0.2, 0.2, 0.2]}] for a in C.LM_ARMS}}
    v_ctrl = evaluate(ctrl, [0.5], [0.4])  # one seed: inconclusive, so the gated claim is uninformative
    assert C.lm_verdicts(out, control=v_ctrl)["pass"].verdict == "uninformative"
    assert C.lm_verdicts(out)["pass"].verdict == "inconclusive"


def _without_timing(m: dict) -> dict:
    return {k: v for k, v in m.items() if "seconds" not in k}


def test_bandit_study_cell_alone_equals_the_grid_and_bad_arms_are_named():
    """A later cell of the bandit grid, run alone, gives the numbers the runner gave it."""
    from rlcourse.studies import compute_aligned as study
    from rlcourse.studies.runner import run_study

    s = study.bandit_study(rlcourse.profile("smoke"), C.BanditConfig(prompts=20, steps=6, every=2), seeds=2)
    res = run_study(s, jobs=1, cache=False)
    arm, seed = s.cells()[-1]
    assert (arm, seed) == ("maj@k", 1)
    assert _without_timing(res.metrics[(arm, seed)]) == _without_timing(study.run_bandit_cell(arm, seed, dict(s.sizes)))
    with pytest.raises(ValueError, match="the arms are .*'pass@k'"):
        study.run_bandit_cell("sft", 0, dict(s.sizes))


def test_lm_studies_cell_alone_equals_the_grid_and_bad_arms_are_named():
    """A later cell of the language-model grid and of the control grid, each run alone, gives the numbers
    the runner gave it (each cell loads its own base model)."""
    from rlcourse.studies import compute_aligned_lm as lm
    from rlcourse.studies.runner import run_study

    P = rlcourse.profile("smoke")
    s = lm.lm_study(P, arms=["standard (RLOO)", "pass@k-aligned"], seeds=2)
    res = run_study(s, jobs=1, cache=False)
    arm, seed = s.cells()[-1]
    assert (arm, seed) == ("pass@k-aligned", 1) and len(res.metrics[(arm, seed)]["reward"]) == s.sizes["steps"]
    assert _without_timing(res.metrics[(arm, seed)]) == _without_timing(lm.run_lm_cell(arm, seed, dict(s.sizes)))
    c = lm.control_study(P, {"train": [0, 1, 2], "test": [3, 4]}, seeds=2)
    res = run_study(c, jobs=1, cache=False)
    arm, seed = c.cells()[-1]
    assert res.metrics[(arm, seed)] == lm.run_lm_control_cell(arm, seed, dict(c.sizes))
    for run, sizes, name in ((lm.run_lm_cell, s.sizes, "maj@k-aligned"), (lm.run_lm_control_cell, c.sizes, "pass@k"),
                             (lm.run_lm_base_cell, lm.lm_base_study(P).sizes, "base model"),
                             (lm.run_pools_cell, lm.pools_study(P).sizes, "hard prompts")):
        with pytest.raises(ValueError, match=f"the arms are .*'{re.escape(name)}"):
            run("no such arm", 0, dict(sizes))
