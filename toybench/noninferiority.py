"""Tolerated staleness as one test procedure, planned and applied at the same error rate.

A configuration (a base loss, partial rollouts or not, a correction) is run at each staleness k
of a ladder (1, 2, 4, 8) and at k = 0, on paired seeds, in two disjoint seed blocks. Per seed,
per metric m of :data:`METRICS` (accuracy and entropy at the horizon, both "lower is worse"),
``d = value at k - value at k = 0``. Each metric has a non-inferiority margin ``delta_m``
(:data:`MARGIN_SHARE` of DAPO's own figure at k = 0, fixed from a pilot before the table's
seeds are run).

**The procedure** (:func:`ladder`):

* at each k, the hypothesis "k costs more than the margin" (``mean d <= -delta_m``) is rejected
  when the one-sided ``1 - alpha`` lower bound of the paired mean (Student's t) lies above
  ``-delta_m``; k is **shown** when that holds on every metric and on both blocks (an
  intersection-union test: its level is ``alpha``, not a Bonferroni share);
* the ladder is walked in order, 1, 2, 4, 8, stopping at the first k not shown (fixed-sequence
  testing: the family-wise error over the ladder stays ``alpha`` with no correction, because a
  k is tested only once every smaller one was shown). **Tolerated up to** the last k shown;
* a k is **harmful** when some metric's one-sided ``1 - alpha`` *upper* bound lies below
  ``-delta_m`` on both blocks: a loss larger than the margin, shown twice (the mirror of
  non-inferiority, at the same level). A significant loss smaller than the margin is not harm:
  the margin says what is too small to matter. Harm is looked for at every k of the ladder; a
  false "harmful" per look has probability at most ``alpha`` squared on independent blocks.
  A k can be neither shown nor harmful: **cannot tell**.

Its power is that of the very procedure, by simulation (:func:`simulate`): correlated paired
differences (the ladder's k share the k = 0 baseline, so their differences correlate; 0.5 when
the arms' own variances are equal), drawn per block, judged by :func:`ladder`. The seeds per
block are the fewest with which a configuration whose staleness costs nothing is tolerated up
to the ladder's top at :data:`POWER` (:func:`plan_seeds`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05
"""One-sided error rate of the whole ladder (fixed sequence; each k's intersection-union test at
this level)."""
POWER = 0.8
"""The chance, planned by simulation, that a configuration whose staleness costs nothing is
tolerated up to the ladder's top."""
METRICS = ("accuracy", "entropy")
"""What must not get worse with staleness: expected accuracy at the horizon (the outcome) and
token entropy at the horizon (health: the collapse Clip-Higher prevents; a fall of entropy is
the failure mode, a rise is not)."""
MARGIN_SHARE = 0.05
"""The non-inferiority margin as a share of DAPO's own figure at k = 0: of its accuracy gain over
the run (first step to horizon) and of its entropy at the horizon. Why 5%: the smallest gain the
DAPO paper attributes to one of its techniques is the token-level loss's, 1 AIME point of the 20
that the four techniques add over naive GRPO (Table 1: 41 -> 42 of 30 -> 50). A staleness cost
below that share cannot undo any one of DAPO's fixes' reported effects; one above it could."""
PILOT = {
    "seeds": "0..63 (the 32 + 32 seeds of the table before this procedure, reports/off_policy at 4e51274)",
    "dapo_k0_first_accuracy": 0.11590,
    "dapo_k0_final_accuracy": 0.68818,
    "dapo_k0_final_entropy": 0.82440,
    "paired_sd_p80": {"accuracy": 0.0524, "entropy": 0.0666},
    "paired_sd_median": {"accuracy": 0.0464, "entropy": 0.0557},
}
"""What the margins and the seed count are planned from, measured before the table's seeds were
run, on seeds the table does not use: DAPO at k = 0 on the composite task (means over the 64
seeds), and the paired standard deviations of (arm - k = 0) over the previous table's 15 rows x
4 k x 2 blocks (accuracy: each block's sd; entropy: from its 95% interval's half-width x sqrt(n)
/ 1.96). The plan uses the 80th percentile: four rows in five have at least the planned power."""
MARGINS = {
    "accuracy": round(MARGIN_SHARE * (PILOT["dapo_k0_final_accuracy"] - PILOT["dapo_k0_first_accuracy"]), 4),
    "entropy": round(MARGIN_SHARE * PILOT["dapo_k0_final_entropy"], 4),
}
"""Non-inferiority margins (accuracy 0.0286, entropy 0.0412 nats): :data:`MARGIN_SHARE` of the
pilot's DAPO at k = 0 (:data:`PILOT`)."""
RHO = 0.5
"""Correlation between two k's paired differences in the plan (a shared k = 0 baseline with
equal arm variances); the report gives the observed one and the power there."""


def bounds(d: np.ndarray, alpha: float = ALPHA) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and one-sided ``1 - alpha`` lower and upper bounds (Student's t) of the paired
    differences along the last axis; NaN differences (a seed where a metric is undefined) are
    dropped per cell. With fewer than 2 finite values the bounds are -inf and +inf."""
    from scipy import stats

    d = np.asarray(d, dtype=np.float64)
    ok = np.isfinite(d)
    n = ok.sum(-1)
    safe = np.where(ok, d, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = safe.sum(-1) / n
        var = (np.where(ok, d - mean[..., None], 0.0) ** 2).sum(-1) / (n - 1)
        half = stats.t.ppf(1 - alpha, np.maximum(n - 1, 1)) * np.sqrt(var / n)
    half = np.where(n >= 2, half, np.inf)
    return mean, mean - half, mean + half


@dataclass(frozen=True)
class Verdict:
    """One configuration's place on the ladder."""

    upto: int
    """The largest k shown non-inferior, with every smaller k (0 where k = 1 is not)."""
    stop: int | None
    """The first k not shown (None where the whole ladder was)."""
    harmful_from: int | None
    """The smallest k where a loss beyond the margin was shown on both blocks on some metric,
    else None."""
    why: str
    """What stopped the ladder (or harmed), in words, naming the metric, k and blocks."""

    def at(self, k: int) -> str:
        """``tolerated``, ``not tolerated`` or ``cannot tell`` for a run read at column k."""
        if k <= self.upto:
            return "tolerated"
        if self.harmful_from is not None and self.harmful_from <= k:
            return "not tolerated"
        return "cannot tell"


def ladder(
    d: np.ndarray,
    ks: Sequence[int],
    margins: Sequence[float],
    alpha: float = ALPHA,
) -> tuple[np.ndarray, np.ndarray]:
    """The procedure on paired differences ``d[..., block, metric, k, seed]`` (leading axes are
    independent replicates): per replicate, the number of leading k shown (the index of the
    tolerated k is that minus 1; 0: none) and the index of the first harmful k (len(ks): none)."""
    d = np.asarray(d, dtype=np.float64)
    m = np.asarray(margins, dtype=np.float64)[:, None]  # [metric, 1]
    _, low, high = bounds(d, alpha)  # [..., block, metric, k]
    shown = (low > -m).all(axis=(-3, -2))  # [..., k]
    upto = np.cumprod(shown, axis=-1).sum(-1)
    harm = (high < -m).all(axis=-3).any(axis=-2)  # [..., k]
    first = np.where(harm.any(-1), harm.argmax(-1), len(ks))
    return upto, first


def judge(
    diffs: Mapping[str, Mapping[int, Mapping[str, Sequence[float]]]],
    margins: Mapping[str, float] = MARGINS,
    alpha: float = ALPHA,
) -> Verdict:
    """:func:`ladder` on one configuration's per-seed differences ``{metric: {k: {block: [d per
    seed]}}}`` (blocks and seeds in the same order for every metric and k), with the reason."""
    metrics = list(diffs)
    ks = sorted(diffs[metrics[0]])
    blocks = list(diffs[metrics[0]][ks[0]])
    n = max(len(diffs[mt][k][b]) for mt in metrics for k in ks for b in blocks)
    arr = np.full((len(blocks), len(metrics), len(ks), n), np.nan)
    for bi, b in enumerate(blocks):
        for mi, mt in enumerate(metrics):
            for ki, k in enumerate(ks):
                v = list(diffs[mt][k][b])
                arr[bi, mi, ki, : len(v)] = v
    shown_n, harm_n = ladder(arr, ks, [margins[mt] for mt in metrics], alpha)
    upto_i, harm_i = int(shown_n), int(harm_n)
    upto = ks[upto_i - 1] if upto_i else 0
    stop = ks[upto_i] if upto_i < len(ks) else None
    harmful_from = ks[harm_i] if harm_i < len(ks) else None
    mean, low, high = bounds(arr, alpha)
    why = ""
    if harmful_from is not None:
        worse = [mt for mi, mt in enumerate(metrics) if (high[:, mi, harm_i] < -margins[mt]).all()]
        shown = ", ".join(
            f"{mt} {'/'.join(f'{mean[bi, metrics.index(mt), harm_i]:+.3f}' for bi in range(len(blocks)))}"
            for mt in worse
        )
        why = f"harmful from k = {harmful_from}: a loss beyond the margin on both blocks ({shown})"
    if stop is not None:
        ki = upto_i
        failed: list[str] = []
        for mi, mt in enumerate(metrics):
            for bi, b in enumerate(blocks):
                if not low[bi, mi, ki] > -margins[mt]:
                    failed.append(
                        f"{mt} on {b} {mean[bi, mi, ki]:+.3f} (bound {low[bi, mi, ki]:+.3f} vs -{margins[mt]:g})"
                    )
        stopped = f"at k = {stop} not shown: {'; '.join(failed)}"
        why = stopped if not why else f"{stopped}; {why}"
    return Verdict(upto, stop, harmful_from, why)


def simulate(
    n: int,
    sd: Mapping[str, float],
    cost: Mapping[str, Sequence[float]] | None = None,
    ks: Sequence[int] = (1, 2, 4, 8),
    margins: Mapping[str, float] = MARGINS,
    rho: float = RHO,
    blocks: int = 2,
    reps: int = 4000,
    alpha: float = ALPHA,
    seed: int = 0,
) -> dict[str, float]:
    """The procedure's operating characteristics by simulation: ``reps`` tables of ``blocks``
    blocks of ``n`` seeds whose paired differences per metric are normal with standard deviation
    ``sd[metric]``, correlation ``rho`` between k's, and true mean ``-cost[metric][i]`` at the
    i-th k (0 where not given). Returns the shares of tables tolerated up to the ladder's top
    (``tolerated_all``), tolerated at k = 1 at least, and found harmful at some k, and the mean
    tolerated k."""
    rng = np.random.default_rng(seed)
    metrics = list(sd)
    K = len(ks)
    shape = (reps, blocks, len(metrics), 1, n)
    common = rng.standard_normal(shape)
    own = rng.standard_normal((reps, blocks, len(metrics), K, n))
    s = np.asarray([sd[m] for m in metrics])[:, None, None]
    mu = np.zeros((len(metrics), K))
    for mi, m in enumerate(metrics):
        if cost and m in cost:
            mu[mi] = -np.asarray(cost[m], dtype=np.float64)
    d = mu[:, :, None] + s * (math.sqrt(rho) * common + math.sqrt(1 - rho) * own)
    upto, harm = ladder(d, ks, [margins[m] for m in metrics], alpha)
    tops = np.asarray([0, *ks])[upto]
    return {
        "tolerated_all": float((upto == K).mean()),
        "tolerated_k1": float((upto >= 1).mean()),
        "harmful": float((harm < K).mean()),
        "harmful_at_k1": float((harm == 0).mean()),
        "mean_tolerated_k": float(tops.mean()),
    }


def plan_seeds(
    sd: Mapping[str, float],
    power: float = POWER,
    ks: Sequence[int] = (1, 2, 4, 8),
    margins: Mapping[str, float] = MARGINS,
    rho: float = RHO,
    reps: int = 4000,
    alpha: float = ALPHA,
    seed: int = 0,
) -> int:
    """The fewest seeds per block with which :func:`simulate` tolerates a configuration whose
    staleness costs nothing up to the ladder's top with probability ``power`` (bisection over n;
    the simulation uses common random numbers, so its power is monotone in n up to noise)."""
    lo, hi = 2, 4
    while (
        simulate(hi, sd, ks=ks, margins=margins, rho=rho, reps=reps, alpha=alpha, seed=seed)["tolerated_all"]
        < power
    ):
        lo, hi = hi, hi * 2
        if hi > 4096:
            raise ValueError(f"no seed count up to 4096 reaches power {power} at sd {dict(sd)}")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        p = simulate(mid, sd, ks=ks, margins=margins, rho=rho, reps=reps, alpha=alpha, seed=seed)[
            "tolerated_all"
        ]
        lo, hi = (lo, mid) if p >= power else (mid, hi)
    return hi


__all__ = [
    "ALPHA",
    "MARGINS",
    "MARGIN_SHARE",
    "METRICS",
    "PILOT",
    "POWER",
    "RHO",
    "Verdict",
    "bounds",
    "judge",
    "ladder",
    "plan_seeds",
    "simulate",
]
