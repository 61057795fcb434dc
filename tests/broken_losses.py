"""Deliberately broken policy losses: `dapo toy check` and its knob probe must name each.

Both look like DAPO's loss and take its knobs, but drop one of them silently."""

from __future__ import annotations

from dapo.loss import policy_loss


def symmetric_clip(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    eps_low,
    eps_high,
    clip_ratio_c=None,
    agg="token-mean",
    agg_denominator=None,
    norm_const=None,
):
    """Clip-Higher lost: the upper bound is hard-coded to the lower one."""
    return policy_loss(
        logp,
        old_logp,
        advantages,
        mask,
        eps_low=eps_low,
        eps_high=eps_low,
        clip_ratio_c=clip_ratio_c,
        agg=agg,
        agg_denominator=agg_denominator,
        norm_const=norm_const,
    )


def per_sequence(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    eps_low,
    eps_high,
    clip_ratio_c=None,
    agg="token-mean",
    agg_denominator=None,
    norm_const=None,
):
    """Token-level loss lost: every response is averaged on its own, whatever ``agg`` says."""
    return policy_loss(
        logp,
        old_logp,
        advantages,
        mask,
        eps_low=eps_low,
        eps_high=eps_high,
        clip_ratio_c=clip_ratio_c,
        agg="seq-mean-token-mean",
        norm_const=norm_const,
    )


def raises(logp, old_logp, advantages, mask, **knobs):
    """A loss that breaks on the toy's tensors."""
    raise RuntimeError("shape [16, 8] is invalid for this loss")


def not_scalar(logp, old_logp, advantages, mask, **knobs):
    """A loss that forgets to reduce."""
    return -(advantages.unsqueeze(-1) * logp)
