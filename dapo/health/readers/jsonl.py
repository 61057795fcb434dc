"""This project's ``metrics.jsonl`` (one JSON object per step), and any JSONL of metric names:
verl's file logger (``{"step": n, "data": {...}}``), W&B ``history`` dumps (``_step``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .base import Reader, Rows, RunLogError, text_lines

STEP_KEYS = ("step", "train/global_step", "global_step", "_step")
"""Where a row's training step is, in order of preference (W&B's ``_step`` counts log calls,
which is the training step only when the trainer passes it)."""


def step_of(row: dict[str, Any]) -> object:
    return next((row[k] for k in STEP_KEYS if k in row), None)


def _read(path: Path) -> tuple[Rows, list[str]]:
    rows, notes = [], []
    lines, complete = text_lines(path)
    last = max((i for i, line in enumerate(lines, 1) if line.strip()), default=0)
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if i == last and not complete:
                notes.append(f"{path}:{i}: partial last line skipped (the run is still being written?)")
                continue
            raise RunLogError(f"{path}:{i}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise RunLogError(f"{path}:{i}: expected a JSON object per line, got {type(row).__name__}")
        if isinstance(row.get("data"), dict):  # verl's file logger: {"step": n, "data": {...}}
            row = {"step": row.get("step"), **row["data"]}
        if step_of(row) is None:
            raise RunLogError(f"{path}:{i}: no 'step' field (nor {', '.join(STEP_KEYS[1:])})")
        row["step"] = step_of(row)
        row["_line"] = i
        label = "/".join(f"{k}={row[k]}" for k in ("experiment", "arm", "seed") if k in row)
        if label:
            row["_run"] = label
        rows.append(row)
    return rows, notes


def _sniff(path: Path, head: str) -> bool:
    first = next((line for line in head.splitlines() if line.strip()), "")
    return first.lstrip().startswith("{") and '"' in first and path.suffix != ".json"


READER = Reader(
    "jsonl", "one JSON object per step: this project, verl's file logger, W&B history", _sniff, _read
)
