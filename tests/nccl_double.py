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

What it does not imitate: NCCL's asynchrony (ops here complete when ``wait`` returns, as
gloo's do), stream semantics, the watchdog's abort, and the ``ncclInvalidUsage`` of
mismatched collectives across members (gloo reports those its own way).
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

NCCL_HOST_TENSOR = "Tensors must be CUDA and dense"
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

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        return self.pg.send(_check(tensors, self.device, "send"), dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        return self.pg.recv(_check(tensors, self.device, "recv"), src, tag)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self.pg.broadcast(_check(tensors, self.device, "broadcast"), opts)

    def allgather(self, outs: list[list[torch.Tensor]], ins: list[torch.Tensor]) -> Any:
        return self.pg.allgather(
            [_check(o, self.device, "allgather") for o in outs], _check(ins, self.device, "allgather")
        )

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        got = _check(tensors, self.device, "allreduce")
        return self.pg.allreduce(got) if opts is None else self.pg.allreduce(got, opts)

    def barrier(self, *args: Any) -> Any:
        raise dist.DistBackendError(
            "NCCL double: barrier on a store-built NCCL group guesses a device (ProcessGroupNCCL warns "
            "and may hang); use an all-reduce of a device tensor"
        )


def nccl_group(store: Any, rank: int, size: int, timeout: timedelta) -> tuple[NcclRules, torch.device]:
    """What :func:`scale.bridge._nccl` returns on GPUs, as the double: the group and this
    member's device (the current :class:`FakeCuda`'s)."""
    from torch.overrides import _get_current_function_mode_stack

    modes = [m for m in _get_current_function_mode_stack() if isinstance(m, FakeCuda)]
    if not modes:
        raise RuntimeError("NCCL double: build an NCCL group inside FakeCuda(index) (no CUDA device here)")
    device = modes[-1].device()
    return NcclRules(store, rank, size, timeout, device), device
