"""Weights from the trainer into the rollout engine, one bounded bucket at a time.

The engine needs full tensors in its own dtype; the trainer holds fp32 masters, sharded
under FSDP2. :func:`stream_weights` walks the LM's state dict in order and yields
``(name, tensor)`` pairs lazily: it all-gathers (``DTensor.full_tensor``) and casts only the
tensors of the current bucket (at most ``bucket_bytes``, or one tensor when a single tensor
is larger), and drops them before gathering the next bucket. Every rank walks the same
names in the same order, so the all-gathers pair up. The engine consumes the stream (one
``reload_weights`` call over the generator in vLLM >= 0.32, or one ``load_weights`` call
per bucket on older vLLM; see :mod:`scale.generator.engines.vllm_engine`).

The tied output layer is sent as ``lm_head.weight`` as well (vLLM's reload would otherwise
keep a stale output layer): a module's state dict names a tied parameter under both of its
names, and the engine refuses a stream without it.

:class:`SyncStats` measures what the issue asks of a sync: seconds, the extra memory the
sync allocated (``peak_bytes``: gathered or cast tensors alive at once; on a GPU the
allocator's peak above its level at the start, whichever is larger) and the largest tensor.
This is the peers' design: verl's ``fsdp_vllm`` sharding manager feeds a generator of full
tensors, TRL gathers one FSDP2 DTensor at a time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .lora import Part, merge, merged_plan

MIB = 1 << 20


@dataclass
class SyncStats:
    """What one sync cost; :meth:`metrics` gives the ``sync/*`` metrics of the step."""

    tensors: int = 0
    bytes: int = 0
    """Bytes handed to the engine (engine dtype)."""
    largest_tensor_bytes: int = 0
    peak_bytes: int = 0
    """Most bytes the sync had allocated at one time (gathered, cast or moved copies)."""
    seconds: float = 0.0
    live: int = field(default=0, repr=False)

    def hold(self, n: int) -> None:
        self.live += n
        self.peak_bytes = max(self.peak_bytes, self.live)

    def release(self, n: int) -> None:
        self.live -= n

    def metrics(self) -> dict[str, float]:
        return {
            "sync/seconds": self.seconds,
            "sync/peak_bytes": float(self.peak_bytes),
            "sync/largest_tensor_bytes": float(self.largest_tensor_bytes),
            "sync/bytes": float(self.bytes),
        }


def _materialise(t: Tensor, dtype: torch.dtype, device: torch.device, stats: SyncStats) -> tuple[Tensor, int]:
    """The full tensor in the engine's dtype and device, and the bytes it newly holds (0 when
    it is the trainer's own storage). A sharded tensor is cast shard by shard first, so the
    all-gather moves and allocates engine-dtype bytes only; transient copies count in
    ``stats``' peak. The shard moves to ``device`` before the all-gather (under
    ``train.fsdp_offload`` it lives in host memory, which NCCL does not serve)."""
    t = t.detach()
    transient = 0
    if hasattr(t, "full_tensor"):  # FSDP2 DTensor: cast the local shard on the device, gather it
        shard = t.to(device=device, dtype=dtype)  # an offloaded shard is a host tensor: NCCL needs it here
        transient = shard.to_local().numel() * shard.to_local().element_size() if shard is not t else 0
        stats.hold(transient)
        t = shard.full_tensor()
        del shard
        stats.release(transient)
        out = t.to(device=device)
        fresh = True
    else:
        out = t.to(device=device, dtype=dtype)
        fresh = out.data_ptr() != t.data_ptr()
    nbytes = out.numel() * out.element_size() if fresh else 0
    stats.hold(nbytes)
    return out, nbytes


def _merged(part: Part, dtype: torch.dtype, device: torch.device, stats: SyncStats) -> tuple[Tensor, int]:
    """A LoRA-adapted weight as the engine needs it: W, A and B gathered (each on its own,
    in the master dtype), ``W + scale * B @ A`` in fp32 (:func:`scale.learner.lora.merge`),
    then cast to ``dtype``; the gathered inputs are dropped before the next tensor."""
    _, w, a, b, scale = part
    assert a is not None and b is not None
    held = 0
    full = []
    for t in (w, a, b):
        x, n = _materialise(t, t.dtype, device, stats)
        full.append(x)
        held += n
    merged = merge(*full, scale)
    stats.hold(merged.numel() * merged.element_size())
    out = merged.to(dtype)
    nbytes = out.numel() * out.element_size()
    if out is not merged:
        stats.hold(nbytes)
        stats.release(merged.numel() * merged.element_size())
    del full, merged
    stats.release(held)
    return out, nbytes


def stream_plan(lm: nn.Module) -> list[Part]:
    """What :func:`stream_weights` sends, in its order: ``(name, W, A, B, scale)`` per engine
    tensor, from ``lm``'s state dict (nothing gathered; see :func:`scale.learner.lora.merged_plan`)."""
    return list(merged_plan(lm))


def stream_weights(
    lm: nn.Module,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    bucket_bytes: int,
    stats: SyncStats | None = None,
) -> Iterator[tuple[str, Tensor]]:
    """Every tensor of ``lm``'s state dict (a transformers causal LM, possibly FSDP2-sharded)
    in checkpoint naming, full and in ``dtype`` on ``device``, gathered one bucket at a time (a
    bucket closes before the tensor that would take it past ``bucket_bytes``). A state dict
    holds a tied output layer under its own name too (``lm_head.weight``), so the engine gets it.

    A LoRA policy (``model.lora``, :mod:`scale.learner.lora`) is streamed as the base model's
    tensors under the base model's names, each adapted weight merged (``W + (alpha/r) B A``,
    fp32, then ``dtype``): the engine never sees an adapter."""
    stats = stats if stats is not None else SyncStats()
    device = torch.device(device)
    plan = stream_plan(lm)
    i = 0
    while i < len(plan):
        bucket: list[tuple[str, Tensor]] = []
        held = size = 0
        while i < len(plan) and (not bucket or size + plan[i][1].numel() * dtype.itemsize <= bucket_bytes):
            name, w, a, _, _ = plan[i]
            if a is None:
                full, fresh = _materialise(w, dtype, device, stats)
            else:
                full, fresh = _merged(plan[i], dtype, device, stats)
            held += fresh
            size += full.numel() * full.element_size()
            bucket.append((name, full))
            i += 1
        for name, full in bucket:
            nbytes = full.numel() * full.element_size()
            stats.tensors += 1
            stats.bytes += nbytes
            stats.largest_tensor_bytes = max(stats.largest_tensor_bytes, nbytes)
            yield name, full
        del bucket, full
        stats.release(held)


class PeakMemory:
    """The accelerator allocator's peak above its level at entry (bytes; 0 on a CPU, where
    :class:`SyncStats` accounting is the measure)."""

    def __enter__(self) -> PeakMemory:
        self.peak = 0
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            torch.cuda.synchronize()
            self.start = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = max(0, torch.cuda.max_memory_allocated() - self.start)


def sync(
    engine, lm: nn.Module, *, dtype: torch.dtype, device: torch.device | str, bucket_mb: float
) -> SyncStats:  # type: ignore[no-untyped-def]
    """Stream ``lm``'s weights into ``engine`` (see :func:`stream_weights`) and measure it."""
    stats = SyncStats()
    t0 = time.perf_counter()
    with PeakMemory() as peak:
        engine.sync_weights(
            stream_weights(lm, dtype=dtype, device=device, bucket_bytes=int(bucket_mb * MIB), stats=stats)
        )
    stats.seconds = time.perf_counter() - t0
    stats.peak_bytes = max(stats.peak_bytes, peak.peak)
    return stats
