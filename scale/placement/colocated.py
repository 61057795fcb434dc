"""The colocated placement: both roles on every rank. Each step the generator's rounds run on
the rank's engine, the engine sleeps while the learner trains, and the new weights are synced
into it in place (:mod:`scale.learner.sync`); periodic evaluation uses the same engine.

:class:`Colocated` offers the loop (:class:`scale.trainer.Trainer`) the placement's calls
(:class:`scale.placement.interface.Placement`); nothing is in flight between steps."""

from __future__ import annotations

import time
import warnings
from typing import Any

from dapo import RolloutBatch
from dapo.sampling import SamplingWarning

from ..config import RunConfig
from ..dist.topology import Comm, Ranks
from ..generator.prompts import Prompts
from ..generator.role import Generator
from ..learner.role import Learner
from ..learner.sharding import dtype
from ..learner.sync import SyncStats, sync
from ..records import Trace
from .interface import Placement


class Colocated(Placement):
    def __init__(
        self,
        cfg: RunConfig,
        *,
        acc: Any,
        ranks: Ranks,
        comm: Comm,
        learner: Learner,
        prompts: Prompts,
        trace: Trace,
        log: Any,
    ):
        self.cfg, self.acc, self.learner, self.trace, self.log = cfg, acc, learner, trace, log
        if cfg.rollout.engine == "vllm" and acc.is_main_process:  # its start is the longest quiet stretch
            log(f"starting the rollout engine (vLLM, {cfg.model.path})")
        self.gen = Generator.build(
            cfg,
            prompts,
            ranks=ranks,
            comm=comm,
            trace=trace if cfg.output.trace_rollouts else None,
            model=learner.unwrapped.lm if cfg.rollout.engine == "hf" else None,  # no copy, no sync
            distributed=ranks.world > 1,  # one vLLM engine per rollout group
        )
        self.engine = self.gen.engine
        self.eval_problems = prompts.eval_problems
        self.synced = False
        """The engine starts with dummy weights: the learner's go in at :meth:`start`."""

    def _sync(self) -> SyncStats:
        """Stream the weights into the engine, one bounded bucket at a time (:mod:`scale.learner.sync`)."""
        r = self.cfg.rollout
        return sync(
            self.engine,
            self.learner.unwrapped.lm,  # the field, as the hf engine holds it
            dtype=dtype(r.dtype),
            device=self.acc.device,
            bucket_mb=r.sync_bucket_mb,
        )

    def start(self, step: int, end: int) -> None:
        """The learner's weights into the engine (it was built with dummy ones)."""
        self._weights_in()

    def _weights_in(self) -> None:
        """The first sync, once: at :meth:`start`, or at the first generation if the loop did not start."""
        if not self.synced:
            self._sync()
            self.synced = True

    def collect(self, step: int) -> tuple[RolloutBatch | None, dict[str, float]]:
        """Generation rounds until the informative groups of all ranks fill the batch; this
        rank's balanced share of it."""
        self._weights_in()
        t0 = time.perf_counter()
        sampler = self.gen.rounds(step, step)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SamplingWarning)
            batch = sampler.take()
        for w in caught:
            if self.acc.is_main_process:
                self.log(f"step {step + 1}: {w.message}")
        if self.cfg.output.trace_rollouts:  # what this rank trains on
            self.trace.share(batch)
        m = sampler.metrics()
        m["time/generate_s"] = time.perf_counter() - t0
        return batch, m

    def before_update(self) -> None:
        self.engine.sleep()

    def publish(self, version: int) -> dict[str, float]:
        """The new weights into the engine, in place."""
        return self._sync().metrics()

    def evaluate(self, step: int) -> dict[str, float]:
        self._weights_in()
        return self.gen.evaluate(self.eval_problems, step) if self.eval_problems else {}

    def close(self) -> None:
        if (shutdown := getattr(self.engine, "shutdown", None)) is not None:
            shutdown()
