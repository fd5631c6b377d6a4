"""Advantage estimators: a registry of pure functions from rewards to advantages.

Outcome estimators take the verl signature
``fn(token_level_rewards, response_mask, index, **options) -> (advantages, returns)``; the outcome
score of a row is the sum of its token-level rewards (the reward sits on the last valid token), and
its advantage is broadcast over the row's response tokens. Register a new estimator with
:func:`register_estimator`; the trainer finds it by name and passes only the options its signature
asks for (for example ``values`` for a critic, ``state`` for an estimator that keeps history).

====================== ====================================================== =====================
name                   advantage of row i in group g                          needs
====================== ====================================================== =====================
``reinforce``          :math:`r_i`                                            -
``reinforce_baseline`` :math:`r_i - \\bar r_{\\text{batch}}`                    -
``rloo``               :math:`r_i - \\frac{1}{G-1}\\sum_{j\\ne i} r_j`  G        >= 2
``grpo``               :math:`(r_i - \\bar r_g) / (\\mathrm{std}_g + \\epsilon)` G >= 2
``dr_grpo``            :math:`r_i - \\bar r_g`                                 G >= 2
``gae``                GAE(:math:`\\gamma, \\lambda`) with a critic             values
====================== ====================================================== =====================
"""
from __future__ import annotations

import torch

from .ops import as_index, check_finite, check_same_shape, group_stats
from .registry import Registry

ESTIMATORS: Registry = Registry("advantage estimator")
register_estimator = ESTIMATORS.register
get_estimator = ESTIMATORS.get


def outcome_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` outcome score of each row: its token-level rewards summed over the response mask."""
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    check_finite("token_level_rewards", token_level_rewards)
    return (token_level_rewards * response_mask).sum(-1)


def place_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Token-level rewards with each row's score on its last valid token (the EOS, if any).

    ============= ========= ========================================
    scores        ``(B,)``  one outcome reward per row
    response_mask ``(B,T)`` 1 up to and including EOS
    returns       ``(B,T)`` zeros except at the last valid position
    ============= ========= ========================================
    """
    if scores.ndim != 1 or scores.shape[0] != response_mask.shape[0]:
        raise ValueError(f"scores {tuple(scores.shape)} must be (B,) with B = {response_mask.shape[0]}")
    lengths = response_mask.sum(-1).long()
    if (lengths == 0).any():
        raise ValueError(f"rows {(lengths == 0).nonzero().flatten().tolist()} have an empty response mask")
    out = torch.zeros_like(response_mask, dtype=torch.float32)
    out[torch.arange(len(scores)), lengths - 1] = scores.float()
    return out


def _broadcast(per_row: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return per_row.unsqueeze(-1) * response_mask


@register_estimator("reinforce")
def compute_reinforce_advantage(token_level_rewards, response_mask, index=None):
    """REINFORCE without a baseline: the advantage is the outcome reward itself.

    =================== ========= ======================================
    token_level_rewards ``(B,T)`` reward on the last valid token
    response_mask       ``(B,T)`` 1 up to and including EOS
    returns                       ``(adv, ret)``, both ``(B,T)``; here equal
    =================== ========= ======================================
    """
    scores = outcome_scores(token_level_rewards, response_mask)
    adv = _broadcast(scores, response_mask)
    return adv, adv.clone()


@register_estimator("reinforce_baseline")
def compute_reinforce_baseline_advantage(token_level_rewards, response_mask, index=None):
    """REINFORCE with the batch-mean reward as baseline: :math:`A_i = r_i - \\frac1B\\sum_j r_j`.
    (The baseline includes :math:`r_i` itself, which biases the gradient by a factor
    :math:`1 - 1/B`; see the foundations chapter.) Returns ``(adv, ret)`` with ``ret`` the reward."""
    scores = outcome_scores(token_level_rewards, response_mask)
    return _broadcast(scores - scores.mean(), response_mask), _broadcast(scores, response_mask)


@register_estimator("rloo")
def compute_rloo_outcome_advantage(token_level_rewards, response_mask, index):
    """REINFORCE leave-one-out: each sample's baseline is the mean reward of the *other* samples of
    its prompt, :math:`A_i = r_i - \\frac{1}{G-1}\\sum_{j\\neq i} r_j = \\frac{G}{G-1}(r_i - \\bar r)`.

    =================== ========= ======================================
    token_level_rewards ``(B,T)`` reward on the last valid token
    response_mask       ``(B,T)`` 1 up to and including EOS
    index               ``(B,)``  group (prompt) id of each row; G >= 2
    returns                       ``(adv, ret)``, both ``(B,T)``; ``ret`` is the reward
    =================== ========= ======================================
    """
    scores = outcome_scores(token_level_rewards, response_mask)
    count, mean, _ = group_stats(scores, as_index(index, len(scores)), min_size=2)
    adv = (scores - mean) * count / (count - 1)
    return _broadcast(adv, response_mask), _broadcast(scores, response_mask)


@register_estimator("grpo")
def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon: float = 1e-6,
                                   norm_adv_by_std_in_grpo: bool = True):
    """GRPO's group-relative advantage: :math:`A_i = (r_i - \\bar r_g) / (\\mathrm{std}_g + \\epsilon)`,
    with the unbiased (Bessel) standard deviation of the group, as TRL and verl use. With
    ``norm_adv_by_std_in_grpo=False`` it is Dr. GRPO's :math:`A_i = r_i - \\bar r_g`.

    =================== ========= ======================================
    token_level_rewards ``(B,T)`` reward on the last valid token
    response_mask       ``(B,T)`` 1 up to and including EOS
    index               ``(B,)``  group (prompt) id of each row; G >= 2
    returns                       ``(adv, ret)``, both ``(B,T)``; ``ret`` is the reward
    =================== ========= ======================================
    """
    scores = outcome_scores(token_level_rewards, response_mask)
    _, mean, std = group_stats(scores, as_index(index, len(scores)), min_size=2)
    adv = scores - mean
    if norm_adv_by_std_in_grpo:
        adv = adv / (std + epsilon)
    return _broadcast(adv, response_mask), _broadcast(scores, response_mask)


@register_estimator("dr_grpo")
def compute_dr_grpo_outcome_advantage(token_level_rewards, response_mask, index):
    """Dr. GRPO: the group-mean baseline without division by the group's std."""
    return compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, norm_adv_by_std_in_grpo=False)


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma: float = 1.0, lam: float = 1.0):
    """Generalised advantage estimation over response tokens.

    :math:`\\delta_t = r_t + \\gamma V_{t+1} - V_t`, :math:`A_t = \\delta_t + \\gamma\\lambda A_{t+1}`,
    and returns :math:`R_t = A_t + V_t`. Masked positions (padding, or tool/observation tokens
    inside a response) are skipped: the next value and the running advantage are carried through
    them, as in verl. Past the last valid token the value is 0 (the episode ends at EOS).

    =================== ========= ==========================================
    token_level_rewards ``(B,T)`` rewards (outcome on the last valid token,
                                  optionally per-token KL penalties)
    values              ``(B,T)`` critic's V(s_t), s_t = prompt + y_<t
    response_mask       ``(B,T)`` 1 on tokens the policy generated
    returns                       ``(adv, ret)``, both ``(B,T)``, zero where masked
    =================== ========= ==========================================
    """
    check_same_shape(token_level_rewards=token_level_rewards, values=values, response_mask=response_mask)
    check_finite("token_level_rewards", token_level_rewards)
    check_finite("values", values)
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must be in [0, 1], got gamma={gamma}, lam={lam}")
    B, T = values.shape
    mask = response_mask.to(values.dtype)
    next_value = torch.zeros(B, dtype=values.dtype)
    last_gae = torch.zeros(B, dtype=values.dtype)
    advantages = torch.zeros_like(values)
    with torch.no_grad():
        for t in reversed(range(T)):
            delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
            gae = delta + gamma * lam * last_gae
            m = mask[:, t]
            # on a masked position, carry the running quantities through unchanged
            next_value = m * values[:, t] + (1 - m) * next_value
            last_gae = m * gae + (1 - m) * last_gae
            advantages[:, t] = gae * m
    returns = (advantages + values) * mask
    return advantages, returns


@register_estimator("gae")
def gae_estimator(token_level_rewards, response_mask, index=None, values=None, gamma: float = 1.0,
                  lam: float = 1.0):
    """Registry entry for :func:`compute_gae_advantage_return`; needs the critic's ``values``."""
    if values is None:
        raise ValueError("the 'gae' estimator needs values from a critic (use a value model)")
    return compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam)
