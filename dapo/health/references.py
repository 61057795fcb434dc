"""Reference bands for the figures: the paper's Figure-7 shapes, or bands built from healthy
reference runs. A band is drawn only where the run is in the band's units."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .series import Run, series


@dataclass(frozen=True)
class ReferenceCurve:
    """A band over training progress (0 = first step, 1 = last) for one metric."""

    metric: str
    source: str
    progress: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    note: str = ""

    def at(self, p: float) -> tuple[float, float]:
        """Band (low, high) at progress ``p`` (linear interpolation)."""
        p = min(max(p, self.progress[0]), self.progress[-1])
        for i in range(len(self.progress) - 1):
            a, b = self.progress[i], self.progress[i + 1]
            if a <= p <= b:
                t = (p - a) / (b - a) if b > a else 0.0
                return (
                    self.low[i] + t * (self.low[i + 1] - self.low[i]),
                    self.high[i] + t * (self.high[i + 1] - self.high[i]),
                )
        return self.low[-1], self.high[-1]

    def comparable(self, values: Sequence[float], factor: float = 4.0) -> bool:
        """Whether a run's values are on this band's scale, so that drawing the band shows the
        run against it rather than squashing the run's own curve: their largest magnitudes
        within ``factor`` of each other (a 1k-4k-token band says nothing about 5-token
        answers), and the run's range (5th to 95th percentile) and the band's overlapping over
        at least a quarter of the narrower of the two (a -0.6..0.2 reward band against a run at
        0.65-0.94 is off its scale). Scale, not meaning: a 0/1 reward and the paper's +-1
        reward can pass; the note says which the band is."""
        if not values:
            return False
        v = sorted(values)
        lo, hi = v[int(0.05 * (len(v) - 1))], v[int(0.95 * (len(v) - 1))]
        run_scale = max(abs(v[0]), abs(v[-1]))
        band_lo, band_hi = min(self.low), max(self.high)
        band_scale = max(abs(band_lo), abs(band_hi))
        if not band_scale / factor <= run_scale <= band_scale * factor:
            return False
        overlap = min(hi, band_hi) - max(lo, band_lo)
        narrower = min(hi - lo, band_hi - band_lo)
        return overlap >= 0.25 * narrower if narrower > 0 else band_lo <= lo <= band_hi


PAPER = (
    "DAPO paper (Yu et al. 2025, arXiv:2503.14476), Figure 7 (Qwen2.5-32B DAPO run): shape only, +-15% band"
)


def _band(metric: str, start: float, end: float, note: str) -> ReferenceCurve:
    mids = [start + (end - start) * p for p in (0.0, 0.25, 0.5, 0.75, 1.0)]
    return ReferenceCurve(
        metric,
        PAPER,
        (0.0, 0.25, 0.5, 0.75, 1.0),
        tuple(m - 0.15 * abs(m) for m in mids),
        tuple(m + 0.15 * abs(m) for m in mids),
        note,
    )


PAPER_REFERENCES: dict[str, ReferenceCurve] = {
    "rollout/length_mean": _band(
        "rollout/length_mean",
        1000.0,
        4000.0,
        "length grows steadily, ~1k -> ~4k tokens; a healthy long-CoT run lengthens",
    ),
    "rollout/reward_mean": _band(
        "rollout/reward_mean", -0.6, 0.2, "reward rises, ~-0.6 -> ~+0.2 (rewards +-1)"
    ),
    "actor/entropy": _band("actor/entropy", 0.63, 0.70, "entropy stays in a narrow band, slowly rising"),
    "actor/mean_prob": _band("actor/mean_prob", 0.82, 0.76, "mean probability of sampled tokens drifts down"),
}
"""The paper's monitoring curves as reference shapes (for long-CoT LLM runs, not toy targets)."""


def references_from_runs(
    runs: Sequence[Run], metrics: Sequence[str], source: str, points: int = 21
) -> dict[str, ReferenceCurve]:
    """Bands (min..max over runs, on a common progress grid) from healthy reference runs."""
    out = {}
    grid = [i / (points - 1) for i in range(points)]
    for metric in metrics:
        per_run = []
        for run in runs:
            ys = series(run, metric).values
            if len(ys) >= 2:
                per_run.append([ys[round(p * (len(ys) - 1))] for p in grid])
        if per_run:
            low = tuple(min(col) for col in zip(*per_run))
            high = tuple(max(col) for col in zip(*per_run))
            out[metric] = ReferenceCurve(metric, source, tuple(grid), low, high)
    return out
