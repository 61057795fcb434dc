"""Dynamic sampling (Section 3.2; the constraint 0 < |{o_i : is_equivalent(a, o_i)}| < G
of Eq. 11) as an accumulating buffer with cost accounting.

Usage, per training step::

    sampler = DynamicSampler.for_config(cfg)
    while not sampler.done:
        sampler.add(generate_one_round())       # whole groups, group-major
    batch = sampler.take()                      # <= target_groups informative groups
    metrics = sampler.metrics()                 # rounds, rejects by reason, tokens...
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .batch import RolloutBatch

if TYPE_CHECKING:
    from .config import AlgoConfig


class SamplingWarning(UserWarning):
    """Dynamic sampling ran out of rounds before the batch was full."""


@dataclass
class _Seen:
    """Per-response scalars of everything generated this step (for the rollout metrics)."""

    correct: list[Tensor]
    lengths: list[Tensor]
    truncated: list[Tensor]
    rewards: list[Tensor]


def uniform_groups(
    correct: Tensor, group_size: int, truncated: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(all_correct, all_wrong) per group for [..., N] group-major responses.

    With ``truncated`` given, truncated responses are left out of the count (a group is
    then judged on its terminated responses; one with none left is all-wrong). This is
    ``AlgoConfig.filtered_group_stats == "excluded"``."""
    lead = correct.shape[:-1]
    c = correct.bool().reshape(*lead, -1, group_size)
    if truncated is None:
        n_correct = c.sum(-1)
        return n_correct == group_size, n_correct == 0
    counted = ~truncated.bool().reshape(*lead, -1, group_size)
    n_counted = counted.sum(-1)
    n_correct = (c & counted).sum(-1)
    return (n_counted > 0) & (n_correct == n_counted), n_correct == 0


def informative_groups(
    batch: RolloutBatch, group_size: int, enabled: bool = True, exclude_truncated: bool = False
) -> tuple[Tensor, int, int]:
    """``(keep, rejected_all_correct, rejected_all_wrong)`` for one round of whole groups:
    ``keep`` [groups] bool marks the groups dynamic sampling accepts (``0 < #correct < G``,
    judged on ``correct``, see :func:`uniform_groups`; every group when not ``enabled``, and then
    nothing counts as rejected)."""
    all_correct, all_wrong = uniform_groups(
        batch.correct, group_size, batch.truncated if exclude_truncated else None
    )
    if not enabled:
        return torch.ones_like(all_correct), 0, 0
    return ~(all_correct | all_wrong), int(all_correct.sum()), int(all_wrong.sum())


def group_rows(keep: Tensor, group_size: int) -> Tensor:
    """Row indices of the groups ``keep`` marks (group-major rows)."""
    return (keep.nonzero().view(-1, 1) * group_size + torch.arange(group_size, device=keep.device)).view(-1)


def sampling_metrics(
    *,
    rounds: int,
    generated_groups: int,
    generated_tokens: int,
    accepted: int,
    target: int,
    rejected_all_correct: int,
    rejected_all_wrong: int,
) -> dict[str, float]:
    """The ``sampling/*`` cost accounting of one step (``accepted``: informative groups found,
    of which at most ``target`` are kept)."""
    kept = min(accepted, target)
    return {
        "sampling/rounds": float(rounds),
        "sampling/generated_groups": float(generated_groups),
        "sampling/generated_tokens": float(generated_tokens),
        "sampling/accepted_groups": float(kept),
        "sampling/rejected_all_correct": float(rejected_all_correct),
        "sampling/rejected_all_wrong": float(rejected_all_wrong),
        "sampling/surplus_groups": float(accepted - kept),
        "sampling/underfilled": float(accepted < target),
        "sampling/tokens_per_accepted_group": generated_tokens / kept if kept else float("nan"),
    }


class DynamicSampler:
    """Collects finished groups until ``target_groups`` informative ones are held.

    A group is informative when ``0 < #correct < G``: judged on ``RolloutBatch.correct``,
    never on the shaped reward (with the overlong penalty an all-wrong group has non-zero
    reward std and would slip through a std filter). With ``enabled=False`` every group is
    accepted and one round fills the batch, so both arms report the same accounting.
    After ``max_rounds`` rounds :meth:`take` hands back what it holds with a
    :class:`SamplingWarning` instead of raising; the surplus beyond ``target_groups`` is
    dropped (and counted). ``exclude_truncated`` judges groups on their terminated
    responses only (see :func:`uniform_groups`).
    """

    def __init__(
        self,
        target_groups: int,
        group_size: int,
        max_rounds: int,
        enabled: bool = True,
        exclude_truncated: bool = False,
    ):
        if target_groups < 1 or group_size < 1 or max_rounds < 1:
            raise ValueError("target_groups, group_size and max_rounds must be >= 1")
        self.target_groups = target_groups
        self.group_size = group_size
        self.max_rounds = max_rounds
        self.enabled = enabled
        self.exclude_truncated = exclude_truncated
        self.reset()

    @classmethod
    def for_config(cls, cfg: AlgoConfig, target_groups: int | None = None) -> DynamicSampler:
        """The sampler an ``AlgoConfig`` asks for (``target_groups`` defaults to
        ``cfg.train_groups``; pass a rank's share under data parallelism)."""
        return cls(
            cfg.train_groups if target_groups is None else target_groups,
            cfg.group_size,
            cfg.max_gen_rounds,
            cfg.dynamic_sampling,
            exclude_truncated=cfg.overlong_filter and cfg.filtered_group_stats == "excluded",
        )

    def reset(self) -> None:
        self.rounds = 0
        self.generated_groups = 0
        self.generated_tokens = 0
        self.rejected_all_correct = 0
        self.rejected_all_wrong = 0
        self._kept: list[RolloutBatch] = []
        self._seen = _Seen([], [], [], [])

    @property
    def accepted_groups(self) -> int:
        return sum(b.num_groups for b in self._kept)

    @property
    def full(self) -> bool:
        return self.accepted_groups >= self.target_groups

    @property
    def done(self) -> bool:
        """True once the batch is full or the round limit is reached."""
        return self.full or self.rounds >= self.max_rounds

    def add(self, batch: RolloutBatch) -> None:
        """Feed one generation round of whole groups."""
        if batch.group_size != self.group_size:
            raise ValueError(f"batch group_size {batch.group_size} != sampler's {self.group_size}")
        self.rounds += 1
        n_groups = batch.num_groups
        self.generated_groups += n_groups
        self.generated_tokens += int(batch.lengths.sum())
        for name in ("correct", "lengths", "truncated", "rewards"):
            getattr(self._seen, name).append(getattr(batch, name).detach().cpu())
        keep, n_all_correct, n_all_wrong = informative_groups(
            batch, self.group_size, self.enabled, self.exclude_truncated
        )
        self.rejected_all_correct += n_all_correct
        self.rejected_all_wrong += n_all_wrong
        if bool(keep.any()):
            rows = group_rows(keep, self.group_size)
            self._kept.append(batch.select(rows.to(batch.old_logp.device), group_size=self.group_size))

    def take(self) -> RolloutBatch | None:
        """The first ``target_groups`` accepted groups (None if none was accepted)."""
        held = self.accepted_groups
        if held < self.target_groups:
            warnings.warn(
                f"dynamic sampling: {held}/{self.target_groups} informative groups after "
                f"{self.rounds} round(s) (max_gen_rounds={self.max_rounds}); training on what "
                f"was found (rejected {self.rejected_all_correct} all-correct, "
                f"{self.rejected_all_wrong} all-wrong groups)",
                SamplingWarning,
                stacklevel=2,
            )
        if not self._kept:
            return None
        batch = RolloutBatch.concat(self._kept)
        if held > self.target_groups:
            batch = batch.select(
                torch.arange(self.target_groups * self.group_size), group_size=self.group_size
            )
        return batch

    def metrics(self) -> dict[str, float]:
        """Cost accounting and the rollout metrics over *everything* generated this step."""
        from .metrics import rollout_metrics  # local: metrics imports nothing of ours back

        out = rollout_metrics(
            correct=torch.cat(self._seen.correct) if self._seen.correct else torch.zeros(0, dtype=torch.bool),
            lengths=torch.cat(self._seen.lengths) if self._seen.lengths else torch.zeros(0),
            truncated=torch.cat(self._seen.truncated)
            if self._seen.truncated
            else torch.zeros(0, dtype=torch.bool),
            rewards=torch.cat(self._seen.rewards) if self._seen.rewards else torch.zeros(0),
            group_size=self.group_size,
        )
        out.update(
            sampling_metrics(
                rounds=self.rounds,
                generated_groups=self.generated_groups,
                generated_tokens=self.generated_tokens,
                accepted=self.accepted_groups,
                target=self.target_groups,
                rejected_all_correct=self.rejected_all_correct,
                rejected_all_wrong=self.rejected_all_wrong,
            )
        )
        return out


# ---- dynamic sampling over many ranks ------------------------------------------------------


def trim_round_major(counts: Sequence[Sequence[int]], target: int) -> list[list[int]]:
    """Which accepted groups a global batch keeps: ``counts[r][d]`` groups accepted by rollout
    group ``d`` in round ``r`` -> how many of them are kept, taking the first ``target`` in
    round-major order (round 0's groups of every rank, then round 1's...). On one rank this
    is :meth:`DynamicSampler.take`'s "first ``target_groups`` accepted"."""
    left = max(0, target)
    kept = []
    for row in counts:
        out = []
        for n in row:
            k = min(n, left)
            out.append(k)
            left -= k
        kept.append(out)
    return kept


def balance_groups(tokens: Sequence[int], parts: int) -> list[list[int]]:
    """Split groups (``tokens[i]``: group i's prompt + response tokens) into ``parts`` lists
    of indices whose sizes differ by at most one (the first ``len % parts`` lists hold the
    extra one), balancing the token sums: largest group first, into the lightest list that
    still has room (longest-processing-time with a cardinality bound; verl balances its
    sequence lengths over data-parallel ranks with a Karmarkar-Karp partition for the same
    purpose). Each list is in increasing index order; deterministic."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    n = len(tokens)
    room = [n // parts + (1 if p < n % parts else 0) for p in range(parts)]
    load = [0] * parts
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(n), key=lambda i: (-tokens[i], i)):
        p = min((q for q in range(parts) if len(out[q]) < room[q]), key=lambda q: (load[q], q))
        out[p].append(i)
        load[p] += tokens[i]
    return [sorted(o) for o in out]
