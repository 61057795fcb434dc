"""What a loss spec is, before :mod:`dapo.registry` resolves one: its text (``NAME`` or
``NAME[key=value,...]``, parsed here with nothing heavy imported, so that a config checks
``algo.policy_loss``'s syntax without loading any loss), the :class:`Loss` record a
resolution gives, the knobs a loss receives and DAPO's recipe for them. Shared by the
registry and :mod:`dapo.peers`, which import nothing of each other at module level."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class LossSpecError(ValueError):
    """A loss spec that does not name a usable loss (one line, for the CLI)."""


_SPEC = re.compile(r"^(?P<name>[^\[\]]+?)(?:\[(?P<params>[^\[\]]*)\])?$")


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``name[k=v,...]`` -> (name, params); values parsed as numbers where they are."""
    m = _SPEC.match(spec.strip()) if isinstance(spec, str) else None
    if not m or not m.group("name").strip():
        raise LossSpecError(f"loss {spec!r}: expected NAME or NAME[key=value,...]")
    params: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in (m.group("params") or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise LossSpecError(f"loss {spec!r}: parameter {item!r} is not key=value")
        params[key.strip()] = _value(value.strip())
    return m.group("name").strip(), params


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            v = cast(text)
        except ValueError:
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise LossSpecError(f"loss parameter value {text!r} is not finite")
        return v
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


DAPO_KNOBS: dict[str, Any] = {
    "eps_low": 0.2,
    "eps_high": 0.28,
    "clip_ratio_c": None,
    "loss_agg": "token-mean",
}
"""DAPO's recipe (Section 4.1): Clip-Higher 0.2 / 0.28, token-mean, no dual clip."""

KNOBS = ("eps_low", "eps_high", "clip_ratio_c", "loss_agg")
"""The :class:`~dapo.AlgoConfig` knobs a policy loss receives (in :class:`~dapo.loss.ClipAgg`;
``loss_agg`` arrives as ``agg``)."""

CLIP_AGG = ("eps_low", "eps_high", "loss_agg")


@dataclass(frozen=True)
class Loss:
    """A resolved loss spec."""

    spec: str
    fn: Callable[..., Any]
    """The loss interface, over leading run dimensions (``fn(logp, old_logp, advantages,
    mask, clip)``; ``is_weights=`` where the loss takes off-policy weights)."""
    knobs: dict[str, Any]
    """The loss's recipe: values of :data:`KNOBS` it is meant to run with."""
    honours: tuple[str, ...]
    """Knobs it says it acts on; the toy check's knob probe flags each one it ignores."""
    claims: tuple[str, ...]
    """Failure modes (of :data:`FAILURE_MODES`) it claims to protect against."""
    source: str
    """Where the loss and its claims come from."""
    params: dict[str, Any] = field(default_factory=dict)
    origin: Any = None
    """What :func:`source_hash` reads: the function (a user's), or the module that defines it."""
