"""Entropy explosion: entropy rises well above its start and keeps rising (the paper's healthy
run rises slowly, ~0.63 -> ~0.70 over its whole length; users of Clip-Higher report runaway
entropy with a too-loose eps_high)."""

from __future__ import annotations

from ..config import HealthConfig
from ..series import Run, slope
from .base import Judgement, Knobs, Rule, start_and_now


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    judged = start_and_now(run, "actor/entropy", c)
    if isinstance(judged, Judgement):
        return judged
    s, start, now, note = judged
    ratio = now / start
    recent = s.recent(c)
    rising = slope(recent.steps, recent.values) > 0
    ev = (
        f"entropy {start:.3f} -> {now:.3f} ({ratio:.2f}x its start)"
        + (", still rising" if rising and ratio > 1 else "")
        + note
    )
    if ratio >= c.entropy_explode_fail:
        status = "failing"
    elif ratio >= c.entropy_explode_warn and rising:
        status = "warning"
    else:
        return Judgement("healthy", evidence=ev)
    since = s.onset(c, lambda v: v >= c.entropy_explode_warn * start)
    advice = None
    eps_high, coeff = knobs.get("eps_high"), knobs.get("entropy_coeff")
    if isinstance(coeff, float) and coeff > 0:
        advice = f"an entropy bonus is on (entropy_coeff={coeff:g}): set it to 0"
    elif isinstance(eps_high, float) and eps_high <= 0.2:
        advice = f"eps_high is {eps_high:g} (not raised): lower train.lr; check the reward for exploits"
    return Judgement(status, since, ev, advice)


RULE = Rule(
    "entropy_explosion",
    "Entropy explosion",
    "Lower algo.eps_high toward 0.28 (or 0.2) and train.lr; no entropy bonus",
    check,
)
