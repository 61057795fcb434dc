"""``report.md`` and one figure per run: a title and run label on every figure, a panel per
rule's metrics (grad norm and KL included), the onset of each problem marked, and reference
bands only where the run is in the band's units (otherwise the run against its own start)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from .config import HealthConfig
from .references import ReferenceCurve
from .series import Run, mean, series
from .verdict import Finding, verdict

PANELS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("Entropy", ("actor/entropy",), ("entropy_collapse", "entropy_explosion")),
    (
        "Groups with accuracy 0 or 1",
        ("rollout/groups_uniform", "rollout/groups_all_correct", "rollout/groups_all_wrong"),
        ("vanishing_signal",),
    ),
    ("Dynamic-sampling rounds", ("sampling/rounds",), ("vanishing_signal",)),
    ("Accuracy / reward", ("rollout/accuracy", "rollout/reward_mean"), ("not_learning",)),
    ("Response length", ("rollout/length_mean",), ("length_growth",)),
    ("Truncation rate", ("rollout/truncation_rate",), ("truncation_noise",)),
    ("Engine/trainer log-prob gap", ("mismatch/logp_gap",), ("rollout_mismatch",)),
    ("KL", ("actor/approx_kl", "actor/ref_kl"), ("kl_blowup",)),
    ("Grad norm", ("actor/grad_norm",), ("gradients",)),
)
"""(panel title, metrics drawn, rules it shows)."""
COLOUR = {"healthy": "C2", "warning": "C1", "failing": "C3", "unknown": "0.5"}


def write_report(
    out: Path,
    source: str,
    runs: Mapping[str, Run],
    results: Mapping[str, Sequence[Finding]],
    references: Mapping[str, ReferenceCurve],
    config: HealthConfig = HealthConfig(),
    max_figures: int = 12,
) -> Path:
    """Write ``report.md`` and the figures (seaborn, when installed) to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    first = next(iter(results.values()))
    verdicts = {label: verdict(fs, config) for label, fs in results.items()}
    lines = [
        f"# Health report: `{source}`",
        "",
        f"{len(runs)} run(s). Rules and thresholds: `dapo.health`.",
        "",
    ]
    lines += [
        "| run | verdict | " + " | ".join(f.rule for f in first) + " |",
        "|---|---|" + "---|" * len(first),
    ]
    for label, fs in results.items():
        cells = [f.status + (f" (step {f.start_step:g})" if f.start_step is not None else "") for f in fs]
        lines.append(f"| {label} | {verdicts[label].status} | " + " | ".join(cells) + " |")
    figures, notes = plots(
        out, source, runs, results, {k: v.status for k, v in verdicts.items()}, references, max_figures
    )
    if len(runs) > max_figures:
        lines += ["", f"Figures for the first {max_figures} of {len(runs)} runs (`--max-figures`)."]
    for label, fs in results.items():
        lines += ["", f"## {label}: {verdicts[label].headline()}", ""]
        for f in fs:
            since = f" since step {f.start_step:g}" if f.start_step is not None else ""
            why = f" ({f.reason})" if f.reason else ""
            todo = f" What to do: {f.advice}." if f.status in ("warning", "failing") else ""
            lines.append(f"- **{f.title}: {f.status}**{why}{since}. {f.evidence}.{todo}")
        if label in figures:
            lines += ["", f"![{label}]({figures[label]})"]
            lines += [f"- {n}" for n in notes.get(label, [])]
    used = {
        r for ns in notes.values() for n in ns for r in references if n.startswith(f"`{r}`: reference band")
    }
    if used:
        lines += ["", "## Reference bands", ""]
        lines += [
            f"- `{references[m].metric}`: {references[m].source}. {references[m].note}" for m in sorted(used)
        ]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def plots(
    out: Path,
    source: str,
    runs: Mapping[str, Run],
    results: Mapping[str, Sequence[Finding]],
    headline: Mapping[str, str],
    references: Mapping[str, ReferenceCurve],
    max_figures: int,
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """One PNG per run (the first ``max_figures``), titled with the run's verdict
    (``headline``): file names and, per run, what each panel's background shows."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import seaborn as sns
    except ImportError:
        return {}, {}
    sns.set_theme(style="whitegrid", font_scale=0.8)
    figures: dict[str, str] = {}
    notes: dict[str, list[str]] = {}
    for n, (label, run) in enumerate(runs.items()):
        if n >= max_figures:
            break
        status = {f.rule: f for f in results[label]}
        panels = [p for p in PANELS if any(series(run, m) for m in p[1])]
        if not panels:
            continue
        cols = min(3, len(panels))
        rows = -(-len(panels) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
        for ax, (title, metrics, rules) in zip(axes.flat, panels):
            for k, metric in enumerate(m for m in metrics if series(run, m)):
                s = series(run, metric)
                ax.plot(s.steps, s.values, color=f"C{k}", lw=1.2, label=metric)
                ref = references.get(metric)
                if ref is not None and len(s) > 1 and ref.comparable(s.values):
                    span = s.steps[-1] - s.steps[0] or 1.0
                    grid = [s.steps[0] + span * p for p in ref.progress]
                    ax.fill_between(grid, ref.low, ref.high, color="0.6", alpha=0.25, label="paper Fig. 7")
                    notes.setdefault(label, []).append(f"`{metric}`: reference band (paper Fig. 7 shape)")
                else:
                    start = mean(s.values[: max(1, len(s) // 10)])
                    ax.axhline(start, color=f"C{k}", ls=":", lw=0.8, label=f"start {start:.3g}")
                if min(s.values) > 0 and max(s.values) > 100 * min(s.values):
                    ax.set_yscale("log")  # spikes of orders of magnitude (grad norm, KL)
            verdicts = [status[r] for r in rules if r in status]
            for f in verdicts:
                if f.start_step is not None:
                    ax.axvline(f.start_step, color=COLOUR[f.status], ls="--", lw=1)
            ax.set_title(title + "\n" + ", ".join(f"{f.rule}: {f.status}" for f in verdicts), fontsize=8)
            ax.set_xlabel("training step")
            ax.legend(fontsize=6)
        for ax in list(axes.flat)[len(panels) :]:
            ax.set_visible(False)
        fig.suptitle(f"{label}: {headline[label]}  ({source})", fontsize=10)
        fig.tight_layout()
        name = f"run{n}.png"
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        figures[label] = name
        notes.setdefault(label, []).append(
            "Dotted lines: the run's own start (mean of its first tenth) where no reference band is in the run's units; "
            "dashed verticals: the step a rule's problem started."
        )
    return figures, notes
