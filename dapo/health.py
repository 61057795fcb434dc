"""Training health: reference curves and one rule per failure mode (pure functions, no I/O).

A run is a list of metric dicts (the :data:`dapo.metrics.SCHEMA` names, one per step,
ordered by ``step``). :func:`diagnose` applies every rule and returns one
:class:`Finding` per rule: ``healthy``, ``warning``, ``failing`` or ``unknown`` (the
metrics it needs are absent), the step where the problem started, the evidence, and the
DAPO knob that addresses it. Thresholds live in :class:`HealthConfig`.

The rules encode what the paper shows each failure looks like:

* entropy collapse (Fig. 2b): entropy falls to a fraction of its start and stays there;
  supporting evidence: up-clipped tokens with low old probability (Fig. 3a);
* vanishing signal (Fig. 3b): the share of groups with accuracy 1 or 0 is high and rising,
  or dynamic sampling needs more and more rounds / cannot fill the batch;
* unhealthy length growth (Fig. 4): length and entropy rise together while accuracy is flat;
* truncation noise (Fig. 5): many responses hit the ceiling while entropy drops;
* rollout/trainer mismatch: the engine's and the trainer's log-probs drift apart;
* gradients: non-finite steps were skipped, or the gradient norm explodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

Run = Sequence[dict[str, float]]
STATUSES = ("healthy", "warning", "failing", "unknown")
SEVERITY = {"unknown": -1, "healthy": 0, "warning": 1, "failing": 2}
Verdict = tuple[str, float | None, str]
"""What a rule's check returns: (status, start step or None, evidence)."""


@dataclass(frozen=True)
class HealthConfig:
    """Thresholds of the rules (fractions are of the metric's value at the start)."""

    window: int = 10
    """Steps averaged for "start", "now" and "stays" judgements."""
    entropy_warn_frac: float = 0.75
    """Entropy below this fraction of its start (and staying there): warning."""
    entropy_fail_frac: float = 0.5
    """...below this fraction: failing (entropy collapse)."""
    uniform_warn: float = 0.5
    """Share of groups with accuracy 0 or 1 above which a rising share warns."""
    uniform_fail: float = 0.8
    """...above which, without dynamic sampling, it fails (most groups give no gradient)."""
    rounds_warn: float = 3.0
    """Dynamic-sampling rounds per step (recent mean) above which, when rising, it warns."""
    length_rise_frac: float = 0.25
    """Relative length growth over the second half of the run that counts as growth."""
    entropy_rise_frac: float = 0.10
    """Relative entropy growth that counts as rising."""
    accuracy_flat: float = 0.02
    """Accuracy change below which accuracy counts as flat."""
    truncation_warn: float = 0.10
    truncation_fail: float = 0.20
    mismatch_warn: float = 0.01
    """Mean |trainer - engine| log-prob gap per token: warning above this, ..."""
    mismatch_fail: float = 0.05
    """...failing above this."""
    grad_explode: float = 10.0
    """Gradient norm above this multiple of its early median: exploding."""
    skipped_fail_frac: float = 0.1
    """Share of optimizer steps skipped (non-finite) above which it fails."""

    def __post_init__(self) -> None:
        """Every threshold finite and in range, each warning level on the safe side of its
        failing level, so that a typo in ``--set`` cannot silently change the verdicts."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{f.name}: expected a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"{f.name}: must be >= 0, got {value}")
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window: must be an integer >= 1, got {self.window}")
        for name in _FRACTIONS:
            if getattr(self, name) > 1:
                raise ValueError(f"{name}: a fraction, must be <= 1, got {getattr(self, name)}")
        for lower, upper in _ORDERED:
            if getattr(self, lower) > getattr(self, upper):
                raise ValueError(
                    f"{lower} ({getattr(self, lower)}) must be <= {upper} ({getattr(self, upper)})"
                )


_FRACTIONS = (
    "entropy_warn_frac",
    "entropy_fail_frac",
    "uniform_warn",
    "uniform_fail",
    "truncation_warn",
    "truncation_fail",
    "skipped_fail_frac",
)
_ORDERED = (
    ("entropy_fail_frac", "entropy_warn_frac"),
    ("uniform_warn", "uniform_fail"),
    ("truncation_warn", "truncation_fail"),
    ("mismatch_warn", "mismatch_fail"),
)


@dataclass(frozen=True)
class Finding:
    rule: str
    title: str
    status: str
    start_step: float | None
    evidence: str
    knob: str


@dataclass(frozen=True)
class Rule:
    name: str
    title: str
    needs: tuple[str, ...]
    """Metrics without which the rule reports ``unknown``."""
    knob: str
    check: Callable[[Run, HealthConfig], Verdict]


# ---- series helpers ------------------------------------------------------------------------


def series(run: Run, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` where it is present and finite."""
    xs, ys = [], []
    for i, row in enumerate(run):
        v = row.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(float(row.get("step", i)))
            ys.append(float(v))
    return xs, ys


def _mean(v: Sequence[float]) -> float:
    return sum(v) / len(v) if v else math.nan


def _moving(ys: Sequence[float], w: int) -> list[float]:
    return [_mean(ys[max(0, i - w + 1) : i + 1]) for i in range(len(ys))]


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    mx, my = _mean(xs), _mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def _onset(xs: Sequence[float], ys: Sequence[float], w: int, bad: Callable[[float], bool]) -> float | None:
    """Where a condition on the moving mean started holding for good, corrected for the
    smoothing lag: the first raw point of the last window that already met it."""
    mv = _moving(ys, w)
    flags = [bad(m) for m in mv]
    if not flags or not flags[-1]:
        return None
    i = len(flags) - 1
    while i > 0 and flags[i - 1]:
        i -= 1
    for j in range(max(0, i - w + 1), i + 1):
        if all(bad(y) for y in ys[j : i + 1]):
            return xs[j]
    return xs[i]


def _uniform_share(run: Run) -> tuple[list[float], list[float]]:
    xs, ys = series(run, "rollout/groups_uniform")
    if xs:
        return xs, ys
    xs, a = series(run, "rollout/groups_all_correct")
    _, b = series(run, "rollout/groups_all_wrong")
    if len(a) != len(b):
        return [], []
    return xs, [p + q for p, q in zip(a, b)]


# ---- the rules ---------------------------------------------------------------------------------


def _entropy(run: Run, c: HealthConfig) -> Verdict:
    xs, ys = series(run, "actor/entropy")
    w = c.window
    start = _mean(ys[:w])
    if not start > 0 or len(ys) < 2 * w:
        return "unknown", None, f"needs >= {2 * w} steps of actor/entropy with a positive start"
    mv = _moving(ys, w)
    now = mv[-1]
    frac = now / start
    status = (
        "failing" if frac < c.entropy_fail_frac else "warning" if frac < c.entropy_warn_frac else "healthy"
    )
    threshold = c.entropy_fail_frac if status == "failing" else c.entropy_warn_frac
    since = _onset(xs, ys, w, lambda v: v < threshold * start) if status != "healthy" else None
    ev = f"entropy {start:.3f} -> {now:.3f} ({frac:.0%} of start)"
    _, up = series(run, "actor/upclip_old_prob")
    _, cf = series(run, "actor/clipfrac_upper")
    if cf and up:
        ev += f"; {_mean(cf):.2%} of tokens up-clipped, their old probability {_mean(up):.2f} on average"
    return status, since, ev


def _vanishing(run: Run, c: HealthConfig) -> Verdict:
    xs, ys = _uniform_share(run)
    rx, rounds = series(run, "sampling/rounds")
    _, under = series(run, "sampling/underfilled")
    w = c.window
    if len(ys) < 2 * w and len(rounds) < 2 * w:
        return "unknown", None, f"needs >= {2 * w} steps of group accuracy shares or sampling rounds"
    ds_active = bool(rounds) and max(rounds) > 1
    status, since, parts = "healthy", None, []
    if ys:
        head, now = _mean(ys[:w]), _mean(ys[-w:])
        parts.append(f"groups with accuracy 0 or 1: {head:.2f} -> {now:.2f}")
        rising = now > head + 0.1
        if not ds_active and now >= c.uniform_fail:
            status = "failing"
        elif not ds_active and now >= c.uniform_warn and rising:
            status = "warning"
        if status != "healthy":
            since = _onset(xs, ys, w, lambda v: v >= c.uniform_warn)
    if rounds:
        r_now = _mean(rounds[-w:])
        parts.append(f"dynamic-sampling rounds {_mean(rounds[:w]):.1f} -> {r_now:.1f}")
        if under and _mean(under[-w:]) > 0.5:
            status, parts = (
                "failing",
                [*parts, f"batch underfilled in {_mean(under[-w:]):.0%} of recent steps"],
            )
            since = since or _onset(rx, under, w, lambda v: v > 0.5)
        elif ds_active and r_now >= c.rounds_warn and _slope(rx[-2 * w :], rounds[-2 * w :]) > 0:
            if SEVERITY[status] < 1:
                status = "warning"
                since = _onset(rx, rounds, w, lambda v: v >= c.rounds_warn)
    return status, since, "; ".join(parts)


def _length(run: Run, c: HealthConfig) -> Verdict:
    xs, ln = series(run, "rollout/length_mean")
    _, ent = series(run, "actor/entropy")
    _, acc = series(run, "rollout/accuracy")
    w = c.window
    if len(ln) < 4 * w or len(ent) != len(ln):
        return "unknown", None, f"needs >= {4 * w} steps of length and entropy"
    half = len(ln) // 2
    l0, l1 = _mean(ln[half : half + w]), _mean(ln[-w:])
    e0, e1 = _mean(ent[half : half + w]), _mean(ent[-w:])
    a_change = (_mean(acc[-w:]) - _mean(acc[half : half + w])) if len(acc) >= 4 * w else math.nan
    l_rel, e_rel = (l1 - l0) / max(l0, 1e-9), (e1 - e0) / max(e0, 1e-9)
    ev = f"second half: length {l0:.1f} -> {l1:.1f} ({l_rel:+.0%}), entropy {e0:.3f} -> {e1:.3f} ({e_rel:+.0%})"
    if not math.isnan(a_change):
        ev += f", accuracy {a_change:+.3f}"
    flat = math.isnan(a_change) or a_change < c.accuracy_flat
    if l_rel > c.length_rise_frac and e_rel > c.entropy_rise_frac and flat:
        status = (
            "failing" if l_rel > 2 * c.length_rise_frac and e_rel > 2 * c.entropy_rise_frac else "warning"
        )
        return status, xs[half], ev
    return "healthy", None, ev


def _truncation(run: Run, c: HealthConfig) -> Verdict:
    xs, tr = series(run, "rollout/truncation_rate")
    ex, ent = series(run, "actor/entropy")
    w = c.window
    if len(tr) < w:
        return "unknown", None, f"needs >= {w} steps of rollout/truncation_rate"
    now = _mean(tr[-w:])
    dropping = len(ent) >= 2 * w and _slope(ex[-2 * w :], ent[-2 * w :]) < 0
    ev = f"truncation rate {now:.1%} over the last {w} steps" + (", entropy dropping" if dropping else "")
    if now >= c.truncation_fail and dropping:
        status = "failing"
    elif now >= c.truncation_warn:
        status = "warning"
    else:
        return "healthy", None, ev
    return status, _onset(xs, tr, w, lambda v: v >= c.truncation_warn), ev


def _mismatch(run: Run, c: HealthConfig) -> Verdict:
    xs, gap = series(run, "mismatch/logp_gap")
    w = c.window
    if not gap:
        return "unknown", None, "no mismatch/logp_gap logged"
    now = _mean(gap[-w:])
    ev = f"mean |trainer - engine| log-prob gap {now:.2e} per token (max logged {max(gap):.2e})"
    status = "failing" if now > c.mismatch_fail else "warning" if now > c.mismatch_warn else "healthy"
    since = _onset(xs, gap, w, lambda v: v > c.mismatch_warn) if status != "healthy" else None
    return status, since, ev


def _gradients(run: Run, c: HealthConfig) -> Verdict:
    xs, gn = series(run, "actor/grad_norm")
    sx, skipped = series(run, "actor/skipped_steps")
    _, steps = series(run, "actor/optimizer_steps")
    if not gn and not skipped:
        return "unknown", None, "no actor/grad_norm or actor/skipped_steps logged"
    status, since, parts = "healthy", None, []
    total_skipped = sum(skipped)
    if total_skipped:
        share = total_skipped / max(1.0, total_skipped + sum(steps))
        parts.append(
            f"{total_skipped:.0f} optimizer step(s) skipped for non-finite loss/gradient ({share:.1%})"
        )
        status = "failing" if share > c.skipped_fail_frac else "warning"
        since = next(x for x, s in zip(sx, skipped) if s > 0)
    if len(gn) >= 2 * c.window:
        early = sorted(gn[: len(gn) // 2])[len(gn) // 4]
        peak = max(gn[len(gn) // 2 :])
        parts.append(f"grad norm early median {early:.3g}, recent max {peak:.3g}")
        if early > 0 and peak > c.grad_explode * early:
            status = (
                "failing"
                if peak > 10 * c.grad_explode * early
                else max(status, "warning", key=SEVERITY.__getitem__)
            )
            since = (
                since if since is not None else next(x for x, g in zip(xs, gn) if g > c.grad_explode * early)
            )
    return status, since, "; ".join(parts) or "gradients finite and stable"


RULES: tuple[Rule, ...] = (
    Rule(
        "entropy_collapse",
        "Entropy collapse",
        ("actor/entropy",),
        "Clip-Higher: raise algo.eps_high (DAPO uses 0.28 with eps_low 0.2)",
        _entropy,
    ),
    Rule(
        "vanishing_signal",
        "Vanishing signal (zero-gradient groups)",
        (),
        "Dynamic sampling: algo.dynamic_sampling=true (already on: filter the data by pass rate or raise "
        "algo.max_gen_rounds)",
        _vanishing,
    ),
    Rule(
        "length_growth",
        "Unhealthy length growth",
        ("rollout/length_mean", "actor/entropy"),
        "Token-level loss: algo.loss_agg=token-mean",
        _length,
    ),
    Rule(
        "truncation_noise",
        "Truncation noise",
        ("rollout/truncation_rate",),
        "Overlong filtering and soft punishment: algo.overlong_filter=true, algo.soft_overlong=true "
        "(expected_len below the lengths that get cut)",
        _truncation,
    ),
    Rule(
        "rollout_mismatch",
        "Rollout/trainer mismatch",
        ("mismatch/logp_gap",),
        "Truncated importance sampling: algo.tis_cap=2.0; check engine dtype and weight sync",
        _mismatch,
    ),
    Rule(
        "gradients",
        "Non-finite or exploding gradients",
        (),
        "Lower train.lr, keep algo.max_grad_norm=1.0; look for bad data at the step it started",
        _gradients,
    ),
)


def diagnose(run: Run, config: HealthConfig = HealthConfig(), rules: Sequence[Rule] = RULES) -> list[Finding]:
    """Apply every rule to ``run`` (sorted by step here)."""
    run = sorted(run, key=lambda r: r.get("step", 0))
    out = []
    for rule in rules:
        missing = [m for m in rule.needs if not series(run, m)[1]]
        if missing:
            out.append(
                Finding(
                    rule.name, rule.title, "unknown", None, f"not logged: {', '.join(missing)}", rule.knob
                )
            )
            continue
        status, since, evidence = rule.check(run, config)
        out.append(Finding(rule.name, rule.title, status, since, evidence, rule.knob))
    return out


def worst(findings: Sequence[Finding]) -> str:
    return max((f.status for f in findings), key=lambda s: SEVERITY[s], default="unknown")


# ---- reference curves -------------------------------------------------------------------------------


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


_FIG7 = "DAPO paper, Figure 7 (Qwen2.5-32B DAPO run), as described in shared/seeds: shape only, +-15% band"


def _band(metric: str, start: float, end: float, note: str) -> ReferenceCurve:
    mids = [start + (end - start) * p for p in (0.0, 0.25, 0.5, 0.75, 1.0)]
    return ReferenceCurve(
        metric,
        _FIG7,
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
    "rollout/reward_mean": _band("rollout/reward_mean", -0.6, 0.2, "reward rises, ~-0.6 -> ~+0.2"),
    "actor/entropy": _band("actor/entropy", 0.63, 0.70, "entropy stays in a narrow band, slowly rising"),
    "actor/mean_prob": _band("actor/mean_prob", 0.82, 0.76, "mean probability of sampled tokens drifts down"),
}
"""The paper's monitoring curves as reference shapes (for LLM runs, not toy targets)."""


def references_from_runs(
    runs: Sequence[Run], metrics: Sequence[str], source: str, points: int = 21
) -> dict[str, ReferenceCurve]:
    """Bands (min..max over runs, on a common progress grid) from healthy reference runs."""
    out = {}
    grid = [i / (points - 1) for i in range(points)]
    for metric in metrics:
        per_run = []
        for run in runs:
            _, ys = series(run, metric)
            if len(ys) >= 2:
                per_run.append([ys[round(p * (len(ys) - 1))] for p in grid])
        if per_run:
            low = tuple(min(col) for col in zip(*per_run))
            high = tuple(max(col) for col in zip(*per_run))
            out[metric] = ReferenceCurve(metric, source, tuple(grid), low, high)
    return out


__all__ = [
    "PAPER_REFERENCES",
    "RULES",
    "Finding",
    "HealthConfig",
    "ReferenceCurve",
    "Rule",
    "diagnose",
    "references_from_runs",
    "series",
    "worst",
]
