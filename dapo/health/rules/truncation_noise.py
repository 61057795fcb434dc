"""Truncation noise (paper Sec. 3.4, Fig. 5): many responses hit the generation ceiling, and
their (usually negative) reward punishes sound reasoning cut short. The severity rests on the
truncation rate alone; falling entropy is reported as supporting evidence."""

from __future__ import annotations

from ..config import HealthConfig
from ..series import Run, mean, series, slope
from .base import Judgement, Knobs, Rule, not_logged, too_few


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    tr, ent = series(run, "rollout/truncation_rate"), series(run, "actor/entropy")
    if not tr:
        return not_logged("rollout/truncation_rate")
    now = mean(tr.tail(c))
    if not tr.covers(c, 1) and now < c.truncation_fail:  # a level: one row of cut responses says it
        return too_few(tr, c, 1, "rollout/truncation_rate")
    recent = ent.recent(c)
    dropping = ent.covers(c, 2) and slope(recent.steps, recent.values) < 0
    ev = f"truncation rate {now:.1%} over the last {len(tr.tail(c))} row(s)" + (
        ", entropy dropping" if dropping else ""
    )
    if now < c.truncation_warn:
        return Judgement("healthy", evidence=ev)
    status = "failing" if now >= c.truncation_fail else "warning"
    advice = None
    if knobs.get("overlong_filter") is True and knobs.get("soft_overlong") is True:
        advice = (
            "overlong filtering and soft punishment are on: raise the generation ceiling "
            "(rollout.max_tokens) or lower expected_len so the penalty starts earlier"
        )
    return Judgement(status, tr.onset(c, lambda v: v >= c.truncation_warn), ev, advice)


RULE = Rule(
    "truncation_noise",
    "Truncation noise",
    "Overlong filtering and soft punishment: algo.overlong_filter=true, algo.soft_overlong=true "
    "(expected_len below the lengths that get cut)",
    check,
)
