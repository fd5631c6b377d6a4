"""The FreshPER chapter's toy: Gymnasium's FrozenLake as tables, exact success, the training loop with
the replay buffer of rlcourse.replay, and the claim plumbing (smoke-sized)."""
from dataclasses import replace

import numpy as np
import pytest
import torch
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

import rlcourse
from rlcourse.envs.frozenlake import make_map
from rlcourse.methods.freshper import (ARMS, WEIGHTED_BETA, LakeConfig, lake_tables, lazy_per_add, lazy_per_sampled,
                                       rollout, success_probability, train_lake)
from rlcourse.replay import ReplayBuffer
from rlcourse.studies import freshper as study
from rlcourse.studies.freshper import lake_verdicts, run_lake_experiment
from rlcourse.studies.runner import run_study


def test_tables_are_gymnasiums_dynamics():
    desc = make_map(3, 5, max_turns=12)
    nxt, rew, done = lake_tables(desc)
    env = FrozenLakeEnv(desc=desc, is_slippery=False)
    for s in range(25):
        for a in range(4):
            env.reset(seed=0)
            env.unwrapped.s = s
            s2, r, term, _, _ = env.step(a)
            assert (nxt[s, a], rew[s, a], done[s, a]) == (s2, r, term)


def test_exact_success_matches_monte_carlo():
    """The exact success probability of a noisy softmax policy (leaning towards the shortest path)
    against 20,000 rollouts, within four binomial standard errors; the shortest path itself succeeds
    with probability 1."""
    from rlcourse.envs.frozenlake import MOVES, shortest_path

    desc = make_map(1, 4, max_turns=8)
    tables = lake_tables(desc)
    path = shortest_path(desc)
    pi = np.full((16, 4), 0.25)
    lean = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    s = 0
    for m in path:
        pi[s] = np.eye(4)[MOVES.index(m)]
        lean[s, MOVES.index(m)] += 2.0
        s = tables[0][s, MOVES.index(m)]
    assert success_probability(pi, tables, 8) == pytest.approx(1.0)
    assert success_probability(pi, tables, len(path) - 1) == 0.0  # the horizon binds
    exact = success_probability(torch.softmax(lean, -1).numpy(), tables, 8)
    n = 20_000
    R = rollout(lean, tables, 8, n, torch.Generator().manual_seed(1))["R"]
    se = np.sqrt(exact * (1 - exact) / n)
    assert 0.05 < exact < 0.95 and abs(float(R.mean()) - exact) < 4 * se, (exact, float(R.mean()))


def test_rollout_records_behaviour_logprobs_and_masks():
    tables = lake_tables(make_map(2, 4, max_turns=8))
    logits = torch.randn(16, 4)
    r = rollout(logits, tables, 8, 64, torch.Generator().manual_seed(0))
    logp = torch.log_softmax(logits, -1)[r["states"], r["actions"]]
    assert torch.allclose(r["logp"], logp * r["mask"])
    m = r["mask"]
    assert (m[:, 0] == 1).all() and ((m[:, 1:] <= m[:, :-1])).all()  # a prefix of each row
    assert set(r["R"].tolist()) <= {0.0, 1.0}


def test_train_lake_is_deterministic_and_replays_only_the_past():
    cfg = LakeConfig(steps=12, episodes=8, replay=8)
    a = train_lake(ARMS["FreshPER"], cfg, 0)
    b = train_lake(ARMS["FreshPER"], cfg, 0)
    assert np.array_equal(a["success"], b["success"]) and len(a["success"]) == 12
    assert a["ages"].min() >= 1 and len(a["ages"]) == 8 * 11  # replay starts at step 2
    assert ((a["ess"] > 0) & (a["ess"] <= 1)).all()
    assert a["kl"].shape == (12,) and (a["kl"] >= -1e-7).all()  # a KL divergence, per step
    on = train_lake(ARMS["on-policy"], cfg, 0)
    assert on["ages"].size == 0
    # with the switch, the success is measured on the second map
    sw = train_lake(ARMS["PER"], replace(cfg, switch_at=7), 0)
    assert sw["success"].shape == (12,)


def test_uniform_replay_draws_every_stored_trajectory_alike():
    cfg = LakeConfig(steps=40, episodes=4, replay=64, capacity=4000)
    ages = train_lake(ARMS["uniform replay"], cfg, 0)["ages"]
    # at step 40 the buffer holds steps 1..39 equally: the mean age over all draws is about half the
    # elapsed steps, averaged over steps (checked loosely: it exceeds a quarter of the run)
    assert ages.mean() > 40 / 4


def test_experiment_and_verdicts_in_smoke():
    P = rlcourse.profile("smoke")
    out = run_lake_experiment(P, cfg=LakeConfig(steps=10))
    v = lake_verdicts(out)
    assert set(v) == {"replay-can-help", "beats-on-policy", "per-degrades", "decay-beats-per", "decay-cuts-staleness"}
    assert all(x.seeds == 1 for x in v.values())
    # one seed is inconclusive; the headline rests on the control, so it is uninformative
    assert v["replay-can-help"].verdict == "inconclusive" and v["replay-can-help"].claim.role == "positive control"
    assert v["beats-on-policy"].verdict == "uninformative" and v["beats-on-policy"].control_verdict == "inconclusive"
    assert all(v[k].verdict == "inconclusive" for k in ("per-degrades", "decay-beats-per", "decay-cuts-staleness"))
    with pytest.raises(ValueError, match="replay-can-help"):
        lake_verdicts(out, names=("beats-on-policy",))
    assert v["per-degrades"].claim.kind == "less" and v["decay-cuts-staleness"].claim.key == "freshper/lake-decay-cuts-staleness"
    sw = run_lake_experiment(P, arms={k: ARMS[k] for k in ("on-policy", "PER", "FreshPER")},
                             cfg=LakeConfig(steps=10, switch_at=6))
    vs = lake_verdicts(sw, names=("decay-beats-per",), note="switch of map")
    assert vs["decay-beats-per"].claim.key == "freshper/lake-decay-beats-per-switch"
    assert "second map" in vs["decay-beats-per"].claim.metric
    assert sw["post"]["PER"].shape == (1,)
    sweep = study.run_tau_sweep(P, taus=(5.0,), cfg=LakeConfig(steps=5))
    assert list(sweep["auc"]) == ["tau=5"]


def test_lake_study_cells_stand_alone():
    """A later cell of the grid, run with the others, equals the same cell run alone; a bad arm is named."""
    P = rlcourse.profile("smoke")
    s = study.lake_study(P, cfg=LakeConfig(steps=6), seeds=2)
    res = run_study(s, jobs=1, cache=False)
    arm, seed = s.cells()[-1]
    assert (arm, seed) == ("FreshPER", 1)
    assert res.metrics[(arm, seed)] == study.run_cell(arm, seed, dict(s.sizes))
    with pytest.raises(ValueError, match="the arms are .*'on-policy'"):
        study.run_cell("no such arm", 0, dict(s.sizes))
    with pytest.raises(ValueError, match="the arms are .*'FreshPER'"):
        study.run_lm_cell("no such arm", 0, study.lm_study(P).sizes)


def test_lazy_per_keeps_max_priority_until_sampled():
    """The authors' standard PER: a new item enters at the running maximum priority, whatever its own;
    once drawn, its leaf is its own (|R| + eps)^alpha, and the maximum follows the drawn bases."""
    buf = ReplayBuffer(8, alpha=0.6, tau=None)
    eps = 1e-6
    slots = [lazy_per_add(buf, f"item{i}", r + eps, 1, 1.0) for i, r in enumerate([0.0, 1.0, 0.0])]
    assert np.allclose(buf.tree.leaves[slots], 1.0)  # a failure nobody drew keeps the top priority
    m = lazy_per_sampled(buf, [slots[0], slots[0], slots[1]], 1.0)
    assert buf.tree.leaves[slots[0]] == pytest.approx(eps ** 0.6)
    assert buf.tree.leaves[slots[1]] == pytest.approx((1 + eps) ** 0.6)
    assert buf.tree.leaves[slots[2]] == pytest.approx(1.0) and m == pytest.approx(1 + eps)
    assert buf.tree.total == pytest.approx(eps ** 0.6 + (1 + eps) ** 0.6 + 1.0)


def test_lake_arms_protocols():
    """No importance weights by default (the authors' buffer); the weighted ablation weighs its draws;
    PER's lazy priorities cannot be combined with a decay."""
    cfg = LakeConfig(steps=8, episodes=8, replay=8)
    assert cfg.beta is None and WEIGHTED_BETA == (0.4, 1.0)
    plain = train_lake(ARMS["PER"], cfg, 0)
    assert np.allclose(plain["replay_weight"], 1.0)
    weighted = train_lake(ARMS["PER (refreshed)"], replace(cfg, beta=WEIGHTED_BETA), 0)
    assert ((weighted["replay_weight"] > 0) & (weighted["replay_weight"] <= 1.0)).all()
    with pytest.raises(ValueError, match="refresh"):
        train_lake(("reward", 25.0, None, False), cfg, 0)
