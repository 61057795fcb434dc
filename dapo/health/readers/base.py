"""What a reader is: it recognises its format from the file's name and first lines, and turns
the file into raw rows (the log's own names, ``step`` where the log has it, ``_run`` where the
file holds several runs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Rows = list[dict[str, Any]]


class RunLogError(ValueError):
    """A metrics file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Reader:
    name: str
    """The ``--format`` name."""
    describe: str
    """What it reads, for ``--help`` and the detection error."""
    sniff: Callable[[Path, str], bool]
    """Whether a file is in this format, from its path and its first lines (text, or "" when
    the file is binary)."""
    read: Callable[[Path], tuple[Rows, list[str]]]
    """The file's rows and reading notes; raises :class:`RunLogError` naming file and line."""


def text_lines(path: Path) -> tuple[list[str], bool]:
    """The file's lines (``\\r`` from progress bars counts as a line break) and whether its last
    line is complete (a log that is still being written may end mid-line)."""
    text = path.read_text(errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), text.endswith(("\n", "\r"))
