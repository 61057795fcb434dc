"""Validation score falling: the held-out score (``eval/score``: verl's ``val-core/*/mean@N``,
TRL's ``eval_reward``, this project's ``eval/avg@k``), judged against its own noise.

The noise of one evaluation is binomial where the number of items is known
(``--eval-items``), else estimated from the evaluations (:func:`~dapo.health.noise.eval_sd`;
fewer than five and no item count: the rule cannot judge). The best evaluation before the last
two was picked as the highest of ``B``: a flat run's best sits above its level by chance, so
the fall from it to the mean of the last two counts only beyond the ``1 - alpha`` quantile of
that very statistic for a flat run (:func:`~dapo.health.noise.fall_quantile`). Beyond it at
``alpha_warn``: warning; beyond it at ``alpha_fail`` and the last two also below the *first*
evaluation by a one-sided ``alpha_fail`` test: failing (the run ended worse than it began).
Issue 70's case: 20 logs of a flat true score of 0.30 on 30 items called failing 12 times by
the fixed 5% drop; ``tests/test_health_noise.py`` holds the new rate."""

from __future__ import annotations

from statistics import NormalDist

from ..config import HealthConfig
from ..noise import fall_from_best, fall_quantile
from ..series import Run, series
from .base import TOO_FEW_STEPS, Judgement, Knobs, Rule, not_logged, unknown


def check(run: Run, c: HealthConfig, knobs: Knobs) -> Judgement:
    s = series(run, "eval/score")
    if not s:
        return not_logged("eval/score")
    if len(s) < 3:
        return unknown(TOO_FEW_STEPS, f"eval/score: {len(s)} evaluation(s); needs 3")
    fall = fall_from_best(s.values, c.eval_items)
    if fall is None:
        return unknown(
            TOO_FEW_STEPS,
            f"eval/score: {len(s)} evaluations, too few to estimate their noise (needs 5, or "
            "--eval-items to know it)",
        )
    sd, before = fall.sd, len(s) - 2
    best, first, now = s.values[fall.best], s.values[0], fall.now
    ev = (
        f"validation score {first:.3g} at step {s.steps[0]:g}, best {best:.3g} at step {s.steps[fall.best]:g}, "
        f"last two {now:.3g} ({len(s)} evaluations; noise {sd:.2g} per evaluation, {fall.how})"
    )
    if sd <= 0:
        return Judgement("healthy", evidence=ev + ": no noise to judge a fall against")
    warn, fail = (fall_quantile(before, 2, a) for a in (c.alpha_warn, c.alpha_fail))
    below_first = -fall.rise > NormalDist().inv_cdf(1 - c.alpha_fail)
    if fall.z > fail and below_first:
        return Judgement(
            "failing",
            s.steps[fall.best],
            ev + f": {fall.z:.1f} sd below its best (counts from {fail:.1f}), below the first",
        )
    if fall.z > warn:
        return Judgement(
            "warning", s.steps[fall.best], ev + f": {fall.z:.1f} sd below its best (counts from {warn:.1f})"
        )
    return Judgement(
        "healthy", evidence=ev + f": {fall.z:.1f} sd below its best (a fall counts from {warn:.1f})"
    )


RULE = Rule(
    "validation",
    "Validation score falling",
    "Keep the checkpoint of the best evaluation; lower train.lr or stop early; check the train "
    "reward for hacking that the validation set does not pay",
    check,
)
