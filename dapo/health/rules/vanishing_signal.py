"""Vanishing signal (paper Fig. 3b): the share of groups whose responses all score alike
(accuracy 1 or 0, so advantage 0 and no gradient) is high and rising, or dynamic sampling
needs more and more rounds / cannot fill the batch. A gradient norm or advantages of exactly
0 say the same thing directly, and so does a policy loss of exactly 0 over many consecutive
rows when nothing else in the log shows a gradient (:func:`_zero_loss`): a hand-written loop
whose every group scored alike, or whose loss is detached, logs exactly that and nothing more.
GRPO's loss is 0 at each batch's first update too (the advantages of a group sum to 0), so a
zero loss beside a non-zero gradient norm, a reward spread within groups or non-zero
advantages is no evidence, and one while the outcome rises, or one the run's loss leaves again
before its end (a stretch in the middle of reasoning-from-scratch's 500-step table, held-out-7),
only a warning: unrecoverable means lasting to the last row."""

from __future__ import annotations

from ..config import HealthConfig
from ..series import Run, mean, series, slope
from .base import (
    SATURATED_ADVICE,
    SEVERITY,
    Judgement,
    Knobs,
    Rule,
    at_ceiling,
    learns,
    no_gradient,
    not_logged,
    saturating,
    too_few,
    uniform_share,
)

SIGNS = ("actor/grad_norm", "rollout/reward_std", "rollout/advantage_abs_max", "rollout/advantage_std")
"""Metrics whose non-zero value shows that an update had a gradient."""


def _zero_loss(run: Run, c: HealthConfig) -> Judgement | None:
    """The longest stretch of consecutive rows with a policy loss of exactly 0; a judgement when
    it is ``c.zero_loss_rows`` long or longer and no row in it shows a gradient (:data:`SIGNS`)."""
    best: list[int] = []
    cur: list[int] = []
    last = -1  # the last row that logs a loss
    for i, row in enumerate(run):
        v = row.get("actor/loss")
        if v is None:
            continue
        last = i
        cur = [*cur, i] if v == 0 else []
        if len(cur) > len(best):
            best = cur
    if len(best) < c.zero_loss_rows:
        return None
    rows = [run[i] for i in best]
    if any(isinstance(r.get(k), (int, float)) and r[k] != 0 for r in rows for k in SIGNS):
        return None
    steps = [float(r.get("step", i)) for r, i in zip(rows, best)]
    ev = (
        f"policy loss exactly 0 in {len(best)} consecutive rows (steps {steps[0]:g}-{steps[-1]:g}), "
        "and no grad norm, reward spread or advantage in them shows a gradient"
    )
    if learns(run, c):
        return Judgement("warning", steps[0], ev + "; the outcome still rises: log the gradient norm to tell")
    if best[-1] != last:  # the loss moved again after the stretch: the signal came back
        return Judgement("warning", steps[0], ev + "; the loss moves again after it (the signal came back)")
    if at_ceiling(run, c) is not False:  # the outcome not logged, or at its ceiling: below it is not shown
        return Judgement("warning", steps[0], ev + "; no outcome below its ceiling is logged beside it")
    return Judgement("failing", steps[0], ev + ": no learning signal", fatal=True)


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    found = _signal(run, c, knobs)
    zero = _zero_loss(run, c)
    if zero is None or (found.status in ("warning", "failing")):
        return found
    if found.status == "healthy":
        zero = Judgement(
            zero.status, zero.since, f"{found.evidence}; {zero.evidence}", zero.advice, fatal=zero.fatal
        )
    return zero


def _signal(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    share, rounds = uniform_share(run), series(run, "sampling/rounds")
    under, adv = series(run, "sampling/underfilled"), series(run, "rollout/advantage_abs_max")
    zero = no_gradient(run, c, series(run, "actor/grad_norm"), "grad norm")
    ds_active = (bool(rounds) and max(rounds.values) > 1) or knobs.get("dynamic_sampling") is True
    if not (share.covers(c, 2) or rounds.covers(c, 2) or adv.covers(c, 2)):
        if zero is not None:  # no gradient at all says it directly
            return zero
        if share and not ds_active and mean(share.tail(c)) >= c.uniform_fail:  # a level: one row says it
            return Judgement(
                "failing",
                share.steps[0],
                f"groups with accuracy 0 or 1: {mean(share.tail(c)):.2f} over the last {len(share.tail(c))} row(s)",
            )
        if not (share or rounds or adv):
            return not_logged("group accuracy shares", "sampling/rounds", "advantages")
        longest = max((share, rounds, adv), key=len)
        return too_few(longest, c, 2, "group shares / sampling rounds")
    status, since, parts = "healthy", None, []
    if share.covers(c, 2):
        head, now = mean(share.head(c)), mean(share.tail(c))
        parts.append(f"groups with accuracy 0 or 1: {head:.2f} -> {now:.2f}")
        if not ds_active and now >= c.uniform_fail:
            status = "failing"
        elif not ds_active and now >= c.uniform_warn and now > head + 0.1:
            status = "warning"
        if status != "healthy":
            since = share.onset(c, lambda v: v >= c.uniform_warn)
    fatal, advice = False, None
    if share.covers(c, 2) and status != "healthy" and saturating(run, c):
        status, advice = "warning", SATURATED_ADVICE
        parts[-1] += ", moving with the outcome to its ceiling: saturated"
    for found in (zero, no_gradient(run, c, adv, "advantages") if adv.covers(c, 2) else None):
        if found is not None:
            parts.append(found.evidence)
            if SEVERITY[found.status] >= SEVERITY[status]:
                status, fatal, advice = found.status, found.fatal, found.advice or advice
            since = since if since is not None else found.since
    if rounds.covers(c, 2):
        r_now = mean(rounds.tail(c))
        parts.append(f"dynamic-sampling rounds {mean(rounds.head(c)):.1f} -> {r_now:.1f}")
        recent = rounds.recent(c)
        if under and mean(under.tail(c)) > 0.5:
            parts.append(f"batch underfilled in {mean(under.tail(c)):.0%} of recent steps")
            status = "failing"
            since = since if since is not None else under.onset(c, lambda v: v > 0.5)
        elif ds_active and r_now >= c.rounds_warn and slope(recent.steps, recent.values) > 0:
            if status == "healthy":
                status, since = "warning", rounds.onset(c, lambda v: v >= c.rounds_warn)
    if status != "healthy" and ds_active:
        advice = (
            "dynamic sampling is already on: filter the data by pass rate (drop prompts always solved "
            "or never solved) or raise algo.max_gen_rounds"
        )
    return Judgement(status, since, "; ".join(parts), advice, fatal=fatal and status == "failing")


RULE = Rule(
    "vanishing_signal",
    "Vanishing signal (zero-gradient groups)",
    "Dynamic sampling: algo.dynamic_sampling=true",
    check,
)
