"""Benchmark: wall time of the toy regime's main jobs on the batched engine against the
per-run loop, measured in the same run on the same machine. Writes
benchmarks/results/toy_speed.json.

    python benchmarks/toy_speed.py            # ~11 minutes on 2 cores (the loop is the slow part)
    python benchmarks/toy_speed.py --only ladder_both_blocks

Measured, each with ``jobs`` = CPU count, after the interpreter has imported the package
(the CLI adds ~2 s of imports):

* ``dapo toy run all --seeds 10``: the four experiments on both seed blocks (20 seeds per arm);
* the same on the discovery block only (``--no-confirm``, the old single block of 10 seeds);
* ``dapo toy ladder``: the six rungs and two variants on both blocks.

For each, the batched engine and the per-run loop give the same verdicts and intervals
(checked here, to 1e-9); the file records both times, their ratio, and whether the
batched time meets the 10 s goal.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import time
from pathlib import Path

import torch

from toybench.experiment import run_experiments
from toybench.experiments import REGISTRY
from toybench.ladder import ladder_experiment

TARGET_WALL_S = 10.0


def _intervals(results) -> list[tuple]:
    return [
        (
            r.experiment.name,
            c.contrast.name,
            block,
            b.verdict,
            b.interval.mean,
            b.interval.low,
            b.interval.high,
        )
        for r in results
        for c in r.contrasts
        for block, b in c.blocks.items()
    ]


def _same(a: list[tuple], b: list[tuple]) -> bool:
    def close(x, y):
        if isinstance(x, float):
            return (math.isnan(x) and math.isnan(y)) or abs(x - y) <= 1e-9
        return x == y

    differ = [(ra, rb) for ra, rb in zip(a, b) if not all(close(x, y) for x, y in zip(ra, rb))]
    for ra, rb in differ[:5]:
        print("differs:", ra, rb, flush=True)
    return len(a) == len(b) and not differ


def measure(name: str, experiments, jobs: int, confirm: bool) -> dict:
    out = {}
    runs = {}
    for engine in ("batched", "loop"):
        t0 = time.perf_counter()
        results = run_experiments(
            experiments, seeds=10, jobs=jobs, confirm=confirm, engine=engine, progress=False
        )
        wall = time.perf_counter() - t0
        runs[engine] = results
        out[engine] = {
            "wall_seconds": round(wall, 2),
            "sampled_tokens": sum(r.sampled_tokens() for r in results),
            "seeds_per_arm": len(results[0].seeds),
            "verdicts": {r.experiment.name: r.primary.verdict for r in results if r.contrasts},
        }

    # and every per-seed summary (the ladder has no contrasts), to rounding
    def summaries(results):
        return [
            (r.experiment.name, k, a, i, x)
            for r in results
            for k, per in r.summaries.items()
            for a, v in per.items()
            for i, x in enumerate(v)
        ]

    same = _same(_intervals(runs["batched"]), _intervals(runs["loop"])) and _same(
        summaries(runs["batched"]), summaries(runs["loop"])
    )
    out["speedup"] = round(out["loop"]["wall_seconds"] / out["batched"]["wall_seconds"], 2)
    out["same_verdicts_and_intervals"] = same
    out["meets_target"] = out["batched"]["wall_seconds"] <= TARGET_WALL_S
    print(name, json.dumps(out), flush=True)
    return out


PARTS = {
    "run_all_both_blocks": ("run all", lambda: list(REGISTRY.values()), True),
    "run_all_discovery_only": ("run all --no-confirm", lambda: list(REGISTRY.values()), False),
    "ladder_both_blocks": ("ladder", lambda: [ladder_experiment()], True),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only",
        nargs="+",
        choices=list(PARTS),
        default=list(PARTS),
        help="measure these parts and keep the others already in the results file",
    )
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    path = Path(__file__).parent / "results" / "toy_speed.json"
    out = json.loads(path.read_text()) if path.exists() and args.only != list(PARTS) else {}
    out.update(
        {
            "benchmark": "toy regime: batched engine vs per-run loop",
            "command": "python benchmarks/toy_speed.py",
            "machine": {
                "cores": cores,
                "processor": platform.processor() or platform.machine(),
                "python": platform.python_version(),
                "torch": torch.__version__,
            },
            "target_wall_seconds": TARGET_WALL_S,
            "jobs": cores,
        }
    )
    for key in args.only:
        name, experiments, confirm = PARTS[key]
        out[key] = {"commit": commit, **measure(name, experiments(), cores, confirm)}
        path.write_text(json.dumps(out, indent=2) + "\n")  # after each part: a crash keeps what was measured
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
