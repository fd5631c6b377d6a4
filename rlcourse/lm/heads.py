"""Scalar heads on the tiny model's trunk: a critic (one value per token) and a reward model."""
from __future__ import annotations

import copy

import torch
from torch import nn

from .model import position_ids_from_mask


class ScalarHeadModel(nn.Module):
    """A copy of a causal LM's transformer trunk with a linear head producing one scalar per position.

    Built from a policy (``ScalarHeadModel.from_policy(model)``) so that the critic or reward model
    starts from the same features; the head starts at zero, so initial outputs are 0.
    """

    def __init__(self, trunk: nn.Module, hidden_size: int):
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_policy(cls, policy: nn.Module) -> "ScalarHeadModel":
        trunk = copy.deepcopy(policy.model if hasattr(policy, "model") else policy)
        return cls(trunk, policy.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``(B, L)`` ids and mask -> ``(B, L)`` float32 scalars."""
        hidden = self.trunk(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids_from_mask(attention_mask)).last_hidden_state
        return self.head(hidden).squeeze(-1).float()

    def response_values(self, input_ids, attention_mask, response_len: int) -> torch.Tensor:
        """Critic values :math:`V(s_t)` for the ``T`` response tokens: the scalar at the position
        *before* each token, so value ``t`` is read with the same slice as the log-probs.

        ============== =========== ==============================
        input_ids      ``(B,P+T)`` prompt then response
        returns        ``(B,T)``   V(prompt, y_<t)
        ============== =========== ==============================
        """
        return self(input_ids, attention_mask)[:, -response_len - 1:-1]

    def sequence_reward(self, input_ids, attention_mask) -> torch.Tensor:
        """Reward-model score: the scalar at each row's last real token, ``(B,)``. Rows must be
        left-padded or right-padded consistently with ``attention_mask``."""
        scalars = self(input_ids, attention_mask)
        last = attention_mask.long().cumsum(-1).argmax(-1)  # index of the last 1 in each row
        return scalars[torch.arange(len(scalars)), last]
