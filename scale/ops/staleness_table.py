"""What the toys say about a run's staleness: the config's loss, correction, partial rollouts and
``rollout.max_staleness`` looked up in the committed off-policy table
(``reports/off_policy/off_policy.json``, written by ``dapo toy off-policy``).

The table holds, per configuration (a base loss, partial rollouts or not, a correction) and per
staleness k in 1, 2, 4, 8, the paired difference in accuracy at the horizon against the same base
at k = 0, with its 95% interval on two disjoint seed blocks. A run at staleness k is read at the
smallest k of the table at or above it (k = 3 at k = 4: the safe side), on every k of the table up
to that one:

* **tolerated**: on both blocks, at every such k, the interval's lower end is above minus the
  table's margin (a loss larger than the margin is ruled out);
* **not tolerated**: on both blocks, at some such k, the interval lies wholly below 0 (a
  significant loss, seen twice);
* **cannot tell**: anything else (the blocks disagree, an interval straddles the margin), a loss
  or correction the table does not hold, a k beyond its last column, or no table at all. The
  way to find out for a loss of one's own is ``dapo toy check --staleness K``.

The base loss is recognised by the fields the Table-1 ladder switches (:data:`dapo.config.SWITCHES`,
with the lower clip): equal to DAPO's or to GRPO's, else unknown. The correction is the algo
section's after ``rollout.correction`` is applied (:func:`scale.config.with_correction`),
recognised when it equals one of :data:`dapo.offpolicy.CORRECTIONS`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parents[2] / "reports" / "off_policy" / "off_policy.json"
"""The committed table (a source checkout has it; an installed wheel does not)."""
LOSS_FIELDS = ("eps_low", "eps_high", "loss_agg", "overlong_filter", "soft_overlong", "dynamic_sampling")
"""The fields that tell the table's two base losses apart."""
CHECK = "check it on the toys: dapo toy check LOSS --staleness {k} --correction NAME (LOSS: dapo, grpo, ... or module:function)"


@dataclass(frozen=True)
class Lookup:
    """The toys' word on a config's staleness."""

    status: str
    """``tolerated``, ``not tolerated`` or ``cannot tell``."""
    row: str | None
    """The table's row used (``dapo +partial, token_tis``), None where none applies."""
    k: int
    """The table's column read (the config's staleness, rounded up to the table's next k)."""
    message: str
    """One line for the user."""


def base_loss(algo: Any) -> str | None:
    """``dapo`` or ``grpo`` when the algo section's loss is one of the table's bases, else None."""
    from dapo.config import PRESETS

    for name in ("dapo", "grpo"):
        ref = PRESETS[name]
        if all(getattr(algo, f) == getattr(ref, f) for f in LOSS_FIELDS):
            return name
    return None


def correction_name(algo: Any) -> str | None:
    """The named correction the algo section's correction fields equal, else None."""
    from dapo.offpolicy import CORRECTIONS, correction_fields

    for name in CORRECTIONS:
        if all(getattr(algo, f) == v for f, v in correction_fields(name).items()):
            return name
    return None


def lookup(cfg: Any, table: Path = TABLE) -> Lookup | None:
    """The toys' word on ``cfg``'s ``rollout.max_staleness`` (None at staleness 0)."""
    from ..config import with_correction

    k = int(cfg.rollout.max_staleness)
    if k == 0:
        return None
    check = CHECK.format(k=k)
    if not table.is_file():
        return Lookup(
            "cannot tell", None, k, f"no staleness table at {table} (a source checkout has it); {check}"
        )
    data = json.loads(table.read_text())
    algo = with_correction(cfg).algo
    base, corr = base_loss(algo), correction_name(algo)
    if base is None or corr is None:
        what = "loss" if base is None else "correction"
        return Lookup(
            "cannot tell",
            None,
            k,
            f"rollout.max_staleness={k}: the toys' table holds no row for this {what} "
            f"(rows: {', '.join(data.get('tolerated', {}))}); {check}",
        )
    row = f"{base}{' +partial' if cfg.rollout.partial else ''}, {corr}"
    grid = [r for r in data["grid"] if r["config"] == row]
    if not grid:
        return Lookup("cannot tell", None, k, f"the toys' table holds no row {row!r}; {check}")
    columns = sorted({int(r["k"]) for r in grid})
    col = next((c for c in columns if c >= k), None)
    if col is None:
        return Lookup(
            "cannot tell",
            row,
            k,
            f"rollout.max_staleness={k} is beyond the toys' table (k <= {columns[-1]}); {check}",
        )
    margin = float(data["margin"])
    blocks = list(data["blocks"])
    upto = [r for r in grid if int(r["k"]) <= col]

    def iv(r: dict[str, Any], b: str) -> tuple[float, float]:
        a = r["accuracy"][b]
        return float(a["low"]), float(a["high"])

    where = f"row {row!r}, k <= {col}, {len(blocks)} seed blocks, margin {margin:g} of accuracy"
    if all(iv(r, b)[0] > -margin for r in upto for b in blocks):
        return Lookup(
            "tolerated",
            row,
            col,
            f"rollout.max_staleness={k}: the toys tolerate it (no loss above {margin:g}; {where})",
        )
    lost = [int(r["k"]) for r in upto if all(iv(r, b)[1] < 0 for b in blocks)]
    if lost:
        return Lookup(
            "not tolerated",
            row,
            col,
            f"rollout.max_staleness={k}: the toys do NOT tolerate it (accuracy lower than at k = 0 on both seed "
            f"blocks from k = {lost[0]}; {where}): lower the staleness or use a correction the table tolerates",
        )
    return Lookup(
        "cannot tell",
        row,
        col,
        f"rollout.max_staleness={k}: the toys cannot tell (an interval straddles the margin or the blocks "
        f"disagree; {where}); {check}",
    )


__all__ = ["CHECK", "LOSS_FIELDS", "TABLE", "Lookup", "base_loss", "correction_name", "lookup"]
