"""Paired comparisons with bootstrap intervals, and the verdict rules."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 12345


@dataclass(frozen=True)
class Interval:
    """Mean of the paired differences and its bootstrap 95% interval."""

    mean: float
    low: float
    high: float
    n: int

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def paired_interval(diffs: list[float] | np.ndarray, confidence: float = 0.95) -> Interval:
    """Bootstrap (BCa, fixed seed) interval of the mean paired difference.

    NaN differences (a metric undefined for that seed) are dropped and the count reported.
    Identical differences (e.g. a control whose arms are the same computation) give a
    zero-width interval at that value.

    The differences are rounded to 12 significant digits first. BCa is discontinuous in
    its data: its bias correction counts the resamples whose mean falls below the
    observed one, and a resample that repeats the sample ties with it up to rounding. So
    a last-bit change (another summation order, another machine's SIMD) would move the
    endpoints by ~1e-5; rounded data give the same interval."""
    d = np.asarray([float(f"{x:.12g}") for x in diffs if not math.isnan(x)], dtype=np.float64)
    if d.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(d.mean())
    if d.size < 2 or np.ptp(d) <= 1e-12 * max(1.0, abs(mean)):
        return Interval(mean, mean, mean, int(d.size))
    from scipy import stats  # lazily: a toy worker process never needs it

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.bootstrap(
            (d,),
            np.mean,
            confidence_level=confidence,
            n_resamples=BOOTSTRAP_RESAMPLES,
            method="BCa",
            random_state=np.random.default_rng(BOOTSTRAP_SEED),
        )
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):  # BCa can fail on near-degenerate data
        lo, hi = (
            float(x)
            for x in np.percentile(
                np.random.default_rng(BOOTSTRAP_SEED).choice(d, (BOOTSTRAP_RESAMPLES, d.size)).mean(1),
                [2.5, 97.5],
            )
        )
    return Interval(mean, lo, hi, int(d.size))


def verdict(interval: Interval, expect: str) -> str:
    """``expect`` is ``+`` or ``-`` (the paper's direction for b - a), ``0`` (a control)
    or ``?`` (no prediction: the observed direction is reported).

    Effects: ``reproduced`` (interval excludes 0 on the expected side), ``reversed``
    (excludes 0 on the other side), ``not reproduced`` (includes 0). Controls:
    ``no effect (as expected)`` or ``EFFECT IN CONTROL``."""
    if interval.n == 0:
        return "undefined"
    if expect == "0":
        return "EFFECT IN CONTROL" if interval.excludes_zero() else "no effect (as expected)"
    if expect == "?":
        if not interval.excludes_zero():
            return "no significant difference"
        return "b > a" if interval.low > 0 else "b < a"
    if not interval.excludes_zero():
        return "not reproduced"
    positive = interval.low > 0
    return "reproduced" if positive == (expect == "+") else "reversed"
