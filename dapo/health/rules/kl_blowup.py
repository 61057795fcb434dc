"""KL blow-up: the KL between the old and the updated policy of a step (``actor/approx_kl``,
verl's ``ppo_kl``) or the KL to the reference policy (``actor/ref_kl``: TRL's ``kl``, verl's
``kl_loss``, custom trainers' ``kl_divergence``) high in absolute terms, spiking far above its
level at the start of the log or above the failing ceiling (once above 10x that ceiling, or in
more than 5% of the rows: failing, or a warning when the KL came back down and the run kept
learning; twice: warning; once: evidence), or non-finite.

Judged against the start and against absolute ceilings, never against the run's own median:
a KL that explodes early and stays high would become its own median. The ceilings are per
kind of KL (per token, any estimator): the reference KL grows as the policy moves away (healthy
runs stay below ~0.15: ``kl_ref_warn`` 0.5, ``kl_ref_fail`` 2.0); one step's PPO KL stays small
(healthy runs below ~0.005: ``kl_ppo_warn`` 0.05, ``kl_ppo_fail`` 0.5). The level is the last
window's median; a level below ``-kl_negative`` is no KL at all (a warning: a sign or
estimator bug). A level needs one row;
spikes need a window of start. A log that prints KL to 3 decimals (old verl: 0.000/0.001) is
judged by the ceilings, which its resolution can show."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from ..config import HealthConfig
from ..series import Run, nonfinite_steps, series
from .base import Judgement, Knobs, Rule, not_logged, spike_status, worse

KL_METRICS = ("actor/approx_kl", "actor/ref_kl")


def _at_least(level: float) -> Callable[[float], bool]:
    return lambda v: v >= level


def _ceilings(key: str, c: HealthConfig) -> tuple[float, float]:
    return (c.kl_ppo_warn, c.kl_ppo_fail) if key == "actor/approx_kl" else (c.kl_ref_warn, c.kl_ref_fail)


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    present = [k for k in KL_METRICS if series(run, k) or nonfinite_steps(run, k)]
    if not present:
        return not_logged(*KL_METRICS)
    status, since, parts, fatal = "healthy", None, [], False

    def at(step: float) -> None:
        nonlocal since
        since = step if since is None else min(since, step)

    for key in present:
        s, bad = series(run, key), nonfinite_steps(run, key)
        warn, fail = _ceilings(key, c)
        if bad:
            parts.append(f"{key} non-finite at {len(bad)} step(s), first {bad[0]:g}")
            status, fatal = "failing", True
            at(bad[0])
        if not s:
            continue
        now = statistics.median(s.tail(c))  # robust: a spike in the last window is not a level
        peak_at, peak = max(zip(s.steps, s.values), key=lambda p: p[1])
        part = f"{key} now {now:.3g} (ceilings {warn:g} / {fail:g}), max {peak:.3g} at step {peak_at:g}"
        if now >= warn:
            status = worse(status, "failing" if now >= fail else "warning")
            onset = s.onset(c, _at_least(warn))
            at(onset if onset is not None else s.steps[0])
        elif now < -c.kl_negative:
            part += "; below 0, which a KL never is: the estimator or its sign is wrong"
            status = worse(status, "warning")
            onset = s.onset(c, lambda v: v < -c.kl_negative)
            at(onset if onset is not None else s.steps[0])
        level = max(statistics.median(s.head(c)), c.kl_floor) if s.covers(c, 2) else None
        if level is not None:
            part += f"; start level {level:.3g}"
        spikes = [
            (x, v)
            for x, v in zip(s.steps, s.values)
            if v >= fail or (level and v > c.kl_blowup * level and v >= warn)
        ]
        if spikes:
            part += f"; {len(spikes)} row(s) above the ceiling {fail:g} or {c.kl_blowup:g}x the start"
            if peak >= 10 * fail or now < warn:  # a KL that stays high is judged by its level above
                severity, note = spike_status(
                    run, s, [x for x, _ in spikes], c, _at_least(warn), blowup=peak >= 10 * fail
                )
                part += note
                status = worse(status, severity)
            if status != "healthy":
                at(spikes[0][0])
        parts.append(part)
    advice = None
    if status != "healthy" and isinstance(knobs.get("lr"), float):
        advice = f"lower train.lr (now {knobs['lr']:g}); look at the batch of the step it started"
    return Judgement(status, since if status != "healthy" else None, "; ".join(parts), advice, fatal=fatal)


RULE = Rule(
    "kl_blowup",
    "KL blow-up",
    "Lower train.lr, keep algo.max_grad_norm=1.0; look at the data of the step it started",
    check,
)
