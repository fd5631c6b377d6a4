"""TCRM: the walk task, the exact value function, the losses (gradients, stop-gradient, shift
invariance), the tabular MC/TD fixed points, the shaping identity and the loop parts."""
import itertools
import json

import numpy as np
import pytest
import torch

import rlcourse
from rlcourse.lm import build_tokenizer
from rlcourse.lm.sampling import sample
from rlcourse.methods import tcrm as T
from rlcourse.profiles import one_torch_thread
from rlcourse.studies import tcrm as study
from rlcourse.supervised import train_reward_model
from rlcourse.tasks import Example, get_task
from rlcourse.train import RLConfig, Trainer


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():
        yield


def test_task_demonstrations_valid_splits_disjoint_and_verdicts():
    task = get_task("dyck_walk")
    train, test = task.examples(300, seed=1), task.examples(8, seed=1, split="test")
    assert all(task.score(e.solution, e).reward == 1.0 for e in train + test)
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert {e.prompt for e in study.test_prompts()} >= {e.prompt for e in test}
    ex = Example("walk 0:1>", "15", "", meta={"walk_prefix": (0, "1")})
    assert task.score("0" * 15, ex).reason == "goes below zero at step 3"
    assert task.score("10" * 7 + "1", ex).reward == 1.0
    for bad in ["", "10", "1" * 16, "10101010101010x", "2" * 15]:
        s = task.score(bad, ex)
        assert s.reward == 0.0 and "malformed" in s.reason
    with pytest.raises(ValueError, match="dyck_walk"):
        T.parse_prompt("47+85=")


def test_survival_value_by_enumeration():
    for h, r in itertools.product(range(3), range(0, 9)):
        walks = itertools.product("01", repeat=r)
        ok = np.mean([T.first_dip(h, "".join(w)) is None for w in walks]) if r else 1.0
        assert T.survival_value(h, r) == pytest.approx(ok, abs=1e-12)
    assert T.survival_value(-1, 3) == 0.0


def test_walk_values_are_conditional_expectations_and_a_martingale():
    ex = Example("walk 0:1101>", "12", "", meta={"walk_prefix": (0, "1101")})
    rng = np.random.default_rng(0)
    walk = study.sample_walks([ex.prompt], rng)[0]
    v = T.walk_values(ex.prompt, walk)
    task = T.DyckWalk()
    for j in (0, 3, 6):  # E[R | h_j] by enumerating the remaining coin flips
        rest = ["".join(w) for w in itertools.product("01", repeat=12 - j)]
        exact = np.mean([task.score(walk[:j] + w, ex).reward for w in rest])
        assert v[j] == pytest.approx(exact, abs=1e-12)
        # martingale: V(h_j) is the mean of V over the two next steps
        up, down = T.walk_values(ex.prompt, walk[:j] + "1"), T.walk_values(ex.prompt, walk[:j] + "0")
        assert v[j] == pytest.approx(0.5 * up[j + 1] + 0.5 * down[j + 1], abs=1e-12)
    assert v[-1] == task.score(walk, ex).reward  # the EOS column is the outcome
    assert T.walk_values(ex.prompt, "1x")[2] == 0.0  # a malformed prefix is worth 0


def random_values(B=5, T_=6, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(B, T_ + 1, generator=g, dtype=dtype)
    lengths = torch.randint(2, T_ + 2, (B,), generator=g)
    mask = (torch.arange(T_ + 1)[None, :] < lengths[:, None]).to(dtype)
    return v, mask


def fd_grad(fn, v, eps=1e-6):
    g = torch.zeros_like(v)
    for i in range(v.numel()):
        d = torch.zeros_like(v).view(-1)
        d[i] = eps
        d = d.view_as(v)
        g.view(-1)[i] = (fn(v + d) - fn(v - d)) / (2 * eps)
    return g


@pytest.mark.parametrize("loss", [T.mc_loss, T.td_loss])
def test_regulariser_gradients(loss):
    v, m = random_values()
    # full derivative (no stop-gradient) against finite differences
    x = v.clone().requires_grad_(True)
    loss(x, m, detach_target=False).backward()
    assert torch.allclose(x.grad, fd_grad(lambda y: loss(y, m, detach_target=False), v) * m, atol=1e-6)
    # semi-gradient: the closed form, and no gradient reaches the targets' own column through them
    x = v.clone().requires_grad_(True)
    loss(x, m).backward()
    fin = T.final_index(m)
    B = v.shape[0]
    expect = torch.zeros_like(v)
    for i in range(B):
        n = int(fin[i])
        for j in range(n):
            target = v[i, n] if loss is T.mc_loss else v[i, j + 1]
            expect[i, j] += 2 * (v[i, j] - target) / n / B
    assert torch.allclose(x.grad, expect, atol=1e-12)


def test_bt_and_tcrm_loss_gradients_and_shift_invariance():
    vp, mp = random_values(seed=1)
    vn, mn = random_values(seed=2)
    # with no regulariser the loss is Bradley-Terry on each row's value at its last masked position
    final = lambda v, m: v[torch.arange(len(v)), m.sum(1).long() - 1]  # noqa: E731
    bt = float(-torch.nn.functional.logsigmoid(final(vp, mp) - final(vn, mn)).mean())
    plain, parts0 = T.tcrm_loss(vp, mp, vn, mn, 0.0, 0.0)
    assert float(plain) == pytest.approx(bt) and parts0["bt"] == pytest.approx(bt)
    fn = lambda a: T.tcrm_loss(a, mp, vn, mn, 0.7, 0.3, detach_target=False)[0]  # noqa: E731
    x = vp.clone().requires_grad_(True)
    fn(x).backward()
    assert torch.allclose(x.grad, fd_grad(fn, vp) * mp, atol=1e-6)
    # shifting every value by a constant changes none of the three terms
    base, parts = T.tcrm_loss(vp, mp, vn, mn, 0.5, 0.5)
    shifted, parts2 = T.tcrm_loss(vp + 3.0, mp, vn + 3.0, mn, 0.5, 0.5)
    assert shifted == pytest.approx(float(base), abs=1e-10) and parts2 == pytest.approx(parts)
    # ... and a constant function has zero regularisers
    assert T.mc_loss(torch.ones_like(vp), mp) == 0 and T.td_loss(torch.ones_like(vp), mp) == 0


def test_losses_refuse_bad_masks_and_shapes():
    v, m = random_values()
    with pytest.raises(ValueError, match="shape mismatch"):
        T.mc_loss(v, m[:, :-1])
    bad = m.clone()
    bad[0, 0] = 0
    with pytest.raises(ValueError, match="column 0"):
        T.td_loss(v, bad)
    gap = m.clone()
    gap[:, 1] = 0
    gap[:, 2] = 1
    with pytest.raises(ValueError, match="prefix"):
        T.mc_loss(v, gap)
    with pytest.raises(ValueError, match=">= 0"):
        T.tcrm_loss(v, m, v, m, lam_mc=-1)
    with pytest.raises(ValueError, match="rows"):
        T.tcrm_loss(v, m, v[:2], m[:2])


def toy_mdp():
    seqs = study.enumerate_sequences(3, 5)
    init = np.array([0.5, 0.3, 0.2])
    trans = np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4]])
    probs = study.markov_probs(seqs, init, trans)
    reward = ((seqs == 2).sum(1) >= 2).astype(float) + 0.1 * seqs[:, -1]
    return seqs, probs, reward


@pytest.mark.parametrize("kind", ["mc", "td"])
def test_tabular_minimiser_is_the_conditional_expectation(kind):
    seqs, probs, reward = toy_mdp()
    assert probs.sum() == pytest.approx(1.0)
    exact = study.conditional_expectations(seqs, probs, reward)
    fitted = study.fit_tabular(seqs, probs, reward, kind, iters=200 if kind == "mc" else 10)
    worst = max(abs(fitted[k] - exact[k]) for k in exact)
    assert worst < 1e-4, worst
    # a wrong target (the TD fixed point with the rewards shifted) is not matched: the test can fail
    other = study.fit_tabular(seqs, probs, reward + 1.0, kind, iters=200 if kind == "mc" else 10)
    assert max(abs(other[k] - exact[k]) for k in exact) > 0.5


def batch_for(prompts_texts, tok):
    """A rollout batch of given walk responses (EOS appended)."""
    from rlcourse.lm.sampling import RolloutBatch, encode_prompts

    prompts = [p for p, _ in prompts_texts]
    p_ids, p_mask = encode_prompts(tok, prompts)
    enc = tok([t + tok.eos_token for _, t in prompts_texts], return_tensors="pt", padding=True,
              padding_side="right", add_special_tokens=False)
    r_ids, r_mask = enc["input_ids"], enc["attention_mask"].float()
    B, Tn = r_ids.shape
    return RolloutBatch(prompt_ids=p_ids, prompt_mask=p_mask, response_ids=r_ids, response_mask=r_mask,
                        logprobs=torch.zeros(B, Tn), index=torch.arange(B), truncated=torch.zeros(B, dtype=torch.bool),
                        prompts=prompts, texts=[t for _, t in prompts_texts], temperature=1.0)


def test_unified_gae_is_potential_shaping():
    tok = build_tokenizer()
    exs = [Example("walk 0:1>", "15", "", meta={"walk_prefix": (0, "1")}),
           Example("walk 2:0110>", "12", "", meta={"walk_prefix": (2, "0110")})]
    rng = np.random.default_rng(3)
    texts = study.sample_walks([e.prompt for e in exs], rng)
    batch = batch_for(list(zip([e.prompt for e in exs], texts)), tok)
    task = T.DyckWalk()
    state = {}
    scores = T.tcrm_score(batch, exs, task, state)
    assert torch.equal(scores, torch.tensor(task.rewards(texts, exs)))  # the oracle's score is the verifier
    from rlcourse.advantages import place_on_last_token
    mask = batch.response_mask
    r = place_on_last_token(scores, mask)
    V = torch.tensor(np.stack([T.walk_values(e.prompt, t, mask.shape[1] + 1) for e, t in zip(exs, texts)]),
                     dtype=torch.float32)
    adv1, _ = T.tcrm_gae(r, mask, batch, exs, state, gamma=1.0, lam=1.0)
    adv0, _ = T.tcrm_gae(r, mask, batch, exs, state, gamma=1.0, lam=0.0)
    for i in range(2):
        n = int(mask[i].sum())
        # lam = 0: the shaped rewards V(h_t) - V(h_{t-1}); they telescope to V(h_T) - V(h_0)
        assert torch.allclose(adv0[i, :n], V[i, 1:n + 1] - V[i, :n], atol=1e-6)
        assert float(adv0[i, :n].sum()) == pytest.approx(float(scores[i] - V[i, 0]), abs=1e-5)
        # lam = 1: every token's advantage is the outcome minus its value
        assert torch.allclose(adv1[i, :n], scores[i] - V[i, :n], atol=1e-6)


def test_parts_refuse_what_they_cannot_serve():
    tok = build_tokenizer()
    ex = Example("47+85=", "132", "231|132")
    batch = batch_for([(ex.prompt, "231|132")], tok)
    with pytest.raises(ValueError, match="dyck_walk"):
        T.tcrm_score(batch, [ex], get_task("addition"), {})
    with pytest.raises(ValueError, match="dyck_walk"):
        T.tcrm_gae(torch.zeros(1, 8), batch.response_mask, batch, [ex], {})
    with pytest.raises(ValueError, match="unknown TCRM reward model"):
        T.tcrm_score(batch, [ex], get_task("addition"), {}, reward_model="nope")
    with pytest.raises(ValueError, match="reserved|oracle"):
        T.use_reward_model("oracle", study.new_reward_model(tok, rlcourse.profile("smoke"), 0))
    with pytest.raises(TypeError):
        T.use_reward_model("x", torch.nn.Linear(2, 1))


def test_metrics_on_hand_examples():
    v = np.array([[1.0, 0.9, 0.1, 0.0], [1.0, 0.8, 0.7, 0.6]])
    assert study.predicted_first_error(v, np.array([3, 3]), 0.5).tolist() == [2, 0]
    assert study.error_f1(np.array([2, 0, 1, 0]), np.array([2, 0, 2, 0])) == pytest.approx(2 * 0.5 * 1 / 1.5)
    with pytest.raises(ValueError):
        study.error_f1(np.array([0]), np.array([0]))
    a, b = np.array([[0.0, 1.0], [0.0, 0.5]]), np.array([[0.0, 0.5], [0.0, 0.5]])
    assert study.middle_token_accuracy(a, b, np.array([1, 1])) == 0.75  # a tie counts half


def test_tcrm_training_step_lowers_the_loss_and_unified_ppo_holds_no_critic():
    P = rlcourse.profile("smoke")
    tok = build_tokenizer()
    rng = np.random.default_rng(0)
    pairs = study.walk_pairs(T.DyckWalk().examples(50, seed=0), 32, rng)
    rm = study.new_reward_model(tok, P, 0)
    log = train_reward_model(rm, tok, pairs, steps=15, batch_size=16, lr=3e-3, loss="tcrm",
                             loss_kwargs={"lam_mc": 0.1, "lam_td": 0.1})
    assert log[-1]["loss"] < log[0]["loss"] and set(log[0]) == {"loss", "bt", "mc", "td"}
    with pytest.raises(ValueError, match="unknown reward-model loss 'tcrm_typo'"):
        train_reward_model(rm, tok, pairs, steps=1, loss="tcrm_typo")
    name = T.use_reward_model("test_tcrm_rm", rm)
    policy = study.tiny_lm(tok, P, 0)
    cfg = RLConfig(num_generations=2, prompts_per_step=2, max_completion_length=17, steps=1, progress=False,
                   reward="tcrm_score", reward_kwargs={"reward_model": name}, advantage_estimator="tcrm_gae",
                   advantage_kwargs={"reward_model": name}, whiten_advantages=True)
    tr = Trainer(policy, tok, "dyck_walk", cfg, eval_examples=study.test_prompts())
    m = tr.step()
    assert tr.value_model is None and np.isfinite(m["loss"])
    assert tr.state["tcrm_forward"]["name"] == name  # the reward's forward pass served the estimator
    sep = Trainer(study.tiny_lm(tok, P, 0), tok, "dyck_walk", RLConfig(**{**cfg.__dict__, "advantage_estimator": "gae",
                                                                     "advantage_kwargs": {}}),
                  eval_examples=study.test_prompts())
    sep.step()
    assert study.state_bytes(sep)["total"] > study.state_bytes(tr)["total"]


def test_pair_target_is_the_pair_posterior():
    # one prompt, exact Monte Carlo: draw mu-walks, keep one valid and one invalid per pair, and compare the
    # share of valid walks among the pair walks through a position with W there
    ex = study.test_prompts()[0]
    rng = np.random.default_rng(0)
    walks = study.sample_walks([ex.prompt] * 4000, rng)
    exact, _ = study.oracle_scores([ex] * len(walks), walks)
    W = study.pair_target(exact)
    s = exact[0, 0]
    assert np.allclose(W[:, 0], 0.5)  # half the pair walks are valid, whatever s is
    v = exact[:, 1]
    assert np.allclose(W[:, 1], v * (1 - s) / (v * (1 - s) + (1 - v) * s))
    if abs(s - 0.5) > 0.05:
        assert not np.allclose(W, exact)
    with pytest.raises(ValueError, match="s must lie"):
        study.pair_target(np.array([[1.0, 1.0]]))
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        study.pair_target(np.array([[0.5, 1.5]]))


def test_studies_cells_stand_alone():
    """A later cell of each grid, run with the others, equals the same cell run alone (timings left
    out); a bad arm is refused with the arms named; the PPO cells rebuild the same reward model."""
    from rlcourse.studies.runner import run_study

    P = rlcourse.profile("smoke")
    for grid, run in ((study.rm_study(P, seeds=2), study.run_rm_cell), (study.ppo_study(P, seeds=2), study.run_ppo_cell)):
        res = run_study(grid, jobs=1, cache=False)
        arm, seed = grid.cells()[-1]
        assert seed == 1
        alone = json.loads(json.dumps(run(arm, seed, dict(grid.sizes)), default=lambda x: x.tolist()))
        untimed = [{k: v for k, v in m.items() if not k.endswith("seconds")} for m in (res.metrics[(arm, seed)], alone)]
        assert untimed[0] == untimed[1]
        with pytest.raises(ValueError, match=f"the arms are .*{arm}"):
            run("no such arm", 0, dict(grid.sizes))
    tok = build_tokenizer()
    a, _ = study.reward_model("TCRM", 0, P, tok)
    b, _ = study.reward_model("TCRM", 0, P, tok)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
