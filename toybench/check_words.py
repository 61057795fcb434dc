"""The words of ``dapo toy check``'s verdicts and the learning gate's margin (no torch: the
command's ``--help`` prints them)."""

from __future__ import annotations

LEARNING_MARGIN = 0.5
"""The learning gate: a candidate must gain at least this share of DAPO's own accuracy gain
on the same seeds (non-inferiority: the interval of candidate - margin x DAPO above 0 on
both blocks). Measured (``reports/losses``): every correct loss of the corpus and of the
peers gains 0.89-1.25 of DAPO's; the broken ones it exists for gain 0.002-0.23 (a loss
divided by its denominator twice, a constant normaliser 1,000x too large, a gradient through
the first token only) where they fail it."""


PROTECTS = "protects"
FRAGILE = "differs between seed blocks"
DOES_NOT_LEARN = "cannot judge: learns too little"


VERDICTS: dict[str, str] = {
    PROTECTS: "candidate - unprotected excludes 0 in the direction of DAPO's fix, on both seed blocks",
    "no effect": "the interval holds 0 (or lies within 1e-9 of the metric's scale), on both blocks",
    "harms": "candidate - unprotected excludes 0 against the fix's direction, on both blocks",
    FRAGILE: "the two seed blocks give different verdicts; a claim needs protects on both, so it fails",
    DOES_NOT_LEARN: f"the candidate gains less than {LEARNING_MARGIN:.0%} of DAPO's accuracy gain on "
    "the same seeds (on some block): no protection verdict, no share",
    "as fix": "candidate - fix lies within +-25% of the fix's own effect",
    "better / weaker": "candidate - fix excludes 0, in / against the fix's direction",
    "inconclusive": "candidate - fix neither excludes 0 nor lies within +-25% of the fix's effect",
}
"""Every verdict word of the check, defined (printed by ``--help`` and under the table)."""


def legend() -> str:
    """What every verdict word means (the table's footnote and ``dapo toy check --help``)."""
    return "\n".join(f"- *{word}*: {text}" for word, text in VERDICTS.items())


__all__ = ["DOES_NOT_LEARN", "FRAGILE", "LEARNING_MARGIN", "PROTECTS", "VERDICTS", "legend"]
