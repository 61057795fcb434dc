"""``dapo diagnose RUN --against REF [REF ...]``: the run against reference runs of the same
recipe (the user's earlier run, a published baseline, healthy toy arms), with a false-alarm rate
that can be stated.

What is done, per metric of :attr:`AgainstConfig.metrics` that the run and at least one
reference log (:func:`compare`):

1. **Alignment.** By training step (``align="step"``): the references are read at the run's own
   logged steps, by linear interpolation between their rows (never extrapolated: only the run's
   steps that every reference spans are judged). By share of the run (``align="share"``): a
   step becomes ``(step - first) / (last - first)`` of its own log, for references of another
   length. The grid is always the run's own rows, so a step reported is one the run logged.
2. **Scale.** The metrics of :attr:`~AgainstConfig.ratio_metrics` (grad norm, length, entropy,
   KL: quantities whose runs differ by a factor) are compared as logarithms where every value of
   the run and the references is positive, so a change is a ratio; the others as they are.
3. **Change, not level.** The judged points are cut into consecutive blocks of ``W = max(3, m //
   blocks)`` points (``m`` judged points; :attr:`~AgainstConfig.blocks`). The first block is the
   baseline. For the run, and for each reference, the *change* at block ``j`` is its block mean
   minus the references' mean curve's block mean, less the same difference over the baseline:
   a run whose level sits apart from the references' from its first rows (a 15% larger gradient
   norm from another batch size, a longer mean length from another prompt set) has no change;
   a run that leaves the references' course does.
4. **Noise, with autocorrelation.** Each series' per-row noise ``sd`` and lag-1 autocorrelation
   ``rho`` come from :func:`.noise.estimate` (residuals around its own course); the mean of ``k``
   rows then has the AR(1) standard error ``sd / sqrt(k) * sqrt((1 + rho) / (1 - rho))``: the
   effective sample size of autocorrelated points. The noise model's variance of the run's change
   at block ``j``: ``N_j = se_run(W_j)^2 + se_run(W_0)^2 + sum_r (se_r(W_j)^2 + se_r(W_0)^2) /
   n^2`` (its own noise, and the references' mean's).
5. **The test, controlled across metrics and blocks.** With ``n >= 2`` references, the variance
   of a new run's change is the classic prediction interval's: the sample variance across the
   references of their own changes (noise and between-run spread alike), pooled over the block
   and its neighbours, times ``1 + 1/n``, and at least ``N_j`` (a run noisier than its
   references); its degrees of freedom are ``(n - 1)`` per pooled block, and the quantile is
   Student's t on them (a variance from two or three runs is often far too small: the t keeps
   the rate). **One reference shows no between-run spread: the variance is ``N_j`` alone, the
   band is the noise alone, and the output says so** (a seed-to-seed difference in the course
   then reads as a departure). ``Z_j = change_j / sqrt(variance)``; a block departs when
   ``|Z_j|`` exceeds the ``1 - alpha / (2 K J)`` quantile (``K`` metrics compared, ``J`` blocks
   after the baseline; Bonferroni, two-sided). Under the model a healthy run of the references'
   recipe departs anywhere with probability at most :attr:`~AgainstConfig.alpha`: the stated
   false-alarm rate. The departure's start is the most likely change point (the split
   maximising the standardised sum after it) in the first departing block and the one before it.
6. **Outcome and verdict** (:meth:`Comparison.finding`). The outcomes (:data:`OUTCOMES`: reward,
   accuracy, validation score) are bad when they depart below. A health metric's departure is a
   ``warning`` with its evidence, *followed* when an outcome departs below at or after its start
   (then it is the first suspect for the cause). ``failing`` needs an outcome that departed below
   **and** stays below: the mean change from its start to the run's end is below by the same
   family-wise quantile in its own standard errors. An outcome that fell and came back is a
   warning; an outcome above the band alone is ``healthy`` (the run does better).

The comparison adds one finding (rule ``against``) to the rules' findings, so the run's verdict,
``--fail-on`` and the report take it in; the per-metric detail is :meth:`Comparison.as_dict`.
The measured false-alarm rates (healthy runs of other seeds, with and without a 15% level offset
in grad norm and length) and detection on toy faults: ``reports/health/against.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from . import noise as _noise
from .readers import RunLogError, read_runs, resolve
from .series import Run, series
from .verdict import Finding

OUTCOMES = ("rollout/accuracy", "rollout/reward_mean", "eval/score")
"""Outcome metrics: higher is better; a departure below is the bad direction."""
HEALTH_METRICS = (
    "actor/entropy",
    "rollout/length_mean",
    "rollout/truncation_rate",
    "actor/approx_kl",
    "actor/ref_kl",
    "actor/grad_norm",
    "actor/clipfrac_upper",
    "actor/clipfrac_lower",
    "actor/mean_prob",
    "rollout/groups_uniform",
    "rollout/groups_all_correct",
    "rollout/groups_all_wrong",
    "mismatch/logp_gap",
    "mismatch/k3_kl",
)
"""Health metrics compared by default (:data:`dapo.schema.SCHEMA` names)."""
RATIO_METRICS = (
    "actor/entropy",
    "rollout/length_mean",
    "actor/approx_kl",
    "actor/ref_kl",
    "actor/grad_norm",
    "mismatch/k3_kl",
)
"""Positive quantities whose runs differ by a factor (a batch size scales the gradient norm, a
prompt set the length): compared as logarithms where every value is positive."""
ALIGNS = ("step", "share")


class AgainstError(ValueError):
    """Bad ``--against`` input: one line naming the file (exit 2)."""


@dataclass(frozen=True)
class AgainstConfig:
    """How the run is compared with its references (module docstring: the method)."""

    align: str = "step"
    """``step``: the references read at the run's own training steps (same length and logging);
    ``share``: at the same share of their own run (step / last step), for references of
    another length."""
    alpha: float = 0.05
    """The family-wise false-alarm rate: the chance, under the noise model, that a healthy run of
    the references' recipe departs in any metric at any block (Bonferroni over both)."""
    blocks: int = 8
    """The judged points are cut into blocks of ``max(3, m // blocks)`` points; the first is the
    baseline. An eighth of the run: the rules' own windows (:func:`.noise.estimate`'s course)."""
    min_points: int = 9
    """Judged grid points a metric needs (and rows each reference needs) to be compared: a
    baseline and two blocks of 3."""
    metrics: tuple[str, ...] = OUTCOMES + HEALTH_METRICS
    """The metrics compared, where the run and a reference both log them."""
    outcomes: tuple[str, ...] = OUTCOMES
    """Those of :attr:`metrics` that are outcomes (higher is better; below is bad)."""
    ratio_metrics: tuple[str, ...] = RATIO_METRICS
    """Those of :attr:`metrics` compared as logarithms where every value is positive."""

    def __post_init__(self) -> None:
        if self.align not in ALIGNS:
            raise ValueError(f"align: expected one of {', '.join(ALIGNS)}, got {self.align!r}")
        if not (isinstance(self.alpha, (int, float)) and 0 < self.alpha < 1):
            raise ValueError(f"alpha: expected a number in (0, 1), got {self.alpha!r}")
        if not (isinstance(self.blocks, int) and self.blocks >= 3):
            raise ValueError(f"blocks: expected an integer >= 3, got {self.blocks!r}")
        if not (isinstance(self.min_points, int) and self.min_points >= 9):
            raise ValueError(f"min_points: expected an integer >= 9, got {self.min_points!r}")


@dataclass(frozen=True)
class Reference:
    """One reference run: its name (``FILE`` or ``FILE: label``), file and rows."""

    name: str
    path: Path
    label: str
    run: Run


@dataclass(frozen=True)
class Departure:
    """Where the run's change from its baseline left the references', beyond the family-wise
    quantile."""

    metric: str
    step: float
    """The run's step where it left (the most likely change point)."""
    confirmed: float
    """The last step of the first departing block: where the departure is first shown."""
    until: float
    """The last step of the consecutive departing blocks from the first."""
    direction: str
    """``above`` or ``below`` the references."""
    change: float
    """The change at the first departing block against the references' (module docstring, step
    3): a difference in the metric's units, or a factor for a metric compared as a ratio."""
    ratio: bool
    """Whether :attr:`change` is a factor (the metric compared as a logarithm)."""
    z: float
    """That change in its standard errors (signed)."""
    threshold: float
    """The family-wise quantile ``|z|`` had to exceed."""
    stays: float
    """Share of the blocks from the first departing one to the end beyond the quantile on the same
    side."""
    tail_z: float
    """The mean change from :attr:`step` to the end, in its standard errors (signed)."""
    tail_threshold: float
    """The quantile :attr:`tail_z` is judged by (the same level as the blocks')."""
    followed_by: str | None = None
    """For a health metric: the first outcome that departed below at or after ``step``."""
    followed_at: float | None = None

    @property
    def stays_below(self) -> bool:
        """Below the references from its start to the run's end, beyond the quantile."""
        return self.direction == "below" and self.tail_z <= -self.tail_threshold

    def size(self) -> str:
        """The change in words: ``-0.12`` or ``x1.8``."""
        return f"x{self.change:.3g}" if self.ratio else f"{self.change:+.3g}"


@dataclass(frozen=True)
class MetricComparison:
    """One metric: the grid, the run's smoothed curve, the references' course shifted to the
    run's baseline with the band a block mean may take, and the departure if any."""

    metric: str
    references: int
    steps: list[float]
    run: list[float]
    centre: list[float]
    low: list[float]
    high: list[float]
    departure: Departure | None
    ratio: bool = False
    threshold: float = math.nan
    between: bool = True
    """Whether the band holds a between-run spread (two references or more)."""


@dataclass(frozen=True)
class Comparison:
    """The run against its references: every metric compared, and the ones skipped with why."""

    label: str
    references: list[str]
    config: AgainstConfig
    metrics: dict[str, MetricComparison]
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def departures(self) -> list[Departure]:
        """Departures in order of their step."""
        ds = [m.departure for m in self.metrics.values() if m.departure is not None]
        return sorted(ds, key=lambda d: (d.step, d.metric))

    def _failing(self) -> list[Departure]:
        return [d for d in self.departures if d.metric in self.config.outcomes and d.stays_below]

    @property
    def status(self) -> str:
        """``failing``, ``warning`` or ``healthy`` (module docstring, step 6); ``unknown`` when
        no metric could be compared."""
        if not self.metrics:
            return "unknown"
        if self._failing():
            return "failing"
        if any(not (d.metric in self.config.outcomes and d.direction == "above") for d in self.departures):
            return "warning"
        return "healthy"

    def _outcome(self, d: Departure) -> str:
        if d.metric in self.config.outcomes:
            if d.direction == "above":
                return "the outcome is better"
            if d.stays_below:
                return "the outcome fell below the references and stayed there"
            return "the outcome fell below the references, then came back"
        if d.followed_by is not None:
            return f"followed by {d.followed_by} below from step {d.followed_at:g}"
        return "the outcome did not follow"

    def _describe(self, d: Departure, detail: bool = True) -> str:
        text = f"{d.metric} {d.direction} from step {d.step:g}"
        if detail:
            text += (
                f" (changed {d.size()} against the references' course, {d.z:+.1f} se, quantile "
                f"{d.threshold:.2f}; {d.stays:.0%} of the blocks since beyond; to the end {d.tail_z:+.1f} se)"
            )
        return f"{text}: {self._outcome(d)}"

    @property
    def one_reference(self) -> bool:
        """Whether every compared metric had a single reference (no between-run spread known)."""
        return bool(self.metrics) and not any(m.between for m in self.metrics.values())

    def _scope(self) -> str:
        n = len(self.metrics)
        text = (
            f"{len(self.references)} reference run(s), aligned by {self.config.align}; false-alarm rate "
            f"{self.config.alpha:g} over {n} metric(s) and their blocks under the noise model"
        )
        if self.one_reference:
            text += (
                "; one reference: the band is its and this run's noise only (no between-run spread is known), "
                "so a difference between seeds reads as a departure"
            )
        return text

    def finding(self) -> Finding:
        """The comparison as one finding (rule ``against``) beside the rules'."""
        ds = self.departures
        if not self.metrics:
            return Finding(
                "against",
                "Against reference runs",
                "unknown",
                None,
                f"no metric could be compared with {len(self.references)} reference run(s)",
                "",
                "too few steps",
            )
        head = f"{len(ds)} of {len(self.metrics)} metric(s) left the references' course ({self._scope()})"
        evidence = head + (": " + "; ".join(self._describe(d, detail=False) for d in ds) if ds else "")
        worst = self._failing()
        if worst:
            w = worst[0]
            evidence += (
                f"; failing: {w.metric} changed {w.size()} against the references from step {w.step:g} and stayed "
                f"below to the end ({w.tail_z:+.1f} se, quantile {w.threshold:.2f})"
            )
        if self.status == "failing":
            advice = (
                "the outcome fell below the reference runs and stayed there: compare this run's config, data and code "
                "with theirs at the first departure; the health metrics that left the course before it point at the cause"
            )
        elif self.status == "warning":
            advice = (
                "compare this run's config, data and code with the references' at the first departure; a health "
                "metric that left the course before the outcome did is the first suspect"
            )
        else:
            advice = ""
        return Finding(
            "against",
            "Against reference runs",
            self.status,
            ds[0].step if ds and self.status != "healthy" else None,
            evidence,
            advice,
        )

    def lines(self) -> list[str]:
        """Text lines, one per metric compared, for the console."""
        out = [f"  against {self._scope()}:"]
        for metric, m in self.metrics.items():
            d = m.departure
            if d is None:
                out.append(f"    {metric} within the band ({len(m.steps)} points)")
            else:
                out.append(f"    {self._describe(d)}")
        out += [f"    {metric} not compared: {why}" for metric, why in self.skipped.items()]
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the references, the config, per metric its departure (or null) and band."""
        return {
            "status": self.status,
            "references": self.references,
            "one_reference": self.one_reference,
            "config": {f.name: getattr(self.config, f.name) for f in fields(self.config)},
            "metrics": {
                k: {
                    "references": m.references,
                    "points": len(m.steps),
                    "ratio": m.ratio,
                    "threshold": m.threshold,
                    "departure": None if m.departure is None else m.departure.__dict__,
                    "steps": m.steps,
                    "run": m.run,
                    "low": m.low,
                    "high": m.high,
                }
                for k, m in self.metrics.items()
            },
            "skipped": self.skipped,
        }

    def markdown(self) -> list[str]:
        """A report section: one table row per metric compared."""
        lines = [
            f"### {self.label}: against {len(self.references)} reference run(s) ({self.status})",
            "",
            f"Aligned by {self.config.align}. Per metric, the run's change from its first block against the "
            f"references' change, in standard errors (AR(1) noise and the between-run spread), tested at a "
            f"false-alarm rate of {self.config.alpha:g} over every metric and block (`dapo.health.against`)."
            + (
                " One reference: no between-run spread is known; the band is the noise alone."
                if self.one_reference
                else ""
            ),
            "",
            "References: " + ", ".join(f"`{r}`" for r in self.references),
            "",
            "| metric | points | departed | direction | change | se (quantile) | blocks beyond since | outcome |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for metric, m in self.metrics.items():
            d = m.departure
            if d is None:
                lines.append(f"| {metric} | {len(m.steps)} | - | - | - | - | - | - |")
                continue
            lines.append(
                f"| {metric} | {len(m.steps)} | step {d.step:g} | {d.direction} | {d.size()} | {d.z:+.1f} "
                f"({d.threshold:.2f}) | {d.stays:.0%} | {self._outcome(d)} |"
            )
        lines += [f"- `{metric}` not compared: {why}" for metric, why in self.skipped.items()]
        return lines


# ---------------------------------------------------------------------------------- the math


def trailing_mean(y: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last ``window`` values at each point (fewer at the start); along the last axis."""
    y = np.asarray(y, dtype=float)
    c = np.cumsum(y, axis=-1)
    out = np.empty_like(y)
    for i in range(y.shape[-1]):
        lo = max(0, i - window + 1)
        total = c[..., i] - (c[..., lo - 1] if lo > 0 else 0.0)
        out[..., i] = total / (i - lo + 1)
    return out


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The upper ``p`` quantile (``p < 0.5``) of Student's t with ``df`` degrees of freedom (the
    normal's for ``df`` above 1e6). The tail ``P(T > x)``: Simpson's rule (2,001 points) on
    ``0.5 - int_0^x f`` for ``x < 1``, and on ``int_0^1 f(x / u) x / u^2 du`` (``t = x / u``) for
    ``x >= 1``; inverted by bisection."""
    tail: Callable[[float], float]
    if df > 1e6:

        def tail(x: float) -> float:
            return 0.5 * math.erfc(x / math.sqrt(2))

    else:
        c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
        grid = np.linspace(0.0, 1.0, 2001)
        w = np.ones_like(grid)
        w[1:-1:2], w[2:-1:2] = 4.0, 2.0
        w *= (grid[1] - grid[0]) / 3
        u = np.maximum(grid, 1e-300)

        def density(t: np.ndarray) -> np.ndarray:
            return np.asarray(np.exp(c - (df + 1) / 2 * np.log1p(t * t / df)))

        def tail(x: float) -> float:
            if x < 1:
                return 0.5 - float((w * density(grid * x)).sum() * x)
            with np.errstate(all="ignore"):
                f = np.where(grid > 0, density(x / u) * x / (u * u), 0.0)
            return float((w * f).sum())

    lo, hi = 0.0, 1.0
    while tail(hi) > p:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tail(mid) > p else (lo, mid)
        if hi - lo < 1e-9 * hi:
            break
    return (lo + hi) / 2


def _edges(m: int, blocks: int) -> list[tuple[int, int]]:
    """The judged points cut into consecutive blocks of ``max(3, m // blocks)`` points (the last
    one takes the remainder); the first is the baseline."""
    w = max(3, m // blocks)
    k = max(m // w, 1)
    starts = [i * w for i in range(k)]
    return [(s, starts[i + 1] if i + 1 < k else m) for i, s in enumerate(starts)]


@dataclass(frozen=True)
class _Stats:
    """One metric's block statistics, before the family-wise quantile is known."""

    metric: str
    references: int
    steps: list[float]
    raw: np.ndarray
    centre: np.ndarray
    edges: list[tuple[int, int]]
    change: np.ndarray
    """Per block after the baseline: the run's change against the references' (transformed)."""
    pooled: np.ndarray
    """The references' own changes' variance, pooled, times ``1 + 1/n`` (step 5; 0 with one
    reference)."""
    df: float
    """The degrees of freedom of :attr:`pooled`: ``n - 1`` (inf with one reference)."""
    diff: np.ndarray
    """Per point: run - references' mean (transformed), less the baseline's mean of it."""
    run_noise: _noise.Noise
    ref_noise: list[_noise.Noise]
    ratio: bool

    def noise_var(self, k: int) -> float:
        """The noise model's variance of the mean change over ``k`` rows against the baseline
        (module docstring, step 4): the run's own noise and the references' mean's."""
        b = self.edges[0][1] - self.edges[0][0]
        n = len(self.ref_noise)
        run = self.run_noise.se(k) ** 2 + self.run_noise.se(b) ** 2
        return run + sum(r.se(k) ** 2 + r.se(b) ** 2 for r in self.ref_noise) / n**2

    def tail(self, start: int, p: float) -> tuple[float, float, float]:
        """The mean of :attr:`diff` from point ``start`` to the end, its standard error and the
        quantile it is judged by at level ``p`` (:func:`_binding`): the noise of so many rows,
        and the pooled spread of the blocks it spans."""
        spans = [j for j, (_, hi) in enumerate(self.edges[1:]) if hi > start]
        pooled = float(np.mean(self.pooled[spans])) if spans else 0.0
        sd, q = _binding(pooled, self.noise_var(len(self.diff) - start), self.df, p, self._floor())
        return float(np.mean(self.diff[start:])), sd, q

    def _floor(self) -> float:
        return (1e-9 * (1.0 + float(np.max(np.abs(self.centre))))) ** 2


def _noise_of(values: np.ndarray) -> _noise.Noise:
    got = _noise.estimate([float(v) for v in values])
    return got if got is not None else _noise.Noise(0.0, 0.0)


def _stats(
    metric: str, steps: list[float], raw: np.ndarray, refs: np.ndarray, config: AgainstConfig
) -> _Stats:
    n, m = refs.shape
    ratio = metric in config.ratio_metrics and bool(np.all(raw > 0) and np.all(refs > 0))
    y, r = (np.log(raw), np.log(refs)) if ratio else (raw, refs)
    centre = r.mean(axis=0)
    edges = _edges(m, config.blocks)
    (b0, b1), rest = edges[0], edges[1:]
    run_noise = _noise_of(y)
    ref_noise = [_noise_of(row) for row in r]
    d = y - centre
    diff = d - d[b0:b1].mean()

    def block(x: np.ndarray, e: tuple[int, int]) -> Any:
        return x[..., e[0] : e[1]].mean(axis=-1)

    change = np.array([block(diff, e) for e in rest])
    pooled = np.zeros(len(rest))
    if n >= 2:
        # the prediction interval for one new run: the variance across the references of their
        # own changes (noise and between-run spread alike), the larger of its mean over the run
        # and over the block and its neighbours, times (1 + 1/n), on n - 1 degrees of freedom
        # (a run's deviation from the others is a smooth curve: its blocks are not independent
        # draws, so pooling them adds no degrees of freedom)
        dev = r - centre
        own = np.array([[block(dev[i], e) - block(dev[i], edges[0]) for e in rest] for i in range(n)])
        s2 = own.var(axis=0, ddof=1)
        whole = float(np.mean(s2))
        for j in range(len(rest)):
            pooled[j] = max(whole, float(np.mean(s2[max(0, j - 1) : j + 2]))) * (1 + 1 / n)
    df = n - 1 if n >= 2 else math.inf
    return _Stats(metric, n, steps, raw, centre, edges, change, pooled, df, diff, run_noise, ref_noise, ratio)


def _binding(pooled: float, noise: float, df: float, p: float, floor: float) -> tuple[float, float]:
    """(sd, quantile) of the test at upper level ``p``: a change must exceed both the references'
    prediction interval (``pooled`` on Student's t with ``df``) and the noise model's band
    (``noise`` on the normal); the wider of the two is the one reported."""
    qn = t_quantile(p, math.inf)
    noise_sd = math.sqrt(max(noise, floor))
    if pooled <= 0 or not math.isfinite(df):
        return noise_sd, qn
    qt = t_quantile(p, df)
    pooled_sd = math.sqrt(pooled)
    return (pooled_sd, qt) if qt * pooled_sd >= qn * noise_sd else (noise_sd, qn)


def _onset(st: _Stats, j: int, sign: int) -> int:
    """The most likely change point for a departure first shown by block ``j`` (0 = the first
    after the baseline): over the points of that block and the one before it (never the
    baseline), the split maximising ``sum(sign * diff[k:end]) / sqrt(end - k)``."""
    lo = st.edges[max(1, j)][0]
    end = st.edges[j + 1][1]
    x = sign * st.diff[lo:end]
    tails = np.cumsum(x[::-1])[::-1]
    score = tails / np.sqrt(np.arange(len(x), 0, -1))
    return lo + int(np.argmax(score))


def _judge(st: _Stats, tests: int, config: AgainstConfig) -> MetricComparison:
    rest = st.edges[1:]
    p = config.alpha / (2 * tests * max(len(rest), 1))
    floor = st._floor()
    sd, q = (
        np.array(v)
        for v in zip(
            *(_binding(pv, st.noise_var(hi - lo), st.df, p, floor) for pv, (lo, hi) in zip(st.pooled, rest))
        )
    )
    z = st.change / sd
    side = np.where(z > q, 1, np.where(z < -q, -1, 0))
    dep = None
    hit = np.flatnonzero(side)
    if len(hit):
        j = int(hit[0])
        s = int(side[j])
        k = j
        while k + 1 < len(side) and side[k + 1] == s:
            k += 1
        start = _onset(st, j, s)
        mean, se, q_tail = st.tail(start, p)
        change = float(st.change[j])
        dep = Departure(
            metric=st.metric,
            step=float(st.steps[start]),
            confirmed=float(st.steps[rest[j][1] - 1]),
            until=float(st.steps[rest[k][1] - 1]),
            direction="above" if s > 0 else "below",
            change=math.exp(change) if st.ratio else change,
            ratio=st.ratio,
            z=float(z[j]),
            threshold=float(q[j]),
            stays=float(np.mean(side[j:] == s)),
            tail_z=mean / se,
            tail_threshold=q_tail,
        )
    # the band, per point: the references' course shifted to the run's baseline, +- the quantile
    # times a block mean's standard error (the figure's and --json's band)
    m = len(st.steps)
    b0, b1 = st.edges[0]
    y = np.log(st.raw) if st.ratio else st.raw
    level = st.centre + float((y - st.centre)[b0:b1].mean())
    half = np.zeros(m)
    for (lo, hi), qq, s in zip(rest, q, sd):
        half[lo:hi] = qq * s
    half[b0:b1] = half[b1] if m > b1 else 0.0
    low, high = level - half, level + half
    w = max(1, b1 - b0)
    smooth = trailing_mean(y, w)
    back = np.exp if st.ratio else (lambda a: a)
    return MetricComparison(
        st.metric,
        st.references,
        st.steps,
        back(smooth).tolist(),
        back(level).tolist(),
        back(low).tolist(),
        back(high).tolist(),
        dep,
        st.ratio,
        float(np.max(q)) if len(q) else math.nan,
        st.references >= 2,
    )


# ------------------------------------------------------------------------------- alignment


def _progress(run: Run) -> tuple[float, float]:
    steps = [float(r["step"]) for r in run if isinstance(r.get("step"), (int, float))]
    return (min(steps), max(steps)) if steps else (0.0, float(max(len(run) - 1, 1)))


def _coords(run: Run, steps: Sequence[float], align: str) -> np.ndarray:
    x = np.asarray(steps, dtype=float)
    if align == "step":
        return x
    first, last = _progress(run)
    return (x - first) / (last - first) if last > first else np.zeros_like(x)


def compare_metric(run: Run, refs: Sequence[Run], metric: str, config: AgainstConfig) -> _Stats | str:
    """One metric of the run against the references that log it, before the family-wise
    quantile; a string says why it could not be compared."""
    s = series(run, metric)
    have = [(r, series(r, metric)) for r in refs]
    have = [(r, rs) for r, rs in have if len(rs) >= 3]
    if not have:
        return "no reference logs it"
    u = _coords(run, s.steps, config.align)
    covered = np.ones(len(u), dtype=bool)
    curves = []
    for r, rs in have:
        ru = _coords(r, rs.steps, config.align)
        covered &= (u >= ru[0] - 1e-9) & (u <= ru[-1] + 1e-9)
        curves.append(np.interp(u, ru, rs.values))
    m = int(covered.sum())
    if m < config.min_points:
        where = "steps" if config.align == "step" else "share of the run"
        return (
            f"{m} of the run's {len(s)} rows lie within the references' {where} (needs {config.min_points})"
        )
    keep = np.flatnonzero(covered)
    steps = [s.steps[i] for i in keep]
    raw = np.asarray(s.values, dtype=float)[keep]
    return _stats(metric, steps, raw, np.array([c[keep] for c in curves]), config)


def compare(
    label: str, run: Run, refs: Sequence[Reference], config: AgainstConfig = AgainstConfig()
) -> Comparison:
    """The run against the references (module docstring: the method)."""
    run = sorted(run, key=lambda r: r.get("step", 0))
    rows = [sorted(r.run, key=lambda x: x.get("step", 0)) for r in refs]
    stats: dict[str, _Stats] = {}
    skipped: dict[str, str] = {}
    for metric in config.metrics:
        if not len(series(run, metric)):
            continue
        got = compare_metric(run, rows, metric, config)
        if isinstance(got, str):
            if got != "no reference logs it":
                skipped[metric] = got
        else:
            stats[metric] = got
    metrics = {k: _judge(st, len(stats), config) for k, st in stats.items()}
    outcome_falls = [
        m.departure
        for k, m in metrics.items()
        if k in config.outcomes and m.departure is not None and m.departure.direction == "below"
    ]
    for k, m in metrics.items():
        d = m.departure
        if d is None or k in config.outcomes:
            continue
        later = [o for o in outcome_falls if o.step >= d.step]
        if later:
            first = min(later, key=lambda o: o.step)
            followed = Departure(**{**d.__dict__, "followed_by": first.metric, "followed_at": first.step})
            metrics[k] = replace(m, departure=followed)
    return Comparison(label, [r.name for r in refs], config, metrics, skipped)


# ------------------------------------------------------------------------------ the inputs


def label_matches(label: str, want: str) -> bool:
    """Whether a run's label is the one asked for: equal, or holding each of its ``/`` parts
    (``arm=clip_higher`` selects ``experiment=x/arm=clip_higher/seed=3``)."""
    parts = label.split("/")
    return label == want or all(p in parts for p in want.split("/"))


def load_references(specs: Sequence[str]) -> list[Reference]:
    """The reference runs of ``--against FILE[#LABEL] ...``: every run in each file (a multi-run
    file: each of its runs), or with ``#LABEL`` those whose label holds each ``/`` part of it.
    Raises :class:`AgainstError` with one line naming the file."""
    out: list[Reference] = []
    for spec in specs:
        path, want = spec, None
        if "#" in spec and not Path(spec).exists():
            path, _, want = spec.rpartition("#")
        try:
            runs, _, _ = read_runs(path)
        except (RunLogError, OSError) as err:
            said = str(err)
            raise AgainstError(f"--against {said if said.startswith(path) else f'{spec}: {said}'}") from None
        chosen = {k: v for k, v in runs.items() if want is None or label_matches(k, want)}
        if not chosen:
            raise AgainstError(
                f"--against {spec}: no run labelled {want!r} in {path}; runs: {', '.join(list(runs)[:12])}"
            )
        file = resolve(path)
        for k, v in chosen.items():
            out.append(Reference(path if k == "run" else f"{path}: {k}", file, k, v))
    return out


def compare_all(
    run_path: str, runs: Mapping[str, Run], refs: Sequence[Reference], config: AgainstConfig = AgainstConfig()
) -> dict[str, Comparison]:
    """Each run of the log against the references, leaving out a reference that is the run
    itself (the same file and label). Raises :class:`AgainstError` for a reference that shares
    no compared metric with the run, or when no reference is left."""
    logged = {m for run in runs.values() for m in config.metrics if len(series(run, m))}
    for ref in refs:
        theirs = {m for m in config.metrics if len(series(ref.run, m))}
        if not logged & theirs:
            have = ", ".join(sorted(logged)) or "none"
            raise AgainstError(
                f"--against {ref.name}: shares no compared metric with {run_path} (the run logs: {have}; "
                f"the reference: {', '.join(sorted(theirs)) or 'none of them'})"
            )
    me = resolve(run_path)
    out = {}
    for label, run in runs.items():
        mine = [r for r in refs if not (r.path == me and r.label == label)]
        if not mine:
            raise AgainstError(f"--against: the only reference is the run itself ({run_path}: {label})")
        out[label] = compare(label, run, mine, config)
    return out


# ---------------------------------------------------------------------------------- report


def append_report(path: Path, comparisons: Mapping[str, Comparison], max_figures: int = 12) -> None:
    """Add an "Against reference runs" section to ``report.md`` at ``path``: per run the table of
    :meth:`Comparison.markdown` and (with the ``report`` extra) a figure of every metric compared,
    the run's smoothed curve over the references' band, departures marked."""
    lines = ["", "## Against reference runs", ""]
    for n, (label, c) in enumerate(comparisons.items()):
        lines += c.markdown()
        if n < max_figures:
            figure = _figure(path.parent, label, c)
            if figure:
                lines += ["", f"![{label} against its references]({figure})"]
        lines.append("")
    with path.open("a") as f:
        f.write("\n".join(lines))


def _figure(out: Path, label: str, c: Comparison) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not c.metrics:
        return None
    cols = min(3, len(c.metrics))
    rows = -(-len(c.metrics) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.2 * rows), squeeze=False)
    for ax, (metric, m) in zip(axes.flat, c.metrics.items()):
        ax.fill_between(m.steps, m.low, m.high, color="0.6", alpha=0.3, label="references' band")
        ax.plot(m.steps, m.centre, color="0.4", lw=0.8, ls=":", label="references' mean")
        ax.plot(m.steps, m.run, color="C0", lw=1.2, label="this run (trailing mean)")
        d = m.departure
        if d is not None:
            ax.axvline(d.step, color="C3", ls="--", lw=1, label=f"left the band ({d.direction})")
        ax.set_title(metric, fontsize=8)
        ax.set_xlabel("training step")
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2, frameon=False)
    for ax in list(axes.flat)[len(c.metrics) :]:
        ax.set_visible(False)
    fig.suptitle(f"{label}: against {len(c.references)} reference run(s) ({c.status})", fontsize=10)
    fig.tight_layout()
    slug = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in label).strip("_") or "run"
    file = f"against-{slug}.png"
    fig.savefig(out / file, dpi=90)
    plt.close(fig)
    return file
