"""Supervised training: fine-tuning on demonstrations (:func:`sft`) and a reward model on preference
pairs (:func:`train_reward_model`), with a registered reward-model loss: Bradley-Terry on the sequence
scores by default (``"bradley_terry"``), or a chapter's (TCRM's ``"tcrm"`` scores every position).

Both are short loops of their own, beside the RL trainer (:mod:`rlcourse.train`): SFT makes the
base models the RL chapters start from, and the reward model scores completions where no verifier
exists.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from tqdm import tqdm

from .lm.heads import ScalarHeadModel
from .lm.sampling import encode_prompts
from .lm.zoo import sft_loss
from .losses import bradley_terry_loss
from .ops import check_finite
from .registry import Registry
from .tasks import Example


def sft(model, tokenizer, examples: Sequence[Example], steps: int, batch_size: int = 32, lr: float | None = None,
        seed: int = 0, progress: bool = False, optimizer: torch.optim.Optimizer | None = None) -> list[float]:
    """Supervised fine-tuning on demonstrations (``example.solution``); returns the loss per step.

    A fresh AdamW at ``lr`` (default ``1e-3``), or ``optimizer``: continue with it (and its Adam
    moments), so that a run split into several calls (to evaluate between them) is one run; its
    learning rate is then the optimizer's, and passing ``lr`` as well is an error.
    """
    if not examples:
        raise ValueError("sft needs at least one example")
    if optimizer is not None and lr is not None:
        raise ValueError(f"sft got both lr={lr} and an optimizer: the optimizer's learning rate is the one used; "
                         "pass one of the two")
    gen = torch.Generator().manual_seed(seed)
    opt = optimizer if optimizer is not None else torch.optim.AdamW(
        model.parameters(), lr=1e-3 if lr is None else lr, weight_decay=0.0)
    losses = []
    model.train()
    for _ in tqdm(range(steps), desc="SFT", disable=not progress):
        rows = torch.randint(len(examples), (min(batch_size, len(examples)),), generator=gen).tolist()
        loss = sft_loss(model, tokenizer, [examples[i] for i in rows])
        check_finite("SFT loss", loss.detach())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    opt.zero_grad(set_to_none=True)  # leave no gradient behind for the next optimiser (an RL Trainer's first step)
    model.eval()
    return losses


@dataclass(frozen=True)
class PreferencePair:
    """A prompt with a preferred (``chosen``) and a dispreferred (``rejected``) completion."""

    prompt: str
    chosen: str
    rejected: str


def encode_pairs(tokenizer, prompts: Sequence[str], completions: Sequence[str]):
    """Left-padded ``(ids, mask)`` of prompt + completion + EOS, for scoring with a reward model."""
    texts = [p + c + tokenizer.eos_token for p, c in zip(prompts, completions)]
    return encode_prompts(tokenizer, texts)


def reward_model_scores(reward_model: ScalarHeadModel, tokenizer, prompts: Sequence[str],
                        completions: Sequence[str]) -> torch.Tensor:
    """``(N,)`` reward-model scores of completions (with gradient if the caller enables it)."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    ids, mask = encode_pairs(tokenizer, prompts, completions)
    return reward_model.sequence_reward(ids, mask)


REWARD_MODEL_LOSSES: Registry = Registry("reward-model loss")
register_reward_model_loss = REWARD_MODEL_LOSSES.register
get_reward_model_loss = REWARD_MODEL_LOSSES.get


@register_reward_model_loss("bradley_terry")
def bradley_terry_pair_loss(reward_model: ScalarHeadModel, tokenizer, pairs: Sequence[PreferencePair]):
    """Bradley-Terry on the sequence scores of a minibatch of pairs: ``(loss, {"accuracy"})``, the
    accuracy being the share of pairs whose chosen completion scores higher."""
    prompts = [p.prompt for p in pairs]
    r_c = reward_model_scores(reward_model, tokenizer, prompts, [p.chosen for p in pairs])
    r_r = reward_model_scores(reward_model, tokenizer, prompts, [p.rejected for p in pairs])
    return bradley_terry_loss(r_c, r_r), {"accuracy": float((r_c > r_r).float().mean())}


def train_reward_model(reward_model: ScalarHeadModel, tokenizer, pairs: Sequence, steps: int,
                       batch_size: int = 64, lr: float = 1e-3, seed: int = 0, progress: bool = False,
                       loss: str | Callable = "bradley_terry", loss_kwargs: dict | None = None) -> list[dict]:
    """Fit a reward model on preference pairs; returns per step the loss and what the loss reports.

    ``loss`` names a registered reward-model loss (or is one): a function ``(reward_model, tokenizer,
    minibatch of pairs, **loss_kwargs) -> (scalar loss, {name: float})``. The default,
    ``"bradley_terry"``, reads :class:`PreferencePair` s and reports the pair accuracy; another loss
    may read pairs of its own kind (TCRM's, :func:`rlcourse.methods.tcrm.tcrm_pair_loss`, reads
    ``(example, preferred, dispreferred)`` tuples and scores every position).
    """
    if not pairs:
        raise ValueError("train_reward_model needs at least one preference pair")
    loss_fn, kwargs = get_reward_model_loss(loss), dict(loss_kwargs or {})
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(reward_model.parameters(), lr=lr, weight_decay=0.0)
    log = []
    reward_model.train()
    for _ in tqdm(range(steps), desc="reward model", disable=not progress):
        rows = torch.randint(len(pairs), (min(batch_size, len(pairs)),), generator=gen).tolist()
        value, metrics = loss_fn(reward_model, tokenizer, [pairs[i] for i in rows], **kwargs)
        check_finite(f"reward-model loss {loss if isinstance(loss, str) else loss.__name__!r}", value.detach())
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()
        log.append({"loss": value.item(), **metrics})
    opt.zero_grad(set_to_none=True)  # leave no gradient behind for the next optimiser (e.g. a critic copied from it)
    reward_model.eval()
    return log
