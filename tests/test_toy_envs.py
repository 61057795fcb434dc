import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import toybench.envs as envs
from toybench.tasks import EOS, TASKS


@pytest.mark.parametrize("name", sorted(TASKS))
def test_registered_envs_pass_the_checker(name):
    env = gym.make(envs.ENV_IDS[name])
    check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize("soft", [False, True])
def test_gym_and_batched_paths_give_the_same_episodes(name, soft):
    env = envs.TokenMDPEnv(task=name, soft_overlong=soft)
    task = env.task
    rng = np.random.default_rng(7)
    rows, prompts, noise, expected = [], [], [], []
    for seed in range(150):
        obs, info = env.reset(seed=seed)
        prompt, u = envs.episode_start(task, seed)
        assert obs["prompt"] == prompt == info["prompt"]
        p_eos = rng.choice([0.05, 0.2, 0.5])
        tokens, done, total = [], False, 0.0
        while not done:
            a = EOS if rng.random() < p_eos else int(rng.integers(1, task.vocab_size))
            obs, r, term, trunc, info = env.step(a)
            tokens.append(a)
            total += r
            assert not (term and trunc), "terminated and truncated are never conflated"
            done = term or trunc
            assert (obs["prefix"][: len(tokens)] == tokens).all()
        assert term == (tokens[-1] == EOS) and trunc == (len(tokens) == task.max_len and tokens[-1] != EOS)
        expected.append((total, info["correct"], info["length"], info["truncated"], info["on_track"]))
        rows.append(tokens + [1] * (task.max_len - len(tokens)))
        prompts.append(prompt)
        noise.append(u)
    res = envs.batched_episodes(
        task,
        torch.tensor(prompts),
        torch.tensor(rows),
        torch.tensor(noise),
        soft_overlong=soft,
        expected_len=env.expected_len,
        cache_len=env.cache_len,
    )
    for i, (total, correct, length, trunc, on_track) in enumerate(expected):
        assert float(res["reward"][i]) == pytest.approx(total)
        assert bool(res["correct"][i]) == correct
        assert int(res["length"][i]) == length
        assert bool(res["truncated"][i]) == trunc
        assert bool(res["on_track"][i]) == on_track
    assert any(e[1] for e in expected) and not all(e[1] for e in expected)


def test_rewards_follow_the_config():
    env = envs.TokenMDPEnv(task="truncation", soft_overlong=True, expected_len=10, cache_len=2)
    env.reset(seed=0)
    for _ in range(12):
        _, r, term, trunc, info = env.step(1)
    assert trunc and not term and not info["correct"]
    assert r == pytest.approx(-1.0 - 1.0)  # wrong (Eq. 7) plus the full ramp (Eq. 13) at max_len
    with pytest.raises(ValueError, match="not a token"):
        env.step(99)
    with pytest.raises(ValueError, match="max_len"):
        envs.TokenMDPEnv(task="truncation", expected_len=5, cache_len=5)
