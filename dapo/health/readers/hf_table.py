"""The training table that transformers' notebook progress callback (and Unsloth's) draws in a
Jupyter notebook, as people paste it into issues and READMEs: a header row that starts with
``Step`` and one row per logged step, cells separated by ``|`` (a markdown table) or tabs::

    Step | Training Loss | reward | reward_std | completion_length | kl
    -- | -- | -- | -- | -- | --
    1 | 0.000000 | -17.250000 | 1.500000 | 445.500000 | 0.000000

The same table printed by a script, columns aligned with spaces and a rule line under the
header (``Step  loss  grad_norm  reward_mean``, ``----``, ``Step | Pre | KL | GradN``), is read
too; a whitespace-aligned header must be all names (no number in it), and rows elided with
``...`` are skipped.

Column names are the logged names, with "Training Loss" for ``loss`` and ``rewards / f`` for
``rewards/f``. The same reader takes the tables people type into run journals
(``| Step | Loss | Reward | KL |``): a header is matched case-insensitively, with units in
parentheses dropped and spaces read as underscores (``Grad Norm`` -> ``grad_norm``); a cell in
percent is a share (``18.0%`` -> 0.18), and a reward given in percent a success rate
(accuracy).

Any table whose header names a step column (``Step``, ``Iter``, ``Iteration``, ``Update``,
``global_step``), wherever it stands (a wall-clock ``Time`` column before it is common), is
read column by column: every numeric column is kept under its header, those with a known name
are judged, the others are listed by :func:`dapo.health.readers.read_runs` with how to map them
(``--map 'Pre=reward'``). A table counts toward detecting the format only by its rows with a
known metric."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .base import Reader, Rows, Text, text_lines
from .names import metric_name, number

SPLIT = re.compile(r"\s*\|\s*|\t+")
RENAME = {"training loss": "loss", "validation loss": "eval_loss"}
UNITS = re.compile(r"\s*\([^)]*\)\s*")
COUNT = re.compile(r"\s*\(\s*\d+\s*/\s*\d+\s*\)\s*$")
"""A count after a share in a cell: ``68.0% (34/50)``."""


def _cells(line: str) -> list[str]:
    cells = SPLIT.split(line.strip().strip("|").strip())
    return [c.strip() for c in cells]


RULE = re.compile(r"^[\s|:+=-]*-[\s|:+=-]*$")
"""A line drawn under a header (``----``, ``-- | --``, ``+-----+``, ``====``)."""


STEP_NAMES = ("step", "steps", "iter", "iteration", "update", "global_step")


def _header(cells: list[str], spaced: bool = False) -> tuple[int, list[str]] | None:
    """The step column's index and each column's name, when ``cells`` are a header: a step
    column and at least one other; spaced headers hold no number ('step 5 loss 0.3' is a row of
    another format)."""
    lowered = [c.strip("`*_ ").lower() for c in cells]
    at = next((i for i, c in enumerate(lowered) if c in STEP_NAMES), None)
    if at is None or len(cells) < 2 or at > 2:
        return None
    if spaced and any(number(c) is not None for c in cells):
        return None
    return at, [_name(c) for c in cells]


def _name(cell: str) -> str:
    """A column's metric name: as logged (in `backticks` too), or normalised as people type it
    in a journal; a name this tool does not know stays as written (the user maps it)."""
    cell = re.sub(r"^[^\w(]+", "", cell.strip("`*_ "))  # a leading emoji or mark ('🏆 Eval Reward')
    name = re.sub(r"\s*/\s*", "/", cell)
    if name in RENAME or metric_name(name):
        return RENAME.get(name, name)
    lower = UNITS.sub(" ", cell.lower()).strip()
    typed = RENAME.get(lower, re.sub(r"\s+", "_", re.sub(r"\s*/\s*", "/", lower)))
    return typed if metric_name(typed) else cell


def _rows(lines: list[str]) -> list[tuple[int, dict[str, Any]]]:
    """Every table row with at least one numeric cell besides its step."""
    out: list[tuple[int, dict[str, Any]]] = []
    header: tuple[int, list[str]] | None = None
    spaced = False  # the header's cells were separated by spaces, not '|' or tabs
    for i, line in enumerate(lines, 1):
        if header is not None and RULE.match(line):
            continue
        piped = "|" in line or "\t" in line
        cells = _cells(line) if piped else line.split()
        found = _header(cells, spaced=not piped)
        if found is not None:
            header, spaced = found, not piped
            continue
        if not piped and not spaced:
            header = None if line.strip() else header
            continue
        at = header[0] if header is not None else 0
        if len(cells) > at:
            cells[at] = cells[at].strip("*_ ")  # a step in **bold** (a journal marking the row)
        if header is None or len(cells) != len(header[1]) or not cells[at].isdigit():
            if not piped and line.strip() and line.strip() != "..." and not cells[0].isdigit():
                header = None  # a table of spaced columns ends at the first line that is not a row
            continue
        row: dict[str, Any] = {"step": int(cells[at])}
        for j, (name, cell) in enumerate(zip(header[1], cells)):
            if j == at:
                continue
            cell = COUNT.sub("", cell.strip("*_ ")).strip("*_ ")  # **bold** in a journal; '68.0% (34/50)'
            percent = cell.endswith("%")
            v = number(cell.removesuffix("%"))
            if v is None:
                continue
            if percent or name.endswith("%"):  # a share: a reward given in percent is a success rate
                v /= 100
                name = "accuracy" if metric_name(name) == "rollout/reward_mean" and percent else name
            row[name] = v
        if len(row) > 1:
            out.append((i, row))
    return out


def _read(path: Path) -> tuple[Rows, list[str]]:
    lines, _ = text_lines(path)
    return [{**row, "_line": i} for i, row in _rows(lines)], []


def _sniff(path: Path, text: Text) -> int:
    return sum(any(metric_name(k) for k in row if k != "step") for _, row in _rows(text.lines))


READER = Reader(
    "hf-table",
    "notebook training tables 'Step | Training Loss | reward | ...' (transformers, Unsloth)",
    _sniff,
    _read,
)
