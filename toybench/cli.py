"""``dapo toy ...``: run the failure-mode experiments from the command line."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dapo toy", description="Toy regime: DAPO's failure modes on a CPU.")
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run experiments and print their verdicts")
    run.add_argument("experiment", help="an experiment name (see `dapo toy list`) or `all`")
    run.add_argument("--seeds", type=int, default=10, help="paired seeds per arm (default 10)")
    run.add_argument("--out", type=Path, default=Path("runs/toy"), help="output directory (default runs/toy)")
    run.add_argument("--jobs", type=int, default=None, help="worker processes (default: CPU count)")
    run.add_argument("--policy", choices=["tabular", "gru"], default="tabular",
                     help="tabular softmax + SGD (default) or GRU + Adam")
    run.add_argument("--steps", type=int, default=None, help="override every horizon (exploration only)")
    run.add_argument("--no-plots", action="store_true", help="skip the PNG figures even if seaborn is installed")
    sub.add_parser("list", help="list the experiments")
    return p


def main(argv: list[str] | None = None) -> int:
    from .experiments import REGISTRY

    args = _parser().parse_args(argv)
    if args.cmd == "list":
        for name, e in REGISTRY.items():
            print(f"{name:<18} {e.title}\n{'':<18} {e.paper}; arms: {', '.join(e.arms)}")
        return 0
    if args.experiment == "all":
        chosen = list(REGISTRY.values())
    elif args.experiment in REGISTRY:
        chosen = [REGISTRY[args.experiment]]
    else:
        print(f"dapo toy run: unknown experiment {args.experiment!r}; choose from: all, {', '.join(REGISTRY)}",
              file=sys.stderr)
        return 2
    if args.seeds < 2:
        print("dapo toy run: --seeds must be >= 2 (paired intervals need at least two)", file=sys.stderr)
        return 2
    return run(chosen, args.seeds, args.out, args.jobs, args.policy, args.steps, plots=not args.no_plots)


def run(chosen, seeds: int, out: Path, jobs: int | None, policy: str, steps: int | None, plots: bool = True) -> int:
    from .experiment import run_experiments
    from .output import format_table, write_all
    from .plots import plot_experiment, plotting_available

    t0 = time.perf_counter()
    results = run_experiments(chosen, seeds=seeds, jobs=jobs, policy=policy, steps=steps)
    wall = time.perf_counter() - t0
    total = write_all(results, out, wall)
    print(format_table(results))
    print(f"\n{len(results)} experiment(s), {seeds} seeds, {total['sampled_tokens']:.0f} sampled tokens "
          f"in {wall:.1f} s wall ({total['sampled_tokens'] / wall:.0f} tokens/s); results in {out}/")
    if plots:
        if plotting_available():
            for r in results:
                path = plot_experiment(r, out / r.experiment.name / f"{r.experiment.name}.png")
                print(f"figure: {path}")
        else:
            print("figures skipped: install the report extra (pip install 'dapo-repro[report]')")
    return 0
