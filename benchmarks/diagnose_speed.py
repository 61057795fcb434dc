"""Benchmark: ``dapo diagnose`` on 1 MB logs, against the code before issue 29's readers
(``--baseline REV``, default 7f8af73) measured in the same run on the same machine.

Three 1 MB logs are made from calibration logs with their steps renumbered: verl console
lines, TRL console dicts amid progress bars, and a custom trainer's ``step:N | key=value``
lines (which the baseline misreads: it takes them for TRL's and fails on a status line, or
says what it found; its exit status is recorded). Each command runs
from a fresh interpreter ``--repeats`` times (default 5); the file records every wall time,
the median, the ratio to the baseline's median, and whether it meets the 1 s goal. Exit 1
when a log misses the goal.

    python benchmarks/diagnose_speed.py    # ~30 s; writes benchmarks/results/diagnose_speed.json
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cli_startup import GOAL_S, write_result  # the same goal and result file as the startup benchmark

ROOT = Path(__file__).resolve().parents[1]
CAL = ROOT / "tests" / "data" / "health" / "calibration"
SIZE = 1_000_000


def _renumbered(lines: list[str], pattern: str, size: int) -> str:
    """``lines`` repeated to ``size`` bytes, the step in each (``pattern``'s group) counting on."""
    out, n, total = [], 0, 0
    rx = re.compile(pattern)
    while total < size:
        for line in lines:
            m = rx.search(line)
            if m:
                n += 1
                line = line[: m.start(1)] + str(n) + line[m.end(1) :]
            out.append(line)
            total += len(line) + 1
    return "\n".join(out) + "\n"


def make_logs(where: Path) -> dict[str, Path]:
    verl = [
        x for x in (CAL / "verl-data-qwen2.5-0.5b-ppo-gsm8k.log").read_text().splitlines() if "step:" in x
    ]
    trl = (CAL / "website-sanitizer-qwen0.5b-grpo-truncation.log").read_text().splitlines()
    kv = (CAL / "monarch-grpo-run12-best.log").read_text().splitlines()
    logs = {
        "verl-console": _renumbered(verl, r"step:(\d+)", SIZE),
        "trl-console": _renumbered(trl, r"\| *(\d+)/\d+ *\[", SIZE),
        "custom-kv": _renumbered(kv, r"^step:(\d+)", SIZE),
    }
    paths = {}
    for name, text in logs.items():
        paths[name] = where / f"{name}.log"
        paths[name].write_text(text)
    return paths


def _wall(argv: list[str], env: dict[str, str], cwd: Path, repeats: int) -> tuple[list[float], int]:
    times, code = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        code = subprocess.run(
            argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        ).returncode
        times.append(time.perf_counter() - t0)
    return times, code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", default="7f8af73", help="git revision of the code to compare with")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/diagnose_speed.json"))
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        logs = make_logs(Path(tmp))
        base = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.baseline],
            check=True,
            capture_output=True,
        )
        try:
            trees = {"this tree": ROOT, f"baseline {args.baseline}": base}
            for name, log in logs.items():
                row: dict = {"log": name, "bytes": log.stat().st_size}
                for label, tree in trees.items():
                    # -S: no site hooks, so an editable install of this tree cannot shadow the
                    # baseline's PYTHONPATH (diagnose needs nothing from site-packages)
                    env = {**os.environ, "PYTHONPATH": str(tree)}
                    cmd = [sys.executable, "-S", "-m", "dapo.cli", "diagnose", str(log)]
                    times, code = _wall(cmd, env, tree, args.repeats)  # -m: the cwd comes first
                    row[label] = {
                        "wall_s": [round(t, 4) for t in times],
                        "median_s": statistics.median(times),
                        "exit": code,
                    }
                ours, theirs = row["this tree"], row[f"baseline {args.baseline}"]
                row["ratio_to_baseline"] = round(ours["median_s"] / theirs["median_s"], 3)
                row["meets_goal"] = ours["median_s"] < GOAL_S and ours["exit"] == 0
                rows.append(row)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True
            )
    what = "median wall seconds of `python -S -m dapo.cli diagnose LOG` from a fresh interpreter"
    write_result(args.out, what, args.repeats, "diagnose_speed", rows)
    for r in rows:
        b = r[f"baseline {args.baseline}"]
        print(
            f"{r['log']:<13} {r['this tree']['median_s']:.2f} s (exit {r['this tree']['exit']})  "
            f"baseline {b['median_s']:.2f} s (exit {b['exit']})  ratio {r['ratio_to_baseline']:.2f}"
        )
    return 0 if all(r["meets_goal"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
