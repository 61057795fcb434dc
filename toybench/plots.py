"""Figures (the ``report`` extra: seaborn, matplotlib, pandas): each arm's curves with a
band over seeds (mean +- 1.96 standard errors: a normal-approximation 95% band).

Two rules keep them readable: each arm has its own colour, dash pattern and line width (the
first arm widest), so arms that coincide, such as the two one-update controls, still show
as a wide line with a narrower dashed one on top; and the legend sits below the panels,
never over the data (:func:`legend_below`, checked by ``tests/test_toy_plots.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .experiment import ExperimentResult

DASHES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (1, 1)))


def plotting_available() -> bool:
    try:
        import matplotlib  # noqa: F401
        import pandas  # noqa: F401
        import seaborn  # noqa: F401
    except ImportError:
        return False
    return True


def arm_style(i: int, n: int) -> dict[str, Any]:
    """Line style of the ``i``-th of ``n`` arms: distinct colour and dashes, widths from 3.2
    down to 1.2, so that a later arm drawn on an earlier one leaves the earlier visible."""
    width = 3.2 - 2.0 * i / max(1, n - 1)
    return {"color": f"C{i % 10}", "linestyle": DASHES[i % len(DASHES)], "linewidth": width}


def draw_arms(
    ax, df, x: str, y: str, by: str, order: list[str], labels: dict[str, str] | None = None
) -> None:  # type: ignore[no-untyped-def]
    """Mean of ``y`` over seeds against ``x`` for each ``by`` level in ``order`` (its own
    style, :func:`arm_style`, in the legend as ``labels[level]`` where given), with a 95%
    normal band (1.96 standard errors)."""
    for i, level in enumerate(order):
        g = df[df[by] == level].groupby(x)[y]
        mean, se = g.mean(), g.sem().fillna(0.0)
        style = arm_style(i, len(order))
        ax.plot(mean.index, mean.values, label=(labels or {}).get(level, level), **style)
        ax.fill_between(
            mean.index, mean - 1.96 * se, mean + 1.96 * se, color=style["color"], alpha=0.12, lw=0
        )


def legend_below(fig, axes, ncol: int | None = None) -> None:  # type: ignore[no-untyped-def]
    """One legend for the figure, under its panels (the handles of the first panel)."""
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    cols = ncol or min(len(labels), 4)
    rows = -(-len(labels) // max(1, cols))
    fig.tight_layout(rect=(0, 0.07 * rows + 0.03, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=cols, fontsize=7, frameon=False)


def experiment_figure(result: ExperimentResult):  # type: ignore[no-untyped-def]
    """The figure of one experiment: a panel per curve, every arm in each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    e = result.experiment
    rows = []
    curves = [(c, *c.split("@")) if "@" in c else (c, c, e.x_axis) for c in e.curves]  # "metric@x-axis"
    for arm, runs in result.logs.items():
        for seed, log in runs.items():
            for m in log:
                for curve, metric, x in curves:
                    if metric in m:
                        rows.append(
                            {"arm": arm, "seed": seed, "x": m[x], "metric": curve, "value": m[metric]}
                        )
    df = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, len(e.curves), figsize=(4.2 * len(e.curves), 4.0), squeeze=False)
    for ax, (curve, metric, x) in zip(axes[0], curves):
        sub = df[df.metric == curve]
        if x != "step":  # per-run x values differ: bin them so seeds can be averaged
            sub = sub.assign(x=(sub.x / (sub.x.max() / 40)).round() * (sub.x.max() / 40))
        draw_arms(ax, sub, "x", "value", "arm", list(result.logs), e.labels)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel(x)
        ax.set_ylabel("")
    fig.suptitle(f"{e.title}\n{result.primary.contrast.name}: {result.primary.verdict}", fontsize=9)
    legend_below(fig, list(axes[0]))
    return fig


def plot_experiment(result: ExperimentResult, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig = experiment_figure(result)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
