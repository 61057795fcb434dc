"""What the toys say about a run's staleness: the config's loss, correction, partial rollouts and
``rollout.max_staleness`` looked up in the committed off-policy table
(``reports/off_policy/off_policy.json``, written by ``dapo toy off-policy``), and, once the run has
measured how far its policy moves, placed on the table by that movement.

The table holds, per configuration (a base loss, partial rollouts or not, a correction), the
verdict of :mod:`toybench.noninferiority`'s procedure over the ladder k = 1, 2, 4, 8: **tolerated
up to** the largest k where accuracy and entropy at the horizon are both shown non-inferior to k = 0
on both seed blocks, and **harmful from** the first k where a loss beyond the margin is shown on
both blocks. A run is
read at a column of that ladder:

* **before it starts**, by version count: the smallest k of the table at or above
  ``rollout.max_staleness`` (k = 3 is read at k = 4: the safe side);
* **while it runs**, by movement (:class:`Movement`): the run's mean k3 KL between the policy that
  sampled (the engine's log-probs) and the one that learns (``mismatch/k3_kl``) against the same
  figure the toys' arms measured at each k of the row; the smallest column whose toy moved at least
  as far. An LLM at lr 1e-6 moves far less per version than a tabular toy at its lr, so a run at
  max_staleness 8 may sit at the table's first column. The measured KL includes the engine's own
  precision mismatch: the safe side again.

At that column: **tolerated** (k <= tolerated-up-to), **not tolerated** (at or beyond harmful-from:
``dapo train`` refuses to start, ``--force`` overrides and is recorded), else **cannot tell** (a
warning): so also a loss or correction the table does not hold, a column beyond its last, or no
table at all. The way to find out for a loss of one's own is ``dapo toy check --staleness K``.

The base loss is recognised by the fields the Table-1 ladder switches (:data:`dapo.config.SWITCHES`,
with the lower clip): equal to DAPO's or to GRPO's, else unknown. The correction is the algo
section's after ``rollout.correction`` is applied (:func:`scale.config.with_correction`),
recognised when it equals one of :data:`dapo.offpolicy.CORRECTIONS`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parents[2] / "reports" / "off_policy" / "off_policy.json"
"""The committed table (a source checkout has it; an installed wheel does not)."""
ENV = "DAPO_STALENESS_TABLE"
"""An environment variable naming another table to read (one written by ``dapo toy off-policy
--out DIR``: ``DIR/off_policy.json``)."""


def table_path() -> Path:
    """The table ``dapo train`` reads: ``$DAPO_STALENESS_TABLE``, else the committed one."""
    return Path(os.environ[ENV]) if os.environ.get(ENV) else TABLE


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


def _read(table: Path) -> dict[str, Any] | None:
    return json.loads(table.read_text()) if table.is_file() else None


def row_of(cfg: Any, data: dict[str, Any]) -> tuple[str | None, str]:
    """The table's row for ``cfg`` and, where there is none, why."""
    from ..config import with_correction

    algo = with_correction(cfg).algo
    base, corr = base_loss(algo), correction_name(algo)
    if base is None or corr is None:
        what = "loss" if base is None else "correction"
        return (
            None,
            f"the toys' table holds no row for this {what} (rows: {', '.join(data.get('verdicts', {}))})",
        )
    row = f"{base}{' +partial' if cfg.rollout.partial else ''}, {corr}"
    if row not in data.get("verdicts", {}):
        return None, f"the toys' table holds no row {row!r}"
    return row, ""


def status_at(verdict: dict[str, Any], col: int) -> str:
    """``tolerated``, ``not tolerated`` or ``cannot tell`` of a row's verdict at column ``col``
    (:meth:`toybench.noninferiority.Verdict.at`)."""
    if col <= int(verdict["upto"]):
        return "tolerated"
    harm = verdict.get("harmful_from")
    if harm is not None and int(harm) <= col:
        return "not tolerated"
    return "cannot tell"


def _words(status: str, verdict: dict[str, Any]) -> str:
    if status == "tolerated":
        return f"the toys tolerate it (tolerated up to k = {verdict['upto']})"
    if status == "not tolerated":
        return (
            f"the toys do NOT tolerate it (harmful from k = {verdict['harmful_from']}: {verdict['why']}): lower "
            "the staleness or use a correction the table tolerates"
        )
    return f"the toys cannot tell (tolerated up to k = {verdict['upto']}; {verdict['why']})"


def lookup(cfg: Any, table: Path | None = None) -> Lookup | None:
    """The toys' word on ``cfg``'s ``rollout.max_staleness`` by version count (None at staleness 0)."""
    k = int(cfg.rollout.max_staleness)
    if k == 0:
        return None
    check = CHECK.format(k=k)
    table = table or table_path()
    data = _read(table)
    if data is None:
        return Lookup(
            "cannot tell", None, k, f"no staleness table at {table} (a source checkout has it); {check}"
        )
    row, why = row_of(cfg, data)
    if row is None:
        return Lookup("cannot tell", None, k, f"rollout.max_staleness={k}: {why}; {check}")
    columns = sorted({int(r["k"]) for r in data["grid"] if r["config"] == row})
    col = next((c for c in columns if c >= k), None)
    if col is None:
        return Lookup(
            "cannot tell",
            row,
            k,
            f"rollout.max_staleness={k} is beyond the toys' table (k <= {columns[-1]}); {check}",
        )
    verdict = data["verdicts"][row]
    status = status_at(verdict, col)
    where = f"row {row!r} read at k = {col} by version count"
    tail = f"; {check}" if status == "cannot tell" else ""
    return Lookup(status, row, col, f"rollout.max_staleness={k}: {_words(status, verdict)}; {where}{tail}")


class Movement:
    """Places a running run on the table by how far its policy moves (the module docstring):
    :meth:`observe` each step's metrics; a line to print when the placement is first known and
    whenever its column or status changes, else None."""

    def __init__(self, cfg: Any, table: Path | None = None) -> None:
        self.kls: list[float] = []
        self.last: tuple[int | None, str] | None = None
        self.row: str | None = None
        self.toy: list[tuple[int, float]] = []
        self.verdict: dict[str, Any] = {}
        if int(cfg.rollout.max_staleness) == 0:
            return
        data = _read(table or table_path())
        if data is None:
            return
        self.row, _ = row_of(cfg, data)
        if self.row is None:
            return
        self.verdict = data["verdicts"][self.row]
        self.toy = sorted(
            (int(r["k"]), float(r["k3_kl"]))
            for r in data["grid"]
            if r["config"] == self.row and r.get("k3_kl") is not None
        )

    def place(self, kl: float) -> tuple[int | None, str]:
        """The column whose toy arm moved at least ``kl`` (None beyond the table) and its status."""
        col = next((k for k, toy in self.toy if toy >= kl), None)
        return col, ("cannot tell" if col is None else status_at(self.verdict, col))

    def observe(self, m: dict[str, Any]) -> str | None:
        if self.row is None or not self.toy:
            return None
        v = m.get("mismatch/k3_kl")
        if not isinstance(v, (int, float)) or not math.isfinite(v):
            return None
        self.kls.append(float(v))
        kl = sum(self.kls) / len(self.kls)
        col, status = self.place(kl)
        if (col, status) == self.last:
            return None
        self.last = (col, status)
        moved = (
            f"mean k3 KL(sampling policy || learning policy) {kl:.2e} per token over {len(self.kls)} step(s)"
        )
        if col is None:
            top, toy = self.toy[-1]
            return (
                f"staleness by movement: {moved}, beyond the toys' row {self.row!r} (k = {top} moved {toy:.2e}): "
                f"the toys cannot tell; {CHECK.format(k=top)}"
            )
        toy = dict(self.toy)[col]
        return (
            f"staleness by movement: {moved}; the toys' row {self.row!r} moves that far at k = {col} "
            f"({toy:.2e}): {_words(status, self.verdict)}"
        )


__all__ = [
    "CHECK",
    "ENV",
    "LOSS_FIELDS",
    "TABLE",
    "Lookup",
    "Movement",
    "base_loss",
    "correction_name",
    "lookup",
    "row_of",
    "status_at",
    "table_path",
]
