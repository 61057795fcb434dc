"""The toy families of the main job in one pass (``dapo toy suite``, the run of ``nox -s toy``).

The four failure modes (``dapo toy run all``), the Table-1 ladder (``dapo toy ladder``) and
prompt selection (``dapo toy run prompt_selection``) are planned as one set of runs: one
scheduler spreads them over the cores (no family waits for another's last job), and torch is
imported once. Each family then writes exactly
what its own command writes, under ``out/<family>``; the results are those of the separate
commands, run for run (each run owns its random stream, whoever trains it).

The off-policy family (``dapo toy off-policy``, ``nox -s off_policy``) is not part of it: its
table needs the seed count its procedure's simulated power sets (45 + 45,
``toybench.noninferiority.plan_seeds``; at the suite's 10 + 10 a harmless row would be tolerated
up to k = 8 in 1% of tables, simulated), and at 10 + 10 it was already four fifths of the suite's CPU time (2,200 of its 2,900 runs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from .experiment import Experiment, ExperimentResult, run_experiments

FAMILIES = ("toy", "ladder", "prompt_selection")
"""Output folders under ``--out``, in the order the suite reports them (``toy`` holds the four
failure modes and the summary the gate reads, as ``dapo toy run all --out runs/toy``)."""


def family_experiments(steps: int | None = None) -> dict[str, list[Experiment]]:
    """The experiments of each family, as their own commands build them."""
    from .experiment import with_steps
    from .experiments import BEYOND, REGISTRY
    from .ladder import ladder_experiment

    fams = {
        "toy": list(REGISTRY.values()),
        "ladder": [ladder_experiment()],
        "prompt_selection": [BEYOND["prompt_selection"]],
    }
    if steps is not None:
        fams = {k: [with_steps(e, steps) for e in v] for k, v in fams.items()}
    return fams


@dataclass
class SuiteResult:
    families: dict[str, list[ExperimentResult]]
    wall_seconds: float
    runs: int
    """Runs trained."""


def run_suite(
    seeds: int = 10,
    jobs: int | None = None,
    seed_start: int = 0,
    confirm: bool = True,
    progress: bool = True,
    steps: int | None = None,
) -> SuiteResult:
    fams = family_experiments(steps)
    order = [e for name in FAMILIES for e in fams[name]]
    t0 = time.perf_counter()
    stats: dict[str, int] = {}
    results = run_experiments(
        order, seeds=seeds, jobs=jobs, seed_start=seed_start, confirm=confirm, progress=progress, stats=stats
    )
    wall = time.perf_counter() - t0
    by_name = {r.experiment.name: r for r in results}
    out = {name: [by_name[e.name] for e in fams[name]] for name in FAMILIES}
    return SuiteResult(out, wall, stats["runs"])


def write_suite(
    result: SuiteResult, out: Path, command: str, plots: bool = True, steps: int | None = None
) -> dict[str, Path]:
    """Each family's files, as its own command writes them; returns each family's report."""
    from .ladder_report import write_ladder
    from .output import write_all
    from .plots import plot_experiment, plotting_available

    f, wall = result.families, result.wall_seconds
    draw = plots and plotting_available()
    paths: dict[str, Path] = {}
    for name in ("toy", "prompt_selection"):
        write_all(f[name], out / name, wall, steps=steps)
        paths[name] = out / name / "summary.json"
        if draw:
            for r in f[name]:
                plot_experiment(r, out / name / r.experiment.name / f"{r.experiment.name}.png")
    paths["ladder"] = write_ladder(f["ladder"][0], wall, out / "ladder", command)
    return paths


def interval_text(mean: float, low: float, high: float) -> str:
    """``+0.181 [+0.140, +0.231]``, ``-17.2 [-22.0, -11.6]``: three significant digits of the
    largest of the three, and at most three decimals, as the README's table writes effects."""
    import math

    scale = max(abs(mean), abs(low), abs(high))
    d = min(3, max(0, 2 - math.floor(math.log10(scale)))) if scale > 0 and math.isfinite(scale) else 3
    return f"{mean:+.{d}f} [{low:+.{d}f}, {high:+.{d}f}]"


def closing_summary(result: SuiteResult, paths: dict[str, Path]) -> str:
    """The lines a user reads last: each failure mode's claim with its effect (b - a, mean and
    95% BCa interval) on each seed block and the verdict, as the README's table reports them, and
    where each family's report is."""
    toy = result.families["toy"]
    blocks = toy[0].blocks if toy else {}
    span = ", ".join(f"{b} {m[0]}..{m[-1]}" for b, m in blocks.items())
    lines = [
        "",
        f"== the four failure modes: b - a, mean [95% interval] per seed block ({span}); "
        "reproduced = every block shows the paper's direction",
    ]
    for r in toy:
        p = r.primary
        c = p.contrast
        a = r.experiment.labels.get(c.a or "", c.a or "0")
        b = r.experiment.labels.get(c.b, c.b)
        what = r.experiment.summaries[c.summary_b or c.summary].description
        cells = " / ".join(
            interval_text(iv.mean, iv.low, iv.high) for iv in (p.blocks[k].interval for k in blocks)
        )
        lines.append(f"   {r.experiment.name:<18} {p.verdict:<14} {c.name}")
        lines.append(f"   {'':<18} {'':<14} {what}, {b} - {a}: {cells}")
    lines.append("== reports")
    for name in FAMILIES:
        lines.append(f"   {name:<18} {paths[name]}")
    lines.append(f"{result.runs} runs in {result.wall_seconds:.1f} s wall")
    lines.append("the off-policy family is its own job: `nox -s off_policy` (`dapo toy off-policy`)")
    return "\n".join(lines)
