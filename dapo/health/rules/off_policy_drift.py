"""Off-policy drift: the policy the engine samples with and the one the trainer optimises
grow apart over the run (staleness that grows, an engine whose numbers drift, a weight
sync that stops), judged on their k3 KL over the sampled tokens. A mismatch that rises
steadily is the early sign of an asynchronous run's collapse (prime-rl's monitoring
notes); a constant small offset (a bf16 engine) is not drift."""

from __future__ import annotations

import statistics

from ..config import HealthConfig
from ..series import Run, series
from .base import Judgement, Knobs, Rule, not_logged, too_few

KEY = "mismatch/k3_kl"


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    s = series(run, KEY)
    if not s:
        return not_logged(KEY)
    if not s.covers(c, 2):
        return too_few(s, c, 2, KEY)
    start = statistics.median(s.head(c))
    now = statistics.median(s.tail(c))  # robust: one bad batch is not a level
    growth = now / max(start, c.drift_floor)
    ev = f"k3 KL(engine || trainer) {start:.2e} -> {now:.2e} per token (x{growth:.1f}; max {max(s.values):.2e})"
    rising = growth >= c.drift_growth
    if rising and now >= c.drift_fail:
        status = "failing"
    elif (rising and now >= c.drift_warn) or now >= c.drift_fail:
        status = "warning"  # grown but still small, or high from the start (an offset, not drift)
    else:
        status = "healthy"
    since = s.onset(c, lambda v: v >= c.drift_warn) if status != "healthy" else None
    advice = None
    if status != "healthy" and isinstance(knobs.get("tis_cap"), float):
        advice = (
            "a correction is on and the gap still grows: lower the staleness bound, check the weight sync"
        )
    return Judgement(status, since, ev, advice)


RULE = Rule(
    "off_policy_drift",
    "Off-policy drift (engine vs trainer policy)",
    "Bound the staleness (rollout.max_staleness) and correct for it: algo.tis_cap=2.0 or the decoupled "
    "objective (dapo.offpolicy); check that weights reach the engine",
    check,
)
