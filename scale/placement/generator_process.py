"""A generator process of a disaggregated run (``python -m scale.placement.generator_process``,
started by the learner's rank 0, :class:`scale.placement.disaggregated.GeneratorPool`, or by a
generator node's agent, :mod:`scale.placement.generator_node`).

It builds the generator role from the run's config.json (its inputs as the learners build
theirs, :class:`scale.generator.prompts.Prompts`; its engine and generator,
:meth:`scale.generator.role.Generator.build`), joins the bridge (:mod:`scale.dist.bridge`), and
for each batch ``b`` of its range takes policy version :func:`dapo.pipeline.behaviour_version` ``(b, k)`` from the versions
the learner published (received into host memory at points every generator process passes
in the same order, between rounds: :mod:`scale.placement.receive`), loads it into the engine
when the batch needs it, generates its slice of every round, decides
dynamic sampling together with the other generators over their own group, and sends its kept
groups (and, from generator 0, the learners' plan and the metrics) to the learner's rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dapo.pipeline import behaviour_version, partial_version, versions_needed
from dapo.sampling import SamplingWarning

from ..dist.topology import Ranks
from ..generator.prompts import ALONE, Prompts
from ..generator.role import Generator
from ..generator.rollout import batch_state
from .receive import Receiver


def _die_with_parent() -> None:
    """A generator ends with the process that started it (Linux: PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def spawn(
    run_dir: Path,
    addr: str,
    port: int,
    index: int,
    count: int,
    tp_rank: int,
    tp: int,
    backend: str,
    devices: list[str] | None,
    log: Path,
) -> subprocess.Popen[bytes]:
    """Start generator ``index``'s tensor-parallel process ``tp_rank`` (of ``tp``) for the bridge
    at ``addr:port``, on ``devices`` (CUDA device ids; None: as inherited), its output appended
    to ``log``; it dies with its parent. The learner's rank 0 starts its node's generators with
    this, a generator node's agent its own (:mod:`scale.placement.generator_node`)."""
    cmd = [
        sys.executable,
        "-m",
        "scale.placement.generator_process",
        "--run-dir",
        str(run_dir),
        "--addr",
        addr,
        "--port",
        str(port),
        "--index",
        str(index),
        "--count",
        str(count),
        "--tp-rank",
        str(tp_rank),
        "--weights-backend",
        backend,
    ]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK"):
        env.pop(var, None)  # a generator is not a rank of the learner's group
    if tp > 1:  # the generator's own group of tp processes (vLLM's external_launcher)
        env.update(RANK=str(tp_rank), LOCAL_RANK=str(tp_rank), WORLD_SIZE=str(tp), LOCAL_WORLD_SIZE=str(tp))
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
        )


def main(argv: list[str] | None = None) -> int:
    """One generator process of a disaggregated run (started by the learner's rank 0)."""
    ap = argparse.ArgumentParser(prog="python -m scale.placement.generator_process")
    ap.add_argument("--run-dir", required=True, help="the run's output.dir (its config.json)")
    ap.add_argument("--addr", required=True, help="the bridge's store (the learner's rank 0)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--index", type=int, required=True, help="this generator, from 0")
    ap.add_argument("--count", type=int, required=True, help="generators in the run")
    ap.add_argument(
        "--tp-rank",
        type=int,
        default=0,
        help="this process within its generator (rollout.tensor_parallel processes, one engine; 0 sends)",
    )
    ap.add_argument(
        "--weights-backend",
        choices=("gloo", "nccl"),
        default="gloo",
        help="how versions arrive (the learner's choice, scale.placement.disaggregated.generator_gpus)",
    )
    args = ap.parse_args(argv)
    from ..config import from_dict
    from ..dist.startup import import_and_freeze, unfreeze_deferred

    cfg = from_dict(json.loads((Path(args.run_dir) / "config.json").read_text()), source="config.json")
    import_and_freeze(learner=False, vllm=cfg.rollout.engine == "vllm")  # before any group exists
    from ..dist import bridge, delta

    i, n, j, tp = args.index, args.count, args.tp_rank, cfg.rollout.tensor_parallel
    g, procs = i * tp + j, n * tp  # this process among every generator process
    timeout = cfg.train.dist_timeout_s
    kv = bridge.store(args.addr, args.port, is_master=False, members=procs + 1, timeout_s=timeout)
    backend = args.weights_backend
    batches = bridge.group(kv, "batches", g + 1, procs + 1, timeout)
    peers = bridge.group(kv, "generators", g, procs, timeout)
    shm_ident = None
    if tp > 1:  # the generator's processes: a default group of their own for vLLM's external_launcher
        from datetime import timedelta

        import torch.distributed as dist

        if torch.cuda.is_available():
            torch.cuda.set_device(j)
        dist.init_process_group(
            "nccl" if torch.cuda.is_available() else "gloo",
            store=dist.PrefixStore(f"dapo-bridge/generator{i}/", kv),
            rank=j,
            world_size=tp,
            timeout=timedelta(seconds=timeout),
        )
        shm_ident = f"dapo-gen{i}-{args.addr.replace('/', '_')}_{args.port}"
    hello = bridge.load(batches.wait("hello", "the learner's start message"))
    first, last, k, learners = hello["first"], hello["last"], hello["k"], hello["learners"]
    floor = hello.get("floor", 0)  # the oldest version the learner can publish (a resume's step)

    # the generator's inputs as the learners prepared them (their cache, read alone here)
    prompts = Prompts.build(cfg, ALONE, lambda _msg: None, evaluation=False)
    stream = prompts.stream
    stream.load_state_dict(hello["stream"])
    gen = Generator.build(
        cfg,
        prompts,
        ranks=Ranks(g, procs, tp),  # generator i's group: seeded rollout.seed + i
        comm=bridge.PickledComm(peers),
        distributed=tp > 1,  # one engine across the generator's processes
        sleep=False,  # a generator never shares its devices with training
        context_len=hello["max_model_len"],  # the learners' (their evaluation set counted)
        shm_ident=shm_ident,
    )
    engine = gen.engine
    # the weights group only now that the engine exists (scale.placement.disaggregated GeneratorPool._join_weights)
    batches.post(f"ready/{g}")
    batches.wait("join", "the learner to send its first policy version")
    weights = bridge.group(kv, "weights", g + 1, procs + 1, timeout, backend=backend)
    weights.held = delta.Base() if cfg.rollout.delta_sync else None  # the version received last
    # received at points every generator process passes in the same order, never beside
    # generation (scale.placement.receive: NCCL's rule for two communicators on one device)
    versions = Receiver(weights, versions_needed(first, last, k, cfg.rollout.partial, floor), leader=g == 0)
    trace_path = Path(args.run_dir) / "trace" / f"generator{i}.jsonl"
    step = [first]

    def trace(**fields: Any) -> None:
        """``output.trace_rollouts``: per round what this engine was asked for, per batch the
        version it sampled with and a digest of the weights it had loaded."""
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        with trace_path.open("a") as f:
            f.write(json.dumps({"step": step[0], "generator": i, **fields}) + "\n")

    gen.trace = trace if cfg.output.trace_rollouts and j == 0 else None
    gen.between_rounds = versions.point
    loaded = -1

    def switch(b: int) -> Callable[[], int] | None:
        fresh = partial_version(b, k, floor)
        if fresh is None:
            return None

        def load() -> int:
            nonlocal loaded
            engine.sync_weights(iter(tensors := versions.take(fresh)))
            loaded = fresh
            if cfg.output.trace_rollouts and j == 0:
                trace(version=fresh, weights=bridge.digest(tensors), partial=True)
            return fresh

        return load

    for b in range(first, last + 1):
        v = behaviour_version(b, k, floor)
        t0 = time.perf_counter()
        tensors = versions.take(v)
        idle = time.perf_counter() - t0
        step[0] = b
        if loaded != v:
            engine.sync_weights(iter(tensors))
            loaded = v
        if cfg.output.trace_rollouts and j == 0:
            trace(version=v, weights=bridge.digest(tensors))
        t1 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SamplingWarning)
            sampler = gen.rounds(b - 1, v, switch(b) if cfg.rollout.partial else None)
            keys, mine, plan = sampler.kept(learners)
        message: dict[str, Any] = {
            "batch": b,
            "version": v,
            "keys": [list(x) for x in keys],
            "groups": batch_state(mine),
            "stream": stream.state_dict(),
            "idle_s": idle,
            "generate_s": time.perf_counter() - t1,
        }
        if j:  # the leader (tensor-parallel process 0) sends; the others hold the same batch
            continue
        if i == 0:
            message["plan"] = [[list(x) for x in part] for part in plan]
            message["metrics"] = sampler.metrics()
            message["warnings"] = [str(w.message) for w in caught]
        batches.post(f"batch/{b}/{i}")  # the learner receives it as soon as it sees this
        batches.send(message, bridge.LEARNER, f"the learner to take batch {b}")
    if (shutdown := getattr(engine, "shutdown", None)) is not None:
        with unfreeze_deferred():  # its collections skip the frozen heap: the process ends here
            shutdown()
    if tp > 1:
        import torch.distributed as dist

        if dist.is_initialized():  # vLLM's shutdown may have ended it
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    sys.exit(main())
