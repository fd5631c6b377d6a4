"""The shared behaviour-IS loss: one implementation behind the ``cuts_is`` and ``r2po`` names."""
import inspect

import pytest
import torch

from rlcourse.losses import POLICY_LOSSES, compute_policy_loss
from rlcourse.methods.behaviour_is import behaviour_is_alias, behaviour_weights, compute_behaviour_is_loss
from rlcourse.methods.cuts import compute_cuts_is_loss
from rlcourse.methods.r2po import compute_r2po_loss


def _inputs(seed=0, B=6, T=5):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 2
    beh = old - torch.rand(B, T, generator=g) * 2 + 0.5
    new = (old + 0.1 * torch.randn(B, T, generator=g)).requires_grad_()
    adv = torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    return old, new, adv, mask, beh


def test_both_chapter_names_are_the_shared_loss():
    assert POLICY_LOSSES.get("behaviour_is") is compute_behaviour_is_loss
    assert POLICY_LOSSES.get("r2po") is compute_behaviour_is_loss is compute_r2po_loss
    assert POLICY_LOSSES.get("cuts_is") is compute_cuts_is_loss
    assert inspect.signature(compute_cuts_is_loss).parameters["is_cap"].default == 2.0
    old, new, adv, mask, beh = _inputs()
    a, ma = compute_cuts_is_loss(old, new, adv, mask, behaviour_logprob=beh)
    b, mb = compute_behaviour_is_loss(old, new, adv, mask, behaviour_logprob=beh, is_cap=2.0)
    torch.testing.assert_close(a, b)
    assert ma == mb and ma["behaviour_is_weight_max"] <= 2.0 + 1e-6
    uncapped, mu = compute_behaviour_is_loss(old, new, adv, mask, behaviour_logprob=beh)
    assert mu["behaviour_is_weight_max"] > 2.0 and not torch.allclose(uncapped, a)  # the cap does something here


def test_weights_are_the_ratio_and_the_loss_is_vanilla_with_weighted_advantages():
    old, new, adv, mask, beh = _inputs(1)
    w = behaviour_weights(old, beh, mask)
    torch.testing.assert_close(w, torch.exp((old - beh) * mask))
    loss, _ = compute_behaviour_is_loss(old, new, adv, mask, behaviour_logprob=beh)
    torch.testing.assert_close(loss, compute_policy_loss(old, new, adv * w, mask)[0])
    ws = behaviour_weights(old, beh, mask, is_level="sequence")
    torch.testing.assert_close(ws, torch.exp(((old - beh) * mask).sum(-1, keepdim=True)).expand_as(ws))
    torch.testing.assert_close(compute_behaviour_is_loss(old, new, adv, mask)[0], compute_policy_loss(old, new, adv, mask)[0])


def test_bad_input_is_refused():
    old, new, adv, mask, beh = _inputs(2)
    with pytest.raises(ValueError, match="is_cap"):
        compute_behaviour_is_loss(old, new, adv, mask, behaviour_logprob=beh, is_cap=0.0)
    with pytest.raises(ValueError, match="is_cap"):
        compute_cuts_is_loss(old, new, adv, mask, is_cap=-1.0)
    with pytest.raises(ValueError, match="is_level"):
        compute_behaviour_is_loss(old, new, adv, mask, behaviour_logprob=beh, is_level="row")
    with pytest.raises(ValueError, match="behaviour_logprob"):
        compute_behaviour_is_loss(old, new, adv, mask, behaviour_logprob=beh[:, :2])
    with pytest.raises(ValueError, match="no parameter"):
        behaviour_is_alias("never_registered", cap=2.0)
