"""``report.md`` and one figure per run: a title with the run's name (its directory or file) on
every figure, a panel per rule's metrics (grad norm, KL, loss and validation included), the
onset of each problem marked, a step without a value drawn as a gap, legends below their
panels (never over the data), and reference bands only where the run is on the band's scale
(:meth:`~.references.ReferenceCurve.comparable`; otherwise the run against its own start)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from .config import HealthConfig
from .readers import DIR_FILES, WANDB_CONSOLE
from .references import ReferenceCurve
from .series import Run, mean, series
from .verdict import Finding, run_notes, verdict

PANELS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("Entropy", ("actor/entropy",), ("entropy_collapse", "entropy_explosion")),
    (
        "Groups with accuracy 0 or 1",
        ("rollout/groups_uniform", "rollout/groups_all_correct", "rollout/groups_all_wrong"),
        ("vanishing_signal",),
    ),
    ("Dynamic-sampling rounds", ("sampling/rounds",), ("vanishing_signal",)),
    ("Accuracy / reward", ("rollout/accuracy", "rollout/reward_mean"), ("not_learning", "reward_collapse")),
    ("Validation score", ("eval/score",), ("validation",)),
    ("Response length", ("rollout/length_mean",), ("length_growth",)),
    ("Truncation rate", ("rollout/truncation_rate",), ("truncation_noise",)),
    ("Engine/trainer log-prob gap", ("mismatch/logp_gap",), ("rollout_mismatch",)),
    ("Engine/trainer k3 KL (off-policy drift)", ("mismatch/k3_kl",), ("off_policy_drift",)),
    ("KL", ("actor/approx_kl", "actor/ref_kl"), ("kl_blowup",)),
    ("Grad norm", ("actor/grad_norm",), ("gradients",)),
    ("Policy loss", ("actor/loss",), ("loss_spikes",)),
)
"""(panel title, metrics drawn, rules it shows)."""
COLOUR = {"healthy": "C2", "warning": "C1", "failing": "C3", "unknown": "0.5"}


def run_name(source: str | Path) -> str:
    """A run's name for titles and file names: its directory for a run directory's own log
    (``runs/qwen-32b/metrics.jsonl`` -> ``qwen-32b``), else the file's name without suffix."""
    path = Path(source)
    for name in (*DIR_FILES, WANDB_CONSOLE):
        if path.as_posix().endswith("/" + name):
            return Path(path.as_posix()[: -len(name) - 1]).name or path.stem
    return path.name if path.is_dir() else path.stem


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "run"


def _drawn(run: Run, metric: str) -> tuple[list[float], list[float], bool]:
    """(steps, values, dense) of a metric: over every row of the run, with NaN where a row has
    no value (drawn as a gap), for a metric logged on most rows; only its own rows (drawn with
    markers) for a sparse one such as a validation score every N steps."""
    s = series(run, metric)
    if len(s) >= 0.5 * len(run):
        xs = [float(r["step"]) for r in run]
        ys = [
            float(r[metric])
            if isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric])
            else math.nan
            for r in run
        ]
        return xs, ys, True
    return s.steps, s.values, False


def write_report(
    out: Path,
    source: str,
    runs: Mapping[str, Run],
    results: Mapping[str, Sequence[Finding]],
    references: Mapping[str, ReferenceCurve],
    config: HealthConfig = HealthConfig(),
    max_figures: int = 12,
    policy_loss: str | None = None,
) -> Path:
    """Write ``report.md`` and the figures (seaborn, when installed) to ``out``; ``policy_loss``
    (from the run's ``config.json``) is named under the title."""
    out.mkdir(parents=True, exist_ok=True)
    first = next(iter(results.values()))
    verdicts = {label: verdict(fs, config) for label, fs in results.items()}
    lines = [
        f"# Health report: `{source}`",
        "",
        f"{len(runs)} run(s). Rules and thresholds: `dapo.health`."
        + (f" Policy loss: `{policy_loss}`." if policy_loss else ""),
        "",
    ]
    lines += [
        "| run | verdict | " + " | ".join(f.rule for f in first) + " |",
        "|---|---|" + "---|" * len(first),
    ]
    name = run_name(source)
    shown = {label: name if label == "run" else label for label in results}
    for label, fs in results.items():
        cells = [f.status + (f" (step {f.start_step:g})" if f.start_step is not None else "") for f in fs]
        lines.append(f"| {shown[label]} | {verdicts[label].status} | " + " | ".join(cells) + " |")
    figures, notes = plots(
        out, source, runs, results, {k: v.status for k, v in verdicts.items()}, references, max_figures
    )
    if len(runs) > max_figures:
        lines += ["", f"Figures for the first {max_figures} of {len(runs)} runs (`--max-figures`)."]
    for label, fs in results.items():
        lines += ["", f"## {shown[label]}: {verdicts[label].headline()}", ""]
        lines += [f"- Note: {n}" for n in run_notes(runs[label])]
        for f in fs:
            since = f" since step {f.start_step:g}" if f.start_step is not None else ""
            why = f" ({f.reason})" if f.reason else ""
            todo = f" What to do: {f.advice}." if f.status in ("warning", "failing") else ""
            lines.append(f"- **{f.title}: {f.status}**{why}{since}. {f.evidence}.{todo}")
        if label in figures:
            lines += ["", f"![{shown[label]}]({figures[label]})"]
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
    name = run_name(source)
    for n, (label, run) in enumerate(runs.items()):
        if n >= max_figures:
            break
        title = name if label == "run" else f"{name}: {label}"
        status = {f.rule: f for f in results[label]}
        panels = [p for p in PANELS if any(series(run, m) for m in p[1])]
        if not panels:
            continue
        cols = min(3, len(panels))
        rows = -(-len(panels) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.5 * rows), squeeze=False)
        for ax, (panel, metrics, rules) in zip(axes.flat, panels):
            for k, metric in enumerate(m for m in metrics if series(run, m)):
                s = series(run, metric)
                xs, ys, dense = _drawn(run, metric)
                ax.plot(xs, ys, color=f"C{k}", lw=1.2, label=metric, marker=None if dense else "o", ms=3)
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
            ax.set_title(panel + "\n" + ", ".join(f"{f.rule}: {f.status}" for f in verdicts), fontsize=8)
            ax.set_xlabel("training step")
            # below the panel, outside the data: never over a curve
            ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
        for ax in list(axes.flat)[len(panels) :]:
            ax.set_visible(False)
        fig.suptitle(f"{title}: {headline[label]}", fontsize=10)
        fig.tight_layout()
        file = f"{_slug(title)}.png"
        fig.savefig(out / file, dpi=90)
        plt.close(fig)
        figures[label] = file
        notes.setdefault(label, []).append(
            "Dotted lines: the run's own start (mean of its first tenth) where no reference band is on the run's scale; "
            "dashed verticals: the step a rule's problem started; gaps: steps that logged no value."
        )
    return figures, notes
