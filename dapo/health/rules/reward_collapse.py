"""Reward collapse: the outcome (accuracy, else the mean reward) rose, then fell back and stays
down (a policy that found something and lost it: degenerate outputs, a reward hack that the
grader stops paying, a blow-up), or fell well below where the log began.

The peak is that of the moving mean over a window; "now" is the last window's mean; a fall
counts only when it is larger than twice the noise of the two windows it compares. Fallen by
``reward_drop_frac`` of the gain from the start to the peak: warning; back at or below the
start: failing."""

from __future__ import annotations

from ..config import HealthConfig
from ..series import Run, mean, stderr
from .base import Judgement, Knobs, Rule, not_logged, outcome, too_few


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    name, out = outcome(run)
    if not out:
        return not_logged("rollout/accuracy", "rollout/reward_mean")
    if not out.covers(c, 3):
        return too_few(out, c, 3, name)
    moving = out.moving(c)
    w = out.window(c)
    first_full = out.steps[0] + w - out.interval  # the first row whose window is full
    ready = [i for i, x in enumerate(out.steps) if x >= first_full]
    top = max(ready, key=lambda i: moving[i])
    peak, peak_at = moving[top], out.steps[top]
    head, tail = out.head(c), out.tail(c)
    start, now = mean(head), mean(tail)
    around = [v for x, v in zip(out.steps, out.values) if peak_at - w < x <= peak_at]
    noise = (stderr(around) ** 2 + stderr(tail) ** 2) ** 0.5
    fall, rise = peak - now, peak - start
    ev = f"{name} {start:.3g} at the start, peak {peak:.3g} (step {peak_at:g}), now {now:.3g}"
    if fall <= 2 * noise or out.steps[-1] - peak_at < w:
        return Judgement("healthy", evidence=ev)
    back = now <= start + 0.1 * max(rise, 0.0) and rise > 2 * noise
    below = now < start - 2 * (noise + stderr(head)) and now < start - 0.1 * (
        max(out.values) - min(out.values)
    )
    if back or below:
        status = "failing"
        ev += ": back at its start" if back else ": below its start"
    elif rise > 0 and fall >= c.reward_drop_frac * rise:
        status = "warning"
        ev += f": lost {fall / rise:.0%} of its gain"
    else:
        return Judgement("healthy", evidence=ev)
    since = next((x for x, m in zip(out.steps[top:], moving[top:]) if m < peak - 2 * noise), peak_at)
    return Judgement(status, since, ev)


RULE = Rule(
    "reward_collapse",
    "Reward collapse (rose, then fell and stays down)",
    "Look at the responses around the step it started (degenerate or hacked outputs); lower "
    "train.lr, keep algo.max_grad_norm=1.0, and resume from the checkpoint before it",
    check,
)
