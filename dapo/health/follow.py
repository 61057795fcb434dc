"""``dapo diagnose RUN --follow``: re-read a growing log and print a line whenever a run's
verdict or a rule's status changes."""

from __future__ import annotations

import time
from collections.abc import Callable

from .config import HealthConfig
from .readers import RunLogError, read_runs, resolve
from .rules import Knobs
from .verdict import diagnose, verdict

State = dict[str, tuple[str, dict[str, str]]]


def changes(before: State, after: State) -> list[tuple[str, str]]:
    """(run, line) for each run whose verdict or rule statuses changed."""
    lines = []
    for label, (v, rules) in after.items():
        old_v, old_rules = before.get(label, ("-", {}))
        moved = [f"{r} {old_rules.get(r, '-')} -> {s}" for r, s in rules.items() if old_rules.get(r) != s]
        if v != old_v or moved:
            lines.append((label, f"{label}: {old_v} -> {v}" + (f" ({'; '.join(moved)})" if moved else "")))
    return lines


def follow(
    path: str,
    fmt: str,
    config: HealthConfig,
    knobs: Knobs,
    interval: float,
    until_idle: float | None,
    emit: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> State:
    """Poll ``path`` every ``interval`` seconds; stop once it has not changed for ``until_idle``
    seconds (never, if None). A log that does not exist yet, or has no metric row yet, is
    waited for, with a line saying so; one that still does not exist when ``until_idle`` runs
    out is an error, as is a malformed line."""
    state: State = {}
    seen: tuple[float, int] | None = None
    idle = 0.0
    existed = False
    while True:
        try:
            file = resolve(path)
            stat = file.stat()
            stamp: tuple[float, int] | None = (stat.st_mtime, stat.st_size)
            existed = True
        except RunLogError as err:
            if not existed and idle == 0:
                emit(f"waiting for {path}: {str(err).removeprefix(f'{path}: ')}")
            stamp = None
        if not existed and until_idle is not None and idle >= until_idle:
            raise RunLogError(f"{path}: still no log after waiting {idle:g} s (--until-idle)")
        if stamp != seen:
            seen, idle = stamp, 0.0
            if stamp is not None:
                try:
                    runs, _, _ = read_runs(path, fmt)
                except RunLogError as err:
                    if "no metric" not in str(err):
                        raise
                    runs = {}
                now: State = {}
                for label, run in runs.items():
                    fs = diagnose(run, config, knobs)
                    now[label] = (verdict(fs, config).status, {f.rule: f.status for f in fs})
                for label, line in changes(state, now):
                    emit(f"[step {runs[label][-1]['step']:g}] {line}")
                state = now
        elif until_idle is not None and idle >= until_idle:
            return state
        sleep(interval)
        idle += interval
