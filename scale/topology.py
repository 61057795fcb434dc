"""Process groups of the full regime: created with a bounded timeout, torn down so that no
communication thread runs on into interpreter shutdown.

Every multi-process entry point shares this lifecycle: ``dapo train`` under torchrun and
the multi-process tests (``tests/multiproc.py``). Rank arithmetic (data- and
tensor-parallel groups) belongs here as well when the full regime grows it.

Why teardown needs care (the cause of the SIGABRT at exit in CI)
----------------------------------------------------------------
``torch.distributed.destroy_process_group()`` only removes a group from torch's registry.
The gloo backend's threads (``pt_gloo_runloop`` workers and the ``gloo_tcp_loop`` device
loop) stop when the *last* reference to the group is released, and two references
routinely outlive the call:

* a DDP- or FSDP-wrapped module (its reducer holds the group), kept by the caller or by
  accelerate's list of prepared models;
* ``torch.distributed.nn.functional``, whose collectives declare ``group=group.WORLD`` as
  a default argument. Python evaluates defaults when the module is first imported, and
  creating the first optimizer imports it (through ``torch._dynamo``). If that happens
  after ``init_process_group``, the default pins the group for the life of the process.

Either way the gloo threads are still running when the interpreter finalizes, and what
they touch then is no longer alive: a thread that needs the GIL during finalization is ended
by CPython (``pthread_exit``), and a forced unwind through a ``noexcept`` C++ frame calls
``std::terminate``, which prints "terminate called without an active exception" and raises
SIGABRT (PyTorch describes the same crash for gloo work held at exit in pytorch#179291).
Whether a thread is caught in that window depends on scheduling, so the test died rarely,
more often under load, and ``barrier()`` before ``destroy_process_group()`` did not help: the
group was never freed. The fix frees it: :func:`preload_collective_modules` before the group
exists, drop the wrapped modules, then :func:`shutdown`, which returns any gloo thread that
survives so that callers can fail loudly instead of leaving it to chance.
"""

from __future__ import annotations

import gc
import os
from datetime import timedelta

GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")
"""Thread names of a live gloo process group (worker threads and the TCP device loop)."""

DIST_TIMEOUT_ENV = "DAPO_DIST_TIMEOUT_S"
"""Environment variable that overrides the process-group timeout (seconds)."""


def preload_collective_modules() -> None:
    """Import, before any process group exists, the torch modules that would otherwise
    capture the default group in a default argument when first imported
    (``torch.distributed.nn.functional``: ``group=group.WORLD``). Call it before
    ``init_process_group`` or ``accelerate.Accelerator()``."""
    import torch.distributed.nn  # noqa: F401


def dist_timeout(default_s: float) -> timedelta:
    """The process-group timeout: ``$DAPO_DIST_TIMEOUT_S`` when set, else ``default_s``.
    A collective whose peer died or hangs fails after this long instead of gloo's or
    NCCL's default of 10-30 minutes."""
    raw = os.environ.get(DIST_TIMEOUT_ENV)
    if raw is None:
        return timedelta(seconds=default_s)
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"{DIST_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if not seconds > 0:
        raise ValueError(f"{DIST_TIMEOUT_ENV}={raw!r} must be > 0 seconds")
    return timedelta(seconds=seconds)


def communication_threads() -> list[str]:
    """Names of this process's live gloo threads, read from ``/proc/self/task`` (Linux);
    an empty list where that is not available."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    names = []
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended while we looked
            continue
        if name.startswith(GLOO_THREADS):
            names.append(name)
    return sorted(names)


def shutdown() -> list[str]:
    """Tear the default process group down for good and return the gloo threads that
    survive it (an empty list when the group is really gone).

    Waits for every rank first (no rank leaves while another still talks), destroys the
    group, and collects garbage so that reference cycles release it. Callers drop what
    holds the group before calling: wrapped modules and their optimizers, and accelerate's
    prepared objects (``Accelerator.free_memory()``). A no-op on a single process."""
    import torch.distributed as dist

    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    gc.collect()
    return communication_threads()
