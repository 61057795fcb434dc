"""Figures (the ``report`` extra: seaborn, matplotlib, pandas): each arm's curves with a
band over seeds (mean and 95% bootstrap interval, seaborn's default estimator)."""

from __future__ import annotations

from pathlib import Path

from .experiment import ExperimentResult


def plotting_available() -> bool:
    try:
        import matplotlib  # noqa: F401
        import pandas  # noqa: F401
        import seaborn  # noqa: F401
    except ImportError:
        return False
    return True


def plot_experiment(result: ExperimentResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    e = result.experiment
    rows = []
    for arm, runs in result.logs.items():
        for seed, log in runs.items():
            for m in log:
                for metric in e.curves:
                    if metric in m:
                        rows.append({"arm": arm, "seed": seed, "x": m[e.x_axis], "metric": metric, "value": m[metric]})
    df = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, len(e.curves), figsize=(4.2 * len(e.curves), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], e.curves):
        sub = df[df.metric == metric]
        sns.lineplot(data=sub, x="x", y="value", hue="arm", errorbar=("ci", 95), n_boot=200, seed=0, ax=ax)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel(e.x_axis)
        ax.set_ylabel("")
        ax.legend(fontsize=7)
    fig.suptitle(f"{e.title}\n{result.primary.contrast.name}: {result.primary.verdict}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
