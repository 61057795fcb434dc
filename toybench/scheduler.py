"""Which runs train together, and on which process.

:func:`plan` stacks runs that can share the batched engine (:mod:`toybench.engine`) into
jobs of at most ``max_runs`` runs with the same window geometry (so no run waits on
windows it does not have); anything else (the GRU policy, the health suite's injected
engine noise and learning-rate fault) is a job of one run for the per-run loop (:func:`toybench.runner.train`). :func:`execute`
runs the jobs, longest first, on this process and ``workers - 1`` spawned ones that start
while this one already computes. Results never depend on the plan or the worker count:
each run owns its random stream.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dapo.progress import Progress
from dapo.registry import LossSpecError

from .runner import RunSpec, train

Log = list[dict[str, float]]
RunId = tuple[str, str, int]
"""(experiment, arm, seed)."""


@dataclass(frozen=True)
class Job:
    runs: tuple[tuple[RunId, RunSpec], ...]
    batched: bool

    @property
    def run_steps(self) -> int:
        return sum(spec.steps for _, spec in self.runs)

    def cost(self) -> float:
        """Rough relative cost, for ordering only: token slots touched per step."""
        total = 0.0
        for _, s in self.runs:
            c = s.cfg
            windows = math.ceil(c.train_groups / c.mini_batch_groups)
            rounds = 3 if c.dynamic_sampling else 1
            total += s.steps * (c.ppo_epochs + rounds + (0 if self.batched else windows)) * c.max_len
        return total * (1.0 if self.batched else 4.0)  # the per-run loop pays Python per run


def plan(runs: Sequence[tuple[RunId, RunSpec]], engine: str = "batched", max_runs: int = 40) -> list[Job]:
    """Jobs for ``runs``; ``engine="loop"`` forces one job per run on the per-run loop."""
    from .engine import batch_key

    if engine not in ("batched", "loop"):
        raise ValueError(f"engine must be 'batched' or 'loop', got {engine!r}")
    jobs: list[Job] = []
    groups: dict[tuple, list[tuple[RunId, RunSpec]]] = {}
    for rid, spec in runs:
        key = batch_key(spec) if engine == "batched" else None
        if key is None:
            jobs.append(Job(((rid, spec),), batched=False))
        else:
            groups.setdefault((key, spec.cfg.ppo_epochs, spec.cfg.mini_batch_groups), []).append((rid, spec))
    for members in groups.values():
        n_chunks = math.ceil(len(members) / max_runs)
        size = math.ceil(len(members) / n_chunks)
        for i in range(0, len(members), size):
            jobs.append(Job(tuple(members[i : i + size]), batched=True))
    jobs.sort(key=lambda j: -j.cost())
    return jobs


def run_job(job: Job, on_step: Callable[[int], None] | None = None) -> tuple[list[tuple[RunId, Log]], float]:
    """Train a job's runs; returns (run id, log) pairs and the CPU seconds spent."""
    t0 = time.process_time()
    if job.batched:
        from .engine import train_many

        logs = train_many([spec for _, spec in job.runs], progress=on_step)
    else:
        logs = []
        for _, spec in job.runs:
            logs.append(train(spec))
            if on_step is not None:
                on_step(spec.steps)
    return [(rid, log) for (rid, _), log in zip(job.runs, logs)], time.process_time() - t0


class _WorkerFailed(RuntimeError):
    """A spawned worker's job raised (its traceback is the message)."""


def _take(cursor) -> int:
    with cursor.get_lock():
        i = cursor.value
        cursor.value += 1
    return i


def _worker(jobs: list[Job], cursor, counter, results, parent: int) -> None:
    import torch

    torch.set_num_threads(1)

    def on_step(k: int) -> None:
        with counter.get_lock():
            counter.value += k

    while os.getppid() == parent and (i := _take(cursor)) < len(jobs):  # an orphan stops after its job
        try:
            results.put((i, run_job(jobs[i], on_step), None))
        except LossSpecError as e:  # a user's loss failed: the parent raises it as it is
            results.put((i, None, e))
            return
        except BaseException:  # reported to the parent, which raises
            results.put((i, None, traceback.format_exc()))
            return


QUIET_EVERY_S = 30.0
"""Seconds between the progress lines of a ``--quiet`` toy command (``$DAPO_QUIET_PROGRESS_S``
overrides it): quiet drops the bar, never every sign of life."""


def quiet_every() -> float:
    """:data:`QUIET_EVERY_S`, or ``$DAPO_QUIET_PROGRESS_S`` (seconds, >= 0) where set."""
    raw = os.environ.get("DAPO_QUIET_PROGRESS_S", "")
    try:
        value = float(raw) if raw else QUIET_EVERY_S
    except ValueError:
        return QUIET_EVERY_S
    return value if value >= 0 and math.isfinite(value) else QUIET_EVERY_S


def execute(
    jobs: list[Job], workers: int = 1, label: str = "toy runs", show_progress: bool = True
) -> list[tuple[list[tuple[RunId, Log]], float]]:
    """Run ``jobs`` on ``workers`` processes (this one included); results in job order."""
    import torch

    total = sum(j.run_steps for j in jobs)
    if show_progress:
        bar = Progress(total, label)
    else:  # --quiet: no bar, but never silent minutes: a plain line every QUIET_EVERY_S
        every = quiet_every()
        bar = Progress(total, label, plain=True, log_every=every, delay=every / 3)
    done: dict[int, tuple[list[tuple[RunId, Log]], float]] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if workers <= 1 or len(jobs) <= 1:
            steps = 0

            def local(k: int) -> None:
                nonlocal steps
                steps += k
                bar.update(steps)

            for i, job in enumerate(jobs):
                done[i] = run_job(job, local)
            return [done[i] for i in range(len(jobs))]
        ctx = mp.get_context("spawn")
        cursor, counter, results = ctx.Value("i", 0), ctx.Value("q", 0), ctx.Queue()
        procs = [
            ctx.Process(target=_worker, args=(jobs, cursor, counter, results, os.getpid()), daemon=True)
            for _ in range(min(workers, len(jobs)) - 1)
        ]
        for p in procs:
            p.start()

        def drain(block: bool) -> None:
            try:
                i, res, err = results.get(timeout=0.2) if block else results.get_nowait()
            except queue.Empty:
                return
            if isinstance(err, LossSpecError):
                raise err
            if err is not None:
                raise _WorkerFailed(f"toy worker failed on job {i}:\n{err}")
            done[i] = res

        def on_step(k: int) -> None:
            with counter.get_lock():
                counter.value += k
            bar.update(counter.value)
            drain(block=False)  # a worker that failed stops this process's job too, at once

        try:
            while (i := _take(cursor)) < len(jobs):  # this process works too while workers start
                try:
                    done[i] = run_job(jobs[i], on_step)
                except (LossSpecError, _WorkerFailed):
                    raise
                except Exception as e:  # reported as a worker's failure is, whichever process ran it
                    raise RuntimeError(f"toy worker failed on job {i}:\n{traceback.format_exc()}") from e
            while len(done) < len(jobs):
                drain(block=True)
                bar.update(counter.value)
                if len(done) < len(jobs) and not any(p.is_alive() for p in procs) and results.empty():
                    codes = [p.exitcode for p in procs]
                    raise RuntimeError(
                        f"toy workers exited (codes {codes}) with {len(jobs) - len(done)} job(s) unfinished"
                    )
        finally:
            for p in procs:
                if p.is_alive() and len(done) < len(jobs):
                    p.terminate()
                p.join(timeout=5)
        return [done[i] for i in range(len(jobs))]
    finally:
        torch.set_num_threads(threads)
        bar.close()
