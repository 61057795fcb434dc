"""Reward collapse: the outcome (accuracy, else the mean reward) rose, then fell back and stays
down (a policy that found something and lost it: degenerate outputs, a reward hack that the
grader stops paying, a blow-up), or fell well below where the log began.

The peak is that of the moving mean over a window; "now" is the last window's mean; a fall
counts only when it is larger than ``z`` times the noise of the two windows it compares, with
``z = 2 + sqrt(2 ln B)`` for a peak picked among ``B`` windows (with ``z = 2`` a fifth of flat
noisy runs "collapsed": the best of many window means is high by chance). Fallen by
``reward_drop_frac`` of the gain from the start to the peak: warning; back at or below the
start: failing.

A fall can also start inside the first window (an evaluation accuracy that falls 0.99 -> 0.60
within the first fifth of a run), where the window that says "start" already holds it: every
outcome the log has (accuracy, reward, validation score; :func:`~.base.outcomes`) is also
judged by blocks of rows from its first row on (:func:`_fall_from_early_best`): the best
block before the last is compared with the last, against the noise of a block mean
(:func:`~.base.row_noise`) widened for having picked the best of several blocks. A fall that
holds over the last two blocks and is at least a tenth of the best level: failing when it ends
below the first block, else a warning."""

from __future__ import annotations

import math
from statistics import stdev

from ..config import HealthConfig
from ..series import Run, Series, mean, stderr
from .base import SEVERITY, Judgement, Knobs, Rule, effect, not_logged, outcome, outcomes, row_noise, too_few


def _fall_from_early_best(name: str, s: Series, c: HealthConfig) -> Judgement | None:
    """A persistent fall of ``s`` from its best block of rows, wherever that block lies (the
    first rows included), or None. Blocks of ``k`` rows (``c.min_points`` at least, an eighth of
    the series at most) from the first row; "now" is the last ``k`` rows. The fall counts when
    it exceeds ``z`` standard errors of the difference of the two block means (each row's noise
    the larger of :func:`~.base.row_noise` and the block's own deviation: a sparse reward's
    consecutive rows are often equal) with ``z = 2 + sqrt(2 ln B)`` over ``B`` blocks (the best of ``B`` block means of a flat series lies about ``sqrt(2 ln B)`` block
    errors above their mean), when the block before the last is down by half as much (it has
    lasted), and when it is at least a tenth of the best level and a change that counts
    (:func:`~.base.effect`)."""
    k = max(c.min_points, len(s) // 8)
    if len(s) < 3 * k:
        return None
    v = s.values
    blocks = [v[i : i + k] for i in range(0, len(v) - 2 * k + 1, k)]  # every block before the last two
    now, before = v[-k:], v[-2 * k : -k]
    best_i = max(range(len(blocks)), key=lambda i: mean(blocks[i]))
    best, first = mean(blocks[best_i]), mean(blocks[0])
    rows = row_noise(s)  # a sparse reward (mostly 0) has no spread of consecutive rows: the blocks' own
    se = math.hypot(*(max(rows, stdev(b)) / math.sqrt(k) for b in (blocks[best_i], now)))
    z = 2 + math.sqrt(2 * math.log(len(blocks) + 2))
    least = max(z * se, 0.1 * abs(best), effect(s, c))
    fall = best - mean(now)
    if not (fall > least and best - mean(before) > least / 2):
        return None
    at = s.steps[best_i * k]
    ev = (
        f"{name} best {best:.3g} over rows from step {at:g}, now {mean(now):.3g} "
        f"(a fall of {fall:.3g}; counts from {least:.2g}; {k}-row blocks, the difference's noise {se:.2g})"
    )
    since = next(
        (x for j, x in enumerate(s.steps) if j >= best_i * k and mean(v[j : j + k]) < best - least / 2), at
    )
    if mean(now) < first - least / 2 or best_i == 0:
        return Judgement("failing", since, ev + ": below where it began")
    return Judgement("warning", since, ev)


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    found = _peak_fall(run, c)
    for name, s in outcomes(run):
        early = _fall_from_early_best(name, s, c)
        if early is not None and SEVERITY[early.status] > SEVERITY[found.status]:
            found = early
    return found


def _peak_fall(run: Run, c: HealthConfig) -> Judgement:
    """The main outcome's fall from the peak of its moving mean (the module's first paragraph)."""
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
    # the peak is the best of about len(out) / len(around) window means: a flat noisy run's best
    # lies ~sqrt(2 ln B) window errors above its level, so the fall must clear that too
    z = 2 + math.sqrt(2 * math.log(max(1.0, len(out) / max(1, len(around)))))
    noise = z / 2 * (stderr(around) ** 2 + stderr(tail) ** 2) ** 0.5
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
