"""The link between the learner and the generator processes of a disaggregated run.

The learner's ranks form the run's own process group (torchrun, FSDP2); the generators are
other processes, each with its own engine, outside that group. They meet in process groups
built straight from a rendezvous store, not from the default group, the way TRL's vLLM
server and verl's disaggregated workers link a trainer to its engines (a
``StatelessProcessGroup``): the learner's rank 0 hosts a ``TCPStore``, every member builds
the group from it with its own rank and size. Three groups, each used by one thread of each
process, so that no two threads ever queue operations on one group:

* ``weights`` (learner rank 0 and every generator): each new policy version, broadcast from
  the learner tensor by tensor (NCCL on GPUs, gloo on CPUs);
* ``batches`` (the same members, gloo): each generator sends its share of a batch to the
  learner's rank 0, point to point;
* ``generators`` (the generators only, gloo): dynamic sampling's per-round reports
  (:class:`scale.rollout.GlobalDynamicSampler`), so that every generator takes the same
  global decisions.

Messages are length-prefixed bytes. Batches and headers travel as ``torch.save`` archives
read with ``weights_only=True``; the sampler's reports travel pickled between the
generators, as ``torch.distributed.all_gather_object`` would carry them.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from .topology import waiting_for

LEARNER = 0
"""The learner's rank 0 in the ``weights`` and ``batches`` groups; generator ``i`` is ``i + 1``."""


@dataclass
class Group:
    """A process group built from a store (not the default group), with the few operations
    the bridge needs. ``rank`` and ``size`` are within the group."""

    pg: Any
    rank: int
    size: int
    device: torch.device

    # -- bytes -----------------------------------------------------------------------
    def send_bytes(self, data: bytes, dst: int, what: str) -> None:
        size = torch.tensor([len(data)], dtype=torch.long)
        payload = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if data
            else torch.empty(0, dtype=torch.uint8)
        )
        with waiting_for(what):
            self.pg.send([size], dst, 0).wait()
            if data:
                self.pg.send([payload], dst, 1).wait()

    def recv_bytes(self, src: int, what: str) -> bytes:
        size = torch.zeros(1, dtype=torch.long)
        with waiting_for(what):
            self.pg.recv([size], src, 0).wait()
            n = int(size.item())
            if not n:
                return b""
            buf = torch.empty(n, dtype=torch.uint8)
            self.pg.recv([buf], src, 1).wait()
        return buf.numpy().tobytes()

    def broadcast_bytes(self, data: bytes | None, root: int, what: str) -> bytes:
        size = torch.tensor([len(data) if data is not None else 0], dtype=torch.long)
        with waiting_for(what):
            self.pg.broadcast([size], _bopts(root)).wait()
            n = int(size.item())
            buf = (
                torch.frombuffer(bytearray(data), dtype=torch.uint8)
                if self.rank == root and data
                else torch.empty(n, dtype=torch.uint8)
            )
            if n:
                self.pg.broadcast([buf], _bopts(root)).wait()
        return buf.numpy().tobytes() if n else b""

    def all_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
        size = torch.tensor([len(data)], dtype=torch.long)
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(self.size)]
        with waiting_for(what):
            self.pg.allgather([sizes], [size]).wait()
            n = max(int(s.item()) for s in sizes)
            mine = torch.zeros(n, dtype=torch.uint8)
            if data:
                mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            out = [torch.empty(n, dtype=torch.uint8) for _ in range(self.size)]
            self.pg.allgather([out], [mine]).wait()
        return [o[: int(s.item())].numpy().tobytes() for o, s in zip(out, sizes)]

    # -- objects -----------------------------------------------------------------------
    def send(self, obj: Any, dst: int, what: str) -> None:
        self.send_bytes(dump(obj), dst, what)

    def recv(self, src: int, what: str) -> Any:
        return load(self.recv_bytes(src, what))

    def broadcast(self, obj: Any, root: int, what: str) -> Any:
        return load(self.broadcast_bytes(dump(obj) if self.rank == root else None, root, what))

    def broadcast_tensor(self, t: torch.Tensor, root: int, what: str) -> None:
        with waiting_for(what):
            self.pg.broadcast([t], _bopts(root)).wait()


def _bopts(root: int) -> Any:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = root
    return opts


def dump(obj: Any) -> bytes:
    """``obj`` (tensors, numbers, strings, lists, dicts) as a ``torch.save`` archive."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def load(data: bytes) -> Any:
    """The inverse of :func:`dump`, with ``weights_only=True`` (no code runs on load)."""
    return torch.load(io.BytesIO(data), weights_only=True)


def digest(named: list[tuple[str, torch.Tensor]]) -> str:
    """A digest of named tensors' names, shapes, dtypes and bytes (the rollout traces: the
    weights a generator loaded against the ones the learner published)."""
    import hashlib

    h = hashlib.sha256()
    for name, t in named:
        t = t.detach().contiguous().cpu()
        h.update(f"{name}:{list(t.shape)}:{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


class PickledComm:
    """:class:`scale.topology.Comm`'s ``all_gather`` over a :class:`Group` (the generators'
    dynamic sampling). The sampler's ``exchange`` is not used across processes here: the
    generators send their kept groups to the learner instead."""

    def __init__(self, group: Group):
        self.group = group

    def all_gather(self, obj: Any, what: str) -> list[Any]:
        if self.group.size == 1:
            return [obj]
        return [pickle.loads(b) for b in self.group.all_gather_bytes(pickle.dumps(obj), what)]


def store(host: str, port: int, *, is_master: bool, members: int, timeout_s: float) -> Any:
    """The bridge's rendezvous store (learner rank 0 hosts it; ``port`` 0: a free one)."""
    import torch.distributed as dist

    return dist.TCPStore(
        host,
        port,
        world_size=members,
        is_master=is_master,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def group(kv: Any, name: str, rank: int, size: int, timeout_s: float, *, backend: str = "gloo") -> Group:
    """The process group ``name`` of ``size`` members built from the store ``kv``."""
    import torch.distributed as dist

    prefixed = dist.PrefixStore(f"dapo-bridge/{name}/", kv)
    if backend == "nccl":  # GPU weights: the learner's rank 0 and each generator's first device
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timedelta(seconds=timeout_s)
        pg = dist.ProcessGroupNCCL(prefixed, rank, size, opts)
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        pg = dist.ProcessGroupGloo(prefixed, rank, size, timedelta(seconds=timeout_s))
        device = torch.device("cpu")
    return Group(pg, rank, size, device)


# ---- weights --------------------------------------------------------------------------------


def send_weights(
    g: Group,
    version: int,
    named: Iterator[tuple[str, torch.Tensor]] | None,
    header: list[tuple[str, list[int], str]],
) -> None:
    """Broadcast policy ``version`` from the learner: a header (version, each tensor's name,
    shape, dtype), then each tensor. ``named`` yields the full tensors in header order (on the
    learner's rank 0); on the learner's other ranks nothing is sent (they only took part in
    gathering the tensors)."""
    g.broadcast({"version": version, "tensors": header}, LEARNER, f"the generators to take version {version}")
    if named is None:
        return
    for name, t in named:
        t = t.contiguous().to(g.device)
        g.broadcast_tensor(t, LEARNER, f"the generators to take {name} of version {version}")


def recv_weights(g: Group, host: bool = True) -> tuple[int, list[tuple[str, torch.Tensor]]]:
    """On a generator: the next version the learner broadcasts, as (version, [(name, tensor)]),
    the tensors in host memory (``host``) to wait there until the engine needs them."""
    head = g.broadcast(None, LEARNER, "the learner's next policy version")
    out = []
    for name, shape, dtype in head["tensors"]:
        t = torch.empty(shape, dtype=getattr(torch, dtype), device=g.device)
        g.broadcast_tensor(t, LEARNER, f"tensor {name} of version {head['version']}")
        out.append((name, t.cpu() if host else t))
    return int(head["version"]), out


__all__ = [
    "LEARNER",
    "Group",
    "PickledComm",
    "dump",
    "group",
    "load",
    "recv_weights",
    "send_weights",
    "store",
]
