"""verl's console logger: one line per step, ``step:N - key:value - key:value ...``, often
behind a Ray prefix such as ``(main_task pid=1234)`` or ``(TaskRunner pid=...)``, sometimes
with ANSI colours."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .base import Reader, Rows, text_lines
from .names import number

LINE = re.compile(r"(?:^|\s|\))step:(\d+) - (.*)$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _read(path: Path) -> tuple[Rows, list[str]]:
    rows, skipped = [], 0
    lines, _ = text_lines(path)
    for i, raw in enumerate(lines, 1):
        m = LINE.search(ANSI.sub("", raw))
        if not m:
            continue
        row: dict[str, Any] = {"step": int(m.group(1)), "_line": i}
        for pair in m.group(2).split(" - "):
            key, sep, value = pair.rpartition(":")
            v = number(value) if sep else None
            if v is None:
                skipped += 1
                continue
            row[key.strip()] = v
        rows.append(row)
    notes = [f"{path}: {skipped} key:value pair(s) without a number skipped"] if skipped else []
    return rows, notes


def _sniff(path: Path, head: str) -> bool:
    return any(LINE.search(ANSI.sub("", line)) for line in head.splitlines())


READER = Reader("verl-console", "verl console lines 'step:N - key:value - ...'", _sniff, _read)
