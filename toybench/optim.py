"""The toy policies' optimizers: plain SGD (the experiments), and a step a loss's scale cannot
change (``dapo toy check``).

Plain SGD on a tabular policy moves the logits by ``lr x gradient``: a loss multiplied by a
constant ``c`` is the same loss at ``c`` times the learning rate, so under SGD a check would
judge the step size a loss happens to have, not what the loss does. The trainer
(``scale/``) uses AdamW, whose step ``m / (sqrt(v) + eps)`` is homogeneous of degree 0 in
the gradient: the constant cancels (up to ``eps``).

:class:`ScaleFreeSGD` keeps SGD's direction and takes AdamW's scale invariance, no more:

    v_t = beta * v_{t-1} + (1 - beta) * ||g_t||^2        (one scalar over every parameter)
    theta <- theta - lr * g_t / (sqrt(v_t / (1 - beta^t)) + eps)

With ``g -> c g`` for a constant ``c > 0``, ``v -> c^2 v`` and every step is the same. The
second moment is one scalar, not one per parameter as in AdamW: on a one-hot table,
per-parameter normalisation makes every visited logit move at the same speed, whatever its
gradient, a geometry the failure modes of the experiments were not designed in (an LLM's
parameters are shared between tokens); a scalar keeps every direction SGD's and only
takes the step's length from the loss's own gradient history. ``beta`` and ``eps`` are
``torch.optim.AdamW``'s defaults (``betas[1] = 0.999``, ``eps = 1e-8``), not fitted here.
A skipped step (non-finite loss or gradient) does not enter ``v``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

BETA = 0.999
"""Decay of the gradient's second moment: ``torch.optim.AdamW``'s default ``betas[1]``."""
EPS = 1e-8
"""Added to the root of the second moment: ``torch.optim.AdamW``'s default ``eps``."""

OPTIMIZERS = ("sgd", "scale_free")
"""``sgd``: plain SGD (the experiments); ``scale_free``: :class:`ScaleFreeSGD` (the check)."""


def squared_norm(grad: torch.Tensor) -> float:
    """``||grad||^2`` as :class:`ScaleFreeSGD` reads it (one kernel on the flattened tensor)."""
    return float(torch.linalg.vector_norm(grad.flatten()).double()) ** 2


def advance(
    v: torch.Tensor, t: torch.Tensor, sq: float, lr: float
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One step of the state: ``(v, t)`` after a gradient of squared norm ``sq``, and the step's
    factor ``lr / (sqrt(v / (1 - BETA^t)) + EPS)`` (:class:`ScaleFreeSGD` and the batched
    engine, per run, with the same arithmetic)."""
    t = t + 1
    v = BETA * v + (1.0 - BETA) * sq
    bias = 1.0 - torch.pow(torch.full_like(v, BETA), t)
    return v, t, float(lr / (torch.sqrt(v / bias) + EPS))


class ScaleFreeSGD(torch.optim.Optimizer):
    """SGD whose step length is normalised by the root mean square of the gradient's norm
    (module docstring): a constant factor on the loss does not change a step."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float):
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a positive number, got {lr}")
        super().__init__(params, {"lr": lr})
        if len(self.param_groups) != 1:
            raise ValueError(
                "ScaleFreeSGD takes one parameter group (its one second moment is over all of them)"
            )
        self.v = torch.zeros((), dtype=torch.float64)
        self.t = torch.zeros((), dtype=torch.float64)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[no-untyped-def, override]
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return None
        (group,) = self.param_groups
        self.v, self.t, factor = advance(self.v, self.t, sum(squared_norm(g) for g in grads), group["lr"])
        for p in group["params"]:
            if p.grad is not None:
                p.add_(p.grad, alpha=-factor)
        return None


def make(name: str, params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The optimizer ``name`` (one of :data:`OPTIMIZERS`) over ``params``."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "scale_free":
        return ScaleFreeSGD(params, lr)
    raise ValueError(f"optimizer {name!r}: choose from {', '.join(OPTIMIZERS)}")
