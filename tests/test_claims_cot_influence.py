"""CIR/SR claims in the book profile: the experiment function the chapter calls.

Asserted, with thresholds from the claims and controls, not from a run: GRPO raises accuracy over the
base by more than the claim's margin (0.02); the positive control holds (the SFT warm-up ends with a
CIR more than 0.02 nats above GRPO's, so the metric can move on this model); every CIR lies in
[0, log 2]; and the path proposition's prediction: when GRPO raises the share of faithful-looking
scratchpads by more than 0.1 while the base's faithful path is the more accurate, CIR rises too. The
paper's claims that can come out either way (GRPO lowers CIR; the CIR reward raises CIR and SR and
keeps accuracy) are evaluated and their verdicts checked against the decision rule, not asserted.

Book run (3 seeds, 30 GRPO steps of 8 prompts x 8 samples, 96 held-out prompts x 4 samples;
2 Dec 2026, 12:22-12:28 UTC, load ~14 on 2 cores: 298 s wall for the experiment including the first
build of the base model, 47 s of CPU for the whole script). Means: base accuracy 0.372, CIR 0.197,
SR 0.325, all-digit thinks 0.478; GRPO 0.727 / 0.406 / 0.735 / 0.948; SFT+GRPO 0.939 / 0.455 / 0.940 /
0.992; GRPO+CIR 0.753 / 0.409 / 0.762 / 0.947. Verdicts: GRPO raises accuracy +0.354 [0.331, 0.378]
holds; GRPO lowers CIR +0.209 [0.201, 0.217] does not hold (CIR rose); SFT warm-up raises CIR +0.049
[0.044, 0.057] holds; CIR reward raises CIR +0.002 [-0.003, 0.006] does not hold; CIR reward raises SR
+0.027 [0.013, 0.039] inconclusive; CIR reward keeps accuracy within 0.05 +0.026 [0.016, 0.042] holds;
sign-flip p = 0.25 or 0.5 (3 seeds). The chapter then executed in the book profile (base model cached)
in 157 s (166 s wall, 38 s CPU; load ~16, 12:39-12:42 UTC) with the same numbers and verdicts; this file passed in the book profile (2 passed, 220 s; 240 s wall,
59 s CPU; load ~12, 12:47-12:51 UTC).
"""
import math

import numpy as np
import pytest

import rlcourse
from rlcourse.claims import decide
from rlcourse.methods import cot_influence as ci

pytestmark = pytest.mark.claims


@pytest.fixture(scope="module")
def result():
    return ci.run_experiment(rlcourse.profile())


def test_controls_and_accuracy(result):
    V = ci.verdicts(result)
    assert V["grpo_accuracy"].verdict == "holds", V["grpo_accuracy"].sentence()
    assert V["sft_cir"].verdict == "holds", V["sft_cir"].sentence()  # the positive control
    for rs in result["runs"].values():
        for r in rs:
            assert 0.0 <= r["after"]["cir"] <= math.log(2)


def test_path_proposition_and_verdict_consistency(result):
    before = np.mean([b["faithful_share"] for b in result["before"]])
    after = np.mean([r["after"]["faithful_share"] for r in result["runs"]["GRPO"]])
    cir0 = np.mean([b["cir"] for b in result["before"]])
    cir1 = np.mean([r["after"]["cir"] for r in result["runs"]["GRPO"]])
    if after - before > 0.1 and result["paths"]["faithful"] > result["paths"]["filler"]:
        assert cir1 > cir0, (before, after, cir0, cir1)
    for v in ci.verdicts(result).values():
        assert v.verdict == decide(v.claim.kind, v.claim.margin, v.low, v.high, v.seeds)
