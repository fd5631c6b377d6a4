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

For the training loop, the module registers the task ``"frozenlake"`` (examples carry the map in
``meta["map_seed"]``; the verifier replays a transcript in the environment) and the sampler
``"multiturn"`` (``G`` episodes per prompt, environment replies in ``attention`` but not in
``response_mask``, ``extras["turn_index"]``, and optionally a behaviour policy ``lag`` steps old).
:func:`play_episodes` takes any environment with the text ``reset``/``step`` interface of
:class:`~rlcourse.envs.frozenlake.TextFrozenLake`; the sampler builds one per row with the text
environment named by its ``env`` keyword, from :data:`TEXT_ENVS` (the book registers ``"frozenlake"``;
:func:`register_text_env` adds another, with its task).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from .envs.frozenlake import TextFrozenLake
from .lagged import behaviour_policy, trainable_weights
from .lm.sampling import RolloutBatch, encode_prompts, sample
from .registry import Registry
from .rollout import register_sampler
from .snapshots import push_lagged
from .tasks import Example, Score, Task, register_task


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
    agent_turns: list[list[str]] = field(default_factory=list)  # each row's turns as the environment received them


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
    agent_turns: list[list[str]] = [[] for _ in range(B)]
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
            agent_turns[i].append(turn_text)
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
                    transcripts=["".join(t) for t in texts], temperature=1.0 if temperature == 0 else float(temperature),
                    agent_turns=agent_turns)


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


# ---------------------------------------------------------------------- the task and the sampler
TURN_SEP = "\n"  # ends each agent turn in a batch's texts; the book's tokenizer cannot produce it


def episode_text(agent_turns: Sequence[str]) -> str:
    """A row's ``batch.texts`` entry: the agent's turns as the environment received them, each ended
    by :data:`TURN_SEP` (so the verifier can replay the episode exactly)."""
    return "".join(t + TURN_SEP for t in agent_turns)


def split_turns(completion: str) -> list[str]:
    """The turns of a completion: a multi-turn text (:func:`episode_text`) is split at :data:`TURN_SEP`;
    a single-turn completion without it is an open-loop plan, one move per character (spaces ignored)."""
    if TURN_SEP in completion:
        turns = completion.split(TURN_SEP)
        return turns[:-1] if turns[-1] == "" else turns
    return [c for c in completion if not c.isspace()]


def replay(completion: str, map_seed: int, max_turns: int = 8, size: int = 4) -> Score:
    """Play the turns of ``completion`` on map ``map_seed``: the return and the reason the episode
    ended (a completion that stops before the episode ends scores 0, "unfinished")."""
    env = TextFrozenLake(size=size, max_turns=max_turns)
    env.reset(options={"map_seed": int(map_seed)})
    total = 0.0
    for turn in split_turns(completion):
        _, reward, terminated, truncated, info = env.step(turn)
        total += reward
        if terminated or truncated:
            return Score(total, info.get("reason", ""))
    return Score(0.0, "unfinished")


class FrozenLakeTask(Task):
    """The text FrozenLake as a task: ``prompt`` is the environment's first observation,
    ``meta["map_seed"]`` the map, ``answer`` and ``solution`` a shortest path (an open-loop plan).
    :meth:`score` replays the completion's turns in the environment (see :func:`split_turns`)."""

    name = "frozenlake"

    def __init__(self, size: int = 4, max_turns: int = 8):
        self.size, self.max_turns = size, max_turns

    def _draw(self, rng: np.random.Generator) -> Example:
        env = TextFrozenLake(size=self.size, max_turns=self.max_turns)
        prompt, info = env.reset(options={"map_seed": int(rng.integers(2**31))})
        return Example(prompt=prompt, answer=info["optimal"], solution=info["optimal"],
                       meta={"map_seed": info["map_seed"], "max_turns": self.max_turns, "size": self.size})

    def score(self, completion: str, example: Example) -> Score:
        if "map_seed" not in example.meta:
            return Score(0.0, "not a frozenlake example (no meta['map_seed'])")
        return replay(completion, example.meta["map_seed"], example.meta.get("max_turns", self.max_turns),
                      example.meta.get("size", self.size))


register_task("frozenlake")(FrozenLakeTask)

TEXT_ENVS: Registry = Registry("text environment")
"""The text environments the ``"multiturn"`` sampler can play, by name: each a function
``(example, max_turns) -> (env, reset_kwargs)`` that builds the environment an example of its task is
played in, or raises ``ValueError`` naming what the example lacks. Add one with
``@register_text_env(name)``."""
register_text_env = TEXT_ENVS.register


@register_text_env("frozenlake")
def frozenlake_env(example: Example, max_turns: int):
    """The text FrozenLake of an example of the ``frozenlake`` task (its map is ``meta['map_seed']``)."""
    if "map_seed" not in example.meta:
        raise ValueError(f"the 'frozenlake' environment plays the 'frozenlake' task; example {example.prompt!r} "
                         "has no meta['map_seed']")
    env = TextFrozenLake(size=example.meta.get("size", 4), max_turns=max_turns)
    return env, {"options": {"map_seed": example.meta["map_seed"]}}

STATE_KEY = "multiturn"


def lagged_policy(model, state: dict, lag: int):
    """The policy ``lag`` calls ago (the current one for ``lag = 0``), by the same snapshots as the
    single-turn ``"lagged"`` sampler: the :func:`~rlcourse.lagged.trainable_weights` of the last
    ``lag + 1`` calls are kept in ``state["multiturn"]["weights"]`` (by
    :func:`~rlcourse.snapshots.push_lagged`; CPU tensors, so a checkpoint holds them and a resumed run
    samples with the same behaviour policy), and the oldest is loaded into the scratch copy of
    :func:`~rlcourse.lagged.behaviour_policy`. Before ``lag`` calls have been made, the oldest kept
    weights serve."""
    if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
        raise ValueError(f"lag must be an integer >= 0, got {lag!r}")
    memo = state.setdefault(STATE_KEY, {})
    if lag == 0:
        memo.pop("weights", None)
        return model
    oldest = push_lagged(memo.setdefault("weights", []), trainable_weights(model), lag)
    return behaviour_policy(model, oldest)


@register_sampler("multiturn")
def multiturn_sampler(model, tokenizer, prompts, config, generator, state, examples=None, lag: int = 0,
                      max_turns: int | None = None, tokens_per_turn: int = 2, env: str = "frozenlake") -> RolloutBatch:
    """``G = config.num_generations`` episodes per prompt in the text environment ``env`` (a name in
    :data:`TEXT_ENVS`), one row each, with the behaviour policy of ``lag`` steps (sampler calls) ago
    (:func:`lagged_policy`; its log-probs are the batch's ``logprobs``).

    ================ ========= =======================================================
    response_mask    ``(B,T)`` 1 on the agent's tokens; environment replies are 0
    attention        ``(B,T)`` 1 on the agent's and the environment's tokens
    extras           dict      ``"turn_index"``: ``(B,T)`` long, the turn of each token
    texts            ``B``     :func:`episode_text`: what the task's verifier replays (the
                               ``"task"`` reward is then the episode's return)
    truncated        ``(B,)``  episodes that ran out of turns
    ================ ========= =======================================================

    Needs the step's examples of the environment's task (for ``"frozenlake"``, ``meta['map_seed']``);
    temperature sampling only (``top_k``/``top_p`` are refused). With ``lag > 0`` no entropy is
    recorded (it would be the old policy's), so the trainer computes the current one.
    """
    make_env = TEXT_ENVS.get(env)  # an unknown name is a ValueError listing the registered ones
    if examples is None:
        raise ValueError(f"the multiturn sampler needs the step's examples of the {env!r} environment's task "
                         "(the trainer passes them)")
    if len(examples) != len(prompts) or any(e.prompt != p for e, p in zip(examples, prompts)):
        raise ValueError("multiturn: examples must be the examples of the prompts, in order")
    if config.top_k or config.top_p != 1.0:
        raise ValueError(f"the multiturn sampler samples at a temperature only; got top_k={config.top_k}, "
                         f"top_p={config.top_p}")
    G = config.num_generations
    per_row = [e for e in examples for _ in range(G)]
    turns = max_turns or per_row[0].meta.get("max_turns", 8)
    built = [make_env(e, turns) for e in per_row]
    behaviour = lagged_policy(model, state, lag)
    ep = play_episodes(behaviour, tokenizer, [b[0] for b in built], [b[1] for b in built], max_turns=turns,
                       tokens_per_turn=tokens_per_turn, temperature=config.temperature, generator=generator)
    if ep.prompts != [e.prompt for e in per_row]:
        raise ValueError("multiturn: the environment's first observation differs from the example's prompt")
    p_ids, p_mask = encode_prompts(tokenizer, ep.prompts)
    return RolloutBatch(prompt_ids=p_ids, prompt_mask=p_mask, response_ids=ep.response_ids,
                        response_mask=ep.response_mask, logprobs=ep.logprobs,
                        index=torch.arange(len(prompts)).repeat_interleave(G),
                        truncated=torch.tensor([r == "out of turns" for r in ep.reasons]),
                        prompts=ep.prompts, texts=[episode_text(t) for t in ep.agent_turns],
                        temperature=ep.temperature, entropy=ep.entropy if lag == 0 else None,
                        extras={"turn_index": ep.turn_index}, attention=ep.attention)
