"""Property-based tests (hypothesis) of what readers feed the package: verifiers, estimators, losses.

- Every registered task's verifier, on arbitrary text, returns a ``Score`` with a reward in [0, 1]
  and a non-empty reason, never an exception; text with no digit at all (a malformed answer for every
  task here, whose answers are numbers, digit strings or moves) scores 0 and says why.
- Every registered advantage estimator and policy loss that the loop can call with its standard
  arguments alone (the ones that need a task's examples or a sampler's extras are covered by
  tests/test_combinations.py), on random group counts, group sizes, lengths and right-padded masks:
  finite outputs of the right shape, zero advantages where the mask is 0 (or, for groups of one, a
  ValueError saying the estimator needs at least two samples to normalise), a finite loss whose gradient
  reaches only unmasked tokens; a mask of another shape is a ValueError that says so.

The examples are few (``max_examples``) and small, so the file runs in seconds; hypothesis still
shrinks any failure to a minimal case.
"""
import inspect
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlcourse.methods  # noqa: F401  (registers the chapters' tasks, estimators and losses)
from rlcourse.advantages import ESTIMATORS
from rlcourse.losses import POLICY_LOSSES
from rlcourse.tasks import Score, get_task, task_names
from rlcourse.train import LOSS_ARGUMENTS

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ESTIMATOR_ARGUMENTS = {"token_level_rewards", "response_mask", "index", "values", "gamma", "lam",
                       "norm_adv_by_std_in_grpo", "scores"}


def required(fn) -> set:
    return {name for name, p in inspect.signature(fn).parameters.items()
            if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def standard_estimators() -> list[str]:
    """The estimators that run on the standard arguments alone (OTB, for one, also needs the
    sampler's ``sum_pi_sq`` and refuses without it: tests/test_otb.py and the combinations test)."""
    from rlcourse.train import call_with_supported
    mask = torch.ones(4, 2)
    probe = dict(token_level_rewards=torch.tensor([[0, 1.0], [0, 0], [0, 1], [0, 0]]), response_mask=mask,
                 index=torch.tensor([0, 0, 1, 1]), values=torch.zeros(4, 2), gamma=1.0, lam=1.0,
                 norm_adv_by_std_in_grpo=True, scores=torch.tensor([1.0, 0, 1, 0]))
    names = []
    for n in ESTIMATORS.names():
        if required(ESTIMATORS.get(n)) <= ESTIMATOR_ARGUMENTS:
            try:
                call_with_supported(ESTIMATORS.get(n), **probe)
                names.append(n)
            except ValueError:
                pass
    return names


def standard_losses() -> list[str]:
    """The losses that run on the standard arguments alone (the capstone's ``tis``, for one, also needs
    the sampler's ``rollout_log_prob`` and refuses without it: tests/test_capstone.py and the
    combinations test)."""
    from rlcourse.train import call_policy_loss
    agg = dict(loss_agg_mode="token-mean", global_tokens=4.0, global_seqs=2.0, max_len=2)
    names = []
    for n in POLICY_LOSSES.names():
        if required(POLICY_LOSSES.get(n)) <= LOSS_ARGUMENTS:
            try:
                call_policy_loss(POLICY_LOSSES.get(n), agg, old_log_prob=torch.zeros(2, 2), log_prob=torch.zeros(2, 2),
                                 advantages=torch.ones(2, 2), response_mask=torch.ones(2, 2), clip_ratio_low=0.2,
                                 clip_ratio_high=0.2, clip_ratio_c=3.0)
                names.append(n)
            except ValueError:
                pass
    return names


def test_the_standard_parts_are_most_of_the_registry():
    assert {"grpo", "rloo", "gae", "reinforce"} <= set(standard_estimators())
    assert {"vanilla", "pg", "gipo", "ppo_is"} <= set(standard_losses())


@pytest.fixture(scope="module")
def examples():
    return {t: get_task(t).examples(3, seed=0, split="train") for t in task_names()}


@pytest.mark.parametrize("task", task_names())
@SETTINGS
@given(text=st.text(max_size=60), which=st.integers(0, 2))
def test_verifier_never_crashes_on_arbitrary_text(examples, task, text, which):
    score = get_task(task).score(text, examples[task][which])
    assert isinstance(score, Score) and 0.0 <= score.reward <= 1.0
    assert isinstance(score.reason, str) and score.reason.strip()


@pytest.mark.parametrize("task", task_names())
@SETTINGS
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Nd",), blacklist_characters="LRUD"), max_size=40),
       which=st.integers(0, 2))
def test_malformed_answer_scores_zero_with_a_reason(examples, task, text, which):
    """No digit (and no FrozenLake move letter): nothing a task here could accept as an answer."""
    score = get_task(task).score(text, examples[task][which])
    assert score.reward == 0.0, (task, text, score)
    assert score.reason.strip() and score.reason != "correct"


@st.composite
def rollouts(draw):
    """``(scores (B,), mask (B,T) right-padded with >= 1 token per row, index (B,), values (B,T))``."""
    groups, size, length = draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 6))
    B = groups * size
    lengths = torch.tensor(draw(st.lists(st.integers(1, length), min_size=B, max_size=B)))
    mask = (torch.arange(length)[None] < lengths[:, None]).float()
    binary = draw(st.booleans())
    raw = draw(st.lists(st.floats(-3, 3, allow_nan=False, width=32), min_size=B, max_size=B))
    scores = torch.tensor([float(r > 0) for r in raw] if binary else raw)
    values = torch.tensor(draw(st.lists(st.floats(-2, 2, allow_nan=False, width=32), min_size=B * length,
                                        max_size=B * length))).reshape(B, length) * mask
    return scores, mask, torch.arange(groups).repeat_interleave(size), values


def last_token_rewards(scores, mask):
    from rlcourse.advantages import place_on_last_token
    return place_on_last_token(scores, mask)


@pytest.mark.parametrize("name", standard_estimators())
@SETTINGS
@given(data=rollouts())
def test_estimator_is_finite_shaped_and_masked(name, data):
    from rlcourse.train import call_with_supported
    scores, mask, index, values = data
    try:
        adv, ret = call_with_supported(ESTIMATORS.get(name), token_level_rewards=last_token_rewards(scores, mask),
                                       response_mask=mask, index=index, values=values, gamma=1.0, lam=1.0,
                                       norm_adv_by_std_in_grpo=True, scores=scores)
    except ValueError as err:  # an estimator that normalises within groups (or the batch) needs two rows
        assert int(torch.bincount(index).min()) == 1 and re.search(r"group|rows|samples", str(err)), (name, err)
        return
    for out in (adv, ret):
        assert out.shape == mask.shape and torch.isfinite(out).all(), (name, out)
    assert (adv[mask == 0] == 0).all(), name


@pytest.mark.parametrize("name", standard_estimators())
def test_estimator_refuses_a_mask_of_another_shape(name):
    from rlcourse.train import call_with_supported
    with pytest.raises(ValueError, match="shape|rows|mask"):
        call_with_supported(ESTIMATORS.get(name), token_level_rewards=torch.zeros(4, 3), response_mask=torch.ones(4, 2),
                            index=torch.tensor([0, 0, 1, 1]), values=torch.zeros(4, 3), gamma=1.0, lam=1.0,
                            norm_adv_by_std_in_grpo=True, scores=torch.zeros(4))


@pytest.mark.parametrize("name", standard_losses())
@SETTINGS
@given(data=rollouts(), shift=st.floats(-0.5, 0.5, allow_nan=False), mode=st.sampled_from(
    ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]))
def test_loss_is_finite_and_its_gradient_stays_on_the_mask(name, data, shift, mode):
    from rlcourse.train import call_policy_loss
    scores, mask, _, values = data
    old = -torch.rand(mask.shape, generator=torch.Generator().manual_seed(0)) * mask
    log_prob = (old + shift * values.tanh()).clone().requires_grad_(True)
    agg = dict(loss_agg_mode=mode, global_tokens=float(mask.sum()), global_seqs=float(mask.shape[0]),
               max_len=mask.shape[1])
    out = call_policy_loss(POLICY_LOSSES.get(name), agg, old_log_prob=old, log_prob=log_prob,
                           advantages=scores[:, None] * mask, response_mask=mask, clip_ratio_low=0.2,
                           clip_ratio_high=0.2, clip_ratio_c=3.0)
    loss = out[0] if isinstance(out, tuple) else out
    assert loss.ndim == 0 and torch.isfinite(loss), (name, loss)
    loss.backward()
    assert torch.isfinite(log_prob.grad).all() and (log_prob.grad[mask == 0] == 0).all(), name


@pytest.mark.parametrize("name", standard_losses())
def test_loss_refuses_a_mask_of_another_shape(name):
    from rlcourse.train import call_policy_loss
    agg = dict(loss_agg_mode="token-mean", global_tokens=6.0, global_seqs=2.0, max_len=3)
    with pytest.raises(ValueError, match="shape"):
        call_policy_loss(POLICY_LOSSES.get(name), agg, old_log_prob=torch.zeros(2, 3), log_prob=torch.zeros(2, 3),
                         advantages=torch.zeros(2, 3), response_mask=torch.ones(2, 2), clip_ratio_low=0.2,
                         clip_ratio_high=0.2, clip_ratio_c=3.0)

