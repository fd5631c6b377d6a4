"""The RepExp chapter's claims, in the book profile (slow: `pytest -m claims`).

The same experiment functions, with the same arguments, as book/repexp.md: the test-time selection
(`run_inference`, decided by `inference_verdicts`, prompts as the paired replicates) and the RL run
(`run_rl`, `rl_verdicts`, P.seeds seeds per arm).

What is asserted follows from the claims, not from a run's numbers:
- the testbed can show the test-time effect: the planted positive control (the elliptical order on
  features that separate the modes exactly) needs fewer verifier calls than the random order (holds);
- the elliptical order on the hidden states is not worse than random at finding a correct sample on
  the prompts where the likeliest mode is wrong, the case the method is for (its effect is negative);
- every verdict is computed over its replicates with the interval matching its word (a "holds" of a
  less-claim has an interval below 0, and so on), and the RL verdicts use P.seeds paired seeds.

Book run (2 Dec 2026, this machine at load ~1-3): the chapter executed in the book profile in 143 s,
building its base model; this file ran in 182 s and the planted control did not hold (+2.22 verifier calls against the random order, [0.29, 4.24] over 48
prompts), so the test-time testbed cannot show the effect and its other verdicts (all prompts -0.51
[-1.53, 0.42], odd n -1.69 [-3.97, 0.35], pass@4 of the selected -0.036 [-0.152, 0.075]) are
inconclusive for want of a working testbed, as the chapter now says from the run. A likely cause: the
planted features spread the first samples over the modes, which costs calls on the even n where the
likeliest mode is already right. The assert stays, as a strict expected failure (test_inference_control):
the control needs redesigning (fixed before the next run), not this threshold. RL (3 seeds): pass@1 within 0.05 holds, pass@32 does not hold (+0, every
arm at 1.0), distinct correct modes and the RL planted control inconclusive.
"""
import numpy as np
import pytest

import rlcourse
from rlcourse.methods import repexp


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


# A known failure, recorded rather than hidden: strict, so the day the control holds this test fails
# (XPASS) and the marker, the chapter's reading and this docstring must be updated together.
@pytest.mark.claims
@pytest.mark.xfail(strict=True, reason="book run of 2 Dec 2026: the planted test-time control did not hold "
                   "(+2.22 calls, [0.29, 4.24]); the testbed needs redesigning")
def test_inference_control(inference):
    out, v = inference
    assert v["control"].holds, v["control"].sentence()


@pytest.mark.claims
def test_inference_claims(inference):
    out, v = inference
    assert v["calls_hard"].effect < 0, v["calls_hard"].sentence()
    for verdict in v.values():
        _consistent(verdict)
        assert verdict.seeds == out["kept"]


@pytest.mark.claims
def test_rl_claims(P):
    out = repexp.run_rl(P)
    v = repexp.rl_verdicts(out)
    for verdict in v.values():
        _consistent(verdict)
        assert verdict.seeds == P.seeds
    for arm in out["arms"]:
        assert np.all(np.diff([out["passk"][arm][k].mean() for k in out["ks"]]) >= -1e-9)  # pass@k rises with k
