"""``dapo diagnose RUN``: is this run healthy, and if not, which knob fixes it?"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .health import PAPER_REFERENCES, SEVERITY, Finding, HealthConfig, ReferenceCurve, diagnose, series, worst
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dapo diagnose",
        description=(
            "Diagnose a run's metrics: one verdict per failure mode (healthy / warning / failing), the step it "
            "started, the evidence and the DAPO knob that addresses it."
        ),
    )
    p.add_argument(
        "run", help="metrics.jsonl (this project or verl names), TRL trainer_state.json, or a run dir"
    )
    p.add_argument("--format", choices=["auto", "dapo", "trl", "verl"], default="auto")
    p.add_argument(
        "--run-label", default=None, help="diagnose only this run of a multi-run file (e.g. arm=dapo/seed=0)"
    )
    p.add_argument("--report", type=Path, default=None, help="write report.md and figures to this directory")
    p.add_argument(
        "--reference",
        default="paper",
        help="reference bands for the figures: 'paper' (Fig. 7 shapes), 'none', or a JSON file",
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
        metavar="THRESHOLD=VALUE",
        help="override a HealthConfig threshold, e.g. --set entropy_fail_frac=0.4",
    )
    return p


def _config(items: list[str]) -> HealthConfig:
    values = {}
    for item in items:
        key, _, raw = item.partition("=")
        if key not in HealthConfig.__dataclass_fields__:
            raise SystemExit(
                f"dapo diagnose: unknown threshold {key!r}; known: {sorted(HealthConfig.__dataclass_fields__)}"
            )
        values[key] = type(getattr(HealthConfig(), key))(raw)
    return HealthConfig(**values)


def _references(spec: str) -> dict[str, ReferenceCurve]:
    if spec == "none":
        return {}
    if spec == "paper":
        return PAPER_REFERENCES
    data = json.loads(Path(spec).read_text())
    return {
        k: ReferenceCurve(
            metric=k,
            source=v["source"],
            progress=tuple(v["progress"]),
            low=tuple(v["low"]),
            high=tuple(v["high"]),
            note=v.get("note", ""),
        )
        for k, v in data.items()
    }


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
    args = _parser().parse_args(argv)
    cfg = _config(args.set)
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
        write_report(args.report, args.run, runs, results, _references(args.reference))
        print(f"\nreport: {args.report / 'report.md'}")
    if args.fail_on:
        level = SEVERITY[args.fail_on]
        if any(SEVERITY[f.status] >= level for fs in results.values() for f in fs):
            return 1
    return 0


def write_report(
    out: Path, source: str, runs, results, references: dict[str, ReferenceCurve], max_figures: int = 12
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


def _plots(out: Path, runs, references, max_figures: int) -> dict[str, str]:
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
