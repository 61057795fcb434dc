"""A metric's own noise, estimated from the log: the yardstick every rule that compares levels
uses instead of a fixed drop.

A logged metric is a course plus noise. The course is taken as a centred moving mean over
``k`` rows (:func:`smooth`); the residuals around it give the per-row noise ``sd`` and the
lag-1 autocorrelation ``rho`` (a batch reused for several updates, an exponentially smoothed
logger, or a slow drift the smooth leaves behind all make neighbouring rows alike). The mean
of ``m`` consecutive rows then has the standard error of an AR(1) process,
``sd / sqrt(m) * sqrt((1 + rho) / (1 - rho))`` (Box, Jenkins & Reinsel, *Time Series
Analysis*, Sec. 2.1; ``rho`` clipped to ``[0, RHO_MAX]``: a negative estimate, which the
smoothing itself biases towards, never makes a mean look more certain).

A level picked as the best of ``B`` (a peak, the best evaluation) is high by chance; the
quantile of a maximum of ``B`` standard normals (:func:`best_of_quantile`) is the correction
(issue 70: a fixed drop of 5% from the best failed 12 of 20 flat evaluations). Evaluation
scores on a known number of items have binomial noise (:func:`binomial_sd`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

RHO_MAX = 0.9
"""The largest autocorrelation credited: the effective sample size of a mean never falls below
``m / 19`` (a smoothed logger's rows; beyond this the log says too little to estimate it)."""
MIN_ROWS = 5
"""Rows below which the noise is not estimated (a residual sd and a lag-1 correlation from
fewer rows are guesses): the rule that needs it cannot judge."""


@dataclass(frozen=True)
class Noise:
    """Per-row noise around a metric's course."""

    sd: float
    """Standard deviation of the residuals (corrected for what the smooth absorbs)."""
    rho: float
    """Lag-1 autocorrelation of the residuals, in ``[0, RHO_MAX]``."""

    def se(self, m: int) -> float:
        """Standard error of the mean of ``m`` consecutive rows."""
        return self.sd / math.sqrt(max(m, 1)) * math.sqrt((1 + self.rho) / (1 - self.rho))

    def se_diff(self, m1: int, m2: int) -> float:
        """Standard error of the difference of two means of ``m1`` and ``m2`` rows, far apart."""
        return math.hypot(self.se(m1), self.se(m2))


def smooth(values: Sequence[float], k: int) -> list[float]:
    """Centred moving mean over ``k`` rows (fewer at the ends), from running sums: O(n)."""
    h, n = k // 2, len(values)
    sums = [0.0, *itertools.accumulate(values)]
    return [
        (sums[min(n, i + h + 1)] - sums[max(0, i - h)]) / (min(n, i + h + 1) - max(0, i - h))
        for i in range(n)
    ]


def estimate(values: Sequence[float]) -> Noise | None:
    """The noise of a series of rows, or None below :data:`MIN_ROWS` rows. The smooth spans an
    eighth of the series (3 rows at least, odd), the share the rules' windows span."""
    n = len(values)
    if n < MIN_ROWS:
        return None
    k = max(3, n // 8) | 1
    course = smooth(values, k)
    r = [v - s for v, s in zip(values, course)]
    mr = math.fsum(r) / n
    var = math.fsum((x - mr) ** 2 for x in r) / (n - 1)
    sd = math.sqrt(var * k / (k - 1))  # a centred mean of k rows absorbs 1/k of each row's noise
    num = math.fsum((a - mr) * (b - mr) for a, b in itertools.pairwise(r))
    rho = num / (var * (n - 1)) if var > 0 else 0.0
    return Noise(sd, min(max(rho, 0.0), RHO_MAX))


def binomial_sd(p: float, items: int) -> float:
    """Standard deviation of a score that is a mean over ``items`` pass/fail items at rate ``p``
    (mean@k scores average k samples per item, which lowers it; this is the conservative end)."""
    p = min(max(p, 0.0), 1.0)
    return math.sqrt(max(p * (1 - p), 1.0 / items) / items)


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def best_of_quantile(b: int, alpha: float) -> float:
    """The ``1 - alpha`` quantile of the largest of ``b`` independent standard normals:
    ``Phi^-1((1 - alpha) ** (1 / b))``, by bisection."""
    target = (1 - alpha) ** (1 / max(b, 1))
    lo, hi = -10.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _phi(mid) < target else (lo, mid)
    return (lo + hi) / 2


def fall_quantile(b: int, m: int, alpha: float) -> float:
    """The ``1 - alpha`` quantile, in units of one row's sd, of ``max(best of b rows) - mean(m
    other rows)`` for independent standard normal rows (a flat series): the fall from a best
    that a flat run shows by chance. ``P(T <= t) = E_M[Phi(t + M) ** b]`` with ``M ~ N(0, 1/m)``,
    integrated on a grid of 401 points over +-8 sd of ``M``; then bisection on ``t``."""
    s = 1 / math.sqrt(m)
    grid = [-8 + 16 * i / 400 for i in range(401)]
    w = [math.exp(-(g * g) / 2) for g in grid]
    tot = math.fsum(w)

    def cdf(t: float) -> float:
        return math.fsum(wi * _phi(t + g * s) ** b for wi, g in zip(w, grid)) / tot

    lo, hi = -10.0, 15.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < 1 - alpha else (lo, mid)
    return (lo + hi) / 2


def eval_sd(values: Sequence[float], items: int) -> tuple[float, str] | None:
    """The per-evaluation noise of a validation score and how it was had: binomial on ``items``
    items where known and the scores lie in [0, 1], else estimated from the evaluations
    (:func:`estimate`, its autocorrelation folded in); None when neither can be had."""
    if items > 0 and all(0 <= v <= 1 for v in values):
        p = math.fsum(values) / len(values)
        return binomial_sd(p, items), f"binomial on {items} items"
    noise = estimate(values)
    if noise is None:
        return None
    return noise.se(1), f"estimated from the {len(values)} evaluations"


@dataclass(frozen=True)
class Fall:
    """A validation score's fall from its best evaluation before the last two to the mean of
    the last two, in units of one evaluation's noise (:func:`fall_from_best`)."""

    sd: float
    """One evaluation's noise (:func:`eval_sd`)."""
    how: str
    """How ``sd`` was had, for the evidence."""
    best: int
    """The index of the best evaluation before the last two."""
    now: float
    """The mean of the last two evaluations."""
    z: float
    """(best - now) / sd; with no noise, 0 for no fall and infinity for any."""
    rise: float
    """(now - first) / (sd * sqrt(1.5)): the last two's mean against the first evaluation, in
    standard errors of that difference (the validation rule's "below the first" is its
    negative, the not-learning rule's "validation rose" itself); 0 with no noise."""

    def beyond(self, alpha: float, before: int) -> bool:
        """Whether the fall exceeds what a flat run of ``before`` evaluations then two shows by
        chance at ``alpha`` (:func:`fall_quantile`)."""
        return self.z > fall_quantile(before, 2, alpha)


def fall_from_best(values: Sequence[float], items: int) -> Fall | None:
    """The fall of a validation score from its best (the best of all but the last two
    evaluations) to the mean of the last two; None with fewer than three evaluations or no
    noise to judge by (:func:`eval_sd`). The one computation behind the validation rule and
    "validation at its best" (the not-learning rule's saturated reading)."""
    if len(values) < 3 or (noise := eval_sd(values, items)) is None:
        return None
    sd, how = noise
    before = values[:-2]
    best = max(range(len(before)), key=lambda i: before[i])
    now = math.fsum(values[-2:]) / 2
    fall = before[best] - now
    z = fall / sd if sd > 0 else (math.inf if fall > 0 else 0.0)
    rise = (now - values[0]) / (sd * math.sqrt(1.5)) if sd > 0 else 0.0
    return Fall(sd, how, best, now, z, rise)
