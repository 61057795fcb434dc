"""Successor policy losses behind DAPO's loss interface, and the interface itself.

A *policy loss* is any callable with the signature of :func:`dapo.loss.policy_loss`::

    fn(logp, old_logp, advantages, mask, clip) -> (loss, stats)

``logp``/``old_logp``/``mask`` are [B, T] (or [..., B, T] for a loss that handles
leading run dimensions; wrap any other in :func:`per_run`), ``advantages`` [B] or
[B, T], ``clip`` the clip and aggregation settings (:class:`dapo.loss.ClipAgg`: ``eps_low``,
``eps_high``, ``clip_ratio_c``, ``agg``, ``norm_const`` and the window's ``denominator``),
and ``loss`` a scalar to minimise. A loss that takes off-policy weights also accepts
``is_weights=`` (:mod:`dapo.offpolicy`). Losses written against the keyword form used
before (``eps_low=..., agg_denominator=...`` instead of ``clip``) still run, adapted by
:func:`dapo.registry.as_policy_loss`. ``stats`` holds the keys of
:func:`dapo.loss.ratio_stats`; the four losses below return exactly those. Each cites the
equation it implements and matches verl 0.9.1's implementation of the same name on
values and gradients (``tests/test_losses.py``); where verl departs from its paper the
docstring says so.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor

from .loss import LOG_RATIO_CLAMP, ClipAgg, LossAndStats, Weights, check_shapes, loss_inputs, ratio_stats
from .offpolicy import takes_weights

GSPO_LOG_RATIO_MAX = 10.0
"""GSPO's log sequence ratio is clamped above before exponentiating (as verl)."""


class PolicyLossFn(Protocol):
    """The loss interface (see the module docstring)."""

    def __call__(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip: ClipAgg,
    ) -> LossAndStats: ...


def gspo_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip: ClipAgg
) -> LossAndStats:
    """GSPO (Zheng et al. 2025, arXiv:2507.18071): the clipped surrogate on the
    length-normalised *sequence* ratio (Eq. 5-7), in its GSPO-token form (Eq. 13-14)::

        s_i     = exp(mean_t (logp_it - old_logp_it))            (Eq. 7)
        s_it    = sg[s_i] * pi(y_it) / sg[pi(y_it)]              (Eq. 14)
        l_it    = max(-A_it s_it, -A_it clip(s_it, 1 - eps_low, 1 + eps_high))

    With a per-response advantage and ``seq-mean-token-mean`` (the paper's 1/G sum over
    responses of a per-response term) this is GSPO's gradient exactly; other ``agg`` modes
    reweight responses (verl allows them too). The paper clips at 3e-4 / 4e-4.
    ``clip_ratio_c`` is not used (no dual clip in GSPO). Leading run dimensions allowed.
    """
    mask, adv, old_logp = loss_inputs(logp, old_logp, advantages, mask)
    token_log_ratio = torch.where(mask, logp - old_logp, torch.zeros_like(logp))
    seq_log_ratio = token_log_ratio.sum(-1) / mask.sum(-1).clamp(min=1).to(logp.dtype)
    log_s = logp - logp.detach() + seq_log_ratio.detach().unsqueeze(-1)
    s = torch.exp(log_s.clamp(max=GSPO_LOG_RATIO_MAX))
    per_token = torch.maximum(-adv * s, -adv * s.clamp(1.0 - clip.eps_low, 1.0 + clip.eps_high))
    loss = clip.aggregate(per_token, mask)
    return loss, ratio_stats(logp, old_logp, adv, mask, clip)


def cispo_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip: ClipAgg
) -> LossAndStats:
    """CISPO (MiniMax-M1, arXiv:2506.13585, Eq. 4-5): clip the importance-sampling
    *weight* and detach it, so every token keeps a REINFORCE gradient::

        r_it = exp(clamp(logp_it - old_logp_it, -20, 20))
        l_it = -sg[clip(r_it, 1 - eps_low, 1 + eps_high)] * A_it * logp_it

    No token is dropped from the gradient, clipped or not (PPO's clip zeroes the gradient
    of a token beyond the bound). The paper aggregates by ``token-mean`` and sets no lower
    bound (a large eps_low). ``clip_ratio_c`` is not used. Leading run dimensions allowed.
    """
    mask, adv, old_logp = loss_inputs(logp, old_logp, advantages, mask)
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    weight = torch.exp(log_ratio).clamp(1.0 - clip.eps_low, 1.0 + clip.eps_high).detach()
    per_token = -weight * adv * logp
    loss = clip.aggregate(per_token, mask)
    stats = ratio_stats(logp, old_logp, adv, mask, clip, log_ratio=log_ratio)
    return loss, stats


def _token_cov(adv: Tensor, logp: Tensor, mask: Tensor) -> Tensor:
    """Per-token centred covariance term (A - mean A)(logp - mean logp), means over the
    batch's loss tokens (Cui et al. 2025, Eq. 12)."""
    m = mask.to(logp.dtype)
    n = m.sum().clamp(min=1)
    mean_a = (adv * m).sum() / n
    mean_lp = (logp.detach() * m).sum() / n
    return (adv - mean_a) * (logp.detach() - mean_lp)


def clip_cov_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip: ClipAgg,
    *,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
) -> LossAndStats:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning Language
    Models", arXiv:2505.22617, Eq. 12-13): entropy falls by the covariance of log-prob
    and advantage, so the gradient of a few high-covariance tokens is detached.

    Per token the PPO term of Eq. 10 (``max(-A r, -A clip(r))``); then, among loss tokens
    the clip did not already bound whose covariance term (:func:`_token_cov`) lies in
    ``(clip_cov_lb, clip_cov_ub)``, ``max(1, int(clip_cov_ratio * n_tokens))`` are drawn
    at random (``torch.randperm``, from ``generator`` or the global RNG as verl does) and
    their loss is multiplied by 0. One [B, T] batch: wrap in :func:`per_run` for runs.
    """
    mask, adv, old_logp = loss_inputs(logp, old_logp, advantages, mask)
    if logp.dim() != 2:
        raise ValueError("clip_cov_loss takes one [B, T] batch; wrap it in dapo.losses.per_run")
    if not clip_cov_ratio > 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    ratio = torch.exp(logp - old_logp)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip.eps_low, 1.0 + clip.eps_high)
    clipped_by_origin = (clipped > unclipped) & mask
    cov = _token_cov(adv, logp, mask)
    eligible = (cov > clip_cov_lb) & (cov < clip_cov_ub) & mask & ~clipped_by_origin
    n_pick = max(int(clip_cov_ratio * int(mask.sum())), 1)
    idx = eligible.nonzero()
    corr = torch.ones_like(logp)
    if len(idx) > 0:
        idx = idx[torch.randperm(len(idx), generator=generator)[: min(n_pick, len(idx))]]
        corr[idx[:, 0], idx[:, 1]] = 0.0
    per_token = torch.maximum(unclipped, clipped) * corr
    loss = clip.aggregate(per_token, mask)
    return loss, ratio_stats(logp, old_logp, adv, mask, clip)


def kl_cov_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip: ClipAgg,
    *,
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 0.1,
) -> LossAndStats:
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617, Eq. 14): no ratio clip at all; the
    ``max(1, int(kl_cov_ratio * n_tokens))`` loss tokens with the *largest* covariance
    term (:func:`_token_cov`) get a penalty ``ppo_kl_coef * |logp - old_logp|``::

        l_it = -A_it r_it  (+ ppo_kl_coef * |log r_it|  for the top-k tokens)

    ``eps_low``/``eps_high`` only feed the diagnostics. ``ppo_kl_coef`` defaults to
    verl's config default (0.1). One [B, T] batch: wrap in :func:`per_run` for runs.
    """
    mask, adv, old_logp = loss_inputs(logp, old_logp, advantages, mask)
    if logp.dim() != 2:
        raise ValueError("kl_cov_loss takes one [B, T] batch; wrap it in dapo.losses.per_run")
    if not kl_cov_ratio > 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    log_ratio = logp - old_logp
    per_token = -adv * torch.exp(log_ratio)
    n_valid = int(mask.sum())
    if n_valid > 0:
        cov = _token_cov(adv, logp, mask)[mask]
        k = max(1, int(n_valid * kl_cov_ratio))
        top = torch.topk(cov, k, largest=True).indices
        valid_idx = mask.reshape(-1).nonzero().squeeze(-1)[top]
        penalty = torch.zeros(per_token.numel(), dtype=per_token.dtype)
        penalty[valid_idx] = ppo_kl_coef
        per_token = per_token + penalty.view_as(per_token) * log_ratio.abs()
    loss = clip.aggregate(per_token, mask)
    return loss, ratio_stats(logp, old_logp, adv, mask, clip)


def per_run(fn: Callable[..., Any], vectorise: bool = True) -> Callable[..., LossAndStats]:
    """Lift a loss over one [B, T] batch to [..., B, T]: each leading index is one call of
    ``fn`` on its own batch, the losses and stats stacked into [...] (the gradient of their
    sum is each run's own).

    A loss that returns a bare tensor, or stats without :func:`dapo.loss.ratio_stats`'s
    keys, gets those keys measured on its inputs, once over all runs (outside the calls:
    the same per-run values, for a fraction of the cost). ``clip.denominator`` of shape [...] is
    handed out one value per call, and ``is_weights`` [..., B, T] (off-policy weights) one
    [B, T] slice per call.

    With ``vectorise`` the calls are made as one, through :func:`torch.func.vmap` (which
    keeps the one-batch semantics: every reduction in ``fn`` stays per run). The first
    call over runs also makes them one by one and compares loss, stats and the gradient
    with respect to ``logp``, bit for bit; a loss that ``vmap`` cannot run (``.item()``,
    Python branches on values, in-place writes into a fresh tensor, global randomness),
    on that batch or a later one, or whose result differs is made one call per run from
    then on, so either way each run gets what the one-by-one calls give it."""
    state: dict[str, bool | None] = {"vmap": None if vectorise else False}

    def one(
        lp: Tensor, old: Tensor, adv: Tensor, m: Tensor, den: Any, w: Tensor | None, clip: ClipAgg
    ) -> LossAndStats:
        extra = {} if w is None else {"is_weights": w}
        out = fn(lp, old, adv, m, clip.with_denominator(den), **extra)
        loss, stats = out if isinstance(out, tuple) else (out, {})
        if not isinstance(loss, Tensor) or loss.dim() != 0:
            raise TypeError(f"a policy loss must return a scalar tensor, got {type(loss).__name__}")
        return loss, {k: stats[k] for k in _STAT_KEYS if isinstance(stats, dict) and k in stats}

    def measured(flat: list[Tensor], clip: ClipAgg) -> dict[str, Tensor]:
        """:func:`ratio_stats` of every run at once, each run's values its own."""
        logp, old_logp, advantages, mask = flat
        return ratio_stats(logp, old_logp, advantages, mask, clip)

    def looped(flat: list[Tensor], den: Any, weights: Tensor | None, clip: ClipAgg) -> LossAndStats:
        n = flat[0].shape[0]
        dens = list(den) if isinstance(den, Tensor) and den.dim() > 0 else [den] * n
        ws: list[Tensor | None] = [None] * n if weights is None else list(weights)
        outs = [one(lp, old, adv, m, d, w, clip) for lp, old, adv, m, d, w in zip(*flat, dens, ws)]
        base = measured(flat, clip)
        return torch.stack([o[0] for o in outs]), {
            k: torch.stack([o[1].get(k, v[i]) for i, o in enumerate(outs)]) for k, v in base.items()
        }

    def mapped(flat: list[Tensor], den: Any, weights: Tensor | None, clip: ClipAgg) -> LossAndStats:
        den_dim = 0 if isinstance(den, Tensor) and den.dim() > 0 else None
        w_dim = None if weights is None else 0

        def call(lp: Tensor, old: Tensor, adv: Tensor, m: Tensor, d: Any, w: Tensor | None) -> LossAndStats:
            return one(lp, old, adv, m, d, w, clip)

        with warnings.catch_warnings():  # vmap's notes on slow fallbacks are not the user's business
            warnings.simplefilter("ignore")
            vm: Callable[..., LossAndStats] = torch.func.vmap(
                call, in_dims=(0, 0, 0, 0, den_dim, w_dim), randomness="error"
            )
            loss, own = vm(*flat, den, weights)
        return loss, {**measured(flat, clip), **own}

    def lifted(
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip: ClipAgg,
        *,
        is_weights: Weights = None,
    ) -> LossAndStats:
        check_shapes(logp, old_logp, mask)
        weights = is_weights
        if logp.dim() == 2:
            loss, own = one(logp, old_logp, advantages, mask, clip.denominator, weights, clip)
            return loss, {**measured([logp, old_logp, advantages, mask], clip), **own}
        lead = logp.shape[:-2]
        flat = [t.reshape(-1, *t.shape[len(lead) :]) for t in (logp, old_logp, advantages, mask)]
        den = clip.denominator
        if isinstance(den, Tensor) and den.dim() > 0:
            den = den.reshape(-1)
        w = None if weights is None else weights.reshape(-1, *weights.shape[len(lead) :])
        if state["vmap"] is False:
            loss, stats = looped(flat, den, w, clip)
        elif state["vmap"]:
            try:
                loss, stats = mapped(flat, den, w, clip)
            except Exception:  # a branch the first batch did not take: the loop, from now on
                state["vmap"] = False
                loss, stats = looped(flat, den, w, clip)
        else:  # the first call over runs: both ways, kept only if they agree bit for bit
            loss, stats = looped(flat, den, w, clip)
            state["vmap"] = _same_runs(lambda: mapped(flat, den, w, clip), (loss, stats), flat[0])
        return loss.reshape(lead), {k: v.reshape(lead) for k, v in stats.items()}

    if not takes_weights(fn):  # a lifted loss takes off-policy weights only where fn does

        def unweighted(
            logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip: ClipAgg
        ) -> LossAndStats:
            return lifted(logp, old_logp, advantages, mask, clip)

        return unweighted
    return lifted


_STAT_KEYS = tuple(
    ratio_stats(
        torch.zeros(1, 1),
        torch.zeros(1, 1),
        torch.zeros(1),
        torch.ones(1, 1, dtype=torch.bool),
        ClipAgg(0.0, 0.0),
    )
)
"""The keys of :func:`dapo.loss.ratio_stats` (taken from it, not restated): a lifted loss's own
stats under these names are kept, the rest measured."""


def _same_runs(attempt: Callable[[], LossAndStats], ref: LossAndStats, logp: Tensor) -> bool:
    """Whether ``attempt()`` (the vectorised calls) runs and gives ``ref`` (the calls one by
    one) exactly: losses, stats and the gradient of the losses' sum with respect to
    ``logp`` (NaN equal to NaN)."""
    try:
        loss, stats = attempt()
    except Exception:
        return False
    ref_loss, ref_stats = ref
    if stats.keys() != ref_stats.keys():
        return False
    pairs = [(loss, ref_loss)] + [(stats[k], ref_stats[k]) for k in stats]
    if logp.requires_grad and ref_loss.requires_grad:
        if not loss.requires_grad:
            return False
        try:
            (g,) = torch.autograd.grad(loss.sum(), logp, retain_graph=True, allow_unused=True)
            (g_ref,) = torch.autograd.grad(ref_loss.sum(), logp, retain_graph=True, allow_unused=True)
        except RuntimeError:
            return False
        if (g is None) != (g_ref is None):
            return False
        if g is not None and g_ref is not None:
            pairs.append((g, g_ref))
    return all(_identical(a.detach(), b.detach()) for a, b in pairs)


def _identical(a: Tensor, b: Tensor) -> bool:
    """Same shape, dtype and bits, NaN equal to NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()))


def seeded_by_batch(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn`` with the global torch RNG seeded from its inputs (and restored after).

    Clip-Cov draws its tokens with ``torch.randperm`` on the global RNG (verl does too); a
    seed taken from the batch makes a toy run reproducible and independent of which runs
    share its process."""

    @functools.wraps(fn)
    def seeded(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *a: Any, **kw: Any) -> Any:
        key = float((old_logp.detach().double() * mask).sum()) + 7.0 * float(mask.sum())
        seed = int(abs(key) * 1e6) % (2**31 - 1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return fn(logp, old_logp, advantages, mask, *a, **kw)

    return seeded
