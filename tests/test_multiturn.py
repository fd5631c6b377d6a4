"""Multi-turn episodes on the text FrozenLake: the environment, the bookkeeping of a played episode
(environment tokens in the sequence, out of the loss, turn indices), and exact log-probs."""
import gymnasium as gym
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import rlcourse
from rlcourse.envs import MOVES, TextFrozenLake, expert_transcript, make_map, shortest_path
from rlcourse.lm import build_model, build_tokenizer, encode_prompts, response_logprobs
from rlcourse.multiturn import check_concatenation, play_episodes


def test_registered_and_passes_gymnasium_checker():
    env = gym.make("rlcourse/TextFrozenLake-v0")
    check_env(env.unwrapped)
    obs, info = env.reset(seed=3)
    assert obs.endswith("0>") and len(info["optimal"]) == 6


def test_dynamics_are_gymnasiums_and_the_expert_reaches_the_goal():
    env = TextFrozenLake()
    for seed in range(20):
        obs, info = env.reset(options={"map_seed": seed})
        total, steps = 0.0, 0
        for move in info["optimal"]:
            reply, r, term, trunc, step_info = env.step(move + "<eos>")
            total += r
            steps += 1
        assert total == 1.0 and term and step_info["reason"] == "goal" and steps == len(shortest_path(env.desc))


def test_holes_invalid_turns_and_turn_limit():
    env = TextFrozenLake(max_turns=6)
    env.reset(options={"map_seed": 0})
    _, r, term, _, info = env.step("X")
    assert (r, term) == (0.0, True) and "not a move" in info["reason"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("R")
    env.reset(options={"map_seed": 0})
    # bump into the left wall six times: out of turns
    for _ in range(6):
        reply, r, term, trunc, info = env.step("L")
    assert trunc and not term and info["reason"] == "out of turns" and reply == ""
    with pytest.raises(ValueError, match="max_turns"):
        TextFrozenLake(max_turns=5)
    with pytest.raises(ValueError, match="no 4x4 map"):
        make_map(0, max_turns=5)


def test_expert_transcript_matches_the_environment():
    env = TextFrozenLake()
    obs, info = env.reset(options={"map_seed": 5})
    agent, replies = expert_transcript(env.desc, obs)
    for a, expected in zip(agent, replies):
        reply, *_ = env.step(a)
        assert reply == expected


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return build_model(tok, rlcourse.profile("smoke"), seed=0), tok


def test_played_episodes_bookkeeping_and_exact_logprobs(tiny):
    model, tok = tiny
    envs = [TextFrozenLake(max_turns=6) for _ in range(6)]
    ep = play_episodes(model, tok, envs, [{"options": {"map_seed": s % 3}} for s in range(6)], max_turns=6,
                       tokens_per_turn=2, temperature=1.0, generator=torch.Generator().manual_seed(0))
    B, T = ep.response_ids.shape
    assert B == 6 and ep.attention.shape == ep.response_mask.shape == ep.turn_index.shape == (B, T)
    # agent tokens are a subset of the real tokens; padding has turn index -1
    assert ((ep.response_mask == 1) <= (ep.attention == 1)).all()
    assert (ep.turn_index[ep.attention == 0] == -1).all() and (ep.turn_index[ep.attention == 1] >= 0).all()
    assert (ep.logprobs[ep.response_mask == 0] == 0).all()
    # turn indices never decrease along a row, and their count matches the turns played
    for i in range(B):
        t = ep.turn_index[i][ep.attention[i] == 1]
        assert (t[1:] >= t[:-1]).all() and int(t.max()) + 1 == int(ep.turns[i])
    # training-time recomputation on [prompt | whole episode] gives the sampling log-probs of every agent token
    p_ids, p_mask = encode_prompts(tok, ep.prompts)
    ids = torch.cat([p_ids, ep.response_ids], 1)
    attn = torch.cat([p_mask, ep.attention.long()], 1)
    with torch.no_grad():
        logp = response_logprobs(model, ids, attn, T, ep.temperature)
    torch.testing.assert_close(logp * ep.response_mask, ep.logprobs, atol=2e-5, rtol=0)


def test_tokenizer_that_merges_across_turns_is_refused():
    class Merging:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [len(text)]}
    with pytest.raises(ValueError, match="concatenation"):
        check_concatenation(Merging(), ["ab", "c"])
