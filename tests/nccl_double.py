"""NCCL's contract on a CPU: a pretend CUDA device and a process group that keeps NCCL's rules.

gloo takes whatever tensor it is given, so code that talks over an NCCL group on GPUs passes
every CPU rehearsal even when NCCL would refuse it (the bridge's size headers were host
tensors: "Tensors must be CUDA and dense" at the first weight send). This double makes the
rules hold on a CPU:

* :class:`FakeCuda` (a torch function mode, per thread): ``torch.empty(..., device="cuda:1")``,
  ``t.to("cuda:1")`` and ``t.cuda()`` give an :class:`OnDevice` tensor, whose ``.device``
  says ``cuda:1`` and whose data lives in host memory; arithmetic on it stays on the device,
  ``.cpu()`` / ``.to("cpu")`` copy it back, ``.numpy()`` and ``.item()`` refuse as they do
  for a CUDA tensor (``item`` is allowed: CUDA allows it, with a sync);
* :class:`NcclRules` (the process group): every tensor of every operation must be an
  :class:`OnDevice` tensor on this member's device and dense; a host tensor gets NCCL's
  error; two members of one group on one device (same host, same device index) are refused
  when the group is built, as NCCL refuses them; the data then moves over gloo.

:func:`nccl_default` makes the same rules the default process group's (a registered Python
backend), with object collectives staged on the current device as NCCL stages them.

* **count and dtype agreement**: NCCL defines one element count and one data type per
  operation, the same on every member (NCCL's *NCCL and MPI* notes: unlike MPI, no different
  send and receive counts or types); a mismatch hangs or delivers garbage on GPUs (a bf16[4]
  broadcast into an fp32[4] "succeeds"). The double exchanges each operation's count and
  dtype first and raises :class:`Mismatch` naming both;
* :class:`StreamOrder`: a model of one stream per device, on which an NCCL kernel blocks until
  every member of its communicator has launched its own; given what each device queued, in
  order, it finds the cycle two communicators used in different orders make (the hang of a
  weight broadcast queued among a tensor-parallel engine's all-reduces at different points).

What it does not imitate: NCCL's asynchrony (ops here complete when ``wait`` returns, as
gloo's do), the watchdog's abort, and FSDP2 on a pretend device.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

NCCL_HOST_TENSOR = "Tensors must be CUDA and dense"
_META_TAG = 1 << 20
"""Added to a point-to-point operation's tag for its (count, dtype) message."""
"""The first words of NCCL's refusal of a host tensor (ProcessGroupNCCL's ``check_gpu_single_tensor``)."""


class OnDevice(torch.Tensor):
    """A tensor on a pretend CUDA device (its data in host memory, as ``inner``)."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor, device: torch.device) -> OnDevice:
        r = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, inner.shape, strides=inner.stride(), dtype=inner.dtype, device=device
        )
        r.inner = inner
        return r

    def __repr__(self) -> str:  # type: ignore[override]
        return f"OnDevice({self.inner!r}, device={self.device})"

    def numpy(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy (copy it to the host first)"
        )

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        devices = {a.device for a in tree_leaves_tensors((args, kwargs)) if isinstance(a, OnDevice)}
        if len(devices) > 1:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found {sorted(map(str, devices))}"
            )
        device = devices.pop()
        to = kwargs.get("device")
        if func is torch.ops.aten._to_copy.default and to is not None:
            rest = {k: v for k, v in kwargs.items() if k != "device"}
            copy = func(args[0].inner, **rest)
            return copy if torch.device(to).type == "cpu" else OnDevice(copy, torch.device(to))
        host = [a for a in tree_leaves_tensors((args, kwargs)) if not isinstance(a, OnDevice) and a.dim() > 0]
        if host:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, {device} and cpu!"
            )

        def unwrap(x: Any) -> Any:
            return x.inner if isinstance(x, OnDevice) else x

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        return tree_map(
            lambda x: (
                OnDevice(x, device) if isinstance(x, torch.Tensor) and not isinstance(x, OnDevice) else x
            ),
            out,
        )


def tree_leaves_tensors(tree: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _cuda(d: Any) -> torch.device | None:
    if d is None or isinstance(d, torch.dtype):
        return None
    try:
        dev = torch.device(d)
    except (RuntimeError, TypeError):
        return None
    return dev if dev.type == "cuda" else None


_SCALARS = (
    torch.Tensor.__index__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__bool__,
    torch.Tensor.item,
    torch.Tensor.tolist,
)


class FakeCuda(TorchFunctionMode):
    """Inside: ``cuda:<index>`` is a device of this process (``index``: ``current_device``)."""

    def __init__(self, index: int = 0):
        super().__init__()
        self.index = index

    def device(self) -> torch.device:
        return torch.device("cuda", self.index)

    def _where(self, d: torch.device) -> torch.device:
        return torch.device("cuda", self.index if d.index is None else d.index)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and isinstance(args[0], OnDevice):
            # indexing builds its index tensors on the tensor's device: do it on the host copy
            def unwrap(x: Any) -> Any:
                return x.inner if isinstance(x, OnDevice) else x

            inner = args[0].inner
            if func is torch.Tensor.__setitem__:
                inner[tree_map(unwrap, args[1])] = unwrap(args[2])
                return None
            return OnDevice(inner[tree_map(unwrap, args[1])], args[0].device)
        if func in (torch.nonzero, torch.Tensor.nonzero) and isinstance(args[0], OnDevice):
            # an output whose size depends on the data (a sync on CUDA): computed on the host copy
            return OnDevice(func(args[0].inner, *args[1:], **kwargs), args[0].device)
        if func in _SCALARS and isinstance(args[0], OnDevice):  # CUDA allows these (a sync)
            return func(args[0].inner, *args[1:], **kwargs)
        to = _cuda(kwargs.get("device"))
        if to is not None and not (args and isinstance(args[0], OnDevice)):
            if func in (torch.Tensor.to, torch.Tensor.cuda):
                return OnDevice(args[0].detach().clone(), self._where(to))
            return OnDevice(func(*args, **dict(kwargs, device="cpu")), self._where(to))
        if func is torch.Tensor.cuda and not isinstance(args[0], OnDevice):
            return OnDevice(
                args[0].detach().clone(), self._where(_cuda(args[1]) if len(args) > 1 else self.device())
            )
        if func is torch.Tensor.to and len(args) > 1 and not isinstance(args[0], OnDevice):
            to = _cuda(args[1])
            if to is not None:
                return OnDevice(args[0].detach().clone(), self._where(to))
        return func(*args, **kwargs)


def _check(tensors: list[torch.Tensor], device: torch.device, op: str) -> list[torch.Tensor]:
    inner = []
    for t in tensors:
        if not isinstance(t, OnDevice) or t.device != device:
            raise dist.DistBackendError(
                f"{NCCL_HOST_TENSOR} (NCCL double: {op} got a tensor on {t.device}; this member's device is {device})"
            )
        if not t.is_contiguous():
            raise dist.DistBackendError(f"{NCCL_HOST_TENSOR} (NCCL double: {op} got a non-contiguous tensor)")
        inner.append(t.inner)
    return inner


class Mismatch(dist.DistBackendError):
    """Members of one NCCL operation disagree on its element count or dtype."""


_DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.uint8,
    torch.int8,
    torch.int32,
    torch.int64,
    torch.bool,
]


def _shape_of(inner: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor(
        [[t.numel(), _DTYPES.index(t.dtype) if t.dtype in _DTYPES else -1] for t in inner], dtype=torch.long
    ).flatten()


def _said(code: torch.Tensor) -> list[str]:
    v = code.tolist()
    return [f"{_DTYPES[v[i + 1]] if v[i + 1] >= 0 else '?'}[{v[i]}]" for i in range(0, len(v), 2)]


class _Both:
    """Two works waited for as one (a send and its (count, dtype) message)."""

    def __init__(self, *works: Any):
        self.works = works

    def wait(self, *args: Any) -> bool:
        return all(w.wait(*args) is not False for w in self.works)

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)


class NcclRules:
    """A process group of the ``torch.distributed.ProcessGroup`` methods the project calls on a
    store-built group (``send``, ``recv``, ``broadcast``, ``allgather``, ``allreduce``,
    ``barrier``), keeping NCCL's rules and moving the data over gloo."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, device: torch.device):
        self.device = device
        me = f"{socket.gethostname()}/{device}"
        store.set(f"nccl-double/device/{rank}", me)
        for r in range(size):
            if r != rank and store.get(f"nccl-double/device/{r}").decode() == me:
                raise dist.DistBackendError(
                    f"Duplicate GPU detected : rank {rank} and rank {r} both on CUDA device {device.index} "
                    "(NCCL double: two members of one communicator on one device)"
                )
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore("nccl-double/", store), rank, size, timeout)

    def size(self) -> int:
        return self.pg.size()

    def rank(self) -> int:
        return self.pg.rank()

    # -- count and dtype agreement: each operation's (count, dtype) exchanged first, on gloo --
    def _agree(self, op: str, inner: list[torch.Tensor]) -> None:
        mine = _shape_of(inner)
        everyone = [torch.empty_like(mine) for _ in range(self.pg.size())]
        self.pg.allgather([everyone], [mine]).wait()
        for r, theirs in enumerate(everyone):
            if not torch.equal(theirs, mine):
                raise Mismatch(
                    f"NCCL double: {op}: rank {self.pg.rank()} has {_said(mine)}, rank {r} has {_said(theirs)} "
                    "(NCCL needs one count and one dtype on every member: a hang or garbage on GPUs)"
                )

    def _agree_pair(self, op: str, inner: list[torch.Tensor], peer: int, tag: int, sending: bool) -> Any:
        mine = _shape_of(inner)
        if sending:  # not waited for here: both sides may send first (batch_isend_irecv)
            return self.pg.send([mine], peer, tag + _META_TAG)
        theirs = torch.empty_like(mine)
        self.pg.recv([theirs], peer, tag + _META_TAG).wait()
        if not torch.equal(theirs, mine):
            raise Mismatch(
                f"NCCL double: {op}: rank {self.pg.rank()} receives into {_said(mine)} what rank {peer} sends as "
                f"{_said(theirs)} (NCCL needs one count and one dtype on both sides: a hang or garbage on GPUs)"
            )

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        inner = _check(tensors, self.device, "send")
        meta = self._agree_pair("send", inner, dst, tag, sending=True)
        return _Both(meta, self.pg.send(inner, dst, tag))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        inner = _check(tensors, self.device, "recv")
        self._agree_pair("recv", inner, src, tag, sending=False)
        return self.pg.recv(inner, src, tag)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        inner = _check(tensors, self.device, "broadcast")
        self._agree("broadcast", inner)
        return self.pg.broadcast(inner, opts)

    def allgather(self, outs: list[list[torch.Tensor]], ins: list[torch.Tensor]) -> Any:
        inner = _check(ins, self.device, "allgather")
        out = [_check(o, self.device, "allgather") for o in outs]
        self._agree("allgather", inner)
        for o in out:
            if any(x.numel() != inner[0].numel() or x.dtype != inner[0].dtype for x in o):
                raise Mismatch(
                    "NCCL double: allgather: an output tensor's count or dtype differs from the input's"
                )
        return self.pg.allgather(out, inner)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        got = _check(tensors, self.device, "allreduce")
        self._agree("allreduce", got)
        return self.pg.allreduce(got) if opts is None else self.pg.allreduce(got, opts)

    def barrier(self, *args: Any) -> Any:
        raise dist.DistBackendError(
            "NCCL double: barrier on a store-built NCCL group guesses a device (ProcessGroupNCCL warns "
            "and may hang); use an all-reduce of a device tensor"
        )


def nccl_group(store: Any, rank: int, size: int, timeout: timedelta) -> tuple[NcclRules, torch.device]:
    """What :func:`scale.dist.bridge._nccl` returns on GPUs, as the double: the group and this
    member's device (the current :class:`FakeCuda`'s)."""
    from torch.overrides import _get_current_function_mode_stack

    modes = [m for m in _get_current_function_mode_stack() if isinstance(m, FakeCuda)]
    if not modes:
        raise RuntimeError("NCCL double: build an NCCL group inside FakeCuda(index) (no CUDA device here)")
    device = modes[-1].device()
    return NcclRules(store, rank, size, timeout, device), device


class NcclDefaultGroup(dist.ProcessGroup):
    """The default process group as NCCL would be (backend ``nccl_double``, :func:`init_default`):
    every operation keeps :class:`NcclRules`, and object collectives (``all_gather_object``)
    stage their bytes on the current device, as they do over NCCL."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        from torch.overrides import _get_current_function_mode_stack

        modes = [m for m in _get_current_function_mode_stack() if isinstance(m, FakeCuda)]
        if not modes:
            raise RuntimeError("NCCL double: init the default group inside FakeCuda(index)")
        self.rules = NcclRules(store, rank, size, timeout, modes[-1].device())

    def getBackendName(self) -> str:
        return "nccl_double"

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self.rules.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self.rules.broadcast(tensors, opts)

    def allgather(self, outs: list[list[torch.Tensor]], ins: list[torch.Tensor], opts: Any = None) -> Any:
        return self.rules.allgather(outs, ins)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        return self.rules.send(tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        return self.rules.recv(tensors, src, tag)

    def barrier(self, opts: Any = None) -> Any:  # NCCL's barrier is an all-reduce on the device
        return self.rules.allreduce([torch.zeros(1, device=self.rules.device)])


@contextmanager
def nccl_default(rank: int, world: int, store: Any, timeout_s: float | None = None) -> Iterator[torch.device]:
    """Inside: this process is on pretend GPU ``rank`` (:class:`FakeCuda`) and the default
    process group is an :class:`NcclDefaultGroup`, with ``torch.cuda.current_device`` and the
    object collectives' staging device as on a GPU run. Yields the device; on the way out the
    group is ended (after a barrier) and everything patched is restored."""
    import torch.distributed.distributed_c10d as c10d

    if "nccl_double" not in dist.Backend.backend_list:
        dist.Backend.register_backend(
            "nccl_double",
            lambda store, rank, size, timeout: NcclDefaultGroup(store, rank, size, timeout),
            devices=["cuda"],
        )
    real_device, real_current = c10d._get_object_coll_device, torch.cuda.current_device
    if timeout_s is None:  # the launch's own (tests/multiproc.py sets it)
        timeout_s = float(os.environ.get("DAPO_DIST_TIMEOUT_S", "30"))

    def object_device(group: Any = None) -> str:
        g = group or c10d._get_default_group()
        return "cuda" if isinstance(g, NcclDefaultGroup) else real_device(group)

    with FakeCuda(rank) as fake:
        c10d._get_object_coll_device = object_device
        torch.cuda.current_device = lambda: int(rank)  # type: ignore[assignment]
        try:
            dist.init_process_group(
                "nccl_double", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
            )
            yield fake.device()
            dist.barrier()
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            c10d._get_object_coll_device = real_device
            torch.cuda.current_device = real_current  # type: ignore[assignment]


class StreamOrder:
    """One stream per device, and NCCL's blocking kernels on it: :meth:`record` what a device
    queues (the communicator of each NCCL operation, in the order it was queued); :meth:`hang`
    runs the queues and says where they stop. An operation runs when it heads the queue of every
    device that is a member of its communicator (every device that queued an operation on it);
    the k-th operation a device queues on a communicator is that communicator's k-th operation
    (NCCL matches them by order). Thread-safe: a test's threads are its devices and processes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queues: dict[str, list[tuple[str, int]]] = defaultdict(list)
        self._count: dict[tuple[str, str], int] = defaultdict(int)

    def record(self, device: str, comm: str) -> None:
        with self.lock:
            k = self._count[device, comm]
            self._count[device, comm] = k + 1
            self.queues[device].append((comm, k))

    def hang(self) -> dict[str, tuple[str, int]] | None:
        """None if every queue runs to its end; else each stuck device's head operation (the
        cycle: each waits for a member whose head is another operation)."""
        with self.lock:
            queues = {d: list(q) for d, q in self.queues.items()}
        members: dict[str, set[str]] = defaultdict(set)
        for d, q in queues.items():
            for comm, _ in q:
                members[comm].add(d)
        pos = dict.fromkeys(queues, 0)
        while True:
            heads = {d: queues[d][pos[d]] for d in queues if pos[d] < len(queues[d])}
            if not heads:
                return None
            ran = False
            for op in set(heads.values()):
                comm = op[0]
                if all(heads.get(d) == op for d in members[comm]):
                    for d in members[comm]:
                        pos[d] += 1
                    ran = True
            if not ran:
                return heads


@contextmanager
def instead_of_gloo(rank: int, world: int) -> Iterator[torch.device]:
    """:func:`nccl_default` in place of the gloo default group a launcher made (tests/multiproc.py),
    on its store. Every rank's gloo mesh is complete before any closes its sockets (a barrier
    first): a rank that destroyed its group while another was still connecting failed that one
    ("Connection closed by peer" in gloo's connectFullMesh, about 1 run in 5 under load)."""
    store = dist.distributed_c10d._get_default_store()
    dist.barrier()
    dist.destroy_process_group()
    with nccl_default(rank, world, dist.PrefixStore("nccl-double/", store)) as device:
        yield device
