"""TRL (transformers ``Trainer``) console output: a Python dict per logging step, e.g.
``{'loss': 0.07, 'grad_norm': 47.75, 'reward': 0.5, ..., 'epoch': 0.01}``, amid tqdm progress
bars (``12%|█▏   | 12/100 [01:02<07:40, 5.2s/it]``). The dict carries no step: it is the step
of the last progress bar before it, or the dict's position when the log has no bars.

Dicts are parsed with :func:`ast.literal_eval` (literals only: nothing in a log is run)."""

from __future__ import annotations

import ast
import bisect
import itertools
import math
import re
from pathlib import Path
from typing import Any

from .base import Reader, Rows, RunLogError, Text, count_rows, text_lines
from .names import metric_name, number

DICT = re.compile(r"\{'[^{}]*\}")
BAR = re.compile(r"\|\s*(\d+)/(\d+)\s*\[")
NONFINITE = re.compile(r"(?<=: )(-?)(nan|inf)\b")
WRAPPED = re.compile(r"(?:np\.\w+|numpy\.\w+|tensor)\(\s*([^(),]*)[^()]*\)")
"""``np.float64(0.5)``, ``tensor(0.5, device='cuda:0')``: the number inside."""
META = {"epoch", "learning_rate", "step"}
NEAR = 6
"""Lines between a dict and the progress bar of its step, at most."""


def _literal(text: str) -> dict[str, Any]:
    text = WRAPPED.sub(r"\1", NONFINITE.sub(r"'\1\2'", text))
    value = ast.literal_eval(text)
    if not isinstance(value, dict):
        raise ValueError("not a dict")
    return {k: (number(v) if isinstance(v, str) and number(v) is not None else v) for k, v in value.items()}


def _dicts(line: str) -> list[tuple[int, dict[str, Any] | None]]:
    """(column, dict) of each dict printed on a line; None where it is not a literal."""
    out: list[tuple[int, dict[str, Any] | None]] = []
    if "{'" not in line:
        return out
    for m in DICT.finditer(line):
        try:
            out.append((m.start(), _literal(m.group(0))))
        except (ValueError, SyntaxError):
            out.append((m.start(), None))
    return out


def _training(row: dict[str, Any]) -> bool:
    """A training step's dict: a metric this tool knows, with a number; not the end-of-training
    summary, an evaluation, or a library's config printed as a dict (vLLM's and inductor's
    ``{'size_asserts': False, ...}``, bitsandbytes' ``{'load_in_4bit': True, ...}``)."""
    if set(row) <= META or "train_runtime" in row or _evaluation(row):
        return False
    return any(_numeric(row, k) for k in row)


def _evaluation(row: dict[str, Any]) -> bool:
    return any(str(k).startswith("eval_") for k in row)


def _read(path: Path) -> tuple[Rows, list[str]]:
    rows: Rows = []
    evals: Rows = []
    notes: list[str] = []
    bad: list[tuple[int, str]] = []
    bars: list[tuple[int, int, int, int]] = []  # (line, column, n, total) of each progress bar
    lines, complete = text_lines(path)
    for i, line in enumerate(lines, 1):
        bars += [(i, m.start(), int(m.group(1)), int(m.group(2))) for m in BAR.finditer(line)]
        for col, row in _dicts(line):
            if row is None:
                if i == len(lines) and not complete:
                    notes.append(f"{path}:{i}: partial last line skipped (the run is still being written?)")
                else:
                    bad.append((i, line[col : col + 80]))
            elif _training(row):
                rows.append({**row, "_line": i, "_col": col})
            elif _evaluation(row):
                evals.append({**row, "_line": i, "_col": col})
    if bad and not rows:
        raise RunLogError(f"{path}:{bad[0][0]}: a dict that is not a Python literal: {bad[0][1]}")
    if bad:
        notes.append(
            f"{path}: {len(bad)} dict(s) that are not Python literals skipped, first at line {bad[0][0]}: {bad[0][1]}"
        )
    _steps(rows, bars, notes, path)
    _eval_steps(evals, rows)
    return sorted([*rows, *evals], key=lambda r: r["_line"]), notes


def _eval_steps(evals: Rows, rows: Rows) -> None:
    """An evaluation's step: that of the training dict printed last before it (the Trainer
    evaluates right after logging the step)."""
    for e in evals:
        before = [r for r in rows if r["_line"] <= e["_line"]]
        e["step"] = before[-1]["step"] if before else 0
        del e["_col"]


def _near(rows: Rows, i: int, bars: list[tuple[int, int, int, int]], after: bool) -> int | None:
    """The counter of the progress bar just before (or after) dict ``i``: within ``NEAR`` lines
    (other output, warnings or an NCCL line, may come between), and with no other dict in
    between. ``bars`` are in the order they appear (by line, then column)."""
    pos = (rows[i]["_line"], rows[i]["_col"])
    if after:
        end = (rows[i + 1]["_line"], rows[i + 1]["_col"]) if i + 1 < len(rows) else (math.inf, 0)
        j = bisect.bisect_right(bars, pos)  # a bar (line, col, ...) sorts after the dict at (line, col)
        if j < len(bars) and bars[j][:2] < end and bars[j][0] - pos[0] <= NEAR:
            return bars[j][2]
        return None
    start = (rows[i - 1]["_line"], rows[i - 1]["_col"]) if i > 0 else (-1, 0)
    j = bisect.bisect_left(bars, pos) - 1
    if j >= 0 and bars[j][:2] > start and pos[0] - bars[j][0] <= NEAR:
        return bars[j][2]
    return None


def _decimals(values: list[float]) -> int:
    """The most decimals a printed value has (the precision ``epoch`` was rounded to)."""
    return max((len(repr(v).partition(".")[2]) for v in values if "e" not in repr(v)), default=6)


def _steps(rows: Rows, bars: list[tuple[int, int, int, int]], notes: list[str], path: Path) -> None:
    """A step for every row. tqdm draws the bar of step n just before the Trainer prints that
    step's dict and redraws it just after; a copied or trimmed log may keep only one of the
    two, and interleaved stdout/stderr may keep neither beside its dict. So: the side (bar
    before / bar after) whose counters rise with the rows and agree with ``epoch`` (to the
    precision it was printed with) for the most rows; rows without a bar get ``epoch`` x steps
    per epoch; counters that contradict the epochs are not used (steps per epoch then come
    from a finished bar, n = total, and the last epoch)."""
    epochs = [float(e) if isinstance(e, (int, float)) else None for e in (r.get("epoch") for r in rows)]
    known_epochs = [e for e in epochs if e is not None]
    informative = len(set(known_epochs)) > 1
    half_unit = 0.5 * 10.0 ** -_decimals(known_epochs)

    def fit(side: list[int | None]) -> tuple[int, int, float | None]:
        """(rows with a counter, counters that agree with their epoch, steps per epoch)."""
        known = [n for n in side if n is not None]
        if not known or any(b <= a for a, b in itertools.pairwise(known)):
            return -1, 0, None
        pairs = [(n, e) for n, e in zip(side, epochs) if n is not None and e is not None]
        positive = [(n, e) for n, e in pairs if e > 0]
        if not informative or not positive:
            return len(known), len(known), None
        spe = sum(n for n, _ in positive) / sum(e for _, e in positive)
        # every row whose epoch is known, 0.0 included: an epoch printed as 0.0 (2 decimals,
        # a large data set) agrees with any counter below half a unit of it
        agree = sum(abs(n - spe * e) <= spe * half_unit + 1 for n, e in pairs)
        return len(known), agree + len(known) - len(pairs), spe

    sides = {after: [_near(rows, i, bars, after) for i in range(len(rows))] for after in (False, True)}
    fits = {after: fit(side) for after, side in sides.items()}
    best = max(sides, key=lambda a: (fits[a][1], fits[a][0]))
    count, agree, spe = fits[best]
    side = sides[best]
    if count <= 0 or agree < 0.8 * count:  # no bar beside its dict
        side = [None] * len(rows)
        done = [t for _, _, n, t in bars if n == t and t > 0]
        spe = done[-1] / known_epochs[-1] if done and informative and known_epochs[-1] > 0 else None
        if bars:
            notes.append(f"{path}: the progress bars do not match the dicts beside them; they are not used")
    estimated = 0
    for n, (row, bar, epoch) in enumerate(zip(rows, side, epochs), 1):
        if bar is not None:
            row["step"] = bar
        elif spe is not None and epoch is not None:
            row["step"], estimated = round(epoch * spe), estimated + 1
        else:
            row["step"] = n
    for row in rows:
        del row["_col"]
    if spe is None and not any(side):
        notes.append(f"{path}: no step numbers (no usable progress bars): rows are numbered 1, 2, ...")
    elif estimated:
        notes.append(
            f"{path}: {estimated} row(s) without a progress bar beside them: step = epoch x {spe:.4g} steps per epoch"
        )


def _sniff(path: Path, text: Text) -> int:
    return count_rows(
        text.lines,
        lambda line: "{'" in line,
        lambda line: any(row is not None and any(_numeric(row, k) for k in row) for _, row in _dicts(line)),
    )


def _numeric(row: dict[str, Any], key: str) -> bool:
    v = row[key]
    return metric_name(str(key)) is not None and isinstance(v, (int, float)) and not isinstance(v, bool)


READER = Reader(
    "trl-console", "TRL/transformers console dicts {'loss': ..., ...} amid progress bars", _sniff, _read
)
