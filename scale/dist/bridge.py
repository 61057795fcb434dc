"""The link between the learner and the generator processes of a disaggregated run.

The learner's ranks form the run's own process group (torchrun, FSDP2); the generators are
other processes, each with its own engine, outside that group. They meet in process groups
built straight from a rendezvous store, not from the default group, the way TRL's vLLM
server and verl's disaggregated workers link a trainer to its engines (a
``StatelessProcessGroup``): the learner's rank 0 hosts a ``TCPStore``, every member builds
the group from it with its own rank and size. Three groups, each used by one thread of each
process, so that no two threads ever queue operations on one group:

* ``weights`` (learner rank 0 and every generator process: a tensor-parallel generator's
  processes all take each version into their part of the engine): each new policy version,
  broadcast from the learner tensor by tensor (NCCL on GPUs, gloo on CPUs);
* ``batches`` (the same members, gloo): each generator's first process sends its share of a
  batch to the learner's rank 0, point to point;
* ``generators`` (the generator processes only, gloo): dynamic sampling's per-round reports
  (:class:`scale.generator.rollout.GlobalDynamicSampler`), so that every generator takes the same
  global decisions.

Only tensors travel over the weights group, each on the group's device (NCCL refuses a host
tensor: "Tensors must be CUDA and dense"); everything else goes out of band, through the
store: the start message, each version's header (names, shapes, dtypes; as TRL's trainer
sends them over HTTP), and the keys that say a batch or a generator is ready. Every wait
across the learner/generator boundary (a generation round, a training step, an engine being
built) is a poll of a store key on the host (:meth:`Group.wait`), never a collective that
``train.dist_timeout_s`` or NCCL's watchdog would abort; a collective starts only once the
other side is known to be ready to take part. Batches travel as length-prefixed
``torch.save`` archives read with ``weights_only=True``; the sampler's reports travel
pickled between the generators, as ``torch.distributed.all_gather_object`` would carry them.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from . import delta
from .topology import await_ranks, poll, waiting_for

LEARNER = 0
"""The learner's rank 0 in the ``weights`` and ``batches`` groups; generator ``i`` is ``i + 1``."""


@dataclass
class Group:
    """A process group built from a store (not the default group), with the few operations
    the bridge needs. ``rank`` and ``size`` are within the group; ``device`` is where its
    tensors must be (NCCL: this member's GPU, never the host; gloo: the host); ``kv`` is the
    group's own namespace of the rendezvous store, for what travels out of band."""

    pg: Any
    rank: int
    size: int
    device: torch.device
    kv: Any = None
    held: delta.Base | None = None
    """``rollout.delta_sync`` on the weights group: the version this member sent or received
    last (:mod:`scale.dist.delta`); None sends every version whole."""

    # -- host waits --------------------------------------------------------------------
    def post(self, key: str, data: bytes = b"") -> None:
        """Put ``key`` in the store (a message out of band, or a sign that something is ready)."""
        self.kv.set(key, data)

    def wait(self, key: str, what: str, alive: Callable[[], None] | None = None) -> bytes:
        """Wait on the host until ``key`` is in the store, however long that takes, and return
        its value. A wait across the learner/generator boundary lasts a generation round or a
        training step, which can be longer than any collective timeout: it is done here,
        never inside a collective. Long waits are reported (:func:`scale.dist.topology.waiting_for`);
        ``alive()`` raises if the other side has died (polled about once a second)."""
        poll(lambda: self.kv.check([key]), what, alive)
        return bytes(self.kv.get(key))

    # -- bytes -----------------------------------------------------------------------
    def _size(self, n: int) -> torch.Tensor:
        return torch.tensor([n], dtype=torch.long).to(self.device)

    def _payload(self, data: bytes) -> torch.Tensor:
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)

    def send_bytes(self, data: bytes, dst: int, what: str) -> None:
        with waiting_for(what):
            self.pg.send([self._size(len(data))], dst, 0).wait()
            if data:
                self.pg.send([self._payload(data)], dst, 1).wait()

    def recv_bytes(self, src: int, what: str) -> bytes:
        size = self._size(0)
        with waiting_for(what):
            self.pg.recv([size], src, 0).wait()
            n = int(size.item())
            if not n:
                return b""
            buf = torch.empty(n, dtype=torch.uint8, device=self.device)
            self.pg.recv([buf], src, 1).wait()
        return _host_bytes(buf)

    def broadcast_bytes(self, data: bytes | None, root: int, what: str) -> bytes:
        size = self._size(len(data) if data is not None else 0)
        with waiting_for(what):
            self.pg.broadcast([size], _bopts(root)).wait()
            n = int(size.item())
            if not n:
                return b""
            buf = (
                self._payload(data)
                if self.rank == root and data
                else torch.empty(n, dtype=torch.uint8, device=self.device)
            )
            self.pg.broadcast([buf], _bopts(root)).wait()
        return _host_bytes(buf)

    def all_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
        sizes = [self._size(0) for _ in range(self.size)]
        with waiting_for(what):
            self.pg.allgather([sizes], [self._size(len(data))]).wait()
            lengths = [int(s.item()) for s in sizes]
            n = max(lengths)
            mine = torch.zeros(n, dtype=torch.uint8)
            if data:
                mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            out = [torch.empty(n, dtype=torch.uint8, device=self.device) for _ in range(self.size)]
            self.pg.allgather([out], [mine.to(self.device)]).wait()
        return [_host_bytes(o)[:k] for o, k in zip(out, lengths)]

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


def _host_bytes(t: torch.Tensor) -> bytes:
    return t.cpu().numpy().tobytes()


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
    """:class:`scale.dist.topology.Comm`'s ``all_gather`` over a :class:`Group` (the generators'
    dynamic sampling). The sampler's ``exchange`` is not used across processes here: the
    generators send their kept groups to the learner instead.

    Each all-gather ends a generation round, and one generator's round can be longer than
    another's by more than ``train.dist_timeout_s`` (a longer response, a slower GPU): every
    member first says in the store that it has arrived and waits on the host for the others
    (:func:`scale.dist.topology.await_ranks`), so the collective starts only once all are there."""

    def __init__(self, group: Group):
        self.group = group
        self.calls = 0

    def all_gather(self, obj: Any, what: str) -> list[Any]:
        if self.group.size == 1:
            return [obj]
        n, self.calls = self.calls, self.calls + 1
        g = self.group
        await_ranks(g.kv, f"gather/{n}", g.rank, g.size, f"the other generators to finish {what}")
        return [pickle.loads(b) for b in g.all_gather_bytes(pickle.dumps(obj), what)]


def store(host: str, port: int, *, is_master: bool, members: int | None, timeout_s: float) -> Any:
    """The bridge's rendezvous store (learner rank 0 hosts it; ``port`` 0: a free one), or a
    client of any store (``members`` None: a launcher's, whose size is not ours to say)."""
    import torch.distributed as dist

    return dist.TCPStore(
        host,
        port,
        world_size=members,
        is_master=is_master,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def _nccl(store: Any, rank: int, size: int, timeout: timedelta) -> tuple[Any, torch.device]:
    """An NCCL group of ``size`` members from ``store``, and this member's device (its current
    CUDA device). The unit tests replace this with a double that keeps NCCL's rules on a CPU
    (``tests/nccl_double.py``)."""
    import torch.distributed as dist

    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, size, opts), torch.device("cuda", torch.cuda.current_device())


def group(
    kv: Any,
    name: str,
    rank: int,
    size: int,
    timeout_s: float,
    *,
    backend: str = "gloo",
    alive: Callable[[], None] | None = None,
) -> Group:
    """The process group ``name`` of ``size`` members built from the store ``kv``, once every
    member has arrived: each says so in the store and waits on the host for the others
    (``alive()`` raises if one has died), so that a member still starting (importing, loading a
    tokenizer on a loaded node) costs a wait, not a construction that gives up after
    ``timeout_s``. ``timeout_s`` then bounds the group's collectives."""
    import torch.distributed as dist

    await_ranks(
        kv, f"dapo-bridge/{name}/arrived", rank, size, f"the {size} members of the bridge's {name} group to start", alive=alive
    )
    prefixed = dist.PrefixStore(f"dapo-bridge/{name}/", kv)
    keys = dist.PrefixStore(f"dapo-bridge/{name}/keys/", kv)
    if backend == "nccl":  # GPU weights: the learner's rank 0 and each generator's first device
        pg, device = _nccl(prefixed, rank, size, timedelta(seconds=timeout_s))
    else:
        pg = dist.ProcessGroupGloo(prefixed, rank, size, timedelta(seconds=timeout_s))
        device = torch.device("cpu")
    return Group(pg, rank, size, device, keys)


# ---- weights --------------------------------------------------------------------------------


def send_weights(
    g: Group,
    version: int,
    named: Iterator[tuple[str, torch.Tensor]] | None,
    header: list[tuple[str, list[int], str]],
) -> dict[str, int]:
    """Send policy ``version`` from the learner's rank 0: its header (each tensor's name, shape
    and dtype) out of band, in the store, then each tensor broadcast from the group's device.
    ``named`` yields the full tensors in header order. The generators wait for the header on
    the host (:func:`recv_weights`), so no member waits inside the broadcast for longer than
    it takes to send. With ``g.held`` (``rollout.delta_sync``), each tensor is sent as the
    changes to the version sent before, where that is smaller (:mod:`scale.dist.delta`).

    Returns what was sent: ``elements`` and ``bytes`` of the full tensors, ``changed``
    elements (bits differing from the version before; all of them without one) and
    ``sent_bytes`` broadcast (plans, indices and values included)."""
    held = g.held
    head: dict[str, Any] = {"version": version, "tensors": header}
    if held is not None:
        head.update(delta=True, base=held.version)
    g.post(f"version/{version}", dump(head))
    sent = {"elements": 0, "bytes": 0, "changed": 0, "sent_bytes": 0}
    if named is None:
        return sent
    kept: dict[str, torch.Tensor] = {}
    for name, t in named:
        t = t.contiguous().to(g.device)
        numel, full = t.numel(), t.numel() * t.element_size()
        sent["elements"] += numel
        sent["bytes"] += full
        what = f"the generators to take {name} of version {version}"
        if held is None:
            g.broadcast_tensor(t, LEARNER, what)
            sent["changed"] += numel
            sent["sent_bytes"] += full
            continue
        old = held.tensors.get(name)
        index = delta.changed(old, t) if old is not None and old.shape == t.shape and old.dtype == t.dtype else None
        count = numel if index is None else index.numel()
        mode, payload = (delta.DENSE, full) if index is None else delta.cost(numel, count, t.element_size())
        g.broadcast_tensor(torch.tensor([mode, count if mode else numel], device=g.device), LEARNER, what)
        sent["changed"] += count
        sent["sent_bytes"] += delta.PLAN_BYTES + payload
        if mode == delta.DENSE:
            g.broadcast_tensor(t, LEARNER, what)
        elif count:
            assert index is not None
            g.broadcast_tensor(index, LEARNER, what)
            g.broadcast_tensor(t.reshape(-1)[index.to(torch.int64)].contiguous(), LEARNER, what)
        kept[name] = t.detach().to("cpu", copy=True)  # never the trainer's own storage
    if held is not None:
        held.tensors, held.version = kept, version
    return sent


def recv_weights(
    g: Group, version: int, host: bool = True, alive: Callable[[], None] | None = None
) -> list[tuple[str, torch.Tensor]]:
    """On a generator: policy ``version`` as the learner sends it, as [(name, tensor)], the
    tensors in host memory (``host``) to wait there until the engine needs them. The wait for
    the learner to reach this version (a training step or more) is on the host. A version sent
    as changes (``rollout.delta_sync``) is applied to the one this generator received last
    (``g.held``), which it must hold (:func:`scale.dist.delta.check_base`)."""
    head = load(g.wait(f"version/{version}", f"the learner's policy version {version}", alive))
    held = g.held
    if head.get("delta"):
        if held is None:
            raise RuntimeError(
                f"delta sync: the learner sends policy version {version} as changes, but this generator "
                "was started without rollout.delta_sync"
            )
        delta.check_base(head, held)
    out, kept = [], {}
    for name, shape, dtype in head["tensors"]:
        dt = getattr(torch, dtype)
        what = f"tensor {name} of version {version}"
        if not head.get("delta"):
            t = torch.empty(shape, dtype=dt, device=g.device)
            g.broadcast_tensor(t, LEARNER, what)
            out.append((name, t.cpu() if host else t))
            continue
        assert held is not None
        plan = torch.empty(2, dtype=torch.int64, device=g.device)
        g.broadcast_tensor(plan, LEARNER, what)
        mode, count = (int(x) for x in plan.tolist())
        if mode == delta.DENSE:
            t = torch.empty(shape, dtype=dt, device=g.device)
            g.broadcast_tensor(t, LEARNER, what)
        else:
            numel = int(torch.Size(shape).numel())
            index = torch.empty(count, dtype=delta.index_dtype(numel), device=g.device)
            values = torch.empty(count, dtype=dt, device=g.device)
            if count:
                g.broadcast_tensor(index, LEARNER, what)
                g.broadcast_tensor(values, LEARNER, what)
            t = delta.apply(held.tensors[name].to(g.device), index, values)
        kept[name] = t.cpu()
        out.append((name, kept[name] if host else t))
    if head.get("delta"):
        assert held is not None
        held.tensors, held.version = kept, version
    return out


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
