"""Losses for the check's metamorphic relations (tests/test_check_relations.py): a base loss
times a constant c, or plus a constant with no gradient. A verdict judges what a loss does,
so none of them may change one: under the trainer's AdamW (and the check's ScaleFreeSGD) a
constant factor does not change a step, and a constant term has no gradient at all.

Each name is ``<base>_x<c>`` (c with ``p`` for the point: ``x0p15`` is 0.15) or
``<base>_plus``; bases: ``dapo`` (:func:`dapo.loss.policy_loss`, run with the knobs the
check is given), and two peers' losses as their own code computes them (verl's
``geo_mean``, TRL's ``dr_grpo``)."""

from __future__ import annotations

from dapo.registry import resolve

FACTORS = (1.0, 0.15, 0.3, 2.0)
"""The constants the issue names (c in [0.15, 2]) and 1, the loss itself."""
SHIFT = 3.0
"""The gradient-free constant added to the loss."""

BASES = {"dapo": "dapo", "geo_mean": "verl:geo_mean", "dr_grpo": "trl:dr_grpo"}
"""Base name -> the registry spec its function comes from."""


def _name(c: float) -> str:
    return "x" + f"{c:g}".replace(".", "p")


def names(base: str) -> list[str]:
    """Every variant of ``base``: each factor, then the shifted loss."""
    return [f"{base}_{_name(c)}" for c in FACTORS] + [f"{base}_plus"]


def _variant(spec: str, c: float, shift: float):
    def fn(logp, old_logp, advantages, mask, clip, *, is_weights=None):
        weights = {} if is_weights is None else {"is_weights": is_weights}
        value, stats = resolve(spec).fn(logp, old_logp, advantages, mask, clip, **weights)
        return value * c + shift, stats

    return fn


for _base, _spec in BASES.items():
    for _c in FACTORS:
        globals()[f"{_base}_{_name(_c)}"] = _variant(_spec, _c, 0.0)
    globals()[f"{_base}_plus"] = _variant(_spec, 1.0, SHIFT)
