"""Random but valid inputs for the core's tests."""

import torch

from dapo.batch import RolloutBatch


def random_batch(
    n_groups=3, group_size=4, max_len=6, seed=0, p_correct=0.5, rollout=False, min_len=1, dtype=torch.float64
):
    g = torch.Generator().manual_seed(seed)
    b = n_groups * group_size
    lengths = torch.randint(min_len, max_len + 1, (b,), generator=g)
    mask = torch.arange(max_len).unsqueeze(0) < lengths.unsqueeze(1)
    old_logp = -torch.rand(b, max_len, generator=g, dtype=dtype) * 3
    old_logp = torch.where(mask, old_logp, torch.zeros_like(old_logp))
    correct = torch.rand(b, generator=g) < p_correct
    truncated = lengths == max_len
    rewards = torch.where(correct, 1.0, -1.0).to(dtype)
    kw = {}
    if rollout:
        kw["rollout_logp"] = old_logp + 0.05 * torch.randn(b, max_len, generator=g, dtype=dtype)
        kw["rollout_logp"] = torch.where(mask, kw["rollout_logp"].clamp(max=0), torch.zeros_like(old_logp))
    return RolloutBatch(
        old_logp=old_logp,
        mask=mask,
        lengths=lengths,
        truncated=truncated,
        correct=correct,
        rewards=rewards,
        group_ids=torch.arange(n_groups).repeat_interleave(group_size),
        group_size=group_size,
        extras={"row": torch.arange(b)},
        **kw,
    )
