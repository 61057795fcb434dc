"""A metric over training steps, and the step-based windows the rules judge it by.

A run is a list of metric dicts (:data:`dapo.schema.SCHEMA` names plus ``step``), sorted by
step. Values may be non-finite (a NaN loss is evidence); :func:`series` keeps only finite
ones and :func:`nonfinite_steps` counts the rest.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from .config import HealthConfig

Run = Sequence[dict[str, float]]


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class Series:
    """Finite values of one metric and the training steps they were logged at."""

    steps: list[float]
    values: list[float]

    def __len__(self) -> int:
        return len(self.values)

    @cached_property
    def interval(self) -> float:
        """Typical steps between two logged rows (1 when every step is logged)."""
        gaps = [b - a for a, b in zip(self.steps, self.steps[1:]) if b > a]
        return statistics.median(gaps) if gaps else 1.0

    @property
    def span(self) -> float:
        """Training steps the series covers (first to last row, plus one logging interval)."""
        return self.steps[-1] - self.steps[0] + self.interval if self.steps else 0.0

    def window(self, c: HealthConfig) -> float:
        """The window in steps: ``c.window_frac`` of the series' own span, widened so that it
        holds ``c.min_points`` rows. A fraction of the run, not a count of steps or rows: the
        same log thinned to every second row, or with its steps relabelled by a factor (an
        epoch axis, steps estimated from epochs), gets the same windows over the same part of
        the run, and "now" is the run's last eighth, not a quarter of a 40-row log."""
        return max(self.span * c.window_frac, c.min_points * self.interval)

    def covers(self, c: HealthConfig, windows: float) -> bool:
        """Whether the series spans ``windows`` windows (and holds enough rows for them)."""
        # a relative tolerance: steps relabelled by a factor (0.01 per step) must not lose a
        # window to rounding
        return len(self) >= windows * c.min_points and self.span >= windows * self.window(c) * (1 - 1e-9)

    def head(self, c: HealthConfig) -> list[float]:
        """Values in the first window of steps, and at least its first ``c.min_points`` rows (a
        log sampled unevenly can leave a window of steps with one or two rows, whose mean and
        noise mean little); [] for an empty series."""
        if not self.steps:
            return []
        end = self.steps[0] + self.window(c)
        n = sum(s < end for s in self.steps)
        return self.values[: max(n, c.min_points)]

    def tail(self, c: HealthConfig) -> list[float]:
        """Values in the last window of steps, and at least its last ``c.min_points`` rows
        (see :meth:`head`); [] for an empty series."""
        if not self.steps:
            return []
        start = self.steps[-1] - self.window(c)
        n = sum(s > start for s in self.steps)
        return self.values[-max(n, c.min_points) :]

    def recent(self, c: HealthConfig, windows: float = 2) -> Series:
        """The last ``windows`` windows of the series (for a trend: still rising or falling?)."""
        return self.after(self.steps[-1] - windows * self.window(c)) if self.steps else self

    def after(self, step: float) -> Series:
        """The part of the series from ``step`` on."""
        keep = [i for i, s in enumerate(self.steps) if s >= step]
        return Series([self.steps[i] for i in keep], [self.values[i] for i in keep])

    def moving(self, c: HealthConfig) -> list[float]:
        """Mean over the window of steps ending at each row: ``mean`` of each window, exactly
        (the window's sum kept as exact partials, :func:`_add_exact`, rounded once by
        ``math.fsum``: the same float as ``fsum`` of the window), in O(rows) rather than
        O(rows x window) (0.29 s of a 1 MB log's 1.5 s)."""
        w = self.window(c)
        out: list[float] = []
        partials: list[float] = []
        lo = 0
        for i, s in enumerate(self.steps):
            _add_exact(partials, self.values[i])
            while self.steps[lo] <= s - w:
                _add_exact(partials, -self.values[lo])
                lo += 1
            out.append(math.fsum(partials) / (i + 1 - lo))
        return out

    def onset(self, c: HealthConfig, bad: Callable[[float], bool]) -> float | None:
        """The step where a condition on the moving mean started holding for good, corrected for
        the smoothing lag: the first row of the last window that already met it."""
        flags = [bad(m) for m in self.moving(c)]
        if not flags or not flags[-1]:
            return None
        i = len(flags) - 1
        while i > 0 and flags[i - 1]:
            i -= 1
        w = self.window(c)
        for j in range(i + 1):
            if self.steps[j] > self.steps[i] - w and all(bad(y) for y in self.values[j : i + 1]):
                return self.steps[j]
        return self.steps[i]


def _add_exact(partials: list[float], x: float) -> None:
    """Add ``x`` to a sum held exactly as non-overlapping partials (Shewchuk's algorithm, as in
    the Python recipe behind ``math.fsum``): ``math.fsum(partials)`` is then the correctly
    rounded exact sum of everything added, the same float ``fsum`` gives for those values."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


def series(run: Run, key: str) -> Series:
    """The finite values of ``key`` and their steps (the row index where a row has no step)."""
    xs, ys = [], []
    for i, row in enumerate(run):
        v = row.get(key)
        if _number(v) and math.isfinite(v):  # type: ignore[arg-type]
            xs.append(float(row.get("step", i)))
            ys.append(float(v))  # type: ignore[arg-type]
    return Series(xs, ys)


def nonfinite_steps(run: Run, key: str) -> list[float]:
    """Steps where ``key`` was logged as NaN or infinite."""
    return [
        float(row.get("step", i))
        for i, row in enumerate(run)
        if _number(row.get(key)) and not math.isfinite(row[key])
    ]


def logged(run: Run, key: str) -> bool:
    """Whether ``key`` occurs in the run at all (finite or not)."""
    return any(key in row for row in run)


def mean(v: Sequence[float]) -> float:
    """The mean (``math.fsum``: a constant series' mean is that constant, exactly, so a level
    equal to a threshold compares as equal)."""
    return math.fsum(v) / len(v) if v else math.nan


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` over ``xs`` (0 for fewer than two points)."""
    if len(xs) < 2:
        return 0.0
    mx, my = mean(xs), mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def stderr(v: Sequence[float]) -> float:
    """Standard error of the mean of ``v`` (0 for fewer than two values)."""
    return statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else 0.0
