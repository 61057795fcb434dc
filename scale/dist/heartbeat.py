"""Rank failure detection faster than the collective timeout: a heartbeat over the rendezvous
store.

A collective whose peer died or stopped waits for the process-group timeout
(``train.dist_timeout_s``, an hour in the 32B preset, above the longest generation round):
one dead GPU would idle the other 127 for that long, and on NCCL the watchdog then kills the
process without the :class:`scale.dist.topology.CollectiveTimeout` line. The heartbeat does not wait
for a collective to fail. Every rank runs one daemon thread that, every ``interval_s``:

1. adds 1 to its own counter ``dapo/heartbeat/<rank>`` in the rendezvous store (the TCP
   store every launcher already runs: torchrun's agent, accelerate's or SLURM's
   ``MASTER_ADDR:MASTER_PORT``);
2. reads every rank's counter (``add(key, 0)``: no wait for a key not yet written) and notes
   when each last moved.

A rank whose counter has not moved for ``timeout_s`` has died (SIGKILL, OOM kill, a lost node)
or stopped answering (SIGSTOP, a hung driver holding its process): every rank that sees it
prints one line naming it, and every other rank silent to within one interval of the timeout
(ranks that went quiet together, such as the node-mates a launcher ends after one is killed:
the watcher sees each last beat at its own read), and exits at once with status 3, the status of a collective
timeout (``--resume auto`` continues from the last checkpoint). A store that cannot be
reached for ``timeout_s`` (the host of rank 0's launcher died) ends the rank the same way. A
rank that finishes cleanly marks itself done (:meth:`Heartbeat.stop`) and is never reported.

Cost: one store round trip per rank per interval for the beat and one per rank per peer for
the reads (128 ranks, 10 s: ~1,650 small requests a second at the store, which a TCP store
serves). The thread needs the GIL briefly every interval; every long wait of a training step
(collectives, kernels, file writes, vLLM's engine loop) releases it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

PREFIX = "dapo/heartbeat/"
DONE = 1 << 40
"""Added to a counter by a rank that finished cleanly: a counter this large is never stale."""
EXIT_STATUS = 3
"""Exit status of a rank that ended because another stopped answering (as a collective
timeout: resume with ``--resume auto``)."""


class Heartbeat:
    """The heartbeat of one rank (see the module docstring). ``store`` is a
    ``torch.distributed.Store``; ``on_failure(message)`` runs once when a peer is found dead
    (default: print the message and ``os._exit(EXIT_STATUS)``); ``clock`` is for tests."""

    def __init__(
        self,
        store: Any,
        rank: int,
        world: int,
        *,
        interval_s: float = 10.0,
        timeout_s: float = 60.0,
        on_failure: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not 0 < interval_s < timeout_s:
            raise ValueError(f"need 0 < interval_s ({interval_s}) < timeout_s ({timeout_s})")
        self.store, self.rank, self.world = store, rank, world
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.on_failure = on_failure or _exit
        self.clock = clock
        now = clock()
        self.last_value: dict[int, int] = {}
        self.last_moved: dict[int, float] = dict.fromkeys(range(world), now)
        self.store_ok_since = now
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failed: str | None = None

    def _key(self, rank: int) -> str:
        return f"{PREFIX}{rank}"

    def beat_and_check(self) -> str | None:
        """One interval's work: beat, read every counter, and return the failure message if a
        peer (or the store) has been silent for ``timeout_s`` (None otherwise)."""
        now = self.clock()
        try:
            self.store.add(self._key(self.rank), 1)
            values = {r: int(self.store.add(self._key(r), 0)) for r in range(self.world) if r != self.rank}
        except Exception as err:  # the store's host is gone, or the network
            if now - self.store_ok_since >= self.timeout_s:
                first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
                return (
                    f"rank {self.rank}: the rendezvous store has not answered for "
                    f"{now - self.store_ok_since:.0f} s ({first}): the launcher of rank 0 has died or "
                    "its host is unreachable; ending this rank"
                )
            return None
        self.store_ok_since = now
        silent_for: dict[int, float] = {}
        for r, v in values.items():
            if r not in self.last_value:  # first sight: silent since this rank started watching
                self.last_value[r] = v
            elif v != self.last_value[r]:
                self.last_value[r] = v
                self.last_moved[r] = now
            elif v < DONE:
                silent_for[r] = now - self.last_moved[r]
        if not any(t >= self.timeout_s for t in silent_for.values()):
            return None
        # every rank silent to within one interval of the timeout went quiet with the first
        # (a killed rank and the node-mates its launcher ends a moment later): all are named,
        # whichever this watcher happened to see last beat one read earlier
        stale = sorted(r for r, t in silent_for.items() if t >= self.timeout_s - self.interval_s)
        silent = max(silent_for[r] for r in stale)
        which = f"rank {stale[0]}" if len(stale) == 1 else "ranks " + ", ".join(map(str, stale))
        return (
            f"rank {self.rank}: {which} stopped answering (no heartbeat for {silent:.0f} s; "
            "dead or stopped: see its log and its node); ending this rank instead of waiting for "
            "the collective timeout"
        )

    def start(self) -> Heartbeat:
        """Beat once now, then every ``interval_s`` in a daemon thread."""
        self.store.add(self._key(self.rank), 1)

        def run() -> None:
            while not self._stop.wait(self.interval_s):
                message = self.beat_and_check()
                if message is not None and not self._stop.is_set():
                    self.failed = message
                    self.on_failure(message)
                    return

        self._thread = threading.Thread(target=run, name="dapo-heartbeat", daemon=True)
        self._thread.start()
        _ACTIVE.append(self)
        return self

    def stop(self) -> None:
        """Stop beating and mark this rank done (peers never report it)."""
        self._stop.set()
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.store.add(self._key(self.rank), DONE)
        except Exception:  # the store is already gone at the end of a run: nothing to tell
            pass


_ACTIVE: list[Heartbeat] = []


def await_verdict() -> None:
    """After a collective failed (gloo sees a dead peer's closed connection at once, before
    its heartbeat is stale): give this rank's heartbeat up to one timeout to name the ranks
    that stopped answering. If it does, its line ends the process here (status 3); if every
    peer still beats, return and let the caller report the collective's own error."""
    if not _ACTIVE:
        return
    hb = _ACTIVE[-1]
    end = time.monotonic() + hb.timeout_s + 2 * hb.interval_s
    while hb._thread is not None and hb._thread.is_alive() and time.monotonic() < end:
        time.sleep(min(0.5, hb.interval_s))


def _exit(message: str) -> None:
    print(f"dapo train: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_STATUS)


def start(cfg: Any, rank: int, world: int) -> Heartbeat | None:
    """The run's heartbeat over the default process group's store (``train.heartbeat_s``,
    ``train.heartbeat_timeout_s``); None on one process or with ``heartbeat_s: 0``."""
    import torch.distributed as dist

    t = cfg.train
    if world == 1 or not t.heartbeat_s or not (dist.is_available() and dist.is_initialized()):
        return None
    store = dist.distributed_c10d._get_default_store()
    return Heartbeat(store, rank, world, interval_s=t.heartbeat_s, timeout_s=t.heartbeat_timeout_s).start()
