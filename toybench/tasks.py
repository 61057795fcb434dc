"""Token-level MDPs that isolate the failure modes DAPO fixes.

One task family covers them all. A response is a token sequence ending in EOS:

* vocabulary ``V = K + 1``: token 0 is EOS, tokens 1..K are words;
* the first token chooses a *path* k (a solution strategy). Path k on prompt p succeeds
  with probability ``quality[p, k]`` (0 = a dead end, 1 = always right): the part of the
  reasoning the toy does not spell out token by token;
* every later word is one step of work; which word is used does not matter to the
  verifier (free text, like most tokens of a chain of thought), so its entropy is pure
  exploration;
* the answer counts only if the response *terminated* (EOS) after at least
  ``need_work[p, k]`` work tokens: some prompts need long reasoning;
* hitting ``max_len`` tokens without EOS truncates the response: no answer, incorrect
  (the paper's failure mode 4). A truncated response on a sound path is "on track".

``prior_path`` and ``prior_stop`` describe the base model (the initial policy): how likely
each path is at first and how eager the model is to stop.

Everything here is pure torch, batched over responses; :mod:`toybench.envs` wraps the same
functions in a gymnasium interface.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

EOS = 0


@dataclass(frozen=True)
class TokenTask:
    """A set of prompts over the path/work token MDP described in the module docstring."""

    name: str
    quality: Tensor
    """[P, K] float in [0, 1]: success probability of path k on prompt p."""
    need_work: Tensor
    """[P, K] int: work tokens (after the path token, before EOS) path k needs on prompt p."""
    max_len: int
    """Generation ceiling in tokens (EOS included); reaching it without EOS truncates."""
    prior_path: Tensor
    """[P, K] float: initial logits of choosing each path (the base model's preference)."""
    prior_stop: float = 0.0
    """Initial logit of EOS against each single work word at every later position."""
    prior_empty: float = -4.0
    """Initial logit of answering nothing (EOS as the first token)."""

    def __post_init__(self) -> None:
        p, k = self.quality.shape
        if self.need_work.shape != (p, k) or self.prior_path.shape != (p, k):
            raise ValueError(f"{self.name}: quality, need_work and prior_path must all be [P, K] = {(p, k)}")
        if not bool(((self.quality >= 0) & (self.quality <= 1)).all()):
            raise ValueError(f"{self.name}: quality must lie in [0, 1]")
        if self.max_len < 2:
            raise ValueError(f"{self.name}: max_len must be >= 2")

    @property
    def num_prompts(self) -> int:
        return int(self.quality.shape[0])

    @property
    def num_paths(self) -> int:
        return int(self.quality.shape[1])

    @property
    def vocab_size(self) -> int:
        return self.num_paths + 1


@dataclass
class Outcome:
    """The verifier's verdict on a batch of finished responses."""

    correct: Tensor  # [B] bool
    on_track: Tensor  # [B] bool: truncated while on a sound path
    path: Tensor  # [B] long, 0 if the response was empty
    work: Tensor  # [B] long, work tokens


def episode_end(tokens: Tensor, max_len: int) -> tuple[Tensor, Tensor]:
    """Lengths (EOS included) and truncation flags of sampled token rows [B, >= max_len].

    A row whose first ``max_len`` tokens hold no EOS is truncated at ``max_len``."""
    tokens = tokens[:, :max_len]
    is_eos = tokens == EOS
    has_eos = is_eos.any(1)
    first = torch.where(
        has_eos, is_eos.float().argmax(1), torch.full_like(has_eos, max_len, dtype=torch.long)
    )
    lengths = torch.where(has_eos, first + 1, torch.full_like(first, max_len))
    return lengths, ~has_eos


def verify(
    task: TokenTask, prompts: Tensor, tokens: Tensor, lengths: Tensor, truncated: Tensor, u: Tensor
) -> Outcome:
    """Is each response correct? ``u`` [B] in [0, 1) is the verification noise (correct
    needs ``u < quality``); draw it once per episode."""
    path = tokens[:, 0].clone()
    empty = path == EOS
    path = torch.where(empty, torch.zeros_like(path), path)
    k = (path - 1).clamp(min=0)
    q = task.quality[prompts, k]
    need = task.need_work[prompts, k]
    work = (lengths - 2).clamp(min=0)  # minus path token and EOS
    work = torch.where(truncated, lengths - 1, work)
    sound = ~empty & (q > 0)
    correct = sound & ~truncated & (work >= need) & (u.to(q.dtype) < q)
    return Outcome(correct=correct, on_track=sound & truncated, path=path, work=work)


# --------------------------------------------------------------------------------------
# The tasks. Each returns a TokenTask built from a fixed structure (no randomness), so
# every seed sees the same task and seeds vary only the policy's initial noise and sampling.
# --------------------------------------------------------------------------------------


def _t(x, dtype=torch.float64) -> Tensor:
    return torch.tensor(x, dtype=dtype)


def entropy_task() -> TokenTask:
    """Failure mode 1 (entropy collapse). 8 prompts, 6 paths. Five common paths succeed
    half the time (reward noise); one *rare* path (prior probability ~1%) succeeds 90% of
    the time. No length constraints. Work tokens are free text whose entropy the noise
    erodes."""
    p, k = 8, 6
    quality = torch.full((p, k), 0.5, dtype=torch.float64)
    quality[:, k - 1] = 0.9
    prior = torch.zeros(p, k, dtype=torch.float64)
    prior[:, : k - 1] = torch.linspace(1.5, 0.0, k - 1, dtype=torch.float64)
    prior[:, k - 1] = -2.0
    return TokenTask(
        name="entropy",
        quality=quality,
        need_work=torch.zeros(p, k, dtype=torch.long),
        max_len=8,
        prior_path=prior,
        prior_stop=-0.5,
    )


def zero_grad_task() -> TokenTask:
    """Failure mode 2 (zero-gradient groups). 16 prompts of graded difficulty: each has one
    right path (deterministic) whose prior probability runs from ~90% (easy) down to ~2%
    (hard); other paths are wrong. As the policy improves, easy prompts turn into
    all-correct groups and hard ones stay all-wrong for a long time."""
    p, k = 16, 5
    quality = torch.zeros(p, k, dtype=torch.float64)
    right = torch.arange(p) % k
    quality[torch.arange(p), right] = 1.0
    prior = torch.zeros(p, k, dtype=torch.float64)
    prior[torch.arange(p), right] = torch.linspace(3.5, -2.5, p, dtype=torch.float64)
    return TokenTask(
        name="zero_grad",
        quality=quality,
        need_work=torch.zeros(p, k, dtype=torch.long),
        max_len=6,
        prior_path=prior,
        prior_stop=0.5,
    )


def length_task(
    q_right: float = 1.0,
    q_wrong: float = 0.0,
    prior_right: tuple[float, float] = (-1.0, 0.5),
    prior_stop: float = -0.7,
) -> TokenTask:
    """Failure mode 3 (length bias of sample-level loss). 8 prompts, 4 paths; on each prompt
    one path is right (success ``q_right``) and three are wrong (``q_wrong``), the right
    one starting at a prior probability between ~10% and ~35%. The reward never depends on
    length (no minimum work, a ceiling far above the typical length), so any length drift
    comes from the loss aggregation."""
    p, k = 8, 4
    right = torch.arange(p) % k
    quality = torch.full((p, k), q_wrong, dtype=torch.float64)
    quality[torch.arange(p), right] = q_right
    prior = torch.zeros(p, k, dtype=torch.float64)
    prior[torch.arange(p), right] = torch.linspace(prior_right[0], prior_right[1], p, dtype=torch.float64)
    return TokenTask(
        name="length",
        quality=quality,
        need_work=torch.zeros(p, k, dtype=torch.long),
        max_len=24,
        prior_path=prior,
        prior_stop=prior_stop,
    )


def truncation_task(max_len: int = 12, need_long: int = 8, prior_stop: float = -3.0) -> TokenTask:
    """Failure mode 4 (truncation noise). 8 prompts, 3 paths. Half the prompts need long
    reasoning: their good path succeeds (90%) only after ``need_long`` work tokens, close to
    the ceiling of ``max_len`` tokens, so many sound responses are truncated. The other half
    are short (need 1 work token). A base model that tends to ramble (``prior_stop``) makes
    truncation common."""
    p, k = 8, 3
    quality = _t([0.9, 0.5, 0.0]).repeat(p, 1)
    need = torch.zeros(p, k, dtype=torch.long)
    need[: p // 2, :2] = need_long
    need[p // 2 :, :2] = 1
    return TokenTask(
        name="truncation",
        quality=quality,
        need_work=need,
        max_len=max_len,
        prior_path=torch.zeros(p, k, dtype=torch.float64),
        prior_stop=prior_stop,
    )


def composite_task() -> TokenTask:
    """All four mechanisms at once (for the Table-1 ladder and the factorial): 12 prompts
    in three difficulty tiers; on each, a common path that is right 40% of the time and a
    rare path (prior ~4%) that is right 90% of the time, plus a dead end; a third of the
    prompts need 7 work tokens (9-token answers) under a 16-token ceiling that a rambling
    base model often hits, so sound responses get truncated. As in the paper's setup, the
    soft ramp of the ladder (12..16) sits above the lengths the prompts need."""
    p, k = 12, 4
    quality = _t([0.4, 0.9, 0.0, 0.2]).repeat(p, 1)
    quality[:4] = _t([0.8, 0.95, 0.0, 0.5])  # easy tier
    quality[8:] = _t([0.1, 0.8, 0.0, 0.0])  # hard tier
    need = torch.zeros(p, k, dtype=torch.long)
    need[::3, :] = 7  # a third of the prompts need long reasoning
    need[1::3, :] = 2
    prior = _t([1.0, -1.5, 0.5, 0.0]).repeat(p, 1)
    return TokenTask(
        name="composite",
        quality=quality,
        need_work=need,
        max_len=16,
        prior_path=prior,
        prior_stop=-1.5,
    )


def prompt_pool_task(drifted: bool = False, prompts: int = 64) -> TokenTask:
    """Prompt selection (issue 33): many prompts whose difficulty drifts as the policy learns.
    ``prompts`` prompts, 5 paths, one right (deterministic) path each whose prior logit runs
    from 3.5 (~90%: solved within a few steps, then all-correct groups) down to -5 (~0.2%:
    all-wrong for most of the horizon); the rest of the work needs no minimum length, as in
    :func:`zero_grad_task`. ``drifted``: the easiest quarter of the prompts now needs 3 work
    tokens before the answer counts (a regression, or a stricter verifier): prompts solved and
    set aside become informative again, the case where skipping them costs accuracy."""
    k = 5
    quality = torch.zeros(prompts, k, dtype=torch.float64)
    right = torch.arange(prompts) % k
    quality[torch.arange(prompts), right] = 1.0
    prior = torch.zeros(prompts, k, dtype=torch.float64)
    prior[torch.arange(prompts), right] = torch.linspace(3.5, -5.0, prompts, dtype=torch.float64)
    need = torch.zeros(prompts, k, dtype=torch.long)
    if drifted:
        need[: prompts // 4, :] = 3
    return TokenTask(
        name="prompt_pool_drifted" if drifted else "prompt_pool",
        quality=quality,
        need_work=need,
        max_len=6,
        prior_path=prior,
        prior_stop=0.5,
    )


TASKS = {
    "entropy": entropy_task,
    "zero_grad": zero_grad_task,
    "length": length_task,
    "truncation": truncation_task,
    "composite": composite_task,
    "prompt_pool": prompt_pool_task,
}
