"""Any registered part of the loop combines with any other: one Trainer step per combination.

The five kinds of parts (samplers, prompt samplers, rewards, advantage estimators, policy losses) are
read from their registries after importing :mod:`rlcourse.methods` and :mod:`rlcourse.capstone`, and
the candidate tasks from the task registry, so a part or a task a chapter registers joins this test
without editing it. Each step
runs :class:`~rlcourse.train.Trainer` with the smoke ``addition`` base model (the tokenizer is one
character per token, so the model can answer any task's prompts, if badly).

Round 1: each part alone (the other kinds at their defaults) on every candidate task. It must run on
at least one of them, and it may refuse the others, but only by a ValueError whose message names the
missing requirement: an accepting task by name (e.g. ``drest`` on addition: "not a drest_choice
prompt") or, quoted, a ``meta`` key that the accepting tasks' examples carry and the refused task's
lack (e.g. ``p_grpo`` on addition: "no meta['pref_group']"). Round 2: the combinations the registry
allows are the elements of the full product of the registries whose parts all ran alone on one
common task; each runs on the first such task (``addition`` first). Any other exception, and any
non-finite metric, fails.

A part that refuses every task with the other kinds at their defaults may name, in its refusal, the
part of another kind it needs, as ``kind='name'`` (the ``replay`` sampler with PER weights:
"use policy_loss='ppo_is'"). Round 1 then runs it with that part, and tries it with every part of
that kind; the ones it refuses (by a ValueError) are left out of round 2's combinations.

Round 2 runs a pairwise covering set of those combinations, not all of them: every pair of parts
(and every part with the task it runs on) that occurs together in an allowed combination occurs in
at least one combination that runs. The parts meet through the batch they pass on (a sampler's
extras reach the loss that names them, a reward's scores reach the estimator), so a failure to
combine shows up between two parts; the full product grew from 612 combinations to about 3,000 as
Part III added samplers and losses, and took half an hour of CI's time on a slow machine, while the
covering set stays near the product of the two largest registries. Set
``RLCOURSE_ALL_COMBINATIONS=1`` to run the full product instead.

The rewards include ``test_combo_digits`` (registered below), which varies within groups even for an
untrained model, so the estimators see non-degenerate groups. A reward that is constant on this
model's answers (the DReST rewards on its malformed choices) gives zero advantages, so
``skip_zero_advantage_rows`` is off: otherwise no row of such a step would reach the policy loss, and
the combination would pass without running it. A step of the smoke model takes about 20 ms on one
thread on an idle machine.
"""
import copy
import inspect
import itertools
import os
import re

import pytest
import torch

import rlcourse
import rlcourse.capstone  # noqa: F401 - registers the capstone's parts (the "tis" loss, its sampler), so
#   they are tested whichever test file imported them first
from rlcourse.advantages import ESTIMATORS
from rlcourse.data import PROMPT_SAMPLERS
from rlcourse.lm.zoo import load_base_model
from rlcourse.profiles import one_torch_thread
from rlcourse.losses import POLICY_LOSSES
from rlcourse.rewards import REWARDS, register_reward
from rlcourse.rollout import SAMPLERS, register_sampler
from rlcourse.tasks import get_task, task_names
from rlcourse.train import LOSS_ARGUMENTS, RLConfig, Trainer, bind_reward, call_policy_loss, call_with_supported


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


@pytest.fixture(scope="module")
def pools():
    """Every candidate task (the base model's own, ``addition``, first) -> its (train, eval) examples,
    drawn once instead of once per step."""
    names = ["addition"] + [t for t in task_names() if t != "addition"]
    return {t: (get_task(t).examples(40, seed=0, split="train"), get_task(t).examples(4, seed=0, split="test"))
            for t in names}


DEFAULTS = {"sampler": "policy", "prompt_sampler": "uniform", "reward": "test_combo_digits",
            "advantage_estimator": "grpo", "policy_loss": "vanilla"}


def one_step(model, tok, task: str, pool, row: dict):
    """One Trainer step of the combination ``row`` on ``task``: ``("ran", metrics)`` or
    ``("refused", message)``. Only a ValueError counts as a refusal; anything else propagates and
    fails the test."""
    # max_completion_length 4 is shorter than every addition demonstration (e.g. "231|132" + EOS),
    # so S-GRPO's injection widens the batch
    cfg = RLConfig(num_generations=4, prompts_per_step=2, max_completion_length=4, steps=1, progress=False,
                   learning_rate=1e-3, seed=0, skip_zero_advantage_rows=False, **row)
    train, held = pool
    try:
        return "ran", Trainer(copy.deepcopy(model), tok, task, cfg, train_examples=train, eval_examples=held).step()
    except ValueError as err:
        return "refused", str(err)


def check_ran(row, m):
    # NaN is documented only where a metric is undefined (e.g. explained variance of constant returns)
    bad = [k for k, v in m.items() if isinstance(v, float) and not torch.isfinite(torch.tensor(v))
           and k not in ("frac_zero_std_groups", "explained_variance")]
    assert not bad, (row, bad)


def meta_keys(examples) -> set:
    """Every ``meta`` key the examples carry."""
    return {key for e in examples for key in e.meta}


def names_requirement(message: str, accepting: list[str], missing_keys: set) -> bool:
    """Whether a refusal names what the refused task lacks: one of the ``accepting`` tasks as a word,
    or one of ``missing_keys`` quoted as Python quotes it (``'pref_group'``), so that a bare word
    such as "needs" or "must", or a one-letter key found inside another word, does not count."""
    return any(re.search(rf"(?<![\w-]){re.escape(t)}(?![\w-])", message) for t in accepting) or \
        any(repr(key) in message for key in missing_keys)


def pairs_of(combo: tuple) -> set:
    """Every unordered pair of the (kind, name) items of ``combo``."""
    return set(itertools.combinations(combo, 2))


def pairwise_cover(combos: list[tuple]) -> list[tuple]:
    """A subset of ``combos`` in which every pair of items that occurs together in some combo occurs
    together in a chosen one: greedily, the combo covering most pairs not yet covered, the first in
    ``combos`` order on a tie (deterministic). Each combo is a tuple of hashable items.

    Greedy covering is within a factor ln(#pairs) of the smallest cover; for pairs it is close to
    the product of the two largest kinds' sizes."""
    uncovered = set().union(*(pairs_of(c) for c in combos)) if combos else set()
    chosen, candidates = [], [(c, pairs_of(c)) for c in combos]
    while uncovered:
        best, gain = None, 0
        for combo, pairs in candidates:
            g = len(pairs & uncovered)
            if g > gain:
                best, gain = (combo, pairs), g
        chosen.append(best[0])
        uncovered -= best[1]
    return chosen


def test_pairwise_cover_covers_every_pair_and_is_small():
    full = [tuple(zip("abc", v)) for v in itertools.product(range(4), range(3), range(2))]
    allowed = [c for c in full if not (c[0][1] == 0 and c[1][1] == 0)]  # a constraint, as tasks impose
    cover = pairwise_cover(allowed)
    assert set(cover) <= set(allowed)
    assert set().union(*map(pairs_of, cover)) == set().union(*map(pairs_of, allowed))
    assert len(cover) < len(allowed) and len(cover) >= 4 * 3 - 1  # at least the allowed (a, b) pairs
    assert pairwise_cover([]) == []


def test_names_requirement_rejects_vague_refusals():
    assert names_requirement("not a drest_choice prompt: '50+60='", ["drest_choice"], set())
    assert names_requirement("example '1+1=' has no meta['pref_group']", ["pg2_prefsort"], {"pref_group"})
    assert not names_requirement("this estimator needs something it must have", ["pg2_prefsort"], {"pref_group"})
    assert not names_requirement("a pref_group-free batch", ["pg2_prefsort"], {"pref_group"})  # not quoted
    assert not names_requirement("not a drest_choice2 prompt", ["drest_choice"], set())
    assert not names_requirement("a bad answer", ["sort"], {"a"})  # key 'a' only quoted


def test_every_registered_combination_runs_or_is_refused_by_name(base, pools):
    """Round 1: each part alone on every candidate task; it must run on one, and a refusal must name
    the requirement. Round 2: a pairwise covering set of the combinations whose parts all ran alone
    on one common task runs there (the full product with ``RLCOURSE_ALL_COMBINATIONS=1``)."""
    model, tok = base
    options = {kind: reg.names() for kind, reg in KINDS.items()}
    assert "s_grpo" in options["sampler"] and "otb" in options["advantage_estimator"]  # chapters registered
    accepts: dict[tuple, list[str]] = {}  # (kind, name) -> the tasks it ran on, in candidate order
    needs: dict[tuple, str] = {}  # (kind, name) -> the kind of the part it named as needed
    partners: dict[tuple, set] = {}  # (kind, name) -> the parts of that kind it runs with
    refusals: dict[tuple, dict[str, str]] = {}  # (kind, name) -> {refused task: message}

    def on_every_task(part, row):
        for task, pool in pools.items():
            outcome, out = one_step(model, tok, task, pool, row)
            if outcome == "ran":
                check_ran((task, row), out)
                accepts[part].append(task)
            else:
                refusals[part][task] = out

    for kind, names in options.items():
        for name in names:
            row, part = {**DEFAULTS, kind: name}, (kind, name)
            accepts[part], refusals[part] = [], {}
            on_every_task(part, row)
            needed = {} if accepts[part] else companion(refusals[part], options, row, kind)
            if needed:  # it refused every task, naming the part of another kind it needs
                on_every_task(part, {**row, **needed})
                needs[part] = next(iter(needed))
            assert accepts[part], f"{kind} {name!r} refused every registered task: {refusals[part]}"
    for part, other in needs.items():  # which parts of the named kind it combines with
        task = accepts[part][0]
        partners[part] = {n for n in options[other]
                          if one_step(model, tok, task, pools[task], {**DEFAULTS, part[0]: part[1], other: n})[0] == "ran"}
        assert partners[part], part
    for part, refused in refusals.items():
        offered = set().union(*(meta_keys(pools[t][0]) for t in accepts[part]))
        for task, message in refused.items():
            if task in accepts[part]:
                continue  # refused with the defaults, ran with the part it named
            missing = offered - meta_keys(pools[task][0])
            assert names_requirement(message, accepts[part], missing), \
                f"{part} refused {task!r} without naming a task it runs on {accepts[part]} or a missing " \
                f"meta key {sorted(missing)}: {message}"
    # the parts that prompted this round: none of them runs on addition, each on the task it is for
    assert "pref_group" in refusals[("advantage_estimator", "p_grpo")]["addition"]
    for part in (("advantage_estimator", "p_grpo"), ("advantage_estimator", "p_grpo_logged"), ("reward", "pg2_pref")):
        assert "pg2_prefsort" in accepts[part] and "addition" not in accepts[part], (part, accepts[part])
    for name in ("drest", "drest_default"):
        assert accepts[("reward", name)] == ["drest_choice"], accepts[("reward", name)]

    allowed = []  # (task, combination) for every combination some task accepts, on its first such task
    for values in itertools.product(*options.values()):
        row = dict(zip(options, values))
        common = [t for t in pools if all(t in accepts[(kind, name)] for kind, name in row.items())]
        if any(row[needs[(kind, name)]] not in partners[(kind, name)]
               for kind, name in row.items() if (kind, name) in needs):
            continue  # e.g. the replay sampler with PER weights and a loss that does not take them
        if common:  # not, e.g., a DReST reward with P-GRPO: no task has both a menu and preference groups
            allowed.append((("task", common[0]),) + tuple(row.items()))
    # 4 samplers x 3 losses x 51 (reward, estimator) pairs when the registries were first counted
    assert len(allowed) >= 612, len(allowed)
    chosen = allowed if os.environ.get("RLCOURSE_ALL_COMBINATIONS") == "1" else pairwise_cover(allowed)
    ran = {}
    for combo in chosen:
        (_, task), row = combo[0], dict(combo[1:])
        outcome, out = one_step(model, tok, task, pools[task], row)
        assert outcome == "ran", f"{row} on {task!r}: parts that run alone refused together: {out}"
        check_ran((task, row), out)
        ran[task] = ran.get(task, 0) + 1
    # every part ran in round 2 on every task it accepts in some allowed combination
    seen = {(kind, name, task) for combo in chosen for kind, name in combo[1:] for task in [combo[0][1]]}
    wanted = {(kind, name, c[0][1]) for c in allowed for kind, name in c[1:]}
    assert seen == wanted, sorted(wanted - seen)[:5]


def companion(refusals: dict[str, str], options: dict[str, list[str]], row: dict, kind: str) -> dict:
    """The part of another kind that a refusal of ``row`` names as ``kind='name'`` (the first such
    that differs from the row's, over the refusals in task order), as a config row fragment; an
    empty dict if none names one."""
    for message in refusals.values():
        for other, name in re.findall(r"(\w+)='([\w-]+)'", message):
            if other in options and other != kind and name in options[other] and row.get(other) != name:
                return {other: name}
    return {}


def test_companion_reads_a_named_part():
    options = {"sampler": ["policy", "replay"], "policy_loss": ["vanilla", "ppo_is"]}
    row = {"sampler": "replay", "policy_loss": "vanilla"}
    message = "policy_loss='vanilla' does not take them: use policy_loss='ppo_is', or beta=0"
    assert companion({"addition": message}, options, row, "sampler") == {"policy_loss": "ppo_is"}
    assert companion({"addition": "use policy_loss='nope'"}, options, row, "sampler") == {}
    assert companion({"addition": "sampler='policy'"}, options, row, "sampler") == {}  # its own kind


def loop_keywords(model, tok, pool) -> dict:
    """What the loop passes each kind of part in one Trainer step, recorded by parts that take
    everything they are offered and hand the work to the default part: ``{kind: keywords}`` (for the
    reward, ``{"context": ..., "args": (batch, examples, task, state)}``). The step uses ``dr_grpo``'s
    aggregation, the one that also passes ``max_len``."""
    seen = {}

    def prompt_sampler(**kw):
        seen["prompt_sampler"] = dict(kw)
        return call_with_supported(PROMPT_SAMPLERS.get("uniform"), **kw)

    def sampler(**kw):
        seen["sampler"] = dict(kw)
        return call_with_supported(SAMPLERS.get("policy"), **kw)

    def reward(batch, examples, task, state, model, tokenizer, ref_model, step):
        seen["reward"] = {"context": dict(model=model, tokenizer=tokenizer, ref_model=ref_model, step=step),
                          "args": (batch, examples, task, state)}
        return digit_fraction(batch, examples, task, state)

    def estimator(**kw):
        seen["advantage_estimator"] = dict(kw)
        return call_with_supported(ESTIMATORS.get("grpo"), **kw)

    def loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c,
             loss_agg_mode, global_tokens, global_seqs, max_len):
        kw = dict(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask,
                  clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
                  loss_agg_mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, max_len=max_len)
        seen["policy_loss"] = {k: (v.detach() if torch.is_tensor(v) else v) for k, v in kw.items()}
        return POLICY_LOSSES.get("vanilla")(**kw)

    assert set(inspect.signature(loss).parameters) == LOSS_ARGUMENTS  # every argument the loop passes a loss
    cfg = RLConfig(num_generations=4, prompts_per_step=2, max_completion_length=4, steps=1, progress=False, seed=0,
                   skip_zero_advantage_rows=False, loss_type="dr_grpo", beta=0.01, prompt_sampler=prompt_sampler,
                   sampler=sampler, reward=reward, advantage_estimator=estimator, policy_loss=loss)
    Trainer(copy.deepcopy(model), tok, "addition", cfg, train_examples=pool[0], eval_examples=pool[1]).step()
    assert set(seen) == set(KINDS), sorted(seen)
    return seen


def call_as_the_loop_does(kind: str, fn, seen: dict, model):
    """Call the registered part ``fn`` of ``kind`` with the keywords the loop passed in ``seen``, the
    way the trainer calls that kind (fresh ``state``, a copy of the model)."""
    kw = dict(seen[kind]) if kind != "reward" else None
    if kind in ("prompt_sampler", "sampler", "advantage_estimator"):
        kw["state"] = {}
        if "model" in kw:
            kw["model"] = copy.deepcopy(model)
        return call_with_supported(fn, **kw)
    if kind == "reward":
        batch, examples, task, _ = seen["reward"]["args"]
        return bind_reward(fn, {}, **seen["reward"]["context"])(batch, examples, task, {})
    agg_keys = ("loss_agg_mode", "global_tokens", "global_seqs", "max_len")
    agg = {k: kw.pop(k) for k in agg_keys}
    kw["log_prob"] = kw["log_prob"].clone().requires_grad_(True)
    return call_policy_loss(fn, agg, **kw)


def test_every_registered_part_takes_the_loops_full_keyword_set(base, pools):
    """Every part of every registry, called with everything the loop passes its kind (recorded from
    a Trainer step), the way the trainer calls it: it runs, or refuses the data by a ValueError (a
    part for another task, or one that needs another part's extras); any other exception (a
    TypeError from a keyword it cannot take) fails. A part whose signature has ``**kwargs`` claims to
    take any keyword, so it is also called with all of them at once."""
    model, tok = base
    seen = loop_keywords(model, tok, pools["addition"])
    assert {"clip_ratio_low", "max_len", "global_tokens"} <= set(seen["policy_loss"])
    ran = {kind: [] for kind in KINDS}
    for kind, reg in KINDS.items():
        for name in reg.names():
            fn = reg.get(name)
            try:
                call_as_the_loop_does(kind, fn, seen, model)
                ran[kind].append(name)
            except ValueError:
                pass
            except Exception as err:  # noqa: BLE001 (the point: any other error names the part)
                pytest.fail(f"{kind} {name!r} called with the loop's keywords raised {type(err).__name__}: {err}")
            params = inspect.signature(fn).parameters.values()
            if kind != "reward" and any(p.kind is p.VAR_KEYWORD for p in params):
                everything = {k: v for k, v in seen[kind].items()}
                if kind == "policy_loss":
                    everything["log_prob"] = everything["log_prob"].clone().requires_grad_(True)
                try:
                    fn(**everything)
                except ValueError:
                    pass
                except TypeError as err:
                    pytest.fail(f"{kind} {name!r} takes **kwargs but not every keyword the loop passes: {err}")
    # the defaults and most parts ran on addition's data (not a test that passes by refusing everything)
    assert {"vanilla", "pg", "gipo", "ppo_is", "sorl"} <= set(ran["policy_loss"]), ran["policy_loss"]
    assert {"policy", "pipo"} <= set(ran["sampler"]) and "grpo" in ran["advantage_estimator"], ran
    assert "task" in ran["reward"] and "uniform" in ran["prompt_sampler"], ran


@register_sampler("test_combo_knob", overwrite=True)
def knob_sampler(model, tokenizer, prompts, config, generator, state, knob: int = 0):
    """The policy sampler, recording its ``knob`` in ``state["knob"]``."""
    state["knob"] = knob
    return SAMPLERS.get("policy")(model=model, tokenizer=tokenizer, prompts=prompts, config=config,
                                  generator=generator, state=state)


def test_wrapper_samplers_configure_their_base(base, pools):
    """Every sampler that wraps a ``base`` sampler takes ``base_kwargs`` for it: the keyword reaches
    the base, and a keyword the base does not take is a ValueError naming it."""
    model, tok = base
    wrappers = [n for n in SAMPLERS.names() if "base" in inspect.signature(SAMPLERS.get(n)).parameters]
    assert {"replay", "pipo"} <= set(wrappers), wrappers
    for name in wrappers:
        assert "base_kwargs" in inspect.signature(SAMPLERS.get(name)).parameters, name
        row = dict(sampler=name, reward="test_combo_digits", policy_loss="ppo_is" if name == "replay" else "vanilla")
        cfg = RLConfig(num_generations=4, prompts_per_step=2, max_completion_length=4, steps=1, progress=False, seed=0,
                       sampler_kwargs={"base": "test_combo_knob", "base_kwargs": {"knob": 7}}, **row)
        tr = Trainer(copy.deepcopy(model), tok, "addition", cfg, train_examples=pools["addition"][0],
                     eval_examples=pools["addition"][1])
        tr.step()
        assert tr.state["knob"] == 7, name
        tr.config.sampler_kwargs["base_kwargs"] = {"knbo": 7}
        with pytest.raises(ValueError, match="base_kwargs.*knbo"):
            tr.step()
        tr.config.sampler_kwargs["base_kwargs"] = {"step": 7}
        with pytest.raises(ValueError, match="given by the loop"):
            tr.step()
