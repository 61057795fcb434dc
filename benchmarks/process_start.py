"""Benchmark: what one ``dapo train`` process costs in this tree against a baseline commit, in the
same run: a one-process tiny run (``dapo train --config tiny-cpu``, 3 steps, a vLLM-CPU engine),
whose time is mostly the process's start (imports, the engine) and teardown. Writes
benchmarks/results/process_start.json.

    python benchmarks/process_start.py --baseline 9b0c914     # ~4 minutes on 2 cores

Four rows, each the median of ``--repeats`` runs (run in turn, row after row, after one
unmeasured run per tree that builds its tiny model and data): the baseline tree and this tree
(``scale/dist/startup.py``: the heavy imports with the collector paused, then frozen, and the
engine's teardown collections deferred), each as it is and with ``TORCHDYNAMO_DISABLE=1``, as
the tests and ``scale_cpu`` run it (``noxfile.py``, ``CPU_ENV``: vLLM's compiled sampler
functions run uncompiled). This tree's rows have ratios against the plain baseline
(``wall_ratio``, ``cpu_ratio``) and against the baseline in the same environment
(``..._same_env``). Wall and CPU seconds (user + system of the process and its children) and
the 1-minute load average before each run. Needs
the ``scale`` and ``scale-cpu`` extras (``nox -s tests`` installs them: run it with
``.nox/tests/bin/python``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "OMP_NUM_THREADS": "1",
}


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _train(tree: Path, out: Path, extra_env: dict[str, str]) -> dict[str, float]:
    env = {**os.environ, **CPU_ENV, "PYTHONPATH": str(tree)}
    env.pop("TORCHDYNAMO_DISABLE", None)  # only the rows that ask for it
    env.update(extra_env)
    where = subprocess.run(
        [sys.executable, "-c", "import scale; print(scale.__file__)"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not where.startswith(str(tree)):  # an installed copy would shadow the tree
        raise SystemExit(f"{tree}: python imports scale from {where!r}, not from this tree")
    cmd = [sys.executable, "-m", "dapo.cli", "train", "--config", "tiny-cpu", f"output.dir={out}", "--fresh"]
    load = os.getloadavg()[0]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: dapo train failed ({proc.returncode}): {proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"wall_s": wall, "cpu_s": cpu, "load_1m_before": load, "steps": len(rows)}


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {
        "wall_s": round(statistics.median(r["wall_s"] for r in runs), 2),
        "cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 2),
        "wall_each_s": [round(r["wall_s"], 2) for r in runs],
        "cpu_each_s": [round(r["cpu_s"], 2) for r in runs],
        "load_1m_before": [round(r["load_1m_before"], 2) for r in runs],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="9b0c914", help="the commit to compare against")
    ap.add_argument("--repeats", type=int, default=3, help="measured runs per row")
    ap.add_argument("--out", default=str(HERE / "benchmarks/results/process_start.json"))
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="process-start-"))
    base = tmp / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=HERE, check=True)
    no_dynamo = {"TORCHDYNAMO_DISABLE": "1"}
    rows = {
        "baseline": (base, {}),
        "baseline_dynamo_disabled": (base, no_dynamo),
        "this_tree": (HERE, {}),
        "this_tree_dynamo_disabled": (HERE, no_dynamo),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in rows}
    try:
        for tree in (base, HERE):  # the tiny model and data are built once per tree, unmeasured
            _train(tree, tmp / "warm", {})
        for i in range(args.repeats):
            for name, (tree, env) in rows.items():
                r = _train(tree, tmp / f"{name}-{i}", env)
                runs[name].append(r)
                print(name, i, {k: round(v, 2) for k, v in r.items()}, flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=HERE, check=False)
    result = {name: _median(r) for name, r in runs.items()}
    for name, same in (("this_tree", "baseline"), ("this_tree_dynamo_disabled", "baseline_dynamo_disabled")):
        for suffix, b in (("", result["baseline"]), ("_same_env", result[same])):
            result[name][f"wall_ratio{suffix}"] = round(b["wall_s"] / result[name]["wall_s"], 2)
            result[name][f"cpu_ratio{suffix}"] = round(b["cpu_s"] / result[name]["cpu_s"], 2)
    report = {
        "what": "one `dapo train --config tiny-cpu` process (3 steps, vLLM-CPU), median of repeats",
        "baseline": args.baseline,
        "repeats": args.repeats,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "date": time.strftime("%Y-%m-%d"),
        "rows": result,
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
