"""Generators on nodes of their own (``rollout.generator_nodes``): both sides of the meeting.

A disaggregated run whose generators do not fit beside the learners runs them on
``rollout.generator_nodes`` nodes of their own, started by the cluster's launcher, not by the
learner: ``dapo launch`` writes a SLURM job of two job steps in one allocation (the learners'
nodes, then the generators'), or for torchrun one command per role. On each generator node
one agent runs (``python -m scale.placement.generator_node``); it meets the learners through
the store every launcher already runs (torchrun's, at ``MASTER_ADDR:MASTER_PORT``):

1. the learner's rank 0 opens the bridge (:mod:`scale.dist.bridge`) and announces it
   (:class:`RemoteGenerators`): ``dapo/generators/pool/<n>`` holds the run directory, the
   bridge's address and port, the generators and how they split over the nodes;
2. each agent follows the newest announcement: it starts its node's share of the generator
   processes (:func:`scale.placement.generator_process.spawn`, each on its own GPUs), beats in
   the bridge's store and reports each process's exit there (status and last line);
3. a learner restarted by its launcher (``dapo launch --max-restarts``) announces a new pool:
   the agents stop what is left of the old one and start the new one. The learner says
   ``dapo/generators/done`` when the run has finished and waits until every agent has left
   (status 0). An agent that loses the launcher's store before that leaves with status 1.

The learner's rank 0 learns of a generator's death from its exit report, and of a node's loss
(power, network, a killed agent) from its beat stopping for ``train.heartbeat_timeout_s``: the
run ends with exit status 4, as when a local generator dies, and ``--resume auto`` (or the
launcher's restart) continues it. Generators read the run's ``config.json`` and write their
logs and traces under ``output.dir``, which must be on a file system every node shares (as the
learners' sharded checkpoints already require).

Why job steps and not Ray (verl, OpenRLHF) or a heterogeneous job: a job step is SLURM's own
way to run a different command on some nodes of one allocation; it needs no second cluster
manager on the nodes, SLURM accounts and kills it with the job, and ``--requeue`` restarts
both roles together. Heterogeneous jobs do the same where a site enables them, but many do
not; vLLM needs Ray only for an engine that spans nodes, which a generator (one engine of at
most a node's GPUs) never is.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ANNOUNCED = "dapo/generators/pools"
"""The launcher's store: how many pools the learner has announced (the newest is this one)."""
POOL = "dapo/generators/pool/"
DONE = "dapo/generators/done"
LEFT = "dapo/generators/left/"
"""The launcher's store: each agent, leaving after :data:`DONE` (``<node>``)."""
BEAT = "dapo-generator-node/beat/"
"""The bridge's store: each agent's beat counter (``<node>``)."""
EXIT = "dapo-generator-node/exit/"
"""The bridge's store: each generator process's exit (``<process>``: status, host, last line)."""


@dataclass(frozen=True)
class Share:
    """What generator node ``node`` of ``nodes`` runs: generators ``first .. first + count - 1``,
    each ``tp`` processes, generator ``first + l``'s on the node's GPUs ``l * tp .. l * tp + tp - 1``."""

    node: int
    nodes: int
    first: int
    count: int
    tp: int

    def processes(self) -> list[tuple[int, int, list[str]]]:
        """(generator, tensor-parallel rank, CUDA device ids) of each process of this node."""
        return [
            (self.first + g, j, [str(g * self.tp + d) for d in range(self.tp)])
            for g in range(self.count)
            for j in range(self.tp)
        ]


def share(node: int, nodes: int, generators: int, tp: int) -> Share:
    """Generator node ``node``'s share of ``generators`` (an equal split; the config checks
    that ``nodes`` divides ``generators``)."""
    if not 0 <= node < nodes:
        raise ValueError(f"generator node {node} of {nodes}: must be 0..{nodes - 1}")
    per = generators // nodes
    return Share(node, nodes, node * per, per, tp)


def launcher_store(addr: str, port: int, timeout_s: float) -> Any:
    """A client of the launcher's store (torchrun's agent hosts it at ``MASTER_ADDR:MASTER_PORT``)."""
    from ..dist.bridge import store

    return store(addr, port, is_master=False, members=None, timeout_s=timeout_s)


class RemoteGenerators:
    """The learner's rank 0's view of generators that agents start on other nodes: announce
    the bridge, then watch the agents' reports (:meth:`alive`) and wait for the processes to
    finish (:meth:`wait`). ``kv`` is the bridge's store (this process hosts it)."""

    def __init__(self, kv: Any, announcement: dict[str, Any], *, startup_s: float, beat_timeout_s: float):
        self.kv = kv
        self.nodes = int(announcement["nodes"])
        self.procs = int(announcement["count"]) * int(announcement["tp"])
        self.tp = int(announcement["tp"])
        self.startup_s, self.beat_timeout_s = startup_s, beat_timeout_s
        self.started = time.monotonic()
        self.beats: dict[int, tuple[int, float]] = {}
        """Each node's last beat count and when it was first seen."""
        self.launcher = launcher_store(
            os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "0")), startup_s
        )
        self.pool = int(self.launcher.add(ANNOUNCED, 1))
        self.launcher.set(f"{POOL}{self.pool}", json.dumps({**announcement, "pool": self.pool}))

    def exits(self) -> dict[int, dict[str, Any]]:
        """The processes that have exited, by process (``g = generator * tp + tensor-parallel rank``)."""
        keys = [f"{EXIT}{g}" for g in range(self.procs)]
        return {g: json.loads(bytes(self.kv.get(k))) for g, k in enumerate(keys) if self.kv.check([k])}

    def alive(self) -> None:
        """Raise :class:`EngineError` if a generator process exited with an error, or a
        generator node stopped beating (or never started within ``train.startup_timeout_s``)."""
        from ..generator.engines import EngineError

        for g, e in sorted(self.exits().items()):
            if e["status"] != 0:
                i, j = divmod(g, self.tp)
                who = f"generator {i}" + (f" (tensor-parallel process {j})" if self.tp > 1 else "")
                said = f": {e['last_line'][:300]}" if e.get("last_line") else ""
                raise EngineError(
                    f"{who} on generator node {e['node']} ({e['host']}) exited with status "
                    f"{e['status']} (see {e['log']}){said}"
                )
        now = time.monotonic()
        for m in range(self.nodes):
            count = int(self.kv.add(f"{BEAT}{m}", 0))
            seen = self.beats.get(m)
            if seen is None or seen[0] != count:
                self.beats[m] = (count, now)
                continue
            if count == 0 and now - self.started > self.startup_s:
                raise EngineError(
                    f"generator node {m} did not start its generators within train.startup_timeout_s="
                    f"{self.startup_s:g} s: start `python -m scale.placement.generator_node` there "
                    "(dapo launch writes it)"
                )
            if count and now - seen[1] > self.beat_timeout_s:
                raise EngineError(
                    f"generator node {m} stopped answering (no beat for {now - seen[1]:.0f} s, "
                    f"train.heartbeat_timeout_s={self.beat_timeout_s:g}): the node or its agent died"
                )

    def finished(self) -> bool:
        return len(self.exits()) == self.procs

    def done(self, wait_s: float = 30.0) -> None:
        """The run has finished: the agents leave. Waits (at most ``wait_s``) until each has
        said so: the launcher's store ends with this process, and an agent that found it gone
        first could not tell the end of the run from a lost learner."""
        self.launcher.set(DONE, b"")
        left = [f"{LEFT}{m}" for m in range(self.nodes)]
        end = time.monotonic() + wait_s
        while not self.launcher.check(left) and time.monotonic() < end:
            time.sleep(0.1)


def last_line(log: Path) -> str:
    """The last non-blank line of a process's log ("" without one): what it said before exiting."""
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


class Agent:
    """One generator node's agent: follows the newest pool the learner announced."""

    def __init__(self, launcher: Any, node: int, log: Any = print):
        self.launcher, self.node, self.log = launcher, node, log
        self.host = socket.gethostname()
        self.pool = 0
        self.kv: Any = None
        self.procs: list[tuple[int, subprocess.Popen[bytes], Path]] = []
        self.reported: set[int] = set()

    def start(self, pool: int) -> None:
        """Stop the old pool's processes, start this node's share of pool ``pool``."""
        from .generator_process import spawn

        self.stop()
        a = json.loads(bytes(self.launcher.get(f"{POOL}{pool}")))
        self.pool = pool
        mine = share(self.node, int(a["nodes"]), int(a["count"]), int(a["tp"]))
        try:
            self.kv = launcher_store(a["addr"], int(a["port"]), 60.0)  # open before it was announced
        except Exception as err:  # that learner is gone already: a newer pool, or the end, follows
            self.log(f"generator node {self.node}: pool {pool}'s bridge at {a['addr']}:{a['port']}: {err}")
            self.kv = None
            return
        run = Path(a["run_dir"])
        self.procs, self.reported = [], set()
        for i, j, devices in mine.processes():
            log = run / (f"generator{i}.log" if j == 0 else f"generator{i}-tp{j}.log")
            p = spawn(
                run, a["addr"], int(a["port"]), i, int(a["count"]), j, mine.tp, a["backend"], devices, log
            )
            self.procs.append((i * mine.tp + j, p, log))
        self.log(
            f"generator node {self.node} ({self.host}): pool {pool}: generators "
            f"{mine.first}..{mine.first + mine.count - 1} started ({len(self.procs)} processes)"
        )

    def report(self) -> None:
        """Beat, and report each process that has exited (once)."""
        if self.kv is None:
            return
        try:
            self.kv.add(f"{BEAT}{self.node}", 1)
            for g, p, log in self.procs:
                rc = p.poll()
                if rc is None or g in self.reported:
                    continue
                e = {
                    "status": rc,
                    "node": self.node,
                    "host": self.host,
                    "log": str(log),
                    "last_line": last_line(log),
                }
                self.kv.set(f"{EXIT}{g}", json.dumps(e))
                self.reported.add(g)
        except Exception:  # the bridge is gone with its learner: a new pool, or the end, follows
            self.kv = None

    def stop(self) -> None:
        for _, p, _ in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        self.procs = []

    def run(self, lost_s: float, every_s: float = 1.0) -> int:
        """Until the run is done (0), or the launcher's store is lost for ``lost_s`` (1)."""
        last_ok = time.monotonic()
        while True:
            try:
                if self.launcher.check([DONE]):
                    self.stop()
                    self.launcher.set(f"{LEFT}{self.node}", b"")
                    self.log(f"generator node {self.node} ({self.host}): the run is done")
                    return 0
                newest = int(self.launcher.add(ANNOUNCED, 0))
                last_ok = time.monotonic()
            except Exception as err:
                if time.monotonic() - last_ok > lost_s:
                    self.stop()
                    self.log(
                        f"generator node {self.node} ({self.host}): the learners' store is gone "
                        f"({type(err).__name__}) before the run said it was done; leaving"
                    )
                    return 1
                time.sleep(every_s)
                continue
            if newest > self.pool:
                try:
                    self.start(newest)
                except ValueError as err:  # this node is not one of the run's generator nodes
                    self.log(f"generator node {self.node}: {err}")
                    return 2
            self.report()
            time.sleep(every_s)


def main(argv: list[str] | None = None) -> int:
    """A generator node's agent (``python -m scale.placement.generator_node``)."""
    ap = argparse.ArgumentParser(
        prog="python -m scale.placement.generator_node",
        description="Run this node's share of a disaggregated run's generators (rollout.generator_nodes).",
    )
    ap.add_argument(
        "--master", default=os.environ.get("MASTER_ADDR"), help="the learners' node 0 (default $MASTER_ADDR)"
    )
    ap.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("MASTER_PORT", "29500")),
        help="its launcher's store (default $MASTER_PORT, else 29500)",
    )
    ap.add_argument(
        "--node",
        type=int,
        required=True,
        help="this generator node, from 0 (SLURM: $SLURM_PROCID of the step)",
    )
    ap.add_argument(
        "--wait-s",
        type=float,
        default=1800.0,
        help="how long to wait for the learners' store to open (default 1800)",
    )
    ap.add_argument(
        "--lost-s",
        type=float,
        default=120.0,
        help="leave after the learners' store has been unreachable this long (default 120)",
    )
    args = ap.parse_args(argv)
    if not args.master:
        print("generator_node: --master: no address (set it or $MASTER_ADDR)", file=sys.stderr)
        return 2
    if args.node < 0:
        print(f"generator_node: --node {args.node}: must be >= 0", file=sys.stderr)
        return 2
    try:
        launcher = launcher_store(args.master, args.port, args.wait_s)
    except Exception as err:
        print(
            f"generator_node: the learners' store at {args.master}:{args.port} did not open within "
            f"--wait-s {args.wait_s:g}: {err}",
            file=sys.stderr,
        )
        return 1
    return Agent(launcher, args.node, log=lambda s: print(s, flush=True)).run(args.lost_s)


if __name__ == "__main__":
    sys.exit(main())
