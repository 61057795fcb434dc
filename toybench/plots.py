"""Figures (the ``report`` extra: seaborn, matplotlib, pandas): each arm's curves with a
band over seeds (mean +- 1.96 standard errors: a normal-approximation 95% band)."""

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
    fig, axes = plt.subplots(1, len(e.curves), figsize=(4.2 * len(e.curves), 3.4), squeeze=False)
    for ax, (curve, metric, x) in zip(axes[0], curves):
        sub = df[df.metric == curve]
        if x != "step":  # per-run x values differ: bin them so seeds can be averaged
            sub = sub.assign(x=(sub.x / (sub.x.max() / 40)).round() * (sub.x.max() / 40))
        sns.lineplot(data=sub, x="x", y="value", hue="arm", errorbar=("se", 1.96), ax=ax)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel(x)
        ax.set_ylabel("")
        ax.legend(fontsize=7)
    fig.suptitle(f"{e.title}\n{result.primary.contrast.name}: {result.primary.verdict}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
