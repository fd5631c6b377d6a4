"""Multi-turn episodes: a language model plays a text environment, turn by turn, and the whole
episode becomes one row of a rollout batch.

Each row is ``[prompt | agent turn 1 | env reply 1 | agent turn 2 | env reply 2 | ...]``. The
environment's tokens are in the sequence (the model reads them) but not in the loss:

================== ========= =================================================================
response_mask      ``(B,T)`` 1 on the agent's tokens (each turn up to and including its EOS), 0 on
                             the environment's replies and on padding
attention          ``(B,T)`` 1 on every real token, the agent's and the environment's
turn_index         ``(B,T)`` long, the turn each token belongs to (an environment reply belongs to
                             the turn it answers); -1 on padding
logprobs, entropy  ``(B,T)`` recorded while sampling, on the agent's tokens; 0 elsewhere
rewards            ``(B,)``  the episode's return
================== ========= =================================================================

Turns are sampled with :func:`rlcourse.lm.sample` on the text of the episode so far, so the log-probs
it records are those of the model on exactly the tokens the training forward pass will see; the
tokenizer must therefore encode the concatenated text as the concatenation of the parts (the book's
character tokenizer does; :func:`check_concatenation` refuses a tokenizer that does not).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .lm.sampling import sample


@dataclass
class Episodes:
    """The output of :func:`play_episodes` (shapes in the module docstring); ``B = len(prompts)``."""

    prompts: list[str]
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    attention: torch.Tensor
    turn_index: torch.Tensor
    logprobs: torch.Tensor
    entropy: torch.Tensor
    rewards: torch.Tensor
    turns: torch.Tensor  # (B,) number of agent turns
    reasons: list[str] = field(default_factory=list)
    transcripts: list[str] = field(default_factory=list)
    temperature: float = 1.0


def check_concatenation(tokenizer, parts: Sequence[str]) -> list[int]:
    """The ids of ``"".join(parts)``; raises if they differ from the parts' ids concatenated."""
    whole = tokenizer("".join(parts), add_special_tokens=False)["input_ids"]
    joined = [i for p in parts if p for i in tokenizer(p, add_special_tokens=False)["input_ids"]]
    if whole != joined:
        raise ValueError("the tokenizer does not encode the episode's text as the concatenation of its turns "
                         f"(parts {list(parts)!r}); multi-turn sampling re-encodes text and needs a tokenizer "
                         "that splits at turn boundaries, such as rlcourse.lm.build_tokenizer()")
    return whole


def play_episodes(model, tokenizer, envs: Sequence, reset_kwargs: Sequence[dict], *, max_turns: int,
                  tokens_per_turn: int = 2, temperature: float = 1.0,
                  generator: torch.Generator | None = None) -> Episodes:
    """Run one episode in each of ``envs`` (reset with ``reset_kwargs[i]``) with ``model`` as the agent.

    Every turn, the rows still running are sampled together (one batch), the environment answers
    each turn, and the episode ends when the environment says so or after ``max_turns`` turns. A
    turn that is not valid text for the environment is the environment's to judge (it ends the
    episode with its own reason); an environment reply that the tokenizer cannot represent raises.
    """
    if len(envs) != len(reset_kwargs):
        raise ValueError(f"{len(envs)} environments but {len(reset_kwargs)} reset argument sets")
    if max_turns < 1 or tokens_per_turn < 1:
        raise ValueError(f"need max_turns >= 1 and tokens_per_turn >= 1, got {max_turns}, {tokens_per_turn}")
    eos = tokenizer.eos_token
    unk = getattr(tokenizer, "unk_token_id", None)
    B = len(envs)
    prompts, texts, infos = [], [], []
    for env, kw in zip(envs, reset_kwargs):
        obs, info = env.reset(**kw)
        prompts.append(obs)
        texts.append([obs])
        infos.append(info)
    ids: list[list[int]] = [[] for _ in range(B)]
    mask: list[list[float]] = [[] for _ in range(B)]
    turn: list[list[int]] = [[] for _ in range(B)]
    logp: list[list[float]] = [[] for _ in range(B)]
    ent: list[list[float]] = [[] for _ in range(B)]
    rewards = torch.zeros(B)
    turns = torch.zeros(B, dtype=torch.long)
    reasons = [""] * B
    running = list(range(B))
    for k in range(max_turns):
        if not running:
            break
        batch = sample(model, tokenizer, ["".join(texts[i]) for i in running], num_generations=1,
                       max_new_tokens=tokens_per_turn, temperature=temperature, generator=generator)
        still = []
        for j, i in enumerate(running):
            keep = batch.response_mask[j] == 1
            turn_ids = batch.response_ids[j][keep].tolist()
            turn_text = tokenizer.decode(turn_ids, skip_special_tokens=False)
            ids[i] += turn_ids
            mask[i] += [1.0] * len(turn_ids)
            turn[i] += [k] * len(turn_ids)
            logp[i] += batch.logprobs[j][keep].tolist()
            ent[i] += batch.entropy[j][keep].tolist()
            turns[i] = k + 1
            reply, reward, terminated, truncated, info = envs[i].step(turn_text)
            rewards[i] += float(reward)
            texts[i].append(turn_text)
            if reply:
                reply_ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
                if unk is not None and unk in reply_ids:
                    raise ValueError(f"environment {type(envs[i]).__name__} replied {reply!r}, which the tokenizer "
                                     "cannot represent (it maps part of it to <unk>)")
                ids[i] += reply_ids
                mask[i] += [0.0] * len(reply_ids)
                turn[i] += [k] * len(reply_ids)
                logp[i] += [0.0] * len(reply_ids)
                ent[i] += [0.0] * len(reply_ids)
                texts[i].append(reply)
            if terminated or truncated:
                reasons[i] = info.get("reason", "terminated" if terminated else "truncated")
            elif k == max_turns - 1:
                reasons[i] = "out of turns"
            else:
                still.append(i)
        running = still
    for i in range(B):
        check_concatenation(tokenizer, texts[i])
    T = max(len(r) for r in ids)
    pad = tokenizer.pad_token_id

    def padded(rows, value, dtype):
        return torch.tensor([r + [value] * (T - len(r)) for r in rows], dtype=dtype)

    attention = padded([[1.0] * len(r) for r in ids], 0.0, torch.float32)
    return Episodes(prompts=prompts, response_ids=padded(ids, pad, torch.long), response_mask=padded(mask, 0.0, torch.float32),
                    attention=attention, turn_index=padded(turn, -1, torch.long), logprobs=padded(logp, 0.0, torch.float32),
                    entropy=padded(ent, 0.0, torch.float32), rewards=rewards, turns=turns, reasons=reasons,
                    transcripts=["".join(t) for t in texts], temperature=1.0 if temperature == 0 else float(temperature))


def expert_sft_examples(transcripts: Callable[[int], tuple[str, list[str], list[str]]], seeds: Sequence[int]):
    """Demonstration episodes for supervised pre-training: ``(prompt, parts, is_agent)`` per seed,
    where ``transcripts(seed) -> (prompt, agent_turns, env_turns)``."""
    out = []
    for s in seeds:
        prompt, agent, env = transcripts(s)
        parts, is_agent = [], []
        for a, e in zip(agent, env):
            parts.append(a)
            is_agent.append(True)
            if e:
                parts.append(e)
                is_agent.append(False)
        out.append((prompt, parts, is_agent))
    return out
