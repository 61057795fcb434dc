"""Benchmark: how long ``dapo --help`` and every subcommand's ``--help`` take, from a fresh
interpreter, against two baselines measured in the same run on the same machine: a bare
interpreter (``python -c pass``, the floor) and ``python -c "import torch"`` (what every help
paid before the core's names were imported lazily, ``dapo/__init__.py``). Also one
``dapo diagnose`` of a small JSONL log, which reads the log without torch.

    python benchmarks/cli_startup.py          # ~20 s; writes benchmarks/results/cli_startup.json

Each command runs ``--repeats`` times (default 5); the file records every wall time, the
median, the median's ratio to the torch import, and whether it meets the 1 s goal. Exit 1
when a command misses the goal.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 1.0


def _commands() -> list[list[str]]:
    """Every leaf command of ``dapo``, read from its own parsers (``tests/test_cli_fuzz.py``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_cli_fuzz import LEAVES

    return [
        [],
        *sorted({tuple(leaf[:1]) for leaf, _ in LEAVES}),
        *[leaf for leaf, _ in LEAVES if len(leaf) > 1],
    ]


def write_result(out: Path, what: str, repeats: int, script: str, rows: list[dict]) -> None:
    """The JSON every timing benchmark here writes: what was timed against the 1 s goal, on which
    machine and at which load, by which command, and its rows."""
    doc = {
        "what": what,
        "goal_s": GOAL_S,
        "repeats": repeats,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "load_average_1m": os.getloadavg()[0],
        "command_line": f"python benchmarks/{script}.py",
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")


def _wall(argv: list[str], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/cli_startup.json"))
    args = ap.parse_args(argv)
    py = sys.executable
    rows: list[dict] = []

    def measure(name: str, cmd: list[str], goal: bool) -> None:
        times = _wall(cmd, args.repeats)
        rows.append(
            {
                "command": name,
                "wall_s": [round(t, 4) for t in times],
                "median_s": statistics.median(times),
                "goal": goal,
            }
        )

    measure("python -c pass (floor)", [py, "-c", "pass"], False)
    measure('python -c "import torch" (the old help)', [py, "-c", "import torch"], False)
    for leaf in _commands():
        measure(" ".join(["dapo", *leaf, "--help"]), [py, "-m", "dapo.cli", *leaf, "--help"], True)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "metrics.jsonl"
        log.write_text(
            "".join(
                json.dumps({"step": s, "actor/entropy": 1.0 - s / 400, "rollout/accuracy": s / 400}) + "\n"
                for s in range(200)
            )
        )
        measure("dapo diagnose metrics.jsonl (200 steps)", [py, "-m", "dapo.cli", "diagnose", str(log)], True)

    torch_s = rows[1]["median_s"]
    for r in rows:
        r["ratio_to_torch_import"] = round(r["median_s"] / torch_s, 3)
        r["meets_goal"] = (r["median_s"] < GOAL_S) if r.pop("goal") else None
    width = max(len(r["command"]) for r in rows)
    for r in rows:
        flag = {True: "ok", False: "SLOWER THAN 1 s", None: "baseline"}[r["meets_goal"]]
        print(
            f"{r['command']:<{width}}  {r['median_s']:6.3f} s  x{r['ratio_to_torch_import']:.2f} torch  {flag}"
        )
    write_result(
        args.out,
        "median wall seconds of each command from a fresh interpreter",
        args.repeats,
        "cli_startup",
        rows,
    )
    print(f"-> {args.out}")
    return 0 if all(r["meets_goal"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
