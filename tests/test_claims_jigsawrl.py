"""The JigsawRL chapter's claim, in the book profile: multiplexing and tail migration raise
throughput when rollout lengths are heavy-tailed, and the gain shrinks to nothing as the tail vanishes."""
import numpy as np
import pytest

import rlcourse
from rlcourse.studies.jigsawrl import jigsaw_verdicts, run_jigsaw_experiment, run_measured_jigsaw_experiment


@pytest.mark.claims
def test_jigsaw_gain_grows_with_tail_weight():
    out = run_jigsaw_experiment(rlcourse.profile("book"))
    sigmas, gain = out["sigmas"], {s: g.mean(axis=0) for s, g in out["gain"].items()}
    assert sigmas[0] == 0.0
    # no tail: the stage-level schedule is already perfectly packed, and nothing beats it
    for s in ("multiplex", "migrate", "lookahead"):
        assert gain[s][0] == pytest.approx(1.0, abs=1e-9)
    # the gain grows with the tail weight (monotone in the mean over seeds)
    for s in ("multiplex", "migrate", "lookahead"):
        assert np.all(np.diff(gain[s]) > 0), (s, gain[s])
    # ordering at every tail weight > 0: stage < multiplex < migrate <= lookahead
    heavy = sigmas > 0
    assert np.all(gain["multiplex"][heavy] > 1.0)
    assert np.all(gain["migrate"][heavy] > gain["multiplex"][heavy])
    assert np.all(out["gain"]["lookahead"] >= out["gain"]["migrate"] - 1e-9)
    assert np.all(out["gain"]["lookahead"] >= 1.0 - 1e-9)
    # the paper's claim at sigma = 1, from the chapter's claim objects: the look-ahead's throughput
    # exceeds the stage-level (verl-like) throughput (gain > 1 over the seeds' interval), and migration
    # with the look-ahead exceeds multiplexing alone; the abstract's "up to 1.85x" is a maximum over its
    # set-ups, so it is no threshold here (see rlcourse.studies.jigsawrl)
    verdicts = jigsaw_verdicts(out, sigma=1.0)
    assert verdicts["gain"].verdict == "holds", verdicts["gain"].sentence()
    assert verdicts["migration"].verdict == "holds", verdicts["migration"].sentence()
    # multiplexing alone cannot beat the area/critical-path bound of its own graph
    assert np.all(out["gain"]["multiplex"] <= out["bound_gain"] + 1e-9)
    # with a single pipeline there is nothing to multiplex with
    p = list(out["pipelines"])
    assert out["gain_by_pipelines"]["multiplex"][:, p.index(1)] == pytest.approx(1.0, abs=1e-9)


@pytest.mark.claims
def test_jigsaw_claim_with_costs_measured_on_rlcourse_loop():
    """The same claim on stage costs measured on rlcourse's own loop (CPU, tiny LM): the gain still
    vanishes with the tail and grows with it; it is smaller than with the synthetic costs, because
    training costs more per token relative to decoding (Amdahl); and the loop's own response lengths
    sit at the no-tail end of the axis."""
    from rlcourse.systems import StageCosts, sample_lengths, simulate, stage_rollout_share

    prof = rlcourse.profile("book")
    out = run_measured_jigsaw_experiment(prof)
    costs = out["costs"]
    assert costs.decode_step == 1.0
    assert all(np.isfinite(v) and v >= 0 for v in vars(costs).values())
    sw = out["sweep"]
    sigmas, gain = sw["sigmas"], {s: g.mean(axis=0) for s, g in sw["gain"].items()}
    for s in ("multiplex", "migrate", "lookahead"):
        assert gain[s][0] == pytest.approx(1.0, abs=1e-9)
        assert np.all(np.diff(gain[s]) > 0), (s, gain[s])
    assert np.all(sw["gain"]["lookahead"] >= sw["gain"]["migrate"] - 1e-9)
    assert np.all(sw["gain"]["multiplex"] <= sw["bound_gain"] + 1e-9)
    # smaller than with the synthetic costs at sigma = 1, and the rollout share says why
    synthetic = run_jigsaw_experiment(prof)
    verdicts = jigsaw_verdicts(synthetic, out, sigma=1.0)
    # the paper's direction holds with the measured costs too (look-ahead gain > 1 over the seeds)
    assert verdicts["gain-measured"].verdict == "holds", verdicts["gain-measured"].sentence()
    i1 = int(np.argmin(np.abs(sigmas - 1.0)))
    assert gain["lookahead"][i1] < synthetic["gain"]["lookahead"].mean(axis=0)[i1]
    z = np.random.default_rng([0, 0]).standard_normal((3, 3, 128))
    L = sample_lengths(z, 256, 1.0, 4096)
    s_meas = stage_rollout_share(simulate(L, 4, costs, "stage"), 4)
    s_syn = stage_rollout_share(simulate(L, 4, StageCosts(), "stage"), 4)
    assert s_meas["s"] < s_syn["s"] and s_meas["amdahl"] < s_syn["amdahl"]
    # the tiny LM's own lengths: a light tail, and (almost) nothing to gain
    i05 = int(np.argmin(np.abs(sigmas - 0.5)))
    assert out["own_sigma"] < 0.5
    assert np.all(out["own_gain"]["lookahead"] >= 1.0 - 1e-9)
    assert out["own_gain"]["lookahead"].mean() < min(1.05, gain["lookahead"][i05])
    # the chapter's computed verdict on the own lengths (margin 0 counts any gain): the look-ahead's small
    # gain is above 1 in every seed's interval, so it holds; its size is what the assert above bounds
    assert verdicts["gain-own-lengths"].verdict == "holds", verdicts["gain-own-lengths"].sentence()
