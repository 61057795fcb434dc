"""Runs already trained in this process, kept for a later call that asks for the same run.

``dapo toy check`` trains, besides each candidate, the failure mode's unprotected and fix
arms; for every loss checked on the same seeds those are the same runs. A test file that
calls :func:`toybench.check.assert_protects` for several losses, or a notebook that checks
one loss after another, trains them once per process. Results do not change: a run is a
pure function of its :class:`~toybench.runner.RunSpec` and the engine that trains it (the
key is both), and :func:`toybench.experiment.run_experiments` already trains a run two
experiments share once per call on the same grounds.

Only runs of built-in losses (:data:`dapo.registry.BUILTIN`) are kept: a user's loss is
code that can change between two calls in one process (an edited module, a monkeypatch),
and so is a peer's. The CPU seconds a result reports count the runs its call trained.
"""

from __future__ import annotations

from collections import OrderedDict

from dapo.registry import BUILTIN, parse_spec

from .runner import RunSpec

Log = list[dict[str, float]]

MAX_RUNS = 512
"""Logs kept at most (the least recently used go first): a log of 150 steps takes ~0.4 MB, so
~200 MB at most. Enough for `dapo toy check`'s unprotected and fix arms on 4 modes x 2 x 10
seeds, and the built-in candidates of a few checks besides."""

_logs: OrderedDict[tuple[str, str], Log] = OrderedDict()


def keeps(spec: RunSpec) -> bool:
    """Whether a run of this spec is kept: its loss is built in. A run's key is the engine
    that trains it and ``repr(spec)`` (what :func:`toybench.experiment.run_experiments` already
    tells runs apart by)."""
    return parse_spec(spec.loss)[0] in BUILTIN


def get(k: tuple[str, str]) -> Log | None:
    """A copy of the run's log, or None if this process has not trained it (or let it go)."""
    log = _logs.get(k)
    if log is None:
        return None
    _logs.move_to_end(k)
    return [dict(m) for m in log]


def put(k: tuple[str, str], log: Log) -> None:
    _logs[k] = [dict(m) for m in log]
    _logs.move_to_end(k)
    while len(_logs) > MAX_RUNS:
        _logs.popitem(last=False)


def clear() -> None:
    """Forget every run (a caller timing a check from scratch)."""
    _logs.clear()
