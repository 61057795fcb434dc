"""This project's ``metrics.jsonl`` (one JSON object per step), and any JSONL of metric names:
verl's file logger (``{"step": n, "data": {...}}``), W&B ``history`` dumps (``_step``),
LLaMA-Factory's ``trainer_log.jsonl`` (``current_steps``). A record with neither a step nor a
metric (a ``{"type": "config", ...}`` line that custom loggers write first) is skipped and said;
a record with metrics but no step, among records with one, is an error naming its line; a file
whose records never carry a step (a user's own ``json.dumps(metrics)`` per logging call) has
its rows numbered, and says so. A last line that is not valid JSON (a log cut mid-record by a
crash, a copy or a writer still running) is skipped and said."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .base import CERTAIN, Reader, Rows, RunLogError, Text, count_rows, text_lines
from .names import metric_name

STEP_KEYS = (
    "step",
    "train/global_step",
    "global_step",
    "global_step/max_steps",
    "_step",
    "update",
    "iteration",
    "current_steps",
)
"""Where a row's training step is, in order of preference (W&B's ``_step`` counts log calls,
which is the training step only when the trainer passes it; ms-swift logs
``"global_step/max_steps": "12/547"``; custom loggers ``update`` or ``iteration``)."""


def step_of(row: dict[str, Any]) -> object:
    step = next((row[k] for k in STEP_KEYS if k in row), None)
    if isinstance(step, str) and "/" in step:  # "12/547"
        step = step.partition("/")[0].strip()
    return step


def _read(path: Path) -> tuple[Rows, list[str]]:
    rows: Rows = []
    notes: list[str] = []
    unstepped: list[int] = []
    lines, complete = text_lines(path)
    last = max((i for i, line in enumerate(lines, 1) if line.strip()), default=0)
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.strip() in ("...", "…"):  # rows left out where the log was pasted
            notes.append(f"{path}:{i}: '...' (rows left out) skipped")
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if i == last:
                still = " (the run is still being written?)" if not complete else " (cut mid-record)"
                notes.append(f"{path}:{i}: partial last line skipped{still}")
                continue
            raise RunLogError(f"{path}:{i}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise RunLogError(f"{path}:{i}: expected a JSON object per line, got {type(row).__name__}")
        if isinstance(row.get("data"), dict):  # verl's file logger: {"step": n, "data": {...}}
            row = {"step": row.get("step"), **row["data"]}
        if step_of(row) is None:
            if not any(metric_name(k) for k in row):  # a record of the run's config, not a step
                notes.append(f"{path}:{i}: a record without a step or a metric (the run's config?) skipped")
                continue
            unstepped.append(i)
        else:
            row["step"] = step_of(row)
        row["_line"] = i
        label = "/".join(f"{k}={row[k]}" for k in ("experiment", "arm", "seed") if k in row)
        if label:
            row["_run"] = label
        rows.append(row)
    if unstepped and len(unstepped) < len(rows):
        raise RunLogError(f"{path}:{unstepped[0]}: no 'step' field (nor {', '.join(STEP_KEYS[1:])})")
    if unstepped:
        for n, row in enumerate(rows, 1):
            row["step"] = n
        notes.append(
            f"{path}: no record has a step ({', '.join(STEP_KEYS)}): rows are numbered 1..{len(rows)}"
        )
    return rows, notes


def _sniff(path: Path, text: Text) -> int:
    """Lines that are JSON objects with a step and a metric this tool knows (a ``.jsonl`` file:
    certain)."""
    if path.suffix == ".jsonl":
        return CERTAIN
    if path.suffix == ".json":
        return 0

    def is_row(line: str) -> bool:
        try:
            row = json.loads(line)
        except ValueError:
            return False
        if isinstance(row, dict) and isinstance(row.get("data"), dict):
            row = {"step": row.get("step"), **row["data"]}
        return isinstance(row, dict) and step_of(row) is not None and any(metric_name(k) for k in row)

    return count_rows(text.lines, lambda line: line.startswith("{") and '"' in line, is_row)


READER = Reader(
    "jsonl", "one JSON object per step: this project, verl's file logger, W&B history", _sniff, _read
)
