"""The one way a test starts several processes.

    from multiproc import run_function, run_script

    run_function("test_update:ranks_update", nproc=2, agg="token-mean", out=str(path))
    run_script(["tests/dp_worker.py", str(model_dir), str(out)], nproc=2)

Both launch ``torchrun --standalone``, whose agent binds its rendezvous store to a free
port itself (no port is picked and released first, so two tests never race for one).
Each rank gets a short process-group timeout (``$DAPO_DIST_TIMEOUT_S``, default 30 s), one
OpenMP thread, and Python's faulthandler, so a fatal signal prints every thread's stack.
The whole launch runs under a wall-clock limit; when it is exceeded the agent and every
rank are killed, so a hung collective costs seconds, never CI's hour. When a rank
fails, the error names its exit status (or signal) and quotes its stderr.

A rank's teardown (:func:`worker`) frees the process group for good and fails with
exit status 3 if any gloo thread survives it: see ``scale/dist/topology.py`` for why a
surviving thread means a SIGABRT at exit some of the time.

Run as a script, this module is the rank entry point of :func:`run_function`.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
LEAK_STATUS = 3
"""Exit status of a rank whose process group survived teardown."""


class MultiprocessError(AssertionError):
    """A multi-process launch failed, hung past its limit, or leaked a process group."""


@dataclass
class RankOutput:
    rank: int
    stdout: str
    stderr: str


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _rank_outputs(log_dir: Path, per_node: int) -> list[RankOutput]:
    """Each rank's stdout/stderr, as torchrun's ``--redirects 3`` wrote them
    (``<log_dir>/<node>/<run_id>/attempt_<n>/<local rank>/std{out,err}.log``; the last
    attempt's where there were several)."""
    found: dict[int, RankOutput] = {}
    for err in sorted(log_dir.glob("*/*/attempt_*/*/stderr.log")):
        rank = int(err.parents[3].name) * per_node + int(err.parent.name)
        out = err.parent / "stdout.log"
        found[rank] = RankOutput(
            rank, out.read_text(errors="replace") if out.exists() else "", err.read_text(errors="replace")
        )
    return [found[r] for r in sorted(found)]


_FAILURE = re.compile(
    r"rank\s*:\s*(\d+) \(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)[^\n]*?(\((SIG\w+)\))?\s*$", re.MULTILINE
)


def failed_ranks(agent_output: str) -> dict[int, str]:
    """``{rank: "exit status 1" | "SIGABRT"}`` from torchrun's failure summary."""
    return {
        int(m.group(1)): m.group(4) or f"exit status {m.group(2)}" for m in _FAILURE.finditer(agent_output)
    }


def _describe(what: str, agent_output: str, ranks: list[RankOutput]) -> str:
    failed = failed_ranks(agent_output)
    if failed:
        what += "; " + ", ".join(f"rank {r}: {how}" for r, how in sorted(failed.items()))
    parts = [what]
    for r in ranks:
        parts.append(f"--- rank {r.rank} stderr (last lines) ---\n{_tail(r.stderr) or '(empty)'}")
    parts.append(f"--- torchrun (last lines) ---\n{_tail(agent_output, 25)}")
    return "\n".join(parts)


def run_script(
    argv: list[str],
    nproc: int,
    *,
    timeout_s: float = 240,
    dist_timeout_s: float = 30,
    max_restarts: int = 0,
    nodes: int = 1,
    beside: tuple[list[str], ...] = (),
) -> list[RankOutput]:
    """Run ``argv`` (a script and its arguments, or ``-m module ...``) as ``nproc`` ranks
    under ``torchrun --standalone`` from the repository root; return every rank's output (of
    the last attempt, where ``max_restarts`` lets torchrun's agent restart the group after a
    rank fails). ``nodes`` > 1 simulates that many nodes of ``nproc`` ranks each: one agent per
    node on a static rendezvous (``--node-rank``, as a cluster's launch), on a port picked free
    and released first (the one case here where two launches could race for a port).
    ``beside``: other processes (``python`` arguments) started with the agents, with
    ``MASTER_ADDR`` and ``MASTER_PORT`` of the rendezvous (a generator node's agent); each
    must exit 0 too.

    Raises :class:`MultiprocessError` naming the failed rank, its exit status or signal
    and its stderr, or after ``timeout_s`` seconds (every rank is killed first)."""
    run_env = dict(os.environ)
    run_env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS), run_env.get("PYTHONPATH", "")]).rstrip(
                os.pathsep
            ),
            "DAPO_DIST_TIMEOUT_S": str(dist_timeout_s),
            "OMP_NUM_THREADS": "1",
            "PYTHONFAULTHANDLER": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if nodes == 1 and not beside:
        where = [["--standalone"]]
    else:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        where = [
            [f"--nnodes={nodes}", f"--node-rank={n}", "--master-addr=127.0.0.1", f"--master-port={port}"]
            for n in range(nodes)
        ]
    with tempfile.TemporaryDirectory(prefix="dapo-mp-") as tmp:
        log_dir = Path(tmp)
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    *node,
                    f"--nproc-per-node={nproc}",
                    f"--max-restarts={max_restarts}",
                    "--redirects=3",
                    f"--log-dir={log_dir / str(n)}",
                    *argv,
                ],
                cwd=ROOT,
                env=run_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for n, node in enumerate(where)
        ]
        procs += [
            subprocess.Popen(
                [sys.executable, *cmd],
                cwd=ROOT,
                env={**run_env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for cmd in beside
        ]
        from scale.dist.topology import kill_tree

        end = time.monotonic() + timeout_s
        outputs = []
        try:
            for proc in procs:
                outputs.append(proc.communicate(timeout=max(end - time.monotonic(), 0.1))[0])
        except subprocess.TimeoutExpired:
            for proc in procs:
                kill_tree(proc.pid)  # the agents and every rank: nothing outlives the test
            agent_output = "\n".join(proc.communicate()[0] for proc in procs)
            raise MultiprocessError(
                _describe(
                    f"{argv} did not finish within {timeout_s:.0f} s; every rank was killed",
                    agent_output,
                    _rank_outputs(log_dir, nproc),
                )
            ) from None
        ranks = _rank_outputs(log_dir, nproc)
        if any(proc.returncode != 0 for proc in procs):
            raise MultiprocessError(_describe(f"{argv} failed", "\n".join(outputs), ranks))
        return ranks


def run_function(
    target: str, nproc: int, *, timeout_s: float = 240, dist_timeout_s: float = 30, **kwargs
) -> list[RankOutput]:
    """Run ``target`` (``"module:function"``, importable from ``tests/`` or the repository
    root) on ``nproc`` ranks as ``function(rank, world, **kwargs)`` inside an initialised
    gloo process group; ``kwargs`` must be JSON values. See :func:`run_script`."""
    return run_script(
        [str(Path(__file__)), target, json.dumps(kwargs)],
        nproc,
        timeout_s=timeout_s,
        dist_timeout_s=dist_timeout_s,
    )


def _exit_now(status: int) -> None:
    """Leave without interpreter finalization: used on failure, where the process group may
    still be alive and finalization could add a SIGABRT to the real error."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def worker(body: Callable[[], None]) -> None:
    """A rank's whole life: run ``body`` (which may create the process group itself, e.g.
    through accelerate), then free the process group for good. Exits 1 with the traceback
    if ``body`` raises, and 3 if a gloo thread survives teardown (something still holds
    the group). Returns normally only after a clean teardown."""
    from scale.dist.topology import preload_collective_modules, shutdown

    preload_collective_modules()
    try:
        body()
    except BaseException:
        traceback.print_exc()
        _exit_now(1)
    # body's frame, and with it every wrapped module it held, is gone by now
    leaked = shutdown()
    if leaked:
        print(
            f"multiproc: the process group outlived destroy_process_group(): gloo threads {leaked} are still "
            "running, so something still holds the group (a DDP/FSDP module, an optimizer, accelerate's "
            "prepared objects: call Accelerator.free_memory()). See scale/dist/topology.py.",
            file=sys.stderr,
        )
        _exit_now(LEAK_STATUS)


def _function_entry(target: str, kwargs_json: str) -> None:
    import torch.distributed as dist

    from scale.dist.topology import dist_timeout

    module, _, name = target.partition(":")
    fn = getattr(importlib.import_module(module), name)
    kwargs = json.loads(kwargs_json)

    def body() -> None:
        dist.init_process_group("gloo", timeout=dist_timeout(30))
        fn(dist.get_rank(), dist.get_world_size(), **kwargs)

    worker(body)


if __name__ == "__main__":
    _function_entry(sys.argv[1], sys.argv[2])
