"""The producers of the one metric schema (:data:`dapo.schema.SCHEMA`, re-exported here)
shared by the toy regime, the scale trainer and ``dapo.health``.

One flat ``dict[str, float]`` per training step, written as a JSONL line; the functions
below are the only places the values are computed. Fractions are in [0, 1]; NaN means "not
defined this step" (e.g. no token was up-clipped).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .schema import SCHEMA

__all__ = ["SCHEMA", "masked_mean", "rollout_metrics", "rollout_stats"]


def masked_mean(x: Tensor, mask: Tensor, dims: int = 1) -> Tensor:
    """Mean of ``x`` over its last ``dims`` dimensions where ``mask``, in float64; NaN
    where the mask is empty. Leading dimensions index independent runs."""
    mask = mask.bool().expand_as(x)
    red = tuple(range(-dims, 0))
    total = torch.where(mask, x.to(torch.float64), torch.zeros((), dtype=torch.float64)).sum(red)
    count = mask.sum(red).to(torch.float64)
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, math.nan))


def rollout_stats(
    *,
    correct: Tensor,
    lengths: Tensor,
    truncated: Tensor,
    rewards: Tensor,
    group_size: int,
    valid: Tensor | None = None,
) -> dict[str, Tensor]:
    """The ``rollout/*`` metrics as tensors over leading run dimensions: inputs are
    [..., N] per-response tensors, group-major; ``valid`` ([..., N] bool, whole groups)
    marks the rows that were generated when runs generated different amounts."""
    correct = correct.bool()
    lengths = lengths.to(torch.float64)
    valid = torch.ones_like(correct) if valid is None else valid.bool()
    n = correct.shape[-1]
    n_groups = n // group_size if group_size else 0
    lead = correct.shape[:-1]
    per_group = correct[..., : n_groups * group_size].reshape(*lead, n_groups, group_size).sum(-1)
    group_valid = valid[..., : n_groups * group_size].reshape(*lead, n_groups, group_size).all(-1)
    nan = torch.full(lead, math.nan, dtype=torch.float64)
    longest = torch.where(valid, lengths, torch.full_like(lengths, -math.inf)).amax(-1) if n else nan
    return {
        "rollout/accuracy": masked_mean(correct.double(), valid),
        "rollout/reward_mean": masked_mean(rewards, valid),
        "rollout/groups_all_correct": masked_mean((per_group == group_size).double(), group_valid),
        "rollout/groups_all_wrong": masked_mean((per_group == 0).double(), group_valid),
        "rollout/length_mean": masked_mean(lengths, valid),
        "rollout/length_max": torch.where(valid.any(-1), longest, nan) if n else nan,
        "rollout/length_correct_mean": masked_mean(lengths, valid & correct),
        "rollout/length_wrong_mean": masked_mean(lengths, valid & ~correct),
        "rollout/truncation_rate": masked_mean(truncated.double(), valid),
    }


def rollout_metrics(
    *, correct: Tensor, lengths: Tensor, truncated: Tensor, rewards: Tensor, group_size: int
) -> dict[str, float]:
    """The ``rollout/*`` metrics from per-response tensors (group-major) of one run."""
    stats = rollout_stats(
        correct=correct.view(-1),
        lengths=lengths.view(-1),
        truncated=truncated.view(-1),
        rewards=rewards.view(-1),
        group_size=group_size,
    )
    return {k: float(v) for k, v in stats.items()}
