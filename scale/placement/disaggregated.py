"""The learner's side of a disaggregated run: its generator processes, as one pool.

On the learner's rank 0, :class:`GeneratorPool` starts ``rollout.generators`` processes
(:func:`scale.placement.generator_process.main`), hosts the bridge's store (:mod:`scale.dist.bridge`), tells each
generator where to start (first and last batch, the prompt stream's position, k), receives
their batches in a thread that does nothing else, and publishes each policy version the
generators will need. Every learner rank calls :meth:`publish` (under FSDP2 each takes part in
gathering the full tensors); only rank 0 sends.

Staleness is a function of the step (:mod:`dapo.pipeline`): batch ``s`` is sampled by
version ``max(0, s - 1 - k)``. :meth:`take` checks it on every token before the learner
trains on it. A checkpoint after step ``s`` holds batches ``s+1 .. s+k`` (:meth:`in_flight`),
sampled by versions the checkpoint no longer holds; resumed, the pool starts the generators
at batch ``s + k + 1``, which version ``s`` (the checkpoint's own) samples: the run continues
exactly as if it had not stopped.

A resume may also change the schedule (:func:`in_flight_to_continue`): more ``train.steps``
than the checkpoint's run had (it generated nothing beyond its last step), another k, another
number of generators or learner ranks, partial rollouts switched. No version older than the
checkpoint exists then, so a batch the checkpoint does not hold is sampled by version
``max(s, b - 1 - k)`` (:func:`dapo.pipeline.behaviour_version` with ``floor = s``): fresher than
the schedule asks, never staler. Held batches that a smaller k no longer allows are sampled
again from the same place of the prompt stream; held batches planned for another number of
learner ranks are split again (:func:`replan`).

No wait is without an end: the learner waits for a batch only while every version it needs
has been published or is about to be (:meth:`GeneratorPool.wait_for`), and a generator waits
for a version only while the versions arriving have not passed it (:mod:`scale.placement.generator_process`).
Waits across the boundary (a generation round, a training step, an engine starting) are on
the host, polling a store key (:mod:`scale.dist.bridge`), so none is cut short by
``train.dist_timeout_s``; a generator that dies is noticed at the next poll.

A generator process that exits before its work is done ends the run with one line naming it
and its log (:class:`scale.generator.engines.EngineError`, exit status 4 of ``dapo train``).
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from dapo import RolloutBatch
from dapo.pipeline import behaviour_version, versions_needed

from ..config import RunConfig
from ..dist import bridge, delta, topology
from ..generator.engines import EngineError
from ..generator.rollout import batch_state, from_state
from ..learner.sharding import dtype
from ..learner.sync import MIB, SyncStats, stream_plan, stream_weights
from ..records import trim_jsonl
from . import generator_process
from .generator_node import RemoteGenerators, last_line
from .interface import Placement


class StalenessError(RuntimeError):
    """A batch arrived with tokens older than ``rollout.max_staleness`` allows (a bug)."""


class ScheduleError(RuntimeError):
    """A wait that can never end: the batch or policy version waited for cannot arrive (a bug
    in the schedule; said at once instead of after the collective timeout)."""


def oldest_version(parts: list[dict[str, Any]]) -> int | None:
    """The oldest policy version of any token in a batch's messages (None: no token)."""
    found = [
        int(v.min())
        for p in parts
        if p["groups"] is not None and (v := p["groups"]["extras"]["version"][p["groups"]["mask"]]).numel()
    ]
    return min(found) if found else None


def in_flight_to_continue(
    held: dict[int, list[dict[str, Any]]], step: int, k: int
) -> tuple[dict[int, list[dict[str, Any]]], list[int]]:
    """Of the batches a checkpoint after ``step`` holds (consecutive from ``step + 1``), those a
    run with staleness ``k`` may still train: the leading ones whose every token is within k of
    the learner that will train it; the rest (a resume with a smaller k) are dropped and sampled
    again, from the prompt stream's position after the last one kept. Returns (kept, dropped)."""
    kept: dict[int, list[dict[str, Any]]] = {}
    for b in sorted(held):
        if b != step + 1 + len(kept):
            raise ValueError(f"the checkpoint of step {step} holds batches {sorted(held)}: not consecutive")
        oldest = oldest_version(held[b])
        if oldest is not None and oldest < b - 1 - k:
            break
        kept[b] = held[b]
    return kept, [b for b in sorted(held) if b not in kept]


def replan(parts: list[dict[str, Any]], learners: int, group_size: int) -> list[list[list[int]]]:
    """A held batch's split over ``learners`` ranks, made again as its generators make it
    (:meth:`scale.generator.rollout.GlobalDynamicSampler.kept`: groups in canonical key order, balanced
    by their prompt + response tokens), for a resume on another number of learner ranks."""
    from dapo.microbatch import row_tokens
    from dapo.sampling import balance_groups

    from ..generator.rollout import from_state

    tokens: dict[tuple[int, ...], int] = {}
    for p in parts:
        if p["groups"] is None:
            continue
        per_group = row_tokens(from_state(p["groups"])).view(-1, group_size).sum(1).tolist()
        for key, n in zip(p["keys"], per_group):
            tokens[tuple(key)] = int(n)
    keys = sorted(tokens)
    plan = balance_groups([tokens[x] for x in keys], learners)
    return [[list(keys[i]) for i in sorted(part)] for part in plan]


def _host() -> str:
    """Where the generators reach the learner's rank 0: its node's address under torchrun
    (``MASTER_ADDR`` is rank 0's node), else this machine."""
    return os.environ.get("DAPO_BRIDGE_ADDR") or os.environ.get("MASTER_ADDR") or socket.gethostname()


def generator_gpus(gpus: int, learners_here: int, generators: int, tp: int = 1) -> tuple[list[int], bool]:
    """Which GPU of rank 0's node each generator process gets (``generators * tp`` of them:
    generator ``i``'s tensor-parallel processes are ``i * tp .. i * tp + tp - 1``), and whether
    they share GPUs with the learners. The GPUs after the learners' when there are enough
    (each process its own device, weights over NCCL); otherwise, at ``tp = 1`` only, generator
    ``i`` shares GPU ``(learners_here + i) % gpus`` (a one-GPU check, a small node). NCCL refuses
    two members of one communicator on the same device, so shared placements send weights
    through host memory (gloo): slower, and what :func:`scale.ops.plan.placement` does not model."""
    if gpus < 1:
        raise ValueError(f"no GPU to place {generators} generator(s) on")
    procs = generators * tp
    if gpus >= learners_here + procs:
        return [learners_here + g for g in range(procs)], False
    if tp > 1:
        raise ValueError(
            f"{generators} generator(s) at rollout.tensor_parallel={tp} need {procs} GPUs of their own "
            f"after the {learners_here} learner(s); this node has {gpus}"
        )
    return [(learners_here + i) % gpus for i in range(generators)], True


class GeneratorPool:
    made = 0
    """Pools made in this process (every learner rank makes the same ones in the same order):
    :attr:`serial` names a pool's keys in the launcher's store."""

    def __init__(
        self,
        cfg: RunConfig,
        *,
        rank: int,
        learners: int,
        first: int,
        last: int,
        stream_state: dict[str, int],
        max_model_len: int,
        floor: int = 0,
        log: Callable[[str], None] = print,
    ):
        """Generators for batches ``first .. last``; ``floor``: the oldest policy version the
        learner can publish (the step it holds now: 0 fresh, the checkpoint's step resumed)."""
        self.cfg = cfg
        GeneratorPool.made += 1
        self.serial = GeneratorPool.made
        self.k = cfg.rollout.max_staleness
        self.rank = rank
        self.first, self.last, self.floor = first, last, floor
        self.restored: set[int] = set()
        """Batches taken over from a checkpoint (sampled on its schedule, not this pool's)."""
        self.log = log
        self.n = cfg.rollout.generators
        self.tp = cfg.rollout.tensor_parallel
        """Processes per generator (one engine across them); generator ``i``'s first is its
        leader, the one that sends its batches (bridge rank ``1 + i * tp``)."""
        self.received: dict[int, list[dict[str, Any]]] = {}
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.remote: RemoteGenerators | None = None
        """``rollout.generator_nodes``: generators started by agents on other nodes."""
        self.weights: bridge.Group | None = None
        self.batches: bridge.Group | None = None
        self.published: set[int] = set()
        self.sent: dict[str, int] = {}
        """What the last :meth:`publish` sent (:func:`scale.dist.bridge.send_weights`; rank 0)."""
        if rank != 0 or first > last:
            return
        out = Path(cfg.output.dir)
        timeout = cfg.train.dist_timeout_s
        host = _host()
        members = self.n * self.tp + 1
        kv = bridge.store("0.0.0.0", 0, is_master=True, members=members, timeout_s=timeout)
        self.gpus: list[int] = []
        backend = "gloo"
        if cfg.rollout.generator_nodes:  # on nodes of their own, each process its own GPUs
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        elif torch.cuda.is_available():
            here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            self.gpus, shared = generator_gpus(torch.cuda.device_count(), here, self.n, self.tp)
            backend = "gloo" if shared else "nccl"
            if shared:
                log(
                    f"rollout.generators={self.n} share GPUs {self.gpus} with the learners "
                    f"({torch.cuda.device_count()} GPUs for {here} learner(s)): weights go "
                    "through host memory (gloo), not NCCL"
                )
        self.weights_backend = backend
        if cfg.rollout.generator_nodes:
            t = cfg.train
            self.remote = RemoteGenerators(
                kv,
                {
                    "run_dir": str(out.resolve()),
                    "addr": host,
                    "port": kv.port,
                    "count": self.n,
                    "tp": self.tp,
                    "nodes": cfg.rollout.generator_nodes,
                    "backend": backend,
                    "startup_s": t.startup_timeout_s,
                },
                startup_s=t.startup_timeout_s,
                beat_timeout_s=t.heartbeat_timeout_s,
            )
            log(
                f"generators: pool {self.remote.pool} announced to {cfg.rollout.generator_nodes} "
                f"generator node(s) (bridge {host}:{kv.port})"
            )
        else:
            for i in range(self.n):
                for j in range(self.tp):
                    self.procs.append(self._spawn(out, host, kv.port, i, j))
        batches = bridge.group(kv, "batches", 0, members, timeout, alive=self._alive)
        self._store = kv
        hello = {
            "first": first,
            "last": last,
            "k": self.k,
            "floor": floor,
            "learners": learners,
            "stream": stream_state,
            "max_model_len": max_model_len,
        }
        batches.post("hello", bridge.dump(hello))
        self.batches = batches
        self.thread = threading.Thread(
            target=self._receive, args=(batches,), name="dapo-batches", daemon=True
        )
        self.thread.start()

    def _log(self, g: int) -> Path:
        """Generator process ``g``'s log: ``generator<i>.log`` (its leader), ``generator<i>-tp<j>.log``."""
        i, j = divmod(g, self.tp)
        return Path(self.cfg.output.dir) / (f"generator{i}.log" if j == 0 else f"generator{i}-tp{j}.log")

    def _spawn(self, out: Path, host: str, port: int, i: int, j: int) -> subprocess.Popen[bytes]:
        devices = None
        if self.gpus:  # generator_gpus: its own GPUs after the learners', or a shared one
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = visible.split(",") if visible else [str(g) for g in range(torch.cuda.device_count())]
            mine = self.gpus[i * self.tp : (i + 1) * self.tp] if self.tp > 1 else [self.gpus[i]]
            devices = [ids[g] for g in mine]
        return generator_process.spawn(
            out, host, port, i, self.n, j, self.tp, self.weights_backend, devices, self._log(i * self.tp + j)
        )

    def _alive(self) -> None:
        """Raise :class:`EngineError` if a generator process has exited before its work is done
        (or, on other nodes, its node stopped answering)."""
        if self.remote is not None:
            self.remote.alive()
        if any(p.poll() not in (None, 0) for p in self.procs):
            self._check()

    def _receive(self, batches: bridge.Group) -> None:
        """Each batch from each generator, taken as soon as that generator says it is ready (a
        store key), so that no generator waits inside a send for another's round."""
        try:
            for b in range(self.first, self.last + 1):
                parts: dict[int, Any] = {}
                pause = 0.005
                with topology.waiting_for(f"batch {b} from the generators"):
                    while len(parts) < self.n:
                        ready = [
                            i
                            for i in range(self.n)
                            if i not in parts and batches.kv.check([f"batch/{b}/{i}"])
                        ]
                        for i in ready:
                            parts[i] = batches.recv(1 + i * self.tp, f"generator {i}'s batch {b}")
                        if not ready:
                            self._alive()
                            time.sleep(pause)
                        pause = 0.005 if ready else min(1.0, pause * 2)
                with self.cond:
                    self.received[b] = [parts[i] for i in range(self.n)]
                    self.cond.notify_all()
        except BaseException as err:
            with self.cond:
                self.error = err
                self.cond.notify_all()

    def _check(self) -> None:
        if self.remote is not None:
            self.remote.alive()
        for g, p in enumerate(self.procs):
            rc = p.poll()
            if rc not in (None, 0):
                i, j = divmod(g, self.tp)
                log = self._log(g)
                said = f": {tail[:300]}" if (tail := last_line(log)) else ""
                who = f"generator {i}" + (f" (tensor-parallel process {j})" if self.tp > 1 else "")
                raise EngineError(f"{who} exited with status {rc} (see {log}){said}")
        if self.error is not None:
            raise EngineError(f"receiving batches from the generators failed: {self.error}")

    def _needs(self, batch: int) -> range:
        return versions_needed(batch, batch, self.k, self.cfg.rollout.partial, self.floor)

    def _reachable(self, batch: int, holding: int) -> None:
        """:class:`ScheduleError` if ``batch`` cannot arrive while the learner holds version
        ``holding`` and waits: it is outside what the generators were asked for, or a version
        it needs was never published (publishing only goes forward) or is one the learner
        cannot publish before it has this batch."""
        if batch in self.received or batch in self.restored:
            return
        if not self.first <= batch <= self.last:
            raise ScheduleError(
                f"the learner waits for batch {batch}, which no generator was asked for (they "
                f"make batches {self.first}..{self.last}); stopping instead of waiting"
            )
        for v in self._needs(batch):
            if v > holding or v not in self.published:
                why = "is newer than the learner's" if v > holding else "was never published"
                raise ScheduleError(
                    f"batch {batch} needs policy version {v}, which {why} (the learner holds "
                    f"version {holding}; k={self.k}, oldest version {self.floor}): it can never "
                    "arrive; stopping instead of waiting"
                )

    def wait_for(self, batch: int, holding: int) -> float:
        """Block until ``batch`` has arrived (rank 0), while the learner holds version
        ``holding``; the seconds waited."""
        t0 = time.perf_counter()
        with self.cond:
            while batch not in self.received:
                self._reachable(batch, holding)
                self._check()
                self.cond.wait(1.0)
        return time.perf_counter() - t0

    def take(self, step: int) -> tuple[list[dict[str, Any]], float]:
        """Batch ``step``'s messages, one per generator (rank 0), and the seconds waited. Every
        token must be within k of the learner (version ``step - 1``); a batch this pool made
        must also come from exactly the version the schedule names."""
        idle = self.wait_for(step, step - 1)
        with self.cond:
            parts = self.received.pop(step)
        want = behaviour_version(step, self.k, self.floor)
        for p in parts:
            if step not in self.restored and p["version"] != want:
                raise StalenessError(f"batch {step} was sampled by version {p['version']}, not {want}")
            groups = p["groups"]
            if groups is not None:
                v = groups["extras"]["version"][groups["mask"]]
                if v.numel() and (int(v.min()) < step - 1 - self.k or int(v.max()) > step - 1):
                    raise StalenessError(
                        f"batch {step} holds tokens of versions {int(v.min())}..{int(v.max())}; "
                        f"the learner at version {step - 1} allows {step - 1 - self.k}.. with "
                        f"rollout.max_staleness={self.k}"
                    )
        return parts, idle

    def tokens_in_flight(self) -> int:
        with self.cond:
            return sum(
                int(p["groups"]["lengths"].sum())
                for parts in self.received.values()
                for p in parts
                if p["groups"]
            )

    def in_flight(self, step: int) -> dict[int, list[dict[str, Any]]]:
        """After step ``step``: batches ``step+1 .. step+k`` (within the run), waited for (rank 0)."""
        upto = min(step + self.k, self.last)
        for b in range(step + 1, upto + 1):
            self.wait_for(b, step)
        with self.cond:
            return {b: self.received[b] for b in range(step + 1, upto + 1)}

    def restore(self, held: dict[int, list[dict[str, Any]]]) -> None:
        """Batches a checkpoint held (:func:`in_flight_to_continue`), for the learner to take."""
        with self.cond:
            self.received.update(held)
            self.restored.update(held)

    def publish(
        self, version: int, named: Callable[[], Iterator[tuple[str, torch.Tensor]]], header: list[Any]
    ) -> bool:
        """Send policy ``version`` to the generators if a batch still to sample needs it
        (every learner rank calls this; ``named`` gathers the full tensors)."""
        needed = versions_needed(self.first, self.last, self.k, self.cfg.rollout.partial, self.floor)
        if version not in needed or version in self.published:
            return False
        self.published.add(version)
        stream = named()
        if self.rank != 0 or self.first > self.last:  # the other ranks: take part in gathering only
            for _ in stream:
                pass
            return True
        try:
            if self.weights is None:
                self.weights = self._join_weights()
            self.sent = bridge.send_weights(self.weights, version, stream, header)
        except Exception:
            self._blame_generator()
            raise
        return True

    def _join_weights(self) -> bridge.Group:
        """The weights group, built once every generator has its engine (vLLM measures free
        device memory while it starts; an NCCL communicator made meanwhile would skew it): each
        generator says ``ready/<i>`` after its engine exists, the learner then says ``join`` and
        all build the group together. The wait for the engines is on the host."""
        assert self.batches is not None
        for g in range(self.n * self.tp):
            self.batches.wait(f"ready/{g}", f"generator {g // self.tp} to build its engine", self._alive)
        self.batches.post("join")
        weights = bridge.group(
            self._store,
            "weights",
            0,
            self.n * self.tp + 1,
            self.cfg.train.dist_timeout_s,
            backend=self.weights_backend,
            alive=self._alive,
        )
        weights.held = delta.Base() if self.cfg.rollout.delta_sync else None  # the version sent last
        return weights

    def _blame_generator(self, wait_s: float = 10.0) -> None:
        """After a failed exchange: if a generator process has died, say so (it is the cause)."""
        end = time.monotonic() + wait_s
        while time.monotonic() < end and all(p.poll() is None for p in self.procs):
            if self.remote is not None:
                self.remote.alive()
            time.sleep(0.2)
        self._check()

    def close(self, timeout_s: float = 120.0) -> None:
        """Wait for the generators to finish (they stop after the last batch); kill any left."""
        end = time.monotonic() + timeout_s
        while self.remote is not None and not self.remote.finished() and time.monotonic() < end:
            try:
                self.remote.alive()
            except EngineError as err:  # every batch arrived: the run is done all the same
                self.log(f"warning: {err} (after its last batch)")
                break
            time.sleep(0.2)
        for p in self.procs:
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def weights_header(lm: torch.nn.Module, dtype: torch.dtype) -> list[tuple[str, list[int], str]]:
    """Name, full shape and engine dtype of each tensor :func:`scale.learner.sync.stream_weights`
    yields, in its order (a LoRA policy's merged tensors under the base model's names)."""
    return [(n, list(t.shape), str(dtype).removeprefix("torch.")) for n, t, *_ in stream_plan(lm)]


__all__ = [
    "GeneratorPool",
    "ScheduleError",
    "StalenessError",
    "generator_gpus",
    "in_flight_to_continue",
    "oldest_version",
    "replan",
    "weights_header",
]


class Disaggregated(Placement):
    """The disaggregated placement, on every learner rank: the generator processes as one
    pool (:class:`GeneratorPool`, started by :meth:`start`), batch ``s`` sampled by policy
    version ``max(0, s - 1 - rollout.max_staleness)`` while the learners train the steps
    before it; rank 0 receives each batch, checks its staleness and sends each rank its share
    (:meth:`collect`); after each step every rank takes part in publishing the new version
    (:meth:`publish`). Its part of a checkpoint: the batches in flight (:meth:`rank_state`).

    The calls of :class:`scale.placement.interface.Placement`."""

    learners_generate = False

    def __init__(
        self,
        cfg: RunConfig,
        *,
        acc: Any,
        ranks: Any,
        comm: Any,
        learner: Any,
        prompts: Any,
        trace: Any,
        log: Any,
    ):
        self.cfg, self.acc, self.comm, self.learner, self.trace, self.log = (
            cfg,
            acc,
            comm,
            learner,
            trace,
            log,
        )
        self.rank, self.world = acc.process_index, acc.num_processes
        self.out = Path(cfg.output.dir)
        self.stream, self.context_len = prompts.stream, prompts.context_len
        self.held: dict[int, list[dict[str, Any]]] = {}
        """Rank 0: batches generated ahead of the step (in flight), a resumed checkpoint's first
        (:meth:`take_in_flight`)."""
        self.pool: GeneratorPool | None = None
        self.traced: set[int] = set()
        """Rank 0, ``output.trace_rollouts``: the versions ``trace/weights.jsonl`` holds a row of."""

    def keep_in_flight(
        self, held: dict[int, list[dict[str, Any]]], step: int
    ) -> tuple[dict[int, list[dict[str, Any]]], list[int], str]:
        """Those still within ``rollout.max_staleness`` (:func:`in_flight_to_continue`)."""
        k = self.cfg.rollout.max_staleness
        kept, dropped = in_flight_to_continue(held, step, k)
        return kept, dropped, f"their tokens are older than rollout.max_staleness={k} allows"

    def take_in_flight(
        self, path: Path, state: dict[str, Any], zero: dict[str, Any], *, step: int, stream: Any, rank: int
    ) -> dict[int, list[dict[str, Any]]]:
        """The checkpoint's batches this run trains as they are (rank 0), split again for
        another number of learner ranks (:func:`replan`); the generators start after them."""
        kept = super().take_in_flight(path, state, zero, step=step, stream=stream, rank=rank)
        for msgs in kept.values():
            if len(msgs[0]["plan"]) != self.world:
                msgs[0]["plan"] = replan(msgs, self.world, self.cfg.algo.group_size)
        self.held = kept
        return kept

    def start(self, step: int, end: int) -> None:
        """Generator processes for the batches up to step ``end`` and the k after it (in flight
        at the checkpoint of step ``end``), starting after the batches held."""
        c = self.cfg
        k = c.rollout.max_staleness
        last = min(end + k, c.train.steps)
        if self.pool is not None:
            if self.pool.last >= last:
                return
            self.pool.close()
            if self.rank == 0:
                self.held.update(self.pool.received)
        first = step + 1 + topology.all_max(len(self.held), self.acc.device)
        if self.rank == 0 and self.pool is None:  # a resumed run's traces: drop what runs again
            for path in (self.out / "trace").glob("generator*.jsonl"):
                trim_jsonl(path, first - 1)
            # versions up to the checkpoint's stay: the resumed learner holds exactly those
            # weights, and a batch in flight may have been sampled with any of them (until
            # 2026-12-07 the checkpoint's own row went, and was not written again when no batch
            # left to generate needed it)
            kept = trim_jsonl(self.out / "trace" / "weights.jsonl", step)
            self.traced = {int(r["version"]) for r in kept}
        self.pool = GeneratorPool(
            c,
            rank=self.rank,
            learners=self.world,
            first=first,
            last=last,
            stream_state=self.stream.state_dict()
            if not self.held
            else self.held[max(self.held)][-1]["stream"],
            max_model_len=self.context_len,
            floor=step,  # no older version exists here (a resumed run's checkpoint step)
            log=self.log,
        )
        if self.rank == 0:
            self.pool.restore(self.held)
        self.held = {}
        self.publish(step)

    def publish(self, version: int) -> dict[str, float]:
        """Send policy ``version`` to the generators if a batch needs it."""
        assert self.pool is not None
        r = self.cfg.rollout
        dt = dtype(r.dtype)
        stats = SyncStats()
        t0 = time.perf_counter()
        sent_tensors: list[tuple[str, torch.Tensor]] = []
        traced = self.cfg.output.trace_rollouts and self.rank == 0

        def named() -> Iterator[tuple[str, torch.Tensor]]:
            for name, t in stream_weights(
                self.learner.lm,
                dtype=dt,
                device=self.acc.device,
                bucket_bytes=int(r.sync_bucket_mb * MIB),
                stats=stats,
            ):
                if traced:
                    sent_tensors.append((name, t.cpu()))
                yield name, t

        sent = self.pool.publish(version, named, weights_header(self.learner.lm, dt))
        stats.seconds = time.perf_counter() - t0
        if sent and traced and version not in self.traced:  # what the generators must report having loaded
            self.traced.add(version)
            path = self.out / "trace" / "weights.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(
                    json.dumps({"step": version, "version": version, "weights": bridge.digest(sent_tensors)})
                    + "\n"
                )
        if not sent:
            return {}
        out = stats.metrics()
        moved = self.pool.sent if r.delta_sync else {}
        if moved.get("elements"):  # rank 0: what crossed to the generators
            out["sync/sent_bytes"] = float(moved["sent_bytes"])
            out["sync/changed_fraction"] = moved["changed"] / moved["elements"]
        return out

    def collect(self, step_done: int) -> tuple[RolloutBatch | None, dict[str, float]]:
        """Rank 0 takes batch ``step_done + 1`` from the generators (its staleness checked),
        splits it as their plan says and sends each learner rank its share."""
        assert self.pool is not None
        step = step_done + 1
        outgoing: dict[int, bytes] = {}
        m: dict[str, float] = {}
        taken = f"pool{self.pool.serial}/taken/{step}"
        if self.rank != 0:  # rank 0 may wait a generation round: wait on the host, not in the all-gather
            topology.wait_announced(taken, f"rank 0 to take batch {step} from the generators")
        if self.rank == 0:
            msgs, idle = self.pool.take(step)
            topology.announce(taken)
            self.stream.load_state_dict(msgs[-1]["stream"])
            m = dict(msgs[0]["metrics"])
            for line in msgs[0].get("warnings", []):
                self.log(f"step {step}: {line}")
            g = self.cfg.algo.group_size
            rows: dict[tuple[int, ...], tuple[RolloutBatch, int]] = {}
            ages = []
            for msg in msgs:
                if msg["groups"] is None:
                    continue
                b = from_state(msg["groups"])
                ages.append((step - 1) - b.extras["version"][b.mask].long())
                for j, key in enumerate(msg["keys"]):
                    rows[tuple(key)] = (b, j)
            for dst, keys in enumerate(msgs[0]["plan"]):
                parts = [
                    rows[tuple(k)][0].select(
                        torch.arange(rows[tuple(k)][1] * g, (rows[tuple(k)][1] + 1) * g), group_size=g
                    )
                    for k in keys
                ]
                if parts:
                    outgoing[dst] = bridge.dump(batch_state(RolloutBatch.concat(parts)))
            age = torch.cat(ages) if ages else torch.zeros(0, dtype=torch.long)
            m["async/staleness_mean"] = float(age.float().mean()) if age.numel() else math.nan
            m["async/staleness_max"] = float(age.max()) if age.numel() else math.nan
            m["async/trainer_idle_s"] = idle
            m["async/generator_idle_s"] = max(float(x["idle_s"]) for x in msgs)
            m["async/tokens_in_flight"] = float(self.pool.tokens_in_flight())
            m["time/generate_s"] = max(float(x["generate_s"]) for x in msgs)
        sizes = self.comm.all_gather(
            {dst: len(b) for dst, b in outgoing.items()}, f"the batch layout of step {step}"
        )
        incoming = {0: sizes[0][self.rank]} if self.rank in sizes[0] else {}
        got = self.comm.exchange(outgoing, incoming, f"this rank's share of batch {step}")
        batch = from_state(bridge.load(got[0])) if got else None
        if self.cfg.output.trace_rollouts:
            self.trace.share(batch)
        return batch, m

    def before_update(self) -> None:
        """The learners hold no engine."""

    def evaluate(self, step: int) -> dict[str, float]:
        """None here (``eval.every`` must be 0: the generators hold older versions)."""
        return {}

    def rank_state(self, step: int, state: dict[str, Any]) -> dict[str, Any]:
        """Rank 0 also keeps the batches in flight (sampled for the k steps after ``step`` by
        versions the checkpoint no longer holds) and the stream's position after them, where
        the generators continue."""
        held_key = f"pool{self.pool.serial}/held/{step}" if self.pool is not None else ""
        if self.pool is not None and self.rank != 0:  # rank 0 waits for k batches: on the host here
            topology.wait_announced(held_key, f"rank 0 to receive the batches in flight after step {step}")
        if self.pool is not None and self.rank == 0:
            held = self.pool.in_flight(step)
            topology.announce(held_key)
            state["in_flight"] = held
            state["stream_at_step"] = state["stream"]  # before the held batches' prompts
            if held:
                state["stream"] = held[max(held)][-1]["stream"]
        return state

    def close(self) -> None:
        """The run has finished: wait for the generators; agents on other nodes may leave."""
        if self.pool is not None:
            self.pool.close()
            if self.pool.remote is not None:
                self.pool.remote.done()
