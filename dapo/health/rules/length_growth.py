"""Unhealthy length growth (paper Fig. 4): over the second half of the run, length and entropy
rise together while accuracy stays flat (sample-level loss lets long, low-quality responses
grow)."""

from __future__ import annotations

import math

from ..config import HealthConfig
from ..series import Run, mean, series
from .base import Judgement, Knobs, Rule, missing, not_logged, too_few


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    absent = missing(run, "rollout/length_mean", "actor/entropy")
    if absent:
        return not_logged(*absent)
    ln, ent, acc = (
        series(run, "rollout/length_mean"),
        series(run, "actor/entropy"),
        series(run, "rollout/accuracy"),
    )
    if not (ln.covers(c, 4) and ent.covers(c, 4)):
        return too_few(min(ln, ent, key=len), c, 4, "length and entropy")
    mid = ln.steps[0] + ln.span / 2
    l2, e2, a2 = ln.after(mid), ent.after(mid), acc.after(mid)
    l0, l1 = mean(l2.head(c)), mean(l2.tail(c))
    e0, e1 = mean(e2.head(c)), mean(e2.tail(c))
    a_change = mean(a2.tail(c)) - mean(a2.head(c)) if a2.covers(c, 2) else math.nan
    l_rel, e_rel = (l1 - l0) / max(l0, 1e-9), (e1 - e0) / max(e0, 1e-9)
    ev = f"second half: length {l0:.1f} -> {l1:.1f} ({l_rel:+.0%}), entropy {e0:.3f} -> {e1:.3f} ({e_rel:+.0%})"
    if not math.isnan(a_change):
        ev += f", accuracy {a_change:+.3f}"
    flat = math.isnan(a_change) or a_change < c.accuracy_flat
    if l_rel > c.length_rise_frac and e_rel > c.entropy_rise_frac and flat:
        failing = l_rel > 2 * c.length_rise_frac and e_rel > 2 * c.entropy_rise_frac
        advice = None
        if knobs.get("loss_agg") == "token-mean":
            advice = (
                "the loss is already token-mean: add the soft overlong punishment (algo.soft_overlong=true)"
            )
        return Judgement("failing" if failing else "warning", l2.steps[0], ev, advice)
    return Judgement("healthy", evidence=ev)


RULE = Rule(
    "length_growth",
    "Unhealthy length growth",
    "Token-level loss: algo.loss_agg=token-mean",
    check,
)
