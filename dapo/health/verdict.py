"""Apply the rules to a run: one :class:`Finding` per rule, and the run's overall verdict
(healthy / warning / failing / inconclusive)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .config import HealthConfig
from .rules import RULES, Knobs, Rule
from .rules.base import SEVERITY as SEVERITY
from .series import Run

STATUSES = ("healthy", "warning", "failing", "unknown")
LEARNING = ("not_learning", "reward_collapse")
"""Rules that judge whether the run learns."""
OUTCOME = ("not_learning", "reward_collapse", "validation")
"""Rules that judge the run's outcome (reward, accuracy, validation score): whether the run
fails at its job. Every other rule judges a mechanism (entropy, zero-gradient groups, clipping,
truncation, KL, gradients, loss): evidence of why, and a knob."""
STABILITY = ("gradients", "kl_blowup")
"""Rules that judge whether the updates are stable. The loss-spike rule is not one of them: a
policy-gradient loss sits near 0 by construction (GRPO's is exactly 0 at the first update of a
batch), so a calm loss alone says little about the updates."""
VERDICTS = ("healthy", "warning", "failing", "inconclusive")
VERDICT_CODE = {"healthy": 0, "warning": 1, "failing": 2, "inconclusive": 3}
"""Numeric codes of the verdicts (``health/*`` metrics of the trainer callback)."""


@dataclass(frozen=True)
class Finding:
    """One rule's verdict on one run."""

    rule: str
    title: str
    status: str
    """healthy, warning, failing or unknown."""
    start_step: float | None
    evidence: str
    advice: str
    """What to change: the rule's knob, or what the run's own knobs and metrics call for."""
    reason: str = ""
    """Why the rule could not judge (``not logged`` / ``too few steps``), for unknown."""
    needs_steps: float | None = None
    """For ``too few steps``: the steps the rule needs to judge."""
    fatal: bool = False
    """Failing on its own, whatever the outcome (:attr:`.rules.base.Judgement.fatal`)."""


@dataclass(frozen=True)
class Verdict:
    """The run's headline."""

    status: str
    """healthy, warning, failing or inconclusive."""
    judged: int
    """Rules that could judge the run."""
    unknown: dict[str, list[str]]
    """Rules that could not, by reason (``not logged``, ``too few steps``)."""
    needs_steps: float | None = None
    """Inconclusive for too few steps: the fewest steps after which enough rules could judge
    (None when more steps would not do)."""
    why: tuple[str, ...] = ()
    """For failing: the rules that make it so, the outcome's first, then the mechanisms the
    failing outcome follows (its causes) or the unrecoverable states."""

    def advice(self, logged: float) -> str:
        """What an inconclusive run needs, in a line (empty when steps would not help)."""
        if self.status != "inconclusive" or self.needs_steps is None:
            return ""
        n = math.ceil(self.needs_steps)
        return (
            f"inconclusive: {logged:g} steps logged, the rules need at least {n}; run longer "
            f"(dapo train: train.steps={n})"
        )

    def headline(self) -> str:
        n = sum(len(v) for v in self.unknown.values())
        status = f"{self.status}: {', '.join(self.why)}" if self.why else self.status
        if not n:
            return f"{status} (all {self.judged} rules judged)"
        why = ", ".join(f"{len(v)} {reason}" for reason, v in self.unknown.items())
        return f"{status} ({n} of {self.judged + n} rules could not judge: {why})"


def diagnose(
    run: Run, config: HealthConfig = HealthConfig(), knobs: Knobs | None = None, rules: Sequence[Rule] = RULES
) -> list[Finding]:
    """Apply every rule to ``run`` (:func:`judge`), then the hierarchy of verdicts
    (:func:`hierarchy`): "failing" means the run fails at its job. ``knobs``: the run's own
    settings where known (:data:`dapo.health.rules.KNOBS`), which the advice takes into
    account."""
    return hierarchy(judge(run, config, knobs, rules))


def judge(
    run: Run, config: HealthConfig = HealthConfig(), knobs: Knobs | None = None, rules: Sequence[Rule] = RULES
) -> list[Finding]:
    """Each rule's own finding on ``run`` (sorted by step here), before the hierarchy: the
    severity of the mechanism it judges, taken alone."""
    run = sorted(run, key=lambda r: r.get("step", 0))
    out = []
    for rule in rules:
        j = rule.check(run, config, knobs or {})
        out.append(
            Finding(
                rule.name,
                rule.title,
                j.status,
                j.since,
                j.evidence,
                j.advice or rule.knob,
                j.reason,
                j.needs_steps,
                j.fatal and j.status == "failing",
            )
        )
    return out


def hierarchy(findings: Sequence[Finding]) -> list[Finding]:
    """A mechanism rule's failing (entropy, zero-gradient groups, truncation, KL, gradients,
    loss) stands when an outcome rule (:data:`OUTCOME`) fails too, as that failure's cause, or
    when it is an unrecoverable state (``fatal``); otherwise it becomes a warning with its
    evidence and knob, and the evidence says the outcome does not follow it."""
    outcome = [f for f in findings if f.rule in OUTCOME and f.status != "unknown"]
    if any(f.status == "failing" for f in outcome):
        return list(findings)
    said = "; ".join(f"{f.rule}: {f.status}" for f in outcome) if outcome else "no outcome logged or judged"
    return [
        replace(
            f,
            status="warning",
            evidence=f"{f.evidence} [a warning: the outcome does not follow it ({said})]",
        )
        if f.status == "failing" and f.rule not in OUTCOME and not f.fatal
        else f
        for f in findings
    ]


def verdict(findings: Sequence[Finding], config: HealthConfig = HealthConfig()) -> Verdict:
    """Failing or warning as soon as one judged rule says so (after :func:`hierarchy`, a
    failing is an outcome that fails, with the mechanisms it follows, or an unrecoverable
    state; :attr:`Verdict.why` names them); healthy when more than ``config.min_judged_frac``
    of the rules could judge, or when a rule on learning (:data:`LEARNING`) and one on stability
    (:data:`STABILITY`) could (what a careful reader of a log without entropy or clip metrics
    still judges by: does it learn, are its updates stable); otherwise inconclusive. The
    headline names what could not judge."""
    unknown: dict[str, list[str]] = {}
    for f in findings:
        if f.status == "unknown":
            unknown.setdefault(f.reason or "unknown", []).append(f.rule)
    judged = len(findings) - sum(len(v) for v in unknown.values())
    worst = max((f.status for f in findings if f.status != "unknown"), key=SEVERITY.__getitem__, default=None)
    if worst in ("warning", "failing"):
        status = worst
    elif findings and (judged > config.min_judged_frac * len(findings) or _core(findings)):
        status = "healthy"
    else:
        status = "inconclusive"
    failing = [f for f in findings if f.status == "failing"]
    why = tuple(
        [f.rule for f in failing if f.rule in OUTCOME]
        + [f"{f.rule} ({'unrecoverable' if f.fatal else 'cause'})" for f in failing if f.rule not in OUTCOME]
    )
    return Verdict(
        status, judged, unknown, _needs_steps(findings, config) if status == "inconclusive" else None, why
    )


def _needs_steps(findings: Sequence[Finding], config: HealthConfig) -> float | None:
    """The fewest steps at which the rules that lack only steps could judge enough of the run
    for a verdict (healthy's condition above), or None."""
    waiting = sorted({f.needs_steps for f in findings if f.needs_steps is not None})
    for n in waiting:
        judged = [
            f
            if f.status != "unknown" or f.needs_steps is None or f.needs_steps > n
            else replace(f, status="healthy")
            for f in findings
        ]
        if sum(f.status != "unknown" for f in judged) > config.min_judged_frac * len(judged) or _core(judged):
            return n
    return None


def _core(findings: Sequence[Finding]) -> bool:
    judged = {f.rule for f in findings if f.status != "unknown"}
    return bool(judged & set(LEARNING)) and bool(judged & set(STABILITY))


def run_notes(run: Run) -> list[str]:
    """What a reader should know about the log before the verdicts: a log that starts mid-run
    (a resumed run, an excerpt) is judged on what it holds, and "start" means its first step."""
    steps = sorted({float(r["step"]) for r in run if "step" in r})
    if len(steps) < 2:
        return []
    gaps = sorted(b - a for a, b in itertools.pairwise(steps))
    interval = gaps[len(gaps) // 2]
    if steps[0] > 1 and steps[0] > 2 * interval:
        return [
            f"the log starts at step {steps[0]:g}, not at the run's start (a resumed run or an excerpt): "
            f"it is judged on what it holds, and 'start' below means step {steps[0]:g}"
        ]
    return []
