"""RepExp: the elliptical bonus and its Sherman-Morrison updates against direct inverses (float64),
leave-one-out = leverage / (1 - leverage), greedy elliptical selection = greedy log-det, a repeated
sample's small bonus, the sparse projection's E[P P^T] = I by Monte Carlo, the random order's expected
verifier calls by Monte Carlo, the limit bonus of the commonest mode under centred one-hot features
against a direct inverse, the divisor task, and the registered sampler in the Trainer (scores =
reward + beta * bonus, frozen features, exact resume)."""
import copy
import dataclasses
import inspect
import math

import numpy as np
import pytest
import torch

import rlcourse
from rlcourse.lm.model import position_ids_from_mask
from rlcourse.methods.repexp import (Divisor, centred_onehot_limit, covariance_inverse, elliptical_bonus, elliptical_order, group_bonus,
                                     mean_response_hidden, normalize_bonus, planted_features,
                                     random_pass_at_k, random_samples_to_first_correct, response_mode,
                                     samples_to_first_correct, selected_pass_at_k, sherman_morrison,
                                     sparse_projection)
from rlcourse.rollout import SAMPLERS


def _direct(phi, lam):
    return torch.linalg.inv(lam * torch.eye(phi.shape[1], dtype=torch.float64) + phi.T @ phi)


def test_sherman_morrison_matches_direct_inverse():
    g = torch.Generator().manual_seed(0)
    phi = torch.randn(12, 5, generator=g, dtype=torch.float64)
    for lam in (0.01, 1.0):
        torch.testing.assert_close(covariance_inverse(phi, lam), _direct(phi, lam), rtol=1e-8, atol=1e-8)
    # the downdate (sign -1) undoes an update, as the leave-one-out inverse needs
    inv = _direct(phi, 0.5)
    loo = sherman_morrison(inv, phi[3], sign=-1.0)
    torch.testing.assert_close(loo, _direct(torch.cat([phi[:3], phi[4:]]), 0.5), rtol=1e-8, atol=1e-8)
    with pytest.raises(ValueError, match="shape|must be"):
        sherman_morrison(inv, phi[0, :3])


def test_leverage_and_leave_one_out():
    g = torch.Generator().manual_seed(1)
    phi = torch.randn(10, 4, generator=g, dtype=torch.float64)
    lam = 0.3
    lev = elliptical_bonus(phi, lam, "leverage", center=False)
    loo = elliptical_bonus(phi, lam, "loo", center=False)
    inv = _direct(phi, lam)
    for i in range(10):
        assert abs(lev[i] - phi[i] @ inv @ phi[i]) < 1e-10
        rest = torch.cat([phi[:i], phi[i + 1:]])
        assert abs(loo[i] - phi[i] @ _direct(rest, lam) @ phi[i]) < 1e-8
    assert ((lev >= 0) & (lev < 1)).all()
    torch.testing.assert_close(loo, lev / (1 - lev), rtol=1e-10, atol=1e-12)
    # sum of leverages = trace(Sigma^-1 (Sigma - lam I)) = k - lam tr(Sigma^-1)
    assert abs(lev.sum() - (4 - lam * torch.trace(inv))) < 1e-10
    with pytest.raises(ValueError, match="kind"):
        elliptical_bonus(phi, kind="volume")
    with pytest.raises(ValueError, match="lam"):
        elliptical_bonus(phi, lam=0.0)


def test_repeated_sample_gets_a_small_bonus():
    """m copies of one direction share it: each copy's leverage is about 1/m (exactly
    m s / (lam + m s) / m for ||phi||^2 = s), while a lone direction keeps about 1."""
    lam, s = 0.01, 4.0
    e = torch.eye(3, dtype=torch.float64) * math.sqrt(s)
    phi = torch.stack([e[0]] * 5 + [e[1], e[2]])
    b = elliptical_bonus(phi, lam, center=False)
    np.testing.assert_allclose(b[:5].numpy(), s / (lam + 5 * s), rtol=1e-10)
    np.testing.assert_allclose(b[5:].numpy(), s / (lam + s), rtol=1e-10)
    assert b[5] > 4 * b[0]


def test_greedy_selection_is_greedy_log_det():
    g = torch.Generator().manual_seed(2)
    phi = torch.randn(15, 4, generator=g, dtype=torch.float64)
    lam = 0.1
    order = elliptical_order(phi, lam)
    assert sorted(order) == list(range(15))
    # greedy on log det(lam I + sum phi phi^T), by brute force at every step
    chosen = []
    for _ in range(6):
        def logdet(rows):
            S = lam * torch.eye(4, dtype=torch.float64) + phi[rows].T @ phi[rows]
            return torch.logdet(S)
        gains = {i: logdet(chosen + [i]) for i in range(15) if i not in chosen}
        best = max(gains, key=lambda i: float(gains[i]))
        # the matrix determinant lemma: the gain is log(1 + bonus)
        S_inv = _direct(phi[chosen], lam) if chosen else torch.eye(4, dtype=torch.float64) / lam
        for i, v in gains.items():
            assert abs(v - logdet(chosen) - math.log1p(phi[i] @ S_inv @ phi[i])) < 1e-9
        chosen.append(best)
    assert order[:6] == chosen


def test_selection_picks_outliers_before_duplicates():
    """A tight cluster of 10 near-copies and three orthogonal outliers: the outliers come right after
    the first pick from the cluster."""
    g = torch.Generator().manual_seed(3)
    cluster = torch.tensor([3.0, 0, 0, 0]) + 0.01 * torch.randn(10, 4, generator=g)
    outliers = torch.tensor([[0, 2.0, 0, 0], [0, 0, 2.0, 0], [0, 0, 0, 2.0]])
    phi = torch.cat([cluster, outliers]).double()
    order = elliptical_order(phi, lam=0.01, k=4)
    assert sorted(order[:4]) == sorted([order[0], 10, 11, 12]) and order[0] < 10


def test_centred_onehot_limit_and_the_planted_order():
    """The proposition of the chapter: with centred one-hots, after one sample of every other mode the
    last mode's bonus tends to sum_{j != K} s_j^2 / s_K^2 and a repeat's to 1 (checked against the direct
    inverse at a tiny ridge); the centred order then verifies repeats before the commonest mode, and the
    uncentred one visits every mode within its first K picks."""
    shares = np.array([0.5, 0.25, 0.15, 0.1])
    eye = torch.eye(4, dtype=torch.float64)
    u = eye - torch.as_tensor(shares)  # row j: the centred feature of mode j
    for last in range(4):
        picked = torch.stack([u[j] for j in range(4) if j != last])
        inv = _direct(picked, 1e-9)
        bonus_last = float(u[last] @ inv @ u[last])
        assert math.isclose(bonus_last, centred_onehot_limit(shares, last), rel_tol=1e-5)
        repeat = picked[0]
        assert math.isclose(float(repeat @ inv @ repeat), 1.0, rel_tol=1e-5)
    assert centred_onehot_limit(shares, 0) < 1 < centred_onehot_limit(shares, 3)
    texts = ["2:"] * 10 + ["3:"] * 5 + ["5:"] * 3 + ["7:"] * 2
    phi = planted_features(texts)
    for centre, ok in ((True, lambda pos: pos > 4), (False, lambda pos: pos <= 4)):
        order = elliptical_order(phi, 1e-4, center=centre)
        first_of_2 = min(order.index(i) for i in range(10)) + 1
        assert ok(first_of_2), (centre, order)
        if not centre:
            assert {texts[i] for i in order[:4]} == set(texts)
    for bad in ([0.5, 0.5, 0.1], [1.0], [0.6, 0.4, 0.0]):
        with pytest.raises(ValueError, match="shares"):
            centred_onehot_limit(bad, 0)
    with pytest.raises(ValueError, match="last"):
        centred_onehot_limit([0.5, 0.5], 2)


def test_random_order_expected_calls_monte_carlo():
    M, c = 20, 3
    rng = np.random.default_rng(0)
    correct = np.zeros(M)
    correct[:c] = 1
    n = 8_000
    draws = np.array([samples_to_first_correct(rng.permutation(M), correct) for _ in range(n)])
    se = draws.std() / math.sqrt(n)
    assert abs(draws.mean() - random_samples_to_first_correct(M, c)) < 4 * se
    hits = np.array([selected_pass_at_k(rng.permutation(M), correct, [4])[4] for _ in range(n)])
    assert abs(hits.mean() - random_pass_at_k(correct, [4])[4]) < 4 * math.sqrt(0.25 / n)
    assert samples_to_first_correct([0, 1], [0, 0]) == math.inf
    with pytest.raises(ValueError):
        random_samples_to_first_correct(5, 0)


def test_sparse_projection_preserves_inner_products_in_expectation():
    d, k, n = 64, 8, 400
    g = torch.Generator().manual_seed(4)
    mats = torch.stack([sparse_projection(d, k, g) for _ in range(n)]).double()
    ppt = (mats @ mats.transpose(1, 2)).mean(0)  # E[P P^T] = I_d
    # each diagonal entry is a mean of n * k terms of variance about (1/density - 1)/k^2 * k
    density = 1 / math.sqrt(d)
    tol = 5 * math.sqrt((1 / density) / k / n)
    assert (ppt.diagonal() - 1).abs().max() < tol
    assert (ppt - torch.diag(ppt.diagonal())).abs().max() < tol
    frac = (mats != 0).double().mean()
    assert abs(frac - density) < 5 * math.sqrt(density / (n * d * k))
    with pytest.raises(ValueError):
        sparse_projection(0, 4, g)


def test_normalisations_and_group_bonus():
    b = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    assert torch.equal(normalize_bonus(b, "none"), b)
    torch.testing.assert_close(normalize_bonus(b, "rnd"), b / b.std())
    z = normalize_bonus(b, "z_score")
    assert abs(z.mean()) < 1e-12 and abs(z.std() - 1) < 1e-12
    with pytest.raises(ValueError, match="normalization"):
        normalize_bonus(b, "minmax")
    g = torch.Generator().manual_seed(5)
    phi = torch.randn(8, 3, generator=g, dtype=torch.float64)
    index = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    out = group_bonus(phi, index)
    torch.testing.assert_close(out[4:], elliptical_bonus(phi[4:]))
    with pytest.raises(ValueError, match="index"):
        group_bonus(phi, index[:3])


def test_divisor_task():
    task = Divisor()
    exs = task.examples(300, seed=0)
    for e in exs[:50]:
        n = e.meta["n"]
        assert e.prompt == f"div {n}:" and e.meta["divisors"] == [p for p in (2, 3, 5, 7) if n % p == 0]
        assert e.meta["divisors"], n
    e = exs[0]
    n = e.meta["n"]
    for d in (2, 3, 5, 7):
        assert task.score(f"{d}:xy", e).reward == float(n % d == 0)
    assert task.score("1:", e).reward == 0.0 and task.score("junk", e).reward == 0.0
    assert task.score(f"{n}:", e).reward == 0.0  # n itself is not a proper divisor
    # the demonstrations' modes follow the prior whatever n is
    modes = [response_mode(e.solution) for e in exs]
    assert 0.4 < modes.count("2") / len(modes) < 0.6 and set(modes) == {"2", "3", "5", "7"}
    assert response_mode("7:zz") == "7" and response_mode("7zz") is None
    phi = planted_features(["2:x", "2:", "7:y", "bad"])
    assert torch.equal(phi[0], phi[1]) and phi[2, 3] == 1 and phi[3, 4] == 1


@pytest.fixture(scope="module")
def smoke_model():
    from rlcourse.lm.zoo import load_base_model
    return load_base_model("addition", prof=rlcourse.profile("smoke"), progress=False)


def _trainer(model, tok, steps, **kw):
    from rlcourse.train import RLConfig, Trainer
    cfg = RLConfig(num_generations=4, prompts_per_step=2, max_completion_length=6, steps=steps, progress=False,
                   sampler="repexp", sampler_kwargs=dict(beta=0.5, off_if_none_correct=False),
                   reward="test_repexp_digits", **kw)
    return Trainer(copy.deepcopy(model), tok, "addition", cfg)


from rlcourse.rewards import register_reward  # noqa: E402


@register_reward("test_repexp_digits", overwrite=True)
def _digits(batch, examples, task, state):
    return torch.tensor([sum(c.isdigit() for c in t) / max(1, len(t)) for t in batch.texts])


def test_sampler_scores_and_features(smoke_model):
    model, tok = smoke_model
    assert SAMPLERS.get("repexp") is not None
    tr = _trainer(model, tok, 2)
    frozen0 = copy.deepcopy(tr.model.state_dict())
    batches = []
    orig = tr.sampler

    def spy(**kw):
        batches.append(orig(**kw))
        return batches[-1]
    spy.__signature__ = inspect.signature(orig)
    tr.sampler = spy
    tr.train()
    st = tr.state["repexp"]["frozen"]
    for k, v in frozen0.items():  # the frozen copy is the model before the first update
        torch.testing.assert_close(st[k], v, rtol=0, atol=0)
    b = batches[1]  # step 2: the model has moved, the features must not
    per_row = [None] * len(b)
    task_scores = _digits(b, per_row, None, None)
    from rlcourse.methods.repexp import projection_generator
    h = mean_response_hidden(tr.model, b, weights=st)
    proj = sparse_projection(h.shape[1], 16, projection_generator(tr.config.seed, 2, True))
    bonus = group_bonus((h @ proj).double(), b.index)
    torch.testing.assert_close(b.scores, (task_scores.double() + 0.5 * bonus).float())
    m = tr.history[-1]
    assert abs(m["repexp_task_reward"] - float(task_scores.mean())) < 1e-6 and m["repexp_bonus_on"] == 1.0
    # the hidden mean against a hand loop
    out = tr.model(input_ids=b.input_ids, attention_mask=b.attention_mask, output_hidden_states=True,
                   position_ids=position_ids_from_mask(b.attention_mask))
    hs = out.hidden_states[-1][:, -b.response_len:]
    r = 0
    n = int(b.response_mask[r].sum())
    torch.testing.assert_close(mean_response_hidden(tr.model, b)[r], hs[r, :n].mean(0), rtol=1e-5, atol=1e-5)


def test_sampler_refusals_and_off_switch(smoke_model):
    model, tok = smoke_model
    from rlcourse.train import RLConfig, Trainer
    with pytest.raises(ValueError, match="num_generations"):
        Trainer(copy.deepcopy(model), tok, "addition", RLConfig(num_generations=1, steps=1, progress=False,
                                                                 sampler="repexp")).train()
    with pytest.raises(ValueError, match="repexp_divisor"):
        Trainer(copy.deepcopy(model), tok, "addition", RLConfig(num_generations=2, prompts_per_step=1, steps=1,
                progress=False, sampler="repexp", sampler_kwargs={"features": "planted"})).train()
    # a group with no positive reward gets no bonus (the authors' turn_off_elliptical_if_none_correct)
    tr = Trainer(copy.deepcopy(model), tok, "addition", RLConfig(num_generations=4, prompts_per_step=2, steps=1,
                 max_completion_length=6, progress=False, sampler="repexp", reward="zero_for_repexp_test"))
    tr.train()
    assert tr.history[-1]["repexp_bonus_on"] == 0.0 and tr.history[-1]["reward"] == 0.0


@register_reward("zero_for_repexp_test", overwrite=True)
def _zero(batch, examples, task, state):
    return torch.zeros(len(batch))


def test_exact_resume(smoke_model, tmp_path):
    model, tok = smoke_model
    a = _trainer(model, tok, 4, output_dir=str(tmp_path / "a"), save_every=2)
    a.train(steps=2)
    b = _trainer(model, tok, 4, output_dir=str(tmp_path / "a"), save_every=2)
    b.__init__(b.model, tok, "addition", b.config, resume=True)
    b.train()
    ref = _trainer(model, tok, 4)
    ref.train()
    # The resumed run repeats the uninterrupted one's steps bit for bit. (It once differed in the last
    # bits: the sampler's hidden-state forward made transformers install output-recording hooks, which
    # sent every later rollout to the "hf" path, except a resumed run's first one; see
    # rlcourse.lm.engine._records_only.)
    for p, q in zip(b.model.parameters(), ref.model.parameters()):
        assert torch.equal(p, q)
    assert [m["repexp_bonus"] for m in b.history] == [m["repexp_bonus"] for m in ref.history]
    assert [m["reward"] for m in b.history] == [m["reward"] for m in ref.history]


def test_rl_verdicts_rest_on_the_planted_control():
    """Made-up per-seed numbers: pass@32 and distinct modes are 'uninformative' when the planted control
    did not hold, ordinary verdicts when it did; pass@1 is a course hypothesis with no control."""
    import numpy as np
    from rlcourse.studies import repexp

    def fake(planted_gain):
        g = np.array([1.00, 1.05, 0.95])
        distinct = {"GRPO": g, "GRPO+RepExp": g + np.array([0.0, 0.01, -0.01]), "GRPO+RepExp (planted)": g + planted_gain}
        p = {a: {1: np.array([0.6, 0.61, 0.59]), 32: np.array([0.8, 0.82, 0.79]) + (0.01 if a != "GRPO" else 0)}
             for a in distinct}
        return {"arms": repexp.RL_ARMS, "passk": p, "distinct": distinct, "steps": 90, "beta": 0.01,
                "eval_prompts": 32, "seconds": 1.0}

    held = repexp.rl_verdicts(fake(np.array([0.3, 0.35, 0.32])))
    assert held["control"].holds and held["distinct"].verdict == "inconclusive"
    failed = repexp.rl_verdicts(fake(np.array([0.01, -0.02, 0.0])))
    assert failed["distinct"].verdict == failed["pass32"].verdict == "uninformative"
    assert failed["pass1"].claim.role == "course hypothesis" and failed["pass1"].verdict != "uninformative"
    with pytest.raises(ValueError, match="prompts"):
        repexp.run_rl(None, prompts="test")
    with pytest.raises(ValueError, match="arms"):
        repexp.run_rl(None, arms=("GRPO+RepExp",))


def test_rl_study_cell_alone_matches_the_grid():
    """A later cell of the RL grid equals the same cell run alone (cells share no state), and an
    unknown arm is refused with the arms named."""
    from rlcourse.studies import repexp
    from rlcourse.studies.runner import run_study

    prof = dataclasses.replace(rlcourse.profile("smoke"), seeds=2)
    study = repexp.rl_study(prof, arms=("GRPO", "GRPO+RepExp"), steps=1)
    res = run_study(study, jobs=1, cache=False)
    arm, seed = study.cells()[-1]
    assert (arm, seed) == ("GRPO+RepExp", 1)
    assert res.metrics[(arm, seed)] == repexp.run_rl_cell(arm, seed, dict(study.sizes))
    with pytest.raises(ValueError, match="GRPO\\+RepExp"):
        repexp.run_rl_cell("PPO", 0, dict(study.sizes))
    with pytest.raises(ValueError, match="base model"):
        repexp.run_rl_base_cell("GRPO", 0, dict(study.sizes))


def test_inference_study_cell_alone_matches_the_grid():
    """Experiment 1 on the runner: a later cell of a two-seed grid equals the same cell run alone, the
    wrapper's dict rebuilds the pool and the prompts from the cell, and an unknown arm is refused with
    the arms named."""
    from rlcourse.studies import repexp
    from rlcourse.studies.runner import run_study

    prof = rlcourse.profile("smoke")
    study = dataclasses.replace(repexp.inference_study(prof), seeds=(0, 1))
    res = run_study(study, jobs=1, cache=False)
    arm, seed = study.cells()[-1]
    assert (arm, seed) == (repexp.INFERENCE_ARM, 1)
    cell = repexp.run_inference_cell(arm, seed, dict(study.sizes))
    assert res.metrics[(arm, seed)] == cell
    out = repexp.run_inference(prof, seed=1, cache=False)
    assert out["pool"]["texts"] == cell["texts"] and out["pool"]["phi"].tolist() == cell["phi"]
    assert out["examples"] == repexp.inference_examples(dict(study.sizes), 1)
    assert out["kept"] == len(out["calls"]["random"]) == int((out["pool"]["correct"].sum(1) > 0).sum())
    with pytest.raises(ValueError, match="the arms are .*'inference'"):
        repexp.run_inference_cell("GRPO", 0, dict(study.sizes))
