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

No book run of this file or of the chapter has been made yet: the book-profile base model (1,500 SFT
steps on repexp_divisor) was still being built when the chapter was first committed, on a machine
under a load of 20 to 30; the smoke profile executes the chapter (308 s under that load).
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


@pytest.mark.claims
def test_inference_claims(P):
    out = repexp.run_inference(P)
    v = repexp.inference_verdicts(out)
    assert v["control"].holds, v["control"].sentence()
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
