"""The learner side of the full regime: the policy on this run's ranks, its optimizer and
learning-rate schedule, the update, and sharded checkpoints of all three.

:class:`Learner` is built from the config (:meth:`Learner.build`) the same way in either
placement (``rollout.mode``); :class:`scale.trainer.Trainer` hands it batches, whoever
generated them. One step (:meth:`Learner.step`): the trainer's own log-probs of the batch
(``old_logp``; the engine's stay as ``rollout_logp`` for the mismatch metrics and the
importance weights), :func:`dapo.update` exact across micro-batches and ranks with the
global grad-norm clip, then the warm-up schedule (linear, then constant).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule

from dapo import DataParallel, RolloutBatch, update
from dapo.loss import policy_loss
from dapo.registry import Loss, of_config

from ..dist.topology import all_max
from . import checkpoint as ckpt
from .lora import param_counts, trainable
from .policy import Policy, response_logp, token_budget_splitter
from .sharding import build_policy, clip_grad_norm

Split = Callable[[torch.Tensor], list[torch.Tensor]]
"""Row indices -> the micro-batches' row indices (the same count on every rank)."""


def by_count(micro_batch_size: int) -> Split:
    return lambda rows: list(torch.split(rows, micro_batch_size))


@torch.no_grad()
def with_trainer_logp(policy, batch: RolloutBatch, split: Split, pad_id: int) -> RolloutBatch:
    """The batch with ``old_logp`` recomputed by the trainer (the engine's log-probs stay in
    ``rollout_logp``): the ratio's denominator must be the trainer's own numbers."""
    old = torch.zeros_like(batch.old_logp)
    for idx in split(torch.arange(batch.size, device=old.device)):
        logp = response_logp(policy, batch.select(idx), pad_id)[0]
        if idx.numel():
            old[idx] = logp.float().to(old.device)
    old = torch.where(batch.mask, old.clamp(max=0.0), torch.zeros_like(old))
    return RolloutBatch(**{**batch.__dict__, "old_logp": old})


def run_update(
    acc,
    policy,
    optimizer,
    algo,
    batch: RolloutBatch,
    micro_batch_size: int,
    pad_id: int,
    *,
    max_tokens: int | None = None,
    sharded: bool = False,
    loss_fn: Callable[..., Any] = policy_loss,
) -> dict[str, float]:
    """Recompute old log-probs, then :func:`dapo.update` with accelerate's backward, the global
    grad-norm clip and a cross-rank sum for the window denominators. Micro-batches hold
    ``micro_batch_size`` responses, or up to ``max_tokens`` tokens (packed) with the same
    number of micro-batches on every rank. ``loss_fn``: the policy loss (the config's,
    :func:`dapo.registry.of_config`)."""
    world = acc.num_processes

    def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
        return acc.reduce(x.to(acc.device), reduction="sum").to(x.device)

    batch = batch.to(acc.device)  # the loss is computed where the log-probs are
    if max_tokens is None:
        split = by_count(micro_batch_size)
    else:
        split = token_budget_splitter(batch, max_tokens, lambda n: all_max(n, acc.device))
    batch = with_trainer_logp(policy, batch, split, pad_id)
    m = update(
        batch,
        lambda mb: response_logp(policy, mb, pad_id),
        optimizer,
        algo,
        micro_batch_size=micro_batch_size,
        micro_batches=None if max_tokens is None else split,
        dp=DataParallel(world, all_reduce_sum if world > 1 else None),
        backward=acc.backward,
        clip_grad_norm=clip_grad_norm(policy, acc, sharded),
        loss_fn=loss_fn,
    )
    if batch.rollout_logp is not None:
        gap = (batch.old_logp - batch.rollout_logp).abs()[batch.mask]
        m["mismatch/logp_gap_max"] = all_max(float(gap.max()) if gap.numel() else -math.inf, acc.device)
        if not math.isfinite(m["mismatch/logp_gap_max"]):
            m["mismatch/logp_gap_max"] = math.nan
    return m


@dataclass
class Learner:
    cfg: Any
    acc: Any
    policy: Any
    """The module to train: accelerate's DDP wrapper, the FSDP2-sharded Policy, or the Policy."""
    unwrapped: Policy
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    pad_id: int
    loss: Loss
    """The policy loss ``algo.policy_loss`` names (:func:`dapo.registry.of_config`)."""

    @classmethod
    def build(cls, cfg: Any, acc: Any, pad_id: int, log: Any = print) -> Learner:
        """The policy loss (``algo.policy_loss``, resolved before anything is built), the model on
        its ranks (DDP or FSDP2; with ``model.lora`` its adapters, their share of the parameters
        logged), then AdamW over the trainable parameters the ranks hold (the adapters only,
        with LoRA) and the warm-up schedule (``train.warmup_steps`` linear, then constant)."""
        loss = of_config(cfg.algo)
        policy, unwrapped = build_policy(cfg, acc)
        lora = cfg.model.lora
        if lora.enabled and acc.is_main_process:
            trained, total = param_counts(unwrapped)
            log(
                f"model.lora: rank {lora.rank} on {', '.join(lora.target_modules)}: "
                f"{trained:,} of {total:,} parameters trained ({100 * trained / total:.2f}%)"
            )
        t = cfg.train
        optimizer = torch.optim.AdamW(
            trainable(unwrapped), lr=t.lr, betas=(t.betas[0], t.betas[1]), weight_decay=t.weight_decay
        )
        warm = t.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warm) if warm > 0 else 1.0
        )
        return cls(cfg, acc, policy, unwrapped, optimizer, scheduler, pad_id, loss)

    @property
    def sharded(self) -> bool:
        return isinstance(self.policy, FSDPModule)

    @property
    def lm(self) -> torch.nn.Module:
        return self.unwrapped.lm

    def step(self, batch: RolloutBatch) -> dict[str, float]:
        """One training step on this rank's share of the batch (every rank calls it)."""
        t = self.cfg.train
        m = run_update(
            self.acc,
            self.policy,
            self.optimizer,
            self.cfg.algo,
            batch,
            t.micro_batch_size,
            self.pad_id,
            max_tokens=t.max_tokens_per_micro_batch,
            sharded=self.sharded,
            loss_fn=self.loss.fn,
        )
        with warnings.catch_warnings():  # a step whose batch was empty took no optimizer step
            warnings.filterwarnings("ignore", message="Detected call of", category=UserWarning)
            self.scheduler.step()
        m["actor/lr"] = self.scheduler.get_last_lr()[0]
        return m

    def save(self, out: Path, step: int, **kw: Any) -> Path:
        """A sharded checkpoint of model, optimizer and schedule (:func:`scale.learner.checkpoint.save`;
        ``kw``: rank_state, trainer_state, hf_save, rank, keep, barrier)."""
        return ckpt.save(
            out,
            step,
            model=self.unwrapped,
            optimizer=self.optimizer,
            scheduler_state=self.scheduler.state_dict(),
            **kw,
        )

    def load(self, path: Path) -> None:
        ckpt.load(path, model=self.unwrapped, optimizer=self.optimizer)
        self.scheduler.load_state_dict(ckpt.load_tensors(path, "scheduler.pt"))


__all__ = ["Learner", "Split", "by_count", "run_update", "with_trainer_logp"]
