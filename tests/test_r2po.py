"""R2PO: the zero-initialised head is the policy exactly; the hook is gone outside its block; the
closed-form ratio and the small-head KL; the rarity advantage on hand examples and its sum (the
number of distinct outcomes); E[K] by Monte Carlo and its maximum at the uniform; the bandit's exact
gradients (corrected = true, the released update can lower J); the corrected loss is unbiased by
Monte Carlo; the sampler (GRPO's rollouts when the head never trains, behaviour log-probs,
LM untouched by the head's stage, refusals), exact resume in the Trainer, and the LM study's cells
standing alone."""
import copy
import math
import re

import numpy as np
import pytest
import torch

import rlcourse
from rlcourse.lm import build_model, build_tokenizer, response_logprobs, sample
from rlcourse.losses import POLICY_LOSSES, compute_policy_loss
from rlcourse.methods.r2po import (RolloutHead, bandit_gradients, compute_r2po_loss, expected_distinct, format_reward,
                                   head_from_state, head_kl, head_log_ratio, head_on, head_update, r2po_sampler,
                                   rarity_advantages)
from rlcourse.rollout import SAMPLERS, policy_sampler
from rlcourse.studies.r2po import bandit_run
from rlcourse.tasks import get_task
from rlcourse.train import RLConfig, Trainer


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    model = build_model(tok, rlcourse.profile("smoke"), seed=0).eval()
    return model, tok


def _ids(tok, texts):
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"]


def test_zero_init_head_is_the_policy_exactly(tiny):
    model, tok = tiny
    head = RolloutHead(model.config.hidden_size, model.config.vocab_size)
    assert float(head(torch.randn(3, model.config.hidden_size)).detach().abs().max()) == 0.0
    ids, mask = _ids(tok, ["12+34=64|46", "7+8=51|15"])
    plain = response_logprobs(model, ids, mask, 5)
    with head_on(model, head):
        rolled = response_logprobs(model, ids, mask, 5)
    assert float((plain - rolled).abs().max().detach()) == 0.0
    # the sampler's draws too: same generator, same tokens, same log-probs (the hooked model runs on
    # the transformers engine: the lean one reads lm_head's weight and would skip the head, so it refuses)
    for engine in ("lean", "hf"):
        a = sample(model, tok, ["1+2="], 4, 6, generator=torch.Generator().manual_seed(0), engine=engine)
        with head_on(model, head):
            b = sample(model, tok, ["1+2="], 4, 6, generator=torch.Generator().manual_seed(0))
            with pytest.raises(ValueError, match="forward hooks on lm_head"):
                sample(model, tok, ["1+2="], 4, 6, engine="lean")
        assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)


def test_head_changes_logits_only_inside_the_block(tiny):
    model, tok = tiny
    head = RolloutHead(model.config.hidden_size, model.config.vocab_size, init="zero_last")
    torch.nn.init.normal_(head.layer2.weight, std=0.5)
    ids, mask = _ids(tok, ["12+34="])
    before = response_logprobs(model, ids, mask, 2)
    with head_on(model, head):
        on = response_logprobs(model, ids, mask, 2)
    assert float((on - before).abs().max()) > 1e-3
    with pytest.raises(RuntimeError), head_on(model, head):
        raise RuntimeError("boom")
    assert not model.lm_head._forward_hooks  # removed, even after the error
    torch.testing.assert_close(response_logprobs(model, ids, mask, 2), before, rtol=0, atol=0)
    with pytest.raises(ValueError, match="init"):
        RolloutHead(4, 5, init="ones")


def test_head_stage_trains_the_head_only(tiny):
    model, tok = tiny
    head = RolloutHead(model.config.hidden_size, model.config.vocab_size)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-2)
    with head_on(model, head):
        batch = sample(model, tok, ["1+2=", "3+4="], 4, 6, generator=torch.Generator().manual_seed(1))
    before = [p.detach().clone() for p in model.parameters()]
    w2 = head.layer2.weight.detach().clone()
    adv = torch.linspace(-1, 1, len(batch))
    m = head_update(model, head, opt, batch, adv, beta=0.04)
    assert all(p.grad is None for p in model.parameters())  # the LM gets no gradient in stage A
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert float((head.layer2.weight - w2).abs().max()) > 0 and m["r2po_head_kl"] == 0.0  # f was 0 before the step
    # and with the hook's train_head flag, a gradient through the model reaches only the head
    ids, mask = _ids(tok, ["12+34=64"])
    with head_on(model, head, train_head=True):
        response_logprobs(model, ids, mask, 3).sum().backward()
    assert all(p.grad is None for p in model.parameters()) and head.layer1.weight.grad is not None


def test_closed_form_ratio_and_small_head_kl():
    g = torch.Generator().manual_seed(0)
    logits, delta = torch.randn(50, 7, generator=g), torch.randn(50, 7, generator=g)
    tokens = torch.randint(7, (50,), generator=g)
    direct = torch.log_softmax(logits.double(), -1) - torch.log_softmax(logits.double() + delta.double(), -1)
    torch.testing.assert_close(head_log_ratio(logits, delta, tokens), direct.gather(-1, tokens[:, None]).squeeze(-1))
    # KL(pi_{theta,phi} || pi_theta) = Var_pi(delta) / 2 + O(eps^3)
    for eps in (1e-1, 1e-2):
        d = eps * delta
        p = torch.softmax(logits.double(), -1)
        var = (p * d.double() ** 2).sum(-1) - (p * d.double()).sum(-1) ** 2
        err = (head_kl(logits.double(), d.double()) - var / 2).abs().max()
        assert err < 5 * eps ** 3, (eps, err)
    with pytest.raises(ValueError):
        head_log_ratio(logits, delta, tokens[:3])


def test_rarity_advantage_hand_examples():
    index = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5])
    a = rarity_advantages(scores, index)
    assert torch.equal(a[4:], torch.zeros(4))  # all equal: zero
    raw = torch.tensor([1 / 3, 1 / 3, 1 / 3, 1.0], dtype=torch.float64)
    expect = (raw - raw.mean()) / (raw.std() + 1e-6)
    torch.testing.assert_close(a[:4].double(), expect, atol=1e-6, rtol=0)
    assert a[3] > 0 > a[0]  # the rare outcome is pushed up
    for g in (0, 1):
        assert abs(float(a[index == g].sum())) < 1e-6
    # the raw scores 1/c sum to the number of distinct outcomes of the group
    r = torch.tensor([2.25, 0.25, 0.25, -2.0, 0.25, 2.25])
    assert float((1.0 / (r[:, None] == r[None, :]).sum(1).double()).sum()) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="G >= 2"):
        rarity_advantages(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]))


def test_expected_distinct_monte_carlo_and_uniform_maximum():
    rng = np.random.default_rng(0)
    p, G, n = np.array([0.6, 0.25, 0.1, 0.05]), 8, 100_000
    draws = rng.choice(4, size=(n, G), p=p)
    K = np.array([len(set(row)) for row in draws[:20_000]])
    se = K.std() / math.sqrt(len(K))
    assert abs(K.mean() - expected_distinct(p, G)) < 5 * se
    uniform = expected_distinct(np.full(4, 0.25), G)
    for _ in range(20):
        q = rng.dirichlet(np.ones(4))
        assert expected_distinct(q, G) <= uniform + 1e-12
    with pytest.raises(ValueError):
        expected_distinct(np.array([0.5, 0.6]), 3)


def test_bandit_corrected_is_the_gradient_and_released_can_descend():
    rng = np.random.default_rng(2)
    for _ in range(10):
        theta, f, r = rng.normal(size=5), rng.normal(size=5), rng.uniform(size=5)
        g = bandit_gradients(theta, f, r)
        np.testing.assert_allclose(g["corrected"], g["true"], atol=1e-12)
        # the true gradient by finite differences
        fd = np.array([(bandit_gradients(theta + 1e-6 * e, f, r)["J"] - bandit_gradients(theta - 1e-6 * e, f, r)["J"])
                       / 2e-6 for e in np.eye(5)])
        np.testing.assert_allclose(g["true"], fd, atol=1e-8)
    # the planted example of the chapter: pi prefers the best answer, the head pushes mass to the mediocre one
    theta, r = np.log([0.6, 0.4, 1e-3]), np.array([1.0, 0.5, 0.0])
    f = np.log([0.01, 0.5, 0.49]) - theta
    g = bandit_gradients(theta, f, r)
    assert g["ascent"] < 0
    run = bandit_run(theta, f, r, steps=5, lr=0.5)
    assert run["uncorrected"][1] < run["uncorrected"][0] < run["corrected"][1]


def test_corrected_loss_is_the_vanilla_loss_with_weighted_advantages():
    g = torch.Generator().manual_seed(3)
    B, T = 6, 5
    old, beh = -torch.rand(B, T, generator=g), -torch.rand(B, T, generator=g)
    logp = (old + 0.05 * torch.randn(B, T, generator=g)).requires_grad_()
    adv = torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    loss, m = compute_r2po_loss(old, logp, adv, mask, behaviour_logprob=beh)
    ref, _ = compute_policy_loss(old, logp, adv * torch.exp((old - beh) * mask), mask)
    torch.testing.assert_close(loss, ref)
    loss0, _ = compute_r2po_loss(old, logp, adv, mask)  # no behaviour log-probs: the vanilla loss
    torch.testing.assert_close(loss0, compute_policy_loss(old, logp, adv, mask)[0])
    seq, _ = compute_r2po_loss(old, logp, adv, mask, behaviour_logprob=beh, is_level="sequence")
    w = torch.exp(((old - beh) * mask).sum(-1, keepdim=True)).expand(B, T)
    torch.testing.assert_close(seq, compute_policy_loss(old, logp, adv * w, mask)[0])
    capped, mc = compute_r2po_loss(old, logp, adv, mask, behaviour_logprob=beh, is_cap=1.1)
    assert mc["behaviour_is_weight_max"] <= 1.1 + 1e-6
    assert POLICY_LOSSES.get("r2po") is compute_r2po_loss
    with pytest.raises(ValueError, match="is_level"):
        compute_r2po_loss(old, logp, adv, mask, behaviour_logprob=beh, is_level="row")
    with pytest.raises(ValueError):
        compute_r2po_loss(old, logp, adv, mask, behaviour_logprob=beh[:, :2])


def test_corrected_loss_is_unbiased_by_monte_carlo():
    """Tokens drawn from mu = softmax(theta + f): minus the gradient of the corrected loss (token-sum)
    estimates grad J; the released one does not. Tolerance: 5 standard errors of the mean."""
    rng = np.random.default_rng(4)
    theta, f, r = rng.normal(size=4), 1.5 * rng.normal(size=4), rng.uniform(size=4)
    g = bandit_gradients(theta, f, r)
    n = 200_000
    y = torch.as_tensor(rng.choice(4, size=n, p=g["mu"]))
    th = torch.tensor(theta, requires_grad=True)
    logp = torch.log_softmax(th, -1)[y][:, None]
    old = logp.detach()
    beh = torch.log(torch.as_tensor(g["mu"]))[y][:, None]
    adv = (torch.as_tensor(r)[y] - g["b"])[:, None]
    ones = torch.ones(n, 1, dtype=torch.float64)
    per = {}
    for name, b in (("corrected", beh), ("released", None)):
        th.grad = None
        loss, _ = compute_r2po_loss(old, logp, adv, ones, behaviour_logprob=b, loss_agg_mode="token-mean")
        loss.backward(retain_graph=True)
        per[name] = -th.grad.numpy()
    # per-sample gradients' spread bounds the error of their mean
    w = torch.exp(old - beh).squeeze(-1).numpy()
    score = np.eye(4)[y.numpy()] - g["pi"]
    samples = (w * adv.squeeze(-1).numpy())[:, None] * score
    se = samples.std(0) / math.sqrt(n)
    assert np.all(np.abs(per["corrected"] - g["true"]) < 5 * se + 1e-9)
    np.testing.assert_allclose(per["released"], g["uncorrected"], atol=5 * se.max() * 3)
    assert np.abs(g["uncorrected"] - g["true"]).max() > 20 * se.max()  # the released update is biased here


def test_format_reward_values():
    task = get_task("addition")
    ex = task.examples(1, seed=0)[0]

    class B:
        texts = [f"{ex.answer[::-1]}|{ex.answer}", "0|1", "no bar"]
    vals = format_reward(B, [ex] * 3, task, {})
    assert vals.tolist() == [2.25, 0.25, -2.0]


def _cfg(**kw):
    base = dict(num_generations=4, prompts_per_step=2, max_completion_length=6, steps=3, progress=False,
                learning_rate=1e-3, sampler="r2po", sampler_kwargs={"head_lr": 1e-2}, reward="r2po_format")
    return RLConfig(**{**base, **kw})


def test_sampler_without_head_training_samples_the_policy(tiny):
    model, tok = tiny
    task = get_task("addition")
    ex = task.examples(2, seed=0)
    cfg = _cfg()
    a = r2po_sampler(model, tok, [e.prompt for e in ex], cfg, torch.Generator().manual_seed(5), {}, ex, task,
                     format_reward, 1, head_every=0)
    b = policy_sampler(model, tok, [e.prompt for e in ex], cfg, torch.Generator().manual_seed(5), {})
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.extras["behaviour_logprob"], a.logprobs, atol=1e-5, rtol=0)
    assert SAMPLERS.get("r2po") is r2po_sampler


def test_sampler_records_behaviour_logprobs_and_leaves_the_model(tiny):
    model, tok = tiny
    task = get_task("addition")
    ex = task.examples(2, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    state = {}
    for step in (1, 2, 3):
        batch = r2po_sampler(model, tok, [e.prompt for e in ex], _cfg(), torch.Generator().manual_seed(step), state,
                             ex, task, format_reward, step, head_lr=5e-2)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before)) and not model.lm_head._forward_hooks
    assert state["r2po"]["updates"] == 3 and batch.metrics["r2po_head_updates"] == 3
    head = head_from_state(state["r2po"])[0]
    T, mask = batch.response_len, batch.response_mask
    with head_on(model, head):
        mu = response_logprobs(model, batch.input_ids, batch.attention_mask, T) * mask
    torch.testing.assert_close(batch.extras["behaviour_logprob"], mu, atol=1e-5, rtol=0)
    pi = response_logprobs(model, batch.input_ids, batch.attention_mask, T) * mask
    torch.testing.assert_close(batch.logprobs, pi, atol=1e-6, rtol=0)
    assert float((mu - pi).abs().max()) > 0  # the head moved
    with pytest.raises(ValueError, match="top_k"):
        r2po_sampler(model, tok, ["1+2="], _cfg(top_k=3), None, {}, ex[:1], task, format_reward, 1)
    with pytest.raises(ValueError, match="num_generations"):
        r2po_sampler(model, tok, ["1+2="], _cfg(num_generations=1), None, {}, ex[:1], task, format_reward, 1)


def test_trainer_runs_and_resumes_exactly(tiny, tmp_path):
    model, tok = tiny
    kw = dict(policy_loss="r2po", micro_batch_size=3, steps=4)
    a = Trainer(copy.deepcopy(model), tok, "addition", _cfg(output_dir=str(tmp_path / "a"), save_every=2, **kw))
    a.train(steps=2)
    b = Trainer(copy.deepcopy(model), tok, "addition", _cfg(output_dir=str(tmp_path / "a"), save_every=2, **kw),
                resume=True)
    b.train()
    ref = Trainer(copy.deepcopy(model), tok, "addition", _cfg(**kw))
    ref.train()
    for p, q in zip(b.model.parameters(), ref.model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    for k, v in ref.state["r2po"]["head"].items():
        torch.testing.assert_close(b.state["r2po"]["head"][k], v, rtol=0, atol=0)
    keys = ("r2po_kl", "r2po_distinct", "reward", "loss")
    assert [[m[k] for k in keys] for m in b.history] == [[m[k] for k in keys] for m in ref.history]
    assert all("r2po_head_loss" in m for m in ref.history)


def test_head_lr_rule_reads_only_the_head_kl():
    from rlcourse.studies.r2po import HEAD_KL_MAX, choose_head_lr, late_kl

    sweep = {1e-2: [0.35, 0.12, 0.40], 3e-3: [0.08, 0.09, 0.11], 1e-3: [0.03, 0.05, 0.04], 3e-4: [0.01, 0.01, 0.02]}
    assert choose_head_lr(sweep) == 1e-3  # the largest whose every seed stayed within 0.1
    assert choose_head_lr(sweep, kl_max=0.12) == 3e-3 and choose_head_lr(sweep, kl_max=0.5) == 1e-2
    assert choose_head_lr({1e-2: [0.5, 0.6]}) is None and HEAD_KL_MAX == 0.1
    for bad in ({}, {1e-2: []}, {-1.0: [0.1]}, {1e-2: [float("nan")]}):
        with pytest.raises(ValueError):
            choose_head_lr(bad)
    with pytest.raises(ValueError, match="kl_max"):
        choose_head_lr(sweep, kl_max=0.0)
    hist = [{"r2po_kl": k} for k in np.linspace(0.0, 0.9, 10)] + [{"loss": 1.0}] + [{"r2po_kl": 1.0}] * 10
    assert late_kl(hist) == pytest.approx(1.0) and late_kl(hist, last=20) == pytest.approx(0.725)
    with pytest.raises(ValueError, match="r2po_kl"):
        late_kl([{"loss": 1.0}])


def test_pass1_verdict_is_uninformative_when_the_head_drifted():
    """lm_verdicts on made-up per-seed numbers: the accuracy claims rest on the head-KL control."""
    from rlcourse.studies import r2po

    def fake(kl):
        def row(p1, dist, fmt, kl_):
            r = {"inference": {"pass@1": p1, "format_errors": fmt, "distinct": dist},
                 "training": {"distinct": dist}, "greedy": p1}
            return r if kl_ is None else {**r, "late_kl": kl_}
        arms = {"GRPO": [row(0.43 + d, 4.0 + d, 0.03, None) for d in (0.0, 0.01, -0.01)],
                "R2PO (released ratio)": [row(0.37 + d, 5.2 + d, 0.05, k) for d, k in zip((0.0, 0.02, -0.01), kl)],
                "R2PO (corrected ratio)": [row(0.35 + d, 5.0, 0.3, k) for d, k in zip((0.0, 0.01, 0.02), kl)]}
        return {"arms": arms, "base": {"pass@1": 0.31}, "seconds": 1.0}

    drifted = r2po.lm_verdicts(fake([0.35, 0.30, 0.41]))
    assert drifted["head_kl"].verdict == "does not hold"
    assert drifted["pass1"].verdict == drifted["corrected"].verdict == "uninformative"
    assert drifted["diverse"].verdict != "uninformative"
    within = r2po.lm_verdicts(fake([0.03, 0.05, 0.04]))
    assert within["head_kl"].holds and within["pass1"].verdict == "does not hold"
    assert within["pass1"].claim.control == within["head_kl"].claim.key
    assert within["format"].claim.role == "course hypothesis" and within["head_kl"].claim.role == "positive control"


def test_head_lr_sweep_runs_on_choosing_seeds_and_prompts():
    import rlcourse
    from rlcourse.studies.r2po import choose_head_lr, head_lr_sweep, run_lm_experiment

    P = rlcourse.profile("smoke")
    sweep = head_lr_sweep(P, head_lrs=(1e-2,), seeds=(10,))
    assert set(sweep) == {1e-2} and sweep[1e-2].shape == (1,) and np.isfinite(sweep[1e-2]).all()
    assert choose_head_lr(sweep, kl_max=1e9) == 1e-2
    with pytest.raises(ValueError, match="disjoint"):
        head_lr_sweep(P, seeds=(1, 2, 3))
    with pytest.raises(ValueError, match="prompts"):
        run_lm_experiment(P, prompts="test")


def test_studies_cells_stand_alone():
    """A later cell of the grid, run with the others, equals the same cell run alone (the trainer's
    wall-clock timings aside); a bad arm is refused with the arms named."""
    from rlcourse.studies import r2po
    from rlcourse.studies.runner import run_study

    def untimed(m):
        return {k: v for k, v in m.items() if not (k.startswith("history/time_") or k.endswith("_seconds"))}

    study = r2po.lm_study(rlcourse.profile("smoke"), seeds=2)
    res = run_study(study, jobs=1, cache=False)
    arm, seed = study.cells()[-1]
    assert seed == 1 and arm == "R2PO (corrected ratio)"
    assert untimed(res.metrics[(arm, seed)]) == untimed(r2po.run_lm_cell(arm, seed, dict(study.sizes)))
    assert r2po.lm_cell_result(res.metrics[(arm, seed)])["late_kl"] == res.metrics[(arm, seed)]["late_kl"]
    with pytest.raises(ValueError, match=f"the arms are .*{re.escape(repr(arm))}"):
        r2po.run_lm_cell("no such arm", 0, dict(study.sizes))
    with pytest.raises(ValueError, match="the arms are .*'base model'"):
        r2po.run_lm_base_cell("GRPO", 0, dict(r2po.lm_base_study(rlcourse.profile("smoke")).sizes))
