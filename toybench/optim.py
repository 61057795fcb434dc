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


def scale_free_factor(v: torch.Tensor, t: torch.Tensor, lr: float) -> torch.Tensor:
    """``lr / (sqrt(v / (1 - BETA^t)) + EPS)``, elementwise (the batched engine's per-run
    factor and :class:`ScaleFreeSGD`'s, with the same arithmetic)."""
    bias = 1.0 - torch.pow(torch.full_like(v, BETA), t)
    return lr / (torch.sqrt(v / bias) + EPS)


class ScaleFreeSGD(torch.optim.Optimizer):
    """SGD whose step length is normalised by the root mean square of the gradient's norm
    (module docstring): a constant factor on the loss does not change a step."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float):
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a positive number, got {lr}")
        super().__init__(params, {"lr": lr})
        self.v = torch.zeros((), dtype=torch.float64)
        self.t = torch.zeros((), dtype=torch.float64)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[no-untyped-def, override]
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return None
        sq = sum(float(torch.linalg.vector_norm(g.flatten()).double()) ** 2 for g in grads)
        self.t += 1
        self.v = BETA * self.v + (1.0 - BETA) * sq  # the batched engine repeats these ops per run
        for group in self.param_groups:
            factor = float(scale_free_factor(self.v, self.t, group["lr"]))
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
