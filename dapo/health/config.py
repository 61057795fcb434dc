"""Thresholds of the health rules, checked on construction (``dapo diagnose --set``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class HealthConfig:
    """Thresholds of the rules. Fractions are of the metric's value at the start of the run;
    windows are shares of the run's span in training steps (the ``step`` of the log), never
    fixed counts of steps or rows."""

    window_frac: float = 0.125
    """The share of a series' span (its first to its last logged step) averaged for "start",
    "now" and "stays" judgements. An eighth: the trend rules compare the first and the last
    window with at least six between them, and "now" is the run's last eighth (a fixed count
    of steps made "now" 55% of a 40-row log, or 1% of a 1,000-step one)."""
    min_points: int = 3
    """Logged rows a window must hold: with sparse logging (every k steps) a window widens to
    ``min_points * k`` steps, so that one row is never a "window"."""
    min_judged_frac: float = 0.5
    """A run is called healthy when more than this share of the rules could judge it, or when
    the rules on learning (not learning, reward collapse) and at least one on stability
    (gradients, KL, loss) could; otherwise it is inconclusive."""
    entropy_warn_frac: float = 0.75
    """Entropy below this fraction of its start (and staying there): warning."""
    entropy_fail_frac: float = 0.5
    """...below this fraction: failing (entropy collapse)."""
    entropy_dead_frac: float = 0.05
    """Entropy at or below this share of its start is at about 0: the policy repeats its own
    samples, every group scores alike and nothing is left to learn from. Below the outcome's
    ceiling and not rising, an unrecoverable state (failing whatever else). A convention (a
    twentieth, i.e. 3 nats below the start), not fitted to any log."""
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
    drift_warn: float = 0.005
    """Off-policy drift: the k3 KL between the engine's and the trainer's policy on the sampled
    tokens (nats per token, ``mismatch/k3_kl``; verl ``rollout_corr/k3_kl``) over the last
    window at or above this, having grown ``drift_growth``-fold from its first window:
    warning (a bf16 engine against an fp32 trainer sits near 1e-4 to 1e-3)..."""
    drift_fail: float = 0.02
    """...failing at or above this."""
    drift_growth: float = 4.0
    """The growth (last window's median over the first window's, the first floored at
    ``drift_floor``) that makes a mismatch "rising" rather than a constant offset."""
    drift_floor: float = 1e-4
    """The smallest first-window level the growth is measured against."""
    kl_blowup: float = 10.0
    """A KL row above this multiple of the KL's level at the start of the log (its first
    window's median, floored at ``kl_floor``) and above the warning ceiling is a spike: two or
    more, a warning; in more than 5% of the rows, failing (one alone is evidence)."""
    kl_floor: float = 1e-3
    """The smallest KL level a spike is measured against (a KL that starts at 0 does not make
    every later value a spike)."""
    kl_ref_warn: float = 0.5
    """KL to the reference policy (nats per token, any estimator: k1, k3/low_var_kl) at or above
    this over the last window: warning..."""
    kl_ref_fail: float = 2.0
    """...failing. Healthy GRPO/PPO runs stay below ~0.15 (calibration logs)."""
    kl_ppo_warn: float = 0.05
    """KL between the old and the updated policy of one step (PPO KL, verl ``ppo_kl``) at or
    above this over the last window: warning..."""
    kl_ppo_fail: float = 0.5
    """...failing. Healthy runs stay below ~0.005 (calibration logs)."""
    kl_negative: float = 0.05
    """A KL (either kind) whose last window's median is below minus this is no KL: a warning (an
    estimator with its sign flipped, a log-prob difference logged as a KL). A batch mean of the
    k1 estimator dips below 0 by noise, by far less than this; k3 never does."""
    reward_drop_frac: float = 0.5
    """Reward collapse: the outcome (accuracy, else reward) now below its peak by this share of
    what it had gained from its start to the peak (and significantly): warning; back at or
    below its start: failing."""
    saturated_frac: float = 0.9
    """The outcome at this share of its possible range (accuracy 0..1; the reward between the
    smallest and largest reward logged) or above is saturated: falling entropy there is a
    converged policy, not a collapse."""
    loss_spike: float = 20.0
    """A policy-loss row farther than this many robust deviations (1.4826 x the median absolute
    deviation) from the loss's median, and over 10x its median magnitude, is a spike."""
    loss_floor: float = 1.0
    """...and larger in magnitude than this."""
    eval_items: int = 0
    """Items in the evaluation set (``dapo diagnose --eval-items``; 0: not known). Known, a
    validation score in [0, 1] has binomial noise on that many items; unknown, its noise is
    estimated from the evaluations themselves (five at least)."""
    alpha_warn: float = 0.05
    """The false-alarm rate of one level comparison that warns: a fall from a best, or a level
    beyond a band, as large as a flat run of the metric's own noise shows this rarely."""
    alpha_fail: float = 0.01
    """...of one that fails."""
    grad_explode: float = 10.0
    """Gradient norm above this multiple of the run's robust level (median of the non-zero
    norms): a spike (one alone is evidence, two a warning); above ``10 * grad_explode``: failing."""
    min_gain_frac: float = 0.25
    """A rise of the outcome counts only if it is at least this share of the spread of its values
    (5th to 95th percentile) as well as larger than its noise."""
    min_gain_rel: float = 0.01
    """...and at least this share of the outcome's magnitude (its largest absolute value)."""
    grad_zero_rows: int = 3
    """This many consecutive rows of a gradient norm of exactly 0: no gradient (warning);
    half the rows or more: failing."""
    zero_loss_rows: int = 10
    """This many consecutive rows of a policy loss of exactly 0, with nothing else in the log
    showing a gradient (no grad norm, reward spread within groups or advantage above 0 in those
    rows): no learning signal (failing; a warning while the outcome still rises, since GRPO's
    loss also reads 0 at each batch's first update)."""
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
        if not isinstance(self.eval_items, int):
            raise ValueError(f"eval_items: must be an integer >= 0 (0: not known), got {self.eval_items}")
        for name in ("min_points", "grad_zero_rows", "zero_loss_rows"):
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
    "window_frac",
    "min_judged_frac",
    "entropy_warn_frac",
    "entropy_fail_frac",
    "entropy_dead_frac",
    "uniform_warn",
    "uniform_fail",
    "floor_frac",
    "truncation_warn",
    "truncation_fail",
    "skipped_fail_frac",
    "reward_drop_frac",
    "saturated_frac",
    "alpha_warn",
    "alpha_fail",
    "min_gain_frac",
    "min_gain_rel",
)
_MULTIPLES = (
    "entropy_explode_warn",
    "entropy_explode_fail",
    "kl_blowup",
    "grad_explode",
    "loss_spike",
    "drift_growth",
)
_ORDERED = (
    ("entropy_dead_frac", "entropy_fail_frac"),
    ("entropy_fail_frac", "entropy_warn_frac"),
    ("entropy_explode_warn", "entropy_explode_fail"),
    ("uniform_warn", "uniform_fail"),
    ("truncation_warn", "truncation_fail"),
    ("mismatch_warn", "mismatch_fail"),
    ("drift_warn", "drift_fail"),
    ("kl_ref_warn", "kl_ref_fail"),
    ("kl_ppo_warn", "kl_ppo_fail"),
    ("alpha_fail", "alpha_warn"),
)
