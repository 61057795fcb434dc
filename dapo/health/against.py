"""``dapo diagnose RUN --against REF [REF ...]``: the run against reference runs of the same
recipe (the user's earlier run, a published baseline, healthy toy arms).

What is done, per metric of :attr:`AgainstConfig.metrics` that the run and at least one
reference log (:func:`compare`):

1. **Alignment.** By training step (``align="step"``): the references are read at the run's own
   logged steps, by linear interpolation between their rows (never extrapolated: only the run's
   steps that every reference spans are judged). By share of the run (``align="share"``): a
   step becomes ``(step - first) / (last - first)`` of its own log, for references of another
   length. The grid is always the run's own rows, so a step reported is one the run logged.
2. **Smoothing, like for like.** The run and every aligned reference are smoothed the same way,
   with a trailing mean over :attr:`~AgainstConfig.window` grid points (a causal moving
   average: a point's smoothed value uses no later row, as in :meth:`.series.Series.moving`).
3. **Noise of a reference.** Each reference's point-to-point noise ``s_r``: the standard
   deviation of its residuals around a centred local-linear fit over
   :attr:`~AgainstConfig.noise_window` of its own rows, each residual divided by
   ``sqrt(1 - h_ii)`` (``h_ii``: the fit's leverage at that row) so that the fit's own use of a
   row does not shrink it (the studentised residual of a local linear smoother; Cleveland 1979,
   Loader 1999 ch. 2). A root mean square, not a median: a metric that is mostly 0 with rare
   non-zero rows (a clip fraction) has noise that a median would call zero.
4. **The band** (:func:`band`), at each grid point: centre ``c`` = the mean of the references'
   smoothed curves; half-width
   ``h = z * sqrt(B * (1 + 1/n) + N)`` with ``n`` references, ``B`` their between-run variance
   (the sample variance of the smoothed curves at that point, averaged over the ``2 * window +
   1`` points around it) and ``N`` the mean of their ``s_r**2``. The ``B * (1 + 1/n)`` term is
   the classic prediction interval for one new draw from the references' population (the
   ``1/n`` for the uncertainty of their mean); the ``N`` term widens it by a reference's own
   point noise, so that two references whose curves happen to agree do not give a razor-thin
   band. A few references estimate ``B`` badly (a variance from 2-4 runs is often far below the
   truth), and one reference not at all, so ``B`` is at least ``(min_spread * R)**2``, with
   ``R`` the range of the references' mean curve over the judged points
   (:attr:`~AgainstConfig.min_spread`): an assumption, that runs of one recipe differ by about a
   tenth of how far the metric moves; with one reference it is the only between-run term. A
   floor of ``1e-9 * (1 + |c|)`` keeps float noise from departing. The measured false-alarm
   rates with 1, 2 and 8 references (``reports/health/against.md``, the README) say what is
   left.
5. **Departure.** The run's smoothed curve outside ``[c - h, c + h]`` on the same side at
   :attr:`~AgainstConfig.persist` consecutive grid points, the first such stretch. Its start is
   corrected for the trailing mean's lag: moved back over the run's raw rows just before it that
   are already beyond the same edge (as :meth:`.series.Series.onset` does for the rules). How far:
   the median (and the largest) excess beyond the edge over the stretch, in the metric's units
   and in band widths (``2h``); the share of the judged points from the start to the end of the
   run that lie beyond that edge says whether it came back.
6. **Outcome and verdict** (:meth:`Comparison.finding`). The outcomes (:data:`OUTCOMES`: reward,
   accuracy, validation score) are bad when they depart below. A health metric's departure is
   *followed* when an outcome departs below at or after its start. Every departure is reported
   at ``warning`` (a downward outcome departure, a departure followed by the outcome, and one the
   outcome did not follow alike; the evidence says which), except an outcome above the band,
   which alone is ``healthy`` (the run does better). ``failing``: an outcome departed below
   and, from its departure to the run's end, its smoothed curve's median distance below the
   references' mean is at least :attr:`~AgainstConfig.fail_sd` standard deviations (the band's
   half-width / ``z``): below for most of the rest of the run, and by more than chance.

The comparison adds one finding (rule ``against``) to the rules' findings, so the run's verdict,
``--fail-on`` and the report take it in; the per-metric detail is :meth:`Comparison.as_dict`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

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
    z: float = 2.5
    """Band half-width in standard deviations of a new run's smoothed value (between-run
    spread and point noise together)."""
    window: int = 5
    """Grid points (the run's logged rows) in the trailing mean that smooths the run and the
    references alike; also the half-width, in points, of the span over which the references'
    between-run variance is averaged."""
    noise_window: int = 5
    """A reference's own rows in the centred local-linear fit whose residuals give its point
    noise."""
    persist: int = 5
    """Consecutive grid points the smoothed run must stay beyond the same edge to depart (for a
    sparse series of ``m`` judged points, ``max(2, min(persist, m // 8))``)."""
    fail_sd: float = 3.0
    """An outcome that departed below and whose median, from its departure to the run's end,
    sits at least this many standard deviations (the band's half-width / ``z``) below the
    references' mean makes the comparison failing: persistently (a median over the rest of the
    run) and beyond a stated size."""
    min_spread: float = 0.1
    """The spread between runs of the recipe (a standard deviation) is taken as at least this
    fraction of the references' range (the max - min of their mean smoothed curve over the
    judged points): what one reference cannot show and a few show badly; 0: only what the
    references show."""
    min_points: int = 8
    """Judged grid points a metric needs (and rows each reference needs) to be compared."""
    metrics: tuple[str, ...] = OUTCOMES + HEALTH_METRICS
    """The metrics compared, where the run and a reference both log them."""
    outcomes: tuple[str, ...] = OUTCOMES
    """Those of :attr:`metrics` that are outcomes (higher is better; below is bad)."""

    def __post_init__(self) -> None:
        if self.align not in ALIGNS:
            raise ValueError(f"align: expected one of {', '.join(ALIGNS)}, got {self.align!r}")
        if not (math.isfinite(self.z) and self.z > 0):
            raise ValueError(f"z: expected a positive number, got {self.z!r}")
        for f in ("fail_sd", "min_spread"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{f}: expected a number >= 0, got {v!r}")
        for f in ("window", "noise_window", "persist"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f}: expected an integer >= 1, got {getattr(self, f)!r}")
        if self.noise_window < 3:
            raise ValueError(f"noise_window: expected an integer >= 3, got {self.noise_window!r}")
        if self.min_points < 3:
            raise ValueError(f"min_points: expected an integer >= 3, got {self.min_points!r}")


@dataclass(frozen=True)
class Reference:
    """One reference run: its name (``FILE`` or ``FILE: label``), file and rows."""

    name: str
    path: Path
    label: str
    run: Run


@dataclass(frozen=True)
class Departure:
    """Where the run's smoothed curve left the references' band, persistently."""

    metric: str
    step: float
    """The run's step where it left (lag-corrected)."""
    confirmed: float
    """The step of the ``persist``-th point outside: where a log growing step by step would first
    show the departure (the run's side uses no later row)."""
    until: float
    """The last step of the first stretch outside."""
    direction: str
    """``above`` or ``below`` the band."""
    excess: float
    """Median excess beyond the band's edge over the stretch, in the metric's units."""
    widths: float
    """The same in band widths (``high - low``)."""
    peak_widths: float
    """The largest excess over the stretch, in band widths."""
    stays: float
    """Share of the judged points from ``step`` to the end beyond the same edge."""
    tail_sd: float
    """Median distance from the references' mean, from ``step`` to the end, in the departure's
    direction, in standard deviations (the band's half-width / ``z``; ``z`` and more: beyond the
    edge)."""
    followed_by: str | None = None
    """For a health metric: the first outcome that departed below at or after ``step``."""
    followed_at: float | None = None


@dataclass(frozen=True)
class MetricComparison:
    """One metric: the grid, the run's smoothed curve, the band, and the departure if any."""

    metric: str
    references: int
    steps: list[float]
    run: list[float]
    centre: list[float]
    low: list[float]
    high: list[float]
    departure: Departure | None


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

    def _bad(self, d: Departure) -> bool:
        return d.metric in self.config.outcomes and d.direction == "below"

    @property
    def status(self) -> str:
        """``failing``, ``warning`` or ``healthy`` (module docstring, step 6); ``unknown`` when
        no metric could be compared."""
        if not self.metrics:
            return "unknown"
        ds = self.departures
        if any(self._bad(d) and d.tail_sd >= self.config.fail_sd for d in ds):
            return "failing"
        if any(not (d.metric in self.config.outcomes and d.direction == "above") for d in ds):
            return "warning"
        return "healthy"

    def _outcome(self, d: Departure) -> str:
        if d.metric in self.config.outcomes:
            return (
                "the outcome fell below the references" if d.direction == "below" else "the outcome is better"
            )
        if d.followed_by is not None:
            return f"followed by {d.followed_by} below from step {d.followed_at:g}"
        return "the outcome did not follow"

    def _describe(self, d: Departure, detail: bool = True) -> str:
        text = f"{d.metric} {d.direction} from step {d.step:g}"
        if detail:
            text += (
                f" (beyond the edge by {_num(abs(d.excess))}, {_num(d.widths)} band widths, peak "
                f"{_num(d.peak_widths)}; {d.stays:.0%} of the points since outside, their median "
                f"{d.tail_sd:.1f} sd {d.direction} the references' mean)"
            )
        return f"{text}: {self._outcome(d)}"

    def finding(self) -> Finding:
        """The comparison as one finding (rule ``against``) beside the rules'."""
        ds = self.departures
        refs = f"{len(self.references)} reference run(s), aligned by {self.config.align}"
        if not self.metrics:
            return Finding(
                "against",
                "Against reference runs",
                "unknown",
                None,
                f"no metric could be compared with {refs}",
                "",
                "too few steps",
            )
        head = f"{len(ds)} of {len(self.metrics)} metric(s) left the references' band ({refs})"
        evidence = head + (": " + "; ".join(self._describe(d, detail=False) for d in ds) if ds else "")
        worst = [d for d in ds if self._bad(d) and d.tail_sd >= self.config.fail_sd]
        if worst:
            evidence += (
                f"; failing: {worst[0].metric} sits a median {worst[0].tail_sd:.1f} sd below the references' mean "
                f"from step {worst[0].step:g} to the end (fail_sd {self.config.fail_sd:g})"
            )
        if self.status == "failing":
            advice = (
                "the outcome fell well below the reference runs: compare this run's config, data and code with "
                "theirs at the first departure; the health metrics that left the band before it point at the cause"
            )
        elif self.status == "warning":
            advice = (
                "compare this run's config, data and code with the references' at the first departure; a health "
                "metric that left the band before the outcome did is the first suspect"
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
        out = [f"  against {len(self.references)} reference run(s), aligned by {self.config.align}:"]
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
            "config": {f.name: getattr(self.config, f.name) for f in fields(self.config)},
            "metrics": {
                k: {
                    "references": m.references,
                    "points": len(m.steps),
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
            f"Aligned by {self.config.align}; band: mean of the references' trailing means (over "
            f"{self.config.window} points) +- {self.config.z:g} x sqrt(between-run variance x (1 + 1/n) + point "
            f"noise); a departure: {self.config.persist} consecutive points beyond one edge "
            "(`dapo.health.against`).",
            "",
            "References: " + ", ".join(f"`{r}`" for r in self.references),
            "",
            "| metric | points | departed | direction | beyond the edge (units; band widths; peak) | outside since "
            "| outcome |",
            "|---|---|---|---|---|---|---|",
        ]
        for metric, m in self.metrics.items():
            d = m.departure
            if d is None:
                lines.append(f"| {metric} | {len(m.steps)} | - | - | - | - | - |")
                continue
            lines.append(
                f"| {metric} | {len(m.steps)} | step {d.step:g} | {d.direction} | {_num(abs(d.excess))}; "
                f"{_num(d.widths)}; {_num(d.peak_widths)} | {d.stays:.0%} | {self._outcome(d)} |"
            )
        lines += [f"- `{metric}` not compared: {why}" for metric, why in self.skipped.items()]
        return lines


def _num(x: float) -> str:
    return f"{x:.3g}"


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


def point_noise(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, window: int) -> float:
    """A series' point-to-point noise: the root mean square of its studentised residuals
    around a local-linear fit over the ``window`` rows nearest each row (shifted, not shrunk,
    at the ends). 0 for fewer than 3 rows."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(ys)
    if n < 3:
        return 0.0
    w = min(window, n)
    res = []
    for i in range(n):
        lo = min(max(0, i - w // 2), n - w)
        xw, yw = xs[lo : lo + w], ys[lo : lo + w]
        xm = xw.mean()
        sxx = float(((xw - xm) ** 2).sum())
        slope = float(((xw - xm) * (yw - yw.mean())).sum()) / sxx if sxx > 0 else 0.0
        fit = yw.mean() + slope * (xs[i] - xm)
        lev = 1.0 / w + ((xs[i] - xm) ** 2 / sxx if sxx > 0 else 0.0)
        if lev < 1.0:
            res.append((ys[i] - fit) / math.sqrt(1.0 - lev))
    return float(np.sqrt(np.mean(np.square(res)))) if res else 0.0


def band(
    smoothed: np.ndarray, noise: Sequence[float], z: float, window: int, min_spread: float = 0.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(centre, low, high) at each grid point from the references' smoothed curves
    (``smoothed``: one row per reference) and their point noise (module docstring, step 4)."""
    smoothed = np.atleast_2d(np.asarray(smoothed, dtype=float))
    n, m = smoothed.shape
    centre = smoothed.mean(axis=0)
    floor = (min_spread * float(np.ptp(centre))) ** 2
    if n > 1:
        var = smoothed.var(axis=0, ddof=1)
        between = np.array([max(var[max(0, i - window) : i + window + 1].mean(), floor) for i in range(m)])
    else:
        between = np.full(m, floor)
    noise2 = float(np.mean(np.square(np.asarray(noise, dtype=float))))
    half = z * np.sqrt(between * (1.0 + 1.0 / n) + noise2)
    half = np.maximum(half, 1e-9 * (1.0 + np.abs(centre)))
    return centre, centre - half, centre + half


def departure(
    metric: str,
    steps: Sequence[float],
    raw: np.ndarray,
    smooth: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    persist: int,
    z: float,
) -> Departure | None:
    """The first stretch of ``persist`` consecutive points where ``smooth`` is beyond the same
    edge of ``[low, high]``, its start moved back over the raw rows before it already beyond
    that edge; None if there is none."""
    side = np.where(smooth > high, 1, np.where(smooth < low, -1, 0))
    m = len(side)
    for i in range(m - persist + 1):
        s = side[i]
        if s == 0 or not np.all(side[i : i + persist] == s):
            continue
        end = i
        while end + 1 < m and side[end + 1] == s:
            end += 1
        start = i
        beyond = raw > high if s > 0 else raw < low
        while start > 0 and beyond[start - 1] and beyond[start]:
            start -= 1
        width = high - low
        centre = (high + low) / 2
        edge_excess = (smooth - high) if s > 0 else (low - smooth)
        stretch = slice(i, end + 1)
        rest = slice(start, m)
        return Departure(
            metric=metric,
            step=float(steps[start]),
            confirmed=float(steps[i + persist - 1]),
            until=float(steps[end]),
            direction="above" if s > 0 else "below",
            excess=float(s * np.median(edge_excess[stretch])),
            widths=float(np.median(edge_excess[stretch] / width[stretch])),
            peak_widths=float(np.max(edge_excess[stretch] / width[stretch])),
            stays=float(np.mean(side[rest] == s)),
            tail_sd=float(np.median(s * (smooth[rest] - centre[rest]) / (width[rest] / (2 * z)))),
        )
    return None


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


def compare_metric(
    run: Run, refs: Sequence[Run], metric: str, config: AgainstConfig
) -> MetricComparison | str:
    """One metric of the run against the references that log it; a string says why it could
    not be compared."""
    s = series(run, metric)
    have = [(r, series(r, metric)) for r in refs]
    have = [(r, rs) for r, rs in have if len(rs) >= 3]
    if not have:
        return "no reference logs it"
    u = _coords(run, s.steps, config.align)
    covered = np.ones(len(u), dtype=bool)
    curves, noise = [], []
    for r, rs in have:
        ru = _coords(r, rs.steps, config.align)
        covered &= (u >= ru[0] - 1e-9) & (u <= ru[-1] + 1e-9)
        curves.append(np.interp(u, ru, rs.values))
        noise.append(point_noise(ru, rs.values, config.noise_window))
    m = int(covered.sum())
    if m < config.min_points:
        where = "steps" if config.align == "step" else "share of the run"
        return (
            f"{m} of the run's {len(s)} rows lie within the references' {where} (needs {config.min_points})"
        )
    keep = np.flatnonzero(covered)
    steps = [s.steps[i] for i in keep]
    raw = np.asarray(s.values, dtype=float)[keep]
    refs_on_grid = np.array([c[keep] for c in curves])
    smooth = trailing_mean(raw, config.window)
    centre, low, high = band(
        trailing_mean(refs_on_grid, config.window), noise, config.z, config.window, config.min_spread
    )
    persist = config.persist if m >= 8 * config.persist else max(2, min(config.persist, m // 8))
    dep = departure(metric, steps, raw, smooth, low, high, persist, config.z)
    return MetricComparison(
        metric,
        len(have),
        steps,
        smooth.tolist(),
        centre.tolist(),
        low.tolist(),
        high.tolist(),
        dep,
    )


def compare(
    label: str, run: Run, refs: Sequence[Reference], config: AgainstConfig = AgainstConfig()
) -> Comparison:
    """The run against the references (module docstring: the method)."""
    run = sorted(run, key=lambda r: r.get("step", 0))
    rows = [sorted(r.run, key=lambda x: x.get("step", 0)) for r in refs]
    metrics: dict[str, MetricComparison] = {}
    skipped: dict[str, str] = {}
    for metric in config.metrics:
        if not len(series(run, metric)):
            continue
        got = compare_metric(run, rows, metric, config)
        if isinstance(got, str):
            if got != "no reference logs it":
                skipped[metric] = got
        else:
            metrics[metric] = got
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
            metrics[k] = MetricComparison(
                m.metric,
                m.references,
                m.steps,
                m.run,
                m.centre,
                m.low,
                m.high,
                Departure(**{**d.__dict__, "followed_by": first.metric, "followed_at": first.step}),
            )
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
