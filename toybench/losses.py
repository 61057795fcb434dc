"""The toy check's probes of a policy loss: does it act on the knobs it says it honours, and
does it keep the contract every policy loss must (finite, masked, the right sign). The loss
itself comes from the core's registry (:mod:`dapo.registry`: built-ins, verl's, TRL's and
users' losses), which this module re-exports for the toy regime's callers.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from dapo.loss import ClipAgg, window_denominator
from dapo.registry import Loss, LossSpecError, knob_values

# ---- the probes: the loss's knobs and its contract ---------------------------------------

PROBE_B, PROBE_T = 16, 8

Batch = tuple[Tensor, Tensor, Tensor, Tensor]


def _probe_batch() -> Batch:
    g = torch.Generator().manual_seed(20250317)
    old = -torch.rand(PROBE_B, PROBE_T, generator=g, dtype=torch.float64) * 3.0 - 0.05
    log_ratio = (torch.rand(PROBE_B, PROBE_T, generator=g, dtype=torch.float64) * 2 - 1) * 2.0
    adv = torch.randn(PROBE_B, generator=g, dtype=torch.float64)
    lengths = torch.arange(PROBE_B) % PROBE_T + 1  # every length from 1 to T
    mask = torch.arange(PROBE_T).unsqueeze(0) < lengths.unsqueeze(1)
    return old + log_ratio, old, adv, mask


class ProbeError(LossSpecError):
    """A loss whose output cannot be probed at all (no gradient, wrong type): refused."""


def _call(
    loss: Loss,
    knobs: dict[str, Any],
    batch: Batch | None = None,
    denominator: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[float, Tensor]:
    """The loss's value and d loss / d logp on ``batch`` (default: the knob probe's), called
    as the batched engine calls it (one leading run dimension)."""
    logp, old, adv, mask = batch if batch is not None else _probe_batch()
    logp = logp.clone().requires_grad_(True)
    weights = {} if is_weights is None else {"is_weights": is_weights.unsqueeze(0)}
    den = None if denominator is None else torch.tensor([denominator], dtype=torch.float64)
    clip = ClipAgg(
        knobs["eps_low"], knobs["eps_high"], knobs["clip_ratio_c"], knobs["loss_agg"], PROBE_T, den
    )
    value, _ = loss.fn(
        logp.unsqueeze(0), old.unsqueeze(0), adv.unsqueeze(0), mask.unsqueeze(0), clip, **weights
    )
    if not isinstance(value, Tensor) or not value.requires_grad:
        raise ProbeError(
            f"loss {loss.spec!r} returned a loss with no gradient with respect to logp "
            "(detached: .item(), .detach(), torch.no_grad or a new tensor built from its value)"
        )
    (grad,) = torch.autograd.grad(value.sum(), logp, allow_unused=True)
    if grad is None:
        grad = torch.zeros_like(logp)
    return float(value.detach().sum()), grad.detach().clone()


PROBE_VALUES: dict[str, tuple[Any, Any]] = {
    "eps_low": (0.1, 0.6),
    "eps_high": (0.1, 1.0),
    "clip_ratio_c": (None, 1.5),
    "loss_agg": ("token-mean", "seq-mean-token-mean"),
}
"""Two values of each knob, far enough apart to bind on the probe batch whatever the
loss's recipe (a sequence ratio, an absolute cap)."""


def _finite(value: float, grad: Tensor) -> bool:
    return math.isfinite(value) and bool(torch.isfinite(grad).all())


def _same(a: tuple[float, Tensor], b: tuple[float, Tensor], rtol: float = 1e-12, atol: float = 1e-15) -> bool:
    return math.isclose(a[0], b[0], rel_tol=rtol, abs_tol=atol) and torch.allclose(
        a[1], b[1], rtol=rtol, atol=atol
    )


def probe_knobs(loss: Loss, knobs: dict[str, Any] | None = None) -> dict[str, bool | None]:
    """For each knob of :data:`KNOBS`: does the loss's value or gradient change when the
    knob does? On a fixed batch (log-ratios spread over [-2, 2], advantages of both signs,
    every response length from 1 to T) where :func:`dapo.loss.policy_loss` changes with
    every one of them, at the two values of :data:`PROBE_VALUES`. ``False`` for a knob in
    ``loss.honours`` is a loss that ignores what it is given (a hard-coded clip, a fixed
    aggregation); ``None``: the loss is not finite at one of the two values, so nothing can
    be said (:func:`probe_contract` names it)."""
    knobs = knob_values(loss, knobs)
    out: dict[str, bool | None] = {}
    for knob, (v1, v2) in PROBE_VALUES.items():
        first = _call(loss, {**knobs, knob: v1})
        second = _call(loss, {**knobs, knob: v2})
        out[knob] = None if not (_finite(*first) and _finite(*second)) else not _same(first, second)
    return out


def uses_weights(loss: Loss, knobs: dict[str, Any] | None = None) -> bool:
    """Whether the loss takes off-policy importance weights and acts on them: it accepts
    ``is_weights`` and its value or gradient changes when the weights go from 1 to a
    spread of values on the probe batch (a loss with ``**kwargs`` may swallow them)."""
    from dapo.offpolicy import takes_weights

    if not takes_weights(loss.fn):
        return False
    knobs = knob_values(loss, knobs)
    _, _, _, mask = _probe_batch()
    ones = torch.ones(mask.shape, dtype=torch.float64)
    spread = torch.linspace(0.1, 2.0, mask.numel(), dtype=torch.float64).view(mask.shape)
    a, b = _call(loss, knobs, is_weights=ones), _call(loss, knobs, is_weights=spread)
    return not _same(a, b)


def probe_line(knob: str, readings: tuple[float, float] | None = None) -> str:
    """The failure line for a knob the loss honours but ignores: the probed values and what
    the loss read at each (:func:`knob_readings`)."""
    v1, v2 = PROBE_VALUES[knob]
    seen = f" (loss {readings[0]:.6g} at both)" if readings is not None else ""
    return (
        f"ignores {knob}: {knob}={v1!r} and {knob}={v2!r} give the same value{seen} and gradient on the "
        f"probe batch, where DAPO's loss changes with {knob}; the loss says it honours {knob}"
    )


def knob_readings(loss: Loss, knob: str, knobs: dict[str, Any] | None = None) -> tuple[float, float]:
    """The loss's value on the probe batch at the two values of ``knob`` (:data:`PROBE_VALUES`)."""
    knobs = knob_values(loss, knobs)
    v1, v2 = PROBE_VALUES[knob]
    return _call(loss, {**knobs, knob: v1})[0], _call(loss, {**knobs, knob: v2})[0]


def _with_empty_rows(batch: Batch, rows: tuple[int, ...]) -> Batch:
    logp, old, adv, mask = batch
    mask = mask.clone()
    mask[list(rows)] = False
    return logp, old, adv, mask


def _repadded(batch: Batch) -> Batch:
    """The same batch with other (finite, plausible) log-probs in every padding position."""
    logp, old, adv, mask = batch
    g = torch.Generator().manual_seed(7)
    junk_logp = -torch.rand(logp.shape, generator=g, dtype=logp.dtype) * 6.0 - 0.01
    junk_old = -torch.rand(logp.shape, generator=g, dtype=logp.dtype) * 6.0 - 0.01
    return torch.where(mask, logp, junk_logp), torch.where(mask, old, junk_old), adv, mask


def _one_token(advantage: float) -> Batch:
    logp = torch.full((1, 1), math.log(0.5), dtype=torch.float64)
    return (
        logp,
        logp.clone(),
        torch.tensor([advantage], dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.bool),
    )


def _dropped(loss: Loss, knobs: dict[str, Any], batch: Batch) -> str:
    """The first class of loss tokens that gets no gradient on every response it occurs in,
    at ratio 1 on ``batch`` (``""`` if none), in words naming what was measured: the class,
    how many responses, and the gradient there."""
    _, old, adv, mask = batch
    _, grad = _call(loss, knobs, (old.clone(), old, adv, mask))
    grad = grad[0] if grad.dim() == 3 else grad
    scale = float(grad.abs().max())
    if scale == 0.0:
        return (
            "d loss / d logp is 0 at every loss token of the probe batch at ratio 1: no gradient reaches any"
        )
    zero = (grad.abs() <= 1e-12 * scale) & mask
    lengths = mask.sum(-1)
    positions = torch.arange(mask.shape[1]).unsqueeze(0)
    classes: list[tuple[str, Tensor]] = [
        ("every token of the responses with a positive advantage", mask & (adv > 0).unsqueeze(1)),
        ("every token of the responses with a negative advantage", mask & (adv < 0).unsqueeze(1)),
    ]
    for k in range(mask.shape[1]):
        word = "last" if k == 0 else f"{_ordinal(k + 1)} from last"
        classes.append(
            (f"the {word} token of each response", mask & (positions == (lengths - 1 - k).unsqueeze(1)))
        )
        word = "first" if k == 0 else _ordinal(k + 1)
        classes.append((f"the {word} token of each response", mask & (positions == k)))
    for name, members in classes:
        n = int(members.any(-1).sum())
        if n >= 2 and bool(zero[members].all()):
            return (
                f"d loss / d logp is 0 at {name} ({n} responses, probe batch at ratio 1, lengths 1 to "
                f"{mask.shape[1]}): those tokens are in the mask but get no gradient"
            )
    return ""


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


CONTRACT = ("finite", "empty_rows", "fully_masked", "padding", "every_token", "gradient_sign", "dual_clip")
"""What every policy loss must satisfy, whatever its knobs (:func:`probe_contract`)."""


def probe_contract(loss: Loss, knobs: dict[str, Any] | None = None) -> dict[str, str]:
    """The loss's contract, at its own knobs; one named line per clause it breaks:

    * ``finite``: value and gradient finite on the knob probe's batch;
    * ``empty_rows``: ... and with some responses that have no loss token (overlong
      filtering, padding rows of a micro-batch);
    * ``fully_masked``: ... and on a micro-batch with no loss token at all (all its
      responses filtered) inside a window that has some, called as :func:`dapo.update.update`
      calls it, with the window's ``agg_denominator``: a mean must not divide 0 by 0;
    * ``padding``: value and gradient unchanged by what sits in padding positions (the
      engine's log-probs there are arbitrary);
    * ``every_token``: on the probe batch at ratio 1 (every response length from 1 to 8,
      advantages of both signs), the gradient reaches the loss tokens: no class of tokens
      gets d loss / d logp = 0 on every response it occurs in (:func:`_dropped`: all tokens
      of the responses with a positive, or a negative, advantage; the k-th token from the
      start, or from the end, of each response). A token masked out of the loss by mistake
      (a response's last token, EOS, dropped; a dual clip below 1 that flattens every
      negative advantage) is one such class; a loss that detaches a few tokens by design
      (Clip-Cov) is not;
    * ``gradient_sign``: on one token at ratio 1, a positive advantage raises that token's
      log-prob under gradient descent (d loss / d logp < 0) and a negative one lowers it:
      the loss is -J of Eq. 10, minimised;
    * ``dual_clip`` (a loss that honours ``clip_ratio_c``): the dual clip bounds the loss of
      negative-advantage tokens only (Ye et al. 2020; verl), so on a batch whose advantages
      are all positive ``clip_ratio_c`` = 1.5 and None give the same value and gradient.
    """
    knobs = knob_values(loss, knobs)
    base = _probe_batch()
    out: dict[str, str] = {}
    plain = _call(loss, knobs, base)
    if not _finite(*plain):
        out["finite"] = "not finite on a plain batch (log-ratios in [-2, 2], lengths 1 to 8)"
    empty = _call(loss, knobs, _with_empty_rows(base, (2, 9)))
    if not _finite(*empty):
        out["empty_rows"] = "not finite when some responses have no loss token (rows with an all-False mask)"
    logp, old, adv, mask = base
    window = float(window_denominator(mask, knobs["loss_agg"], PROBE_T))
    none = _call(loss, knobs, (logp, old, adv, torch.zeros_like(mask)), denominator=window)
    if not _finite(*none):
        out["fully_masked"] = (
            "not finite on a micro-batch with no loss token, given the window's agg_denominator "
            "(0 / 0 in a mean?)"
        )
    if "finite" not in out:
        other = _call(loss, knobs, _repadded(base))
        if not _finite(*other) or not _same(plain, other, rtol=1e-9, atol=1e-12):
            out["padding"] = (
                f"changes with what sits in padding positions (value {plain[0]:.6g} -> {other[0]:.6g}): "
                "the mask is not applied to the loss"
            )
    if "clip_ratio_c" in loss.honours and "finite" not in out:
        positive = (logp, old, adv.abs() + 0.1, mask)
        with_dual = _call(loss, {**knobs, "clip_ratio_c": 1.5}, positive)
        if not _same(
            _call(loss, {**knobs, "clip_ratio_c": None}, positive), with_dual, rtol=1e-9, atol=1e-12
        ):
            out["dual_clip"] = (
                "clip_ratio_c=1.5 changes the loss of a batch whose advantages are all positive: "
                "the dual clip must act on negative advantages only"
            )
    if "finite" not in out:
        dropped = _dropped(loss, knobs, base)
        if dropped:
            out["every_token"] = dropped
    for advantage, want in ((1.0, -1.0), (-1.0, 1.0)):
        value, grad = _call(loss, knobs, _one_token(advantage))
        g = float(grad.sum())
        if not (math.isfinite(g) and math.isfinite(value)):  # not a sign: say what it is
            out.setdefault(
                "finite",
                f"not finite on one token at ratio 1 with advantage {advantage:+g} "
                f"(loss {value:.3g}, d loss / d logp = {g:.3g})",
            )
            break
        if g * want > 0:
            continue
        if g == 0 and "every_token" in out:  # the same finding, measured there on every length
            break
        line = f"on one token at ratio 1 with advantage {advantage:+g}, d loss / d logp = {g:+.3g}"
        if g == 0:
            line += ": gradient descent would leave its log-prob where it is (no gradient reaches it)"
        else:
            effect = "lower" if g > 0 else "raise"
            line += f": gradient descent would {effect} its log-prob, against its advantage (-J must be minimised)"
        out["gradient_sign"] = line
        break
    return out
