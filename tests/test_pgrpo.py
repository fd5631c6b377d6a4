import copy

import numpy as np
import pytest
import torch

import rlcourse
import rlcourse.methods.pgrpo as pg
from rlcourse.advantages import get_estimator, place_on_last_token
from rlcourse.lm import build_model, build_tokenizer
from rlcourse.train import RLConfig, Trainer


def test_welford_matches_numpy_in_chunks():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.5, size=10_000)
    stats = pg.new_stats()
    cuts = np.sort(rng.choice(np.arange(1, len(x)), size=37, replace=False))
    for chunk in np.split(x, cuts):
        stats = pg.welford_update(stats, chunk)
    mean, std = pg.stats_mean_std(stats)
    assert stats["n"] == len(x)
    assert abs(mean - x.mean()) < 1e-10
    assert abs(std - x.std(ddof=1)) < 1e-10


def test_welford_is_pure_and_rejects_bad_input():
    s = pg.new_stats()
    s2 = pg.welford_update(s, [1.0, 2.0])
    assert s == pg.new_stats() and s2["n"] == 2
    with pytest.raises(ValueError, match="NaN"):
        pg.welford_update(s, [1.0, float("nan")])
    with pytest.raises(ValueError, match="one-dimensional"):
        pg.welford_update(s, np.ones((2, 2)))
    with pytest.raises(ValueError, match="n = 0"):
        pg.stats_mean_std(pg.new_stats())


def test_ema_stationary_moments_match_closed_form():
    # stationary N(mu, sigma^2): E[mean] = mu and E[var] = (1-a) * 2 sigma^2 / (2-a), a = 1 - decay
    rng = np.random.default_rng(1)
    decay, mu, sigma = 0.8, 1.5, 2.0
    a = 1 - decay
    means, vars_ = [], []
    for _ in range(2000):
        s = pg.ema_update(pg.new_stats(), rng.normal(mu, sigma, size=200), decay)
        means.append(s["mean"])
        vars_.append(s["m2"])
    expected_var = (1 - a) * 2 * sigma**2 / (2 - a)
    assert abs(np.mean(means) - mu) < 0.05
    assert abs(np.mean(vars_) - expected_var) < 0.15  # sigma^2 = 4 (0.44 away) would fail
    with pytest.raises(ValueError, match="decay"):
        pg.ema_update(pg.new_stats(), [1.0], 1.0)


def test_pooled_moments_law_of_total_variance():
    rng = np.random.default_rng(2)
    p, mu, s = [0.8, 0.2], [0.0, -2.0], [1.0, 0.3]
    m, sd = pg.pooled_moments(p, mu, s)
    n = 400_000
    g = rng.random(n) < 0.8
    x = np.where(g, rng.normal(0, 1, n), rng.normal(-2, 0.3, n))
    assert abs(m - x.mean()) < 0.01 and abs(sd - x.std()) < 0.01
    with pytest.raises(ValueError, match="probability"):
        pg.pooled_moments([0.5, 0.6], mu, s)


def test_two_groups_pooled_vs_personalised():
    # brief: 80 % N(0,1), 20 % N(-2, 0.3): pooled minority mean advantage < -1; P-GRPO ~ N(0,1) per group
    rng = np.random.default_rng(3)
    history = {}
    adv_p, labels_all = [], []
    for step in range(60):
        labels = ["A" if u < 0.8 else "B" for u in rng.random(256)]
        r = torch.tensor([rng.normal(0, 1) if lab == "A" else rng.normal(-2, 0.3) for lab in labels])
        adv, history = pg.p_grpo_advantages(r, labels, history)
        if step >= 10:
            adv_p.append(adv.numpy())
            labels_all += labels
        pooled = (r - r.mean()) / r.std()
    lab = np.array(labels_all)
    a = np.concatenate(adv_p)
    pooled_b = pooled[torch.tensor([x == "B" for x in labels])]
    assert float(pooled_b.mean()) < -1
    for g in "AB":
        assert abs(a[lab == g].mean()) < 0.05
        assert abs(a[lab == g].std() - 1) < 0.05


def test_degenerate_group_gets_signal_and_cold_start_falls_back():
    r = torch.tensor([1.0, 1.0, 1.0, 1.0])
    hist = {"A": pg.welford_update(pg.new_stats(), [0.0, 1.0, 0.0, 1.0])}  # mean .5, std .577
    adv, new = pg.p_grpo_advantages(r, ["A"] * 4, hist, include_batch=False, epsilon=0.0)
    assert torch.allclose(adv, torch.full((4,), 0.5 / np.sqrt(1 / 3)), atol=1e-6)
    assert new["A"]["n"] == 8 and hist["A"]["n"] == 4  # history not mutated
    adv0, _ = pg.p_grpo_advantages(torch.tensor([1.0, 0.0]), ["B", "B"], {}, include_batch=False, epsilon=0.0)
    assert torch.allclose(adv0, torch.tensor([0.7071068, -0.7071068]))  # batch fallback
    with pytest.raises(ValueError, match="labels"):
        pg.p_grpo_advantages(r, ["A"] * 3, {})


def test_a_history_of_equal_rewards_does_not_blow_up_the_advantage():
    """sigma = 0 in the history and a reward that differs (include_batch=False): the std is floored at
    min_std (0.1), so the advantage is 1/0.1 = 10, not 1/epsilon = 1e6."""
    hist = {"B": pg.welford_update(pg.new_stats(), [0.0] * 20)}
    adv, _ = pg.p_grpo_advantages(torch.tensor([1.0, 0.0]), ["B", "B"], hist, include_batch=False)
    assert torch.allclose(adv, torch.tensor([1 / (0.1 + 1e-6), 0.0]))
    ema = {"B": pg.ema_update(pg.new_stats(), torch.zeros(20), 0.9)}
    adv_ema, _ = pg.p_grpo_advantages(torch.tensor([1.0, 0.0]), ["B", "B"], ema, include_batch=False, decay=0.9)
    assert adv_ema.abs().max() <= 10.0 + 1e-3
    with pytest.raises(ValueError, match="min_std"):
        pg.p_grpo_advantages(torch.tensor([1.0, 0.0]), ["B", "B"], hist, include_batch=False, min_std=-1.0)


def test_registered_estimator_keeps_history_in_state():
    est = get_estimator("p_grpo")
    mask = torch.ones(4, 3)
    tlr = place_on_last_token(torch.tensor([10.0, 0.0, 1.0, 0.0]), mask)
    ex = pg.PrefSort().examples(4)
    ex = [ex[0].__class__(e.prompt, e.answer, e.solution, meta={"pref_group": g}) for e, g in zip(ex, "AABB")]
    state = {}
    adv, ret = est(tlr, mask, torch.tensor([0, 0, 1, 1]), ex, state)
    assert set(state["p_grpo"]) == {"A", "B"} and state["p_grpo"]["A"]["n"] == 2
    assert torch.allclose(adv[:, 0], torch.tensor([0.7071, -0.7071, 0.7071, -0.7071]), atol=1e-4)
    assert torch.equal(ret[:, 2], torch.tensor([10.0, 0.0, 1.0, 0.0]))
    bad = [e.__class__(e.prompt, e.answer, e.solution) for e in ex]
    with pytest.raises(ValueError, match="pref_group"):
        est(tlr, mask, torch.tensor([0, 0, 1, 1]), bad, {})


def test_expected_gradient_scaling_exact_bandit():
    # E[(r - c)/s * grad log pi] = grad E[r] / s for any constant c: pooled scale 1/sigma_mix
    theta = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64, requires_grad=True)
    r = torch.tensor([10.0, 0.0, 4.0], dtype=torch.float64)
    pi = torch.softmax(theta, 0)
    (g_true,) = torch.autograd.grad((pi * r).sum(), theta)
    c, s = 7.0, 3.0
    logp = torch.log_softmax(theta, 0)
    jac = torch.stack([torch.autograd.grad(logp[a], theta, retain_graph=True)[0] for a in range(3)])
    g_est = (pi.detach()[:, None] * ((r - c) / s)[:, None] * jac).sum(0)
    assert torch.allclose(g_est, g_true / s, atol=1e-12)


def test_prefsort_task_and_reward():
    task = pg.PrefSort()
    ex = task.examples(200, seed=0)
    share = np.mean([e.meta["pref_group"] == "A" for e in ex])
    assert 0.7 < share < 0.9
    a = task.examples_of("A", 5)[0]
    b = task.examples_of("B", 5)[0]
    assert a.answer == "".join(sorted(a.prompt[2:-1])) and b.answer == "".join(sorted(b.prompt[2:-1]))[::-1]
    assert task.score(a.answer, a).reward == 1.0 and task.score(a.answer[::-1], a).reward == 0.0
    mix = pg.SortMix()
    m = mix.examples(1, seed=0)[0]
    assert mix.score(m.answer[::-1], m).reward == 1.0


def test_trainer_runs_p_grpo_and_state_survives_checkpoint(tmp_path):
    tok = build_tokenizer()
    model = build_model(tok, rlcourse.profile("smoke"), seed=0)
    cfg = dict(num_generations=2, prompts_per_step=4, max_completion_length=6, steps=2, progress=False,
               train_pool_size=40, eval_prompts=4, reward="pg2_pref", advantage_estimator="p_grpo",
               output_dir=str(tmp_path), save_every=2)
    tr = Trainer(copy.deepcopy(model), tok, pg.PrefSort(), RLConfig(**cfg))
    tr.train()
    stats = copy.deepcopy(tr.state["p_grpo"])
    assert sum(s["n"] for s in stats.values()) == 2 * 8
    again = Trainer(copy.deepcopy(model), tok, pg.PrefSort(), RLConfig(**cfg), resume=True)
    assert again.state["p_grpo"] == stats


# ------------------------------------------------------------------ the chapter's experiment parts
def test_prefsort_spreads_lengths_within_each_group_and_keeps_the_default():
    from rlcourse.methods.pgrpo import PrefSort, SortMix

    ex = PrefSort(lengths=(3, 4, 5)).examples(400, seed=1)
    for tag in "AB":
        assert {len(e.answer) for e in ex if e.meta["pref_group"] == tag} == {3, 4, 5}
    assert {len(e.answer) for e in PrefSort().examples(50)} == {4}
    assert SortMix().name == "pg2_sortmix-lean0.70" and SortMix(lengths=(3, 4, 5)).name.endswith("-len345")
    with pytest.raises(ValueError, match="length"):
        PrefSort(lengths=(1, 4))


def test_logged_estimator_gives_p_grpos_advantages_and_logs_each_group():
    from rlcourse.advantages import get_estimator
    from rlcourse.methods.pgrpo import LOG_KEY, PrefSort

    ex = PrefSort().examples(6, seed=0)
    rows = [e for e in ex for _ in range(2)]
    scores = torch.tensor([10.0 if e.meta["pref_group"] == "A" and i % 2 else 1.0 * (i % 2) for i, e in enumerate(rows)])
    mask = torch.ones(len(rows), 3)
    tlr = torch.zeros(len(rows), 3)
    tlr[:, -1] = scores
    index = torch.arange(6).repeat_interleave(2)
    s1, s2 = {}, {}
    a1, _ = get_estimator("p_grpo")(token_level_rewards=tlr, response_mask=mask, index=index, examples=rows, state=s1)
    a2, _ = get_estimator("p_grpo_logged")(token_level_rewards=tlr, response_mask=mask, index=index, examples=rows,
                                            state=s2)
    assert torch.equal(a1, a2)
    log = s2[LOG_KEY][0]
    for g, entry in log.items():
        sel = [i for i, e in enumerate(rows) if e.meta["pref_group"] == g]
        assert entry["adv"] == pytest.approx(float(a1[sel, 0].mean()), abs=1e-6) and entry["n"] == len(sel)


def test_logged_estimator_takes_every_keyword_of_p_grpo():
    """``p_grpo_logged`` promises p_grpo's advantages, so every knob of p_grpo must reach it (it
    lacked ``min_std`` and ``group_key``): the same keywords with the same defaults, and a floor set
    through it acts. A history of equal rewards (sigma = 0) without the batch: a reward of 1 gets
    1 / (min_std + eps), 2 with min_std = 0.5 (10 at the default 0.1)."""
    import inspect

    from rlcourse.methods.pgrpo import LOG_KEY

    def keywords(fn):
        return {n: p.default for n, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}

    assert keywords(pg.compute_p_grpo_logged_advantage) == keywords(pg.compute_p_grpo_advantage)
    ex = pg.PrefSort().examples(1, seed=0)[0]
    rows = [ex.__class__(ex.prompt, ex.answer, ex.solution, meta={"user": "B"})] * 2
    mask = torch.ones(2, 3)
    tlr = place_on_last_token(torch.tensor([1.0, 0.0]), mask)
    for min_std in (0.1, 0.5):
        state = {"p_grpo": {"B": pg.welford_update(pg.new_stats(), [0.0] * 20)}}
        adv, _ = get_estimator("p_grpo_logged")(tlr, mask, torch.tensor([0, 0]), rows, state, include_batch=False,
                                                group_key="user", min_std=min_std)
        assert torch.allclose(adv[:, 0], torch.tensor([1 / (min_std + 1e-6), 0.0]))
        assert state[LOG_KEY][0]["B"]["adv"] == pytest.approx(0.5 / (min_std + 1e-6))


def test_advantages_are_invariant_to_the_reward_scale_at_the_floor_too():
    """The std floor is relative to a group's reward range, so multiplying every reward by 10 (or
    shifting it) leaves the advantages unchanged, also for a group whose history has sigma = 0 and sits
    at the floor; an absolute floor of 0.1 would give 10 for a 0/1 reward and 100 for a 0/10 one."""
    torch.manual_seed(0)
    for include_batch in (True, False):
        for decay in (None, 0.9):
            update = pg.welford_update if decay is None else (lambda s, v: pg.ema_update(s, v, decay))
            hist = {"flat": update(pg.new_stats(), [0.0] * 20), "mixed": update(pg.new_stats(), [0.0, 1.0] * 5)}
            labels = ["flat", "flat", "mixed", "mixed", "new", "new"]
            r = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
            base, _ = pg.p_grpo_advantages(r, labels, hist, include_batch=include_batch, decay=decay)
            scaled_hist = {g: {k: (v * 10 if k in ("mean",) else v * 100 if k == "m2" else v) for k, v in st.items()}
                           for g, st in hist.items()}
            scaled, _ = pg.p_grpo_advantages(10 * r, labels, scaled_hist, include_batch=include_batch, decay=decay)
            shifted_hist = {g: {**st, "mean": st["mean"] + 3} for g, st in hist.items()}
            shifted, _ = pg.p_grpo_advantages(r + 3, labels, shifted_hist, include_batch=include_batch, decay=decay)
            assert torch.allclose(scaled, base, rtol=1e-5, atol=1e-5), (include_batch, decay, base, scaled)
            assert torch.allclose(shifted, base, rtol=1e-5, atol=1e-5)
            if not include_batch:  # the flat group is at the floor: |A| = 1 / min_std, at both scales
                assert scaled[0].item() == pytest.approx(10.0, rel=1e-4)
    # the range is carried in the history, so a later batch of equal rewards keeps the scale it has seen
    _, h = pg.p_grpo_advantages(torch.tensor([0.0, 10.0]), ["g", "g"], {})
    assert (h["g"]["lo"], h["g"]["hi"]) == (0.0, 10.0)
    with pytest.raises(ValueError, match="no rewards"):
        pg.reward_range(pg.new_stats(), [])


def test_pgrpo_study_cell_alone_equals_the_grid_and_bad_arms_are_named():
    import json

    from rlcourse.studies import run_study
    from rlcourse.studies.p_grpo import BASE, pgrpo_base_study, pgrpo_study, run_base_cell, run_cell

    study = pgrpo_study(rlcourse.profile("smoke"), seeds=2)
    res = run_study(study, jobs=1, cache=False)
    arm, seed = study.cells()[-1]  # a later cell: P-GRPO on seed 1
    assert arm == "P-GRPO" and "adv_log" in res.metrics[(arm, seed)]
    assert res.metrics[(arm, seed)] == json.loads(json.dumps(run_cell(arm, seed, study.sizes)))
    base = pgrpo_base_study(rlcourse.profile("smoke"))
    assert base.cells() == [(BASE, 0)] and set(run_base_cell(BASE, 0, base.sizes)) == {"base", "base_sorted"}
    with pytest.raises(ValueError, match="GRPO, pooled batch"):
        run_cell("no such arm", 0, study.sizes)
    with pytest.raises(ValueError, match="base model"):
        run_base_cell("P-GRPO", 0, base.sizes)
