"""KL blow-up: the per-step PPO KL between the old and the new policy (``actor/approx_kl``,
verl's ``ppo_kl``) or the KL to the reference policy (``actor/ref_kl``: TRL's ``kl``, verl's
``kl_loss``) jumps far above its own robust level (the run's median, floored at
``kl_floor``; a blow-up in the first steps counts too), or turns non-finite. A reference KL
that grows steadily is normal; a jump of orders of magnitude is not."""

from __future__ import annotations

import statistics

from ..config import HealthConfig
from ..series import Run, mean, nonfinite_steps, series
from .base import Judgement, Knobs, Rule, not_logged, too_few, worse

KL_METRICS = ("actor/approx_kl", "actor/ref_kl")


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    present = [k for k in KL_METRICS if series(run, k) or nonfinite_steps(run, k)]
    if not present:
        return not_logged(*KL_METRICS)
    status, since, parts = "healthy", None, []
    judged = False
    for key in present:
        s, bad = series(run, key), nonfinite_steps(run, key)
        if bad:
            parts.append(f"{key} non-finite at {len(bad)} step(s), first {bad[0]:g}")
            status, since = "failing", bad[0] if since is None else min(since, bad[0])
            judged = True
        if not s.covers(c, 2):
            continue
        judged = True
        level = max(statistics.median(s.values), c.kl_floor)
        peak_at, peak = max(zip(s.steps, s.values), key=lambda p: p[1])
        now = mean(s.tail(c))
        parts.append(f"{key} median {level:.3g}, now {now:.3g}, max {peak:.3g} at step {peak_at:g}")
        if peak > c.kl_blowup**2 * level or now > c.kl_blowup * level:
            status = worse(status, "failing" if peak > c.kl_blowup**2 * level else "warning")
            first = next(x for x, v in zip(s.steps, s.values) if v > c.kl_blowup * level)
            since = first if since is None else min(since, first)
    if not judged:
        longest = max((series(run, k) for k in present), key=len)
        return too_few(longest, c, 2, " / ".join(present))
    advice = None
    if status != "healthy" and isinstance(knobs.get("lr"), float):
        advice = f"lower train.lr (now {knobs['lr']:g}); look at the batch of the step it started"
    return Judgement(status, since, "; ".join(parts), advice)


RULE = Rule(
    "kl_blowup",
    "KL blow-up",
    "Lower train.lr, keep algo.max_grad_norm=1.0; look at the data of the step it started",
    check,
)
