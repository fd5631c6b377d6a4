"""The project's Gymnasium environments: registered under rlcourse/..., and valid per Gymnasium's checker."""
import gymnasium as gym
import mujoco  # noqa: F401  (a default dependency: the MuJoCo test fails, not skips, without it)
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rlcourse.control  # noqa: F401  (registers the environments)
from rlcourse.control import CONTROL_ENVS


@pytest.mark.parametrize("env_id", sorted(CONTROL_ENVS))
def test_registered_env_passes_gymnasium_check_env(env_id):
    env = gym.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    obs2, *_ = env.step(env.action_space.sample())
    assert env.observation_space.contains(obs2)
    env.close()


def test_nav2d_registered_env_is_seeded():
    a, b = gym.make("rlcourse/Nav2D-v0"), gym.make("rlcourse/Nav2D-v0")
    oa, _ = a.reset(seed=7)
    ob, _ = b.reset(seed=7)
    np.testing.assert_array_equal(oa, ob)
    act = np.array([0.5, -0.5], np.float32)
    np.testing.assert_array_equal(a.step(act)[0], b.step(act)[0])


def test_mujoco_tasks_used_by_the_poe_chapter_run():
    for env_id in ("InvertedDoublePendulum-v5", "Hopper-v5"):
        env = gym.make(env_id)
        obs, _ = env.reset(seed=0)
        obs, r, term, trunc, _ = env.step(env.action_space.sample())
        assert env.observation_space.shape == obs.shape and np.isfinite(r)
        env.close()
