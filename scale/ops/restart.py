"""A run its launcher restarts: torchrun's elastic agent (``--max-restarts``, which ``dapo
launch`` writes) restarts the worker group after a rank dies, and SLURM requeues a job
(``#SBATCH --requeue``) after a node is lost. Each restart is a new ``dapo train`` process
that must continue the run, never start it again:

* a restarted attempt resumes from the last complete checkpoint (``--resume auto``) whatever
  its command line says: ``--fresh`` would delete the run, and without ``--resume`` the
  output directory is refused as a previous run's;
* rank 0 records each restart in ``<output.dir>/restarts.jsonl`` (which attempt, the last
  step the attempt before it logged, the checkpoint it resumes from);
* a run whose last two attempts both died after logging the same step (a deterministic crash:
  a bad batch, a loss that raises at that step, a kernel fault) is not restarted into the same
  crash again: rank 0 stops with one line and exit status :data:`CRASH_LOOP`, and every later
  restart the launcher still has left stops the same way at once (their number is bounded by
  ``--max-restarts``).

The counts come from the launchers: torchrun sets ``TORCHELASTIC_RESTART_COUNT`` in every
worker (0 on the first attempt), SLURM sets ``SLURM_RESTART_COUNT`` after a requeue (unset
before). torchrun's count starts at 0 again in a requeued job, so an attempt is the pair.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CRASH_LOOP = 6
"""``dapo train``'s exit status when it stops a crash loop."""
RECORD = "restarts.jsonl"
"""Under ``output.dir``: one row per restart."""


@dataclass(frozen=True)
class Attempt:
    """Which attempt of the run this process is: restarts by SLURM's requeue and, within the
    job, by torchrun's agent."""

    slurm: int = 0
    torchrun: int = 0

    @property
    def restarted(self) -> bool:
        return self.slurm > 0 or self.torchrun > 0

    def __str__(self) -> str:
        by = [f"SLURM requeue {self.slurm}"] * (self.slurm > 0) + [f"torchrun restart {self.torchrun}"] * (
            self.torchrun > 0
        )
        return ", ".join(by) or "the first attempt"


def attempt(env: dict[str, str] | None = None) -> Attempt:
    """This process's attempt, from the launchers' variables (a value that is not a count reads
    as 0: a launcher that sets it to anything else did not restart anything)."""
    env = os.environ if env is None else env

    def count(name: str) -> int:
        value = env.get(name, "0").strip()
        return int(value) if value.isdigit() else 0

    return Attempt(slurm=count("SLURM_RESTART_COUNT"), torchrun=count("TORCHELASTIC_RESTART_COUNT"))


def last_logged_step(out: Path) -> int:
    """The last step ``metrics.jsonl`` holds (0 without one): how far the attempt before this
    one got. Read before the resumed trainer trims the file to its checkpoint. A torn last line
    (the process died writing it) is skipped."""
    path = out / "metrics.jsonl"
    if not path.is_file():
        return 0
    step = 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            step = max(step, row["step"])
    return step


def records(out: Path) -> list[dict[str, Any]]:
    path = out / RECORD
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def crash_loop(previous: list[dict[str, Any]], reached: int) -> str | None:
    """Why the run must not go on (None: it may): the attempt before this one died after
    logging step ``reached``, and so had the one before it (the last row of ``previous``
    records how far that one got)."""
    if not previous or previous[-1].get("reached") != reached:
        return None
    return (
        f"the last two attempts both died after step {reached} was logged, in step {reached + 1} "
        f"({RECORD}); a third would meet the same fault: stopping. Fix the cause, then "
        "resume with --resume auto"
    )


def on_restart(out: Path, now: Attempt, checkpoint_step: int | None, log: Any = print) -> str | None:
    """Rank 0 of a restarted attempt, before anything is trimmed: record the restart, say it,
    and return why it must stop instead (:func:`crash_loop`), or None."""
    rows = records(out)
    previous = [r for r in rows if (r.get("slurm"), r.get("torchrun")) != (now.slurm, now.torchrun)]
    reached = last_logged_step(out)
    stop = crash_loop(previous, reached)
    row = {
        "slurm": now.slurm,
        "torchrun": now.torchrun,
        "reached": reached,
        "resumes_from": checkpoint_step or 0,
        "stopped": stop is not None,
        "time": time.time(),
    }
    if len(previous) == len(rows):  # once per attempt (a restart of rank 0 alone writes again)
        with (out / RECORD).open("a") as f:
            f.write(json.dumps(row) + "\n")
    if stop is None:
        start = f"checkpoint step {checkpoint_step}" if checkpoint_step else "the start (no checkpoint yet)"
        log(f"dapo train: {now}: the attempt before reached step {reached}; resuming from {start}")
    return stop
