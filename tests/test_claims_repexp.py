"""The RepExp chapter's claims, in the book profile (slow: `pytest -m claims`).

The same experiment functions, with the same arguments, as book/repexp.md: the test-time selection
(`run_inference`, decided by `inference_verdicts`, prompts as the paired replicates) and the RL run
(`run_rl`, `rl_verdicts`, P.seeds seeds per arm).

What is asserted follows from the claims, not from a run's numbers:
- the testbed can show the test-time effect: the planted positive controls (the elliptical order on
  uncentred one-hots of the mode) need fewer verifier calls than the random order, on all prompts and
  on the odd n (both hold);
- the elliptical order on the hidden states is not worse than random at finding a correct sample on
  the prompts where the likeliest mode is wrong, the case the method is for (its effect is negative);
- the hidden-feature claims rest on their planted controls (control=): they are "uninformative" exactly
  when the control did not hold;
- every verdict is computed over its replicates with the interval matching its word (a "holds" of a
  less-claim has an interval below 0, and so on), and the RL verdicts use P.seeds paired seeds.

Records of earlier versions of this experiment (verdicts then on percentile-bootstrap intervals, not
gated on their controls). The first version's planted control used centred one-hots and did not hold (+2.22 calls
against random, [0.29, 4.24] over 48 prompts). The chapter's proposition prop-repexp-centred-onehot
is why: centred one-hots are linearly dependent, so the commonest mode (right on even n) came after
the repeats. Changed before the next run: the planted features are not centred, and the odd-n
comparison has its own control; nothing else. The next run (`run_inference` in the book profile,
125 s at load ~3): control holds -1.19 [-2.00, -0.53], odd-n control holds -2.66 [-4.52, -1.20]; the
hidden-feature order is inconclusive on all prompts (-0.62 [-1.64, 0.25]) and on the 19 odd n (-1.66
[-3.94, 0.39]), pass@4 of the selected inconclusive (+0.067 [-0.024, 0.155]).

RL, first run (2 Dec, 30 steps at 1e-4, 3 seeds): pass@1 within 0.05 holds, pass@32 does not hold (+0,
every arm at 1.0), distinct correct modes and the RL planted control inconclusive: plain GRPO had not
narrowed the modes, so there was nothing for a bonus to keep. A sweep on seeds 10-12 (not the
chapter's; GRPO and the planted arm only; steps {30, 90} x lr {1e-4, 3e-4}) found the collapse only at
90 steps and 3e-4, and that budget (repexp.RL_STEPS, RL_LR) is used for every arm since (committed on
4 Dec 2026). The first run at that budget (`run_rl`, 88 s): the RL planted control holds (+0.344 distinct modes [0.281, 0.375]); pass@32
inconclusive (+0.021 [0.0, 0.062]; GRPO 0.74, RepExp 0.76, base 0.969); pass@1 within 0.05 holds;
distinct modes inconclusive (+0.0 [-0.031, 0.031]). So the RL testbed can show the effect (asserted
below), and the hidden-feature bonus did not show it.

4 Dec 2026, this file in the book profile (fresh machine, load ~3 with a book build beside it): all three
tests passed (inference 130 s, the whole file 235 s). The first try failed on this file's own check that
every inference verdict counts all kept prompts: the odd-n verdicts (added on 3 Dec) count the odd-n
prompts; the check now says so per verdict.
The chapter in a fresh-clone make book the same day (195 s): inference controls hold (-1.19 [-2.01, -0.54];
odd n -2.69 [-4.54, -1.23]), the hidden-feature order inconclusive (-0.51 [-1.53, 0.42]; odd n -1.69
[-3.97, 0.35]); RL planted control holds (+0.344 distinct modes [0.188, 0.438]), pass@32 inconclusive
(0.740 both), distinct modes inconclusive (-0.021 [-0.094, 0.031]), pass@1 within 0.05 holds.
The sweep scored on the same held-out prompts as these verdicts; run_rl(prompts="choose") now gives a
disjoint set for choosing. The current version (gated verdicts on t-intervals, the uncentred hidden
order as an unclaimed line) passed here in the book profile on 6 Dec 2026: alone (3 passed, 362 s) and in a
fresh-clone make claims JOBS=2.
"""
import numpy as np
import pytest

import rlcourse
from rlcourse.studies import repexp


@pytest.fixture(scope="module")
def P():
    return rlcourse.profile("book")


def _consistent(v):
    k, m = v.claim.kind, v.claim.margin
    if v.verdict == "holds":
        assert (k == "greater" and v.low > m) or (k == "less" and v.high < -m) or \
               (k == "equivalent" and -m <= v.low and v.high <= m)
    if v.verdict == "does not hold":
        assert (k == "greater" and v.high <= m) or (k == "less" and v.low >= -m) or \
               (k == "equivalent" and (v.low > m or v.high < -m))


@pytest.fixture(scope="module")
def inference(P):
    out = repexp.run_inference(P)
    return out, repexp.inference_verdicts(out)


@pytest.mark.claims
def test_inference_controls(inference):
    out, v = inference
    assert v["control"].holds, v["control"].sentence()
    assert v["control_hard"].holds, v["control_hard"].sentence()


@pytest.mark.claims
def test_inference_claims(inference):
    out, v = inference
    assert v["calls_hard"].effect < 0, v["calls_hard"].sentence()
    for name, ctrl in (("calls", "control"), ("pass4", "control"), ("calls_hard", "control_hard")):
        assert (v[name].verdict == "uninformative") == (not v[ctrl].holds), name
    for name, verdict in v.items():
        _consistent(verdict)
        # prompts are the units: every kept prompt, or the kept prompts with odd n for the *_hard claims
        assert verdict.seeds == (int(out["hard"].sum()) if name.endswith("_hard") else out["kept"]), name


@pytest.mark.claims
def test_rl_claims(P):
    out = repexp.run_rl(P)
    v = repexp.rl_verdicts(out)
    assert v["control"].verdict == "holds", v["control"].sentence()  # the RL testbed can show the effect
    for verdict in v.values():
        _consistent(verdict)
        assert verdict.seeds == P.seeds
    for arm in out["arms"]:
        assert np.all(np.diff([out["passk"][arm][k].mean() for k in out["ks"]]) >= -1e-9)  # pass@k rises with k
