"""What a reader is: it recognises its format from the file, and turns the file into raw rows
(the log's own names, ``step`` where the log has it, ``_run`` where the file holds several
runs).

Text logs are read as people publish them: stray binary bytes (a NUL in an NCCL debug line),
ANSI colours and cursor codes, ``\\r`` progress-bar redraws and Windows line ends are noise, not
reasons to refuse the file (:func:`clean_text`). A text format is recognised by how many of the
file's lines are its rows, anywhere in the file (a 700 KB config dump before the first metric
line is common), so the choice never rests on the first kilobytes."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

Rows = list[dict[str, Any]]

ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
"""ANSI escape sequences: CSI (colours, cursor moves), OSC (titles, links), two-byte escapes."""
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""Control characters other than tab, newline and carriage return."""


class RunLogError(ValueError):
    """A metrics file that cannot be read; the message names the file and line."""


def clean_text(data: bytes) -> str:
    """A log's text: UTF-8 (undecodable bytes replaced), escape sequences and control
    characters removed, every ``\\r\\n`` and lone ``\\r`` (a progress bar redrawn) a line break."""
    text = data.decode("utf-8", errors="replace")
    text = CONTROL.sub("", ESCAPES.sub("", text))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def is_binary(data: bytes) -> bool:
    """Whether ``data`` (a file's first bytes) is not text: more than 10% control bytes other
    than tab, newline, carriage return and escape. One NUL in a text log is not binary."""
    if not data:
        return False
    control = sum(b < 32 and b not in (9, 10, 13, 27) for b in data) + data.count(127)
    return control > 0.1 * len(data)


class Text:
    """A file's cleaned text and its lines, read once and shared by every reader that sniffs it."""

    def __init__(self, path: Path):
        self.path = path
        if path.is_dir():
            self.raw = b""
        else:
            with path.open("rb") as fh:
                self.raw = fh.read()

    @cached_property
    def binary(self) -> bool:
        return is_binary(self.raw[:65536])

    @cached_property
    def text(self) -> str:
        return "" if self.binary else clean_text(self.raw)

    @cached_property
    def lines(self) -> list[str]:
        return self.text.split("\n")

    @property
    def head(self) -> str:
        return self.text[:65536]


@dataclass(frozen=True)
class Reader:
    name: str
    """The ``--format`` name."""
    describe: str
    """What it reads, for ``--help`` and the detection error."""
    sniff: Callable[[Path, Text], int]
    """How strongly a file is in this format: for a text format, the number of its lines that are
    rows of it with at least one metric this tool knows; for a structured format (a JSON
    document, a CSV, event files), :data:`CERTAIN` when its name and first bytes say so. 0: not
    this format."""
    read: Callable[[Path], tuple[Rows, list[str]]]
    """The file's rows and reading notes; raises :class:`RunLogError` naming file and line."""


CERTAIN = 1 << 40
"""The sniff score of a structured format recognised by its name and header."""
SAMPLE = 400
"""Candidate lines a text reader parses to sniff a file; more are sampled evenly."""


def count_rows(lines: list[str], candidate: Callable[[str], bool], is_row: Callable[[str], bool]) -> int:
    """How many of ``lines`` are rows: every line that passes the cheap ``candidate`` test, times
    the share of them that ``is_row`` confirms (all of them when there are at most
    :data:`SAMPLE`, else an even sample across the whole file, so a long preamble or a
    1 MB log costs the same)."""
    found = [line for line in lines if candidate(line)]
    if len(found) <= SAMPLE:
        return sum(map(is_row, found))
    step = len(found) / SAMPLE
    sample = [found[int(i * step)] for i in range(SAMPLE)]
    return round(len(found) * sum(map(is_row, sample)) / SAMPLE)


def text_lines(path: Path) -> tuple[list[str], bool]:
    """The file's cleaned lines (:func:`clean_text`) and whether its last line is complete (a log
    that is still being written may end mid-line)."""
    data = path.read_bytes()
    return clean_text(data).split("\n"), data.endswith((b"\n", b"\r"))
