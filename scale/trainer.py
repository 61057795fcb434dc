"""The training loop of the full regime, written once over either placement.

:class:`Trainer` builds the run from the config as a list of constructions: this process in
the run (:func:`_join`: process group, ranks, heartbeat, layout checks), the generator's
inputs (:class:`scale.generator.prompts.Prompts`: model files, tokenizer, prompt set and
stream, prompt selection), the resume point, the learner (:class:`scale.learner.role.Learner`:
model on its ranks, optimizer, schedule), the placement ``rollout.mode`` names
(:mod:`scale.placement.interface`: :class:`scale.placement.colocated.Colocated`,
:class:`scale.placement.disaggregated.Disaggregated` or one's own, each wiring the roles) and the run's
records. Per training step, on every rank:

1. collect: this rank's share of a batch filled with informative groups (global dynamic
   sampling over every rollout group, colocated; the generator processes' batch, its staleness
   checked, disaggregated), padded to the same group count on every rank;
2. the placement prepares the update (colocated: the engine sleeps); the learner recomputes
   the sampling policy's log-probs (``old_logp``; the engine's stay as ``rollout_logp``) and
   runs :func:`dapo.update`, exact across micro-batches and ranks, then steps its schedule;
3. publish: the new weights into the engine in place (colocated) or to the generators
   (disaggregated); metrics go to JSONL (and accelerate trackers) with the health verdicts;
4. periodic evaluation (colocated) and checkpoints (the learner's state, the generator's
   stream and selection, the placement's batches in flight).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dapo import RolloutBatch

from .config import RunConfig
from .dist import heartbeat
from .dist.topology import Comm, Ranks, all_max, barrier, make_accelerator, start_wait_reports, waiting_for
from .generator.data import DataError  # noqa: F401  (what a failed start raises; `dapo train` reports it)
from .generator.evaluation import eval_line
from .generator.prompts import Prompts
from .generator.role import empty_groups
from .learner import checkpoint as ckpt
from .learner.policy import Policy
from .learner.role import Learner
from .placement.interface import PlacementError, placement_class
from .records import Records


def _labelled_barrier(what: str) -> None:
    with waiting_for(what):
        barrier()


PER_RANK_METRICS = ("time/", "sync/", "memory/")
"""Metrics measured on each rank (the run logs the largest); all others are global."""


class LayoutError(ValueError):
    """The config does not fit this run's processes (said before any model loads)."""


class Trainer:
    """The training loop over either placement: collect, update, publish, evaluate, save, health."""

    def __init__(
        self, cfg: RunConfig, *, resume: str | None = None, accelerator=None, log=print, progress: bool = True
    ):
        self.cfg, self.log, self.progress, self.out = cfg, log, progress, Path(cfg.output.dir)
        try:  # rollout.mode: refused before the process group and any model exist
            placement = placement_class(cfg.rollout.mode)
        except PlacementError as err:
            raise LayoutError(str(err)) from None
        self.acc, self.ranks, self.comm, self.heartbeat = _join(
            cfg, accelerator, log, placement.learners_generate
        )
        self.rank, self.world = self.ranks.rank, self.ranks.world
        # the generator's inputs first: refuse to start (before allocating a model) if any record is malformed
        self.prompts = Prompts.build(cfg, self.acc, log)
        # which checkpoint to continue from, refused now if it cannot be (before the model loads)
        resume_from = ckpt.resume_point(cfg, self.out, resume, log)
        self.learner = Learner.build(cfg, self.acc, self.prompts.pad_id, log)
        self.step = 0
        self.totals = {"responses": 0.0, "tokens": 0.0, "optimizer_steps": 0.0, "skipped_steps": 0.0}
        in_flight = self._resume(*resume_from) if resume_from is not None else None
        # the start records, the trace and the health monitor; a resumed run's later steps dropped
        self.records = Records.start(cfg, self.acc, self.ranks, self.prompts, step=self.step, log=log)
        self.placement = placement(
            cfg,
            acc=self.acc,
            ranks=self.ranks,
            comm=self.comm,
            learner=self.learner,
            prompts=self.prompts,
            trace=self.records.trace,
            log=log,
        )
        if in_flight is not None:  # what the checkpoint held of work under way
            self.placement.take_in_flight(
                *in_flight, step=self.step, stream=self.prompts.stream, rank=self.rank
            )
        self.watches: list[Callable[[dict[str, float]], str | None]] = []
        """Called with each step's metrics on the main process; a line returned is logged (the
        command adds its own: ``dapo train``'s staleness-by-movement placement)."""

    def _unwrapped(self) -> Policy:
        return self.learner.unwrapped

    # ---- update -------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        c = self.cfg
        t0 = time.perf_counter()
        self.records.trace.step = self.step
        batch, m = self.placement.collect(self.step)
        # equal group counts on every rank (dynamic sampling may leave them unequal)
        per_rank = c.algo.train_groups // self.world
        have = batch.num_groups if batch is not None else 0
        t_len = batch.mask.shape[1] if batch is not None else 1
        t_len, need = all_max(t_len, self.acc.device), all_max(have, self.acc.device)
        need = max(need, 1 if per_rank else 0)
        if have < need:
            pad = empty_groups(need - have, c.algo.group_size, t_len, self.prompts.pad_id)
            batch = pad if batch is None else RolloutBatch.concat([batch, pad])
        self.placement.before_update()
        cuda = self.acc.device.type == "cuda"
        if cuda:  # the update's own peak (dapo plan's training phase; the GPU checks compare them)
            torch.cuda.reset_peak_memory_stats()
        t1 = time.perf_counter()
        m.update(self.learner.step(batch))
        t2 = time.perf_counter()
        if cuda:
            m["memory/update_peak_gib"] = torch.cuda.max_memory_allocated() / (1 << 30)
        m.update(self.placement.publish(self.step + 1))
        m["time/update_s"] = t2 - t1
        m["time/sync_s"] = time.perf_counter() - t2
        m["time/step_s"] = time.perf_counter() - t0
        return m

    # ---- evaluation -----------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        return self.placement.evaluate(self.step)

    # ---- the loop --------------------------------------------------------------------------
    def _reduce_metrics(self, m: dict[str, float]) -> dict[str, float]:
        """One line for the whole run. Timings and sync figures are per rank (the slowest rank
        counts); every other metric is global by construction (token-weighted sums over all
        ranks, or the same all-gathered reports), so rank 0's value stands for all. A global
        metric that differs across ranks is a bug: it is logged."""
        if self.world == 1:
            return m
        parts = self.comm.all_gather(m, f"the metrics of step {self.step + 1}")
        out = {}
        for k in sorted({k for p in parts for k in p}):
            vals = [p[k] for p in parts if k in p and not (isinstance(p[k], float) and math.isnan(p[k]))]
            if k.startswith(PER_RANK_METRICS):
                out[k] = max(vals) if vals else math.nan
                continue
            out[k] = parts[0].get(k, math.nan)
            if self.acc.is_main_process and vals and max(vals) - min(vals) > 1e-6 * max(1.0, abs(vals[0])):
                self.log(
                    f"step {self.step + 1}: warning: metric {k} differs across ranks ({min(vals)} .. {max(vals)})"
                )
        return out

    def train(self, steps: int | None = None) -> list[dict[str, float]]:
        """Run to ``train.steps`` (or ``steps`` more steps); returns this call's metrics."""
        c = self.cfg
        end = c.train.steps if steps is None else min(c.train.steps, self.step + steps)
        history = []
        from dapo.progress import Progress

        # a bar on a terminal; in a redirected log a plain line per step, at most one per 30 s
        self.placement.start(self.step, end)
        with Progress(
            end, "dapo train", enabled=self.acc.is_main_process and self.progress, start=self.step
        ) as bar:
            while self.step < end:
                m = self._reduce_metrics(self.train_step())
                self.totals["responses"] += m["sampling/generated_groups"] * c.algo.group_size
                self.totals["tokens"] += m["sampling/generated_tokens"]
                self.totals["optimizer_steps"] += m["actor/optimizer_steps"]
                self.totals["skipped_steps"] += m["actor/skipped_steps"]
                if m["actor/skipped_steps"] and self.acc.is_main_process:
                    self.log(
                        f"step {self.step + 1}: skipped {m['actor/skipped_steps']:.0f} optimizer step(s) with a "
                        "non-finite loss or gradient; weights left unchanged for them"
                    )
                m.update({f"cost/{k}_total": v for k, v in self.totals.items()})
                self.step += 1
                m["step"] = self.step  # steps count from 1: the number printed, logged and checkpointed
                if c.eval.every and self.step % c.eval.every == 0:
                    scores = self.evaluate()
                    m.update(scores)
                    if scores and self.acc.is_main_process:
                        bar.clear()
                        self.log(f"step {self.step}: {eval_line(scores)}")
                verdicts, change = self.records.health.observe(m)
                m.update(verdicts)
                if change and self.acc.is_main_process:
                    bar.clear()
                    self.log(f"step {self.step}: {change}")
                for watch in self.watches if self.acc.is_main_process else []:
                    said = watch(m)
                    if said:
                        bar.clear()
                        self.log(f"step {self.step}: {said}")
                self.records.write(m)
                history.append(m)
                bar.update(
                    self.step,
                    f"acc={m.get('rollout/accuracy', math.nan):.3f} ent={m.get('actor/entropy', math.nan):.3f}",
                )
                if (
                    c.output.checkpoint_every and self.step % c.output.checkpoint_every == 0
                ) or self.step == end:
                    self.save()
        # the trackers' files closed; not accelerate's end_training(), which also destroys the
        # process group while the engine's groups and the checkpoint barrier still need it
        for tracker in self.acc.trackers if c.output.trackers else []:
            tracker.finish()
        return history

    def close(self) -> None:
        """Drop the wrapped model, the optimizer and the engine, and accelerate's references to
        them, so that the process group can really be freed (see :mod:`scale.dist.topology`). The
        engine is shut down first, while the group it was built on still exists."""
        if self.heartbeat is not None:  # done: the peers must not take this rank's exit for a death
            self.heartbeat.stop()
        self.placement.close()
        self.acc.free_memory()
        self.learner = self.placement = None  # type: ignore[assignment]

    # ---- checkpoints ---------------------------------------------------------------------------
    def save(self) -> Path:
        """A sharded checkpoint, written by every rank (:mod:`scale.learner.checkpoint`)."""
        trainer_state = {
            "step": self.step,
            "totals": self.totals,
            "world_size": self.world,
            "config": self.cfg.to_dict(),
        }

        def hf_save(d: Path) -> None:
            self.learner.lm.config.save_pretrained(d)
            self.prompts.tokenizer.save_pretrained(d)

        return self.learner.save(
            self.out,
            self.step,
            rank_state=self._rank_state(),
            trainer_state=trainer_state,
            hf_save=hf_save,
            rank=self.rank,
            keep=self.cfg.output.keep_checkpoints,
            barrier=lambda: _labelled_barrier(f"the other ranks' checkpoint step_{self.step}"),
        )

    def _rank_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of this rank: its RNG, the generator's state (the prompt
        stream's position, the selection's history) and the placement's (disaggregated, rank 0:
        the batches in flight)."""
        state: dict[str, Any] = {"rng": ckpt.rng_state(), **self.prompts.state_dict()}
        return self.placement.rank_state(self.step, state)

    def _resume(self, path: Path, state: dict[str, Any]) -> tuple[Path, dict[str, Any], dict[str, Any]]:
        """Continue the checkpoint at ``path``: the learner's state, the RNG, the generator's
        state. Returns what the placement needs for the work the checkpoint held in flight
        (:meth:`scale.placement.interface.Placement.take_in_flight`): the path, the trainer's
        state and rank 0's part."""
        self.learner.load(path)
        written = int(state["world_size"])
        # the RNG streams are per rank and carry over only to the same world size; the prompt
        # stream is the same on every rank, and rank 0's position (the one a disaggregated run
        # advances) serves any world size
        mine = ckpt.load_tensors(path, f"rank{self.rank if written == self.world else 0}.pt")
        if written == self.world:
            ckpt.set_rng_state(mine["rng"])
        zero = mine if self.rank == 0 or written != self.world else ckpt.load_tensors(path, "rank0.pt")
        self.prompts.stream.load_state_dict(zero["stream"])
        self.step = int(state["step"])
        if self.prompts.selection is not None:  # its policy was checked by resume_point
            if "selection" in mine:
                self.prompts.selection.load_state_dict(mine["selection"])
            else:
                self.log(f"{path} holds no prompt-selection history: algo.prompt_selection starts from none")
        self.totals = {k: float(v) for k, v in state["totals"].items()}
        moved = (
            f" (written by {written} processes, resharded onto {self.world})" if written != self.world else ""
        )
        self.log(f"resumed from {path} at step {self.step}{moved}")
        return path, state, zero


def _join(
    cfg: RunConfig, accelerator: Any, log: Any, learners_generate: bool
) -> tuple[Any, Ranks, Comm, Any]:
    """This process in the run: the process group (accelerate), its place (:class:`Ranks`,
    checked against the config before anything loads), the wait reports and the heartbeat."""
    acc = accelerator or make_accelerator(cfg)
    rank, world = acc.process_index, acc.num_processes
    try:
        # where the learners do not generate, rollout.tensor_parallel is the generators'
        ranks = Ranks(rank, world, cfg.rollout.tensor_parallel if learners_generate else 1)
    except ValueError as err:
        raise LayoutError(str(err)) from None
    comm = Comm(ranks, acc.device)
    start_wait_reports(cfg.train.wait_report_s, log, rank)
    # rank 0 prepared the output directory (and the tiny preset's files) before it joined the
    # group; creating the group is no barrier where communicators start lazily (NCCL, gloo
    # with TORCH_GLOO_LAZY_INIT=1), so wait for it here, before anything reads them
    _labelled_barrier("rank 0 to prepare the output directory")
    # from here a dead or stopped rank ends every rank within train.heartbeat_timeout_s
    beat = heartbeat.start(cfg, rank, world)
    if world > 1 and cfg.train.sharding == "fsdp2" and cfg.rollout.engine == "hf":
        raise LayoutError(
            "rollout.engine=hf generates with the trainer's module, which train.sharding=fsdp2 "
            "shards over ranks that generate different lengths; use rollout.engine=vllm"
        )
    if cfg.rollout.generator_nodes and not os.environ.get("MASTER_ADDR"):
        raise LayoutError(
            f"rollout.generator_nodes={cfg.rollout.generator_nodes}: the generators meet the learners "
            "through the launcher's store, and MASTER_ADDR is not set; start the run with the "
            "commands dapo launch writes (torchrun, accelerate or SLURM)"
        )
    algo = cfg.algo
    if algo.train_groups % world:
        raise LayoutError(f"algo.train_groups={algo.train_groups} is not divisible by the {world} processes")
    if cfg.gen_groups % ranks.dp_size:
        raise LayoutError(
            f"rollout.gen_groups={cfg.gen_groups} is not divisible by the {ranks.dp_size} rollout "
            f"groups ({world} processes / rollout.tensor_parallel={ranks.tensor_parallel})"
        )
    torch.manual_seed(cfg.train.seed)
    return acc, ranks, comm, beat
