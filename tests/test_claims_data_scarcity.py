"""Data-scarcity survey: the comparison's claims in the book profile, the exact toy only (every arm on
the same seeds).

Thresholds follow from the claims (fewer rollouts to the target: an effect below zero, margin 0; the
positive control must hold before any verdict against an arm is read), never from a run.

Toy run in the book profile (2026-12-02, about 19:00 UTC, 25 s wall under load 5-7 while a base model
was being built): 5 seeds, budget 25,600 fresh rollouts, target 0.75; mean rollouts to the target:
uniform 14,592, pass_filter 8,128, synth_easier 8,576, heapa 7,232, replay 20,928, oracle 6,912; no
run censored. A first toy run with an 8-step cooldown made the filter a no-op (13,824 for pass_filter)
and was discarded for the cooldown in passes over the pool (see the chapter). Book run of the whole chapter (2026-12-02, 20:28-20:30 UTC): 95.1 s wall, 94.5 s user, load average
0.1-0.6 (the base model already cached). Toy verdicts (effect in rollouts, 95% interval): oracle -
uniform -7680 [-8064, -7296] holds; pass_filter -6464 [-6848, -5952] holds; synth_easier -6016
[-6464, -5504] holds; heapa -7360 [-8192, -6208] holds; replay +6336 [5824, 6848] does not hold;
synth_easier - pass_filter +448 [-64, 960] inconclusive. Tiny LM (3 seeds, budget 2,304 rollouts,
base accuracy 0.565, target 0.665, checks every 256 rollouts): control uniform final accuracy 0.690
vs base 0.565, +0.125 [0.115, 0.146] holds; rollouts to target vs uniform (1024/256/256): pass_filter
0 [0, 0] does not hold (the same counts on every seed at this check grid), synth_easier -256 [-768,
0] inconclusive, heapa 0 [-256, 256] inconclusive, replay -171 [-512, 0] inconclusive. The LM claims
are not asserted here: the book base model (built once in 1,033 s under load) is not in the tests'
fresh cache, and three seeds on a 256-rollout grid decide little.

The records above are an earlier version of this experiment (percentile-bootstrap intervals; the replay
arm's step divided by fresh plus replayed groups; its own toy runner with another random stream). The
toy re-run of 5 Dec 2026 in the book profile (8 s for the toy; one runner shared with HeaPA, every
step normalised by the fresh rollouts; Student-t intervals; 5 seeds): uniform 14,720, pass_filter
8,000, synth_easier 8,512, heapa 7,552, replay 14,208, oracle 6,848, none censored. Oracle - uniform
-7872 [-8475, -7269] holds; pass_filter -6720 [-7348, -6092] holds; synth_easier -6208 [-6741, -5675]
holds; heapa -7168 [-9461, -4875] holds; replay -512 [-1905, 881] inconclusive (was "does not hold",
+6336, under the old normalisation); synth_easier - pass_filter +512 [59, 965] does not hold. The LM
arms were not re-run.
"""
import pytest

import rlcourse
from rlcourse.claims import evaluate
from rlcourse.methods import data_scarcity as D

pytestmark = pytest.mark.claims


@pytest.fixture(scope="module")
def toy():
    return D.toy_experiment(rlcourse.profile("book"))


def _verdict(toy, key, method, baseline):
    claims = D.toy_claims(toy["budget"], toy["sizes"]["target"])
    control = None
    if claims[key].control is not None:
        control = evaluate(claims["control"], toy["to_target"]["oracle"], toy["to_target"]["uniform"])
    return evaluate(claims[key], toy["to_target"][method], toy["to_target"][baseline], control=control)


def test_positive_control_the_oracle_needs_fewer_rollouts_than_uniform(toy):
    v = _verdict(toy, "control", "oracle", "uniform")
    assert v.seeds >= 5 and v.holds, v.sentence()


@pytest.mark.parametrize("arm", ["pass_filter", "heapa"])
def test_filtering_and_heapa_need_fewer_rollouts_than_uniform(toy, arm):
    assert _verdict(toy, "control", "oracle", "uniform").holds
    v = _verdict(toy, arm, arm, "uniform")
    assert v.holds, v.sentence()


def test_every_arm_spends_the_same_budget(toy):
    for runs in toy["runs"].values():
        assert all(r["rollouts"][-1] == toy["budget"] for r in runs)
