"""A run-time check that every collective runs on the compute device.

NCCL serves CUDA tensors only: a broadcast, all-gather or all-reduce over a host tensor fails
("No backend type associated with device type cpu"), and under ``train.fsdp_offload`` the
sharded parameters, their gradients and the optimizer state *are* host tensors. gloo serves
both, so a CPU rehearsal never sees the mistake. :class:`CollectiveDeviceCheck` makes the
rule explicit wherever it runs: while it is active, every ``c10d`` and functional-collective
operator (the ones ``torch.distributed``, DTensor and FSDP2 all dispatch to) is inspected
before it runs, and one whose tensors are not on the compute device raises
:class:`CollectiveDeviceError` naming the operator and the devices, instead of NCCL's error
from deep inside a DTensor op.

It is on when ``$DAPO_CHECK_COLLECTIVES=1`` (``python -m scale.rehearsal`` and
``benchmarks/gpu_check.py`` set it): a ``TorchDispatchMode`` sees every operator, which slows
training, so it is not on by default. Dispatch modes are per thread; the weight sync's side
thread enters its own (:func:`scale.generator.engines.vllm_engine.VLLMEngine.sync_weights`).

What a CPU run can and cannot show: on a CPU the compute device *is* the host, so the check
passes there whatever the placement; it proves that the check sees every collective of a
training step and raises nothing spurious. A host tensor reaching a collective on a GPU run
is what it catches, in the GPU check.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ENV = "DAPO_CHECK_COLLECTIVES"
NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
"""Operator namespaces of collectives (process-group ops and functional collectives)."""


class CollectiveDeviceError(RuntimeError):
    """A collective was issued with tensors on a device other than the compute device."""


def _tensors(args: Any, kwargs: Any) -> list[torch.Tensor]:
    return [a for a in tree_leaves((args, kwargs or {})) if isinstance(a, torch.Tensor)]


class CollectiveDeviceCheck(TorchDispatchMode):
    """Raise :class:`CollectiveDeviceError` before a collective whose tensors are not all on
    ``device`` (compared by device type: a rank's collectives use its own CUDA device, which
    NCCL has bound). ``seen`` counts the collectives inspected, by operator name."""

    def __init__(self, device: torch.device | str):
        super().__init__()
        self.device = torch.device(device)
        self.seen: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func.namespace in NAMESPACES:
            name = f"{func.namespace}.{func._opname}"
            self.seen[name] = self.seen.get(name, 0) + 1
            wrong = sorted(
                {str(t.device) for t in _tensors(args, kwargs) if t.device.type != self.device.type}
            )
            if wrong:
                raise CollectiveDeviceError(
                    f"collective {name} on tensors on {', '.join(wrong)}, not on the compute device "
                    f"{self.device}: NCCL serves only CUDA tensors, so this fails on GPUs (move the "
                    "tensor to the device before the collective)"
                )
        return func(*args, **(kwargs or {}))


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def compute_device() -> torch.device:
    """This rank's compute device as the launcher assigns it: ``cuda:$LOCAL_RANK`` where CUDA
    is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def checked(device: torch.device | str) -> AbstractContextManager[Any]:
    """The check for ``device`` when ``$DAPO_CHECK_COLLECTIVES`` is set, else nothing."""
    return CollectiveDeviceCheck(device) if enabled() else nullcontext()
