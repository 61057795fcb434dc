"""What a resolved loss is, shared by :mod:`toybench.losses` (the built-ins, users' losses, the
probes) and :mod:`toybench.peers` (verl's and TRL's): the :class:`Loss` record, the spec error,
the DAPO recipe and the batch-seeded wrapper. Imports nothing of either, so that the two do
not import each other."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

DAPO_KNOBS: dict[str, Any] = {
    "eps_low": 0.2,
    "eps_high": 0.28,
    "clip_ratio_c": None,
    "loss_agg": "token-mean",
}


class LossSpecError(ValueError):
    """A loss spec that does not name a usable loss (one line, for the CLI)."""


@dataclass(frozen=True)
class Loss:
    """A resolved loss spec."""

    spec: str
    fn: Callable[..., tuple[Tensor, dict[str, Tensor]]]
    """Called as the batched engine calls :func:`dapo.loss.policy_loss` (leading run dims)."""
    knobs: dict[str, Any]
    """The loss's recipe: values of :data:`toybench.losses.KNOBS` it is meant to run with."""
    honours: tuple[str, ...]
    """Knobs it says it acts on; the knob probe flags each one it ignores."""
    claims: tuple[str, ...]
    """Failure modes (of :data:`toybench.losses.FAILURE_MODES`) it claims to protect against."""
    source: str
    """Where the loss and its claims come from."""
    params: dict[str, Any] = field(default_factory=dict)


CLIP_AGG = ("eps_low", "eps_high", "loss_agg")


def seeded_by_batch(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn`` with the global torch RNG seeded from its inputs (and restored after).

    Clip-Cov draws its tokens with ``torch.randperm`` on the global RNG (verl does too); a
    seed taken from the batch makes a toy run reproducible and independent of which runs
    share its process."""

    @functools.wraps(fn)
    def seeded(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, **kw: Any) -> Any:
        key = float((old_logp.detach().double() * mask).sum()) + 7.0 * float(mask.sum())
        seed = int(abs(key) * 1e6) % (2**31 - 1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return fn(logp, old_logp, advantages, mask, **kw)

    return seeded
