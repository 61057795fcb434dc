"""A run's JSONL records: trimmed on resume (:func:`trim_jsonl`) and the per-rank rollout
trace (:class:`Trace`, ``output.trace_rollouts``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def trim_jsonl(path: Path, step: int) -> list[dict[str, Any]]:
    """Drop the lines of ``path`` (JSONL, one object per line with ``step``, counted from 1) of
    steps after ``step`` (the steps completed): on resume, the steps that will run again. The
    lines kept ([] without the file)."""
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    keep = [r for r in rows if r.get("step", 0) <= step]
    path.write_text("".join(json.dumps(r) + "\n" for r in keep))
    return keep


class Trace:
    """``output.trace_rollouts``: one line per generation round (what this rank's engine was
    asked for: the members of a rollout group write the same) and one per step (this rank's
    share of the batch: groups and response tokens), in ``<out>/trace/rank<r>.jsonl``."""

    def __init__(self, out: Path, ranks: Any):
        self.ranks = ranks
        self.path = out / "trace" / f"rank{ranks.rank}.jsonl"
        self.step = 0
        """The steps completed; lines carry the step being made (``step + 1``)."""

    def __call__(self, **fields: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = {
            "step": self.step + 1,  # the step being made, numbered as printed and in metrics.jsonl
            **{k: getattr(self.ranks, k) for k in ("rank", "dp_rank", "tp_rank")},
            **fields,
        }
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")

    def share(self, batch: Any) -> None:
        """What this rank trains on this step."""
        self(
            share_groups=batch.num_groups if batch is not None else 0,
            share_tokens=int(batch.mask.sum()) if batch is not None else 0,
        )
