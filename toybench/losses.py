"""Policy losses by name, for the toy regime: this project's, verl's, TRL's and users'.

A *loss spec* names a loss and, optionally, its own parameters:

* a built-in name (:data:`BUILTIN`): ``dapo``, ``grpo``, ``dr_grpo``, ``gspo``, ``cispo``,
  ``clip_cov``, ``kl_cov``;
* ``verl:NAME``: verl's registered policy loss, called through verl's own
  ``get_policy_loss_fn`` (:mod:`toybench.peers`);
* ``trl:LOSS_TYPE``: TRL's ``GRPOTrainer._compute_loss`` for that ``loss_type``;
* ``module:function``: any importable function with :func:`dapo.loss.policy_loss`'s
  signature (:class:`dapo.losses.PolicyLossFn`).

Parameters follow in brackets: ``clip_cov[clip_cov_ratio=0.02]``. :func:`resolve` turns a
spec into a :class:`Loss`: a function over runs ([R, B, T], as the batched engine calls
it), the loss's own recipe for the clip and aggregation knobs, the knobs it says it acts
on, and the failure modes it claims to fix (each with the source of the claim).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dapo import losses as dl
from dapo.loss import policy_loss, window_denominator

from .loss_spec import CLIP_AGG, DAPO_KNOBS, Loss, LossSpecError, seeded_by_batch

KNOBS = ("eps_low", "eps_high", "clip_ratio_c", "loss_agg")
"""The :class:`~dapo.AlgoConfig` knobs a policy loss receives (``loss_agg`` arrives as
``agg``)."""

FAILURE_MODES = ("entropy_collapse", "zero_gradient", "length_bias", "truncation_noise")


@dataclass(frozen=True)
class _Entry:
    fn: Callable[..., Any]
    knobs: dict[str, Any]
    honours: tuple[str, ...]
    claims: tuple[str, ...]
    source: str
    batched: bool = True
    params: dict[str, Any] = field(default_factory=dict)


BUILTIN: dict[str, _Entry] = {
    "dapo": _Entry(
        policy_loss,
        DAPO_KNOBS,
        KNOBS,
        ("entropy_collapse", "length_bias"),
        "DAPO (Yu et al. 2025) Eq. 10 + 12: Clip-Higher 0.2/0.28, token-mean",
    ),
    "grpo": _Entry(
        policy_loss,
        {**DAPO_KNOBS, "eps_high": 0.2, "loss_agg": "seq-mean-token-mean"},
        KNOBS,
        (),
        "GRPO (Shao et al. 2024) Eq. 3: symmetric 0.2, per-response mean (the unprotected baseline)",
    ),
    "dr_grpo": _Entry(
        policy_loss,
        {**DAPO_KNOBS, "eps_high": 0.2, "loss_agg": "seq-mean-token-sum-norm"},
        KNOBS,
        ("length_bias",),
        "Dr. GRPO (Liu et al. 2025): per-response token sum / a constant (claims no length bias)",
    ),
    "gspo": _Entry(
        dl.gspo_loss,
        {**DAPO_KNOBS, "eps_low": 3e-4, "eps_high": 4e-4, "loss_agg": "seq-mean-token-mean"},
        CLIP_AGG,
        (),
        "GSPO (Zheng et al. 2025) Eq. 5-7, 13-14: sequence ratio clipped at 3e-4/4e-4 (claims stability)",
    ),
    "cispo": _Entry(
        dl.cispo_loss,
        {**DAPO_KNOBS, "eps_low": 0.99, "eps_high": 4.0},
        CLIP_AGG,
        ("entropy_collapse",),
        "CISPO (MiniMax-M1 2025) Eq. 4-5: detached IS weight capped at 5, no lower bound in effect; "
        "keeps the gradient of clipped rare tokens",
    ),
    "clip_cov": _Entry(
        dl.clip_cov_loss,
        {**DAPO_KNOBS, "eps_high": 0.2},
        CLIP_AGG,
        ("entropy_collapse",),
        "Clip-Cov (Cui et al. 2025) Eq. 12-13: detach the gradient of high-covariance tokens",
        batched=False,
    ),
    "kl_cov": _Entry(
        dl.kl_cov_loss,
        {**DAPO_KNOBS, "eps_high": 0.2},
        ("loss_agg",),
        ("entropy_collapse",),
        "KL-Cov (Cui et al. 2025) Eq. 14: KL penalty on the top-covariance tokens",
        batched=False,
    ),
}

_SPEC = re.compile(r"^(?P<name>[^\[\]]+?)(?:\[(?P<params>[^\[\]]*)\])?$")


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``name[k=v,...]`` -> (name, params); values parsed as numbers where they are."""
    m = _SPEC.match(spec.strip())
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


def _builtin(name: str, params: dict[str, Any], spec: str) -> Loss:
    e = BUILTIN[name]
    fn = e.fn
    if params:
        _check_params(fn, params, spec)
        fn = functools.partial(fn, **params)
    if name == "clip_cov":
        fn = seeded_by_batch(fn)
    if not e.batched:
        fn = dl.per_run(fn)
    return Loss(spec, fn, dict(e.knobs), e.honours, e.claims, e.source, params)


def _check_params(fn: Callable[..., Any], params: dict[str, Any], spec: str) -> None:
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY and p.name not in _INTERFACE]
    for key in params:
        if key not in {p.name for p in own}:
            known = ", ".join(p.name for p in own) or "none"
            raise LossSpecError(f"loss {spec!r}: unknown parameter {key!r} (its parameters: {known})")


_INTERFACE = ("eps_low", "eps_high", "clip_ratio_c", "agg", "agg_denominator", "norm_const")


def _user(name: str, params: dict[str, Any], spec: str) -> Loss:
    module, _, attr = name.partition(":")
    try:
        mod = importlib.import_module(module)
    except (Exception, SystemExit) as e:  # ImportError, and whatever else the module raises at import
        raise LossSpecError(f"loss {spec!r}: cannot import module {module!r} ({_one_line(e)})") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise LossSpecError(f"loss {spec!r}: module {module!r} has no function {attr!r}")
    _check_signature(fn, spec)
    honours = declared_knobs(fn, spec)
    if params:
        fn = functools.partial(fn, **params)
    return Loss(
        spec,
        _guarded(dl.per_run(fn), spec),
        dict(DAPO_KNOBS),
        honours,
        ("entropy_collapse", "length_bias"),
        f"user function {name}, run with DAPO's loss knobs (claims what DAPO's loss claims)",
        params,
    )


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if isinstance(e, SyntaxError) and e.lineno is not None:
        text = f"{e.msg} at {e.filename}:{e.lineno}"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _check_signature(fn: Callable[..., Any], spec: str) -> None:
    """The loss must take :class:`dapo.losses.PolicyLossFn`'s arguments: four positional
    (or ``*args``) and the interface's keywords (or ``**kwargs``)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    kinds = [p.kind for p in sig.parameters.values()]
    positional = sum(
        k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for k in kinds
    )
    if positional < 4 and inspect.Parameter.VAR_POSITIONAL not in kinds:
        raise LossSpecError(
            f"loss {spec!r}: takes fewer than 4 positional arguments "
            "(logp, old_logp, advantages, mask); see dapo.losses.PolicyLossFn"
        )
    if inspect.Parameter.VAR_KEYWORD not in kinds:
        missing = [k for k in _INTERFACE if k not in sig.parameters]
        if missing:
            raise LossSpecError(
                f"loss {spec!r}: lacks keyword argument(s) {', '.join(missing)} of dapo.losses.PolicyLossFn"
            )


KNOBS_ATTRIBUTE = "dapo_knobs"
"""A user's loss declares the knobs it honours as a function attribute,
``my_loss.dapo_knobs = ("eps_low", "eps_high")``; without it, every knob of :data:`KNOBS`
(what DAPO's loss honours). ``dapo toy check --knobs`` overrides both."""


def declared_knobs(fn: Callable[..., Any], spec: str) -> tuple[str, ...]:
    value = getattr(fn, KNOBS_ATTRIBUTE, None)
    if value is None:
        return KNOBS
    names = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if names is None or any(not isinstance(n, str) or n not in KNOBS for n in names):
        raise LossSpecError(
            f"loss {spec!r}: {KNOBS_ATTRIBUTE} = {value!r} must be a tuple of knob names from {', '.join(KNOBS)}"
        )
    return tuple(k for k in KNOBS if k in names)


def _guarded(fn: Callable[..., Any], spec: str) -> Callable[..., Any]:
    """A user's loss that raises on the toy's tensors is bad input, reported in one line."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise LossSpecError(f"loss {spec!r} raised on the toy batch: {type(e).__name__}: {e}") from None

    return call


@functools.cache
def resolve(spec: str) -> Loss:
    """The :class:`Loss` a spec names; :class:`LossSpecError` (one line) if none."""
    name, params = parse_spec(spec)
    if name in BUILTIN:
        return _builtin(name, params, spec)
    prefix, sep, rest = name.partition(":")
    if sep and prefix in ("verl", "trl"):
        from . import peers

        return peers.resolve(prefix, rest, params, spec)
    if sep and rest and re.fullmatch(r"[A-Za-z_][\w.]*", prefix) and rest.isidentifier():
        return _user(name, params, spec)
    raise LossSpecError(
        f"loss {spec!r}: not a built-in ({', '.join(BUILTIN)}), verl:NAME, trl:LOSS_TYPE or module:function"
    )


def knob_values(loss: Loss, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The loss's recipe with ``overrides`` applied, as :class:`~dapo.AlgoConfig` fields."""
    out = {**loss.knobs, **(overrides or {})}
    return {k: out[k] for k in KNOBS}


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
    value, _ = loss.fn(
        logp.unsqueeze(0),
        old.unsqueeze(0),
        adv.unsqueeze(0),
        mask.unsqueeze(0),
        eps_low=knobs["eps_low"],
        eps_high=knobs["eps_high"],
        clip_ratio_c=knobs["clip_ratio_c"],
        agg=knobs["loss_agg"],
        agg_denominator=None if denominator is None else torch.tensor([denominator], dtype=torch.float64),
        norm_const=PROBE_T,
        **weights,
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


CONTRACT = ("finite", "empty_rows", "fully_masked", "padding", "gradient_sign", "dual_clip")
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
        line = f"on one token at ratio 1 with advantage {advantage:+g}, d loss / d logp = {g:+.3g}"
        if math.isfinite(g):
            effect = (
                "leave its log-prob where it is"
                if g == 0
                else ("lower" if g > 0 else "raise") + " its log-prob"
            )
            line += f": gradient descent would {effect} (the loss must be -J, to minimise)"
        out["gradient_sign"] = line
        break
    return out
