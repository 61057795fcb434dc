"""Deliberately broken policy losses: `dapo toy check` and its knob probe must name each.

The first two look like DAPO's loss and take its knobs, but drop one of them silently."""

from __future__ import annotations

from dapo.loss import policy_loss


def symmetric_clip(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """Clip-Higher lost: the upper bound is hard-coded to the lower one."""
    return policy_loss(logp, old_logp, advantages, mask, eps_low=eps_low, eps_high=eps_low, **knobs)


def per_sequence(logp, old_logp, advantages, mask, *, agg="token-mean", agg_denominator=None, **knobs):
    """Token-level loss lost: every response is averaged on its own, whatever ``agg`` says."""
    return policy_loss(logp, old_logp, advantages, mask, agg="seq-mean-token-mean", **knobs)


def raises(logp, old_logp, advantages, mask, **knobs):
    """A loss that breaks on the toy's tensors."""
    raise RuntimeError("shape [16, 8] is invalid for this loss")


def not_scalar(logp, old_logp, advantages, mask, **knobs):
    """A loss that forgets to reduce."""
    return -(advantages.unsqueeze(-1) * logp)
