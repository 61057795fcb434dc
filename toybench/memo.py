"""Runs already trained, kept for a later call that asks for the same run: in this process,
and on disk for other processes.

``dapo toy check`` trains, besides each candidate, the failure mode's unprotected and fix
arms; for every loss checked on the same seeds those are the same runs. A test file that
calls :func:`toybench.check.assert_protects` for several losses, a notebook that checks one
loss after another, or a user's CI that runs ``dapo toy check`` once per loss, trains them
once. Results do not change: a run is a pure function of its
:class:`~toybench.runner.RunSpec`, the engine that trains it and the code (the key is all
three), and :func:`toybench.experiment.run_experiments` already trains a run two experiments
share once per call on the same grounds.

Only runs of built-in losses (:data:`dapo.registry.BUILTIN`) are kept: a user's loss is code
that can change between two calls (an edited module, a monkeypatch), and so is a peer's. The
CPU seconds a result reports count the runs its call trained.

**On disk** (:func:`cache_dir`): ``$DAPO_TOY_CACHE``, by default ``~/.cache/dapo/toy-runs``
(``$XDG_CACHE_HOME`` respected); ``DAPO_TOY_CACHE=off`` keeps nothing there. A run is one
gzipped JSON file (data, never code: no pickle) under a folder named by the code's
fingerprint (:func:`fingerprint`: the source of ``toybench`` and ``dapo``, torch's and
numpy's versions, the machine's architecture), written atomically, so concurrent processes
never read half a file; a file that cannot be read, or holds another run, is a miss (and
removed). A process that patches ``toybench`` or ``dapo`` in memory must set
``DAPO_TOY_CACHE=off``: the fingerprint sees the files, not the patch.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform
import shutil
import tempfile
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path

from dapo.registry import BUILTIN, parse_spec

from .runner import RunSpec

Log = list[dict[str, float]]

MAX_RUNS = 512
"""Logs kept in memory at most (the least recently used go first): a log of 150 steps takes
~0.4 MB, so ~200 MB at most. Enough for `dapo toy check`'s unprotected and fix arms on 4
modes x 2 x 10 seeds, and the built-in candidates of a few checks besides."""

KEEP_VERSIONS = 4
"""Fingerprint folders kept on disk (the most recently written): older code's runs go when a
fifth version writes its first run (a check's built-in arms on 4 modes x 2 x 10 seeds take
about 5 MB)."""

OFF = ("off", "0", "no", "false", "")

_logs: OrderedDict[tuple[str, str], Log] = OrderedDict()


def keeps(spec: RunSpec) -> bool:
    """Whether a run of this spec is kept: its loss is built in. A run's key is the engine
    that trains it and ``repr(spec)`` (what :func:`toybench.experiment.run_experiments` already
    tells runs apart by)."""
    return parse_spec(spec.loss)[0] in BUILTIN


def cache_dir() -> Path | None:
    """Where runs are kept on disk (read at each call), or None when ``DAPO_TOY_CACHE`` is off."""
    value = os.environ.get("DAPO_TOY_CACHE")
    if value is not None:
        return None if value.strip().lower() in OFF else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dapo" / "toy-runs"


@lru_cache(maxsize=1)
def fingerprint() -> str:
    """What a run's result depends on besides its spec and engine: every source file of the
    ``toybench`` and ``dapo`` packages, torch's and numpy's versions and the CPU architecture
    (the same float64 sums round alike on it)."""
    import numpy
    import torch

    import dapo

    h = hashlib.sha256()
    for package in (Path(__file__).parent, Path(dapo.__file__).parent):
        for path in sorted(package.rglob("*.py")):
            h.update(path.relative_to(package.parent).as_posix().encode())
            h.update(path.read_bytes())
    h.update(f"torch {torch.__version__} numpy {numpy.__version__} {platform.machine()}".encode())
    return h.hexdigest()[:16]


def _path(root: Path, k: tuple[str, str]) -> Path:
    name = hashlib.sha256(f"{k[0]}\0{k[1]}".encode()).hexdigest()
    return root / fingerprint() / f"{name}.json.gz"


def _read(root: Path, k: tuple[str, str]) -> Log | None:
    path = _path(root, k)
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            kept = json.load(f)
        if kept["engine"] != k[0] or kept["spec"] != k[1]:
            raise ValueError("another run")
        log = kept["log"]
        if not isinstance(log, list) or not all(isinstance(m, dict) for m in log):
            raise ValueError("not a log")
        return [{str(key): v for key, v in m.items()} for m in log]
    except FileNotFoundError:
        return None
    except (OSError, EOFError, ValueError, KeyError, TypeError):  # truncated, corrupt, foreign
        path.unlink(missing_ok=True)
        return None


def _write(root: Path, k: tuple[str, str], log: Log) -> None:
    path = _path(root, k)
    tmp = None
    try:
        new = not path.parent.is_dir()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as raw, gzip.open(raw, "wt", encoding="utf-8", compresslevel=1) as f:
            json.dump({"engine": k[0], "spec": k[1], "log": log}, f, default=float)
        os.replace(tmp, path)
        if new:
            _prune(root)
    except OSError:  # a read-only or full disk: the run is still kept in memory
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _prune(root: Path) -> None:
    versions = sorted(
        (p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for old in versions[KEEP_VERSIONS:]:
        shutil.rmtree(old, ignore_errors=True)


def _hold(k: tuple[str, str], log: Log) -> None:
    """Keep ``log`` in this process as the most recently used run (the oldest go past MAX_RUNS)."""
    _logs[k] = log
    _logs.move_to_end(k)
    while len(_logs) > MAX_RUNS:
        _logs.popitem(last=False)


def get(k: tuple[str, str]) -> Log | None:
    """A copy of the run's log, or None if no process has trained it (or it was let go)."""
    log = _logs.get(k)
    if log is None:
        root = cache_dir()
        log = _read(root, k) if root is not None else None
        if log is None:
            return None
    _hold(k, log)
    return [dict(m) for m in log]


def put(k: tuple[str, str], log: Log) -> None:
    _hold(k, [dict(m) for m in log])
    root = cache_dir()
    if root is not None:
        _write(root, k, log)


def clear() -> None:
    """Forget every run this process holds (a caller timing a check from scratch sets
    ``DAPO_TOY_CACHE=off`` too)."""
    _logs.clear()
