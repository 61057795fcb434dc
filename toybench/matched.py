"""Read a failure mode's curve at equal learning, so that a policy that barely moves cannot
look protected by standing still (``dapo toy check``).

The failure modes a loss can fix happen *as the policy learns*: in the toys, accuracy rises
within the first quarter of the run, and entropy then collapses (symmetric clip) or the wrong
path's length grows (sample-level loss) over the plateau, at the same accuracy. Read at equal
optimizer steps, a loss that learns almost nothing keeps its step-0 entropy and length gap and
looks like a fix. Read here, on each seed, every compared arm (paired: same seed, same initial
policy):

1. the **common gain** ``H``: the smallest final accuracy gain among the arms (last 10 steps
   minus step 0), what every one of them has learned;
2. each arm's **crossing**: the first step its accuracy (a centred mean over
   :data:`SMOOTH` steps) has risen by :data:`LEVEL` x ``H``;
3. its **reading**: the curve's mean over the same number of steps from its crossing for
   every arm (the fewest any arm has left), so each is read at the same accuracy and for the
   same time after reaching it.

An arm that learns nothing sets ``H`` near 0 for its seed, and the reading then compares
every arm from its first steps: it is not a verdict on learning, which is why
:mod:`toybench.check` gates on learning (against DAPO's own loss) first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
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
    """Final accuracy gain: the mean over the last :data:`LAST` steps minus step 0."""
    tail = [m[metric] for m in log[-LAST:]]
    return sum(tail) / len(tail) - log[0][metric]


def _smoothed(values: list[float]) -> list[float]:
    half = SMOOTH // 2
    out = []
    for t in range(len(values)):
        window = values[max(0, t - half) : t + half + 1]
        out.append(sum(window) / len(window))
    return out


def crossing(log: Log, rise: float, metric: str = ACCURACY) -> int | None:
    """The first step whose smoothed accuracy is at least ``rise`` above step 0 (None if never)."""
    start = log[0][metric]
    for t, a in enumerate(_smoothed([m[metric] for m in log])):
        if a - start >= rise:
            return t
    return None


def read_matched(
    logs: Mapping[str, Log], curve: Callable[[dict[str, Any]], float], metric: str = ACCURACY
) -> dict[str, float]:
    """One seed's arms (name -> log), each read at equal learning (module docstring); NaN for
    every arm when one never reaches the level (it cannot, as the level is below each arm's
    own final gain, unless its accuracy falls back by more than the margin at the end)."""
    common = min(gain(log, metric) for log in logs.values())
    rise = LEVEL * max(common, 0.0)
    starts = {name: crossing(log, rise, metric) for name, log in logs.items()}
    if any(t is None for t in starts.values()):
        return dict.fromkeys(logs, math.nan)
    width = min(len(logs[name]) - t for name, t in starts.items() if t is not None)
    out = {}
    for name, log in logs.items():
        t = starts[name]
        assert t is not None
        values = [curve(m) for m in log[t : t + width]]
        out[name] = sum(values) / len(values)
    return out


__all__ = ["LEVEL", "SMOOTH", "crossing", "gain", "read_matched"]
