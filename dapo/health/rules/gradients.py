"""Gradients: non-finite values or skipped steps, blow-ups (also in the first steps), spikes
against a robust level that does not collapse at 0 (the median of the non-zero norms), and
runs of exactly-zero norms (no gradient at all: every group uniform, or a broken loss).

Severity: non-finite norms: failing; a blow-up (above ``10 * grad_explode`` times the level)
or spikes in more than 5% of the rows: failing, or a warning when the run came back from them
and kept learning; two or more spikes: warning; one spike below the blow-up level is reported
as evidence only (the norm is measured before clipping, and the run recovered)."""

from __future__ import annotations

import statistics

from ..config import HealthConfig
from ..series import Run, nonfinite_steps, series
from .base import Judgement, Knobs, Rule, no_gradient, not_logged, spike_status, worse


def _zero_runs(steps: list[float], values: list[float], min_len: int) -> list[tuple[float, int]]:
    """(first step, length) of each run of at least ``min_len`` consecutive exact zeros."""
    out, start, n = [], None, 0
    for x, v in zip([*steps, None], [*values, None]):
        if v == 0:
            start, n = (x if n == 0 else start), n + 1
            continue
        if n >= min_len:
            out.append((start, n))
        n = 0
    return out  # type: ignore[return-value]


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    gn, bad = series(run, "actor/grad_norm"), nonfinite_steps(run, "actor/grad_norm")
    skipped, steps = series(run, "actor/skipped_steps"), series(run, "actor/optimizer_steps")
    if not (gn or bad or skipped):
        return not_logged("actor/grad_norm", "actor/skipped_steps")
    status, since, parts = "healthy", None, []
    zero_runs, spikes = [], []

    def at(step: float) -> None:
        nonlocal since
        since = step if since is None else min(since, step)

    fatal, advice_zero = False, None
    if bad:
        parts.append(f"grad norm non-finite at {len(bad)} step(s), first {bad[0]:g}")
        status, fatal = "failing", True
        at(bad[0])
    total_skipped = sum(skipped.values)
    if total_skipped:
        share = total_skipped / max(1.0, total_skipped + sum(steps.values))
        parts.append(
            f"{total_skipped:.0f} optimizer step(s) skipped for non-finite loss/gradient ({share:.1%})"
        )
        status = worse(status, "failing" if share > c.skipped_fail_frac else "warning")
        fatal = fatal or share > c.skipped_fail_frac
        at(next(x for x, s in zip(skipped.steps, skipped.values) if s > 0))
    if gn:
        nonzero = [v for v in gn.values if v != 0]
        zeros = len(gn) - len(nonzero)
        zero_runs = _zero_runs(gn.steps, gn.values, c.grad_zero_rows)
        if zero_runs:
            longest = max(n for _, n in zero_runs)
            parts.append(f"grad norm exactly 0 in {zeros} of {len(gn)} rows (longest run {longest} rows)")
            found = no_gradient(run, c, gn, "grad norm")
            status = worse(status, found.status if found is not None else "warning")
            fatal = fatal or (found is not None and found.fatal)
            if found is not None and found.advice:
                advice_zero = found.advice
            at(zero_runs[0][0])
        if len(nonzero) >= c.min_points:
            level = statistics.median(nonzero)
            spikes = [(x, v) for x, v in zip(gn.steps, gn.values) if v > c.grad_explode * level]
            parts.append(f"grad norm median {level:.3g} (non-zero rows), max {max(nonzero):.3g}")
            if spikes:
                parts.append(
                    f"{len(spikes)} spike(s) above {c.grad_explode:g}x the median, first at step {spikes[0][0]:g} "
                    f"({spikes[0][1]:.3g})"
                )
                big = max(v for _, v in spikes) > 10 * c.grad_explode * level
                severity, note = spike_status(
                    run, gn, [x for x, _ in spikes], c, lambda v: v > c.grad_explode * level, blowup=big
                )
                parts[-1] += note
                status = worse(status, severity)
                if severity != "healthy":
                    at(spikes[0][0])
    advice = None
    if zero_runs and not spikes and not bad:
        advice = advice_zero or (
            "a gradient of exactly 0 means no token carried a signal: every group uniform (see vanishing "
            "signal / not learning) or the loss is detached"
        )
    return Judgement(
        status,
        since,
        "; ".join(parts) or "gradients finite and stable",
        advice,
        fatal=fatal and status == "failing",
    )


RULE = Rule(
    "gradients",
    "Non-finite, exploding or zero gradients",
    "Lower train.lr, keep algo.max_grad_norm=1.0; look for bad data at the step it started",
    check,
)
