"""Thresholds of the health rules, checked on construction (``dapo diagnose --set``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class HealthConfig:
    """Thresholds of the rules. Fractions are of the metric's value at the start of the run;
    windows are in training steps (the ``step`` of the log), never in log rows."""

    window: int = 10
    """Training steps averaged for "start", "now" and "stays" judgements."""
    min_points: int = 3
    """Logged rows a window must hold: with sparse logging (every k steps) a window widens to
    ``min_points * k`` steps, so that one row is never a "window"."""
    min_judged_frac: float = 0.5
    """A run is called healthy only if more than this share of the rules could be judged;
    otherwise it is inconclusive."""
    entropy_warn_frac: float = 0.75
    """Entropy below this fraction of its start (and staying there): warning."""
    entropy_fail_frac: float = 0.5
    """...below this fraction: failing (entropy collapse)."""
    entropy_explode_warn: float = 1.5
    """Entropy above this multiple of its start and still rising: warning (entropy explosion)."""
    entropy_explode_fail: float = 2.0
    """...above this multiple: failing."""
    uniform_warn: float = 0.5
    """Share of groups with accuracy 0 or 1 above which a rising share warns."""
    uniform_fail: float = 0.8
    """...above which, without dynamic sampling, it fails (most groups give no gradient)."""
    rounds_warn: float = 3.0
    """Dynamic-sampling rounds per step (recent mean) above which, when rising, it warns."""
    floor_frac: float = 0.02
    """Accuracy at or below this (or at least ``1 - floor_frac`` of the groups all wrong) is the
    floor; at or above ``1 - floor_frac`` the ceiling (not learning)."""
    length_rise_frac: float = 0.25
    """Relative length growth over the second half of the run that counts as growth."""
    entropy_rise_frac: float = 0.10
    """Relative entropy growth that counts as rising."""
    accuracy_flat: float = 0.02
    """Accuracy change below which accuracy counts as flat."""
    truncation_warn: float = 0.10
    """Share of responses cut at the generation ceiling (recent window): warning..."""
    truncation_fail: float = 0.20
    """...failing, whatever else is logged."""
    mismatch_warn: float = 0.01
    """Mean |trainer - engine| log-prob gap per token: warning above this, ..."""
    mismatch_fail: float = 0.05
    """...failing above this."""
    kl_blowup: float = 10.0
    """KL (PPO or reference) now above this multiple of its robust level (the run's median):
    warning; any value above ``kl_blowup ** 2`` times it: failing."""
    kl_floor: float = 1e-3
    """The smallest KL level a blow-up is measured against (a KL that starts at 0 does not
    make every later value a blow-up)."""
    grad_explode: float = 10.0
    """Gradient norm above this multiple of the run's robust level (median of the non-zero
    norms): a spike (one alone is evidence, two a warning); above ``10 * grad_explode``: failing."""
    grad_zero_rows: int = 3
    """This many consecutive rows of a gradient norm of exactly 0: no gradient (warning);
    half the rows or more: failing."""
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
        for name in ("window", "min_points", "grad_zero_rows"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {getattr(self, name)}")
        for name in _FRACTIONS:
            if getattr(self, name) > 1:
                raise ValueError(f"{name}: a fraction, must be <= 1, got {getattr(self, name)}")
        for name in _MULTIPLES:
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: a multiple, must be >= 1, got {getattr(self, name)}")
        for lower, upper in _ORDERED:
            if getattr(self, lower) > getattr(self, upper):
                raise ValueError(
                    f"{lower} ({getattr(self, lower)}) must be <= {upper} ({getattr(self, upper)})"
                )


_FRACTIONS = (
    "min_judged_frac",
    "entropy_warn_frac",
    "entropy_fail_frac",
    "uniform_warn",
    "uniform_fail",
    "floor_frac",
    "truncation_warn",
    "truncation_fail",
    "skipped_fail_frac",
)
_MULTIPLES = ("entropy_explode_warn", "entropy_explode_fail", "kl_blowup", "grad_explode")
_ORDERED = (
    ("entropy_fail_frac", "entropy_warn_frac"),
    ("entropy_explode_warn", "entropy_explode_fail"),
    ("uniform_warn", "uniform_fail"),
    ("truncation_warn", "truncation_fail"),
    ("mismatch_warn", "mismatch_fail"),
)
