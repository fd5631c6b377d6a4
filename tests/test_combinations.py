"""Any registered part of the loop combines with any other: one Trainer step per combination.

The five kinds of parts (samplers, prompt samplers, rewards, advantage estimators, policy losses) are
read from their registries after importing :mod:`rlcourse.methods`, so a part a chapter registers
joins this test without editing it. Each combination runs one step of :class:`~rlcourse.train.Trainer`
on the smoke ``addition`` base model. First each part runs alone (the other kinds at their
defaults): it may refuse the task, but only by a ValueError whose message names what is missing
(e.g. ``p_grpo`` on a task without preference groups). Then *every* combination of the parts that
ran alone (the full product of the registries, not a sample of it) must run. Any other exception,
and any non-finite metric, fails.

The rewards include ``test_combo_digits`` (registered below), which varies within groups even for an
untrained model, so the estimators see non-degenerate groups. A step of the smoke model takes about
25 ms on one thread, so the full product (162 combinations when this was written) takes seconds;
it grows as the product of the registries' sizes, and at 1,000 combinations would still take under
a minute.
"""
import copy
import itertools

import pytest
import torch

import rlcourse
from rlcourse.advantages import ESTIMATORS
from rlcourse.data import PROMPT_SAMPLERS
from rlcourse.lm.zoo import load_base_model
from rlcourse.profiles import one_torch_thread
from rlcourse.losses import POLICY_LOSSES
from rlcourse.rewards import REWARDS, register_reward
from rlcourse.rollout import SAMPLERS
from rlcourse.tasks import task_names
from rlcourse.train import RLConfig, Trainer


@register_reward("test_combo_digits", overwrite=True)
def digit_fraction(batch, examples, task, state):
    """Fraction of digits in each response: varies within a group even for an untrained model."""
    return torch.tensor([sum(c.isdigit() for c in t) / max(1, len(t)) for t in batch.texts])


KINDS = {"sampler": SAMPLERS, "prompt_sampler": PROMPT_SAMPLERS, "reward": REWARDS,
         "advantage_estimator": ESTIMATORS, "policy_loss": POLICY_LOSSES}


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():  # a tiny model: one thread is faster than two fighting over 2 cores
        yield


@pytest.fixture(scope="module")
def base():
    return load_base_model("addition", prof=rlcourse.profile("smoke"), progress=False)


DEFAULTS = {"sampler": "policy", "prompt_sampler": "uniform", "reward": "test_combo_digits",
            "advantage_estimator": "grpo", "policy_loss": "vanilla"}


def one_step(model, tok, row: dict):
    """One Trainer step of the combination ``row``: ``("ran", metrics)`` or ``("refused", message)``.
    Only a ValueError counts as a refusal; anything else propagates and fails the test."""
    # max_completion_length 4 is shorter than every addition demonstration (e.g. "231|132" + EOS),
    # so S-GRPO's injection widens the batch
    cfg = RLConfig(num_generations=4, prompts_per_step=2, max_completion_length=4, steps=1, progress=False,
                   train_pool_size=40, eval_prompts=4, learning_rate=1e-3, seed=0, **row)
    try:
        return "ran", Trainer(copy.deepcopy(model), tok, "addition", cfg).step()
    except ValueError as err:
        return "refused", str(err)


def check_ran(row, m):
    # NaN is documented only where a metric is undefined (e.g. explained variance of constant returns)
    bad = [k for k, v in m.items() if isinstance(v, float) and not torch.isfinite(torch.tensor(v))
           and k not in ("frac_zero_std_groups", "explained_variance")]
    assert not bad, (row, bad)


def test_every_registered_combination_runs_or_is_refused_by_name(base):
    """Two rounds. (1) Each part alone, the other kinds at their defaults: a part may refuse the
    addition task (a reward for another task, an estimator that needs preference groups), but only
    with a ValueError that names the requirement. (2) A pairwise cover of all the parts that ran:
    every combination in it must run."""
    model, tok = base
    options = {kind: reg.names() for kind, reg in KINDS.items()}
    assert "s_grpo" in options["sampler"] and "otb" in options["advantage_estimator"]  # chapters registered
    needs_task = {}
    for kind, names in options.items():
        for name in names:
            row = {**DEFAULTS, kind: name}
            outcome, out = one_step(model, tok, row)
            if outcome == "ran":
                check_ran(row, out)
                continue
            names_need = any(w in out for w in ("needs", "requires", "must", "no meta", *task_names()))
            assert name in out or names_need, f"{kind} {name!r} refused with no requirement named: {out}"
            needs_task[(kind, name)] = out
    p_grpo = needs_task.get(("advantage_estimator", "p_grpo"))
    assert p_grpo is not None and "preference group" in p_grpo  # the addition task has no preference groups
    usable = {kind: [n for n in names if (kind, n) not in needs_task] for kind, names in options.items()}
    assert all(usable.values()), usable
    rows = [dict(zip(usable, values)) for values in itertools.product(*usable.values())]
    assert len(rows) >= 162  # 3 samplers x 1 prompt sampler x 2 rewards x 9 estimators x 3 losses at least
    for row in rows:
        outcome, out = one_step(model, tok, row)
        assert outcome == "ran", f"{row}: parts that run alone refused together: {out}"
        check_ran(row, out)
