"""Reading run metrics from disk for ``dapo diagnose``: this project's JSONL, a TRL
``trainer_state.json`` log history, or a JSONL of verl metric names. Other formats map
their names onto :data:`dapo.metrics.SCHEMA` through the tables below.

A log that is still being written may end in a partial line: it is skipped (and said). Any
other malformed line is an error that names the file and the line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .metrics import SCHEMA

TRL_NAMES = {
    "entropy": "actor/entropy",
    "clip_ratio/high_mean": "actor/clipfrac_upper",
    "clip_ratio/low_mean": "actor/clipfrac_lower",
    "completions/mean_length": "rollout/length_mean",
    "completions/max_length": "rollout/length_max",
    "completions/clipped_ratio": "rollout/truncation_rate",
    "frac_reward_zero_std": "rollout/groups_uniform",
    "reward": "rollout/reward_mean",
    "grad_norm": "actor/grad_norm",
    "kl": "actor/approx_kl",
    "loss": "actor/loss",
}
"""TRL GRPOTrainer log names -> this schema. ``frac_reward_zero_std`` (groups whose rewards
are all equal) stands for the share of groups with accuracy 0 or 1."""

VERL_NAMES = {
    "actor/entropy": "actor/entropy",
    "actor/pg_clipfrac": "actor/clipfrac_upper",
    "actor/pg_clipfrac_lower": "actor/clipfrac_lower",
    "actor/ppo_kl": "actor/approx_kl",
    "actor/grad_norm": "actor/grad_norm",
    "actor/pg_loss": "actor/loss",
    "response_length/mean": "rollout/length_mean",
    "response_length/max": "rollout/length_max",
    "response_length/clip_ratio": "rollout/truncation_rate",
    "critic/score/mean": "rollout/reward_mean",
    "train/num_gen_batches": "sampling/rounds",
    "training/rollout_probs_diff_mean": "mismatch/logp_gap",
}
"""verl metric names -> this schema. verl's ``actor/pg_clipfrac`` counts both clip sides; it
is read as the upper clip fraction (the side Clip-Higher changes)."""


class RunLogError(ValueError):
    """A metrics file that cannot be read; the message names the file and line."""


def _rows_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    rows, notes = [], []
    text = path.read_text()
    lines = text.split("\n")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            last = i == len(lines) or (i == len(lines) - 1 and not lines[-1])
            if last and not text.endswith("\n"):
                notes.append(f"{path}:{i}: partial last line skipped (the run is still being written?)")
                continue
            raise RunLogError(f"{path}:{i}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise RunLogError(f"{path}:{i}: expected a JSON object per line, got {type(row).__name__}")
        if isinstance(row.get("data"), dict):  # {"step": n, "data": {...}}
            row = {"step": row.get("step"), **row["data"]}
        rows.append(row)
    return rows, notes


def detect_format(path: Path, rows: list[dict[str, Any]] | None = None) -> str:
    if path.suffix == ".json" or path.name == "trainer_state.json":
        return "trl"
    keys = set().union(*(r.keys() for r in rows[:20])) if rows else set()
    if keys & {"response_length/mean", "critic/score/mean", "actor/pg_clipfrac"}:
        return "verl"
    return "dapo"


def _clean(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RunLogError(f"{where}: expected a number, got {value!r}")
    return float(value) if math.isfinite(value) else None


def read_runs(path: str | Path, fmt: str = "auto") -> tuple[dict[str, list[dict[str, float]]], list[str]]:
    """Runs in a metrics file, keyed by a label (one run unless the file holds several, as
    toybench's JSONL does with ``arm`` and ``seed``), with reading notes."""
    path = Path(path)
    if path.is_dir():
        for name in ("metrics.jsonl", "trainer_state.json"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise RunLogError(f"{path}: no metrics.jsonl or trainer_state.json in this directory")
    if not path.is_file():
        raise RunLogError(f"{path}: no such file")
    notes: list[str] = []
    if path.suffix == ".json":
        try:
            state = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise RunLogError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
        if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
            raise RunLogError(f"{path}: expected a TRL trainer_state.json with a log_history list")
        rows = state["log_history"]
        fmt = "trl" if fmt == "auto" else fmt
    else:
        rows, notes = _rows_jsonl(path)
        fmt = detect_format(path, rows) if fmt == "auto" else fmt
    names = {"trl": TRL_NAMES, "verl": VERL_NAMES}.get(fmt)
    if fmt not in ("trl", "verl", "dapo"):
        raise RunLogError(f"unknown format {fmt!r} (auto, dapo, trl, verl)")
    runs: dict[str, list[dict[str, float]]] = {}
    for i, row in enumerate(rows, 1):
        where = f"{path}:{i}"
        if "step" not in row:
            if fmt == "trl":  # TRL's final summary entry has no per-step metrics
                continue
            raise RunLogError(f"{where}: no 'step' field")
        label = "/".join(f"{k}={row[k]}" for k in ("experiment", "arm", "seed") if k in row) or "run"
        step = _clean(row["step"], f"{where}: step")
        if step is None:
            raise RunLogError(f"{where}: step is null or not finite")
        out: dict[str, float] = {"step": step}
        for key, value in row.items():
            if key in ("step", "experiment", "arm", "seed", "epoch"):
                continue
            metric: str | None = names.get(key) if names is not None else key
            if metric is None or (isinstance(value, (str, list, dict)) and metric not in SCHEMA):
                continue  # not a metric this tool reads
            v = _clean(value, f"{where}: {key}")
            if v is not None:
                out[metric] = v
        runs.setdefault(label, []).append(out)
    if not runs:
        raise RunLogError(f"{path}: no metric rows")
    read = {k for run in runs.values() for row in run for k in row} - {"step"}
    if not read & set(SCHEMA):
        hint = (
            f" (it looks like {detect_format(path, rows)}; try --format auto)"
            if path.suffix != ".json"
            else ""
        )
        raise RunLogError(f"{path}: none of the metrics that --format {fmt} names occur in this file{hint}")
    return runs, notes
