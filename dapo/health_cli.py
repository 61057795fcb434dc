"""``dapo diagnose RUN``: is this run healthy, and if not, which knob fixes it?"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .cliargs import InFile, OutDir, Parser, Text, UsageError
from .health import (
    PAPER_REFERENCES,
    SEVERITY,
    Finding,
    HealthConfig,
    ReferenceCurve,
    Run,
    diagnose,
    series,
    worst,
)
from .runlog import RunLogError, read_runs

PLOTTED = (
    "actor/entropy",
    "rollout/length_mean",
    "rollout/reward_mean",
    "actor/mean_prob",
    "rollout/truncation_rate",
    "rollout/groups_uniform",
    "rollout/groups_all_correct",
    "mismatch/logp_gap",
)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="dapo diagnose",
        description=(
            "Diagnose a run's metrics: one verdict per failure mode (healthy / warning / failing), the step it "
            "started, the evidence and the DAPO knob that addresses it."
        ),
    )
    p.add_argument(
        "run",
        type=Text(),
        help="metrics.jsonl (this project or verl names), TRL trainer_state.json, or a run dir",
    )
    p.add_argument(
        "--format",
        choices=["auto", "dapo", "trl", "verl"],
        default="auto",
        help="the log's metric names (default auto: detected from the file; a format that names none "
        "of the file's metrics is refused)",
    )
    p.add_argument(
        "--run-label",
        type=Text(),
        default=None,
        help="diagnose only this run of a multi-run file (e.g. arm=dapo/seed=0)",
    )
    p.add_argument(
        "--report", type=OutDir(), default=None, help="write report.md and figures to this directory"
    )
    p.add_argument(
        "--reference",
        type=Text(),
        default="paper",
        help="reference bands for the figures: 'paper' (Fig. 7 shapes), 'none', or a JSON file "
        "{metric: {source, progress, low, high, note?}}",
    )
    p.add_argument(
        "--fail-on",
        choices=["warning", "failing"],
        default=None,
        help="exit with status 1 if any rule reaches this level",
    )
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        type=Text(),
        metavar="THRESHOLD=VALUE",
        help="override a HealthConfig threshold, e.g. --set entropy_fail_frac=0.4",
    )
    return p


def _config(items: list[str]) -> HealthConfig:
    """``--set NAME=VALUE`` items as a checked :class:`HealthConfig`: every value must parse
    as the default's type and pass the config's own range checks."""
    values: dict[str, Any] = {}
    defaults = HealthConfig()
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise UsageError(f"--set {item!r}: expected THRESHOLD=VALUE")
        if key not in HealthConfig.__dataclass_fields__:
            raise UsageError(
                f"--set: unknown threshold {key!r}; known: {', '.join(sorted(HealthConfig.__dataclass_fields__))}"
            )
        kind = type(getattr(defaults, key))
        try:
            value = kind(raw)
        except ValueError:
            raise UsageError(f"--set {key}: expected {kind.__name__}, got {raw!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"--set {key}: must be finite, got {raw!r}")
        values[key] = value
    try:
        return HealthConfig(**values)
    except ValueError as err:
        raise UsageError(f"--set: {err}") from None


def _references(spec: str) -> dict[str, ReferenceCurve]:
    if spec == "none":
        return {}
    if spec == "paper":
        return PAPER_REFERENCES
    try:
        path = InFile("json")(spec)
    except argparse.ArgumentTypeError as err:
        raise UsageError(f"--reference: expected 'paper', 'none' or a JSON file; {err}") from None
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise UsageError(f"--reference {spec}: expected a JSON object of metric -> curve")
    curves = {}
    for k, v in data.items():
        try:
            curves[k] = ReferenceCurve(
                metric=k,
                source=str(v["source"]),
                progress=tuple(float(x) for x in v["progress"]),
                low=tuple(float(x) for x in v["low"]),
                high=tuple(float(x) for x in v["high"]),
                note=str(v.get("note", "")),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise UsageError(
                f"--reference {spec}: curve {k!r}: needs source, progress, low and high (lists of numbers): {err!r}"
            ) from None
        if not len(curves[k].progress) == len(curves[k].low) == len(curves[k].high):
            raise UsageError(f"--reference {spec}: curve {k!r}: progress, low and high differ in length")
    return curves


def format_findings(label: str, findings: list[Finding]) -> str:
    unknown = sum(f.status == "unknown" for f in findings)
    lines = [
        f"== {label}: {worst(findings)}" + (f" ({unknown} rule(s) without enough data)" if unknown else "")
    ]
    for f in findings:
        since = f" since step {f.start_step:g}" if f.start_step is not None else ""
        lines.append(f"  {f.status:<8} {f.title}{since}")
        lines.append(f"           evidence: {f.evidence}")
        if f.status in ("warning", "failing"):
            lines.append(f"           knob:     {f.knob}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = _config(args.set)
    references = _references(args.reference)  # checked even without --report: a typo is not ignored
    try:
        runs, notes = read_runs(args.run, args.format)
    except (RunLogError, OSError) as err:
        print(f"dapo diagnose: {err}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.run_label:
        if args.run_label not in runs:
            print(
                f"dapo diagnose: no run {args.run_label!r}; runs: {', '.join(list(runs)[:20])}",
                file=sys.stderr,
            )
            return 2
        runs = {args.run_label: runs[args.run_label]}
    results = {label: diagnose(run, cfg) for label, run in runs.items()}
    if args.json:
        print(json.dumps({label: [f.__dict__ for f in fs] for label, fs in results.items()}, indent=2))
    else:
        print("\n\n".join(format_findings(label, fs) for label, fs in results.items()))
    if args.report:
        write_report(args.report, args.run, runs, results, references)
        print(f"\nreport: {args.report / 'report.md'}")
    if args.fail_on:
        level = SEVERITY[args.fail_on]
        if any(SEVERITY[f.status] >= level for fs in results.values() for f in fs):
            return 1
    return 0


def write_report(
    out: Path,
    source: str,
    runs: Mapping[str, Run],
    results: dict[str, list[Finding]],
    references: dict[str, ReferenceCurve],
    max_figures: int = 12,
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# Health report: `{source}`",
        "",
        f"{len(runs)} run(s). Rules and thresholds: `dapo.health`.",
        "",
    ]
    lines += [
        "| run | " + " | ".join(f.rule for f in next(iter(results.values()))) + " |",
        "|---|" + "---|" * len(next(iter(results.values()))),
    ]
    for label, fs in results.items():
        lines.append(
            f"| {label} | "
            + " | ".join(
                f.status + (f" (step {f.start_step:g})" if f.start_step is not None else "") for f in fs
            )
            + " |"
        )
    figures = _plots(out, runs, references, max_figures)
    for label, fs in results.items():
        lines += ["", f"## {label}", ""]
        for f in fs:
            lines.append(
                f"- **{f.title}: {f.status}**"
                + (f" since step {f.start_step:g}" if f.start_step is not None else "")
                + f". {f.evidence}."
                + (f" Knob: {f.knob}." if f.status in ("warning", "failing") else "")
            )
        if label in figures:
            lines += ["", f"![{label}]({figures[label]})"]
    if references:
        lines += ["", "## Reference bands", ""]
        lines += [f"- `{r.metric}`: {r.source}. {r.note}" for r in references.values()]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _plots(
    out: Path, runs: Mapping[str, Run], references: dict[str, ReferenceCurve], max_figures: int
) -> dict[str, str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import seaborn as sns
    except ImportError:
        return {}
    sns.set_theme(style="whitegrid", font_scale=0.8)
    figures = {}
    for n, (label, run) in enumerate(runs.items()):
        if n >= max_figures:
            break
        metrics = [m for m in PLOTTED if series(run, m)[1]]
        if not metrics:
            continue
        fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 2.8), squeeze=False)
        for ax, metric in zip(axes[0], metrics):
            xs, ys = series(run, metric)
            sns.lineplot(x=xs, y=ys, ax=ax, color="C0", label="run")
            ref = references.get(metric)
            if ref is not None and len(xs) > 1:
                span = xs[-1] - xs[0] or 1.0
                grid = [xs[0] + span * p for p in ref.progress]
                ax.fill_between(grid, ref.low, ref.high, color="C1", alpha=0.25, label="reference")
            ax.set_title(metric, fontsize=8)
            ax.legend(fontsize=6)
        fig.tight_layout()
        name = f"run{n}.png"
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        figures[label] = name
    return figures
