"""Benchmark: wall time of `dapo toy run all` (10 seeds per arm) and sampled tokens per
second, parallel (the default, one worker per core) against a serial baseline measured in
the same run. Writes benchmarks/results/toy_speed.json.

    python benchmarks/toy_speed.py            # ~3 minutes on 2 cores
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

import torch

from toybench.experiment import run_experiments
from toybench.experiments import REGISTRY

TARGET_WALL_S = 60.0


def measure(jobs: int) -> dict:
    t0 = time.perf_counter()
    results = run_experiments(list(REGISTRY.values()), seeds=10, jobs=jobs)
    wall = time.perf_counter() - t0
    tokens = sum(r.sampled_tokens() for r in results)
    return {
        "jobs": jobs,
        "wall_seconds": round(wall, 2),
        "sampled_tokens": tokens,
        "tokens_per_second": round(tokens / wall),
        "cpu_seconds_per_experiment": {r.experiment.name: round(r.cpu_seconds, 2) for r in results},
        "verdicts": {r.experiment.name: r.primary.verdict for r in results},
    }


def main() -> None:
    cores = os.cpu_count() or 1
    parallel = measure(cores)
    serial = measure(1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {
        "benchmark": "dapo toy run all --seeds 10",
        "command": "python benchmarks/toy_speed.py",
        "commit": commit,
        "machine": {"cores": cores, "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "torch": torch.__version__},
        "target_wall_seconds": TARGET_WALL_S,
        "parallel": parallel,
        "serial_baseline": serial,
        "speedup_vs_serial": round(serial["wall_seconds"] / parallel["wall_seconds"], 2),
        "meets_target": parallel["wall_seconds"] <= TARGET_WALL_S,
    }
    path = Path(__file__).parent / "results" / "toy_speed.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
