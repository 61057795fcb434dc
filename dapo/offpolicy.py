"""Off-policy corrections: training on tokens a different policy sampled.

Three policies meet in an asynchronous or mixed-precision run: the *behaviour* policy
``mu`` that sampled each token (the rollout engine's weights, possibly ``k`` optimizer
steps old, in its own precision; ``RolloutBatch.rollout_logp``), the *proximal* policy
``pi_old`` the trainer recomputes at the start of the step (``RolloutBatch.old_logp``),
and the policy being optimised ``pi``. The clipped surrogate (Eq. 10) is a trust region
around ``pi_old``; these functions correct for ``mu != pi_old``, token by token, with the
per-token log ratio ``log rho_t = log pi_old(y_t) - log mu(y_t)``. This is verl's
*decoupled* mode (``verl/trainer/ppo/rollout_corr_helper.py``, 0.9.1) and AReaL's
decoupled PPO (Fu et al. 2025, arXiv:2505.24298, Eq. 5)::

    J = E_mu[ w_t * min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t) ],
        r_t = pi(y_t) / pi_old(y_t),   w_t = a function of rho_t (below), detached

Weights (``AlgoConfig.tis_cap``, ``is_level``, ``is_lower``), equal to verl's
``compute_rollout_correction_weights``:

* token TIS:  ``w_t = min(rho_t, C)``;
* sequence TIS: ``w_t = min(prod_t rho_t, C)`` for every token of the response;
* with a band ``[lower, C]`` (IcePop, MIS): the weight is ``rho`` inside the band and 0
  outside it instead of truncated; ``lower = 0`` is AReaL's ``behav_imp_weight_cap``
  (tokens whose weight exceeds the cap are dropped; verl requires ``lower > 0``).

Rejection (``AlgoConfig.rejection``/``rejection_threshold``), equal to verl's
``compute_rollout_rejection_mask``: tokens or whole responses whose divergence estimate
leaves its bound leave the loss mask (and so the normaliser). With ``k1 = -log rho``,
``k2 = (log rho)^2 / 2``, ``k3 = rho - 1 - log rho``: ``token_k{1,2,3}``,
``seq_sum_k{1,2,3}`` (sum over the response), ``seq_mean_k{1,2,3}`` (mean: ``seq_mean_k1``
is the geometric-mean ratio test), ``seq_max_k{2,3}``. ``k1`` options take a ratio band
``"lower_upper"`` (one number ``u`` means ``1/u_u``) and compare ``k1`` with the logs of
its bounds, as verl does, so the band keeps ``rho`` in ``[1/upper, 1/lower]`` (the same
band when it is symmetric in log, as verl's presets are); the others take an upper bound.

``AlgoConfig.behaviour_clip`` is verl's *bypass* mode (``bypass_ppo_clip``): the ratio is
taken against ``mu`` itself (``old_logp := rollout_logp``), so the clip is the only
correction; it takes no weights and no rejection.

Everything here is a pure function of tensors with any leading (run) dimensions; the
sequence dimension is the last one.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .config import REJECTION_OPTIONS, AlgoConfig, parse_rejection

SAFETY_BOUND = 20.0
"""|log rho| (per token, or summed over a response) is clamped here before
exponentiating, as verl's ``SAFETY_BOUND``."""


def is_weights(
    log_ratio: Tensor, mask: Tensor, level: str, upper: float, lower: float | None = None
) -> Tensor:
    """Importance weights of ``pi_old / mu`` per token (detached; 0 off the mask).

    ``level`` ``token``: ``rho_t``; ``sequence``: ``prod_t rho_t`` over the response's
    masked tokens, broadcast to them. ``lower`` None truncates at ``upper`` (TIS);
    a number zeroes every weight outside ``[lower, upper]`` (IcePop / MIS; 0 is AReaL's
    cap). verl's ``compute_rollout_correction_weights`` without batch normalisation."""
    if level not in ("token", "sequence"):
        raise ValueError(f"is_level must be 'token' or 'sequence', got {level!r}")
    log_ratio = log_ratio.detach()
    mask = mask.bool()
    if level == "token":
        log_w = log_ratio
    else:
        log_w = torch.where(mask, log_ratio, torch.zeros_like(log_ratio)).sum(-1, keepdim=True)
    raw = torch.exp(log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = torch.where(mask, raw, torch.zeros_like(raw))
    if lower is None:
        return raw.clamp(max=upper)
    keep = (raw >= lower) & (raw <= upper)
    return torch.where(keep, raw, torch.zeros_like(raw))


def rejection_mask(log_ratio: Tensor, mask: Tensor, options: str, thresholds: str | float) -> Tensor:
    """The tokens kept by every rejection option of ``options`` (comma separated, see the
    module docstring), as a bool mask within ``mask``. verl's
    ``compute_rollout_rejection_mask``."""
    mask = mask.bool()
    lr = log_ratio.detach().clamp(-SAFETY_BOUND, SAFETY_BOUND)
    per_token = {"k1": -lr, "k2": 0.5 * lr**2, "k3": torch.exp(lr) - 1.0 - lr}
    n = mask.sum(-1)
    keep = mask.clone()
    for name, lower_log, upper in parse_rejection(options, thresholds):
        level, est = name.rsplit("_", 1)
        values = torch.where(mask, per_token[est], torch.zeros_like(lr))
        if level == "token":
            stat = values
        elif level == "seq_sum":
            stat = values.sum(-1, keepdim=True)
        elif level == "seq_mean":
            stat = values.sum(-1, keepdim=True) / (n.unsqueeze(-1) + 1e-8)  # verl's masked_mean
        else:  # seq_max; a response with no token gets 0, as verl
            big = torch.where(mask, per_token[est], torch.full_like(lr, -math.inf)).amax(-1, keepdim=True)
            stat = torch.where(torch.isinf(big), torch.zeros_like(big), big)
        ok = stat <= upper if lower_log is None else (stat >= lower_log) & (stat <= upper)
        keep = keep & ok.expand_as(mask)
    return keep


@dataclass
class Correction:
    """What :func:`correct` hands the update."""

    weights: Tensor | None
    """Per-token weights of the loss (detached), or None for no weighting."""
    mask: Tensor
    """The loss mask with rejected tokens removed."""
    sums: dict[str, tuple[Tensor, Tensor]]
    """``mismatch/*`` metrics as (sum, count) per run, to be summed over ranks and divided."""


def correct(
    old_logp: Tensor, rollout_logp: Tensor, response_mask: Tensor, loss_mask: Tensor, cfg: AlgoConfig
) -> Correction:
    """Weights and rejection of ``cfg`` for a batch (leading run dimensions allowed), with
    the mismatch metrics of the whole response mask. Rejection is judged on the response
    mask (as verl, before overlong filtering) and removed from ``loss_mask``."""
    log_ratio = (old_logp - rollout_logp).detach()
    mask = response_mask.bool()
    sums = mismatch_sums(old_logp, rollout_logp, mask)
    keep = loss_mask.bool()
    if cfg.rejection is not None:
        kept = rejection_mask(log_ratio, mask, cfg.rejection, cfg.rejection_threshold or "")
        rejected = mask & ~kept
        sums["mismatch/rejected_frac"] = _token_sum(rejected, mask)
        sums["mismatch/rejected_seq_frac"] = (
            rejected.any(-1).to(torch.float64).sum(-1),
            mask.any(-1).to(torch.float64).sum(-1),
        )
        keep = keep & kept
    weights = None
    if cfg.tis_cap is not None:
        weights = is_weights(log_ratio, mask, cfg.is_level, cfg.tis_cap, cfg.is_lower)
        w = weights.to(torch.float64)
        sums["mismatch/tis_weight_mean"] = _token_sum(w, mask)
        if cfg.is_lower is None:
            capped = w >= cfg.tis_cap * (1 - 1e-6)
        else:
            capped = w == 0
        sums["mismatch/tis_capped_frac"] = _token_sum(capped, mask)
    return Correction(weights, keep, sums)


def _token_sum(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    v = torch.where(mask, values.to(torch.float64), torch.zeros((), dtype=torch.float64))
    return v.sum((-2, -1)), mask.to(torch.float64).sum((-2, -1))


def mismatch_sums(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
    """verl's off-policy diagnostics (``compute_offpolicy_metrics``) as (sum, count):

    * ``mismatch/logp_gap``: mean ``|log rho_t|`` over tokens;
    * ``mismatch/kl``: mean ``log mu - log pi_old`` (KL(mu || pi_old), k1) over tokens;
    * ``mismatch/k3_kl``: mean ``rho - 1 - log rho`` over tokens (k3);
    * ``mismatch/chi2_token``: mean ``rho_t^2`` over tokens, minus 1;
    * ``mismatch/chi2_seq``: mean ``(prod_t rho_t)^2`` over responses, minus 1;
    * ``mismatch/ppl_ratio``: mean over responses of ``exp(mean_t log mu - mean_t log pi_old)``
      (the trainer's perplexity over the engine's);
    * ``mismatch/log_ppl_abs_diff``: mean over responses of ``|mean_t log mu - mean_t log pi_old|``.

    verl averages the per-response terms over every row of the batch, empty ones included;
    here over responses with at least one token (the same on batches without empty rows).
    The constant -1 of the chi-square terms is applied by :func:`finish`."""
    mask = mask.bool()
    lr = torch.where(
        mask, (old_logp - rollout_logp).detach().to(torch.float64), torch.zeros((), dtype=torch.float64)
    )
    safe = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    rho = torch.exp(safe)
    n_tok = mask.sum(-1)
    has = n_tok > 0
    n_seq = has.to(torch.float64).sum(-1)
    seq_sum = lr.sum(-1)
    diff = -seq_sum / n_tok.clamp(min=1)  # mean log mu - mean log pi_old per response

    def seq(values: Tensor) -> tuple[Tensor, Tensor]:
        return torch.where(has, values, torch.zeros_like(values)).sum(-1), n_seq

    return {
        "mismatch/logp_gap": _token_sum(lr.abs(), mask),
        "mismatch/kl": _token_sum(-lr, mask),
        "mismatch/k3_kl": _token_sum(rho - 1.0 - safe, mask),
        "mismatch/chi2_token": _token_sum(rho.square(), mask),
        "mismatch/chi2_seq": seq(torch.exp(2.0 * seq_sum.clamp(-SAFETY_BOUND, SAFETY_BOUND))),
        "mismatch/ppl_ratio": seq(torch.exp(diff)),
        "mismatch/log_ppl_abs_diff": seq(diff.abs()),
    }


CHI2 = ("mismatch/chi2_token", "mismatch/chi2_seq")


def finish(name: str, total: float, count: float) -> float:
    """A metric of :func:`mismatch_sums` from its summed (sum, count)."""
    if not count:
        return math.nan
    value = total / count
    return value - 1.0 if name in CHI2 else value


def takes_weights(loss_fn: Callable[..., Any]) -> bool:
    """Whether a policy loss accepts ``is_weights`` (by name or through ``**kwargs``)."""
    try:
        params = inspect.signature(loss_fn).parameters.values()
    except (TypeError, ValueError):
        return True  # not introspectable: let the call say
    return any(p.name == "is_weights" or p.kind is p.VAR_KEYWORD for p in params)


def require_weights(loss_fn: Callable[..., Any]) -> None:
    """One clear error when ``tis_cap`` would weight a loss that cannot take weights."""
    if not takes_weights(loss_fn):
        name = getattr(loss_fn, "__qualname__", repr(loss_fn))
        raise ValueError(
            f"tis_cap: the policy loss {name} takes no is_weights keyword, so importance weights "
            "cannot reach it; add the keyword (multiply it into the per-token loss) or use a "
            "correction without weights (rejection, behaviour_clip)"
        )


CORRECTIONS: dict[str, dict[str, object]] = {
    "none": {},
    "bypass": {"behaviour_clip": True},
    "token_tis": {"tis_cap": 2.0, "is_level": "token"},
    "seq_tis": {"tis_cap": 2.0, "is_level": "sequence"},
    "icepop": {"tis_cap": 5.0, "is_level": "token", "is_lower": 0.5},
    "seq_mis": {
        "tis_cap": 2.0,
        "is_level": "sequence",
        "rejection": "seq_sum_k1",
        "rejection_threshold": "0.5_2.0",
    },
    "geo_rs": {"rejection": "seq_mean_k1", "rejection_threshold": "0.999_1.001"},
    "k3_rs": {"rejection": "seq_mean_k3", "rejection_threshold": "0.01"},
    "decoupled": {"tis_cap": 5.0, "is_level": "token", "is_lower": 0.0},
}
"""Named corrections as ``AlgoConfig`` fields, each a peer's preset with its defaults:
``none`` (the trainer's recomputed ``pi_old`` and nothing else: plain asynchronous PPO),
verl's ``bypass_ppo_clip``, ``decoupled_token_is``, ``decoupled_seq_is``,
``decoupled_token_icepop``, ``decoupled_seq_is_rs`` (MIS), ``decoupled_geo_rs``,
``decoupled_k3_rs``, and AReaL's decoupled PPO with ``behav_imp_weight_cap=5``."""


def correction_fields(name: str) -> dict[str, object]:
    """The ``AlgoConfig`` fields of a named correction; every correction field is set
    (to its default where the preset leaves it), so presets replace one another."""
    if name not in CORRECTIONS:
        raise ValueError(f"unknown correction {name!r}; known: {', '.join(CORRECTIONS)}")
    base: dict[str, object] = {
        "tis_cap": None,
        "is_level": "token",
        "is_lower": None,
        "rejection": None,
        "rejection_threshold": None,
        "behaviour_clip": False,
    }
    return {**base, **CORRECTIONS[name]}


__all__ = [
    "CORRECTIONS",
    "REJECTION_OPTIONS",
    "Correction",
    "correct",
    "correction_fields",
    "finish",
    "is_weights",
    "mismatch_sums",
    "rejection_mask",
    "require_weights",
    "takes_weights",
]
