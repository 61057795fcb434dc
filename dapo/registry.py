"""Policy losses by name: one registry for every caller (``dapo toy check``, the toy suite,
``dapo train`` in both placements, the gate).

A *loss spec* names a loss and, optionally, its own parameters:

* a built-in name (:data:`BUILTIN`): ``dapo``, ``grpo``, ``dr_grpo``, ``gspo``, ``cispo``,
  ``clip_cov``, ``kl_cov``;
* ``verl:NAME``: verl's registered policy loss, called through verl's own
  ``get_policy_loss_fn`` (:mod:`dapo.peers`; the ``peers`` extra);
* ``trl:LOSS_TYPE``: TRL's ``GRPOTrainer._compute_loss`` for that ``loss_type``;
* ``module:function``: any importable function with the loss interface
  (:class:`dapo.losses.PolicyLossFn`), or the keyword form used before it
  (:func:`as_policy_loss`).

Parameters follow in brackets: ``clip_cov[clip_cov_ratio=0.02]``. :func:`resolve` turns a
spec into a :class:`Loss`: a function over runs ([R, B, T], as the toy engine calls it; a
trainer's [B, T] call is the one-run case), the loss's own recipe for the clip and
aggregation knobs, the knobs it says it acts on, the failure modes it claims to fix (each
with the source of the claim), and a hash of its source (:func:`source_hash`, what the toy
gate records). verl does the same by name in its core (``actor.policy_loss.loss_mode``,
``@register_policy_loss``) with no check in front of it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from . import losses as dl
from .loss import ClipAgg, policy_loss
from .loss_spec import CLIP_AGG, DAPO_KNOBS, KNOBS, Loss, LossSpecError, parse_spec
from .losses import seeded_by_batch

FAILURE_MODES = ("entropy_collapse", "zero_gradient", "length_bias", "truncation_noise")

DEFAULT = "dapo"
"""The loss of a config that names none (``algo.policy_loss``)."""


@dataclass(frozen=True)
class _Entry:
    fn: Callable[..., Any]
    knobs: dict[str, Any]
    honours: tuple[str, ...]
    claims: tuple[str, ...]
    source: str
    batched: bool = True


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
    return Loss(spec, fn, dict(e.knobs), e.honours, e.claims, e.source, params, sys.modules[e.fn.__module__])


def _check_params(fn: Callable[..., Any], params: dict[str, Any], spec: str) -> None:
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY and p.name not in _LEGACY]
    for key in params:
        if key not in {p.name for p in own}:
            known = ", ".join(p.name for p in own) or "none"
            raise LossSpecError(f"loss {spec!r}: unknown parameter {key!r} (its parameters: {known})")


_LEGACY = tuple(ClipAgg(0.0, 0.0).keywords())
"""The keyword form of the interface before :class:`~dapo.loss.ClipAgg` (still accepted)."""


def as_policy_loss(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` behind the loss interface ``fn(logp, old_logp, advantages, mask, clip)``.

    A function with a parameter named ``clip`` is that interface already. One without it is
    the keyword form documented before: it is called with ``clip``'s
    :meth:`~dapo.loss.ClipAgg.keywords` (and ``is_weights=`` where it takes it: :func:`dapo.offpolicy.takes_weights` sees the
    function's own signature)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn
    if "clip" in params:
        return fn

    @functools.wraps(fn)
    def keywords(
        logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip: ClipAgg, **kw: Any
    ) -> Any:
        return fn(logp, old_logp, advantages, mask, **clip.keywords(), **kw)

    return keywords


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
    origin = fn
    fn = as_policy_loss(fn)
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
        origin,
    )


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if isinstance(e, SyntaxError) and e.lineno is not None:
        text = f"{e.msg} at {e.filename}:{e.lineno}"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _check_signature(fn: Callable[..., Any], spec: str) -> None:
    """The loss must take :class:`dapo.losses.PolicyLossFn`'s arguments: four positional
    (or ``*args``) and ``clip``, or the keyword form's keywords (or ``**kwargs``)."""
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
    if "clip" in sig.parameters:
        return
    if inspect.Parameter.VAR_KEYWORD not in kinds:
        missing = [k for k in _LEGACY if k not in sig.parameters]
        if missing:
            raise LossSpecError(
                f"loss {spec!r}: takes no clip argument (dapo.loss.ClipAgg) and lacks the keyword "
                f"argument(s) {', '.join(missing)} of the keyword form; see dapo.losses.PolicyLossFn"
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
    """A user's loss that raises is bad input, reported in one line that names it."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise LossSpecError(f"loss {spec!r} raised: {type(e).__name__}: {e}") from None

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


def source_hash(loss: Loss) -> str:
    """A hash of what the loss runs: the source of the module that defines it (the whole
    module: a helper it calls is part of the loss) and of the function, with the spec's
    parameters. The toy gate records it beside the check's verdicts, so an edit of the loss
    after its check is seen. A module with no readable source (a compiled extension) is
    hashed by its file's bytes; with neither, by its name and version."""
    origin = loss.origin
    module = inspect.getmodule(origin) if origin is not None else None
    h = hashlib.sha256(loss.spec.encode())
    for obj in (module, origin if not inspect.ismodule(origin) else None):
        if obj is None:
            continue
        try:
            h.update(inspect.getsource(obj).encode())
            continue
        except (OSError, TypeError):
            pass
        path = getattr(obj, "__file__", None)
        try:
            h.update(Path(path).read_bytes() if path else b"")
        except OSError:
            h.update(f"{getattr(obj, '__name__', '?')}:{getattr(obj, '__version__', '?')}".encode())
    return h.hexdigest()[:16]


def of_config(algo: Any) -> Loss:
    """The loss ``algo.policy_loss`` names (an :class:`~dapo.AlgoConfig`), resolved as every
    caller resolves it (``dapo train`` in both placements, ``dapo toy check --config``, the
    gate); :class:`LossSpecError` names the field. A ``module:function`` is looked up from the
    current directory too, as ``dapo toy check`` and pytest do. With ``algo.tis_cap`` set, the
    loss must take the importance weights (``is_weights``), or it is refused here, before a
    model is built, rather than at the first step."""
    from .offpolicy import takes_weights

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        loss = resolve(algo.policy_loss)
    except LossSpecError as e:
        raise LossSpecError(f"algo.policy_loss: {e}") from None
    if algo.tis_cap is not None and not takes_weights(loss.fn):
        raise LossSpecError(
            f"algo.policy_loss: loss {loss.spec!r} takes no is_weights keyword, so the importance "
            f"weights of algo.tis_cap={algo.tis_cap} cannot reach it; add the keyword (multiply it "
            "into the per-token loss) or set algo.tis_cap=null"
        )
    return loss
