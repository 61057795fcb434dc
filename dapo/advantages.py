"""Group-relative advantage (Eq. 9 of the DAPO paper, shared with GRPO), and which
responses enter a group's statistics when overlong filtering removes some from the loss."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .rewards import outcome_reward

if TYPE_CHECKING:
    from .config import AlgoConfig


def group_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    eps: float = 1e-6,
    std_norm: bool = True,
    include: Tensor | None = None,
) -> Tensor:
    """A_i = (R_i - mean(R_group)) / (std(R_group) + eps), one value per response.

    ``rewards`` is [..., B], group-major along the last dimension: G = ``group_size``
    consecutive responses per prompt. Leading dimensions index independent runs (the toy
    engine trains several seeds at once); a single run passes [B]. The std is the
    *sample* standard deviation (n - 1 denominator), as in verl and TRL. A group whose
    rewards are all equal gets exactly 0 (not a rounding residue), which is what makes it
    a zero-gradient group. ``std_norm=False`` is the Dr. GRPO variant ``R_i - mean``.

    ``include`` ([..., B] bool, default all) restricts the group's mean, std and equality
    test to the included responses; excluded responses get advantage 0. A group with one
    included response (or none) is uniform, so 0. Computed in float64 and returned in the
    rewards' dtype.
    """
    if rewards.dim() < 1:
        raise ValueError(f"rewards must be 1-D [B] (or [..., B]), got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.shape[-1] % group_size != 0:
        raise ValueError(f"B = {rewards.shape[-1]} is not a multiple of group_size = {group_size}")
    r = rewards.detach().to(torch.float64).reshape(-1, group_size)
    if include is None:
        centred = r - r.mean(dim=1, keepdim=True)
        if std_norm and group_size > 1:
            centred = centred / (r.std(dim=1, keepdim=True) + eps)
        uniform = (r == r[:, :1]).all(dim=1, keepdim=True)
        adv = torch.where(uniform, torch.zeros_like(centred), centred)
        return adv.view(rewards.shape).to(rewards.dtype)
    inc = include.reshape(-1, group_size).bool()
    if inc.shape != r.shape:
        raise ValueError(f"include shape {tuple(include.shape)} != rewards shape {tuple(rewards.shape)}")
    n = inc.sum(1, keepdim=True).to(torch.float64)
    zero = torch.zeros_like(r)
    mean = torch.where(inc, r, zero).sum(1, keepdim=True) / n.clamp(min=1)
    centred = r - mean
    if std_norm:
        var = torch.where(inc, centred * centred, zero).sum(1, keepdim=True) / (n - 1).clamp(min=1)
        centred = centred / (var.sqrt() + eps)
    lo = torch.where(inc, r, torch.full_like(r, torch.inf)).amin(1, keepdim=True)
    hi = torch.where(inc, r, torch.full_like(r, -torch.inf)).amax(1, keepdim=True)
    uniform = (n <= 1) | (lo == hi)
    adv = torch.where(uniform | ~inc, zero, centred)
    return adv.view(rewards.shape).to(rewards.dtype)


def config_advantages(
    rewards: Tensor, correct: Tensor, lengths: Tensor, truncated: Tensor, group_size: int, cfg: AlgoConfig
) -> Tensor:
    """Eq. 9 for an ``AlgoConfig``: how responses removed from the loss by overlong
    filtering enter their group's statistics follows ``cfg.filtered_group_stats``
    (see its docstring). Without ``cfg.overlong_filter`` every response enters with its
    shaped reward. All tensors are [..., B]."""
    include = None
    if cfg.overlong_filter and cfg.filtered_group_stats == "unpenalized":
        base = outcome_reward(
            correct, lengths, soft_overlong=False, expected_len=cfg.expected_len, cache_len=cfg.cache_len
        ).to(rewards.dtype)
        rewards = torch.where(truncated, base, rewards)
    elif cfg.overlong_filter and cfg.filtered_group_stats == "excluded":
        include = ~truncated
    return group_advantages(rewards, group_size, eps=cfg.adv_eps, std_norm=cfg.adv_std_norm, include=include)
