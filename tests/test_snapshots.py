"""The lagged-snapshot helper shared by the GIPO bandit, the SORL lock, the multiturn sampler and the
checkpoint bank."""
import pytest
import torch

from rlcourse.snapshots import detached_copy, push_lagged


def test_push_lagged_returns_the_policy_lag_pushes_old():
    kept = []
    x = torch.zeros(3, requires_grad=True)
    seen = []
    for step in range(6):
        with torch.no_grad():
            x.fill_(step)
        seen.append(float(push_lagged(kept, x, 2)[0]))
    # before two pushes the oldest there is serves; then the policy of two pushes ago
    assert seen == [0, 0, 0, 1, 2, 3]
    assert len(kept) == 3 and not kept[0].requires_grad
    assert push_lagged([], x, 0) is not x and float(push_lagged([], x, 0)[0]) == 5.0


def test_detached_copy_of_module_state_dict_and_errors():
    lin = torch.nn.Linear(2, 2)
    sd = detached_copy(lin)
    assert set(sd) == {"weight", "bias"}
    with torch.no_grad():
        lin.weight.add_(1.0)
    assert not torch.equal(sd["weight"], lin.weight)  # a copy, not a view
    with pytest.raises(TypeError, match="list"):
        detached_copy([1, 2])
    with pytest.raises(ValueError, match="lag"):
        push_lagged([], torch.zeros(1), -1)
    with pytest.raises(TypeError, match="kept"):
        push_lagged((), torch.zeros(1), 1)
