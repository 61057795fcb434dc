"""Validation score falling: the held-out score (``eval/score``: verl's ``val-core/*/mean@N``,
TRL's ``eval_reward``, this project's ``eval/avg@k``) below its best so far in the last two
evaluations by more than ``val_drop`` of the best (and 0.01 at least): warning; the latest
below the first evaluation by that margin: failing. Needs three evaluations."""

from __future__ import annotations

from ..config import HealthConfig
from ..series import Run, series
from .base import TOO_FEW_STEPS, Judgement, Knobs, Rule, not_logged, unknown, val_margin


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    s = series(run, "eval/score")
    if not s:
        return not_logged("eval/score")
    if len(s) < 3:
        return unknown(TOO_FEW_STEPS, f"eval/score: {len(s)} evaluation(s); needs 3")
    best_i = max(range(len(s)), key=lambda i: s.values[i])
    best, first, last = s.values[best_i], s.values[0], s.values[-1]
    margin = val_margin(best, c)
    ev = (
        f"validation score {first:.3g} at step {s.steps[0]:g}, best {best:.3g} at step {s.steps[best_i]:g}, "
        f"last {last:.3g} ({len(s)} evaluations)"
    )
    if last < first - margin:
        return Judgement("failing", s.steps[best_i], ev + ": below the first evaluation")
    if best_i < len(s) - 2 and all(v < best - margin for v in s.values[-2:]):
        return Judgement("warning", s.steps[best_i], ev + ": below its best in the last two")
    return Judgement("healthy", evidence=ev)


RULE = Rule(
    "validation",
    "Validation score falling",
    "Keep the checkpoint of the best evaluation; lower train.lr or stop early; check the train "
    "reward for hacking that the validation set does not pay",
    check,
)
