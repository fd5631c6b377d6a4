"""The JigsawRL simulator against closed forms, hand computations and provable properties."""
import numpy as np
import pytest

import rlcourse
from rlcourse.systems import (SCHEDULERS, StageCosts, bottom_levels, build_graph, decode_time,
                              exponential_idle_fraction, fit_decode_cost, list_schedule, lookahead_schedule,
                              measure_stage_costs, migration_saving, resample_lengths,
                              sample_lengths, simulate, split_tail, stage_costs_from_seconds,
                              stage_rollout_share, sync_idle_fraction, tail_weight, time_decode_steps,
                              time_prefill)
from rlcourse.studies.jigsawrl import run_jigsaw_experiment

# Graham (1969), "Bounds on multiprocessing timing anomalies": nine tasks, list order T1..T9.
GRAHAM_D = [3, 2, 2, 2, 4, 4, 4, 4, 9]
GRAHAM_PREDS = [(), (), (), (), (3,), (3,), (3,), (3,), (0,)]
GRAHAM_PRIO = -np.arange(9.0)


def random_dag(rng, n, p_edge=0.15, max_d=10):
    """A random DAG in topological order, with integer durations (exact float arithmetic)."""
    d = rng.integers(0, max_d + 1, size=n).astype(float)
    preds = [tuple(int(u) for u in range(v) if rng.random() < p_edge) for v in range(n)]
    return d, preds


def assert_valid(sched, d, preds, m):
    """Precedence, one task at a time per worker, durations, and work conservation."""
    d = np.asarray(d, float)
    np.testing.assert_allclose(sched.finish - sched.start, d)
    for v, ps in enumerate(preds):
        for u in ps:
            assert sched.start[v] >= sched.finish[u] - 1e-9
    busy = np.zeros(m)
    for w in range(m):
        idx = np.where(sched.worker == w)[0]
        idx = idx[np.lexsort((sched.finish[idx], sched.start[idx]))]
        assert np.all(sched.start[idx][1:] >= sched.finish[idx][:-1] - 1e-9)
        busy[w] = d[idx].sum()
    assert busy.sum() == pytest.approx(d.sum())  # every unit of work is done exactly once


def test_decode_time_closed_form_matches_step_by_step():
    rng = np.random.default_rng(0)
    for _ in range(20):
        L = rng.integers(1, 60, size=rng.integers(1, 12))
        a, b = rng.uniform(0.1, 2), rng.uniform(0, 0.5)
        steps = sum(a + b * np.sum(L >= t) for t in range(1, L.max() + 1))
        assert decode_time(L, a, b) == pytest.approx(steps, rel=1e-12)


def test_one_worker_makespan_is_the_sum_for_every_scheduler():
    costs = StageCosts(decode_per_seq=0.0)
    L = np.full((2, 2, 8), 10)  # constant stage times
    for s in SCHEDULERS:
        res = simulate(L, 1, costs, s)
        assert res.makespan == pytest.approx(res.graph.work, rel=1e-12)
        assert res.idle_fraction(1) == pytest.approx(0.0, abs=1e-12)
    # the sum itself, by hand: per (p, k): a*10 + 8 * 10 * (reward + ref + train per token)
    per_iter = 10 * costs.decode_step + 80 * (costs.reward_per_token + costs.ref_per_token + costs.train_per_token)
    assert simulate(L, 1, costs, "stage").makespan == pytest.approx(4 * per_iter, rel=1e-12)


def test_stage_level_makespan_is_sum_over_stages_of_the_slowest_subtask():
    rng = np.random.default_rng(1)
    costs = StageCosts()
    L = rng.integers(1, 300, size=(3, 2, 16))
    M = 4
    res = simulate(L, M, costs, "stage")
    expected = 0.0
    for k in range(2):
        for p in range(3):
            tok = L[p, k].sum()
            expected += max(decode_time(s, costs.decode_step, costs.decode_per_seq) for s in L[p, k].reshape(M, -1))
            expected += (costs.reward_per_token + costs.ref_per_token + costs.train_per_token) * tok / M
    assert res.makespan == pytest.approx(expected, rel=1e-12)


def test_hand_built_two_pipeline_graph():
    # P=2, K=1, B=2, M=2, a=1, b=0. Pipeline 0 shards 1 and 3 tokens, pipeline 1 shards 2 and 2.
    costs = StageCosts(decode_step=1.0, decode_per_seq=0.0, reward_per_token=0.5, ref_per_token=0.5,
                       train_per_token=1.0)
    L = np.array([[[1, 3]], [[2, 2]]])
    # stage: pipeline 0 = 3 + 1 + 1 + 2 = 7, pipeline 1 = 2 + 1 + 1 + 2 = 6.
    assert simulate(L, 2, costs, "stage").makespan == 13.0
    # multiplex: W = 12 + 12 = 24 on 2 workers, and the greedy schedule has no idle time.
    res = simulate(L, 2, costs, "multiplex")
    assert res.graph.work == 24.0
    assert res.makespan == 12.0


def test_graham_anomalies_reproduced():
    assert list_schedule(GRAHAM_D, GRAHAM_PREDS, 3, GRAHAM_PRIO).makespan == 12.0
    assert list_schedule(GRAHAM_D, GRAHAM_PREDS, 4, GRAHAM_PRIO).makespan == 15.0   # more workers
    shorter = np.array(GRAHAM_D) - 1
    assert list_schedule(shorter, GRAHAM_PREDS, 3, GRAHAM_PRIO).makespan == 13.0    # shorter tasks
    fewer = [()] * 8 + [(0,)]
    assert list_schedule(GRAHAM_D, fewer, 3, GRAHAM_PRIO).makespan == 16.0          # fewer constraints


def test_list_schedule_bounds_validity_and_work_conservation_on_random_dags():
    rng = np.random.default_rng(2)
    for _ in range(60):
        n, m = int(rng.integers(1, 40)), int(rng.integers(1, 6))
        d, preds = random_dag(rng, n)
        s = list_schedule(d, preds, m)
        assert_valid(s, d, preds, m)
        W, cp = d.sum(), bottom_levels(d, preds).max()
        assert s.makespan >= max(W / m, cp) - 1e-9                      # lower bounds
        assert s.makespan <= W / m + (1 - 1 / m) * cp + 1e-9            # Graham's bound
        # work-conserving: a task that waits after becoming ready waits because all workers are busy
        for v in range(n):
            ready = max([s.finish[u] for u in preds[v]], default=0.0)
            if s.start[v] > ready + 1e-9:
                busy = np.sum((s.start <= ready + 1e-12) & (s.finish > ready + 1e-12))
                assert busy == m


def test_bottom_levels_by_hand():
    # chain 0 -> 1 -> 3 and 0 -> 2 -> 3
    bl = bottom_levels([1.0, 5.0, 2.0, 3.0], [(), (0,), (0,), (1, 2)])
    np.testing.assert_allclose(bl, [9.0, 8.0, 5.0, 3.0])


def test_lookahead_width_one_is_greedy_and_never_worse():
    rng = np.random.default_rng(3)
    improved = 0
    for _ in range(40):
        n, m = int(rng.integers(2, 25)), int(rng.integers(2, 4))
        d, preds = random_dag(rng, n)
        g = list_schedule(d, preds, m)
        one = lookahead_schedule(d, preds, m, width=1)
        assert one.order == g.order and np.array_equal(one.start, g.start)
        la = lookahead_schedule(d, preds, m, width=3)
        assert_valid(la, d, preds, m)
        assert la.makespan <= g.makespan + 1e-9
        improved += la.makespan < g.makespan - 1e-9
    assert improved > 0  # the look-ahead does find better schedules on some graphs
    # and on Graham's example with 4 workers it recovers from the anomaly
    assert lookahead_schedule(GRAHAM_D, GRAHAM_PREDS, 4, width=3, priority=GRAHAM_PRIO).makespan < 15.0


def test_migration_saving_identity_and_head_plus_tail():
    rng = np.random.default_rng(4)
    costs = StageCosts(tau=3)
    a, b = costs.decode_step, costs.decode_per_seq
    for _ in range(30):
        shards = [rng.integers(1, 500, size=8) for _ in range(4)]
        mig = migration_saving(shards, costs)
        separate_tails = []
        for j, shard in enumerate(shards):
            c, R = split_tail(shard, costs.tau)
            assert np.count_nonzero(R) <= costs.tau - 1
            tail_j = a * R.max() + b * R.sum()
            separate_tails.append(tail_j)
            # head + the shard's own tail is the unsplit shard
            assert mig["head"][j] + tail_j == pytest.approx(decode_time(shard, a, b), rel=1e-12)
        area_separate = sum(separate_tails)
        assert mig["saving"] == pytest.approx(area_separate - mig["tail"], rel=1e-9, abs=1e-9)
        assert mig["tail"] >= max(separate_tails) - 1e-9  # merging never shortens the pipeline's own tail


def test_migrate_graph_work_is_never_larger():
    rng = np.random.default_rng(5)
    costs = StageCosts()
    z = rng.standard_normal((2, 2, 64))
    for sigma in (0.0, 0.5, 1.0, 1.5):
        L = sample_lengths(z, 256, sigma, 4096)
        w_mux = build_graph(L, 4, costs, "multiplex").work
        w_mig = build_graph(L, 4, costs, "migrate").work
        assert w_mig <= w_mux + 1e-9
        assert build_graph(L, 4, costs, "stage").work == pytest.approx(w_mux, rel=1e-12)


def test_greedy_migration_can_hurt_even_at_zero_cost():
    # Not a property: the chapter's counterexample (migration raises the critical path).
    costs = StageCosts(mig_fixed=0.0, mig_per_token=0.0)
    z = np.random.default_rng(1).standard_normal((2, 2, 64))
    L = sample_lengths(z, 256, 1.0, 4096)
    mux, mig = simulate(L, 4, costs, "multiplex"), simulate(L, 4, costs, "migrate")
    assert mig.work < mux.work
    assert mig.critical_path > mux.critical_path
    assert mig.makespan > mux.makespan


def test_fit_decode_cost_recovers_a_line():
    n = np.array([1, 2, 4, 8, 16, 32, 64])
    a, b = fit_decode_cost(n, 0.02 + 0.0015 * n)
    assert a == pytest.approx(0.02, rel=1e-9) and b == pytest.approx(0.0015, rel=1e-9)
    with pytest.raises(ValueError, match="two different"):
        fit_decode_cost([4, 4], [1.0, 1.1])


def test_perfect_balance_constant_lengths():
    costs = StageCosts()
    L = np.full((3, 2, 32), 200)
    res = {s: simulate(L, 4, costs, s) for s in SCHEDULERS}
    # the stage-level schedule has no idle time, so it meets the W/M lower bound and is optimal
    assert res["stage"].makespan == pytest.approx(res["stage"].work / 4, rel=1e-12)
    for s in SCHEDULERS:
        assert res[s].makespan >= res["stage"].makespan - 1e-9
    assert res["migrate"].migrations == 0
    assert res["lookahead"].makespan == pytest.approx(res["stage"].makespan, rel=1e-12)


def test_lookahead_never_worse_than_stage_and_migrate_on_rollout_graphs():
    costs = StageCosts()
    for seed in range(4):
        z = np.random.default_rng(seed).standard_normal((2, 2, 32))
        for sigma in (0.0, 1.0):
            L = sample_lengths(z, 128, sigma, 2048)
            la = simulate(L, 4, costs, "lookahead").makespan
            assert la <= simulate(L, 4, costs, "stage").makespan + 1e-9
            assert la <= simulate(L, 4, costs, "migrate").makespan + 1e-9


def test_idle_fraction_exponential_closed_form_monte_carlo():
    rng = np.random.default_rng(6)
    for B in (4, 16, 64):
        L = rng.exponential(100.0, size=(20000, B))
        assert sync_idle_fraction(L) == pytest.approx(exponential_idle_fraction(B), rel=0.02)
    assert exponential_idle_fraction(1) == 0.0
    assert exponential_idle_fraction(2) == pytest.approx(1 / 3)


def test_sample_lengths_tail_weight():
    z = np.random.default_rng(7).standard_normal(200000)
    assert np.all(sample_lengths(z, 256, 0.0, 4096) == 256)
    L = sample_lengths(z, 256, 0.5, 100000)
    assert L.mean() == pytest.approx(256, rel=0.01)  # fixed mean, the tail changes
    assert sample_lengths(z, 256, 1.0, 100000).max() > L.max()


def test_determinism_and_bad_inputs():
    prof = rlcourse.profile("smoke")
    a, b = run_jigsaw_experiment(prof, cache=False), run_jigsaw_experiment(prof, cache=False)
    for s in SCHEDULERS:
        np.testing.assert_array_equal(a["throughput"][s], b["throughput"][s])
    with pytest.raises(ValueError, match="multiple"):
        build_graph(np.full((1, 1, 10), 5), 4, StageCosts(), "stage")
    with pytest.raises(ValueError, match="scheduler"):
        simulate(np.full((1, 1, 4), 5), 4, StageCosts(), "fifo")
    with pytest.raises(ValueError, match="cycle"):
        list_schedule([1.0, 1.0], [(1,), (0,)], 2)
    with pytest.raises(ValueError, match=">= 1 token"):
        decode_time([3, 0], 1.0, 0.1)
    with pytest.raises(TypeError, match="whole token"):
        decode_time([3.5], 1.0, 0.1)
    with pytest.raises(ValueError, match="tau"):
        StageCosts(tau=0)
    with pytest.raises(ValueError, match="not a ready task"):
        list_schedule([1.0, 1.0], [(), (0,)], 1, choices=[1])
    with pytest.raises(ValueError, match="dimension"):
        build_graph(np.full((2, 8), 5), 4, StageCosts(), "stage")


# ----------------------------------------------------------------------------------------------
# Measured stage costs
# ----------------------------------------------------------------------------------------------

PER_TOKEN = {"reward": 2e-6, "ref": 3e-5, "train": 1e-4}


def test_stage_costs_from_seconds_divides_by_the_decode_step():
    c = stage_costs_from_seconds((0.002, 0.0001), PER_TOKEN, (0.004, 2e-5), tau=3)
    assert c.decode_step == 1.0 and c.tau == 3
    assert c.decode_per_seq == pytest.approx(0.05, rel=1e-12)
    assert c.reward_per_token == pytest.approx(1e-3, rel=1e-12)
    assert c.ref_per_token == pytest.approx(0.015, rel=1e-12)
    assert c.train_per_token == pytest.approx(0.05, rel=1e-12)
    assert c.mig_fixed == pytest.approx(2.0, rel=1e-12)
    assert c.mig_per_token == pytest.approx(0.01, rel=1e-12)


def test_fit_and_conversion_recover_synthetic_costs_exactly():
    """Seconds generated from known costs at an arbitrary unit give the same costs back."""
    true = StageCosts(decode_per_seq=0.04, reward_per_token=0.001, ref_per_token=0.02, train_per_token=0.07,
                      mig_fixed=1.5, mig_per_token=0.01)
    unit = 0.0013  # seconds per decode step
    sec = true.scaled(unit)
    n = np.array([1, 2, 4, 8, 16, 32, 64], float)
    a, b = fit_decode_cost(n, sec.decode_step + sec.decode_per_seq * n)
    N = np.array([8, 24, 48, 32, 96, 192], float)
    f, g = fit_decode_cost(N, sec.mig_fixed + sec.mig_per_token * N)
    per = {"reward": sec.reward_per_token, "ref": sec.ref_per_token, "train": sec.train_per_token}
    got = stage_costs_from_seconds((a, b), per, (f, g))
    for name in ("decode_step", "decode_per_seq", "reward_per_token", "ref_per_token", "train_per_token",
                 "mig_fixed", "mig_per_token"):
        assert getattr(got, name) == pytest.approx(getattr(true, name), rel=1e-9, abs=1e-12), name


def test_stage_costs_from_seconds_bad_inputs():
    with pytest.raises(ValueError, match="unit"):
        stage_costs_from_seconds((0.0, 1e-4), PER_TOKEN, (1e-3, 1e-5))
    with pytest.raises(ValueError, match="unit"):
        stage_costs_from_seconds((-1e-3, 1e-4), PER_TOKEN, (1e-3, 1e-5))
    with pytest.raises(ValueError, match=">= 0"):
        stage_costs_from_seconds((1e-3, -1e-4), PER_TOKEN, (1e-3, 1e-5))
    with pytest.raises(ValueError, match="decode_fit"):
        stage_costs_from_seconds((1e-3, np.nan), PER_TOKEN, (1e-3, 1e-5))
    with pytest.raises(ValueError, match="prefill_fit"):
        stage_costs_from_seconds((1e-3, 1e-4), PER_TOKEN, (1e-3,))
    with pytest.raises(ValueError, match="keys"):
        stage_costs_from_seconds((1e-3, 1e-4), {"reward": 1e-6, "train": 1e-4}, (1e-3, 1e-5))
    with pytest.raises(ValueError, match="ref"):
        stage_costs_from_seconds((1e-3, 1e-4), {**PER_TOKEN, "ref": float("inf")}, (1e-3, 1e-5))
    with pytest.raises(ValueError, match="factor"):
        StageCosts().scaled(0.0)


def test_time_unit_changes_no_schedule():
    """Proposition (time unit): scaling every cost by lambda scales every makespan by lambda and
    keeps the dispatch order; exact for a power of two, to rounding for any other factor."""
    costs = StageCosts(mig_fixed=1.0)
    for seed in range(3):
        L = sample_lengths(np.random.default_rng(seed).standard_normal((2, 2, 32)), 128, 1.0, 2048)
        for s in SCHEDULERS:
            base = simulate(L, 4, costs, s)
            exact = simulate(L, 4, costs.scaled(2.0**-10), s)
            assert exact.makespan == base.makespan * 2.0**-10
            assert exact.schedule.order == base.schedule.order and exact.migrations == base.migrations
            other = simulate(L, 4, costs.scaled(0.0037), s)
            assert other.makespan / 0.0037 == pytest.approx(base.makespan, rel=1e-9)


def test_amdahl_identity_for_the_stage_schedule():
    """Proposition (Amdahl): M C_stage / W = 1 / (1 - s (1 - u)), and no schedule beats W / M."""
    for seed, sigma in ((0, 0.0), (1, 0.5), (2, 1.0), (3, 1.5)):
        L = sample_lengths(np.random.default_rng(seed).standard_normal((3, 2, 32)), 128, sigma, 4096)
        for costs in (StageCosts(), StageCosts(train_per_token=0.08, ref_per_token=0.03)):
            st = simulate(L, 4, costs, "stage")
            info = stage_rollout_share(st, 4)
            assert 0 < info["s"] <= 1 and 0 < info["u"] <= 1 + 1e-12
            assert info["amdahl"] == pytest.approx(4 * st.makespan / st.work, rel=1e-12)
            assert simulate(L, 4, costs, "multiplex").makespan >= st.makespan / info["amdahl"] - 1e-9
            if sigma == 0.0:
                assert info["u"] == pytest.approx(1.0, rel=1e-12)  # equal shards: a full rollout
    # more expensive training lowers the rollout share s, hence the bound
    L = sample_lengths(np.random.default_rng(9).standard_normal((3, 2, 32)), 128, 1.0, 4096)
    cheap = stage_rollout_share(simulate(L, 4, StageCosts(), "stage"), 4)
    dear = stage_rollout_share(simulate(L, 4, StageCosts(train_per_token=0.1), "stage"), 4)
    assert dear["s"] < cheap["s"] and dear["u"] == pytest.approx(cheap["u"], rel=1e-12)
    assert dear["amdahl"] < cheap["amdahl"]
    with pytest.raises(ValueError, match="stage"):
        stage_rollout_share(simulate(L, 4, StageCosts(), "multiplex"), 4)


def test_tail_weight_recovers_sigma_and_is_scale_free():
    z = np.random.default_rng(11).standard_normal(100000)
    for sigma in (0.25, 0.5, 1.0):
        L = sample_lengths(z, 10000, sigma, 10**9)  # a large mean makes rounding negligible
        assert tail_weight(L) == pytest.approx(sigma, rel=0.02)
    L = np.array([4, 6, 6, 8, 8, 8])
    assert tail_weight(L) == pytest.approx(tail_weight(10 * L), rel=1e-12)
    assert tail_weight(np.full(10, 7)) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="two lengths"):
        tail_weight([5])


def test_resample_lengths_keeps_ratios_and_hits_the_mean():
    measured = np.array([4, 6, 6, 8, 8, 8, 8, 8])
    rng = np.random.default_rng(0)
    out = resample_lengths(measured, (3, 2, 5000), 256, 4096, rng)
    assert out.shape == (3, 2, 5000) and out.dtype == np.int64
    assert set(np.unique(out)) <= {round(v * 256 / measured.mean()) for v in (4, 6, 8)}
    assert out.mean() == pytest.approx(256, rel=0.02)
    assert tail_weight(out.ravel()) == pytest.approx(tail_weight(measured), rel=0.05)
    with pytest.raises(ValueError, match="max_len"):
        resample_lengths(measured, (4,), 256, 100, rng)
    with pytest.raises(ValueError, match=">= 1 token"):
        resample_lengths([0, 3], (4,), 256, 4096, rng)


@pytest.fixture(scope="module")
def tiny_lm():
    from rlcourse.lm import build_model, build_tokenizer

    tok = build_tokenizer()
    return build_model(tok, rlcourse.profile("smoke"), seed=0), tok


def test_time_decode_steps_and_prefill_structure(tiny_lm):
    model, tok = tiny_lm
    with rlcourse.profiles.one_torch_thread():
        n, t = time_decode_steps(model, tok, ["12+34="], [1, 3], steps=(2, 5), repeats=2)
        N, sec = time_prefill(model, tok, "12+34=", [1, 2], [4, 9], repeats=1)
    assert n.tolist() == [1.0, 3.0] and t.shape == (2,) and np.all(np.isfinite(t))
    assert N.tolist() == [4.0, 9.0, 8.0, 18.0] and np.all(sec > 0)
    with pytest.raises(ValueError, match="short < long"):
        time_decode_steps(model, tok, ["1+1="], [1, 2], steps=(4, 4))
    with pytest.raises(ValueError, match="batch_sizes"):
        time_decode_steps(model, tok, ["1+1="], [0, 2])
    with pytest.raises(ValueError, match="empty"):
        time_decode_steps(model, tok, [], [1, 2])


def test_measure_stage_costs_structure_and_sanity(tiny_lm):
    import torch

    model, tok = tiny_lm
    before = [p.detach().clone() for p in model.parameters()]
    with rlcourse.profiles.one_torch_thread():
        costs, d = measure_stage_costs(model, tok, "addition", rlcourse.profile("smoke"))
    assert isinstance(costs, StageCosts) and costs.decode_step == 1.0
    for name in ("decode_per_seq", "reward_per_token", "ref_per_token", "train_per_token", "mig_fixed",
                 "mig_per_token"):
        value = getattr(costs, name)
        assert np.isfinite(value) and value >= 0, name
    a, b = d["decode_fit"]
    assert a > 0 and d["n"].shape == d["step_seconds"].shape
    # the conversion in the details is the one the costs went through
    assert costs.ref_per_token == pytest.approx(d["per_token_seconds"]["ref"] / a, rel=1e-12)
    assert costs.train_per_token > 0 and costs.ref_per_token > 0  # beta > 0: the reference ran
    assert np.all(d["stages"]["time_reference"] > 0)
    assert d["lengths"].ndim == 1 and d["lengths"].min() >= 1
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters()))  # weights untouched


def test_simulator_modules_do_not_import_torch():
    """The simulator (cost model, graphs, schedulers, sweep) is NumPy only: importing it, or the whole
    package, in a fresh interpreter leaves torch out of sys.modules; only the measurement loads it."""
    import subprocess
    import sys

    code = ("import sys\n"
            "import rlcourse.systems.costs, rlcourse.systems.graph, rlcourse.systems.scheduler\n"
            "import rlcourse.systems.simulator, rlcourse.studies.jigsawrl\n"
            "assert 'torch' not in sys.modules, 'a simulator module imported torch'\n"
            "from rlcourse.systems import simulate, StageCosts, measure_stage_costs\n"
            "assert 'torch' not in sys.modules, 'importing rlcourse.systems imported torch'\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_jigsaw_verdicts_read_the_sweep_at_the_asked_tail_weight():
    from rlcourse.studies.jigsawrl import CLAIMS, jigsaw_verdicts

    R = 5
    sweep = {"sigmas": np.array([0.0, 1.0]), "seconds": 1.0,
             "gain": {"lookahead": np.column_stack([np.ones(R), 1.5 + 0.01 * np.arange(R)]),
                      "multiplex": np.column_stack([np.ones(R), 1.2 + 0.01 * np.arange(R)])}}
    v = jigsaw_verdicts(sweep, sigma=1.0)
    assert set(v) == {"gain", "migration"}
    assert v["gain"].claim is CLAIMS["gain"] and v["gain"].verdict == "holds"
    assert v["gain"].effect == pytest.approx(0.52) and v["migration"].effect == pytest.approx(0.3)
    # at sigma = 0 every gain is exactly 1: no spread, so no interval and no verdict either way
    at_zero = jigsaw_verdicts(sweep, sigma=0.0)["gain"]
    assert at_zero.verdict == "inconclusive" and "no spread" in at_zero.sentence()
    with pytest.raises(ValueError, match="no tail weight"):
        jigsaw_verdicts(sweep, sigma=0.5)


def test_jigsaw_study_cells_do_not_depend_on_order():
    """A cell of the sweep's grid gives the same numbers run last in the grid as run alone (its draws come
    from its own seed), and a bad arm names the schedulers."""
    import dataclasses

    from rlcourse.studies import run_study
    from rlcourse.studies.jigsawrl import jigsaw_study, run_cell

    study = jigsaw_study(dataclasses.replace(rlcourse.profile("smoke"), toy_seeds=2), seed=1)
    res = run_study(study, jobs=1, cache=False)
    arm, seed = study.cells()[-1]
    assert (arm, seed) == ("lookahead", 1)
    assert res.metrics[(arm, seed)] == run_cell(arm, seed, dict(study.sizes))
    assert res.metrics[("stage", 0)] == run_cell("stage", 0, dict(study.sizes))
    with pytest.raises(ValueError, match="the arms are the schedulers.*lookahead"):
        run_cell("fifo", 0, dict(study.sizes))
