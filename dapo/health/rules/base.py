"""What a rule is and what it returns; the helpers rules share."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..config import HealthConfig
from ..noise import estimate, fall_from_best
from ..series import Run, Series, logged, mean, series, stderr

Knobs = Mapping[str, float | str | bool]
"""The run's own settings where they are known (``eps_high``, ``dynamic_sampling``, ``lr``,
...: :data:`KNOBS`); advice checks them before it recommends."""

KNOBS = {
    "policy_loss": str,
    "eps_low": float,
    "eps_high": float,
    "dynamic_sampling": bool,
    "loss_agg": str,
    "overlong_filter": bool,
    "soft_overlong": bool,
    "tis_cap": float,
    "lr": float,
    "max_grad_norm": float,
    "entropy_coeff": float,
    "kl_coef": float,
}
"""Knob names :func:`dapo.health.diagnose` understands, with their types."""

SEVERITY = {"unknown": -1, "healthy": 0, "warning": 1, "failing": 2}
NOT_LOGGED = "not logged"
TOO_FEW_STEPS = "too few steps"


@dataclass(frozen=True)
class Judgement:
    """A rule's verdict on one run."""

    status: str
    """healthy, warning, failing or unknown."""
    since: float | None = None
    """The training step where the problem started (None when healthy or unknown)."""
    evidence: str = ""
    """The numbers the verdict rests on."""
    advice: str | None = None
    """What to change, when the run's own knobs or metrics call for something other than the
    rule's default knob (None: the default)."""
    reason: str = ""
    """Why the rule could not judge: ``not logged`` or ``too few steps`` (unknown only)."""
    needs_steps: float | None = None
    """For ``too few steps``: the steps (first to last logged, at the log's interval) the rule
    needs to judge."""
    fatal: bool = False
    """A failing state the run cannot come back from whatever its outcome does (non-finite
    values; no gradient anywhere for a sustained stretch below the outcome's ceiling; entropy at
    about 0 below it): failing on its own. Any other failing of a mechanism rule stands only
    when the outcome fails too (:func:`dapo.health.verdict.diagnose`)."""


def unknown(reason: str, evidence: str) -> Judgement:
    return Judgement("unknown", evidence=evidence, reason=reason)


def not_logged(*names: str) -> Judgement:
    return unknown(NOT_LOGGED, "not logged: " + " or ".join(names))


def too_few(s: Series, c: HealthConfig, windows: float, what: str) -> Judgement:
    plural = "window" if windows == 1 else "windows"
    return Judgement(
        "unknown",
        evidence=f"{what}: {len(s)} row(s) over {s.span:g} step(s); needs {windows:g} {plural} of "
        f">= {s.window(c) if len(s) else c.min_points:g} steps with >= {c.min_points} rows each",
        reason=TOO_FEW_STEPS,
        needs_steps=steps_needed(s.interval if len(s) > 1 else 1.0, c, windows),
    )


def steps_needed(interval: float, c: HealthConfig, windows: float) -> float:
    """The fewest steps a series logged every ``interval`` steps must span to cover ``windows``
    windows (:meth:`Series.covers`: the window is a share of the span, so the rows decide)."""
    return math.ceil(windows * c.min_points) * interval


ORDERS = 10.0
"""A first window whose values span this factor or more (an order of magnitude) holds a
change, not a level: the start is then the first row, and the move is evidence of its own
(issue 70: entropy 0.155 -> 4.6 within the first window read as a start of 4.98)."""


def start_and_now(run: Run, key: str, c: HealthConfig) -> tuple[Series, float, float, str] | Judgement:
    """``key``'s series with its start (the mean of the first window, or its first row when
    the first window spans an order of magnitude: :data:`ORDERS`), the mean of its last window,
    and a note on the start (empty unless it is the first row); or the verdict when it cannot
    be judged (not logged, too few steps, a start that is not positive)."""
    s = series(run, key)
    if not s:
        return not_logged(key)
    if not s.covers(c, 2):
        return too_few(s, c, 2, key)
    head = s.head(c)
    start, note = mean(head), ""
    lo, hi = min(head), max(head)
    if lo > 0 and hi >= ORDERS * lo:
        start = head[0]
        note = (
            f"; {key} moves {lo:.3g} .. {hi:.3g} within its first window: the start is its first row, "
            f"{head[0]:.3g} at step {s.steps[0]:g}"
        )
    if not start > 0:
        return Judgement("healthy", evidence=f"{key} starts at {start:.3g}")
    return s, start, mean(s.tail(c)), note


def outcome(run: Run) -> tuple[str, Series]:
    """The run's measure of success: accuracy where logged, else the mean reward."""
    acc = series(run, "rollout/accuracy")
    return ("accuracy", acc) if acc else ("reward", series(run, "rollout/reward_mean"))


OUTCOMES = (
    ("accuracy", "rollout/accuracy"),
    ("reward", "rollout/reward_mean"),
    ("validation score", "eval/score"),
)
"""Every column that measures success (higher is better), with the name the evidence uses."""


def outcomes(run: Run) -> list[tuple[str, Series]]:
    """Every outcome the run logs (:data:`OUTCOMES`), each under its own name."""
    return [(name, s) for name, key in OUTCOMES if (s := series(run, key))]


def row_noise(s: Series) -> float:
    """The per-row noise of ``s`` around its own course: the median absolute difference of
    consecutive rows / 0.954 (for independent normal noise of sd sigma, that median is
    0.954 sigma). A trend or a single jump moves few differences, so neither inflates it."""
    d = sorted(abs(b - a) for a, b in zip(s.values, s.values[1:]))
    return d[len(d) // 2] / 0.954 if d else 0.0


def saturation(run: Run, name: str, level: float) -> float | None:
    """Where ``level`` of the outcome lies in its possible range (0: the bottom, 1: the top):
    accuracy is in [0, 1]; a reward between the smallest and largest reward the log holds
    (verl's ``critic/score/min``/``max``). None when the range is not known."""
    if name == "accuracy":
        return level
    lo, hi = series(run, "rollout/reward_min"), series(run, "rollout/reward_max")
    if not (lo and hi) or max(hi.values) <= min(lo.values):
        return None
    return (level - min(lo.values)) / (max(hi.values) - min(lo.values))


def progress(run: Run, c: HealthConfig, since: float) -> tuple[str, str]:
    """How learning went from step ``since`` on (a problem's onset), and the evidence:
    ``rising`` (the outcome rose significantly over the later half of that part), ``saturated``
    (flat there at ``saturated_frac`` of its range or above, or the validation score at its best),
    ``stalled`` (flat or falling), or ``unknown`` (no outcome, or too few rows)."""
    name, out = outcome(run)
    after = out.after(since)
    if not after.covers(c, 2):
        return "unknown", ""
    later = after.after(after.steps[0] + after.span / 2) if after.covers(c, 4) else after
    g, noise = gain(later)
    now = mean(out.tail(c))
    ev = f"{name} from step {later.steps[0]:g}: {g:+.3g} (+-{noise:.2g}), now {now:.3g}"
    if g > 2 * noise:
        return "rising", ev + ", still rising"
    top = saturation(run, name, now)
    if top is not None and top >= c.saturated_frac:
        return "saturated", ev + f", at {top:.0%} of its range"
    val = series(run, "eval/score").after(since)
    if val_at_best(val, c):
        return "saturated", ev + f"; validation score {val.values[-1]:.3g}, at its best"
    return "stalled", ev + ", no longer rising"


def uniform_share(run: Run) -> Series:
    """Share of groups with accuracy 0 or 1 (zero reward spread): logged directly, or
    all-correct + all-wrong."""
    s = series(run, "rollout/groups_uniform")
    if s:
        return s
    a, b = series(run, "rollout/groups_all_correct"), series(run, "rollout/groups_all_wrong")
    both = dict(zip(a.steps, a.values))
    pairs = [(x, both[x] + v) for x, v in zip(b.steps, b.values) if x in both]
    return Series([p[0] for p in pairs], [p[1] for p in pairs])


def at_ceiling(run: Run, c: HealthConfig) -> bool | None:
    """Whether the outcome's last window is at its ceiling (``saturated_frac`` of its range or
    above). The range is that of :func:`saturation` (accuracy, or the logged reward bounds); a
    reward that never leaves [0, 1] is read as a pass rate (the stated assumption of a 0/1
    grader). None when the range is not known."""
    name, out = outcome(run)
    if not out:
        return None
    now = mean(out.tail(c))
    top = saturation(run, name, now)
    if top is None and min(out.values) >= 0 and max(out.values) <= 1:
        top = now
    return None if top is None else top >= c.saturated_frac


def saturating(run: Run, c: HealthConfig) -> bool | None:
    """Whether groups that all score alike are all *right*: the outcome at its ceiling
    (:func:`at_ceiling`), or the share of such groups moving with the outcome (correlation
    above 0.5 over the rows both are logged: more uniform groups when the reward is higher
    means all-right groups; all-wrong ones move against it). None when neither tells."""
    ceiling = at_ceiling(run, c)
    if ceiling:
        return True
    _, out = outcome(run)
    share = uniform_share(run)
    pairs = dict(zip(share.steps, share.values))
    xy = [(v, pairs[x]) for x, v in zip(out.steps, out.values) if x in pairs]
    if len(xy) >= 2 * c.min_points and _correlation([a for a, _ in xy], [b for _, b in xy]) > 0.5:
        return True
    return ceiling


def _correlation(x: Sequence[float], y: Sequence[float]) -> float:
    mx, my = mean(x), mean(y)
    sxy = math.fsum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = math.fsum((a - mx) ** 2 for a in x), math.fsum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0


SATURATED_ADVICE = (
    "saturated: most groups are all right, so they carry no gradient; dynamic sampling "
    "(algo.dynamic_sampling=true) keeps the batch full of groups that teach, or use harder prompts "
    "(filter the data by pass rate)"
)


def no_gradient(run: Run, c: HealthConfig, zeros: Series, what: str) -> Judgement | None:
    """A judgement on rows where ``zeros`` (a gradient norm, or advantages) is exactly 0, or None
    when fewer than half the rows of its last window are. At the outcome's ceiling: saturation,
    a warning with dynamic sampling as the knob. Every row of the last two windows 0 (a quarter
    of the run, no gradient at all), the outcome logged, not rising and known to be below its
    ceiling: an unrecoverable state (failing whatever else). Otherwise a warning."""
    if not zeros.covers(c, 2) or mean([float(v == 0) for v in zeros.tail(c)]) <= 0.5:
        return None
    at = [x for x, v in zip(zeros.steps, zeros.values) if v == 0]
    ev = f"{what} exactly 0 in {len(at)} of {len(zeros)} rows"
    ceiling = at_ceiling(run, c)
    if ceiling:
        return Judgement(
            "warning", at[0], ev + "; the outcome is at its ceiling: saturated", SATURATED_ADVICE
        )
    recent = zeros.recent(c)
    if (
        ceiling is False
        and len(recent) >= 2 * c.min_points
        and all(v == 0 for v in recent.values)
        and not learns(run, c)
    ):
        return Judgement(
            "failing",
            at[0],
            ev + "; none in the last quarter of the run, the outcome below its ceiling",
            fatal=True,
        )
    return Judgement("warning", at[0], ev)


def val_at_best(val: Series, c: HealthConfig) -> bool:
    """Whether a validation score's last two evaluations are at its best: below the best before
    them by no more than a flat run of the score's own noise falls by chance at ``alpha_warn``
    (what the validation rule calls a fall). False with fewer than three evaluations or no
    noise to judge by."""
    fall = fall_from_best(val.values, c.eval_items)
    return fall is not None and not fall.beyond(c.alpha_warn, len(val) - 2)


def effect(s: Series, c: HealthConfig, *, smoothed: bool = True) -> float:
    """The smallest change of ``s`` that counts as one: ``min_gain_frac`` of the spread (5th to
    95th percentile) of its smoothed curve (the moving mean over a window) and ``min_gain_rel``
    of the values' magnitude, so that a significant but negligible drift (0.2056 -> 0.2064) is
    no rise. The smoothed curve, not the rows: with a few responses a step the rows scatter
    over the whole reward range, and a quarter of that spread hid real rises (reasoning-rl
    train5: 0.70 -> 1.23 on a 0-2 reward); the curve's spread is the run's own course plus the
    noise left after smoothing. ``smoothed=False``: the rows' spread, the scale on which the
    not-learning rule shows that a rise is *absent* (its upper bound below a quarter of the
    rows' scatter), which a flat run's small smoothed spread could not."""
    if not s.values:
        return 0.0
    v = sorted(s.moving(c) if smoothed else s.values)
    spread = v[int(0.95 * (len(v) - 1))] - v[int(0.05 * (len(v) - 1))]
    return max(c.min_gain_frac * spread, c.min_gain_rel * max(abs(x) for x in s.values))


def learns(run: Run, c: HealthConfig) -> bool:
    """Whether the outcome rose over the log: first to last quarter, by more than twice its
    noise and by a change that counts (:func:`effect`)."""
    _, out = outcome(run)
    if not out.covers(c, 2):
        return False
    g, noise = gain(out)
    return g > 2 * noise and g >= effect(out, c)


def spike_status(
    run: Run,
    s: Series,
    spikes: Sequence[float],
    c: HealthConfig,
    is_spike: Callable[[float], bool],
    blowup: bool = False,
) -> tuple[str, str]:
    """The severity of spikes at steps ``spikes`` of ``s`` (a blow-up, or more than 5% of the
    rows and two at least: failing; two or more: warning; one: evidence), and what to add to
    the evidence. Spikes a run keeps coming back from (the last window's median is no spike)
    while it keeps learning (:func:`learns`) are judged by how often they recur, not by their
    height: the clip absorbed them. Recurring (over 5% of the rows): a warning; a few, a
    blow-up among them, need nothing done: healthy, with the spikes in the evidence."""
    if not spikes:
        return "healthy", ""
    recurring = len(spikes) > max(1.0, 0.05 * len(s))
    calm = not is_spike(statistics.median(s.tail(c))) and not is_spike(
        statistics.median(s.values[-c.min_points :])
    )
    if calm and learns(run, c):
        why = "; transient (the last window's median is normal) and the run kept learning"
        return ("warning", why) if recurring else ("healthy", ", isolated" + why)
    if blowup or recurring:
        return "failing", ""
    return ("warning", "") if len(spikes) > 1 else ("healthy", ", isolated")


def gain(s: Series) -> tuple[float, float]:
    """(last quarter's mean - first quarter's, the standard error of that difference). The
    error is that of the series' own noise around its course, autocorrelation folded in
    (:func:`~dapo.health.noise.estimate`); below five rows, or a quarter of one row, the
    quarters' own spread (the whole series' for one row: a difference of two single rows is
    never significant by construction)."""
    q = max(1, len(s) // 4)
    first, last = s.values[:q], s.values[-q:]
    g = mean(last) - mean(first)
    noise = estimate(s.values)
    if noise is not None and noise.sd > 0:
        return g, noise.se_diff(q, q)
    if q < 2:
        sd = statistics.stdev(s.values) if len(s) > 1 else 0.0
        return g, sd * (2 / q) ** 0.5
    return g, (stderr(first) ** 2 + stderr(last) ** 2) ** 0.5


def worse(status: str, than: str) -> str:
    """The more severe of two statuses."""
    return status if SEVERITY[status] >= SEVERITY[than] else than


def missing(run: Run, *names: str) -> list[str]:
    return [n for n in names if not logged(run, n)]


@dataclass(frozen=True)
class Rule:
    name: str
    title: str
    knob: str
    """The DAPO knob that addresses the failure (the default advice)."""
    check: Callable[[Run, HealthConfig, Knobs], Judgement]
