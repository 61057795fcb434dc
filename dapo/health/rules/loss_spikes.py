"""Loss spikes: the policy loss non-finite, or far outside its usual range. A policy-gradient
loss hovers around 0 with either sign, so a spike is measured in robust deviations from its
median (1.4826 x the median absolute deviation), and must also exceed 10x the median
magnitude and ``loss_floor`` (a clipped surrogate with normalised advantages stays well inside
+-1; GRPO's loss hovers near 0, where robust deviations alone are tiny). Non-finite: failing; spikes in more than 5% of the rows: failing (a warning when none is in
the last window and the run kept learning); two or more: warning; one alone is evidence (the
run recovered)."""

from __future__ import annotations

import statistics

from ..config import HealthConfig
from ..series import Run, nonfinite_steps, series
from .base import Judgement, Knobs, Rule, not_logged, spike_status, too_few


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    s, bad = series(run, "actor/loss"), nonfinite_steps(run, "actor/loss")
    if bad:
        return Judgement(
            "failing", bad[0], f"loss non-finite at {len(bad)} step(s), first {bad[0]:g}", fatal=True
        )
    if not s:
        return not_logged("actor/loss")
    if not s.covers(c, 2):
        return too_few(s, c, 2, "actor/loss")
    med = statistics.median(s.values)
    spread = 1.4826 * statistics.median(abs(v - med) for v in s.values)
    size = statistics.median(abs(v) for v in s.values)

    def is_spike(v: float) -> bool:
        return abs(v - med) > c.loss_spike * spread and abs(v) > max(10 * size, c.loss_floor)

    spikes = [(x, v) for x, v in zip(s.steps, s.values) if is_spike(v)]
    ev = f"loss median {med:.3g}, robust spread {spread:.3g}"
    if not spikes:
        return Judgement("healthy", evidence=ev)
    ev += f"; {len(spikes)} spike(s), the largest {max(spikes, key=lambda p: abs(p[1]))[1]:.3g}, first at step {spikes[0][0]:g}"
    severity, note = spike_status(run, s, [x for x, _ in spikes], c, is_spike)
    return Judgement(severity, spikes[0][0] if severity != "healthy" else None, ev + note)


RULE = Rule(
    "loss_spikes",
    "Loss spikes or a non-finite loss",
    "Lower train.lr, keep algo.max_grad_norm=1.0; look at the batch of the step it started",
    check,
)
