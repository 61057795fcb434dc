"""verl's console logger: one line per step, ``step:N - key:value - key:value ...``, often
behind a Ray prefix such as ``(main_task pid=1234)`` or ``(TaskRunner pid=...)``, sometimes
with ANSI colours (removed with the rest of the noise by :func:`.base.clean_text`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .base import Reader, Rows, Text, count_rows, text_lines
from .names import metric_name, number

LINE = re.compile(r"(?:^|\s|\))step:(\d+) - (.*)$")


def parse(line: str) -> tuple[dict[str, Any], int] | None:
    """The row of a line (``step`` and every ``key:number`` pair) and the pairs without a
    number, or None when the line is not a step line."""
    m = LINE.search(line) if "step:" in line else None
    if not m:
        return None
    row: dict[str, Any] = {"step": int(m.group(1))}
    skipped = 0
    for pair in m.group(2).split(" - "):
        key, sep, value = pair.rpartition(":")
        v = number(value) if sep else None
        if v is None:
            skipped += 1
            continue
        row[key.strip()] = v
    return row, skipped


def _read(path: Path) -> tuple[Rows, list[str]]:
    rows, skipped = [], 0
    lines, _ = text_lines(path)
    for i, line in enumerate(lines, 1):
        parsed = parse(line)
        if parsed is None:
            continue
        row, bad = parsed
        skipped += bad
        rows.append({**row, "_line": i})
    notes = [f"{path}: {skipped} key:value pair(s) without a number skipped"] if skipped else []
    return rows, notes


def _is_row(line: str) -> bool:
    parsed = parse(line)
    return parsed is not None and any(metric_name(k) for k in parsed[0])


def _sniff(path: Path, text: Text) -> int:
    return count_rows(text.lines, lambda line: "step:" in line, _is_row)


READER = Reader("verl-console", "verl console lines 'step:N - key:value - ...'", _sniff, _read)
