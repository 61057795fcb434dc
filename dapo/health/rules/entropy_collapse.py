"""Entropy collapse (paper Fig. 2b): entropy falls to a fraction of its start and stays there.
Supporting evidence: up-clipped tokens with low old probability (Fig. 3a).

Collapse harms by ending exploration, so the learning curve decides how bad it is: entropy
that falls while accuracy (or reward) keeps rising significantly after the fall began is a
policy converging, a warning at most; entropy that falls while learning stalls is failing."""

from __future__ import annotations

from ..config import HealthConfig
from ..series import Run, mean, series
from .base import Judgement, Knobs, Rule, gain, outcome, start_and_now


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    judged = start_and_now(run, "actor/entropy", c)
    if isinstance(judged, Judgement):
        return judged
    s, start, now = judged
    frac = now / start
    status = (
        "failing" if frac < c.entropy_fail_frac else "warning" if frac < c.entropy_warn_frac else "healthy"
    )
    threshold = c.entropy_fail_frac if status == "failing" else c.entropy_warn_frac
    since = s.onset(c, lambda v: v < threshold * start) if status != "healthy" else None
    ev = f"entropy {start:.3f} -> {now:.3f} ({frac:.0%} of start)"
    up, cf = series(run, "actor/upclip_old_prob"), series(run, "actor/clipfrac_upper")
    if cf and up:
        ev += f"; {mean(cf.values):.2%} of tokens up-clipped, their old probability {mean(up.values):.2f} on average"
    name, out = outcome(run)
    if status == "failing" and since is not None and out.after(since).covers(c, 2):
        g, noise = gain(out.after(since))
        ev += f"; {name} since step {since:g}: {g:+.3g} (+-{noise:.2g})"
        if g > 2 * noise:
            status = "warning"
            ev += ", still rising: converging rather than stuck"
    return Judgement(status, since, ev, _advice(run, knobs) if status != "healthy" else None)


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
