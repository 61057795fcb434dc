"""TensorBoard event files (``events.out.tfevents.*``), as verl's and transformers' TensorBoard
loggers write them: one scalar per tag and step. Read with the ``tensorboard`` package's
event-file loader (the ``health`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import CERTAIN, Reader, Rows, RunLogError, Text


def event_files(path: Path) -> list[Path]:
    """The event files of a run: the file itself, or every one under a directory."""
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if "tfevents" in p.name and p.is_file())
    return [path]


def _read(path: Path) -> tuple[Rows, list[str]]:
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util import tensor_util
    except ImportError:
        raise RunLogError(
            f"{path}: reading TensorBoard event files needs the tensorboard package: pip install 'dapo-repro[health]'"
        ) from None
    by_step: dict[int, dict[str, Any]] = {}
    for file in event_files(path):
        try:
            events = list(EventFileLoader(str(file)).Load())
        except Exception as err:  # the loader raises its own types for corrupt records
            raise RunLogError(f"{file}: not a readable TensorBoard event file ({err})") from None
        for event in events:
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    v = float(value.simple_value)
                elif value.HasField("tensor") and value.tensor.dtype in (1, 2, 19):  # float, double, half
                    array = tensor_util.make_ndarray(value.tensor)
                    if array.size != 1:
                        continue
                    v = float(array.reshape(()))
                else:
                    continue
                by_step.setdefault(int(event.step), {"step": int(event.step), "_line": f"step {event.step}"})[
                    value.tag
                ] = v
    return [by_step[s] for s in sorted(by_step)], []


def _sniff(path: Path, text: Text) -> int:
    return CERTAIN if "tfevents" in path.name or (path.is_dir() and bool(event_files(path))) else 0


READER = Reader(
    "tensorboard", "TensorBoard event files (events.out.tfevents.*, or their directory)", _sniff, _read
)
