"""Weights & Biases exports: a run's history as CSV or JSON (``_step`` / ``train/global_step``
plus one column per metric), and a panel's "Export CSV" (``Step`` plus ``<run> - <metric>``
columns, with ``__MIN``/``__MAX`` companions), which may hold several runs. Any CSV with a step
column and metric columns reads the same way."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from .base import CERTAIN, Reader, Rows, RunLogError, Text
from .jsonl import STEP_KEYS, step_of
from .names import number

CSV_STEP = (*STEP_KEYS, "Step")


def _read_csv(path: Path) -> tuple[Rows, list[str]]:
    with path.open(newline="") as fh:
        table = list(csv.reader(fh))
    if not table:
        raise RunLogError(f"{path}: empty file")
    header = [h.strip() for h in table[0]]
    step_col = next((header.index(k) for k in CSV_STEP if k in header), None)
    if step_col is None:
        raise RunLogError(f"{path}:1: no step column (one of {', '.join(CSV_STEP)}) in the header")
    rows = []
    for i, cells in enumerate(table[1:], 2):
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise RunLogError(f"{path}:{i}: {len(cells)} cells, the header has {len(header)}")
        step = number(cells[step_col])
        if step is None:
            raise RunLogError(f"{path}:{i}: step {cells[step_col]!r} is not a number")
        per_run: dict[str, dict[str, Any]] = {}
        for name, cell in zip(header, cells):
            if name in CSV_STEP or name.endswith(("__MIN", "__MAX")) or not cell.strip():
                continue
            run, sep, metric = name.rpartition(" - ")
            v = number(cell)
            if v is not None:
                per_run.setdefault(run if sep else "", {})[metric if sep else name] = v
        for run, row in per_run.items():
            rows.append({**row, "step": step, "_line": i, **({"_run": run} if run else {})})
    return rows, []


def _read_json(path: Path) -> tuple[Rows, list[str]]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise RunLogError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    history = data.get("history") if isinstance(data, dict) else data
    if not isinstance(history, list):
        raise RunLogError(f"{path}: expected a list of history rows (or {{'history': [...]}})")
    rows = []
    for i, row in enumerate(history):
        if not isinstance(row, dict) or step_of(row) is None:
            raise RunLogError(f"{path}: history[{i}]: expected an object with one of {', '.join(STEP_KEYS)}")
        rows.append({**row, "step": step_of(row), "_line": f"history[{i}]"})
    return rows, []


def _sniff_csv(path: Path, text: Text) -> int:
    first = text.head.split("\n", 1)[0]
    header = [h.strip().strip('"') for h in first.split(",")]
    return CERTAIN if path.suffix == ".csv" or any(k in header for k in CSV_STEP) else 0


def _sniff_json(path: Path, text: Text) -> int:
    head = text.head
    known = '"_step"' in head or '"history"' in head or '"train/global_step"' in head
    return CERTAIN if path.suffix == ".json" and known else 0


CSV_READER = Reader(
    "wandb-csv", "W&B CSV export (run history or panel) or any CSV with a step column", _sniff_csv, _read_csv
)
JSON_READER = Reader("wandb-json", "W&B history as a JSON list of rows with _step", _sniff_json, _read_json)
