"""Copy this file into your project's tests to check your policy loss in CI (seconds, CPU).

Point LOSS at your function, ``package.module:function``, with the signature of
``dapo.loss.policy_loss`` (logp, old_logp, advantages, mask, clip) -> loss or (loss, stats),
``clip`` the clip and aggregation settings (``dapo.loss.ClipAgg``). A verl or TRL loss
is named ``verl:NAME`` / ``trl:LOSS_TYPE`` (install the peers first; see docs/how-to/bring-your-own-loss.md). Each
assertion runs the toy failure-mode experiment with your loss in place of the unprotected
arm's, on two disjoint blocks of paired seeds, and fails with a message naming what is
wrong: a broken contract (NaN on empty rows or fully masked micro-batches, padding that
changes the loss, a gradient of the wrong sign), a loss shown to learn too little (less than 0.82 of DAPO's accuracy gain) or skips
steps, a failure mode not protected against, or a knob your loss ignores. A loss that is
not meant to honour every knob says which it does: ``my_loss.dapo_knobs = ("eps_low",
"eps_high")`` (or ``assert_protects(..., knobs=[...])``).

Here LOSS is this project's own DAPO loss, so the file runs as it is in this repo's CI.
"""

import pytest

from toybench.check import assert_protects

LOSS = "dapo"  # e.g. "mypkg.losses:my_policy_loss", "verl:vanilla", "trl:dapo"


@pytest.mark.slow
def test_loss_keeps_entropy_up():
    """Clip-Higher's claim: the loss does not collapse entropy under repeated updates."""
    assert_protects(LOSS, "entropy_collapse")


@pytest.mark.slow
def test_loss_has_no_length_bias():
    """Token-level loss's claim: wrong answers do not drift longer than right ones."""
    assert_protects(LOSS, "length_bias")
