"""The trainer's live diagnosis (``diagnose.every_steps``): every N steps, the verdicts on the
history so far, as ``health/*`` metrics in the step's own row (:data:`dapo.schema.SCHEMA`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from .config import HealthConfig
from .readers import schema_row
from .rules import Knobs
from .verdict import SEVERITY, VERDICT_CODE, diagnose, verdict


def as_logged(metrics: Mapping[str, Any]) -> dict[str, float]:
    """A step's metrics as ``dapo diagnose`` reads them back from ``metrics.jsonl``: a value
    that is not finite is written as null there ("not defined this step": the actor metrics of
    a step with no update), so it is absent here too; names in the reader's schema."""
    return schema_row(
        {k: v for k, v in metrics.items() if not (isinstance(v, float) and not math.isfinite(v))}
    )


class HealthMonitor:
    """Collects the logged rows; :meth:`observe` adds the verdicts on every step that is a
    multiple of ``every_steps``. The rows are those ``dapo diagnose`` reads from the run's
    ``metrics.jsonl`` (:func:`as_logged`), so the live and the offline verdicts of a step agree."""

    def __init__(self, every_steps: int, config: HealthConfig = HealthConfig(), knobs: Knobs | None = None):
        if every_steps < 0:
            raise ValueError(f"every_steps: must be >= 0, got {every_steps}")
        self.every_steps, self.config, self.knobs = every_steps, config, dict(knobs or {})
        self.history: list[dict[str, float]] = []
        self.last: str | None = None

    def extend(self, rows: Iterable[Mapping[str, float]]) -> None:
        """Rows logged before (a resumed run's ``metrics.jsonl``)."""
        self.history.extend(as_logged(r) for r in rows)

    def observe(self, metrics: Mapping[str, float]) -> tuple[dict[str, float], str | None]:
        """Record one step's row (with its ``step``, counted from 1). On every step that is a
        multiple of ``every_steps``, return the ``health/*``
        metrics (``health/verdict``: 0 healthy, 1 warning, 2 failing, 3 inconclusive;
        ``health/<rule>``: -1 unknown, 0 healthy, 1 warning, 2 failing) and, when the verdict
        changed, a line saying so."""
        self.history.append(as_logged(metrics))
        if not self.every_steps or int(metrics["step"]) % self.every_steps:
            return {}, None
        findings = diagnose(self.history, self.config, self.knobs)
        v = verdict(findings, self.config)
        out = {"health/verdict": float(VERDICT_CODE[v.status])}
        out.update({f"health/{f.rule}": float(SEVERITY[f.status]) for f in findings})
        line = None
        if v.status != self.last:
            bad = [f"{f.rule} {f.status}" for f in findings if f.status in ("warning", "failing")]
            line = f"health: {self.last or 'start'} -> {v.headline()}" + (
                f": {', '.join(bad)}" if bad else ""
            )
            self.last = v.status
        return out, line
