"""Reading training logs as printed or exported by this project, verl, TRL, OpenRLHF, custom
trainers, W&B and TensorBoard: one module per format, detected from the file. Every reader
gives raw rows; the names are mapped onto :data:`dapo.schema.SCHEMA` here, once, by
:mod:`.names`.

Detection: a structured format (event files, a ``.wandb`` run, a JSON document, a CSV) by its
name and header; a text log by which reader finds the most rows with a known metric anywhere
in the file (ties: the order of :data:`READERS`). A file no reader finds a row in is refused
with the formats tried, never with a parse error from a reader that does not fit.

In a console log, lines that are not rows are noise; a line of a structured format (JSONL, CSV,
JSON) that does not parse is an error naming the file and line. A log that is still being
written may end in a partial line: it is skipped (and said).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import (
    custom_kv,
    hf_table,
    jsonl,
    tensorboard,
    trl_console,
    trl_state,
    verl_console,
    wandb,
    wandb_offline,
)
from .base import CERTAIN, Reader, RunLogError, Text
from .names import columns, metric_name, normalize, number, parse_map, user_names

READERS: dict[str, Reader] = {
    r.name: r
    for r in (
        tensorboard.READER,
        wandb_offline.READER,
        trl_state.READER,
        wandb.JSON_READER,
        jsonl.READER,
        verl_console.READER,
        trl_console.READER,
        custom_kv.READER,
        hf_table.READER,
        wandb.CSV_READER,
    )
}
"""The formats; a structured one claims a file first, then text logs go to the reader with the
most rows (ties in this order)."""
FORMATS = ("auto", *READERS)
DIR_FILES = ("metrics.jsonl", "trainer_state.json")
"""A run directory's own log: this project's, transformers'."""
WANDB_CONSOLE = "files/output.log"
"""A W&B run directory's captured console, read when the directory has no ``.wandb`` file."""

Runs = dict[str, list[dict[str, float]]]
STRICT = ("jsonl", "wandb-json", "wandb-csv", "trl-state")
"""Formats whose every row is a metric row: a metric that is not a number there is an error (in a
console log, a line that happens to look like a row is noise)."""


def resolve(path: str | Path) -> Path:
    """The log of ``path``: the file itself, or in a run directory, in this order, its
    ``metrics.jsonl`` or ``trainer_state.json``, its W&B runs (``.wandb``), a W&B run's captured
    console (``files/output.log``), its TensorBoard event files."""
    path = Path(path)
    if path.is_dir():
        for name in DIR_FILES:
            if (path / name).is_file():
                return path / name
        if wandb_offline.run_files(path):
            return path
        if (path / WANDB_CONSOLE).is_file():
            return path / WANDB_CONSOLE
        if tensorboard.event_files(path):
            return path
        raise RunLogError(
            f"{path}: no {', '.join(DIR_FILES)}, W&B run-*.wandb, {WANDB_CONSOLE} or TensorBoard event files "
            "in this directory"
        )
    if not path.exists():
        raise RunLogError(f"{path}: no such file or directory")
    if not path.is_file():
        raise RunLogError(f"{path}: not a regular file")
    return path


def detect(path: Path) -> Reader:
    """The reader whose format ``path`` is in; the error names every format tried and what
    the first line looked like."""
    text = Text(path)
    scores = {name: reader.sniff(path, text) for name, reader in READERS.items()}
    best = max(scores, key=lambda name: scores[name])  # the first of equals: READERS' order
    if scores[best] > 0:
        return READERS[best]
    if text.binary:
        shown = "binary data"
    else:
        first = next((line for line in text.lines if line.strip()), "")
        shown = f"its first line: {first[:100]!r}"
    raise RunLogError(
        f"{path}: not a log format this tool reads: no line is a metric row of any of them "
        f"(tried {', '.join(READERS)}); {shown}"
    )


def schema_row(raw: Mapping[str, Any]) -> dict[str, float]:
    """A raw row in the schema: its numeric ``step`` (an integer where it is one) and the
    metrics this tool knows (:func:`.names.normalize`). The trainer's live monitor reads its
    rows through this too, so live and offline verdicts rest on the same numbers."""
    step = raw["step"]
    return {"step": int(step) if float(step).is_integer() else float(step), **normalize(raw)}


@dataclass(frozen=True)
class Reading:
    """What was read from a log: its runs in the schema, the reading notes, the format, and the
    columns: each numeric column read (with the metric it was read as) and each not read."""

    runs: Runs
    notes: list[str]
    format: str
    read: dict[str, str]
    unread: list[str]

    def columns_said(self) -> list[str]:
        """What the reader recognised and what it left, as lines for the user."""
        out = []
        if self.read:
            out.append(_read_said(self.read))
        if self.unread:
            out.append(_unread_hint(self.unread))
        return out


def read_runs(
    path: str | Path, fmt: str = "auto", names: Mapping[str, str] | None = None
) -> tuple[Runs, list[str], str]:
    """The runs in a log, keyed by a label (one run, ``run``, unless the file holds several),
    in this schema and sorted by step; with reading notes and the format read (:func:`read_log`)."""
    r = read_log(path, fmt, names)
    return r.runs, r.notes, r.format


def read_log(path: str | Path, fmt: str = "auto", names: Mapping[str, str] | None = None) -> Reading:
    """:func:`read_runs` with the columns said: which numeric columns were read as what, and
    which were not (to map with ``names``: the user's own column names, :func:`.names.parse_map`,
    ``dapo diagnose --map``; None: the names already in force)."""
    if names is None:
        return _read_log(resolve(path), fmt)
    with user_names(names):
        return _read_log(resolve(path), fmt)


READ_LISTED = 8
"""Up to this many columns read are named one by one; more are counted per prefix."""


def _read_said(read: dict[str, str]) -> str:
    """``read: a, b as rollout/accuracy``, or for many columns ``read 41 columns: rollout/ 9,
    actor/ 12, ...`` with the renamed ones (the user's to check) still named."""
    renamed = [f"{k} as {v}" for k, v in read.items() if k != v]
    if len(read) <= READ_LISTED:
        return "read: " + ", ".join(f"{k} as {v}" if k != v else k for k, v in read.items())
    groups: dict[str, int] = {}
    for k in read:
        group = k.split("/", 1)[0] + "/" if "/" in k else "(top level)"
        groups[group] = groups.get(group, 0) + 1
    said = f"read {len(read)} columns: " + ", ".join(f"{g} {n}" for g, n in groups.items())
    if renamed:
        shown = ", ".join(renamed[:READ_LISTED]) + (
            f" and {len(renamed) - READ_LISTED} more" if len(renamed) > READ_LISTED else ""
        )
        said += f"; read under another name: {shown}"
    return said


RESEMBLES = {
    "reward": "reward",
    "rewards": "reward",
    "return": "reward",
    "accuracy": "accuracy",
    "acc": "accuracy",
    "correct": "accuracy",
    "correctness": "accuracy",
    "entropy": "entropy",
    "kl": "kl",
    "grad": "grad_norm",
    "gradnorm": "grad_norm",
    "gnorm": "grad_norm",
    "loss": "loss",
    "length": "completion_length",
    "len": "completion_length",
}
"""Words in a column's name that make it plausibly one of the metrics ``--map`` takes."""


NOT_A_METRIC = frozenset(
    {"coef", "coeff", "beta", "weight", "target", "lr", "scale", "time", "seconds", "ms"}
)
"""Words that make a column a setting or a timer, whatever else its name says (``kl_coef``)."""


def resembles(column: str) -> str | None:
    """The metric name an unread column plausibly is (``toy/expected_accuracy``: ``accuracy``), by
    the words of its name; None for a column nothing suggests is a metric (``seed``, ``cost/...``)
    or one that names a setting or a timer (``kl_coef``, ``reward_time``)."""
    words = re.split(r"[^a-z0-9]+", column.lower())
    if NOT_A_METRIC.intersection(words):
        return None
    for word in reversed(words):
        if word in RESEMBLES:
            return RESEMBLES[word]
    return None


def _unread_hint(unread: list[str]) -> str:
    shown = ", ".join(unread[:12]) + (f" and {len(unread) - 12} more" if len(unread) > 12 else "")
    said = f"numeric column(s) not read, their names being unknown here: {shown}"
    like = [(c, resembles(c)) for c in unread]
    like = [(c, m) for c, m in like if m is not None]
    if like:
        maps = ", ".join(f"--map '{c.replace(chr(39), '')}={m}'" for c, m in like[:3])
        return f"{said}; if one is the metric its name suggests, map it: {maps}"
    return f"{said}; none is named like a metric this tool reads (to map one anyway: --map 'COLUMN=reward')"


def _read_log(file: Path, fmt: str) -> Reading:
    if fmt != "auto" and fmt not in READERS:
        raise RunLogError(f"unknown format {fmt!r} ({', '.join(FORMATS)})")
    try:
        reader = detect(file) if fmt == "auto" else READERS[fmt]
    except RunLogError as err:
        tables = [row for _, row in hf_table._rows(Text(file).lines)] if not file.is_dir() else []
        _, unread = columns(tables)
        if unread:
            raise RunLogError(
                f"{file}: a table of {len(tables)} row(s) with a step column, but no column this tool knows; "
                + _unread_hint(unread)
            ) from None
        raise err
    rows, notes = reader.read(file)
    read, unread = columns(rows)
    runs: Runs = {}
    nonnumeric: list[str] = []
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
                if reader.name in STRICT:
                    raise RunLogError(f"{where}: {key}: expected a number, got {value!r}")
                nonnumeric.append(f"{where}: {key}: {value!r}")
        row = schema_row({**raw, "step": step})
        if len(row) > 1:
            runs.setdefault(str(raw.get("_run", "run")), []).append(row)
    if nonnumeric:
        notes.append(f"{len(nonnumeric)} known metric(s) without a number skipped, first {nonnumeric[0]}")
    if not runs:
        hint = "" if fmt == "auto" else f" (read as --format {fmt}; try --format auto)"
        why = f" ({notes[0]})" if notes else ""
        said = f"; {_unread_hint(unread)}" if unread else ""
        raise RunLogError(
            f"{file}: no metric this tool knows occurs in the {reader.name} rows{hint}{why}{said}"
        )
    for run in runs.values():
        run.sort(key=lambda r: r["step"])
        _accuracy_in_range(run, notes)
    return Reading(runs, notes, reader.name, read, unread)


def _accuracy_in_range(run: list[dict[str, float]], notes: list[str]) -> None:
    """A column read as an accuracy (a share of right answers) whose values leave [0, 1] is not
    one (a correctness *reward* of 0 or 2, as Unsloth's GSM8K notebook scores): it is dropped,
    said, and the run judged by its reward."""
    acc = [r["rollout/accuracy"] for r in run if math.isfinite(r.get("rollout/accuracy", math.nan))]
    if acc and (min(acc) < 0 or max(acc) > 1):
        for r in run:
            r.pop("rollout/accuracy", None)
        notes.append(
            f"the accuracy column ranges {min(acc):.3g}..{max(acc):.3g}, which no share of right answers does: "
            "not read as an accuracy (the reward is judged instead)"
        )


__all__ = [
    "CERTAIN",
    "DIR_FILES",
    "FORMATS",
    "READERS",
    "WANDB_CONSOLE",
    "Reader",
    "Reading",
    "RunLogError",
    "Runs",
    "detect",
    "parse_map",
    "read_log",
    "read_runs",
    "resolve",
    "schema_row",
    "user_names",
]
