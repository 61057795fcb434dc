"""Delta weight sync: send only the elements of each tensor whose bits changed since the
version the generators hold (``rollout.delta_sync``, the disaggregated placement).

Why it pays: the learner keeps fp32 masters and the engine runs in bf16. At the presets'
learning rates (1e-6) an Adam step moves a weight by about ``lr`` (Adam's update is ~``lr``
per element), a relative change of ~1e-6 to ~1e-4 for weights of size 0.01-1, while one bf16
step is 2^-8 = 0.4% of the value: most bf16 values are the same bits after a step. verl's and
slime's delta syncs exploit the same fact.

What is sent, per tensor, after a small plan ``[mode, count]`` (two int64): ``mode`` 0, the
whole tensor (``count`` = its elements); ``mode`` 1, the flat indices of the changed elements
(int32, or int64 past 2^31 elements) then their new values (the tensor's dtype). A delta costs
``count x (4 + itemsize)`` bytes against ``numel x itemsize`` for the whole tensor, so it is
sent only where smaller (:func:`plan`). "Changed" compares bits, not values: -0.0 against 0.0
and a NaN's payload are changes, so the receiver's tensor equals the sender's bit for bit
(:func:`changed`), and by induction every version the generators load equals what a full sync
would have sent.

Both sides hold the previous version's tensors (:class:`Base`): the learner's rank 0 in host
memory (one copy of the model in the engine's dtype), each generator process the version it
received last. A version names the one its delta is against (``base`` in its header); a
receiver that holds another refuses it in one line (:func:`check_base`) rather than apply a
delta to the wrong weights. The first version after a (re)start is sent whole.

Pure tensor functions, no I/O and no process group: :mod:`scale.dist.bridge` sends and
receives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

DENSE, SPARSE = 0, 1
"""The two modes of a tensor's plan."""
PLAN_BYTES = 16
"""A tensor's plan, ``[mode, count]`` as two int64, sent before it."""


@dataclass
class Base:
    """The tensors of the version one side holds, by name (host memory), and its number;
    ``None`` before the first version (everything is sent whole)."""

    version: int | None = None
    tensors: dict[str, Tensor] = field(default_factory=dict)


def index_dtype(numel: int) -> torch.dtype:
    return torch.int32 if numel <= torch.iinfo(torch.int32).max else torch.int64


def _bits(t: Tensor) -> Tensor:
    """The tensor's elements as integers of the same width (bit patterns)."""
    flat = t.detach().contiguous().reshape(-1)
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
    return flat.view(width)


def changed(old: Tensor, new: Tensor) -> Tensor:
    """Flat indices (:func:`index_dtype`) of the elements whose bits differ between ``old``
    and ``new`` (same shape and dtype; ``old`` moved to ``new``'s device)."""
    if old.shape != new.shape or old.dtype != new.dtype:
        raise ValueError(f"delta: {tuple(old.shape)} {old.dtype} against {tuple(new.shape)} {new.dtype}")
    diff = _bits(old.to(new.device)) != _bits(new)
    return torch.nonzero(diff).reshape(-1).to(index_dtype(new.numel()))


def cost(numel: int, count: int, itemsize: int) -> tuple[int, int]:
    """The mode a tensor of ``numel`` elements with ``count`` changed ones is sent in, and the
    bytes that follow its plan: :data:`SPARSE` (an index and a value per changed element)
    where that is fewer than the whole tensor's, else :data:`DENSE`."""
    whole, changes = numel * itemsize, count * (index_dtype(numel).itemsize + itemsize)
    return (SPARSE, changes) if changes < whole else (DENSE, whole)


def plan(numel: int, count: int, itemsize: int) -> int:
    """The mode of :func:`cost`."""
    return cost(numel, count, itemsize)[0]


def apply(old: Tensor, index: Tensor, values: Tensor) -> Tensor:
    """A new tensor: ``old`` with the elements at flat ``index`` set to ``values`` (``old`` is
    not changed: an older version a generator still holds stays as it was)."""
    out = old.detach().clone()
    out.view(-1)[index.to(torch.int64)] = values.to(out.dtype)
    return out


def check_base(head: dict[str, object], held: Base) -> None:
    """Refuse a version whose deltas are against a version this side does not hold."""
    want = head.get("base")
    if want is not None and want != held.version:
        raise RuntimeError(
            f"delta sync: policy version {head.get('version')} is sent as changes to version {want}, "
            f"but this generator holds {held.version if held.version is not None else 'none'}; "
            "a generator must take every version the learner sends (rollout.delta_sync: false sends each whole)"
        )


__all__ = ["DENSE", "PLAN_BYTES", "SPARSE", "Base", "apply", "changed", "check_base", "cost", "index_dtype", "plan"]
