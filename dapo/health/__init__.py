"""Training health: one rule per failure mode, over the metrics a run logged.

A run is a list of metric dicts (the :data:`dapo.schema.SCHEMA` names, one per logged step,
ordered by ``step``). :func:`diagnose` applies every rule and returns one :class:`Finding`
per rule: ``healthy``, ``warning``, ``failing`` or ``unknown`` (not logged, or too few steps),
the step where the problem started, the evidence, and what to change. "Failing" means the run
fails at its job: the outcome (reward, accuracy, validation score) not learning or falling
against its own noise, or an unrecoverable state; a mechanism (entropy, zero-gradient groups,
truncation, KL, gradients) is a warning unless the outcome follows it, and then the failure's
cause (:func:`.verdict.hierarchy`; each rule's own severity: :func:`judge`). :func:`verdict`
gives the run's headline: healthy only when enough rules could judge, else ``inconclusive``.

Layout: :mod:`.rules` (one module per rule), :mod:`.readers` (one module per log format),
:mod:`.report` (markdown and figures), :mod:`.follow` (a growing log), :mod:`.callback` (the
trainer's live verdicts), :mod:`.cli` (``dapo diagnose``). Only the readers, the report and the
CLI touch files; the objective's modules in :mod:`dapo` never import this package.
"""

from __future__ import annotations

from .config import HealthConfig
from .references import PAPER_REFERENCES, ReferenceCurve, references_from_runs
from .rules import KNOBS, RULES, Rule
from .series import Run, series
from .verdict import SEVERITY, STATUSES, VERDICT_CODE, VERDICTS, Finding, Verdict, diagnose, judge, verdict

__all__ = [
    "KNOBS",
    "PAPER_REFERENCES",
    "RULES",
    "SEVERITY",
    "STATUSES",
    "VERDICTS",
    "VERDICT_CODE",
    "Finding",
    "HealthConfig",
    "ReferenceCurve",
    "Rule",
    "Run",
    "Verdict",
    "diagnose",
    "judge",
    "references_from_runs",
    "series",
    "verdict",
]
