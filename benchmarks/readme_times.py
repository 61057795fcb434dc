"""The times the README quotes, measured the way a user meets them: wall time and CPU time
(user + system, of the command and every process under it), each command run ``--repeats``
times, with the conditions (CPU count, load average before each run, whether the nox
virtual environment existed). Writes benchmarks/results/readme_times.json.

    python benchmarks/readme_times.py                 # from a fresh clone: ~8 min on 2 cores
    python benchmarks/readme_times.py --only toy_run_all
    python benchmarks/readme_times.py --only nox_tests --repeats 1   # after .ci/run made .nox/tests

Run it from the repository root of a fresh clone, on an otherwise idle machine, to reproduce
the README's figures; under a shared load, wall times grow while CPU times stay close (the
README gives both for that reason).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

NOX = [sys.executable, "-m", "nox"]
TOY_BIN = Path(".nox/toy/bin")

STEPS: dict[str, tuple[str, list[str]]] = {
    # name -> (what it is, command); the first creates the toy session's virtual environment
    "nox_toy_install": (
        "`nox -s toy --install-only` into a new .nox/toy (pip, from its cache)",
        [*NOX, "-s", "toy", "--install-only"],
    ),
    "nox_toy": (
        "`nox -s toy` with .nox/toy in place: installs checked, experiments, ladder, gate",
        [*NOX, "-s", "toy"],
    ),
    "toy_run_all": (
        "`dapo toy run all --seeds 10 --brief` (both blocks, 20 seeds per arm)",
        [
            str(TOY_BIN / "dapo"),
            "toy",
            "run",
            "all",
            "--seeds",
            "10",
            "--out",
            "runs/toy",
            "--brief",
            "--quiet",
        ],
    ),
    "toy_ladder": (
        "`dapo toy ladder --seeds 10`",
        [str(TOY_BIN / "dapo"), "toy", "ladder", "--seeds", "10", "--out", "runs/ladder", "--quiet"],
    ),
    # not run by default (~8 minutes): --only nox_tests, once .ci/run has made .nox/tests
    "nox_tests": ("`nox -s tests` with .nox/tests in place", [*NOX, "-s", "tests"]),
}
DEFAULT = ("nox_toy_install", "nox_toy", "toy_run_all", "toy_ladder")


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(command: list[str]) -> dict[str, float]:
    load = os.getloadavg()[0]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load_average_1m_before": round(load, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only", choices=list(STEPS), action="append", default=None)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/readme_times.json"))
    args = ap.parse_args(argv)
    if not Path("noxfile.py").is_file():
        raise SystemExit("run it from the repository root")
    rows = {}
    for name in args.only or DEFAULT:
        what, command = STEPS[name]
        runs = []
        for _ in range(args.repeats):
            if name == "nox_toy_install":
                shutil.rmtree(".nox/toy", ignore_errors=True)  # a new virtual environment each time
            runs.append(measure(command))
            print(f"{name}: {runs[-1]}", flush=True)
        rows[name] = {
            "what": what,
            "command": " ".join(command).replace(sys.executable, "python"),
            "runs": runs,
            "wall_s_range": [min(r["wall_s"] for r in runs), max(r["wall_s"] for r in runs)],
            "cpu_s_range": [min(r["cpu_s"] for r in runs), max(r["cpu_s"] for r in runs)],
        }
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "date": time.strftime("%Y-%m-%d"),
        "command_line": "python benchmarks/readme_times.py",
        "steps": rows,
    }
    if args.out.exists() and args.only:  # --only refreshes those rows, keeps the others
        old = json.loads(args.out.read_text())
        old["steps"].update(rows)
        result["steps"] = old["steps"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
