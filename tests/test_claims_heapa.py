"""HeaPA's claims in the book profile: the exact curriculum toy, every arm on the same seeds.

Thresholds follow from the claims (fewer rollouts to the target: an effect below zero; a positive
control that must hold before any verdict against HeaPA is read), not from a run.

Book run of the chapter (2026-12-02, 12:43-12:46 UTC): 209 s wall, 59.5 s user, load average 11.5-12.8
on 2 cores shared with other jobs (an earlier toy-only run: 25.8 s wall, 16.7 s user at load 0.5-1.6);
the toy took 9 s, the tiny-LM runs 129 s; building the heapa_addition base model (once, then cached)
took 404 s under load 9-16. Toy, 5 seeds, budget 25,600 rollouts, target 0.75; mean rollouts to the
target: uniform 14720, pass_filter (now named skip_extremes) 8064, heapa 7552, heapa_fixed 11328, heapa_boundary 21760 (4 of 5
runs censored), oracle 6848. heapa - uniform -7168 [-8576, -5760], holds; oracle - uniform -7872
[-8256, -7488], holds; heapa - heapa_fixed -3776 [-4864, -2688], holds; zero-variance share heapa
0.622 vs uniform 0.758, -0.136 [-0.166, -0.113], holds. No heapa run was censored. Sign-flip p =
0.0625 for each (the smallest five seeds allow). This file tests the toy only.

Tiny LM (3 seeds, lr 1e-4, budget 2,304 rollouts, base accuracy 0.549 by level 0.67/0.84/0.03/0.66,
target 0.649): rollouts to target heapa 341 vs uniform 512, -171 [-768, 256], inconclusive; all-equal
groups 0.410 vs 0.471, -0.061 [-0.163, 0.056], inconclusive; final accuracy 0.697 vs 0.694. A first
run at lr 3e-4 lowered both arms (final 0.07 heapa, 0.33 uniform; all runs censored) and was
discarded for the lab notes' rate. The LM claims are not asserted here: without an oracle arm an
inconclusive or negative LM verdict is no evidence either way.

Toy re-run of 5 Dec 2026 in the book profile, after the toy runner was merged with the data-scarcity
chapter's (rlcourse.studies.curriculum_toy; the same random stream as before, so the same counts), on
Student-t intervals: heapa - uniform -7168 [-9461, -4875] holds; oracle - uniform -7872 [-8475, -7269]
holds; growth -3776 [-5540, -2012] holds; wasted groups -0.136 [-0.178, -0.093] holds; and the new
claim heapa - skip_extremes -512 [-2450, 1426], inconclusive.
"""
import pytest

import rlcourse
from rlcourse.claims import evaluate
from rlcourse.studies import heapa as study

pytestmark = pytest.mark.claims


@pytest.fixture(scope="module")
def toy():
    return study.toy_experiment(rlcourse.profile("book"))


def test_positive_control_the_oracle_needs_fewer_rollouts_than_uniform(toy):
    c = study.toy_claims(toy["budget"], toy["sizes"]["target"])["control"]
    v = evaluate(c, toy["to_target"]["oracle"], toy["to_target"]["uniform"])
    assert v.seeds >= 5 and v.holds, v.sentence()


def test_heapa_reaches_the_target_with_fewer_rollouts_than_uniform(toy):
    c = study.toy_claims(toy["budget"], toy["sizes"]["target"])["fewer"]
    v = evaluate(c, toy["to_target"]["heapa"], toy["to_target"]["uniform"])
    assert toy["censored"]["heapa"] == 0, "a censored HeaPA run makes the comparison optimistic"
    assert v.high < 0 and v.holds, v.sentence()


def test_growth_and_wasted_groups(toy):
    claims = study.toy_claims(toy["budget"], toy["sizes"]["target"])
    growth = evaluate(claims["growth"], toy["to_target"]["heapa"], toy["to_target"]["heapa_fixed"])
    waste = evaluate(claims["waste"], toy["zero_var"]["heapa"], toy["zero_var"]["uniform"])
    assert growth.holds, growth.sentence()
    assert waste.holds, waste.sentence()


def test_the_weak_level_is_the_base_models_not_the_tasks():
    """The LM experiment's base model (pre-training seed 0) answers 3-digit sums far worse than 4-digit
    ones, and its answers are well-formed at every level (wrong sums, not a wrong format); a base model
    pre-trained from seed 1 is weakest at another level, with its answers there mostly well-formed too.
    So which level is weakest belongs to the pre-trained model, not to the task or its format.

    Fresh-clone make claims of 6 Dec 2026, accuracy by level (1-4 digits), well-formed share:
    seed 0 0.667 / 0.844 / 0.031 / 0.656, well-formed 1.0 at every level; seed 1 1.0 / 0.969 / 0.188 /
    0.047, well-formed 1.0 / 1.0 / 0.797 / 0.922. An earlier version of this test asked seed 1 for
    well-formed answers at every level too, which the chapter never claims (it reads seed 0's forms):
    seed 1 writes a malformed answer to a fifth of the 3-digit prompts, not at its weakest level."""
    P = rlcourse.profile("book")
    seed0, seed1 = study.completion_forms(P, seed=0), study.completion_forms(P, seed=1)
    assert min(seed0["well_formed"]) >= 0.9, seed0["well_formed"]
    weakest = [min(range(4), key=lambda d: f["accuracy"][d]) for f in (seed0, seed1)]
    assert weakest[0] != weakest[1], (seed0["accuracy"], seed1["accuracy"])
    assert seed1["well_formed"][weakest[1]] >= 0.9, seed1["well_formed"]
