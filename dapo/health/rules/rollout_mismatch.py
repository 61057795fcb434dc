"""Rollout/trainer mismatch: the engine's and the trainer's log-probs of the sampled tokens
drift apart (dtype, kernels, a stale or broken weight sync)."""

from __future__ import annotations

from ..config import HealthConfig
from ..series import Run, mean, series
from .base import Judgement, Knobs, Rule, not_logged, unknown

STALE = "asynchronous"


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    gap = series(run, "mismatch/logp_gap")
    if not gap:
        return not_logged("mismatch/logp_gap")
    stale = series(run, "async/staleness_max")
    if stale and max(stale.tail(c)) > 0:  # an asynchronous run: the gap is mostly policy change
        return unknown(
            STALE,
            f"tokens up to {max(stale.tail(c)):g} policy versions old (async/staleness_max): the gap "
            "mixes that policy change with the engine's mismatch; off_policy_drift judges its growth",
        )
    now = mean(gap.tail(c))
    ev = f"mean |trainer - engine| log-prob gap {now:.2e} per token (max logged {max(gap.values):.2e})"
    status = "failing" if now > c.mismatch_fail else "warning" if now > c.mismatch_warn else "healthy"
    since = gap.onset(c, lambda v: v > c.mismatch_warn) if status != "healthy" else None
    advice = None
    if status != "healthy" and isinstance(knobs.get("tis_cap"), float):
        advice = "truncated importance sampling is on: check the engine dtype and the weight sync"
    return Judgement(status, since, ev, advice)


RULE = Rule(
    "rollout_mismatch",
    "Rollout/trainer mismatch",
    "Truncated importance sampling: algo.tis_cap=2.0; check engine dtype and weight sync",
    check,
)
