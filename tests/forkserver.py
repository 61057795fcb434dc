"""``dapo train``, ``eval`` and ``export`` for the tests, forked from a process that imported
the stack once.

    from forkserver import run_dapo

    r = run_dapo(["train", "--config", "tiny-cpu", ...], env=env, cwd=ROOT, timeout=600)
    r.returncode, r.stdout, r.stderr  # as subprocess.run(..., capture_output=True, text=True)

A ``dapo train`` process spends most of its CPU importing torch, transformers, accelerate and
vLLM (on 2026-12-07, 2-core host: 8.0 of 15.1 CPU-s for a tiny run on the HF engine, 20.4 of
26.2 with vLLM), and the tests start dozens of them. A fork server per pytest worker and kind
(``hf``: without vLLM; ``vllm``) imports what :func:`scale.dist.startup.import_and_freeze`
imports, in the environment :func:`scale.ops.cli.quiet_environment` gives a run, then forks a
child per command; the child runs ``dapo.cli`` as ``python -m dapo.cli`` would
(:func:`runpy.run_module` as ``__main__``, its ``sys.path`` and ``sys.argv``, the request's
working directory, environment, stdin, stdout and stderr), in its own process group, and
ends through the interpreter's normal exit (atexit handlers, finalizers, non-daemon threads).

A server imports in the environment of the requests it serves (a variable read when a library
imports, ``PYTHONPATH``, a log level), so there is one per kind and environment, ``DAPO_*``
variables and ``PYTEST_CURRENT_TEST`` aside (this project reads the first when it runs; pytest
changes the second with every test): a test's own ``PYTHONPATH`` gets a server of its own, and
so do the requests after a library imported in the pytest worker set variables there (vLLM sets
seven, ``LD_LIBRARY_PATH`` among them, and a test that imports it in-process leaves them in
every later request's environment: in CI on 2026-12-07 every command after such a test had run
fresh, unseen). At most :data:`MAX_SERVERS` live per worker; the least recently used goes.

What a fresh interpreter would do differently is not served; such a request runs as a
subprocess, as before, and its reason is kept in :data:`FRESH` (the tests' CPU report counts
them):

* ``--verbose``, or a command other than ``train``, ``eval`` and ``export``;
* output from the server's own imports (a fresh process would print it; none is expected);
* ``DAPO_TEST_FORK=0``, or a server that failed to start.

A timeout kills the child's process group (the generator processes a disaggregated run
starts included) and raises :class:`subprocess.TimeoutExpired`. Each child's CPU (from
``wait4``) is added to :data:`CHILD_CPU_S`, which the tests' CPU report counts
(``tests/conftest.py``).

Run as a script, this module is the server: ``python tests/forkserver.py SOCKET KIND``.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import locale
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVED = ("train", "eval", "export")
CHILD_CPU_S = 0.0
"""CPU seconds of every command this process had forked (the server's children are not its
own, so ``RUSAGE_CHILDREN`` misses them)."""
SERVERS_CPU_S = 0.0
"""CPU seconds of the servers this process closed, the commands they forked included (a closed
server is a waited-for child, so ``RUSAGE_CHILDREN`` counts it: the tests' CPU report takes it
out again, the commands being in :data:`CHILD_CPU_S` already)."""
FORKED = 0
"""How many commands this process had forked."""
FRESH: list[str] = []
"""Why each command that a server could have forked ran as a subprocess instead."""
MAX_SERVERS = 3
"""Servers alive per pytest worker: each holds the imported stack (the vLLM kind about 0.6 GB);
one per kind, and one more for the environment a test changed."""
_START_TIMEOUT_S = 300.0


def _read_at_import(key: str) -> bool:
    """Whether a library may read the variable when it imports: all but ``DAPO_*`` (this
    project reads them when it runs) and pytest's ``PYTEST_CURRENT_TEST`` (it changes with every
    test)."""
    return not key.startswith("DAPO_") and key != "PYTEST_CURRENT_TEST"


def _at_import(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if _read_at_import(k)}


def _differs(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The variables read at import (:func:`_read_at_import`) two environments set differently."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and _read_at_import(k))


# ---- the server ---------------------------------------------------------------------------------


def _quiet_env() -> None:
    sys.path[0] = str(ROOT)  # not this file's folder: a fresh `python -m dapo.cli` has no tests/ on its path
    from scale.ops.cli import quiet_environment

    quiet_environment(False)


def _serve(path: str, kind: str) -> tuple[dict, list[int]] | None:
    """Import, then answer requests until the parent (the pytest worker) is gone. Returns only
    in a forked child: its request and the file descriptors it received."""
    base = dict(os.environ)  # the environment the imports saw; requests are compared with it
    from scale.dist.startup import import_and_freeze

    # the imports' own output, kept apart: a fresh process would print it, so none may come
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            from scale.ops.cli import quiet_engines

            quiet_engines(False)  # as `dapo train`: the engines' loggers quieted before they import
            import_and_freeze(learner=True, vllm=kind == "vllm")
            import scale.trainer  # noqa: F401
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, saved_fd in ((1, saved[0]), (2, saved[1])):
                os.dup2(saved_fd, fd)
                os.close(saved_fd)
        out.seek(0)
        noise = out.read()
    if noise:
        print(f"forkserver: the imports printed {noise[-500:]!r}: not serving", file=sys.stderr)
        return None
    parent = os.getppid()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path + ".tmp")
        os.rename(path + ".tmp", path)  # the client waits for the name: bound and listening
        server.listen(4)
        server.settimeout(1.0)
        while os.getppid() == parent:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                request = json.loads(msg)
                changed = _differs(base, request["env"])
                if changed:
                    conn.sendall(json.dumps({"refused": changed}).encode() + b"\n")
                    for fd in fds:
                        os.close(fd)
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    server.close()
                    conn.close()
                    return request, fds
                for fd in fds:
                    os.close(fd)
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                status, usage = _wait(pid, parent)
                if status is None:  # the pytest worker is gone: so is the command
                    return None
                cpu = usage.ru_utime + usage.ru_stime
                reply = {"returncode": os.waitstatus_to_exitcode(status), "cpu_s": cpu}
                try:
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                except OSError:
                    pass  # the client gave up (a timeout): it killed the child itself
    return None


def _wait(pid: int, parent: int) -> tuple[int | None, resource.struct_rusage | None]:
    """``wait4`` for the child, its status and CPU; if the server's parent dies meanwhile,
    the child's process group is killed and (None, None) returned."""
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage
        if os.getppid() != parent:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.wait4(pid, 0)
            return None, None
        time.sleep(0.05)


def _become(request: dict, fds: list[int]) -> None:
    """In the child: the process ``python -m dapo.cli ARGS`` would be, up to the run itself."""
    os.setpgid(0, 0)
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    for k in [k for k in os.environ if k not in request["env"]]:
        del os.environ[k]
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]  # `-m`: the working directory first, not this file's folder
    if "dapo.cli" in sys.modules:  # `-m dapo.cli` runs it as __main__, never imported before
        del sys.modules["dapo.cli"]
        del sys.modules["dapo"].cli
    sys.argv = ["-m", *request["args"]]  # runpy puts the module's path in place of "-m"
    if "numpy" in sys.modules:  # numpy's global generator, seeded afresh as in a new process
        sys.modules["numpy"].random.seed()


# ---- the client ---------------------------------------------------------------------------------


class _Server:
    """A server of ``kind`` that imports in ``env`` (a request's, as the run sees it)."""

    def __init__(self, kind: str, env: dict[str, str]):
        self.dir = tempfile.mkdtemp(prefix=f"dapo-fork-{kind}-")
        self.path = os.path.join(self.dir, "socket")
        self.log = open(os.path.join(self.dir, "server.log"), "w")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, self.path, kind],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=_at_import(env),
        )
        end = time.monotonic() + _START_TIMEOUT_S
        while not os.path.exists(self.path):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.proc.kill()
                self.log.flush()
                text = Path(self.log.name).read_text(errors="replace")[-1000:]
                raise RuntimeError(f"the {kind} fork server did not start: {text}")
            time.sleep(0.05)

    def close(self) -> None:
        global SERVERS_CPU_S
        self.proc.kill()
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        SERVERS_CPU_S += usage.ru_utime + usage.ru_stime
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_servers: dict[tuple[str, tuple[tuple[str, str], ...]], _Server | str] = {}
"""Live servers (or why one did not start) by kind and environment, the most recently used last."""


def _server(kind: str, env: dict[str, str]) -> _Server | str:
    """The server of ``kind`` for a request's environment, started if there is none; or why
    it could not start."""
    key = kind, tuple(sorted(_at_import(env).items()))
    if key not in _servers:
        while len(_servers) >= MAX_SERVERS:
            old = _servers.pop(next(iter(_servers)))
            if isinstance(old, _Server):
                old.close()
        try:
            _servers[key] = _Server(kind, env)
        except RuntimeError as err:
            print(f"forkserver: {err}; commands run as subprocesses", file=sys.stderr)
            _servers[key] = str(err)
    _servers[key] = _servers.pop(key)  # the most recently used last
    return _servers[key]


def _close_all() -> None:
    for server in _servers.values():
        if isinstance(server, _Server):
            server.close()


atexit.register(_close_all)


def _kind(args: list[str]) -> str:
    """``hf`` where the process hosts no vLLM engine (the HF engine, a disaggregated run's
    learner, an export: a fresh process would not import vLLM), else ``vllm``."""
    hf = {"rollout.engine=hf", "rollout.mode=disaggregated"} & set(args) or any(
        a == "--engine" and b == "hf" for a, b in itertools.pairwise(args)
    )
    return "hf" if hf or args[:1] == ["export"] else "vllm"


def _with_defaults(env: dict[str, str]) -> dict[str, str]:
    """``env`` as the run sees it once :func:`scale.ops.cli.quiet_environment` has set its
    defaults (before any library imports)."""
    from scale.ops.cli import quiet_environment

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        quiet_environment(False)
        return dict(os.environ)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_dapo(
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | Path = ROOT,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, "-m", "dapo.cli", *args], capture_output=True,
    text=True, env=env, cwd=cwd, timeout=timeout)``, forked from a server where it can be."""
    global CHILD_CPU_S, FORKED
    env = dict(os.environ if env is None else env)
    argv = [sys.executable, "-m", "dapo.cli", *args]

    def fresh(why: str) -> subprocess.CompletedProcess[str]:
        FRESH.append(why)
        return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)

    if os.environ.get("DAPO_TEST_FORK", "1") == "0":
        return fresh("DAPO_TEST_FORK=0")
    if not args or args[0] not in SERVED:
        return fresh(f"not served: {args[:1]}")
    if "--verbose" in args:
        return fresh("--verbose")
    seen = _with_defaults(env)
    server = _server(_kind(args), seen)
    if isinstance(server, str):
        return fresh(server)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, open(os.devnull) as null:
        request = {"args": args, "env": seen, "cwd": str(Path(cwd).resolve())}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(server.path)
            socket.send_fds(conn, [json.dumps(request).encode()], [null.fileno(), out.fileno(), err.fileno()])
            reader = conn.makefile("r")
            first = json.loads(reader.readline())
            if "refused" in first:  # the environment differs from the one its imports saw
                return fresh(f"refused: {', '.join(first['refused'])} differ")
            FORKED += 1
            pid = first["pid"]
            conn.settimeout(timeout)
            try:
                line = reader.readline()
            except (TimeoutError, KeyboardInterrupt) as stop:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                if isinstance(stop, KeyboardInterrupt):
                    raise
                out.seek(0)
                err.seek(0)
                raise subprocess.TimeoutExpired(argv, timeout, out.read(), err.read()) from None
            reply = json.loads(line)
        CHILD_CPU_S += reply["cpu_s"]
        return subprocess.CompletedProcess(argv, reply["returncode"], _text(out), _text(err))


def _text(f) -> str:
    """What ``subprocess.run(text=True)`` makes of a stream: the locale's encoding, universal
    newlines."""
    f.seek(0)
    return f.read().decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


if __name__ == "__main__":
    _quiet_env()
    served = _serve(sys.argv[1], sys.argv[2])
    if served is None:
        sys.exit(0)
    _become(*served)
    del served
    import runpy

    runpy.run_module("dapo.cli", run_name="__main__", alter_sys=True)
