"""How far the sampler's log-probs are from the trainer's, for the same weights and tokens.

The sampler decodes one token at a time with a KV cache; the trainer scores the whole sequence in
one forward pass. In float32 the two agree to rounding; in bfloat16 they do not, and the PPO ratio
``pi_train / pi_sample`` of a batch that has not been updated yet is then not 1.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from ..lm.model import response_logprobs
from ..lm.sampling import sample
from .tis import tis_weights


@torch.no_grad()
def logprob_mismatch(model, tokenizer, prompts: Sequence[str], num_generations: int = 4, max_new_tokens: int = 16,
                     temperature: float = 1.0, epsilon: float = 0.2, seed: int = 0, tis_cap: float = 2.0) -> dict:
    """Sample from ``model``, rescore the same tokens with the training forward, and compare.

    Returns, over the response tokens: ``mean_abs`` and ``max_abs``, the mean and largest
    ``|log pi_train - log pi_sample|``; ``outside_clip``, the share of tokens whose ratio
    ``exp(log pi_train - log pi_sample)`` leaves ``[1 - epsilon, 1 + epsilon]`` (PPO would clip them
    before any update); ``tis_weight_mean``, the mean weight truncated importance sampling gives a
    token, ``min(exp(log pi_train - log pi_sample), tis_cap)`` (:func:`~rlcourse.capstone.tis.tis_weights`),
    and ``tis_capped``, the share of tokens whose weight the cap cuts; ``tokens``, how many were compared.
    """
    if not prompts:
        raise ValueError("logprob_mismatch needs at least one prompt")
    if epsilon <= 0:
        raise ValueError(f"epsilon must be positive, got {epsilon}")
    gen = torch.Generator().manual_seed(seed)
    batch = sample(model, tokenizer, list(prompts), num_generations=num_generations, max_new_tokens=max_new_tokens,
                   temperature=temperature, generator=gen)
    train = response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_len, batch.temperature)
    keep = batch.response_mask.bool()
    gap = (train - batch.logprobs)[keep].double()
    weights = tis_weights(train[keep], batch.logprobs[keep], tis_cap)
    return {"mean_abs": float(gap.abs().mean()), "max_abs": float(gap.abs().max()),
            "outside_clip": float(((gap.exp() - 1).abs() > epsilon).double().mean()),
            "tis_weight_mean": float(weights.double().mean()),
            "tis_capped": float((gap > math.log(tis_cap)).double().mean()),
            "tokens": int(keep.sum())}
