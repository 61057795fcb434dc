"""The words of ``dapo toy check``'s verdicts and the constants behind them (no torch: the
command's ``--help`` prints them)."""

from __future__ import annotations

LEARNING_MARGIN = 0.82
"""The learning gate: a candidate fails it when it is shown to gain less than this share of
DAPO's own accuracy gain on the same seeds (the interval of candidate - margin x DAPO below
0 on some block). Derived from DAPO's own loss, without any candidate (``python -m
toybench.step_sweep --seeds 10``, ``reports/losses/step_sweep.md``): at smaller steps the
check's two reference arms still show both of DAPO's fixes on both seed blocks down to 0.4 x
the check's step (Clip-Higher on entropy: +0.053 / +0.060; token-level on the length gap:
-2.92 / -2.70), and there the arm that learns least (the symmetric clip, entropy task) gains
0.83 / 0.82 of the fix arm's gain at the check's step; at 0.3 x Clip-Higher's effect is gone
(+0.021 [-0.004, +0.046] / +0.001). So 0.82 is the least a run learned in which the check
still sees both failure modes: a candidate that learns less could hide either by moving
too little. (Before issue 69: 0.5, set between the corpus's broken and correct losses.)"""


MIN_SHARE = 0.5
"""``protects`` needs the candidate's effect beyond this share of DAPO's fix's effect (the
fixed yardstick), with confidence: the interval of ``(candidate - unprotected) - MIN_SHARE x
(fix - unprotected)``, paired by seed, excludes 0 in the fix's direction. One half is the
midpoint between the two reference arms: below it the candidate stands nearer the
unprotected arm than the fix, so it is not called a protection. ``harms`` is the mirror:
beyond the same share against the fix's direction (a rounding-level difference is neither). ``as fix`` uses the same
half: candidate - fix within +-half the fix's effect (nearer the fix than the unprotected
arm on either side). From the definition of the two references, not from any loss."""

MIN_SEEDS = 6
"""A seed block needs at least this many judged seeds (paired, finite, every arm read) for a
verdict: with 5 or fewer, even all differences of one sign cannot exclude 0 by a two-sided
sign test at 5% (2 x 0.5^5 = 0.0625; at 6, 0.031), and a bootstrap interval over so few
values is not a 95% interval. Below it the block is ``cannot judge: too few seeds``."""

PROTECTS = "protects"
NO_EFFECT = "no effect shown"
FRAGILE = "differs between seed blocks"
DOES_NOT_LEARN = "cannot judge: learns too little"
NO_YARDSTICK = "cannot judge: DAPO's fix shows no effect here"
TOO_FEW = "cannot judge: too few seeds"


VERDICTS: dict[str, str] = {
    PROTECTS: f"candidate - unprotected lies beyond {MIN_SHARE:.0%} of DAPO's fix's own effect, in its "
    "direction (the interval of the paired difference excludes that share), on both seed blocks",
    NO_EFFECT: f"neither protects (beyond {MIN_SHARE:.0%} of the fix's effect) nor harms, on both blocks",
    "harms": f"candidate - unprotected lies beyond {MIN_SHARE:.0%} of the fix's effect against its direction, "
    "on both blocks",
    FRAGILE: "the two seed blocks give different verdicts; a claim needs protects on both, so it fails",
    DOES_NOT_LEARN: f"the candidate is shown to gain less than {LEARNING_MARGIN:.0%} of DAPO's accuracy "
    "gain on the same seeds (the interval below it, on some block): no protection verdict, no share",
    NO_YARDSTICK: "DAPO's fix against the unprotected arm does not exclude 0 in its direction on both "
    "blocks in the check's conditions: there is no yardstick to judge a candidate by",
    TOO_FEW: f"fewer than {MIN_SEEDS} seeds of a block could be judged (the report names each seed "
    "left out and why: no learning, a late crossing, a non-finite run)",
    "as fix": f"candidate - fix lies within +-{MIN_SHARE:.0%} of the fix's own effect",
    "better / weaker": "candidate - fix excludes 0, in / against the fix's direction",
    "inconclusive": f"candidate - fix neither excludes 0 nor lies within +-{MIN_SHARE:.0%} of the fix's effect",
}
"""Every verdict word of the check, defined (printed by ``--help`` and under the table)."""


def legend() -> str:
    """What every verdict word means (the table's footnote and ``dapo toy check --help``)."""
    return "\n".join(f"- *{word}*: {text}" for word, text in VERDICTS.items())


__all__ = [
    "DOES_NOT_LEARN",
    "FRAGILE",
    "LEARNING_MARGIN",
    "MIN_SEEDS",
    "MIN_SHARE",
    "NO_EFFECT",
    "NO_YARDSTICK",
    "PROTECTS",
    "TOO_FEW",
    "VERDICTS",
    "legend",
]
