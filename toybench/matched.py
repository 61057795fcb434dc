"""Read a failure mode's curve at equal learning, so that a policy that barely moves cannot
look protected by standing still (``dapo toy check``).

The failure modes a loss can fix happen *as the policy learns*: in the toys, accuracy rises
within the first quarter of the run, and entropy then collapses (symmetric clip) or the wrong
path's length grows (sample-level loss) over the plateau, at the same accuracy. Read at equal
optimizer steps, a loss that learns almost nothing keeps its step-0 entropy and length gap and
looks like a fix. Read here, on each seed (paired: same seed, same initial policy), in a
**window the reference arms fix** (``dapo toy check``: DAPO's loss with and without DAPO's
fix), so that the yardstick does not move with the arm being judged:

1. the **common gain** ``H``: the smaller final accuracy gain of the reference arms (last 10
   steps minus step 0);
2. each arm's **crossing**: the first step its accuracy (a centred mean over
   :data:`SMOOTH` steps) has risen by :data:`LEVEL` x ``H``;
3. its **reading**: the curve's mean over the same number of steps from its crossing (the
   fewest either reference arm has left), so every arm is read at the same accuracy and for
   the same time after reaching it.

A seed where a reference arm gains nothing has no window (:func:`reference_window` says
why); an arm judged against the references that never reaches their level, or reaches it
too late to be read for the whole window, is not read on that seed (:func:`read` says why).
Neither is a zero: the check counts such seeds and names them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

LEVEL = 0.9
"""Share of the common gain an arm must reach before it is read."""
SMOOTH = 5
"""Steps in the centred mean that decides the crossing (the exact expected accuracy still moves
from step to step with the sampled batches)."""
ACCURACY = "toy/expected_accuracy"
LAST = 10
"""Steps of the final window that define an arm's gain."""

Log = list[dict[str, Any]]


def gain(log: Log, metric: str = ACCURACY) -> float:
    """Final accuracy gain: the mean over the last :data:`LAST` steps minus step 0 (the
    differences are averaged, so a flat log gains exactly 0)."""
    start = log[0][metric]
    tail = [m[metric] - start for m in log[-LAST:]]
    return sum(tail) / len(tail)


def _smoothed(values: list[float]) -> list[float]:
    half = SMOOTH // 2
    out = []
    for t in range(len(values)):
        window = values[max(0, t - half) : t + half + 1]
        out.append(sum(window) / len(window))
    return out


def crossing(log: Log, rise: float, metric: str = ACCURACY) -> int | None:
    """The first step whose smoothed accuracy is at least ``rise`` above step 0 (None if never).

    The rise is smoothed, not the accuracy: a mean of equal values can differ from them by a
    rounding error, and a flat log must never rise however small ``rise`` is."""
    start = log[0][metric]
    for t, a in enumerate(_smoothed([m[metric] - start for m in log])):
        if a >= rise:
            return t
    return None


@dataclass(frozen=True)
class Window:
    """Where one seed's arms are read: from the first step each has risen :attr:`rise` above
    its step-0 accuracy, over :attr:`width` steps."""

    rise: float
    width: int


def reference_window(logs: Mapping[str, Log], metric: str = ACCURACY) -> Window | str:
    """The window the reference arms fix on one seed (``dapo toy check``: DAPO's loss with and
    without DAPO's fix): ``rise`` = :data:`LEVEL` x the smallest gain among them, ``width`` =
    the fewest steps any of them has left after its crossing. A reason (str) where there is
    none: a reference arm that gains nothing, never reaches the level, or reaches it with
    fewer than :data:`LAST` steps left."""
    common = min(gain(log, metric) for log in logs.values())
    if not (common > 0):
        return "a reference arm gains nothing on this seed"
    rise = LEVEL * common
    starts = {name: crossing(log, rise, metric) for name, log in logs.items()}
    if any(t is None for t in starts.values()):
        return "a reference arm falls back below its level at the end"
    width = min(len(logs[name]) - t for name, t in starts.items() if t is not None)
    if width < LAST:
        return f"a reference arm reaches its level with fewer than {LAST} steps left"
    return Window(rise, width)


def read(
    log: Log, curve: Callable[[dict[str, Any]], float], window: Window, metric: str = ACCURACY
) -> float | str:
    """The curve's mean over ``window`` from the log's own crossing of ``window.rise``; a
    reason (str) where it cannot be read: the arm never rises that far, rises too late to be
    read for ``window.width`` steps (a shorter window would read it earlier after its
    crossing than the references), or the curve is not finite there."""
    t = crossing(log, window.rise, metric)
    if t is None:
        return "never reaches the level DAPO's loss reaches"
    if len(log) - t < window.width:
        return f"reaches DAPO's level at step {t}, too late to be read for {window.width} steps"
    values = [curve(m) for m in log[t : t + window.width]]
    value = sum(values) / len(values)
    return value if math.isfinite(value) else "its reading is not finite"


def read_against(
    refs: Mapping[str, Log],
    log: Log,
    curve: Callable[[dict[str, Any]], float],
    window: Window,
    metric: str = ACCURACY,
) -> dict[str, float] | str:
    """The reference arms and ``log`` (key ``""``) read over the same steps: each from its own
    crossing of ``window.rise``, over ``window.width`` steps or the fewer ``log`` has left
    after its crossing (a later learner is read over a shorter window, and so are the
    references, so all three are read at the same accuracy for the same time). A reason
    (str) where ``log`` cannot be read: it never reaches the level, or has fewer than
    :data:`LAST` steps left after it (the steps that define a gain)."""
    t = crossing(log, window.rise, metric)
    if t is None:
        return "never reaches the level DAPO's loss reaches"
    width = min(window.width, len(log) - t)
    if width < LAST:
        return f"reaches DAPO's level with fewer than {LAST} steps left to read"
    same = Window(window.rise, width)
    out = {name: read(x, curve, same, metric) for name, x in {**refs, "": log}.items()}
    if any(isinstance(v, str) for v in out.values()):
        return "a reading is not finite"
    return {k: float(v) for k, v in out.items()}


def read_matched(
    logs: Mapping[str, Log], curve: Callable[[dict[str, Any]], float], metric: str = ACCURACY
) -> dict[str, float]:
    """One seed's arms (name -> log), each read at equal learning (module docstring) in the
    window they fix together (:func:`reference_window` over all of them); NaN for every arm
    where there is none."""
    window = reference_window(logs, metric)
    if isinstance(window, str):
        return dict.fromkeys(logs, math.nan)
    out = {name: read(log, curve, window, metric) for name, log in logs.items()}
    return {name: v if isinstance(v, float) else math.nan for name, v in out.items()}


__all__ = [
    "LEVEL",
    "SMOOTH",
    "Window",
    "crossing",
    "gain",
    "read",
    "read_against",
    "read_matched",
    "reference_window",
]
