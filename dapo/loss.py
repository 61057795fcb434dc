"""The clipped surrogate of DAPO (Eq. 8/10) and its aggregation modes (off-policy weights:
:mod:`dapo.offpolicy`).

Everything here is a pure function of tensors. The loss is returned as a quantity to
*minimise* (the negative of the paper's objective J).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import Tensor

from .config import AGG_MODES

LossAndStats = tuple[Tensor, dict[str, Tensor]]
"""What a policy loss returns: the scalar loss (one per run with leading run dimensions) and
its detached statistics (:func:`ratio_stats`'s keys)."""

Weights = Tensor | None
"""Off-policy importance weights of a loss's tokens (:mod:`dapo.offpolicy`), or none."""

LOG_RATIO_CLAMP = 20.0
"""|log r| is clamped before exponentiating so a wild token cannot overflow (as verl)."""


@dataclasses.dataclass(frozen=True)
class ClipAgg:
    """The clip and aggregation settings every policy loss receives, as one object (the
    fifth argument of the loss interface, :class:`dapo.losses.PolicyLossFn`)."""

    eps_low: float
    """Lower clip: the token ratio is clipped at ``1 - eps_low`` (Eq. 10)."""
    eps_high: float
    """Upper clip: ``1 + eps_high`` (Eq. 10; Clip-Higher raises it above ``eps_low``)."""
    clip_ratio_c: float | None = None
    """Dual clip for negative advantages (Ye et al. 2020); ``None``: none."""
    agg: str = "token-mean"
    """How per-token losses are reduced (:func:`aggregate`; Eq. 12 for ``token-mean``)."""
    norm_const: float | None = None
    """The constant of ``seq-mean-token-sum-norm`` (Dr. GRPO)."""
    denominator: Tensor | float | None = None
    """The optimizer-step window's normaliser (:func:`window_denominator`, summed over ranks),
    the same for every micro-batch of the window; ``None``: this batch's own. One value per
    run ([...]) when the tensors have leading run dimensions."""

    @classmethod
    def of(cls, cfg: Any, denominator: Tensor | float | None = None) -> ClipAgg:
        """The settings of an :class:`~dapo.AlgoConfig` (or any object with its knobs)."""
        return cls(cfg.eps_low, cfg.eps_high, cfg.clip_ratio_c, cfg.loss_agg, cfg.norm_const, denominator)

    @classmethod
    def from_keywords(
        cls,
        *,
        eps_low: float,
        eps_high: float,
        clip_ratio_c: float | None = None,
        agg: str = "token-mean",
        agg_denominator: Tensor | float | None = None,
        norm_const: float | None = None,
    ) -> ClipAgg:
        """The settings from the keyword form of the loss interface used before this object
        (``agg_denominator`` is :attr:`denominator`); :meth:`keywords` is the reverse."""
        return cls(eps_low, eps_high, clip_ratio_c, agg, norm_const, agg_denominator)

    def keywords(self) -> dict[str, Any]:
        """These settings as the keyword form's arguments (:meth:`from_keywords`)."""
        return {
            "eps_low": self.eps_low,
            "eps_high": self.eps_high,
            "clip_ratio_c": self.clip_ratio_c,
            "agg": self.agg,
            "agg_denominator": self.denominator,
            "norm_const": self.norm_const,
        }

    def with_denominator(self, denominator: Tensor | float | None) -> ClipAgg:
        return dataclasses.replace(self, denominator=denominator)

    def aggregate(self, loss_mat: Tensor, mask: Tensor) -> Tensor:
        """:func:`aggregate` of per-token losses by these settings."""
        return aggregate(loss_mat, mask, self.agg, denominator=self.denominator, norm_const=self.norm_const)


def _check_agg(agg: str) -> None:
    if agg not in AGG_MODES:
        raise ValueError(f"agg must be one of {AGG_MODES}, got {agg!r}")


def window_denominator(mask: Tensor, agg: str, norm_const: float | None = None) -> Tensor:
    """The normaliser of ``agg`` over a whole optimizer-step window given its loss mask.

    * ``token-mean``: the number of loss tokens (Eq. 12's sum of |o_i|);
    * ``seq-mean-token-mean``: the number of responses with at least one loss token
      (Eq. 5's G, summed over the window's groups);
    * ``seq-mean-token-sum-norm``: that response count times ``norm_const``.

    Responses with no loss token (e.g. removed by overlong filtering) are not counted.
    ``mask`` is [B, T], or [..., B, T] for independent runs (one normaliser each).
    Pass the value to :func:`policy_loss` as ``agg_denominator`` for every micro-batch of
    the window (summed over ranks under data parallelism) and the summed micro-batch
    losses equal the full-window loss exactly.
    """
    _check_agg(agg)
    mask = mask.bool()
    if agg == "token-mean":
        return mask.sum((-2, -1)).to(torch.float64)
    n_seq = mask.any(dim=-1).sum(-1).to(torch.float64)
    if agg == "seq-mean-token-mean":
        return n_seq
    if norm_const is None or not norm_const > 0:
        raise ValueError("seq-mean-token-sum-norm needs norm_const > 0")
    return n_seq * float(norm_const)


def aggregate(
    loss_mat: Tensor,
    mask: Tensor,
    agg: str,
    *,
    denominator: Tensor | float | None = None,
    norm_const: float | None = None,
) -> Tensor:
    """Reduce per-token losses [B, T] to a scalar ([..., B, T] to one value per run, with
    ``denominator`` a scalar or [...]).

    The numerator is the sum of per-token losses (``token-mean`` and
    ``seq-mean-token-sum-norm``) or the sum of per-response token means
    (``seq-mean-token-mean``); it is divided by ``denominator``, by default
    :func:`window_denominator` of this ``mask``. An empty mask gives a zero loss that is
    still connected to the graph.
    """
    _check_agg(agg)
    mask = mask.bool()
    # where(), not multiplication: padding may hold inf/nan and 0 * inf is nan.
    masked = torch.where(mask, loss_mat, torch.zeros_like(loss_mat))
    if agg == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1).to(loss_mat.dtype)
        numerator = per_seq.sum(-1)
    else:
        numerator = masked.sum((-2, -1))
    if denominator is None:
        denominator = window_denominator(mask, agg, norm_const)
    denominator = torch.as_tensor(denominator, dtype=torch.float64, device=loss_mat.device)
    # one normaliser (or one per run); a window with no loss token gets a zero loss (a safe
    # divisor keeps 0/0 out of the backward pass). A where() and no branch on the value, so
    # that the loss also runs under torch.func.vmap (dapo.losses.per_run); the values and the
    # gradient are those of the branch (x + 0.0 is x)
    positive = denominator > 0
    safe = torch.where(positive, denominator, torch.ones_like(denominator)).to(loss_mat.dtype)
    return torch.where(positive, numerator / safe, numerator * 0.0)


def check_shapes(logp: Tensor, old_logp: Tensor, mask: Tensor) -> None:
    """The three per-token inputs of a policy loss must share one shape."""
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(
            f"shape mismatch: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, "
            f"mask {tuple(mask.shape)}"
        )


def loss_inputs(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """What every policy loss starts from: the shapes checked, then ``(mask as bool, the
    advantages per token (:func:`token_advantages`), old_logp detached)``."""
    check_shapes(logp, old_logp, mask)
    return mask.bool(), token_advantages(advantages, logp), old_logp.detach()


def token_advantages(advantages: Tensor, logp: Tensor) -> Tensor:
    """Advantages [..., B] (one per response, broadcast over its tokens) or [..., B, T] as
    [..., B, T] in ``logp``'s dtype."""
    adv = advantages.to(logp.dtype)
    if adv.shape == logp.shape[:-1]:
        adv = adv.unsqueeze(-1).expand_as(logp)
    if adv.shape != logp.shape:
        raise ValueError(
            f"advantages shape {tuple(advantages.shape)} fits neither [B] nor [B, T] = {tuple(logp.shape)}"
        )
    return adv


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip: ClipAgg,
    *,
    is_weights: Weights = None,
) -> LossAndStats:
    """The decoupled-clip surrogate of Eq. 10, as a loss to minimise.

    Per token, with r = exp(logp - old_logp) and A the advantage (Eq. 9)::

        l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
        l = min(l, -A clip_ratio_c)      if A < 0 and clip_ratio_c (dual clip)
        l = l * w                        if is_weights (TIS, detached)

    with ``eps_low``, ``eps_high`` and ``clip_ratio_c`` from ``clip``, then :func:`aggregate` by
    ``clip.agg`` with ``clip.denominator`` (default: this batch's own :func:`window_denominator`). A token whose ratio is beyond the clip bound on the side
    of its advantage gets exactly zero gradient; inside the region the gradient is the
    unclipped one.

    ``advantages`` is [B] (broadcast over tokens) or [B, T]. Leading dimensions
    ([..., B, T], advantages [..., B]) index independent runs: the loss and every statistic
    are then one value per run, each run with its own normaliser (``clip.denominator``
    [...]); the gradient of their sum is each run's own gradient. ``mask`` is the *loss* mask
    (response tokens, minus filtered responses). Returns the scalar loss and detached
    statistics over the masked tokens: ``clipfrac_upper`` (A > 0, r > 1 + eps_high),
    ``clipfrac_lower`` (A < 0, r < 1 - eps_low), ``dual_clipfrac``, ``upclip_old_prob``
    (mean pi_old of up-clipped tokens; NaN if none: the paper's Fig. 3a), ``approx_kl``
    (k3 estimate of KL(pi_old || pi)), ``ratio_mean``, with weights ``n_tokens`` and
    ``n_upclip`` for combining micro-batches.
    """
    _check_agg(clip.agg)
    mask, adv, old_logp = loss_inputs(logp, old_logp, advantages, mask)
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip.eps_low, 1.0 + clip.eps_high)
    per_token = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(mask)
    if clip.clip_ratio_c is not None:
        bound = -adv * clip.clip_ratio_c
        dual = (adv < 0) & (per_token > bound)
        per_token = torch.where(dual, bound, per_token)
    if is_weights is not None:
        per_token = per_token * is_weights.detach().to(per_token.dtype)
    loss = clip.aggregate(per_token, mask)
    stats = ratio_stats(logp, old_logp, adv, mask, clip, dual=dual, log_ratio=log_ratio, ratio=ratio)
    return loss, stats


def ratio_stats(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip: ClipAgg,
    *,
    dual: Tensor | None = None,
    log_ratio: Tensor | None = None,
    ratio: Tensor | None = None,
) -> dict[str, Tensor]:
    """The detached token statistics of :func:`policy_loss`, for any policy loss.

    Measured on the token ratio ``r = exp(logp - old_logp)`` against the clip range
    ``[1 - clip.eps_low, 1 + clip.eps_high]`` whatever the loss does with it (a loss that clips a
    sequence-level ratio, or none, still gets the token-level diagnostics of Eq. 10):
    ``clipfrac_upper``, ``clipfrac_lower``, ``dual_clipfrac`` (from ``dual``, the tokens
    a dual clip capped; zero when None), ``upclip_old_prob``, ``approx_kl``,
    ``ratio_mean``, ``n_tokens`` and ``n_upclip``. Shapes as in :func:`policy_loss`;
    ``log_ratio`` (the clamped ``logp - old_logp``) and ``ratio`` (its exp), when the
    caller has them, save their recomputation (this runs per micro-batch)."""
    mask = mask.bool()
    adv = token_advantages(advantages, logp)
    if dual is None:
        dual = torch.zeros_like(mask)
    with torch.no_grad():
        if log_ratio is None:
            log_ratio = torch.clamp(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        log_ratio = log_ratio.detach()
        old = old_logp.detach()
        ratio = torch.exp(log_ratio) if ratio is None else ratio.detach()
        # one stacked reduction instead of one per statistic (this runs per micro-batch)
        up = mask & (adv > 0) & (ratio > 1.0 + clip.eps_high)
        low = mask & (adv < 0) & (ratio < 1.0 - clip.eps_low)
        m = mask.to(torch.float64)
        rows = (
            torch.stack(
                [
                    m,
                    up.to(torch.float64),
                    low.to(torch.float64),
                    (dual & mask).to(torch.float64),
                    torch.where(up, old, torch.full_like(old, -math.inf)).exp().to(torch.float64),
                    torch.where(mask, ratio - 1.0 - log_ratio, torch.zeros_like(ratio)).to(torch.float64),
                    torch.where(mask, ratio, torch.zeros_like(ratio)).to(torch.float64),
                ]
            )
            .flatten(-2)
            .sum(-1)
        )
        n, n_up = rows[0], rows[1]
        nf = n.clamp(min=1)
        stats = {
            "clipfrac_upper": n_up / nf,
            "clipfrac_lower": rows[2] / nf,
            "dual_clipfrac": rows[3] / nf,
            "upclip_old_prob": torch.where(
                n_up > 0, rows[4] / n_up.clamp(min=1), torch.full_like(n_up, math.nan)
            ),
            "approx_kl": rows[5] / nf,
            "ratio_mean": rows[6] / nf,
            "n_tokens": n,
            "n_upclip": n_up,
        }
    return stats
