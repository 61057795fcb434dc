"""The policy update shared by both regimes: one rollout batch -> several optimizer steps.

For each epoch and each optimizer-step window of ``cfg.mini_batch_groups`` groups:

1. advantages (Eq. 9) for the whole batch (filtered responses enter the group statistics
   as ``cfg.filtered_group_stats`` says), loss mask minus truncated responses when
   ``overlong_filter``; against the engine's log-probs (``rollout_logp``), when the batch
   has them, the off-policy correction of ``cfg`` (:mod:`dapo.offpolicy`: weights,
   rejection, or the ratio taken against the engine) and the mismatch metrics;
2. the window's normaliser (:func:`dapo.loss.window_denominator`, summed over ranks);
3. per micro-batch (``micro_batch_size`` rows, or the split ``micro_batches`` returns,
   e.g. bins of a token budget): new log-probs from ``logp_fn``,
   :func:`dapo.loss.policy_loss` with that normaliser, scaled by the world size
   (data-parallel gradient averaging divides it back out), backward. The summed
   micro-batch gradients equal the full-window gradient;
4. global grad-norm clip, optimizer step, unless the loss or the gradient is non-finite:
   then the gradients are dropped, the step is skipped and counted, and weights stay as
   they were. The token statistics (clip fractions, KL, entropy) describe the steps taken:
   a skipped window's micro-batches are left out of them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .advantages import config_advantages
from .batch import RolloutBatch
from .config import AlgoConfig
from .loss import ClipAgg, LossAndStats, policy_loss, window_denominator
from .offpolicy import correct, finish, require_weights


@dataclass
class LogProbs:
    """What a regime's ``logp_fn`` returns for a mini-batch."""

    logp: Tensor
    """[b, T] log-probs of the batch's tokens under the current policy, with grad."""
    entropy: Tensor | None = None
    """[b, T] entropy of the full next-token distribution (may be detached), or None."""


LogProbFn = Callable[[RolloutBatch], "LogProbs | tuple[Tensor, Tensor | None]"]


@dataclass(frozen=True)
class DataParallel:
    """How an optimizer-step window spans ranks. Each rank calls :func:`update` on its
    own shard of the batch (whole groups, equal sizes on every rank)."""

    world_size: int = 1
    """Ranks that average gradients (DDP/FSDP divide the summed gradient by this)."""
    all_reduce_sum: Callable[[Tensor], Tensor] | None = None
    """Sum a tensor over ranks and return the result (e.g. a wrapper of
    ``torch.distributed.all_reduce``). None on a single process."""

    def sum(self, x: Tensor) -> Tensor:
        return x if self.all_reduce_sum is None else self.all_reduce_sum(x)


def _params(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    return [p for g in optimizer.param_groups for p in g["params"]]


def update(
    batch: RolloutBatch | None,
    logp_fn: LogProbFn,
    optimizer: torch.optim.Optimizer,
    cfg: AlgoConfig,
    *,
    micro_batch_size: int | None = None,
    micro_batches: Callable[[Tensor], list[Tensor]] | None = None,
    dp: DataParallel = DataParallel(),
    backward: Callable[[Tensor], None] | None = None,
    clip_grad_norm: Callable[[float], Tensor] | None = None,
    generator: torch.Generator | None = None,
    loss_fn: Callable[..., LossAndStats] = policy_loss,
) -> dict[str, float]:
    """Run ``cfg.ppo_epochs`` x (batch groups / ``cfg.mini_batch_groups``) optimizer steps.

    Under data parallelism each rank passes its own shard (whole groups, the same number on
    every rank) and ``dp``. The number of optimizer steps per epoch is the global batch's
    groups / ``cfg.mini_batch_groups``; each rank cuts its responses into that many windows,
    so a window may hold a fraction of a group per rank (128 GPUs, 32-group windows).

    ``logp_fn(mini_batch)`` returns the current policy's log-probs (and entropy) of the
    mini-batch's response tokens, as :class:`LogProbs` or a ``(logp, entropy)`` tuple.
    ``micro_batch_size`` (responses per forward; memory only, never the result) defaults
    to the whole window. ``micro_batches(rows) -> [rows, ...]``, when given, replaces it: it
    gets a window's row indices (into ``batch``) and returns the micro-batches' row indices
    (each row exactly once), e.g. bins of a token budget
    (:func:`dapo.microbatch.token_budget_bins`). A micro-batch may be empty (so every rank
    runs the same number of forwards/backwards): ``logp_fn`` still runs on the empty
    mini-batch and a zero loss connected to its output is backpropagated; ``loss_fn`` is
    not called and no statistic changes. ``backward`` defaults to ``loss.backward()`` (pass
    ``accelerator.backward``), ``clip_grad_norm(max_norm) -> total_norm`` to
    ``torch.nn.utils.clip_grad_norm_`` over the optimizer's parameters (pass the FSDP
    one). ``generator`` shuffles groups between windows each epoch; None keeps batch
    order. ``loss_fn`` is the policy loss (any :class:`dapo.losses.PolicyLossFn`; it gets
    ``is_weights`` only when ``cfg.tis_cap`` is set, see :mod:`dapo.offpolicy`). Returns the ``actor/*`` and
    ``mismatch/*`` metrics of ``dapo.schema.SCHEMA``.
    """
    out: dict[str, float] = {"actor/optimizer_steps": 0.0, "actor/skipped_steps": 0.0}
    if batch is None or batch.size == 0:
        return out
    g = batch.group_size
    if g is None:
        raise ValueError("update needs a batch of whole groups (group_size set)")
    # Tensor.backward is unannotated in torch's stubs.
    backward = backward or (lambda loss: loss.backward())  # type: ignore[no-untyped-call]
    if clip_grad_norm is None:
        params = _params(optimizer)

        def clip_grad_norm(max_norm: float) -> Tensor:
            return torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)

    advantages = config_advantages(batch.rewards, batch.correct, batch.lengths, batch.truncated, g, cfg)
    loss_mask = batch.mask
    if cfg.overlong_filter:
        loss_mask = loss_mask & ~batch.truncated.unsqueeze(-1)
    weights = None
    # token means over the whole (all-rank) batch: (sum, count) pairs, summed over ranks at the end
    means: dict[str, tuple[float, float]] = {}
    n_tokens = float(batch.mask.sum())
    means["actor/mean_prob"] = (float(torch.exp(batch.old_logp.double())[batch.mask].sum()), n_tokens)
    if batch.rollout_logp is not None:
        if cfg.tis_cap is not None:
            require_weights(loss_fn)
        corr = correct(batch.old_logp, batch.rollout_logp, batch.mask, loss_mask, cfg)
        loss_mask, weights = corr.mask, corr.weights
        means.update({k: (float(s), float(c)) for k, (s, c) in corr.sums.items()})
        if cfg.behaviour_clip:  # verl's bypass mode: the ratio against the engine's log-probs
            batch = dataclasses.replace(batch, old_logp=batch.rollout_logp)

    # optimizer steps per epoch: the whole (all-rank) batch cut into windows of
    # mini_batch_groups groups; each rank cuts its own responses into that many pieces
    n_windows = max(1, math.ceil(batch.num_groups * dp.world_size / cfg.mini_batch_groups))
    sums = _Sums()
    n_groups = batch.num_groups
    for epoch in range(cfg.ppo_epochs):
        if generator is not None:
            order = torch.randperm(n_groups, generator=generator)
        else:
            order = torch.arange(n_groups)
        rows_all = (order.view(-1, 1) * g + torch.arange(g)).view(-1)
        for rows in torch.tensor_split(rows_all, n_windows):
            rows = rows.to(batch.old_logp.device)
            denom = dp.sum(
                window_denominator(loss_mask[rows], cfg.loss_agg, cfg.norm_const).to(batch.old_logp.device)
            )
            if float(denom) == 0.0:  # every response of the window was filtered
                sums.empty_windows += 1
                continue
            clip = ClipAgg.of(cfg, denom)
            optimizer.zero_grad(set_to_none=True)
            window = _Sums()  # merged into ``sums`` only if the step is taken
            finite = True
            loss_total = 0.0
            if micro_batches is None:
                mbs = micro_batch_size or len(rows)
                parts = [rows[start : start + mbs] for start in range(0, len(rows), mbs)]
            else:
                parts = [torch.as_tensor(p, dtype=torch.long).to(rows.device) for p in micro_batches(rows)]
                got = torch.cat(parts) if parts else rows[:0]
                if not torch.equal(got.sort().values, rows.sort().values):
                    raise ValueError("micro_batches must return the window's rows, each exactly once")
            for idx in parts:
                mb = batch.select(idx)
                res = logp_fn(mb)
                logp, entropy = (res.logp, res.entropy) if isinstance(res, LogProbs) else res
                stats: dict[str, Tensor] | None = None
                if len(idx) == 0:
                    # an empty micro-batch (ranks in step): a zero loss on the forward's graph
                    loss = logp.sum() * 0.0
                else:
                    extra = {} if weights is None else {"is_weights": weights[idx]}
                    loss, stats = loss_fn(logp, mb.old_logp, advantages[idx], loss_mask[idx], clip, **extra)
                bad = torch.tensor(0.0 if torch.isfinite(loss) else 1.0, device=loss.device)
                if float(dp.sum(bad)) > 0:  # every rank skips together
                    finite = False
                    break
                backward(loss * dp.world_size)
                loss_total += float(loss.detach())
                if stats is None:
                    continue
                window.add_stats(stats)
                if epoch == 0:
                    window.add_tokens(mb, entropy)
            if finite:
                norm = clip_grad_norm(cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf)
                grad_norm = float(norm)
                finite = math.isfinite(grad_norm)
            if not finite:
                optimizer.zero_grad(set_to_none=True)
                sums.skipped += 1
                continue
            optimizer.step()
            sums.merge(window)
            sums.steps += 1
            sums.losses.append(loss_total)
            sums.norms.append(grad_norm)
    optimizer.zero_grad(set_to_none=True)

    filtered = batch.truncated if cfg.overlong_filter else torch.zeros_like(batch.truncated)
    totals = {"actor/loss_tokens": float(loss_mask.sum()), "actor/filtered_responses": float(filtered.sum())}
    summary = sums.finish(dp, means, totals)
    # the order of the single-process loop's log (the toy engine's batched log must match it)
    out.update({k: v for k, v in summary.items() if k.startswith("mismatch/")})
    out.update({k: v for k, v in summary.items() if not k.startswith("mismatch/")})
    return out


_TOKEN_STATS = ("clipfrac_upper", "clipfrac_lower", "dual_clipfrac", "approx_kl")


class _Sums:
    """Token-weighted accumulation of loss statistics across micro-batches. Every metric is
    reported on every call (NaN when no step was taken), so the schema does not depend on
    whether a step succeeded."""

    def __init__(self) -> None:
        self.steps = 0
        self.skipped = 0
        self.empty_windows = 0
        self.losses: list[float] = []
        self.norms: list[float] = []
        self.tokens = 0.0
        self.weighted = dict.fromkeys(_TOKEN_STATS, 0.0)
        self.n_upclip = 0.0
        self.upclip_prob = 0.0
        self.ent_tokens = 0.0
        self.ent_sum = 0.0

    def add_stats(self, stats: dict[str, Tensor]) -> None:
        n = float(stats["n_tokens"])
        self.tokens += n
        for key in _TOKEN_STATS:
            self.weighted[key] += float(stats[key]) * n
        k = float(stats["n_upclip"])
        if k:
            self.n_upclip += k
            self.upclip_prob += float(stats["upclip_old_prob"]) * k

    def merge(self, other: _Sums) -> None:
        """Add a window's token statistics (a skipped window's are dropped, not merged)."""
        self.tokens += other.tokens
        for key in _TOKEN_STATS:
            self.weighted[key] += other.weighted[key]
        self.n_upclip += other.n_upclip
        self.upclip_prob += other.upclip_prob
        self.ent_tokens += other.ent_tokens
        self.ent_sum += other.ent_sum

    def add_tokens(self, mb: RolloutBatch, entropy: Tensor | None) -> None:
        m = mb.mask
        if entropy is not None:
            self.ent_tokens += float(m.sum())
            self.ent_sum += float(entropy.detach().to(torch.float64)[m].sum())

    def finish(
        self, dp: DataParallel, means: dict[str, tuple[float, float]], totals: dict[str, float]
    ) -> dict[str, float]:
        """The ``actor/*`` metrics of the whole batch over every rank, equal on every rank:
        one all-reduce sums the token-weighted statistics, each optimizer step's loss (each
        rank's share is its local sum over the global denominator), the token means
        (``means``: name -> (sum, count)) and the ``totals``. Steps are taken or skipped by all
        ranks together, so every rank holds as many losses."""
        local = {"tokens": self.tokens, **self.weighted, "n_upclip": self.n_upclip}
        local.update(
            {"upclip_prob": self.upclip_prob, "ent_tokens": self.ent_tokens, "ent_sum": self.ent_sum}
        )
        for k, (total, count) in means.items():
            local[f"{k}/sum"], local[f"{k}/count"] = total, count
        local.update(totals)
        summed = dp.sum(torch.tensor([*local.values(), *self.losses], dtype=torch.float64)).tolist()
        g, losses = dict(zip(local, summed)), summed[len(local) :]
        nan = math.nan
        res = {f"actor/{k}": g[k] / g["tokens"] if g["tokens"] else nan for k in _TOKEN_STATS}
        res["actor/upclip_old_prob"] = g["upclip_prob"] / g["n_upclip"] if g["n_upclip"] else nan
        res["actor/entropy"] = g["ent_sum"] / g["ent_tokens"] if g["ent_tokens"] else nan
        res["actor/loss"] = sum(losses) / len(losses) if losses else nan
        res["actor/grad_norm"] = sum(self.norms) / len(self.norms) if self.norms else nan
        res["actor/grad_norm_max"] = max(self.norms) if self.norms else nan
        res["actor/optimizer_steps"] = float(self.steps)
        res["actor/skipped_steps"] = float(self.skipped)
        res["actor/empty_windows"] = float(self.empty_windows)
        res.update({k: finish(k, g[f"{k}/sum"], g[f"{k}/count"]) for k in means})
        res.update({k: g[k] for k in totals})
        return res


__all__: Sequence[str] = ["DataParallel", "LogProbFn", "LogProbs", "update"]
