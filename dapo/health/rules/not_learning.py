"""Not learning: accuracy (or reward) at its floor or its ceiling, or flat over the run. At the
floor every group is all-wrong and gives no gradient; at the ceiling there is nothing left to
learn. A level needs one row (one step whose every group is all wrong already says there is no
gradient); a trend needs windows: an outcome that does not rise from the first to the last
quarter (of a run of two windows or more) is a warning, and failing where the absence of a rise
that counts is shown against the run's own noise (the gain's upper bound at ``alpha_fail`` below
one row's own scatter, the least rise a log can show, each quarter holding two windows' rows); flat at ``saturated_frac`` of its range or above, it is at the
ceiling (a warning, as the other rules call it converged). The absence of a rise must be shown, not assumed: where the
change is no significant rise but a rise that counts (:func:`~.base.effect`) still lies within
one standard error of it, the rule cannot judge yet (a few noisy rows say neither). A rise
counts against the smoothed curve's spread; its absence is shown against the rows' spread
(:func:`~.base.effect`). A run whose last window is above its first by two standard errors, flat only
over its later quarters, rose and then held: a plateau, not a run that does not learn (the
blind batches' "plateau called failing"): healthy at ``saturated_frac`` of its range or above,
else a warning (it stopped improving short of its ceiling, or where its range is unknown). A
run whose quarters are flat but whose validation score rose from its first evaluation beyond
its noise (:func:`validation_rose`) learned within its first window: a warning, never failing.
Without that evidence, an outcome whose last quarter lies below its first by a one-sided
``alpha_fail`` test and by a change that counts fell: failing at any length (the blind batches'
warm-started runs, accuracy 0.80 -> 0.60 over 21 rows, were a warning only because the
absence of a rise needs 8 windows' rows; a significant fall needs no more than its standard
error)."""

from __future__ import annotations

import math
from statistics import NormalDist

from ..config import HealthConfig
from ..noise import estimate, fall_from_best
from ..series import Run, mean, series, stderr
from .base import (
    TOO_FEW_STEPS,
    Judgement,
    Knobs,
    Rule,
    effect,
    gain,
    not_logged,
    saturation,
    too_few,
    unknown,
)


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    acc, reward = series(run, "rollout/accuracy"), series(run, "rollout/reward_mean")
    wrong = series(run, "rollout/groups_all_wrong")
    lo, hi = series(run, "rollout/reward_min"), series(run, "rollout/reward_max")
    main = acc if acc else reward
    if not (main or wrong):
        return not_logged("rollout/accuracy", "rollout/reward_mean", "rollout/groups_all_wrong")
    parts, floor_now, floor_start = [], False, False
    if acc:
        a0, a1 = mean(acc.head(c)), mean(acc.tail(c))
        parts.append(f"accuracy {a0:.3f} -> {a1:.3f}" if acc.covers(c, 2) else f"accuracy {a1:.3f}")
        floor_now, floor_start = a1 <= c.floor_frac, a0 <= c.floor_frac
        if a0 >= 1 - c.floor_frac and a1 >= 1 - c.floor_frac:
            return Judgement("warning", acc.steps[0], "; ".join(parts) + " (at the ceiling)", _ceiling)
    if wrong:
        w0, w1 = mean(wrong.head(c)), mean(wrong.tail(c))
        parts.append(
            f"groups all wrong {w0:.2f} -> {w1:.2f}" if wrong.covers(c, 2) else f"groups all wrong {w1:.2f}"
        )
        floor_now = floor_now or w1 >= 1 - c.floor_frac
        floor_start = floor_start or w0 >= 1 - c.floor_frac
    if reward:
        r0, r1 = mean(reward.head(c)), mean(reward.tail(c))
        parts.append(f"reward {r0:.3g} -> {r1:.3g}" if reward.covers(c, 2) else f"reward {r1:.3g}")
        recent = list(reward.tail(c))
        spread = list(zip(lo.tail(c), hi.tail(c)))
        alike = all(a == b for a, b in spread) if spread else len(recent) >= c.min_points
        if max(recent) == min(recent) and alike:
            parts.append(
                f"reward exactly {recent[0]:.3g} in the last {len(recent)} row(s) (every response scored alike)"
            )
            floor_now = True
    if floor_now:
        since = main.onset(c, lambda v: v <= c.floor_frac) if acc else None
        if since is None and wrong:
            since = wrong.onset(c, lambda v: v >= 1 - c.floor_frac)
        first = (main if main else wrong).steps[0]
        where = " from the start" if floor_start else ""
        return Judgement(
            "failing",
            since if since is not None else first,
            "; ".join(parts) + f" (at the floor{where})",
            _floor,
        )
    longest = max((main, wrong), key=len)
    if not longest.covers(c, 2):
        return too_few(longest, c, 2, "accuracy / reward")
    if main.covers(c, 2):
        g, noise = gain(main)
        least, absent = effect(main, c), effect(main, c, smoothed=False)
        parts.append(f"first to last quarter {g:+.3g} (+-{noise:.2g}; a rise counts from {least:.2g})")
        head, tail = main.head(c), main.tail(c)
        rose = mean(tail) - mean(head)
        rising = g > noise and g >= least
        if rose > 2 * math.hypot(stderr(head), stderr(tail)) and rose >= least and not rising:
            parts.append(f"first to last window {rose:+.3g}: it rose, then held (a plateau)")
            top = saturation(run, "accuracy" if acc else "reward", mean(tail))
            if top is not None and top >= c.saturated_frac:
                return Judgement("healthy", evidence="; ".join(parts) + f" at {top:.0%} of its range")
            where = "" if top is None else f" at {top:.0%} of its range"
            return Judgement(
                "warning", main.steps[len(main) // 2], "; ".join(parts) + where + ", no longer rising"
            )
        if g + noise >= absent and g <= noise:
            return unknown(
                TOO_FEW_STEPS,
                "; ".join(parts)
                + f" (neither a rise nor its absence is established over {main.span:g} steps)",
            )
        if g <= noise or g < least:
            top = saturation(run, "accuracy" if acc else "reward", mean(main.tail(c)))
            if top is not None and top >= c.saturated_frac:  # flat at the top: converged
                parts.append(f"not rising, at {top:.0%} of its range (the ceiling)")
                return Judgement("warning", main.steps[len(main) // 2], "; ".join(parts), _ceiling)
            learned = validation_rose(run, c)
            if learned is not None:  # it learned before the quarters compared here: a plateau
                parts.append(f"not rising; {learned}")
                return Judgement(
                    "warning", main.steps[len(main) // 2], "; ".join(parts) + ", no longer rising"
                )
            z = NormalDist().inv_cdf(1 - c.alpha_fail)
            # it made the outcome worse: failing at any length
            if noise > 0 and -g > z * noise and -g >= least:
                return Judgement(
                    "failing",
                    main.steps[len(main) // 2],
                    "; ".join(parts)
                    + f" (it fell: {-g / noise:.1f} standard errors below its start, where a fall counts "
                    f"from {z:.1f}, and by a change that counts)",
                )
            # no rise of a row's own scatter, at alpha_fail, each quarter's mean on two windows' rows
            rows = estimate(main.values)
            absent = max(absent, rows.sd if rows is not None else 0.0)
            shown = g + z * noise < absent and len(main) >= 8 * c.min_points
            why = (
                f" (not rising over {main.span:g} steps: the rise's upper bound {g + z * noise:.2g} is below "
                f"{absent:.2g}, the least that counts)"
                if shown
                else " (not rising)"
            )
            return Judgement(
                "failing" if shown else "warning", main.steps[len(main) // 2], "; ".join(parts) + why
            )
    return Judgement("healthy", evidence="; ".join(parts))


def validation_rose(run: Run, c: HealthConfig) -> str | None:
    """The evidence that a run learned, where the held-out score shows it: the mean of the last
    two evaluations above the first by a one-sided ``alpha_fail`` test against one evaluation's
    noise (:func:`~dapo.health.noise.eval_sd`; the mirror of the validation rule's "below the
    first"). A run can learn within its first window (reasoning-from-scratch's GRPO tables:
    reward 0.2 -> 0.6 in 15 of 500 steps, MATH-500 15.6% -> 45%) and hold: its quarters are
    flat, and it is no run that does not learn. None without that evidence."""
    s = series(run, "eval/score")
    fall = fall_from_best(s.values, c.eval_items)
    if fall is None or fall.sd <= 0 or fall.rise <= NormalDist().inv_cdf(1 - c.alpha_fail):
        return None
    return (
        f"validation score {s.values[0]:.3g} at step {s.steps[0]:g} -> {fall.now:.3g} (last two; "
        f"{fall.rise:.1f} sd of its noise): it learned, then held"
    )


_floor = (
    "no response is right, so no group has a signal: check the reward function and answer format "
    "on a few rollouts, start from an easier data mix or a stronger base model"
)
_ceiling = "every response is already right: harder prompts (filter the data by pass rate)"

RULE = Rule(
    "not_learning",
    "Not learning (reward flat, at its floor or ceiling)",
    "Check the reward and the data's difficulty; dynamic sampling cannot create a signal",
    check,
)
