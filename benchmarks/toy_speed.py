"""Benchmark: wall time of the toy regime's main jobs on the batched engine against the
per-run loop, measured in the same run on the same machine; and (``--budget``) the toy
budgets of issue 45, each command timed in this tree and in a baseline commit in the same
run. Writes benchmarks/results/toy_speed.json.

    python benchmarks/toy_speed.py            # ~11 minutes on 2 cores (the loop is the slow part)
    python benchmarks/toy_speed.py --only ladder_both_blocks
    python benchmarks/toy_speed.py --budget --baseline d0e9722 [--check-all]   # ~15-25 minutes
    python benchmarks/toy_speed.py --scaling     # ~1 minute: a batched step's fixed and per-run cost

``--budget`` checks the baseline out into a temporary git worktree and runs, in each tree
(``python -m dapo.cli`` with that tree first on ``PYTHONPATH``, the interpreter running this
script: it needs the ``toy``, ``report`` and ``gate`` extras, and the ``peers`` for
``--check-all``), the body of its ``nox -s toy`` (the commands its noxfile runs after
installing), ``dapo toy run all --seeds 10``, ``dapo toy check dapo`` and, with
``--check-all``, ``dapo toy check --all``. Each row gives wall and CPU seconds (user + system
of every process) and the 1-minute load average before it; the ratio is baseline / this tree.

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
import sys
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


# ---- budgets: this tree against a baseline commit -------------------------------------------

CLI = [sys.executable, "-m", "dapo.cli"]
GATE = ["gate", "write", "--config", "qwen2.5-32b-dapo", "--toy-summary", "runs/toy/summary.json"]
NOX_TOY_BEFORE = [  # the body of `nox -s toy` before `dapo toy suite`: four commands, then the gate
    ["toy", "run", "all", "--seeds", "10", "--out", "runs/toy", "--brief"],
    ["toy", "ladder", "--seeds", "10", "--out", "runs/ladder"],
    ["toy", "off-policy", "--seeds", "10", "--out", "runs/off_policy", "--quiet"],
    ["toy", "run", "prompt_selection", "--seeds", "10", "--out", "runs/prompt_selection", "--brief"],
    GATE,
]
NOX_TOY_NOW = [  # since the gate follows the loss: the suite ends with the config's loss check
    ["toy", "suite", "--seeds", "10", "--out", "runs", "--quiet", "--config", "qwen2.5-32b-dapo"],
    GATE,
]
NOX_TOY_SUITE_ONLY = [["toy", "suite", "--seeds", "10", "--out", "runs", "--quiet"], GATE]
"""A baseline with `toy suite` but before the loss check (its gate reads no loss check)."""
BUDGET_ROWS = {  # row -> (what, goal in seconds, commands in a tree without `toy suite`, with it)
    "nox_toy_body": (
        "`nox -s toy`'s run with its environment in place (the failure modes, the ladder and prompt "
        "selection on both seed blocks, the gate; the baseline's suite also held the off-policy family)",
        60.0,
        NOX_TOY_BEFORE,
        NOX_TOY_NOW,
    ),
    "run_all": (
        "`dapo toy run all --seeds 10` (four failure modes, both blocks)",
        5.0,
        [["toy", "run", "all", "--seeds", "10", "--out", "runs/bench-toy", "--brief", "--quiet"]],
        None,
    ),
    "check_dapo": ("`dapo toy check dapo`", 5.0, [["toy", "check", "dapo", "--quiet"]], None),
    "check_all": ("`dapo toy check --all` (24 losses)", 60.0, [["toy", "check", "--all", "--quiet"]], None),
}


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(tree: Path, commands: list[list[str]]) -> dict[str, float]:
    # every command from scratch: no toy run read back from an earlier one (toybench.memo)
    env = {**os.environ, "PYTHONPATH": str(tree), "DAPO_TOY_CACHE": "off"}
    load = os.getloadavg()[0]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    for cmd in commands:
        proc = subprocess.run(
            [*CLI, *cmd], cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        if proc.returncode not in (0, 1):  # 1: `check` found a failing loss, as it should
            raise SystemExit(
                f"{tree}: dapo {' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]!r}"
            )
    return {
        "wall_s": round(time.perf_counter() - t0, 1),
        "cpu_s": round(_children_cpu() - cpu0, 1),
        "load_average_1m_before": round(load, 2),
    }


def budget(baseline: str, rows: list[str]) -> dict:
    import tempfile

    here = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="toy-budget-"))
    base = tmp / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), baseline], cwd=here, check=True)
    try:
        out: dict = {}
        for row in rows:
            what, goal, before, now = BUDGET_ROWS[row]
            # a baseline with `toy suite` runs its own suite (which then held every family), one
            # before the loss registry without the config's loss check
            if now is NOX_TOY_NOW and not (base / "dapo" / "registry.py").exists():
                b = _timed(base, NOX_TOY_SUITE_ONLY if (base / "toybench" / "suite.py").exists() else before)
            else:
                b = _timed(base, (now or before) if (base / "toybench" / "suite.py").exists() else before)
            n = _timed(here, now or before)
            out[row] = {
                "what": what,
                "goal_s": goal,
                "baseline": b,
                "this_tree": n,
                "wall_ratio": round(b["wall_s"] / n["wall_s"], 2),
                "cpu_ratio": round(b["cpu_s"] / n["cpu_s"], 2) if n["cpu_s"] else None,
                "meets_goal": n["wall_s"] <= goal,
            }
            print(row, json.dumps(out[row]), flush=True)
        return out
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=here, check=False)


# ---- scaling: what a batched step costs, fixed and per run ---------------------------------

SCALING_RUNS = (1, 10, 40, 120)
SCALING_STEPS = 20


def _scaling_arms() -> dict[str, tuple]:
    from toybench.off_policy import grid_experiment

    return {
        "entropy_collapse/symmetric (4 epochs)": (REGISTRY["entropy_collapse"], "symmetric"),
        "length_bias/sample_level": (REGISTRY["length_bias"], "sample_level"),
        "zero_gradient/dynamic_sampling": (REGISTRY["zero_gradient"], "dynamic_sampling"),
        "off_policy/dapo_k2_token_tis": (grid_experiment(), "dapo_k2_token_tis"),
    }


def scaling() -> dict:
    """CPU seconds of one batched step of R runs of one arm (``train_many``, this process, one
    thread), for R in :data:`SCALING_RUNS`, fitted as ``fixed + R * per_run``: ``fixed`` is
    what a step costs whatever it holds (Python, the dispatch of each op), ``per_run`` what each
    run adds: the arithmetic over its tokens (the DAPO core's loss, advantages and update, in
    float64, which the engine keeps bit for bit with the per-run loop) and the engine's own
    gathers and copies of its rows. With the scheduler's 40 runs a job,
    ``arithmetic_share_at_40_runs`` = ``per_run * 40 / (fixed + per_run * 40)``: what a step
    costs that no rewrite of its Python or its dispatch removes."""
    import numpy as np

    from toybench.engine import train_many

    torch.set_num_threads(1)
    out = {}
    for label, (exp, arm) in _scaling_arms().items():
        ys = []
        for r in SCALING_RUNS:
            specs = [exp.spec(arm, s, steps=SCALING_STEPS) for s in range(r)]
            t0 = time.process_time()
            train_many(specs)
            ys.append((time.process_time() - t0) / SCALING_STEPS * 1e3)
        per_run, fixed = np.polyfit(SCALING_RUNS, ys, 1)
        out[label] = {
            "ms_per_batched_step": {str(r): round(y, 2) for r, y in zip(SCALING_RUNS, ys)},
            "fixed_ms_per_step": round(float(fixed), 2),
            "per_run_ms_per_step": round(float(per_run), 3),
            "arithmetic_share_at_40_runs": round(float(per_run * 40 / (fixed + per_run * 40)), 3),
        }
        print(label, json.dumps(out[label]), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", action="store_true", help="time the budget rows against --baseline")
    ap.add_argument("--baseline", default="d0e9722", help="the commit the budget rows compare against")
    ap.add_argument("--check-all", action="store_true", help="with --budget: also `dapo toy check --all`")
    ap.add_argument(
        "--scaling", action="store_true", help="a batched step's fixed and per-run CPU cost, per family"
    )
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
    if args.scaling:
        out = json.loads(path.read_text()) if path.exists() else {}
        out["scaling"] = {
            "command": "python benchmarks/toy_speed.py --scaling",
            "commit": commit,
            "date": time.strftime("%Y-%m-%d"),
            "processor": platform.processor() or platform.machine(),
            "steps": SCALING_STEPS,
            "arms": scaling(),
        }
        path.write_text(json.dumps(out, indent=2) + "\n")
        return
    if args.budget:
        out = json.loads(path.read_text()) if path.exists() else {}
        rows = ["nox_toy_body", "run_all", "check_dapo", *(["check_all"] if args.check_all else [])]
        out["budget"] = {
            "command": "python benchmarks/toy_speed.py --budget --baseline "
            + args.baseline
            + (" --check-all" if args.check_all else ""),
            "commit": commit,
            "baseline": args.baseline,
            "date": time.strftime("%Y-%m-%d"),
            "cores": cores,
            "rows": budget(args.baseline, rows),
        }
        path.write_text(json.dumps(out, indent=2) + "\n")
        return
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
