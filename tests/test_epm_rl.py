"""EPM-RL: the parser, the rewards, LoRA's algebra, advantage invariance and the judge bound."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from rlcourse.advantages import compute_grpo_outcome_advantage
from rlcourse.methods import epm_rl as E


def test_task_labels_and_teacher_rationale_are_faithful():
    task = E.ProductPairs(0.7)
    ex = task.examples(200, seed=0)
    assert 0.35 < np.mean([e.answer == "Y" for e in ex]) < 0.65
    for e in ex:
        assert E.judge_score(e.solution, e.meta["brands"], e.meta["models"]) == 1.0
        assert task.score(e.solution, e).reward == 1.0


def test_judge_partial_credit_and_inconsistency():
    brands, models = ("kio", "kio"), ("4", "5")
    assert E.judge_score("kio/kio 4/5>N", brands, models) == 1.0
    assert E.judge_score("kio/kio 4/4>Y", brands, models) == 0.5  # wrong id cited, label follows from it
    assert E.judge_score("kio/kio 4/5>Y", brands, models) == 0.0  # label does not follow
    assert E.judge_score("garbage", brands, models) == 0.0


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_parser_never_crashes_and_malformed_scores_zero(text):
    got = E.parse_rationale(text)
    ex = E.ProductPairs(0.5).examples(1, seed=3)[0]
    parts = E.reward_parts([text], [ex])
    if got is None:
        assert float(parts["format"][0]) == float(parts["label"][0]) == float(parts["judge"][0]) == 0.0
        assert float(E.composite_reward(parts)[0]) == 0.0


@given(st.sampled_from(E.BRANDS), st.sampled_from(E.BRANDS), st.integers(0, 9), st.integers(0, 9),
       st.sampled_from("YN"))
def test_parser_roundtrip(b1, b2, m1, m2, label):
    assert E.parse_rationale(f" {b1}/{b2} {m1}/{m2}>{label}\n") == ((b1, b2), (str(m1), str(m2)), label)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="noise"):
        E.ProductPairs(1.5)
    with pytest.raises(ValueError, match="completions"):
        E.reward_parts(["a"], [])
    with pytest.raises(ValueError, match="w_judge"):
        E.composite_reward({"format": torch.ones(1), "label": torch.ones(1), "judge": torch.ones(1)}, w_judge=-1)
    with pytest.raises(ValueError, match="judge"):
        E.composite_reward({"format": torch.ones(1), "label": torch.ones(1)})
    with pytest.raises(ValueError, match="brand"):
        from rlcourse.tasks import Example
        E.reward_parts(["x"], [Example("p", "Y", "s")])
    with pytest.raises(ValueError, match="positive"):
        E.lora_parameter_count(4, 4, 0)


def test_lora_grads_match_autograd_and_finite_differences():
    g = torch.Generator().manual_seed(0)
    n, di, do, r, s = 5, 6, 4, 2, 2.0
    X, G = torch.randn(n, di, generator=g, dtype=torch.float64), torch.randn(n, do, generator=g, dtype=torch.float64)
    W0 = torch.randn(do, di, generator=g, dtype=torch.float64)
    A = torch.randn(r, di, generator=g, dtype=torch.float64, requires_grad=True)
    B = torch.randn(do, r, generator=g, dtype=torch.float64, requires_grad=True)
    loss = lambda A, B: ((X @ W0.T + s * X @ A.T @ B.T) * G).sum()
    loss(A, B).backward()
    dA, dB = E.lora_grads(G, X, A.detach(), B.detach(), s)
    assert torch.allclose(dA, A.grad, atol=1e-12) and torch.allclose(dB, B.grad, atol=1e-12)
    h, E_ = 1e-6, torch.zeros_like(B); E_[1, 0] = 1
    fd = (loss(A.detach(), B.detach() + h * E_) - loss(A.detach(), B.detach() - h * E_)) / (2 * h)
    assert abs(float(fd) - float(dB[1, 0])) < 1e-7
    dA0, _ = E.lora_grads(G, X, A.detach(), torch.zeros(do, r, dtype=torch.float64), s)
    assert float(dA0.abs().max()) == 0.0  # B = 0: the first step moves B only


def test_lora_b_zero_equals_base_and_counts_parameters():
    from rlcourse.capstone.models import add_lora
    from rlcourse.lm.model import build_model
    from rlcourse.lm.tokenizer import build_tokenizer
    import rlcourse

    tok = build_tokenizer()
    base = build_model(tok, rlcourse.profile("smoke"), seed=0).eval()
    ids = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = base(input_ids=ids).logits
    import copy
    lora = add_lora(copy.deepcopy(base), r=4, alpha=8).eval()
    with torch.no_grad():
        assert torch.equal(lora(input_ids=ids).logits, ref)
    cfg = base.config
    d, f = cfg.hidden_size, cfg.intermediate_size
    per_layer = 4 * E.lora_parameter_count(d, d, 4) + 2 * E.lora_parameter_count(d, f, 4) + E.lora_parameter_count(f, d, 4)
    assert E.count_parameters(lora)[0] == cfg.num_hidden_layers * per_layer


def test_group_advantage_invariant_to_per_prompt_constant():
    g = torch.Generator().manual_seed(0)
    N, Gs, T = 5, 6, 3
    r = torch.rand(N * Gs, generator=g, dtype=torch.float64)
    mask = torch.ones(N * Gs, T, dtype=torch.float64)
    index = torch.arange(N).repeat_interleave(Gs)
    c = torch.randn(N, generator=g, dtype=torch.float64)[index] * 10
    place = lambda x: torch.cat([torch.zeros(len(x), T - 1, dtype=x.dtype), x[:, None]], 1)
    a1, _ = compute_grpo_outcome_advantage(place(r), mask, index)
    a2, _ = compute_grpo_outcome_advantage(place(r + c), mask, index)
    assert float((a1 - a2).abs().max()) < 1e-12


def test_pinsker_bound_on_random_distributions():
    rng = np.random.default_rng(0)
    for _ in range(500):
        p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
        J = rng.random(6)
        kl = float(np.sum(p * np.log(p / q)))
        assert abs(p @ J - q @ J) <= E.judge_shift_bound(kl, float(J.max())) + 1e-12


def test_registered_rewards_compose():
    from rlcourse.rewards import get_reward
    from types import SimpleNamespace
    ex = E.ProductPairs(0.5).examples(3, seed=0)
    batch = SimpleNamespace(texts=[ex[0].solution, "bad", ex[2].solution])
    r = get_reward("epm_composite")(batch, ex, None, {}, w_format=0.2, w_label=1.0, w_judge=0.5)
    assert torch.allclose(r, torch.tensor([1.7, 0.0, 1.7]))
    assert torch.equal(get_reward("epm_format")(batch, ex, None, {}), torch.tensor([1.0, 0.0, 1.0]))


def test_pinsker_bound_is_tight_for_a_two_point_judge():
    # J = 1 on one outcome: |dE J| = TV exactly; a tiny KL makes TV ~ sqrt(KL/2), so the bound is nearly attained
    p, q = np.array([0.5 + 1e-3, 0.5 - 1e-3]), np.array([0.5, 0.5])
    kl = float(np.sum(p * np.log(p / q)))
    assert abs(p[0] - q[0]) / E.judge_shift_bound(kl) > 0.99
    assert E.judge_shift_bound(0.02) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="kl"):
        E.judge_shift_bound(-1.0)


def test_planted_label_deficit_is_class_conditional():
    ex = E.ProductPairs(0.7).examples(400, seed=3)
    planted = E.plant_label_deficit(ex, 1.0, seed=0)
    for e, f in zip(ex, planted):
        b, m = e.meta["brands"], e.meta["models"]
        target = b[0] == b[1] and m[0] != m[1]
        assert f.answer == e.answer and f.solution[:-1] == e.solution[:-1]
        assert f.solution[-1] == ("Y" if target else e.solution[-1])
    assert sum(f.solution != e.solution for e, f in zip(ex, planted)) > 50
    half = E.plant_label_deficit(ex, 0.5, seed=0)
    assert 0 < sum(f.solution != e.solution for e, f in zip(ex, half)) < sum(f.solution != e.solution
                                                                                for e, f in zip(ex, planted))
    with pytest.raises(ValueError, match="share"):
        E.plant_label_deficit(ex, 1.5)


def test_study_cell_alone_equals_the_grid_and_bad_arms_are_named():
    """A later cell of the grid (a noise level without the ablation), run alone, gives the runner's numbers."""
    from dataclasses import replace

    import rlcourse
    from rlcourse.studies import epm_rl as study
    from rlcourse.studies.runner import run_study

    s = study.study(replace(rlcourse.profile("smoke"), seeds=2))
    s = replace(s, arms=s.arms[:1])  # the low noise level only: no ablation, so the test stays short
    res = run_study(s, jobs=1, cache=False)
    arm, seed = s.cells()[-1]
    assert (arm, seed) == ("noise 0.2", 1) and "SFT-full" not in res.metrics[(arm, seed)]

    def numbers(out: dict) -> dict:
        return {k: {m: x for m, x in v.items() if m != "seconds"} if isinstance(v, dict) else v for k, v in out.items()}

    assert numbers(res.metrics[(arm, seed)]) == numbers(study.run_cell(arm, seed, dict(s.sizes)))
    with pytest.raises(ValueError, match="the arms are .*'noise 0.7'"):
        study.run_cell("noise 0.5", 0, dict(s.sizes))
