"""What a rule is and what it returns; the helpers rules share."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..config import HealthConfig
from ..series import Run, Series, logged, mean, series, stderr

Knobs = Mapping[str, float | str | bool]
"""The run's own settings where they are known (``eps_high``, ``dynamic_sampling``, ``lr``,
...: :data:`KNOBS`); advice checks them before it recommends."""

KNOBS = {
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


def unknown(reason: str, evidence: str) -> Judgement:
    return Judgement("unknown", evidence=evidence, reason=reason)


def not_logged(*names: str) -> Judgement:
    return unknown(NOT_LOGGED, "not logged: " + " or ".join(names))


def too_few(s: Series, c: HealthConfig, windows: float, what: str) -> Judgement:
    return unknown(
        TOO_FEW_STEPS,
        f"{what}: {len(s)} row(s) over {s.span:g} step(s); needs {windows:g} windows of "
        f">= {s.window(c) if len(s) else c.window:g} steps with >= {c.min_points} rows each",
    )


def start_and_now(run: Run, key: str, c: HealthConfig) -> tuple[Series, float, float] | Judgement:
    """``key``'s series with the means of its first and last window, or the verdict when it
    cannot be judged (not logged, too few steps, a start that is not positive)."""
    s = series(run, key)
    if not s:
        return not_logged(key)
    if not s.covers(c, 2):
        return too_few(s, c, 2, key)
    start = mean(s.head(c))
    if not start > 0:
        return Judgement("healthy", evidence=f"{key} starts at {start:.3g}")
    return s, start, mean(s.tail(c))


def outcome(run: Run) -> tuple[str, Series]:
    """The run's measure of success: accuracy where logged, else the mean reward."""
    acc = series(run, "rollout/accuracy")
    return ("accuracy", acc) if acc else ("reward", series(run, "rollout/reward_mean"))


def gain(s: Series) -> tuple[float, float]:
    """(last quarter's mean - first quarter's, the standard error of that difference)."""
    q = max(1, len(s) // 4)
    first, last = s.values[:q], s.values[-q:]
    return mean(last) - mean(first), (stderr(first) ** 2 + stderr(last) ** 2) ** 0.5


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
