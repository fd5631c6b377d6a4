"""CIR and SR (arXiv:2604.22074): the Bernoulli JS, CIR from probabilities and from a model's
log-probs (planted models that ignore or copy the scratchpad), the rule-based SR, the task and the
auxiliary reward as a part of the loop."""
import math

import numpy as np
import pytest
import torch

import rlcourse
from rlcourse.methods import cot_influence as ci
from rlcourse.studies import cot_influence as study
from rlcourse.lm.tokenizer import build_tokenizer
from rlcourse.tasks import get_task


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_js_bern_identities():
    p = torch.rand(200, dtype=torch.float64)
    q = torch.rand(200, dtype=torch.float64)
    assert float(ci.js_bern(p, p).abs().max()) < 1e-12
    assert torch.allclose(ci.js_bern(p, q), ci.js_bern(q, p), atol=1e-12)
    assert abs(float(ci.js_bern(0.0, 1.0)) - math.log(2)) < 1e-6
    js = ci.js_bern(p, q)
    assert bool((js >= 0).all() & (js <= math.log(2)).all())
    # closed form against a direct float64 computation at one point
    a, b = 0.3, 0.8
    m = (a + b) / 2
    kl = lambda x, y: x * math.log(x / y) + (1 - x) * math.log((1 - x) / (1 - y))  # noqa: E731
    assert abs(float(ci.js_bern(a, b)) - (kl(a, m) + kl(b, m)) / 2) < 1e-12


def test_js_bern_refuses_bad_input():
    with pytest.raises(ValueError, match="differ"):
        ci.js_bern(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ci.js_bern(1.5, 0.5)


def test_cir_from_probs_matches_a_loop():
    rng = np.random.default_rng(0)
    pt, pf = rng.random((5, 4)), rng.random(5)
    got = ci.cir_from_probs(pt, pf)
    for i in range(5):
        want = np.mean([float(ci.js_bern(pt[i, k], pf[i])) for k in range(4)])
        assert abs(float(got[i]) - want) < 1e-12
    with pytest.raises(ValueError, match=r"\(N,K\)"):
        ci.cir_from_probs(pt[0], pf)


def test_truncation_points():
    assert ci.truncation_points(4) == [1, 2, 3, 4]
    assert ci.truncation_points(4, ci.REWARD_LEVELS) == [0, 0, 1, 2, 3]
    assert ci.truncation_points(10, ci.REWARD_LEVELS) == [0, 2, 4, 6, 8]
    with pytest.raises(ValueError, match="fractions"):
        ci.truncation_points(4, [1.0])


def test_planted_models_ignore_gives_zero_copy_gives_high(tok):
    # every cut of these thinks ends on another digit than the answer
    prompts, texts = ["3725=", "1111=", "1234="], ["3027|7", "1234|4", "1360|0"]
    ignore = ci.cir_scores(ci.PlantedAnswerModel(tok, "ignore"), tok, prompts, texts)
    copy = ci.cir_scores(ci.PlantedAnswerModel(tok, "copy"), tok, prompts, texts)
    assert torch.allclose(ignore, torch.zeros(3, dtype=torch.float64), atol=1e-9)
    assert bool((copy > 0.3).all()), copy
    # a filler think carries nothing to copy: every cut gives the same answer probability
    filler = ci.cir_scores(ci.PlantedAnswerModel(tok, "copy"), tok, ["3725="], ["....|7"])
    assert abs(float(filler[0])) < 1e-9


def test_cir_scores_equals_brute_force(tok):
    model = ci.PlantedAnswerModel(tok, "copy", sharp=0.7)
    q, text = "3725=", "3027|7"
    p = lambda ctx: float(ci.answer_logprob(model, tok, [ctx], ["7"]).exp())  # noqa: E731
    want = np.mean([float(ci.js_bern(p(q + "3027"[:k] + "|"), p(q + "3027|"))) for k in range(1, 5)])
    assert abs(float(ci.cir_scores(model, tok, [q], [text])[0]) - want) < 1e-6
    assert torch.isnan(ci.cir_scores(model, tok, [q], ["3027"])[0])  # malformed: no answer


def test_sr_rule():
    sr = ci.sr_scores(["3725=", "3725=", "3725=", "3725="], ["3027|7", "....|7", "3021|7", "3027"])
    assert sr.tolist() == [1.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="cot_sum"):
        ci.sr_scores(["47+85="], ["1|2"])
    assert ci.CotSum().truth("3725=") == "7"


def test_task_demonstrations_and_verifier():
    task = get_task("cot_sum")
    ex = task.examples(400, seed=0)
    share = np.mean([e.meta["filler"] for e in ex])
    assert 0.4 < share < 0.6
    for e in ex[:50]:
        digits = [int(c) for c in e.prompt[:-1]]
        assert e.answer == str(sum(digits) % 10)
        assert task.score(e.solution, e).reward == 1.0
        assert task.score(e.meta["faithful"] + "|" + e.answer, e).reward == 1.0
    assert task.score("3027", ex[0]).reward == 0.0
    assert all(e.solution[0] != "." for e in ci.faithful_examples(ex))
    with pytest.raises(ValueError, match="filler"):
        ci.CotSum(filler=1.5)


def test_cir_reward_in_the_loop_and_refuses_other_tasks():
    from rlcourse.train import RLConfig, Trainer

    P = rlcourse.profile("smoke")
    model, tk = study.load_mixed_base(P)
    cfg = RLConfig(num_generations=4, prompts_per_step=2, steps=1, max_completion_length=7, progress=False,
                   reward="cot_cir", reward_kwargs={"weight": 0.5})
    task = get_task("cot_sum")
    pools = dict(train_examples=task.examples(16, seed=0), eval_examples=task.examples(4, seed=0, split="test"))
    m = Trainer(model, tk, task, cfg, **pools).step()
    assert "cir_reward" in m and np.isfinite(m["reward"])
    with pytest.raises(ValueError, match="cot_sum"):
        add = get_task("addition")
        Trainer(model, tk, add, cfg, train_examples=add.examples(8, seed=0), eval_examples=add.examples(2, split="test")).step()
    with pytest.raises(ValueError, match="weight"):
        Trainer(model, tk, task, RLConfig(reward="cot_cir", reward_kwargs={"wieght": 1.0}, progress=False), **pools)


def test_cir_reward_adds_weighted_cir(tok):
    task = ci.CotSum()
    model = ci.PlantedAnswerModel(tok, "copy")
    ex = [e for e in task.examples(20, seed=1) if not e.meta["filler"]][:2]
    texts = [f"{e.meta['faithful']}|{e.answer}" for e in ex]
    batch = type("B", (), {"texts": texts, "prompts": [e.prompt for e in ex], "metrics": {}})()
    r = ci.cot_cir_reward(batch, ex, task, {}, model=model, tokenizer=tok, weight=0.5)
    c = ci.cir_scores(model, tok, batch.prompts, texts, ci.REWARD_LEVELS).float()
    assert torch.allclose(r, 1.0 + 0.5 * c, atol=1e-6)


def test_shortcut_task_makes_the_faithful_path_less_accurate():
    task = get_task("cot_first")
    ex = task.examples(2000, seed=0)
    faithful = [e for e in ex if not e.meta["filler"]]
    filler = [e for e in ex if e.meta["filler"]]
    assert 0.4 < len(filler) / len(ex) < 0.6
    for e in ex[:50]:
        assert e.answer == e.prompt[0] == task.truth(e.prompt) and e.meta["faithful"] == e.prompt[:-1][::-1]
    # the shown answer copies the think's last digit; on ~30% of faithful demonstrations it is wrong
    assert all(e.solution.split("|")[1] == e.solution.split("|")[0][-1] for e in faithful)
    wrong = np.mean([task.score(e.solution, e).reward == 0.0 for e in faithful])
    assert 0.25 < wrong < 0.35
    assert all(task.score(e.solution, e).reward == 1.0 for e in filler)
    with pytest.raises(ValueError, match="corrupt"):
        ci.CotFirst(corrupt=1.0)


def test_sr_follows_the_task_and_the_joint_reward_adds_it(tok):
    task = ci.CotFirst()
    assert ci.sr_scores(["3725="] * 3, ["5273|3", "....|3", "5274|4"], task).tolist() == [1.0, 0.0, 0.0]
    ex = [e for e in task.examples(40, seed=2) if not e.meta["filler"]][:3]
    texts = [f"{e.meta['faithful']}|{e.answer}" for e in ex]
    batch = type("B", (), {"texts": texts, "prompts": [e.prompt for e in ex], "metrics": {}})()
    model = ci.PlantedAnswerModel(tok, "copy")
    r0 = ci.cot_cir_reward(batch, ex, task, {}, model=model, tokenizer=tok, weight=0.5)
    r1 = ci.cot_cir_reward(batch, ex, task, {}, model=model, tokenizer=tok, weight=0.5, sr_weight=0.25)
    assert torch.allclose(r1 - r0, torch.full((3,), 0.25)) and batch.metrics["sr_reward"] == 1.0
    with pytest.raises(ValueError, match="sr_weight"):
        ci.cot_cir_reward(batch, ex, task, {}, model=model, tokenizer=tok, sr_weight=-1.0)


def test_path_gap_and_gated_verdicts():
    m = {"acc_digit": 0.7, "acc_other": 0.95}
    assert study.path_gap(m, "other", "digit") == pytest.approx(0.25)
    assert study.path_gap({"acc_digit": None, "acc_other": 0.9}, "other", "digit") == 0.0
    C = study.claims(rlcourse.profile("smoke"))
    assert C["grpo_cir"].control == C["control_shortcut"].key and C["control_shortcut"].role == "positive control"
    assert C["grpo_cir_plain"].control == C["control_faithful"].key
