"""Custom trainers' console lines: a step and ``key=value`` or ``key: value`` pairs, in the
many spellings people print them, e.g.

    step:12 | policy_loss=0.0312 | kl_divergence=0.0041 | mean_reward=0.18 | grad_norm=0.93
    Step 5/233: loss=0.41, reward=0.30, kl=0.012
    [iter 40] reward: 0.52  entropy: 0.81  grad_norm: 1.2

    Epoch:[1/1](12/500), Reward: 0.38, KL_ref: 0.0004, Actor Loss: 0.0000, Avg Len: 129

A line is a row when it names a step (``step``, ``global_step``, ``iter``, ``iteration``,
``update``: a number after it, ``/total`` allowed; or MiniMind's ``Epoch:[e/E](n/N)``, step
``(e - 1) N + n``) and at least one pair whose key this tool knows (:mod:`.names`; a key of
capitalised words, ``Actor Loss``, is read as ``actor_loss``). A line that is one known ``key: value`` (words allowed in the key, as
DeepSpeed-Chat's ``average reward score: 0.21``) within two lines of a row belongs to it.
Every other line (status lines, config dumps, tracebacks) is noise. In a row, the pairs whose
key is not known are kept under the key as printed: they are listed as unread, and the user
can map them (``--map``).

Two more spellings: MLX-LM's GRPO trainer separates its pairs by commas and a name from its
value by a space (``Iter 80: Train loss 0.000, Total rewards mean 0.000, KL 0.001, Peak mem
34.7 GB``); and some loops print no step at all (``[Epoch 0.28]  loss=-0.047  grad=0.084
reward=0.102±0.077``): in a file where no line names a step, a line with two or more known
``key=value`` pairs is a row, the rows are numbered, and the reader says so."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .base import Reader, Rows, Text, count_rows, text_lines
from .names import metric_name, number

STEP = re.compile(
    r"(?i)(?<![\w/])(?:global_step|step|iter|iteration|update)\s*[:=#]?\s*(\d+)(?:\s*/\s*\d+)?\b"
)
EPOCH_STEP = re.compile(r"(?i)\bepoch\s*[:=]?\s*\[\s*(\d+)\s*/\s*\d+\s*\]\s*\(\s*(\d+)\s*/\s*(\d+)\s*\)")
"""MiniMind's trainers: ``Epoch:[e/E](n/N)``, the n-th of N steps of epoch e."""
PAIR = re.compile(
    r"(?<![\w/.])([A-Za-z_][\w./-]*?(?: [A-Za-z][\w./-]*?){0,3})\s*[=:]\s*"
    r"((?:[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf))(?![\w.]))",
    re.IGNORECASE,
)


def parse(line: str) -> dict[str, Any] | None:
    """The row of a line, or None when the line names no step or no known metric."""
    if "=" not in line and ":" not in line:
        return None
    step = STEP.search(line) or EPOCH_STEP.search(line)
    if step is None:
        return None
    row, known = _pairs(line, step.end())
    if not known:
        row, known = _spaced(line[step.end() :])
    if not known:
        return None
    if step.re is STEP:
        row["step"] = int(step.group(1))
    else:
        e, n, total = (int(g) for g in step.groups())
        row["step"] = (e - 1) * total + n
    return row


def _pairs(line: str, start: int = 0, seps: str = "=:") -> tuple[dict[str, Any], int]:
    """The ``key=value`` / ``key: value`` pairs of ``line`` from ``start`` (unknown keys as
    printed), and how many known keys are joined to their value by one of ``seps``."""
    row: dict[str, Any] = {}
    known = 0
    for m in PAIR.finditer(line, start):
        key = _key(m.group(1))
        known += key is not None and line[m.end(1) : m.start(2)].strip() in seps
        row.setdefault(key if key is not None else m.group(1).strip(), number(m.group(2)))
    return row, known


SPACED = re.compile(
    r"^\s*([A-Za-z][\w./-]*(?: [A-Za-z][\w./-]*){0,4})\s+([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|[-+]?inf)"
    r"(?:\s*[A-Za-z%/]{1,4})?\s*$",
    re.IGNORECASE,
)
"""One comma-separated ``name value [unit]`` item (MLX-LM: ``Total rewards mean 0.000``)."""


def _spaced(rest: str) -> tuple[dict[str, Any], int]:
    row: dict[str, Any] = {}
    known = 0
    for item in rest.lstrip(" :]-|").split(","):
        m = SPACED.match(item)
        if m is None:
            continue
        key = _key(m.group(1))
        known += key is not None
        row.setdefault(key if key is not None else m.group(1).strip(), number(m.group(2)))
    return row, known


def unstepped(line: str) -> dict[str, Any] | None:
    """A line without a step with two or more known ``key=value`` pairs (a row where no line of
    the file names a step), else None."""
    if "=" not in line or STEP.search(line) or EPOCH_STEP.search(line):
        return None
    row, known = _pairs(line, seps="=")
    return row if known >= 2 else None


def _key(text: str) -> str | None:
    """The known key a pair's key stands for: as printed, else in lower case with its words
    joined by ``_`` (``Actor Loss`` -> ``actor_loss``); None for a key this tool does not read."""
    if metric_name(text) is not None:
        return text
    key = re.sub(r"\s+", "_", text.strip().lower())
    return key if metric_name(key) is not None else None


ALONE = re.compile(
    r"^\s*([A-Za-z][\w ./-]*?)\s*[:=]\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|[-+]?inf)\s*$"
)


def _continued(line: str) -> tuple[str, float] | None:
    """A line that is one known ``key: value`` pair (the key may hold spaces)."""
    m = ALONE.match(line) if ":" in line or "=" in line else None
    if m is None:
        return None
    key = re.sub(r"\s+", "_", m.group(1).strip().lower())
    value = number(m.group(2))
    return (key, value) if metric_name(key) and value is not None else None


def _rows(lines: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(lines, 1):
        row = parse(line)
        if row is not None:
            rows.append({**row, "_line": i})
        elif rows and i - rows[-1]["_line"] <= 2 and (pair := _continued(line)) is not None:
            rows[-1].setdefault(pair[0], pair[1])
    return rows


def _read(path: Path) -> tuple[Rows, list[str]]:
    lines, _ = text_lines(path)
    rows = _rows(lines)
    if rows:
        return rows, []
    loose = [{**row, "_line": i} for i, line in enumerate(lines, 1) if (row := unstepped(line)) is not None]
    for n, row in enumerate(loose, 1):
        row["step"] = n
    note = (
        f"{path}: no line names a step: the {len(loose)} rows of key=value pairs are numbered 1..{len(loose)}"
    )
    return loose, [note] if loose else []


def _candidate(line: str) -> bool:
    low = line[:200].lower()
    return ("=" in line or ":" in line) and any(w in low for w in ("step", "iter", "update", "epoch"))


def _sniff(path: Path, text: Text) -> int:
    stepped = count_rows(text.lines, _candidate, lambda line: parse(line) is not None)
    if stepped:
        return stepped
    return count_rows(text.lines, lambda line: "=" in line, lambda line: unstepped(line) is not None)


READER = Reader(
    "custom-kv",
    "custom trainers' lines 'step N | key=value | ...' or 'step N: key: value ...'",
    _sniff,
    _read,
)
