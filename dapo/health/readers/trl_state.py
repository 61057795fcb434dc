"""TRL / transformers ``trainer_state.json``: the ``log_history`` list, one entry per logging
step, evaluations (``eval_*``) included; the end-of-training summary is skipped."""

from __future__ import annotations

import json
from pathlib import Path

from .base import CERTAIN, Reader, Rows, RunLogError, Text


def _read(path: Path) -> tuple[Rows, list[str]]:
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise RunLogError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise RunLogError(f"{path}: expected a trainer_state.json with a log_history list")
    rows = []
    for i, entry in enumerate(state["log_history"]):
        if not isinstance(entry, dict):
            raise RunLogError(f"{path}: log_history[{i}]: expected an object, got {type(entry).__name__}")
        if "step" not in entry or "train_runtime" in entry:
            continue  # the end-of-training summary; evaluations (eval_*) are kept
        rows.append({**entry, "_line": f"log_history[{i}]"})
    return rows, []


def _sniff(path: Path, text: Text) -> int:
    return CERTAIN if path.suffix == ".json" and '"log_history"' in text.text else 0


READER = Reader("trl-state", "TRL/transformers trainer_state.json (log_history)", _sniff, _read)
