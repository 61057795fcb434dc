"""Group-relative advantage (Eq. 9 of the DAPO paper, shared with GRPO)."""

from __future__ import annotations

import torch
from torch import Tensor


def group_advantages(rewards: Tensor, group_size: int, *, eps: float = 1e-6, std_norm: bool = True) -> Tensor:
    """A_i = (R_i - mean(R_group)) / (std(R_group) + eps), one value per response.

    ``rewards`` is [B], group-major: G = ``group_size`` consecutive responses per prompt.
    The std is the *sample* standard deviation (n - 1 denominator), as in verl and TRL.
    A group whose rewards are all equal gets exactly 0 (not a rounding residue), which is
    what makes it a zero-gradient group. ``std_norm=False`` is the Dr. GRPO variant
    ``R_i - mean``. Computed in float64 and returned in the rewards' dtype.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"B = {rewards.numel()} is not a multiple of group_size = {group_size}")
    r = rewards.detach().to(torch.float64).view(-1, group_size)
    centred = r - r.mean(dim=1, keepdim=True)
    if std_norm and group_size > 1:
        centred = centred / (r.std(dim=1, keepdim=True) + eps)
    uniform = (r == r[:, :1]).all(dim=1, keepdim=True)
    adv = torch.where(uniform, torch.zeros_like(centred), centred)
    return adv.view(-1).to(rewards.dtype)
