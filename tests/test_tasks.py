import pytest

from rlcourse.tasks import Addition, Countdown, Example, Score, Sort, get_task, task_names


@pytest.mark.parametrize("name", ["sort", "addition", "addition3", "countdown"])
def test_demonstrations_score_one_and_splits_are_disjoint(name):
    task = get_task(name)
    train, test = task.examples(200, seed=3), task.examples(50, seed=3, split="test")
    assert all(task.score(e.solution, e).reward == 1.0 for e in train + test)
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert task.examples(20, seed=3) == train[:20]  # deterministic for a seed
    assert task.examples(20, seed=4) != train[:20]


def test_addition_right_wrong_malformed():
    t = Addition()
    ex = Example("47+85=", "132", "231|132")
    assert t.score("231|132", ex) == Score(1.0, "correct")
    assert t.score("999|132", ex).reward == 1.0  # only the final answer is graded
    wrong = t.score("231|133", ex)
    assert wrong.reward == 0.0 and "wrong" in wrong.reason
    for bad in ["", "132", "231|", "231|1a2", "|||"]:
        s = t.score(bad, ex)
        assert s.reward == 0.0 and "malformed" in s.reason


def test_sort_right_wrong_malformed():
    t = Sort()
    ex = Example("sort 4179:", "1479", "1479")
    assert t.score("1479", ex).reward == 1.0
    assert t.score("1497", ex).reward == 0.0
    assert t.score("147", ex).reason.startswith("wrong")
    assert "malformed" in t.score("14x9", ex).reason


def test_countdown_accepts_any_correct_expression_and_rejects_reuse():
    t = Countdown()
    ex = Example("3 5 7>22:", "22", "3*5+7")
    assert t.score("7+3*5", ex).reward == 1.0  # another correct expression
    assert t.score("5*3+7", ex).reward == 1.0
    assert t.score("3*5+5", ex).reward == 0.0  # 5 used twice
    assert "not available" in t.score("3*5+5", ex).reason
    assert t.score("3+5+7", ex).reward == 0.0
    assert "malformed" in t.score("3*(5+7)", ex).reason
    assert "malformed" in t.score("", ex).reason
    assert "malformed" in t.score("3**5", ex).reason


def test_countdown_evaluates_with_precedence():
    from rlcourse.tasks import _safe_eval

    for expr in ["3*5+7", "7-3*2", "2*3*4-5", "9-8-1", "4"]:
        assert _safe_eval(expr) == eval(expr)


def test_unknown_task_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        get_task("nope")
    assert {"sort", "addition", "countdown"} <= set(task_names())
    with pytest.raises(ValueError, match="split"):
        get_task("sort").examples(3, split="dev")


def test_rewards_length_mismatch():
    t = get_task("sort")
    with pytest.raises(ValueError, match="2 completions but 1 examples"):
        t.rewards(["1", "2"], t.examples(1))


def test_reasoning_gym_adapter():
    pytest.importorskip("reasoning_gym")
    t = get_task("rg:chain_sum")
    train, test = t.examples(8, seed=0), t.examples(4, seed=0, split="test")
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    e = train[0]
    assert t.score(e.answer, e).reward == 1.0
    assert t.score("not a number", e).reward == 0.0
    assert t.score("", e).reward == 0.0
    with pytest.raises(ValueError, match="reasoning-gym could not create"):
        get_task("rg:no_such_generator").examples(2)


def test_held_out_prompts_are_distinct_and_disjoint_from_training():
    task = Addition()
    test = task.examples(256, seed=0, split="test")
    assert len({e.prompt for e in test}) == 256  # drawn with replacement, 256 held ~224 distinct
    train = task.examples(2000, seed=0, split="train")
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert task.examples(100, seed=0, split="test") == test[:100]  # a prefix: deterministic
    one_digit = Addition(digits=1)  # 100 prompts in all, about 10 of them held out
    with pytest.raises(ValueError, match="distinct test prompts"):
        one_digit.examples(60, split="test")


def test_held_out_splits_are_disjoint_and_keep_the_reported_prompts():
    from rlcourse.tasks import get_task, held_out_splits

    task = get_task("addition")
    report, choose = held_out_splits(task, 12, 10, seed=7)
    assert [e.prompt for e in report] == [e.prompt for e in task.examples(12, seed=7, split="test")]
    assert len(choose) == 10 and not {e.prompt for e in report} & {e.prompt for e in choose}
    with pytest.raises(ValueError, match="n_choose"):
        held_out_splits(task, 12, 0)
