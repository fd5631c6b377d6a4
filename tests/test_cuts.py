"""CUTS / Mixed-CUTS: the candidate set (contains the argmax, at most exp(H) tokens, greedy when
peaked), CUTS's draws (inside C_t, uniform there by a chi-square test), its KL bound, the mixed
group's non-degeneracy probability and reward variance against Monte Carlo, the vanishing GRPO
advantage, the off-policy direction of a softmax bandit, the cuts_is loss, the registered sampler
in the Trainer, and the study's cells."""
import math

import numpy as np
import pytest
import torch

import rlcourse
from rlcourse.advantages import compute_grpo_outcome_advantage, place_on_last_token
from rlcourse.losses import compute_policy_loss
from rlcourse.methods.cuts import (best_split, candidate_mask, compute_cuts_is_loss, cuts_probs, explore_rows,
                                   importance_ratio, mixed_proposal, mixed_reward_variance,
                                   nondegenerate_probability, softmax_pg_direction, zero_variance_share)
from rlcourse.profiles import one_torch_thread
from rlcourse.tasks import get_task


def random_logits(seed=0, B=200, V=12, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, V, generator=g, dtype=torch.float64) * scale


def test_typical_set_holds_the_argmax_and_at_most_exp_entropy_tokens():
    logits = random_logits()
    mask = candidate_mask(logits)
    p = torch.softmax(logits, -1)
    H = -(p * p.log()).sum(-1)
    assert mask.gather(-1, logits.argmax(-1, keepdim=True)).all()
    assert (mask.sum(-1) >= 1).all() and (mask.sum(-1) <= H.exp() + 1e-9).all()
    # every member has p >= exp(-H), every non-member less
    assert (p[mask] >= (-H)[:, None].expand_as(p)[mask].exp() - 1e-12).all()
    assert (p[~mask] < (-H)[:, None].expand_as(p)[~mask].exp()).all()
    # the top-k cap and the top_k rule
    capped = candidate_mask(logits, "typical", top_k=2)
    assert (capped.sum(-1) <= 2).all() and (capped <= mask).all()
    assert (candidate_mask(logits, "top_k", top_k=3).sum(-1) == 3).all()
    with pytest.raises(ValueError, match="rule"):
        candidate_mask(logits, "nucleus")
    with pytest.raises(ValueError, match="top_k"):
        candidate_mask(logits, "top_k", top_k=0)


def test_peaked_distribution_gives_greedy_and_uniform_gives_everything():
    peaked = torch.full((3, 10), -30.0)
    peaked[torch.arange(3), torch.tensor([4, 0, 9])] = 5.0
    q = cuts_probs(peaked)
    assert torch.equal(q.argmax(-1), peaked.argmax(-1)) and torch.allclose(q.max(-1).values, torch.ones(3))
    flat = torch.zeros(2, 7)
    assert candidate_mask(flat).all()  # H = log 7: every token has p = exp(-H)


def test_cuts_kl_and_entropy_bounds():
    """H(q) = log|C| <= H(p) and KL(q || p) <= H(p) - log|C| (members have -log p <= H)."""
    logits = random_logits(1)
    p = torch.softmax(logits, -1)
    H = -(p * p.log()).sum(-1)
    q = cuts_probs(logits).double()
    n = (q > 0).sum(-1).double()
    kl = torch.where(q > 0, q * (q.clamp_min(1e-300).log() - p.log()), torch.zeros_like(q)).sum(-1)
    assert (n.log() <= H + 1e-9).all() and (kl <= H - n.log() + 1e-9).all() and (kl >= -1e-12).all()


def test_cuts_draws_stay_inside_the_set_and_are_uniform_there():
    logits = torch.tensor([[2.0, 2.0, 2.0, -1.0, -3.0, -5.0]])
    mask = candidate_mask(logits)[0]
    k = int(mask.sum())
    assert k == 3
    n = 100_000
    draws = torch.multinomial(cuts_probs(logits)[0], n, replacement=True, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=6).double()
    assert counts[~mask].sum() == 0
    expected = n / k
    chi2 = float(((counts[mask] - expected) ** 2 / expected).sum())
    assert chi2 < 13.8  # the 0.999 quantile of chi-square with k - 1 = 2 degrees of freedom


def test_nondegenerate_probability_and_variance_match_monte_carlo():
    rng = np.random.default_rng(0)
    n = 200_000
    for p_e, p_x, G_e, G_x in [(0.95, 0.6, 4, 4), (0.9, 0.9, 8, 0), (0.99, 0.3, 6, 2), (0.5, 0.2, 1, 3)]:
        r = np.concatenate([rng.random((n, G_e)) < p_e, rng.random((n, G_x)) < p_x], 1).astype(float)
        nondeg = (r.std(1) > 0).astype(float)
        exact = nondegenerate_probability(p_e, p_x, G_e, G_x)
        assert abs(nondeg.mean() - exact) < 3 * math.sqrt(exact * (1 - exact) / n) + 1e-12
        for ddof in (0, 1):
            v = r.var(1, ddof=ddof)
            assert abs(v.mean() - mixed_reward_variance(p_e, p_x, G_e, G_x, ddof)) < 4 * v.std() / math.sqrt(n)
    assert abs(zero_variance_share(0.95, 8) - (0.95**8 + 0.05**8)) < 1e-15
    # the between-sub-group term is what mixing adds: equal p gives the plain Bernoulli variance
    assert abs(mixed_reward_variance(0.7, 0.7, 4, 4, ddof=1) - 0.21) < 1e-12
    assert mixed_reward_variance(0.95, 0.6, 4, 4) > mixed_reward_variance(0.95, 0.95, 4, 4)
    # the best split of G = 8 for a near-saturated exploiter and a weaker explorer explores
    assert best_split(0.99, 0.6, 8) > 0 and best_split(0.5, 0.5, 8) == 0
    with pytest.raises(ValueError):
        nondegenerate_probability(1.2, 0.5, 4, 4)


def test_grpo_advantage_is_exactly_zero_on_constant_groups():
    scores = torch.tensor([1.0] * 8 + [0.0] * 8 + [1, 0, 1, 1, 1, 1, 1, 1.0])
    mask = torch.ones(24, 5)
    adv, _ = compute_grpo_outcome_advantage(place_on_last_token(scores, mask), mask, torch.arange(3).repeat_interleave(8))
    assert (adv[:16] == 0).all() and (adv[16:] != 0).all()


def test_off_policy_direction_of_a_softmax_bandit():
    """Unweighted draws from q follow q * (r - E_q r); weighted by pi/q they follow the true gradient
    pi * (r - J), which is also the finite difference of J(theta) = softmax(theta) . r."""
    theta = np.array([1.5, 0.3, 0.0, -2.0])
    pi = np.exp(theta) / np.exp(theta).sum()
    r = np.array([1.0, 1.0, 0.0, 0.0])
    q = np.array([1 / 3, 1 / 3, 1 / 3, 0.0])
    naive = softmax_pg_direction(pi, q, r)
    weighted = softmax_pg_direction(pi, np.array([0.4, 0.3, 0.2, 0.1]), r, weighted=True)  # full support
    np.testing.assert_allclose(naive, q * (r - q @ r), atol=1e-12)
    J = lambda t: np.exp(t) @ r / np.exp(t).sum()  # noqa: E731
    fd = np.array([(J(theta + 1e-6 * e) - J(theta - 1e-6 * e)) / 2e-6 for e in np.eye(4)])
    np.testing.assert_allclose(weighted, fd, atol=1e-8)
    # the two disagree: the naive one raises both correct arms equally, the true one mostly the likelier
    assert abs(naive[0] - naive[1]) < 1e-12 and weighted[0] > weighted[1]
    # Monte Carlo of the naive estimator
    rng = np.random.default_rng(0)
    n = 200_000
    a = rng.choice(4, size=n, p=q)
    g = (r[a] - q @ r)[:, None] * (np.eye(4)[a] - pi)
    assert np.all(np.abs(g.mean(0) - naive) < 4 * g.std(0) / math.sqrt(n) + 1e-12)
    with pytest.raises(ValueError):
        softmax_pg_direction(pi, np.array([0.5, 0.5, 0.0, 0.0]), r, weighted=True)


def test_importance_ratio_and_rows():
    assert torch.allclose(importance_ratio(torch.log(torch.tensor([0.5, 0.25])), torch.tensor([2.0, 4.0])),
                          torch.ones(2))
    assert explore_rows(8, 4, 1).tolist() == [False, False, False, True] * 2
    with pytest.raises(ValueError, match="n_explore"):
        explore_rows(8, 4, 5)
    with pytest.raises(ValueError, match="groups"):
        explore_rows(7, 4, 2)


def test_cuts_is_loss_weights_and_falls_back_to_vanilla():
    g = torch.Generator().manual_seed(0)
    B, T = 6, 5
    old = -torch.rand(B, T, generator=g) * 2
    new = (old + 0.1 * torch.randn(B, T, generator=g)).requires_grad_()
    adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous()
    mask = torch.ones(B, T)
    mask[0, 3:] = 0
    plain, _ = compute_policy_loss(old, new, adv, mask)
    alone, _ = compute_cuts_is_loss(old, new, adv, mask)
    on_policy, m = compute_cuts_is_loss(old, new, adv, mask, behaviour_logprob=old.clone())
    assert torch.allclose(plain, alone) and torch.allclose(plain, on_policy) and abs(m["behaviour_is_weight"] - 1) < 1e-6
    behaviour = old - torch.rand(B, T, generator=g) * 2  # q below pi: weights above 1, capped at 2
    w = torch.exp(old - behaviour).clamp(max=2.0)
    got, m = compute_cuts_is_loss(old, new, adv, mask, behaviour_logprob=behaviour)
    want, _ = compute_policy_loss(old, new, adv * w, mask)
    assert torch.allclose(got, want) and m["behaviour_is_weight"] <= 2.0
    with pytest.raises(ValueError, match="is_cap"):
        compute_cuts_is_loss(old, new, adv, mask, behaviour_logprob=behaviour, is_cap=0.0)
    with pytest.raises(ValueError, match="behaviour_logprob"):
        compute_cuts_is_loss(old, new, adv, mask, behaviour_logprob=behaviour[:, :2])


def test_short_operand_task_draws_one_single_digit_operand():
    task = get_task("addition_short")
    for e in task.examples(50, seed=0, split="test"):
        a, b = e.meta["a"], e.meta["b"]
        assert (a < 10) != (b < 10) and task.score(e.solution, e).reward == 1.0


@pytest.fixture(scope="module")
def smoke_model():
    from rlcourse.lm import load_base_model
    return load_base_model("addition", prof=rlcourse.profile("smoke"), progress=False)


def test_sampler_in_the_trainer(smoke_model):
    """The CUTS rows' tokens lie in the typical set (log pi >= -H at each step), log q = -log|C| there
    and log pi on the policy rows; metrics and scores come with the batch; bad configs are refused."""
    from rlcourse.lm import sample
    from rlcourse.train import RLConfig, Trainer

    model, tok = smoke_model
    G, n_x = 4, 2
    with one_torch_thread():
        batch = sample(model, tok, ["12+34=", "56+7="], num_generations=G, max_new_tokens=8,
                       generator=torch.Generator().manual_seed(0), proposal=mixed_proposal(G, n_x))
        rows = explore_rows(len(batch), G, n_x)
        m, lq = batch.response_mask, batch.extras["behaviour_logprob"]
        x = m * rows[:, None]
        assert ((batch.logprobs >= -batch.entropy - 1e-4) | (x == 0)).all()
        n_cand = torch.exp(-lq[x == 1])
        assert torch.allclose(n_cand, n_cand.round(), atol=1e-4) and (n_cand >= 1).all()
        e = m * (~rows)[:, None]
        assert torch.allclose(lq[e == 1], batch.logprobs[e == 1], atol=1e-4)

        cfg = RLConfig(num_generations=G, prompts_per_step=2, steps=1, max_completion_length=8, sampler="mixed_cuts",
                       policy_loss="cuts_is", sampler_kwargs={"n_explore": 1}, progress=False)
        tr = Trainer(model, tok, "addition", cfg)
        h = tr.train()[-1]
        for key in ("cuts_mixed_groups", "cuts_explore_reward", "cuts_exploit_reward", "cuts_candidates",
                    "cuts_greedy_share", "cuts_exploit_entropy"):
            assert np.isfinite(h[key]), key
        assert abs(h["cuts_mixed_groups"] - (1 - h["frac_zero_std_groups"])) < 1e-6
        for bad, match in [(dict(top_k=5), "top_k"), (dict(temperature=0.0), "temperature")]:
            with pytest.raises(ValueError, match=match):
                Trainer(model, tok, "addition", RLConfig(**{**cfg.__dict__, **bad})).train(1)
        with pytest.raises(ValueError, match="n_explore"):
            Trainer(model, tok, "addition", RLConfig(**{**cfg.__dict__, "sampler_kwargs": {"n_explore": 9}})).train(1)


def test_lm_verdicts_gate_the_mixed_groups_claim_on_the_exploring_control():
    """The typical-set arm's mixed-groups verdict is 'uninformative' when the top-2 explorer did not raise
    the mixed share, and an ordinary verdict when it did (made-up per-seed numbers)."""
    from rlcourse.studies import cuts

    def fake(explorer_gain):
        arms = list(cuts.ARMS)
        base = np.array([0.40, 0.42, 0.41])
        vals = {"GRPO": base, "Mixed-CUTS": base - np.array([0.10, 0.12, 0.11]),
                "Mixed-CUTS + IS": base, "GRPO on short-operand sums (control)": base + np.array([0.2, 0.21, 0.19]),
                cuts.EXPLORER: base + explorer_gain}
        out = {k: dict(vals) for k in ("mixed_train", "entropy", "hard")}
        return {**out, "arms": arms, "steps": 20, "lr": 1e-4, "seconds": 1.0}

    good = cuts.lm_verdicts(fake(np.array([0.20, 0.22, 0.21])))
    assert good["explorer"].holds and good["mixed"].verdict == "does not hold"
    assert good["mixed"].claim.control == good["explorer"].claim.key
    bad = cuts.lm_verdicts(fake(np.array([0.01, -0.02, 0.0])))
    assert not bad["explorer"].holds and bad["mixed"].verdict == "uninformative"
    assert bad["hard"].verdict != "uninformative"  # the harder variant rests on the other control, which held
    assert "steps" in good["mixed"].claim.setting and "20 steps" in good["mixed"].claim.setting


def test_lm_study_cells_stand_alone():
    """A later cell of the grid, run with the others, equals the same cell run alone (the loop's timings
    aside); a bad arm is named."""
    from rlcourse.studies import cuts
    from rlcourse.studies.runner import run_study

    s = cuts.lm_study(rlcourse.profile("smoke"), seeds=2, steps=2,
                      arms={k: cuts.ARMS[k] for k in ("GRPO", "Mixed-CUTS")})
    res = run_study(s, jobs=1, cache=False)
    arm, seed = s.cells()[-1]
    assert (arm, seed) == ("Mixed-CUTS", 1)
    assert res.metrics[(arm, seed)] == cuts.run_cell(arm, seed, dict(s.sizes))
    assert len(res.metrics[(arm, seed)]["explore"]) == 2 and "explore" not in res.metrics[("GRPO", 1)]
    with pytest.raises(ValueError, match="the arms are .*'Mixed-CUTS'"):
        cuts.run_cell("no such arm", 0, dict(s.sizes))
    with pytest.raises(ValueError, match="the arms are .*'base model'"):
        cuts.run_base_cell("no such arm", 0, cuts.base_study(rlcourse.profile("smoke")).sizes)
