"""The data contract between a rollout regime (toy or scale) and the DAPO core."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor


class BatchError(ValueError):
    """A :class:`RolloutBatch` field is malformed. ``field`` names it."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"RolloutBatch.{field_name}: {message}")
        self.field = field_name


_PER_SEQ = ("lengths", "truncated", "correct", "rewards", "group_ids")
_PER_TOKEN = ("old_logp", "mask", "rollout_logp")


@dataclass
class RolloutBatch:
    """B responses, right-padded to T tokens, grouped G at a time (group-major).

    Responses of one prompt are consecutive: rows ``[k*G, (k+1)*G)`` form group k. All
    checks run on construction, so a batch that exists is a batch the core can trust.
    """

    old_logp: Tensor
    """[B, T] float: log-prob of each sampled token under the sampling policy
    (pi_theta_old of Eq. 8), as computed by the trainer. Finite where ``mask``."""
    mask: Tensor
    """[B, T] bool: True on response tokens, False on padding."""
    lengths: Tensor
    """[B] int64: response length in tokens; equals ``mask.sum(1)``."""
    truncated: Tensor
    """[B] bool: the response hit the generation ceiling without EOS."""
    correct: Tensor
    """[B] bool: the verifiable outcome (is_equivalent of Eq. 7). Dynamic sampling filters
    on this, never on ``rewards``."""
    rewards: Tensor
    """[B] float: the shaped reward (Eq. 7 plus the Eq. 13 penalty when enabled)."""
    group_ids: Tensor
    """[B] int64: the prompt each response answers; constant within each group."""
    group_size: int | None
    """G, or None for a sub-batch that need not hold whole groups (a mini-batch)."""
    rollout_logp: Tensor | None = None
    """[B, T] float or None: the rollout engine's log-probs of the same tokens (vLLM), for
    mismatch monitoring and truncated importance sampling."""
    extras: dict[str, Tensor] = field(default_factory=dict)
    """Per-response payload the regime needs to recompute log-probs (token ids, prompt
    ids, ...): tensors whose first dimension is B. Carried through select and concat;
    concat right-pads further dimensions with zeros."""

    def __post_init__(self) -> None:
        _validate(self)

    # -- shape helpers ---------------------------------------------------------------
    @property
    def size(self) -> int:
        """B, the number of responses."""
        return int(self.old_logp.shape[0])

    @property
    def num_groups(self) -> int:
        if self.group_size is None:
            raise BatchError("group_size", "this sub-batch has no group structure")
        return self.size // self.group_size

    # -- structural operations -------------------------------------------------------
    def select(self, index: Tensor | Sequence[int], *, group_size: int | None = None) -> RolloutBatch:
        """The responses at ``index`` (a sub-batch without group structure unless
        ``group_size`` is given and the index keeps whole groups)."""
        idx = torch.as_tensor(index, dtype=torch.long, device=self.old_logp.device)
        values = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "group_size":
                v = group_size
            elif f.name == "extras":
                v = {k: t[idx] for k, t in v.items()}
            elif isinstance(v, Tensor):
                v = v[idx]
            values[f.name] = v
        if group_size is not None:
            return RolloutBatch(**values)
        # A row subset of a validated batch is valid; skip re-validation on this hot path
        # (the update selects every micro-batch).
        sub = object.__new__(RolloutBatch)
        sub.__dict__.update(values)
        return sub

    def groups(self) -> Iterator[RolloutBatch]:
        """Each group as its own batch, in order."""
        g = self.group_size
        if g is None:
            raise BatchError("group_size", "this sub-batch has no group structure")
        for k in range(self.num_groups):
            yield self.select(torch.arange(k * g, (k + 1) * g), group_size=g)

    def to(self, device: torch.device | str) -> RolloutBatch:
        moved = {k: v.to(device) for k, v in self.extras.items()}
        tensors = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), Tensor)
        }
        return replace(self, **tensors, extras=moved)

    @staticmethod
    def concat(batches: Sequence[RolloutBatch]) -> RolloutBatch:
        """Stack batches of whole groups (same G), right-padding the token dimension."""
        if not batches:
            raise BatchError("batches", "concat needs at least one batch")
        g = batches[0].group_size
        if any(b.group_size != g for b in batches):
            raise BatchError("group_size", "concat needs batches with the same group size")
        has_rollout = [b.rollout_logp is not None for b in batches]
        if any(has_rollout) and not all(has_rollout):
            raise BatchError("rollout_logp", "present in some batches of a concat and not in others")
        keys = set(batches[0].extras)
        if any(set(b.extras) != keys for b in batches):
            raise BatchError("extras", "concat needs the same extras keys in every batch")
        values: dict[str, Any] = {}
        for name in _PER_TOKEN:
            if name == "rollout_logp" and not has_rollout[0]:
                values[name] = None
                continue
            values[name] = _pad_cat([getattr(b, name) for b in batches])
        for name in _PER_SEQ:
            values[name] = torch.cat([getattr(b, name) for b in batches])
        values["extras"] = {k: _pad_cat([b.extras[k] for b in batches]) for k in sorted(keys)}
        return RolloutBatch(group_size=g, **values)


def _pad_cat(tensors: list[Tensor]) -> Tensor:
    """Concatenate on dim 0, right-padding every further dim with zeros (False)."""
    if tensors[0].dim() <= 1:
        return torch.cat(tensors)
    shape = [max(t.shape[d] for t in tensors) for d in range(1, tensors[0].dim())]
    out = []
    for t in tensors:
        pad: list[int] = []
        for d in reversed(range(1, t.dim())):
            pad += [0, shape[d - 1] - t.shape[d]]
        out.append(torch.nn.functional.pad(t, pad) if any(pad) else t)
    return torch.cat(out)


def _validate(b: RolloutBatch) -> None:
    def fail(name: str, msg: str) -> None:
        raise BatchError(name, msg)

    for f in fields(b):
        v = getattr(b, f.name)
        if f.name in (*_PER_SEQ, "old_logp", "mask") and not isinstance(v, Tensor):
            fail(f.name, f"must be a torch.Tensor, got {type(v).__name__}")
    if b.old_logp.dim() != 2:
        fail("old_logp", f"must be 2-D [B, T], got shape {tuple(b.old_logp.shape)}")
    if not b.old_logp.is_floating_point():
        fail("old_logp", f"must be floating point, got {b.old_logp.dtype}")
    bsz, t = b.old_logp.shape
    if b.mask.shape != b.old_logp.shape:
        fail("mask", f"shape {tuple(b.mask.shape)} != old_logp shape {(bsz, t)}")
    if b.mask.dtype != torch.bool:
        if not bool(((b.mask == 0) | (b.mask == 1)).all()):
            fail("mask", "values must be 0 or 1")
        b.mask = b.mask.bool()
    for name, want in (
        ("lengths", "int"),
        ("truncated", "bool"),
        ("correct", "bool"),
        ("rewards", "float"),
        ("group_ids", "int"),
    ):
        v = getattr(b, name)
        if v.shape != (bsz,):
            fail(name, f"must have shape [B] = ({bsz},), got {tuple(v.shape)}")
        if want == "bool" and v.dtype != torch.bool:
            fail(name, f"must be torch.bool, got {v.dtype}")
        if want == "int" and (v.is_floating_point() or v.dtype == torch.bool):
            fail(name, f"must be an integer tensor, got {v.dtype}")
        if want == "float" and not v.is_floating_point():
            fail(name, f"must be floating point, got {v.dtype}")
    valid_logp = b.old_logp[b.mask]
    if not bool(torch.isfinite(valid_logp).all()):
        row = int(torch.nonzero(~torch.isfinite(b.old_logp) & b.mask)[0, 0])
        fail("old_logp", f"non-finite value on a response token (row {row})")
    if bool((valid_logp > 1e-4).any()):
        fail("old_logp", "log-probs must be <= 0 on response tokens")
    if b.rollout_logp is not None:
        if not isinstance(b.rollout_logp, Tensor) or b.rollout_logp.shape != b.old_logp.shape:
            fail("rollout_logp", f"must be a tensor of shape {(bsz, t)}")
        if not bool(torch.isfinite(b.rollout_logp[b.mask]).all()):
            fail("rollout_logp", "non-finite value on a response token")
    if not bool(torch.isfinite(b.rewards).all()):
        row = int(torch.nonzero(~torch.isfinite(b.rewards))[0, 0])
        fail("rewards", f"non-finite reward (row {row})")
    counted = b.mask.sum(1)
    if not torch.equal(counted.to(b.lengths.dtype), b.lengths):
        row = int(torch.nonzero(counted.to(b.lengths.dtype) != b.lengths)[0, 0])
        fail("lengths", f"row {row}: length {int(b.lengths[row])} != mask count {int(counted[row])}")
    if b.group_size is not None:
        g = b.group_size
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            fail("group_size", f"must be a positive int or None, got {g!r}")
        if bsz % g != 0:
            fail("group_size", f"B = {bsz} responses is not a multiple of G = {g}")
        ids = b.group_ids.view(-1, g)
        bad = (ids != ids[:, :1]).any(1)
        if bool(bad.any()):
            k = int(torch.nonzero(bad)[0, 0])
            fail(
                "group_ids",
                f"group {k} (rows {k * g}..{k * g + g - 1}) mixes prompts; responses must be group-major",
            )
    for key, v in b.extras.items():
        if not isinstance(v, Tensor) or v.dim() == 0 or v.shape[0] != bsz:
            fail(f"extras[{key!r}]", f"must be a tensor with first dimension B = {bsz}")
