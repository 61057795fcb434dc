"""Entropy collapse (paper Fig. 2b): entropy falls to a fraction of its start and stays there.
Supporting evidence: up-clipped tokens with low old probability (Fig. 3a).

Collapse harms by ending exploration, so the learning curve decides whether it is one. Every
long-CoT run's entropy falls as the policy sharpens (the paper's Fig. 2b baseline falls too;
its DAPO run is the exception). Entropy that falls while the outcome is still rising over the
later half of the time since the fall, or has saturated (at ``saturated_frac`` of its range,
or the validation score at its best), is a policy converging: healthy, with a note. Entropy
that falls below ``entropy_fail_frac`` of its start while learning has stalled short of that is
a collapse (failing); one that stays above it is a warning, unless the run learned before it
levelled off (moderate sharpening: healthy). Without an outcome logged the fall alone decides
(below ``entropy_warn_frac``: warning)."""

from __future__ import annotations

from ..config import HealthConfig
from ..series import Run, mean, series
from .base import Judgement, Knobs, Rule, at_ceiling, learns, progress, start_and_now


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    judged = start_and_now(run, "actor/entropy", c)
    if isinstance(judged, Judgement):
        return judged
    s, start, now, note = judged
    frac = now / start
    status = (
        "failing" if frac < c.entropy_fail_frac else "warning" if frac < c.entropy_warn_frac else "healthy"
    )
    ev = f"entropy {start:.3f} -> {now:.3f} ({frac:.0%} of start)" + note
    if status == "healthy":
        return Judgement(status, evidence=ev)
    threshold = c.entropy_fail_frac if status == "failing" else c.entropy_warn_frac
    since = s.onset(c, lambda v: v < threshold * start)
    up, cf = series(run, "actor/upclip_old_prob"), series(run, "actor/clipfrac_upper")
    if cf and up:
        ev += f"; {mean(cf.values):.2%} of tokens up-clipped, their old probability {mean(up.values):.2f} on average"
    state, learning = progress(run, c, since if since is not None else s.steps[0])
    if learning:
        ev += f"; {learning}"
    if state in ("rising", "saturated"):
        return Judgement("healthy", evidence=ev + ": a policy converging, not a collapse")
    if state == "stalled" and status == "warning" and learns(run, c):
        return Judgement(
            "healthy", evidence=ev + "; the run learned before it levelled off: moderate sharpening"
        )
    if frac <= c.entropy_dead_frac and at_ceiling(run, c) is not True:  # deterministic on its own samples
        ev += f": at about 0 (at most {c.entropy_dead_frac:.0%} of its start) below the outcome's ceiling"
        return Judgement("failing", since, ev, _advice(run, knobs), fatal=True)
    return Judgement(status, since, ev, _advice(run, knobs))


def _advice(run: Run, knobs: Knobs) -> str | None:
    """Clip-Higher helps only where the upper clip acts and eps_high is not already raised."""
    cf = series(run, "actor/clipfrac_upper")
    if cf and max(cf.values) == 0:
        return (
            f"clipping never acts here (actor/clipfrac_upper is 0 in all {len(cf)} rows), so Clip-Higher "
            "cannot help: lower train.lr, take fewer optimizer steps per batch, or use a loss that "
            "protects entropy without the clip (clip_cov, kl_cov; `dapo toy check`)"
        )
    eps_high = knobs.get("eps_high")
    if isinstance(eps_high, float) and eps_high >= 0.28:
        return (
            f"eps_high is already {eps_high:g} (DAPO's 0.28): raising it further risks entropy explosion; "
            "lower train.lr or try clip_cov / kl_cov (`dapo toy check`)"
        )
    return None


RULE = Rule(
    "entropy_collapse",
    "Entropy collapse",
    "Clip-Higher: raise algo.eps_high (DAPO uses 0.28 with eps_low 0.2)",
    check,
)
