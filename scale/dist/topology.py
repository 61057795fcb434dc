"""Process groups of the full regime: created with a bounded timeout, torn down so that no
communication thread runs on into interpreter shutdown.

Every multi-process entry point shares this lifecycle: ``dapo train`` under torchrun,
accelerate or SLURM (:func:`make_accelerator`: the group with ``train.dist_timeout_s``), and
the multi-process tests (``tests/multiproc.py``). The small collectives the trainer needs
(:func:`barrier`, :func:`all_max`) live here too, so that rank arithmetic stays in one place.

Why teardown needs care (the cause of the SIGABRT at exit in CI)
----------------------------------------------------------------
``torch.distributed.destroy_process_group()`` only removes a group from torch's registry.
The gloo backend's threads (``pt_gloo_runloop`` workers and the ``gloo_tcp_loop`` device
loop) stop when the *last* reference to the group is released, and three references
routinely outlive the call:

* a DDP- or FSDP-wrapped module (its reducer holds the group), kept by the caller or by
  accelerate's list of prepared models;
* ``torch.distributed.nn.functional``, whose collectives declare ``group=group.WORLD`` as
  a default argument. Python evaluates defaults when the module is first imported, and
  creating the first optimizer imports it (through ``torch._dynamo``). If that happens
  after ``init_process_group``, the default pins the group for the life of the process;
* under FSDP2, the ``DeviceMesh`` (its ``_pg_registry`` holds the group), kept by DTensor's
  memo caches once every module, parameter and optimizer is gone. The one that pinned it
  here: ``MeshTopoInfo.build_from_mesh`` in ``torch.distributed.tensor._collective_utils``,
  a class-level ``@staticmethod @lru_cache(None)`` keyed by the mesh (its value holds the
  mesh too), filled by ``redistribute_cost`` whenever DTensor ranks sharding strategies;
  ``clip_grad_norm_`` over the sharded gradients (the norm's reduction) is the first such
  op in a training step. A cleaner that looks only at module-level caches misses it.

Any of them keeps the gloo threads running when the interpreter finalizes, and what
they touch then is no longer alive: a thread that needs the GIL during finalization is ended
by CPython (``pthread_exit``), and a forced unwind through a ``noexcept`` C++ frame calls
``std::terminate``, which prints "terminate called without an active exception" and raises
SIGABRT (PyTorch describes the same crash for gloo work held at exit in pytorch#179291).
Whether a thread is caught in that window depends on scheduling, so the test died rarely,
more often under load, and ``barrier()`` before ``destroy_process_group()`` did not help: the
group was never freed. The fix frees it: :func:`preload_collective_modules` before the group
exists, drop the wrapped modules, then :func:`shutdown`, which clears DTensor's caches
(:func:`_clear_dtensor_caches`) and returns any gloo thread that survives so that callers
can fail loudly instead of leaving it to chance.
"""

from __future__ import annotations

import gc
import itertools
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

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


def make_accelerator(cfg: Any) -> Any:
    """The run's ``Accelerator``: on a machine without CUDA, CPU processes over gloo (accelerate
    would otherwise run them as unrelated single processes); the group built within
    ``train.startup_timeout_s`` (ranks arrive as their imports finish, seconds apart on a
    loaded node), then its collectives bounded by ``train.dist_timeout_s``
    (``$DAPO_DIST_TIMEOUT_S`` overrides; :func:`bound_collectives`); accelerate's bf16 autocast
    unless FSDP2 shards over several processes (it then casts through its own mixed-precision
    policy, :mod:`scale.learner.sharding`; one process has nothing to shard and runs unwrapped)."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    t = cfg.train
    fsdp2 = t.sharding == "fsdp2" and int(os.environ.get("WORLD_SIZE", "1")) > 1
    collectives = dist_timeout(t.dist_timeout_s)
    init_restarted_group(max(collectives, timedelta(seconds=t.startup_timeout_s)))
    acc = Accelerator(
        cpu=not torch.cuda.is_available(),
        mixed_precision="no" if fsdp2 else t.mixed_precision,
        log_with=list(cfg.output.trackers) or None,
        project_dir=cfg.output.dir,
        kwargs_handlers=[
            InitProcessGroupKwargs(timeout=max(collectives, timedelta(seconds=t.startup_timeout_s)))
        ],
    )
    bound_collectives(collectives)
    return acc


def init_restarted_group(timeout: timedelta) -> bool:
    """The default process group of an attempt torchrun restarted while its workers share the
    agent's store, keyed by the attempt (returns whether it built it; accelerate then uses it).

    Such a store outlives the attempts: a restarted group's ranks would read the dead attempt's
    addresses from it and fail to connect (gloo's connectFullMesh, refused on every restart
    here; NCCL's unique id in pytorch/pytorch#135712). torchrun keys the store by attempt only
    when it makes a new one, which a static rendezvous (accelerate's multi-node config, torchrun
    with ``--node-rank``) never does, and a c10d one does not while it shares its store (its
    default; ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` makes each attempt's rank 0 host one).
    Every agent restarts its workers once per failure of the group, so the attempt is the same
    on every rank. The first attempt is left to accelerate, as before."""
    import torch
    import torch.distributed as dist

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if (
        os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        or attempt in ("", "0")
        or dist.is_initialized()
    ):
        return False
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    dist.init_process_group(
        "nccl" if torch.cuda.is_available() else "gloo",
        store=dist.PrefixStore(f"dapo/attempt_{attempt}/", store),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timeout,
    )
    return True


def bound_collectives(timeout: timedelta) -> None:
    """From now on the default group's collectives give up after ``timeout`` (gloo and NCCL
    alike; torch's ``_set_pg_timeout``). The group was built with a longer bound, the time
    the ranks may take to arrive, which is not the time a collective may hang."""
    import torch.distributed.distributed_c10d as c10d

    if _initialized():
        c10d._set_pg_timeout(timeout)


def _initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    """Wait for every rank (a no-op on one process)."""
    import torch.distributed as dist

    if _initialized():
        dist.barrier()


def announce(key: str) -> None:
    """Put ``key`` in the default group's store (the launcher's), for :func:`wait_announced`
    on the other ranks (a no-op on one process)."""
    import torch.distributed.distributed_c10d as c10d

    if _initialized():
        c10d._get_default_store().set(f"dapo/{key}", b"")


def wait_announced(key: str, what: str) -> None:
    """Wait on the host until some rank has :func:`announce`d ``key``: a wait that may last a
    generation round (rank 0 waiting for the generators) is done here rather than inside a
    collective that ``train.dist_timeout_s`` would cut short. Reported when long
    (:func:`waiting_for`); a rank that dies ends the job through the launcher and the heartbeat."""
    import torch.distributed.distributed_c10d as c10d

    if not _initialized():
        return
    kv = c10d._get_default_store()
    poll(lambda: kv.check([f"dapo/{key}"]), what)


def poll(ready: Callable[[], bool], what: str, alive: Callable[[], None] | None = None) -> None:
    """Wait on the host until ``ready()``, however long that takes (checks from 5 ms apart,
    doubling to 1 s), reported when long (:func:`waiting_for`); ``alive()`` raises if the
    side waited for has died."""
    pause = 0.005
    with waiting_for(what):
        while not ready():
            if alive is not None:
                alive()
            time.sleep(pause)
            pause = min(1.0, pause * 2)


def all_max(value: float, device: Any = "cpu") -> Any:
    """The largest ``value`` over ranks (itself on one process); an int for ints."""
    import torch
    import torch.distributed as dist

    if not _initialized():
        return value
    x = torch.tensor([value], dtype=torch.float64 if isinstance(value, float) else torch.long, device=device)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x.item()


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


def _memo_caches(module: Any) -> list[Any]:
    """The ``functools`` caches (``lru_cache``/``cache``) that ``module`` holds: its functions,
    and the functions, static methods and methods of the classes it defines (nested ones
    too), where they belong to ``torch.distributed``. Objects are recognised by their exact
    type, so that nothing else is touched (``torch.distributed.reduce_op`` warns on access)."""
    import functools
    import types

    wrapper = getattr(functools, "_lru_cache_wrapper", None)  # the C implementation's type
    found: list[Any] = []
    seen: set[int] = set()

    def add(value: Any) -> None:
        if type(value) in (staticmethod, classmethod):
            value = value.__func__
        kind = type(value)
        if not (kind is wrapper or (kind is types.FunctionType and "cache_clear" in vars(value))):
            return  # the pure-Python lru_cache is a plain function with cache_clear attached
        if id(value) not in seen and str(getattr(value, "__module__", "")).startswith("torch.distributed"):
            seen.add(id(value))
            found.append(value)

    def scan(namespace: dict[str, Any]) -> None:
        for value in list(namespace.values()):
            if not issubclass(type(value), type):
                add(value)
            elif value.__dict__.get("__module__") == module.__name__ and id(value) not in seen:
                seen.add(id(value))  # a class defined here, not one imported
                scan(dict(vars(value)))

    if issubclass(type(module), types.ModuleType):  # not a placeholder some libraries put in sys.modules
        scan(vars(module))
    return found


def _clear_dtensor_caches() -> None:
    """Drop what DTensor and FSDP2 memoise about a device mesh: every entry keeps the
    ``DeviceMesh``, whose ``_pg_registry`` holds the process group, alive after every module,
    parameter and optimizer is gone (see the module docstring).

    * every ``functools`` cache of the ``torch.distributed`` modules, module-level *and*
      class-level: ``MeshTopoInfo.build_from_mesh`` (``_collective_utils``, a
      ``@staticmethod @lru_cache(None)`` keyed by the mesh, called by ``redistribute_cost``
      while choosing a sharding strategy, e.g. for the norm in ``clip_grad_norm_``),
      ``_gen_transform_infos``, the propagator's ``_propagate_tensor_meta_cached``;
    * the sharding propagator's cache of op schemas (a per-thread ``lru_cache``: this clears
      the calling thread's), and the C++ fast path's copy of it;
    * the redistribute planners (a plain dict; each planner holds its mesh)."""
    import sys

    if "torch.distributed.tensor" not in sys.modules:
        return
    import torch
    from torch.distributed.tensor import DTensor

    caches = []
    prop = getattr(getattr(DTensor, "_op_dispatcher", None), "sharding_propagator", None)
    if prop is not None:
        caches += [getattr(prop, n, None) for n in ("propagate_op_sharding", "_propagate_tensor_meta_cached")]
    for name, module in list(sys.modules.items()):
        if (name == "torch.distributed" or name.startswith("torch.distributed.")) and module is not None:
            caches += _memo_caches(module)
    for cache in caches:
        if cache is not None and callable(getattr(cache, "cache_clear", None)):
            cache.cache_clear()
    if (clear := getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)) is not None:
        clear()  # the C++ fast path's cache
    try:
        from torch.distributed.tensor._redistribute import clear_redistribute_planner_cache
    except ImportError:
        return
    clear_redistribute_planner_cache()


SHUTDOWN_WAIT_S = 600.0
"""How long :func:`shutdown` waits on the host for the other ranks: longer than any rank's
teardown (an engine's shutdown, the generator processes' exit), finite for a peer that died
after its last collective."""

_shutdowns = itertools.count()  # every rank tears down the same groups in the same order


def shutdown(wait_s: float = SHUTDOWN_WAIT_S) -> list[str]:
    """Tear the default process group down for good and return the gloo threads that
    survive it (an empty list when the group is really gone).

    Waits for every rank first (no rank leaves while another still talks), destroys the
    group, and collects garbage so that reference cycles release it. The wait is on the
    host (:func:`await_ranks`, at most ``wait_s``), not a collective: ranks end their runs
    at different times (rank 0 of a disaggregated run stops the generator processes first;
    a full collection of a large heap takes seconds on a loaded host), and a barrier failed
    finished runs after ``train.dist_timeout_s``. Callers drop what holds the group before
    calling: wrapped modules and their optimizers, and accelerate's prepared objects
    (``Accelerator.free_memory()``). A no-op on a single process."""
    import torch.distributed as dist

    _clear_dtensor_caches()
    gc.collect()
    if _initialized():
        missing = await_ranks(
            dist.distributed_c10d._get_default_store(),
            f"dapo/shutdown/{next(_shutdowns)}",
            dist.get_rank(),
            dist.get_world_size(),
            "the other ranks to end their runs",
            wait_s,
        )
        if missing:  # their runs ended without a teardown (killed after their last collective)
            print(
                f"warning: ranks {missing} did not reach the end of the run within {wait_s:.0f} s; "
                "this rank ends without them",
                file=sys.stderr,
            )
        dist.destroy_process_group()
    gc.collect()
    return communication_threads()


def await_ranks(
    store: Any,
    key: str,
    rank: int,
    world: int,
    what: str,
    wait_s: float = math.inf,
    alive: Callable[[], None] | None = None,
) -> list[int]:
    """A barrier on the host: set ``key/rank`` in ``store``, then wait (:func:`poll`) until
    ``key/r`` exists for every rank r, or ``wait_s`` has passed, or ``alive()`` raises (a
    member has died); returns the ranks still missing (empty: all arrived)."""
    store.set(f"{key}/{rank}", b"")
    keys = [f"{key}/{r}" for r in range(world)]
    deadline = time.monotonic() + wait_s

    def ready() -> bool:
        return store.check(keys) or time.monotonic() >= deadline

    poll(ready, what, alive)
    return [r for r in range(world) if not store.check([keys[r]])]


# ---- process trees (Linux /proc): what a killed node leaves behind ----------------------------


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...), or None
    when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        fields = _stat(entry)
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _gone(pid: int) -> bool:
    fields = _stat(pid)
    return fields is None or fields[0] in ("Z", "X")  # reaped, or dead and not yet reaped


def kill_tree(pid: int) -> None:
    """SIGKILL a launcher (a torchrun agent) and every process below it, and wait until they
    are dead. The agent starts each rank in a session of its own, so killing the agent's
    process group would leave the ranks running on (and writing checkpoints)."""
    pids = [pid, *_descendants(pid)]
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 30
    while not all(map(_gone, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)


# ---- rollout groups: who generates what --------------------------------------------------------


@dataclass(frozen=True)
class Ranks:
    """Where a process sits. Training shards over all ``world`` ranks; generation runs in
    rollout (data-parallel) groups of ``tensor_parallel`` consecutive ranks, one vLLM engine
    split over each group (the layout vLLM's ``external_launcher`` builds: ranks
    ``[0, tp)``, ``[tp, 2 tp)``, ...). The members of a group must ask their engine for the
    same thing at the same time, so prompts, seeds and every round decision derive from
    ``dp_rank``, never from ``rank`` (TRL seeds by ``process_index // tp`` likewise)."""

    rank: int
    world: int
    tensor_parallel: int = 1

    def __post_init__(self) -> None:
        if self.tensor_parallel < 1 or self.world % self.tensor_parallel:
            raise ValueError(
                f"rollout.tensor_parallel={self.tensor_parallel} does not divide the {self.world} processes"
            )
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is outside a world of {self.world}")

    @property
    def dp_rank(self) -> int:
        """This rank's rollout group: what decides its prompts and seeds."""
        return self.rank // self.tensor_parallel

    @property
    def dp_size(self) -> int:
        """Rollout groups (independent engines)."""
        return self.world // self.tensor_parallel

    @property
    def tp_rank(self) -> int:
        """Position inside the rollout group (0 speaks for the group where one must)."""
        return self.rank % self.tensor_parallel

    def members(self, dp_rank: int) -> range:
        """The ranks of rollout group ``dp_rank``."""
        return range(dp_rank * self.tensor_parallel, (dp_rank + 1) * self.tensor_parallel)


# ---- collectives that say what they wait for ------------------------------------------------------


class CollectiveTimeout(RuntimeError):
    """A collective gave up (the process-group timeout): names what this rank waited for."""


class _Waits:
    """What this process waits for now (one at a time: collectives are sequential)."""

    def __init__(self) -> None:
        self.what: str | None = None
        self.since = 0.0
        self.reported = 0.0
        self.lock = threading.Lock()
        self.reporter: threading.Thread | None = None


_WAITS = _Waits()


def start_wait_reports(report_s: float, log: Callable[[str], None], rank: int) -> None:
    """Report, every ``report_s`` seconds, a wait inside :func:`waiting_for` that has lasted
    longer than that: ``rank 3: waiting 310 s for <what>`` (one daemon thread per process;
    0 turns reports off)."""
    if report_s <= 0 or (_WAITS.reporter is not None and _WAITS.reporter.is_alive()):
        return

    def watch() -> None:
        while True:
            time.sleep(min(report_s, 5.0) / 2)
            with _WAITS.lock:
                what, since, last = _WAITS.what, _WAITS.since, _WAITS.reported
                now = time.monotonic()
                due = what is not None and now - since >= report_s and now - last >= report_s
                if due:
                    _WAITS.reported = now
            if due:
                log(f"rank {rank}: waiting {now - since:.0f} s for {what}")

    _WAITS.reporter = threading.Thread(target=watch, name="dapo-wait-reports", daemon=True)
    _WAITS.reporter.start()


@contextmanager
def waiting_for(what: str) -> Iterator[None]:
    """Run a collective (or anything that waits on other ranks) under a name: long waits are
    reported (:func:`start_wait_reports`), and a collective that times out raises
    :class:`CollectiveTimeout` naming ``what`` and how long this rank waited."""
    with _WAITS.lock:
        outer = _WAITS.what, _WAITS.since
        _WAITS.what, _WAITS.since, _WAITS.reported = what, time.monotonic(), time.monotonic()
    t0 = time.monotonic()
    try:
        yield
    except CollectiveTimeout:
        raise
    except RuntimeError as err:  # gloo and NCCL raise RuntimeError subclasses (DistBackendError)
        if not is_collective_failure(err):
            raise
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise CollectiveTimeout(
            f"gave up after {time.monotonic() - t0:.0f} s waiting for {what} ({first}); another rank "
            "is slower (a longer generation round?) or has died: see its log, or raise "
            "train.dist_timeout_s"
        ) from err
    finally:
        with _WAITS.lock:
            _WAITS.what, _WAITS.since = outer


MISUSE = ("tensors must be cuda", "duplicate gpu", "invalid usage", "no backend type associated")
"""Words of NCCL's (and c10d's) refusals of a call that could never succeed: a host tensor, two
members on one device. Said as they are, never as a wait that gave up."""


def is_collective_failure(err: BaseException) -> bool:
    """A collective that gave up waiting (a timeout, a closed connection), not one refused."""
    import torch.distributed as dist

    text = str(err).lower()
    if any(s in text for s in MISUSE):
        return False
    return isinstance(err, getattr(dist, "DistError", ())) or any(
        s in text for s in ("timed out", "timeout", "connection closed", "connection reset", "gloo", "nccl")
    )


class Comm:
    """The few collectives the rollout needs, over the default process group (or trivial on
    one process). Objects travel pickled (``all_gather_object``); batches travel as bytes
    point to point (:meth:`exchange`), so no rank ever holds the whole global batch."""

    def __init__(self, ranks: Ranks, device: Any = "cpu"):
        self.ranks = ranks
        self.device = device

    def all_gather(self, obj: Any, what: str) -> list[Any]:
        """``obj`` from every rank, in rank order."""
        if self.ranks.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.ranks.world
        with waiting_for(what):
            dist.all_gather_object(out, obj)
        return out

    def exchange(self, outgoing: dict[int, bytes], incoming: dict[int, int], what: str) -> dict[int, bytes]:
        """Send ``outgoing[dst]`` to each ``dst`` and receive ``incoming[src]`` bytes from each
        ``src`` (sizes every rank computed alike); what arrives, by source."""
        import torch

        got = {src: outgoing[src] for src in incoming if src == self.ranks.rank}
        if self.ranks.world == 1:
            return got
        import torch.distributed as dist

        ops, bufs = [], {}
        for dst, data in outgoing.items():
            if dst != self.ranks.rank:
                t = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
                ops.append(dist.P2POp(dist.isend, t, dst))
        for src, size in incoming.items():
            if src != self.ranks.rank:
                bufs[src] = torch.empty(size, dtype=torch.uint8, device=self.device)
                ops.append(dist.P2POp(dist.irecv, bufs[src], src))
        with waiting_for(what):
            for work in dist.batch_isend_irecv(ops) if ops else []:
                work.wait()
        got.update({src: bytes(b.cpu().numpy().tobytes()) for src, b in bufs.items()})
        return got
