"""DReST for the tiny LM: the multiple-choice task, the meta-episode reward over RLOO groups (hand
computations, order, per-prompt counts and normalisers), the balance property by Monte Carlo, the
closed form of the expected RLOO drift, the exact answer probabilities, and errors on bad input."""
import types

import numpy as np
import pytest
import torch

import rlcourse
import rlcourse.methods.drest_lm  # noqa: F401  (registers the task and the rewards)
from rlcourse.advantages import compute_rloo_outcome_advantage, place_on_last_token
from rlcourse.lm import build_model, build_tokenizer, sample
from rlcourse.profiles import one_torch_thread
from rlcourse.methods.drest_lm import (COIN_MAX, INVALID_REWARD, TASK_NAME, DReSTLMReward, choice_metrics,
                                       choice_probabilities, class_maxima, expected_rloo_drift, format_prompt,
                                       make_drest_lm_reward, meta_episode_rewards, parse_choice, parse_prompt)
from rlcourse.rewards import get_reward
from rlcourse.rewards.drest import drest_reward, expected_meta_return, myopic_advantage
from rlcourse.tasks import get_task
from rlcourse.train import RLConfig, Trainer, sft

P1 = "S3 L5 S2 L7>"  # m = (3, 7)
P2 = "L9 S8 L1 S4>"  # m = (8, 9)


def fake_batch(prompts, texts, G):
    """A stand-in for a RolloutBatch: what the reward reads (texts, prompts, index)."""
    index = torch.arange(len(prompts)).repeat_interleave(G)
    return types.SimpleNamespace(texts=list(texts), prompts=[p for p in prompts for _ in range(G)], index=index)


# ----------------------------------------------------------------------------------------- task
def test_prompt_round_trip_and_choice_parsing():
    classes, coins = parse_prompt(P1)
    assert classes.tolist() == [0, 1, 0, 1] and coins.tolist() == [3, 5, 2, 7]
    assert format_prompt(classes, coins) == P1
    np.testing.assert_array_equal(class_maxima(classes, coins), [3.0, 7.0])
    assert parse_choice("L7", classes, coins) == 3 and parse_choice(" S2 ", classes, coins) == 2
    for bad in ("", "L3", "S5", "L", "7", "L7L7", "A", "L77"):  # L3: 3 coins is a short option
        assert parse_choice(bad, classes, coins) is None, bad
    for bad in ("S3 L5 S2 L7", "S3 X5>", "S3 L3>", "S3>", ">", "S3  L5>"):
        with pytest.raises(ValueError):
            parse_prompt(bad)
    with pytest.raises(TypeError):
        parse_prompt(3)
    with pytest.raises(ValueError):
        format_prompt([0, 1], [3, 3])  # coins name the option, so they must differ
    with pytest.raises(ValueError):
        class_maxima(np.array([1, 1]), np.array([2.0, 3.0]))  # no short option


def test_task_examples_satisfy_the_design_and_demonstrations_are_uninformative():
    task = get_task(TASK_NAME)
    ex = task.examples(2000, seed=3)
    picked_best, picked_pos, n_long = 0, np.zeros(4), []
    for e in ex:
        classes, coins = parse_prompt(e.prompt)
        m = class_maxima(classes, coins)
        assert m[1] > m[0] and 1 <= classes.sum() <= 3 and len(set(coins)) == 4
        assert task.score(e.solution, e).reward == 1.0 and task.score("Q1", e).reward == 0.0
        j = parse_choice(e.solution, classes, coins)
        picked_pos[j] += 1
        picked_best += coins[j] == m[classes[j]]
        n_long.append(classes.sum())
    # the demonstration is a uniformly random option: each position ~ 1/4 (4.5 standard errors)
    se = np.sqrt(0.25 * 0.75 / len(ex))
    assert np.all(np.abs(picked_pos / len(ex) - 0.25) < 4.5 * se)
    assert set(n_long) == {1, 2, 3}
    # and the held-out split is disjoint from the training split
    assert not {e.prompt for e in task.examples(200, split="test")} & {e.prompt for e in ex}


# --------------------------------------------------------------------------------------- reward
def test_reward_on_hand_computed_meta_episodes():
    """Two prompts, G = 4. Counts reset per prompt; each prompt has its own m; invalid rows count nowhere."""
    lam = 0.9
    texts = ["S3", "L5", "L7", "xx",      # prompt 1, m = (3, 7)
             "L9", "L9", "S8", "S4"]      # prompt 2, m = (8, 9)
    r = get_reward("drest")(fake_batch([P1, P2], texts, 4), None, None, {}).numpy()
    expected = [
        1.0,                               # e=0: counts (0,0): exponent 0; 3/3
        lam ** (0 - 0.5) * 5 / 7,          # e=1: counts (1,0): L has 0 - mean 0.5
        lam ** (1 - 1.0) * 7 / 7,          # e=2: counts (1,1)
        INVALID_REWARD,                    # e=3: not an option
        1.0,                               # prompt 2 starts afresh: counts (0,0); 9/9
        lam ** (1 - 0.5) * 9 / 9,          # counts (0,1)
        lam ** (0 - 1.0) * 8 / 8,          # counts (0,2): S is rare, boosted
        lam ** (1 - 1.5) * 4 / 8,          # counts (1,2)
    ]
    np.testing.assert_allclose(r, expected, rtol=1e-6)
    # the default reward: coins / COIN_MAX, no length discount
    d = get_reward("drest_default")(fake_batch([P1, P2], texts, 4), None, None, {}).numpy()
    np.testing.assert_allclose(d, [3 / 9, 5 / 9, 7 / 9, INVALID_REWARD, 1, 1, 8 / 9, 4 / 9], rtol=1e-6)


def test_order_within_a_meta_episode_matters_and_prompts_do_not_share_counts():
    lam = 0.8
    fn = make_drest_lm_reward("drest", lam, G=3)
    a = fn(fake_batch([P1], ["L7", "L7", "S3"], 3), None, None, {}).numpy()
    b = fn(fake_batch([P1], ["S3", "L7", "L7"], 3), None, None, {}).numpy()
    np.testing.assert_allclose(a, [1.0, lam ** 0.5, lam ** -1.0], rtol=1e-6)
    np.testing.assert_allclose(b, [1.0, lam ** -0.5, lam ** 0.0], rtol=1e-6)
    assert not np.allclose(np.sort(a), np.sort(b))  # same samples, different order, different rewards
    # a second prompt's meta-episode is unaffected by the first one's choices
    both = fn(fake_batch([P1, P1], ["L7", "L7", "S3", "S3", "L7", "L7"], 3), None, None, {}).numpy()
    np.testing.assert_allclose(both, np.r_[a, b], rtol=1e-6)


def test_vectorised_meta_episode_rewards_match_the_single_step_form():
    """meta_episode_rewards against drest_reward, one mini-episode at a time, on random meta-episodes
    with invalid rows."""
    rng = np.random.default_rng(0)
    L = rng.integers(-1, 2, size=(50, 10))
    c = rng.integers(1, 10, size=(50, 10)).astype(float)
    m = rng.uniform(5, 10, size=(50, 2))
    r = meta_episode_rewards(L, c, m, 0.85, invalid_reward=-3.0)
    for i in range(50):
        counts = np.zeros(2)
        for e in range(10):
            if L[i, e] < 0:
                assert r[i, e] == -3.0
                continue
            assert abs(r[i, e] - drest_reward(counts, L[i, e], c[i, e], m[i], 0.85)) < 1e-12
            counts[L[i, e]] += 1


def test_memoryless_policy_expected_return_peaks_at_one_half_by_monte_carlo():
    """Synthetic rows through the reward: the mean meta-return of a memoryless policy matches the
    closed form, and over p in {0, 0.1, ..., 1} it is largest at 1/2 (common random numbers)."""
    E, lam, n = 12, 0.9, 20_000
    u = np.random.default_rng(1).random((n, E))
    grid = np.round(np.linspace(0, 1, 11), 2)
    means = []
    for p in grid:
        L = (u < p).astype(np.int64)
        ret = meta_episode_rewards(L, np.ones((n, E)), np.ones((n, 2)), lam).sum(1)
        closed = expected_meta_return(np.array([1 - p, p]), E, lam)
        assert abs(ret.mean() - closed) < 4.5 * ret.std(ddof=1) / np.sqrt(n) + 1e-9
        means.append(ret.mean())
    assert grid[int(np.argmax(means))] == 0.5
    assert abs(means[5] - 12.092) < 0.05 and abs(means[-1] - 9.131) < 5e-4  # p = 1 is deterministic


def test_expected_rloo_drift_matches_monte_carlo_and_its_closed_form():
    """The drift by enumeration equals (a) a Monte Carlo of the trainer's own RLOO estimator on
    synthetic rows and (b) G/(G-1) p(1-p) G g(p) - p(1-p) R'(p)/(G-1)."""
    G, lam, p, n = 6, 0.9, 0.3, 40_000
    rng = np.random.default_rng(2)
    L = (rng.random((n, G)) < p).astype(np.int64)
    r = meta_episode_rewards(L, np.ones((n, G)), np.ones((n, 2)), lam)
    mask = torch.ones(n * G, 1)
    adv, _ = compute_rloo_outcome_advantage(place_on_last_token(torch.as_tensor(r.reshape(-1)), mask), mask,
                                            torch.arange(n).repeat_interleave(G))
    per_meta = (adv[:, 0].double().numpy().reshape(n, G) * (L - p)).sum(1)
    h = expected_rloo_drift(p, G, lam)
    assert abs(per_meta.mean() - h) < 4.5 * per_meta.std(ddof=1) / np.sqrt(n)
    for G_, lam_ in [(4, 0.7), (8, 0.9), (10, 0.95)]:
        for q in (0.1, 0.35, 0.5, 0.8):
            R = lambda x: expected_meta_return(np.array([1 - x, x]), G_, lam_)
            dR = (R(q + 1e-6) - R(q - 1e-6)) / 2e-6
            closed = G_ / (G_ - 1) * q * (1 - q) * G_ * myopic_advantage(q, G_, lam_) - q * (1 - q) * dR / (G_ - 1)
            assert abs(expected_rloo_drift(q, G_, lam_) - closed) < 1e-6


def test_rloo_drift_points_to_one_half_and_raw_coins_push_to_long():
    G, lam = 8, 0.9
    assert abs(expected_rloo_drift(0.5, G, lam)) < 1e-12
    for p in (0.05, 0.2, 0.4):
        assert expected_rloo_drift(p, G, lam) > 0 > expected_rloo_drift(1 - p, G, lam)
        assert abs(expected_rloo_drift(p, G, lam) + expected_rloo_drift(1 - p, G, lam)) < 1e-12
    # the default reward (lam = 1, long worth more): RLOO is unbiased, drift = G p (1-p) (v_L - v_S) > 0
    v = np.array([3 / 9, 7 / 9])
    for p in (0.1, 0.5, 0.9):
        assert abs(expected_rloo_drift(p, G, 1.0, v) - G * p * (1 - p) * (v[1] - v[0])) < 1e-12


def test_reward_rejects_bad_batches_and_bad_settings():
    fn = make_drest_lm_reward("drest", 0.9, G=4)
    with pytest.raises(ValueError, match="multiple"):
        fn(fake_batch([P1], ["S3"] * 3, 3), None, None, {})
    with pytest.raises(ValueError, match="mixes prompts"):
        b = fake_batch([P1, P2], ["S3"] * 8, 4)
        b.index = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1])
        fn(b, None, None, {})
    with pytest.raises(ValueError, match="contiguous"):  # G inferred from an interleaved index
        b = fake_batch([P1, P2], ["S3"] * 8, 4)
        b.index = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])
        DReSTLMReward()(b, None, None, {})
    with pytest.raises(ValueError):
        DReSTLMReward(mode="shutdown")
    with pytest.raises(ValueError):
        DReSTLMReward(lam=0.0)
    with pytest.raises(ValueError):
        DReSTLMReward(G=0)
    with pytest.raises(ValueError):
        meta_episode_rewards(np.array([[0, 2]]), np.ones((1, 2)), np.ones((1, 2)), 0.9)  # class 2 of k = 2
    with pytest.raises(ValueError):
        meta_episode_rewards(np.array([[0, 1]]), np.ones((1, 3)), np.ones((1, 2)), 0.9)
    with pytest.raises(ValueError):
        expected_rloo_drift(0.5, 1, 0.9)


# ---------------------------------------------------------------------------------- measurement
def test_choice_metrics_by_hand():
    classes, coins = parse_prompt(P1)  # S3 L5 S2 L7, m = (3, 7)
    out = choice_metrics(np.array([0.25, 0.0, 0.0, 0.5]), classes, coins)  # a quarter of the mass invalid
    assert abs(out["valid"] - 0.75) < 1e-12 and abs(out["p_long"] - 2 / 3) < 1e-12
    assert abs(out["neutrality"] - (-(1 / 3) * np.log2(1 / 3) - (2 / 3) * np.log2(2 / 3))) < 1e-12
    assert abs(out["usefulness"] - 1.0) < 1e-12  # only the best option of each class
    out = choice_metrics(np.array([0.0, 1.0, 0.0, 0.0]), classes, coins)
    assert out["neutrality"] == 0.0 and abs(out["usefulness"] - 5 / 7) < 1e-12
    with pytest.raises(ValueError):
        choice_metrics(np.array([0.6, 0.6, 0.0, 0.0]), classes, coins)


@one_torch_thread()
def test_exact_answer_probabilities_match_sampling():
    """choice_probabilities on a briefly fine-tuned tiny model against the frequencies of sampled answers."""
    tok = build_tokenizer()
    model = build_model(tok, rlcourse.profile("smoke"), seed=0)
    sft(model, tok, get_task(TASK_NAME).examples(512, seed=5), steps=60, batch_size=32, lr=3e-3)  # some mass on options
    probs = choice_probabilities(model, tok, [P1])[0]
    n = 4000
    batch = sample(model, tok, [P1], num_generations=n, max_new_tokens=3, generator=torch.Generator().manual_seed(1))
    classes, coins = parse_prompt(P1)
    freq = np.bincount([j for t in batch.texts if (j := parse_choice(t, classes, coins)) is not None], minlength=4) / n
    assert probs.sum() > 0.05 and probs.min() > 0.01  # the test means something
    assert np.all(np.abs(freq - probs) < 4.5 * np.sqrt(probs * (1 - probs) / n) + 1e-3)


@one_torch_thread()
def test_trainer_runs_with_the_registered_reward():
    tok = build_tokenizer()
    model = build_model(tok, seed=0)
    cfg = RLConfig(num_generations=4, prompts_per_step=2, steps=1, max_completion_length=3, reward="drest",
                   advantage_estimator="rloo", train_pool_size=16, eval_prompts=2, progress=False)
    trainer = Trainer(model, tok, TASK_NAME, cfg)
    m = trainer.step()
    log = trainer.state["drest_lm"]
    assert len(log["valid"]) == 1 and np.isfinite(m["reward"])
    assert COIN_MAX == 9


def test_lm_study_cells_stand_alone():
    """A later cell of the LM grid, run with the others, equals the same cell run alone (each cell loads
    the base model and seeds its own trainer); the grid's verdicts are the chapter's; a bad arm is
    refused with the arms named."""
    from rlcourse.studies.drest_lm import (ARMS, LM_BASE, drest_lm_verdicts, lm_base_study, lm_runs, lm_study,
                                           run_lm_base_cell, run_lm_cell)
    from rlcourse.studies.runner import run_study

    P = rlcourse.profile("smoke")
    study = lm_study(P, seeds=(0, 1))
    res = run_study(study, jobs=1, cache=False)
    arm, seed = study.cells()[-1]
    assert (arm, seed) == (ARMS[-1], 1)
    assert res.metrics[(arm, seed)] == run_lm_cell(arm, seed, dict(study.sizes))
    base = run_study(lm_base_study(P), jobs=1, cache=False).metrics[(LM_BASE, 0)]
    runs = lm_runs(res, base)
    assert [r["curve"][0] for r in runs["drest"]] == [dict(step=0, **base)] * 2
    chapter = drest_lm_verdicts({"runs": runs, "seconds": res.wall_seconds})
    assert {k: v.method_values for k, v in res.verdicts().items()} == {k: v.method_values for k, v in chapter.items()}
    with pytest.raises(ValueError, match="the arms are .*'default', 'drest'"):
        run_lm_cell("shutdown", 0, dict(study.sizes))
    with pytest.raises(ValueError, match="the arms are .*'base model'"):
        run_lm_base_cell("drest", 0, dict(study.sizes))
