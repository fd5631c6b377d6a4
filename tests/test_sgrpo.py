import copy
import math

import numpy as np
import pytest
import torch

import rlcourse
import rlcourse.methods.sgrpo as sg
from rlcourse.advantages import compute_grpo_outcome_advantage, place_on_last_token
from rlcourse.lm import build_model, build_tokenizer, response_logprobs, sample
from rlcourse.losses import compute_policy_loss
from rlcourse.rewards import register_reward
from rlcourse.tasks import Addition, Example, get_task
from rlcourse.train import RLConfig, Trainer


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return build_model(tok, rlcourse.profile("smoke"), seed=0), tok


def test_zero_variance_probability_monte_carlo():
    rng = np.random.default_rng(0)
    for p, G in [(0.05, 8), (0.3, 4), (0.5, 2), (0.9, 16)]:
        draws = rng.random((200_000, G)) < p
        sums = draws.sum(1)
        mc = np.mean((sums == 0) | (sums == G))
        exact = sg.zero_variance_probability(p, G)
        assert abs(mc - exact) < 4 * math.sqrt(exact * (1 - exact) / 200_000) + 1e-4
        assert abs(exact - (p**G + (1 - p) ** G)) < 1e-15
    # a wrong formula (only all-fail) would fail at p = 0.9
    assert sg.zero_variance_probability(0.9, 16) > 0.18
    with pytest.raises(ValueError):
        sg.zero_variance_probability(1.2, 4)


@pytest.mark.parametrize("n", [4, 8, 9, 16])
def test_injected_advantages_closed_forms(n):
    r = torch.zeros(n)
    r[-1] = 1.0
    mask = torch.ones(n, 2)
    adv, _ = compute_grpo_outcome_advantage(place_on_last_token(r, mask), mask, torch.zeros(n, dtype=torch.long),
                                            epsilon=0.0)
    a_star, a_fail = sg.injected_advantages(n, "sample")
    assert abs(float(adv[-1, 0]) - a_star) < 1e-5 and abs(float(adv[0, 0]) - a_fail) < 1e-5
    x = r.double().numpy()
    pop = (x - x.mean()) / x.std()
    a_star_p, a_fail_p = sg.injected_advantages(n, "pop")
    assert abs(pop[-1] - a_star_p) < 1e-12 and abs(pop[0] - a_fail_p) < 1e-12
    # the brief's append form, G = n - 1 samples + 1: pop std gives sqrt(G) and -1/sqrt(G)
    assert abs(a_star_p - math.sqrt(n - 1)) < 1e-12


def test_all_fail_groups():
    r = torch.tensor([0, 0, 0, 1, 0, 0, 0, 0.0])
    assert sg.all_fail_groups(r, 4).tolist() == [False, True]
    with pytest.raises(ValueError, match="G=3"):
        sg.all_fail_groups(r, 3)


def _batch(tiny, prompts, G=2, T=3):
    model, tok = tiny
    return sample(model, tok, prompts, num_generations=G, max_new_tokens=T, temperature=0.8,
                  generator=torch.Generator().manual_seed(0))


def test_injection_recomputes_logprobs_and_pads(tiny):
    model, tok = tiny
    batch = _batch(tiny, ["12+34=", "5+6="], G=2, T=3)
    demo = ["64|46", "11|11"]
    new = sg.inject_demonstrations(model, tok, batch, [1, 3], demo)
    assert new.response_len == 6 >= batch.response_len  # "64|46" + EOS
    assert new.texts[1] == "64|46" and new.texts[0] == batch.texts[0]
    assert new.response_mask[1].tolist() == [1.0] * 6 and not new.truncated[1]
    with torch.no_grad():
        lp = response_logprobs(model, new.input_ids, new.attention_mask, new.response_len, new.temperature)
    m = new.response_mask
    assert float(((lp - new.logprobs) * m).abs().max()) < 1e-5  # ratio exactly 1 on every row
    assert tok.decode(new.response_ids[3][new.response_mask[3] == 1]).replace("<eos>", "") == "11|11"
    assert torch.equal(batch.response_ids, _batch(tiny, ["12+34=", "5+6="], G=2, T=3).response_ids)  # not mutated
    with pytest.raises(ValueError, match="distinct"):
        sg.inject_demonstrations(model, tok, batch, [1, 1], demo)


def test_gradient_is_weighted_sft_plus_unlikelihood(tiny):
    """At ratio 1, the clipped loss's gradient on an injected group equals
    -(1/n) [A* grad mean-logp(y*) + A_fail sum_i grad mean-logp(y_i)] (seq-mean-token-mean)."""
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    G = 4
    batch = _batch((model, tok), ["12+34="], G=G, T=4)
    batch = sg.inject_demonstrations(model, tok, batch, [G - 1], ["64|46"])
    r = torch.tensor([0.0] * (G - 1) + [1.0])
    mask = batch.response_mask
    adv, _ = compute_grpo_outcome_advantage(place_on_last_token(r, mask), mask, batch.index, epsilon=0.0)
    logp = response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_len, batch.temperature)
    loss, _ = compute_policy_loss(batch.logprobs, logp, adv, mask, loss_agg_mode="seq-mean-token-mean")
    params = [p for p in model.parameters()]
    g_loss = torch.autograd.grad(loss, params)
    a_star, a_fail = sg.injected_advantages(G, "sample")
    logp2 = response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_len, batch.temperature)
    seq_mean = (logp2 * mask).sum(1) / mask.sum(1)
    manual = -(a_star * seq_mean[-1] + a_fail * seq_mean[:-1].sum()) / G
    g_manual = torch.autograd.grad(manual, params)
    for a, b in zip(g_loss, g_manual):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_sampler_in_trainer_injects_and_leaves_successful_groups(tiny):
    model, tok = tiny
    task = Addition()
    pool = task.examples(20, seed=0)
    cfg = RLConfig(num_generations=2, prompts_per_step=3, max_completion_length=8, steps=1, progress=False,
                   sampler="s_grpo", eval_prompts=4)
    # from the config alone: the trainer hands the sampler the step's examples, task and reward
    tr2 = Trainer(copy.deepcopy(model), tok, task, cfg, train_examples=pool)
    m = tr2.step()
    assert tr2.state["s_grpo"]["injected"] == [1.0]  # an untrained model fails everything
    assert m["reward"] == pytest.approx(0.5)  # one demonstration (reward 1) in each group of 2
    # a group with a success is left alone: patch the verifier to accept everything
    class Lenient(Addition):
        def score(self, completion, example):
            return get_task("addition").score(example.solution, example)

    tr3 = Trainer(copy.deepcopy(model), tok, task, cfg, train_examples=pool)
    sg.attach_references(tr3.state, Lenient(), pool)
    gen = torch.Generator().manual_seed(5)
    out = sg.s_grpo_sampler(tr3.model, tok, [e.prompt for e in pool[:3]], cfg, gen, tr3.state)
    ref = sample(tr3.model, tok, [e.prompt for e in pool[:3]], num_generations=2, max_new_tokens=8,
                 generator=torch.Generator().manual_seed(5))
    assert out.texts == ref.texts and torch.equal(out.logprobs, ref.logprobs)
    assert tr3.state["s_grpo"]["injected"] == [0.0]


def test_attach_references_rejects_wrong_demonstrations():
    bad = [Example("1+1=", "2", "3|3")]
    with pytest.raises(ValueError, match="verifier"):
        sg.attach_references({}, "addition", bad)


def test_sortadd_task_scores_both_parts():
    task = sg.SortAddition()
    ex = task.examples(50, seed=0)
    kinds = {("+" in e.prompt) for e in ex}
    assert kinds == {True, False}
    assert all(task.score(e.solution, e).reward == 1.0 for e in ex)


def test_injection_of_a_longer_demonstration_widens_every_per_token_tensor(tiny):
    """Demonstrations longer than every sampled response (max_completion_length=1): the batch, its
    entropy and its extras are widened, and the injected rows' entropy is recomputed, not kept."""
    model, tok = tiny
    pool = Addition().examples(12, seed=1)
    cfg = RLConfig(num_generations=2, prompts_per_step=2, max_completion_length=1, steps=1, progress=False,
                   sampler="s_grpo", eval_prompts=4)
    tr = Trainer(copy.deepcopy(model), tok, "addition", cfg, train_examples=pool)
    m = tr.step()  # crashed: "shape mismatch: loss_mat (4, 1), loss_mask (4, 8)"
    assert m["reward"] == pytest.approx(0.5) and math.isfinite(m["entropy"])
    batch = sample(model, tok, [e.prompt for e in pool[:2]], num_generations=2, max_new_tokens=1,
                   generator=torch.Generator().manual_seed(0))
    batch.extras["x"] = torch.ones_like(batch.logprobs)
    new = sg.inject_demonstrations(model, tok, batch, [1], [pool[0].solution])
    T = len(pool[0].solution) + 1
    assert new.response_len == T and new.entropy.shape == (4, T) and "x" not in new.extras
    _, ent = response_logprobs(model, new.input_ids[1:2], new.attention_mask[1:2], T, 1.0, return_entropy=True)
    assert torch.allclose(new.entropy[1], ent[0] * new.response_mask[1], atol=1e-5)
    assert (new.entropy[1, 1:T] > 0).all()  # kept or zero-padded, these would be 0


def test_injection_and_the_trainer_use_the_same_reward(tiny):
    """Under a reward other than the task's verifier (here: it fails everything, as a noisy verifier
    might), the sampler decides the injection with that reward, and the trainer's advantages use the
    very scores the sampler acted on: each all-fail group holds one demonstration scored 1."""
    model, tok = tiny
    pool = Addition().examples(20, seed=0)
    calls = []

    @register_reward("test_sg_fails_all", overwrite=True)
    def fails_all(batch, examples, task, state):
        calls.append(len(batch))
        return torch.zeros(len(batch))

    cfg = RLConfig(num_generations=4, prompts_per_step=3, max_completion_length=8, steps=1, progress=False,
                   sampler="s_grpo", reward="test_sg_fails_all", eval_prompts=4)
    tr = Trainer(copy.deepcopy(model), tok, "addition", cfg, train_examples=pool)
    m = tr.step()
    assert calls == [12]  # scored once, by the sampler; the trainer reused its scores
    assert m["reward"] == pytest.approx(0.25) and tr.state["s_grpo"]["injected"] == [1.0]


# ------------------------------------------------------------------ the chapter's SFT frontier
def test_sft_forgetting_at_reads_the_frontier():
    from rlcourse.studies.s_grpo import sft_forgetting_at

    slow = np.array([[0.0, 0.0], [0.1, 0.02], [0.2, 0.06]])
    fast = np.array([[0.0, 0.0], [0.2, 0.2], [0.4, 0.5]])
    # interpolated at the first crossing; the most favourable run wins
    assert sft_forgetting_at(0.15, [slow, fast]) == (pytest.approx(0.04), True)
    assert sft_forgetting_at(0.3, [slow, fast]) == (pytest.approx(0.35), True)
    # a gain no run reaches: the largest-gain point stands in, flagged as unmatched
    assert sft_forgetting_at(0.9, [slow, fast]) == (pytest.approx(0.5), False)
    with pytest.raises(ValueError, match="trajectory"):
        sft_forgetting_at(0.1, [np.zeros((3, 3))])
    with pytest.raises(ValueError, match="at least one"):
        sft_forgetting_at(0.1, [])


def test_sgrpo_claims_are_well_formed():
    from rlcourse.studies.s_grpo import SGRPO_CLAIMS

    for c in SGRPO_CLAIMS.values():
        assert c.key.startswith("s_grpo/") and c.source == "abstract" and c.kind == "greater"


def test_learning_summary_says_which_verdicts_rest_on_arms_that_learned():
    import rlcourse.studies.s_grpo as sgr

    def res(add_final):  # base addition 0.2; each arm's final addition accuracy per seed (2 seeds)
        curve = lambda f: {"addition": np.array([[0.2, f[0]], [0.2, f[1]]]),  # noqa: E731
                           "sort": np.array([[0.9, 0.9], [0.9, 0.8]])}
        return {"base": {"addition": 0.2, "sort": 0.9}, "lr": 3e-4, "seeds": [0, 1],
                "curves": {a: curve(add_final[a]) for a in ("GRPO", "S-GRPO")},
                "sft": {3e-4: curve(add_final["SFT"])}}

    flat = sgr.learning_summary(res({"GRPO": (0.21, 0.19), "S-GRPO": (0.25, 0.22), "SFT": (0.2, 0.2)}))
    assert flat["threshold"] == sgr.LEARNED_GAIN == 0.05
    assert np.allclose(flat["gain"]["S-GRPO"], [0.05, 0.02]) and flat["mean"]["S-GRPO"] == pytest.approx(0.035)
    assert not any(flat["learned"].values()) and flat["weak"] == ["vs-grpo", "vs-sft-gain", "forgetting"]
    assert "No arm gained 0.05 or more" in flat["sentence"] and "+0.050, +0.020" in flat["sentence"]
    some = sgr.learning_summary(res({"GRPO": (0.3, 0.35), "S-GRPO": (0.2, 0.2), "SFT": (0.2, 0.2)}))
    assert some["learned"] == {"GRPO": True, "S-GRPO": False, "SFT lr=0.0003": False}
    assert some["weak"] == ["vs-sft-gain", "forgetting"] and "say little" in some["sentence"]
    every = sgr.learning_summary(res({"GRPO": (0.3, 0.3), "S-GRPO": (0.4, 0.4), "SFT": (0.3, 0.3)}))
    assert every["weak"] == [] and "Every verdict below involves an arm that learned" in every["sentence"]


def test_frontier_run_rejects_an_empty_budget():
    import rlcourse
    from rlcourse.studies.s_grpo import run_sgrpo_frontier

    smoke = rlcourse.profile("smoke")
    with pytest.raises(ValueError, match="steps=0"):
        run_sgrpo_frontier(smoke, steps=0)
    with pytest.raises(ValueError, match="sft_lrs=\\[\\]"):
        run_sgrpo_frontier(smoke, sft_lrs=[])
    with pytest.raises(ValueError, match="lr=-0.001"):
        run_sgrpo_frontier(smoke, lr=-1e-3)


def test_sft_rate_rule_refuses_the_reported_seeds_and_compares_with_the_chosen_rate():
    import rlcourse.studies.s_grpo as sgr
    from rlcourse.profiles import profile

    with pytest.raises(ValueError, match="overlaps"):
        sgr.choose_sft_lr(profile("book"), first_seed=1)
    claim = sgr.SGRPO_CLAIMS["vs-sft-gain"]
    assert "best rate" in claim.baseline and "from 10 on" in claim.setting


def test_frontier_study_cells_stand_alone():
    """A later cell of the grid, run with the others, equals the same cell run alone; a bad arm is named."""
    from dataclasses import replace

    import rlcourse.studies.s_grpo as sgr
    from rlcourse.studies.runner import run_study

    s = sgr.frontier_study(replace(rlcourse.profile("smoke"), seeds=2))
    res = run_study(s, jobs=1, cache=False)
    arm, seed = s.cells()[-1]
    assert (arm, seed) == ("S-GRPO", 1) and s.arms == ("SFT lr=0.0001", "GRPO", "S-GRPO")
    assert res.metrics[(arm, seed)] == sgr.run_cell(arm, seed, dict(s.sizes))
    assert len(res.metrics[(arm, seed)]["injected"]) == s.sizes["steps"] and "injected" not in res.metrics[("GRPO", 1)]
    with pytest.raises(ValueError, match="the arms are .*'SFT lr=0.0001'.*'S-GRPO'"):
        sgr.run_cell("no such arm", 0, dict(s.sizes))
    with pytest.raises(ValueError, match="the arms are .*'base model'"):
        sgr.run_base_cell("no such arm", 0, sgr.base_study(rlcourse.profile("smoke")).sizes)
