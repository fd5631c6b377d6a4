"""Data-scarcity survey: the map covers the table of contents exactly once; the arithmetic of a group
(sum of |A|, zero-variance probability, the expected GRPO step) against enumeration, Monte Carlo
and finite differences; the pass-rate filter and the easier-variant synthesis as registered prompt
samplers in the loop; the toy's arms; clear errors on bad input."""
import math

import numpy as np
import pytest
import torch

from rlcourse import catalogue
from rlcourse.advantages import compute_grpo_outcome_advantage
from rlcourse.data import get_prompt_sampler
from rlcourse.methods import data_scarcity as D
from rlcourse.tasks import get_task


# ---------------------------------------------------------------------- the map
def test_every_chapter_of_the_toc_is_placed_exactly_once_and_every_placed_stem_exists():
    stems = catalogue.toc_stems()
    D.check_map(stems)  # raises on a chapter missing from the map or a stem that is no chapter
    book = [s for s in stems if s.startswith("book/")]
    assert sorted(D.PLACEMENTS) == sorted(book)
    rows = D.map_rows()
    assert [r["stem"] for r in rows] == book
    leaves, parts, counts = D.map_grid(rows)
    assert counts.sum() == len(book) and counts.shape == (len(leaves), len(parts))


def test_every_chapter_label_exists_in_its_file():
    for r in D.map_rows():
        text = open(f"{catalogue.ROOT}/{r['stem']}.md").read()
        assert f"({r['label']})=" in text, r["stem"]


def test_check_map_names_what_is_wrong():
    with pytest.raises(ValueError, match="not placed.*book/new_one"):
        D.check_map(["book/new_one"], {})
    with pytest.raises(ValueError, match="no chapter.*book/gone"):
        D.check_map([], {"book/gone": D.Placement(D.OUTSIDE, "", "x")})
    with pytest.raises(ValueError, match="unknown branch/leaf"):
        D.check_map(["book/a"], {"book/a": D.Placement("data-centric", "no such leaf", "x")})
    with pytest.raises(ValueError, match="needs a reason"):
        D.check_map(["book/a"], {"book/a": D.Placement(D.OUTSIDE, "", "")})
    with pytest.raises(ValueError, match="twice"):
        D.check_map(["book/a", "book/a"], {"book/a": D.Placement(D.OUTSIDE, "", "x")})


# ---------------------------------------------------------------------- the arithmetic of a group
@pytest.mark.parametrize("G", [2, 3, 5, 8, 16])
def test_sum_of_absolute_advantages_matches_the_package_estimator(G):
    for k in range(G + 1):
        r = torch.zeros(G, 1, dtype=torch.float64)
        r[:k] = 1.0
        mask = torch.ones_like(r)
        adv, _ = compute_grpo_outcome_advantage(r, mask, torch.zeros(G, dtype=torch.long), epsilon=0.0)
        got = float(adv.abs().sum()) if 0 < k < G else 0.0
        assert math.isclose(got, float(D.abs_advantage_sum(k, G, ddof=1)), rel_tol=1e-9, abs_tol=1e-12)
        pop = (r - r.mean()) / r.std(unbiased=False) if 0 < k < G else torch.zeros_like(r)
        assert math.isclose(float(pop.abs().sum()), float(D.abs_advantage_sum(k, G, ddof=0)), rel_tol=1e-9,
                            abs_tol=1e-12)
        assert math.isclose(float((r - r.mean()).abs().sum()), float(D.abs_centred_sum(k, G)), abs_tol=1e-12)


def test_zero_variance_probability_matches_monte_carlo_within_one_percent():
    rng = np.random.default_rng(0)
    G, n = 8, 400_000
    for p in (0.1, 0.3, 0.5, 0.85):
        y = rng.random((n, G)) < p
        mc = (y.all(1) | (~y).all(1)).mean()
        exact = float(D.zero_variance_probability(p, G))
        assert exact == pytest.approx(p**G + (1 - p) ** G)
        assert abs(mc - exact) < 0.01 * exact + 4 * math.sqrt(exact * (1 - exact) / n), (p, mc, exact)


@pytest.mark.parametrize("ddof", [0, 1])
def test_expected_grpo_step_is_the_derivative_of_the_surrogate_and_below_the_sqrt_bound(ddof):
    G, h = 8, 1e-5
    for theta in (-3.0, -1.0, 0.0, 0.7, 2.5):
        fd = (D.grpo_surrogate(theta + h, theta, G, ddof) - D.grpo_surrogate(theta - h, theta, G, ddof)) / (2 * h)
        exact = float(D.expected_grpo_logit_step(1 / (1 + math.exp(-theta)), G, ddof))
        assert abs(fd - exact) < 1e-6 * max(1.0, abs(exact)), (theta, fd, exact)
        p = 1 / (1 + math.exp(-theta))
        bound = math.sqrt(G * (G - ddof)) * math.sqrt(p * (1 - p) * (G - 1) / G)  # Jensen
        assert exact <= bound + 1e-12


def test_expected_grpo_step_matches_monte_carlo():
    rng = np.random.default_rng(3)
    G, n = 6, 200_000
    for p in (0.2, 0.5):
        y = (rng.random((n, G)) < p).astype(float)
        sd = y.std(1, ddof=1, keepdims=True)
        a = np.where(sd > 0, (y - y.mean(1, keepdims=True)) / np.where(sd > 0, sd, 1), 0.0)
        step = (a * (y - p)).sum(1)
        assert abs(step.mean() - float(D.expected_grpo_logit_step(p, G, 1))) < 4 * step.std() / math.sqrt(n)


def test_group_arithmetic_rejects_bad_input():
    with pytest.raises(ValueError, match="G >= 2"):
        D.abs_advantage_sum(0, 1)
    with pytest.raises(ValueError, match=r"integers in \[0, G=4\]"):
        D.abs_advantage_sum(5, 4)
    with pytest.raises(ValueError, match="ddof"):
        D.abs_advantage_sum(1, 4, ddof=2)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        D.expected_grpo_logit_step(1.2, 4)


# ---------------------------------------------------------------------- the choosers
def test_eligible_keeps_unmeasured_inside_band_and_stale_prompts():
    rates = np.array([np.nan, 0.0, 0.5, 1.0, 0.0])
    at = np.array([0, 9, 9, 9, 1])
    assert D.eligible(rates, at, 10, cooldown=5).tolist() == [True, False, True, False, True]
    with pytest.raises(ValueError, match="equal 1-D"):
        D.eligible(rates, at[:2], 10)
    with pytest.raises(ValueError, match="band"):
        D.eligible(rates, at, 10, lo=0.6, hi=0.5)
    with pytest.raises(ValueError, match="cooldown"):
        D.eligible(rates, at, 10, cooldown=0)
    assert D.cooldown_steps(200, 8, 2.0) == 50
    with pytest.raises(ValueError, match="passes"):
        D.cooldown_steps(200, 8, 0.0)


def test_filtered_draw_prefers_eligible_and_fills_up():
    g = torch.Generator().manual_seed(0)
    mask = np.array([False, True, False, True, False])
    for _ in range(20):
        assert sorted(D.filtered_draw(mask, 2, g)) == [1, 3]
        got = D.filtered_draw(mask, 4, g)
        assert len(set(got)) == 4 and {1, 3} <= set(got)
    with pytest.raises(ValueError, match="pool of 5"):
        D.filtered_draw(mask, 6, g)


def test_easier_variant_drops_one_level_and_is_answered_exactly():
    task = get_task("scarcity_addition")
    rng = np.random.default_rng(0)
    for e in task.examples(200, seed=0, split="train"):
        child = task.easier(e, rng)
        d = e.meta["digits"]
        if d == 1:
            assert child is None
            continue
        assert child.meta["digits"] == d - 1
        a, b = child.meta["a"], child.meta["b"]
        assert len(str(a)) == d - 1 and len(str(b)) == d - 1 and child.answer == str(a + b)
        assert task.score(child.solution, child).reward == 1.0
    assert task.easier(type(e)(prompt="1+1=", answer="2", solution="2|2"), rng) is None


def _feedback(state, step, examples, rates):
    state["prompt_feedback"] = {"step": step, "rates": {e.prompt: (r * 4, 4) for e, r in zip(examples, rates)}}


def test_pass_filter_sampler_drops_solved_and_unreachable_prompts():
    task = get_task("scarcity_addition")
    pool = task.examples(12, seed=0, split="train", distinct=True)
    fn = get_prompt_sampler("pass_filter")
    g, state = torch.Generator().manual_seed(0), {}
    first = fn(pool=pool, n=6, generator=g, state=state, task=task, step=1)
    _feedback(state, 1, first, [0.0, 1.0, 0.0, 1.0, 0.5, 0.25])
    second = fn(pool=pool, n=6, generator=g, state=state, task=task, step=2)
    dropped = {first[i].prompt for i in range(4)}
    assert not dropped & {e.prompt for e in second}  # six others remain: the unmeasured and the mixed ones
    with pytest.raises(ValueError, match="heapa_feedback"):
        fn(pool=pool, n=6, generator=g, state=state, task=task, step=3)


def test_synth_easier_sampler_adds_one_level_down_children_of_failed_prompts():
    task = get_task("scarcity_addition")
    pool = [e for e in task.examples(200, seed=1, split="train") if e.meta["digits"] == 4][:8]
    fn = get_prompt_sampler("synth_easier")
    g, state = torch.Generator().manual_seed(0), {}
    first = fn(pool=pool, n=4, generator=g, state=state, task=task, step=1)
    _feedback(state, 1, first, [0.0, 0.0, 0.5, 1.0])
    fn(pool=pool, n=4, generator=g, state=state, task=task, step=2)
    items = state[D.MEMORY_KEY]["items"]
    assert len(items) == 10 and all(e.meta["digits"] == 3 for e in items[8:])
    with pytest.raises(ValueError, match="easier"):
        fn(pool=pool, n=4, generator=g, state={}, task=get_task("heapa_addition"), step=1)


@pytest.mark.parametrize("arm", ["pass_filter", "synth_easier"])
def test_registered_samplers_run_in_the_trainer(arm):
    from rlcourse.lm.zoo import load_base_model
    from rlcourse.train import RLConfig, Trainer

    import rlcourse

    prof = rlcourse.profile("smoke")
    task = get_task("scarcity_addition")
    model, tok = load_base_model("heapa_addition", strength=0.5, prof=prof, progress=False)
    cfg = RLConfig(num_generations=4, prompts_per_step=4, max_completion_length=12, steps=3, progress=False,
                   **D.LM_ARMS[arm])
    tr = Trainer(model, tok, task, cfg, train_examples=task.examples(16, seed=0, split="train"))
    for _ in range(3):
        m = tr.step()
    assert "filter_eligible" in m and 0.0 <= m["filter_eligible"] <= 1.0


# ---------------------------------------------------------------------- the toy
def test_toy_arms_spend_the_same_fresh_rollouts_and_reject_unknown_arms():
    for arm in D.TOY_ARMS:
        r = D.toy_run(arm, 0, steps=10, eval_every=5)
        assert r["rollouts"].tolist() == [0, 320, 640]
        assert np.isfinite(r["accuracy"]).all() and 0 <= r["zero_var"].min() <= r["zero_var"].max() <= 1
    with pytest.raises(ValueError, match="unknown toy arm"):
        D.toy_run("nope", 0, steps=1)
    with pytest.raises(ValueError, match="unknown LM arm"):
        D.run_lm_cell("nope", 0, {})


def test_studies_cells_stand_alone():
    """The last cell of each grid (the toy's study is HeaPA's, with this chapter's arms), run with the
    others, equals the same cell run alone (the timing aside); a bad arm is refused with the arms named."""
    import rlcourse
    from rlcourse.studies import curriculum_toy as toy
    from rlcourse.studies import data_scarcity as DS
    from rlcourse.studies.runner import run_study

    toy_s = toy.toy_study(D.TOY_ARMS, 2, steps=12)
    lm_s = DS.lm_study(rlcourse.profile("smoke"), arms=("uniform", "replay"), seeds=2)
    assert toy_s.cells()[-1] == ("oracle", 1) and lm_s.cells()[-1] == ("replay", 1)
    got = run_study(toy_s, jobs=1, cache=False).metrics[("oracle", 1)]
    assert got == toy.run_toy_cell("oracle", 1, dict(toy_s.sizes))
    got = run_study(lm_s, jobs=1, cache=False).metrics[("replay", 1)]
    assert {**got, "seconds": 0} == {**DS.run_lm_cell("replay", 1, dict(lm_s.sizes)), "seconds": 0}
    for run, s in ((toy.run_toy_cell, toy_s), (DS.run_lm_cell, lm_s)):
        with pytest.raises(ValueError, match="the arms are .*'replay'"):
            run("no such arm", 0, dict(s.sizes))


def test_toy_claims_are_fixed_before_the_run():
    c = D.toy_claims(25600, 0.75)
    assert {"control", "pass_filter", "synth_easier", "heapa", "replay", "synth_vs_filter"} == set(c)
    assert all(v.margin == 0.0 and v.kind == "less" for v in c.values())
    lm = D.lm_claims(2304, 0.1)
    assert lm["control"].kind == "greater" and lm["control"].baseline == "base"
