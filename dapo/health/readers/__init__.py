"""Reading training logs as printed or exported by this project, verl, TRL, OpenRLHF, W&B and
TensorBoard: one module per format, detected from the file. Every reader gives raw rows; the
names are mapped onto :data:`dapo.schema.SCHEMA` here, once, by :mod:`.names`.

A log that is still being written may end in a partial line: it is skipped (and said). Any
other malformed line is an error that names the file and the line.
"""

from __future__ import annotations

import math
from pathlib import Path

from . import jsonl, tensorboard, trl_console, trl_state, verl_console, wandb
from .base import Reader, RunLogError
from .names import metric_name, normalize, number

READERS: dict[str, Reader] = {
    r.name: r
    for r in (
        tensorboard.READER,
        trl_state.READER,
        wandb.JSON_READER,
        jsonl.READER,
        verl_console.READER,
        trl_console.READER,
        wandb.CSV_READER,
    )
}
"""The formats, in the order auto-detection tries them."""
FORMATS = ("auto", *READERS)
DIR_FILES = ("metrics.jsonl", "trainer_state.json")

Runs = dict[str, list[dict[str, float]]]


def resolve(path: str | Path) -> Path:
    """The log file of ``path``: the file itself, or a run directory's ``metrics.jsonl``,
    ``trainer_state.json`` or TensorBoard event files."""
    path = Path(path)
    if path.is_dir():
        for name in DIR_FILES:
            if (path / name).is_file():
                return path / name
        if tensorboard.event_files(path):
            return path
        raise RunLogError(f"{path}: no {', '.join(DIR_FILES)} or TensorBoard event files in this directory")
    if not path.is_file():
        raise RunLogError(f"{path}: no such file")
    return path


def _head(path: Path) -> str:
    if path.is_dir():
        return ""
    with path.open("rb") as fh:
        data = fh.read(65536)
    return "" if b"\0" in data else data.decode(errors="replace")


def detect(path: Path) -> Reader:
    """The reader whose format ``path`` is in; the error names every format tried and what
    the first line looked like."""
    head = _head(path)
    for reader in READERS.values():
        if reader.sniff(path, head):
            return reader
    first = next((line for line in head.splitlines() if line.strip()), "")
    shown = repr(first[:100]) if head else "binary data"
    raise RunLogError(
        f"{path}: not a log format this tool reads (tried {', '.join(READERS)}); its first line: {shown}"
    )


def read_runs(path: str | Path, fmt: str = "auto") -> tuple[Runs, list[str], str]:
    """The runs in a log, keyed by a label (one run, ``run``, unless the file holds several),
    in this schema and sorted by step; with reading notes and the format read."""
    file = resolve(path)
    if fmt != "auto" and fmt not in READERS:
        raise RunLogError(f"unknown format {fmt!r} ({', '.join(FORMATS)})")
    reader = detect(file) if fmt == "auto" else READERS[fmt]
    rows, notes = reader.read(file)
    runs: Runs = {}
    for raw in rows:
        where = f"{file}:{raw.get('_line', '?')}"
        step = raw.get("step")
        if isinstance(step, str):
            step = number(step)
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
            raise RunLogError(f"{where}: step is {raw.get('step')!r}, not a finite number")
        for key, value in raw.items():
            if isinstance(value, str) and metric_name(key) and number(value) is not None:
                raw[key] = number(value)  # some loggers print numbers as strings ('loss': '-0.1')
            elif value is not None and metric_name(key) and not isinstance(raw[key], (int, float)):
                raise RunLogError(f"{where}: {key}: expected a number, got {value!r}")
        row = {"step": float(step), **normalize(raw)}
        if len(row) > 1:
            runs.setdefault(str(raw.get("_run", "run")), []).append(row)
    if not runs:
        hint = "" if fmt == "auto" else f" (read as --format {fmt}; try --format auto)"
        raise RunLogError(f"{file}: no metric this tool knows occurs in the {reader.name} rows{hint}")
    for run in runs.values():
        run.sort(key=lambda r: r["step"])
    return runs, notes, reader.name


__all__ = ["FORMATS", "READERS", "Reader", "RunLogError", "Runs", "detect", "read_runs", "resolve"]
