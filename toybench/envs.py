"""Gymnasium interface over the token MDPs of :mod:`toybench.tasks`.

An episode is one response. The observation carries the prompt and the prefix; an action
is a token; EOS ends the episode with ``terminated``; reaching ``max_len`` tokens without
EOS ends it with ``truncated`` (never both). The verifiable outcome is in ``info``
(``correct``, ``on_track``, ``path``, ``length``) on the last step, and the reward (given
on the last step, 0 before) is Eq. 7 plus, when enabled, the Eq. 13 penalty.

Training uses the batched tensor path (:func:`batched_episodes` over the same
:func:`toybench.tasks.verify`); a test checks both give the same episodes.

    import gymnasium as gym
    import toybench.envs  # registers the ids
    env = gym.make("toybench/Composite-v0")
"""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from dapo.rewards import outcome_reward

from .tasks import EOS, TASKS, TokenTask, episode_end, verify


def episode_start(task: TokenTask, seed: int) -> tuple[int, float]:
    """Prompt and verification noise of the episode reset with ``seed`` (gymnasium seeds
    ``np_random`` with ``numpy.random.default_rng(seed)``; draw order: prompt, then noise)."""
    rng = np.random.default_rng(seed)
    return int(rng.integers(task.num_prompts)), float(rng.random())


class TokenMDPEnv(gym.Env):
    """One response to one prompt of a :class:`~toybench.tasks.TokenTask`."""

    metadata: ClassVar[dict[str, list[str]]] = {"render_modes": ["ansi"]}

    def __init__(
        self,
        task: str = "composite",
        soft_overlong: bool = False,
        expected_len: int | None = None,
        cache_len: int | None = None,
        task_kwargs: dict | None = None,
        render_mode: str | None = None,
    ):
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; known: {sorted(TASKS)}")
        self.task = TASKS[task](**(task_kwargs or {}))
        t = self.task.max_len
        self.cache_len = cache_len if cache_len is not None else max(1, t // 4)
        self.expected_len = expected_len if expected_len is not None else t - self.cache_len
        if self.expected_len + self.cache_len != t:
            raise ValueError(f"expected_len + cache_len must equal the task's max_len {t}")
        self.soft_overlong = soft_overlong
        self.render_mode = render_mode
        v = self.task.vocab_size
        self.pad = v
        self.observation_space = spaces.Dict(
            {
                "prompt": spaces.Discrete(self.task.num_prompts),
                "prefix": spaces.Box(low=0, high=v, shape=(t,), dtype=np.int64),
            }
        )
        self.action_space = spaces.Discrete(v)
        self._prompt = 0
        self._noise = 0.0
        self._tokens: list[int] = []

    def _obs(self) -> dict:
        prefix = np.full(self.task.max_len, self.pad, dtype=np.int64)
        prefix[: len(self._tokens)] = self._tokens
        return {"prompt": self._prompt, "prefix": prefix}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._prompt = int(self.np_random.integers(self.task.num_prompts))
        self._noise = float(self.np_random.random())
        if options and "prompt" in options:
            self._prompt = int(options["prompt"])
        self._tokens = []
        return self._obs(), {"prompt": self._prompt}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not a token of this task (0..{self.task.vocab_size - 1})")
        self._tokens.append(int(action))
        terminated = int(action) == EOS
        truncated = not terminated and len(self._tokens) >= self.task.max_len
        info: dict = {}
        reward = 0.0
        if terminated or truncated:
            res = batched_episodes(
                self.task,
                torch.tensor([self._prompt]),
                torch.tensor([self._tokens]),
                torch.tensor([self._noise]),
                soft_overlong=self.soft_overlong,
                expected_len=self.expected_len,
                cache_len=self.cache_len,
            )
            reward = float(res["reward"][0])
            info = {k: (v[0].item()) for k, v in res.items() if k != "reward"}
        return self._obs(), reward, terminated, truncated, info

    def render(self):
        if self.render_mode == "ansi":
            words = ["<eos>" if t == EOS else f"w{t}" for t in self._tokens]
            return f"prompt {self._prompt}: " + " ".join(words)
        return None


def batched_episodes(
    task: TokenTask,
    prompts: torch.Tensor,
    tokens: torch.Tensor,
    noise: torch.Tensor,
    *,
    soft_overlong: bool,
    expected_len: int,
    cache_len: int,
) -> dict[str, torch.Tensor]:
    """The outcome of many episodes at once: tokens [B, <= max_len] (anything after the first
    EOS ignored; rows shorter than ``max_len`` without EOS are padded with a word)."""
    if tokens.shape[1] < task.max_len:
        tokens = torch.nn.functional.pad(tokens, (0, task.max_len - tokens.shape[1]), value=1)
    lengths, truncated = episode_end(tokens, task.max_len)
    out = verify(task, prompts, tokens, lengths, truncated, noise)
    reward = outcome_reward(
        out.correct, lengths, soft_overlong=soft_overlong, expected_len=expected_len, cache_len=cache_len
    )
    return {
        "reward": reward,
        "correct": out.correct,
        "on_track": out.on_track,
        "path": out.path,
        "length": lengths,
        "truncated": truncated,
    }


ENV_IDS = {name: f"toybench/{name.title().replace('_', '')}-v0" for name in TASKS}
"""Task name -> registered gymnasium id (e.g. ``toybench/Composite-v0``)."""

for _name, _id in ENV_IDS.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point="toybench.envs:TokenMDPEnv", kwargs={"task": _name})
