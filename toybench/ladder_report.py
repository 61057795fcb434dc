"""Markdown reports (and seaborn figures) for ``dapo toy ladder`` and ``dapo toy factorial``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from dapo import PRESETS, SWITCHES

from . import ladder as L
from .experiment import ExperimentResult
from .output import write_metrics
from .plots import draw_arms, legend_below, plotting_available


def _fmt(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.3f}"


def _ci(lo: float, hi: float) -> str:
    return f"[{lo:+.3f}, {hi:+.3f}]"


def _range(lo: float, hi: float) -> str:
    return f"[{lo:.3f}, {hi:.3f}]"


def write_ladder(result: ExperimentResult, wall: float, out: Path, command: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    write_metrics(result, out / "metrics.jsonl")
    s = result.summaries
    lines = [
        "# The Table-1 ladder on the composite toy",
        "",
        f"Command: `{command}`  ",
        f"Wall time: {wall:.1f} s; {len(result.seeds)} paired seeds per rung; "
        f"horizon {result.experiment.steps} steps; tabular policy, SGD lr {L.LR}.",
        "",
        "Each rung adds one technique to the one above (the paper's order). The paper's AIME avg@32: "
        "30, 36, 38, 41, 42, 50. Values: mean over seeds [95% bootstrap interval]; step: paired difference "
        "from the rung above [95% BCa interval].",
        "",
    ]
    table = {}
    blocks = result.blocks
    heads = " | ".join(f"step, {b} seeds {m[0]}..{m[-1]} | 95% CI" for b, m in blocks.items())
    for metric in ("accuracy_final", "accuracy_mean"):
        steps = L.ladder_steps(s[metric], result.seeds, blocks)
        table[metric] = steps
        lines += [
            f"## {L.RESPONSES[metric].description}",
            "",
            f"| rung | mean | 95% CI | vs | {heads} | holds |",
            "|---|---|---|---|" + "---|---|" * len(blocks) + "---|",
        ]
        for r in steps:
            cells = " | ".join(
                f"{_fmt(r.get(f'step_{b}'))} | "
                f"{_ci(r[f'low_{b}'], r[f'high_{b}']) if f'step_{b}' in r else ''}"
                for b in blocks
            )
            lines.append(
                f"| {r['rung']} | {r['mean']:.3f} | {_range(r['low'], r['high'])} | {r.get('vs', '')} | "
                f"{cells} | {r.get('holds', '')} |"
            )
        lines.append("")
    lines += [
        "Variants below the six rungs change only how truncated responses enter the group statistics "
        "(`filtered_group_stats`; the rungs use `shaped`) and are compared with the dapo rung.",
        "",
    ]
    lines += [
        "## Health metrics per rung (means over seeds)",
        "",
        "| rung | entropy | truncation | length | all-wrong groups | rare path prob | responses generated |",
        "|---|---|---|---|---|---|---|",
    ]
    for rung in result.experiment.arms:
        m = {k: float(np.nanmean(s[k][rung])) for k in s}
        lines.append(
            f"| {rung} | {m['entropy_final']:.3f} | {m['truncation_final']:.3f} | {m['length_final']:.2f} | "
            f"{m['uniform_groups_final']:.3f} | {m['best_path_final']:.3f} | {m['responses_total']:.0f} |"
        )
    _write_reference(result, out / "reference.json")
    fig = _ladder_figure(result, out, table["accuracy_final"]) if plotting_available() else None
    if fig:
        lines += ["", f"![ladder]({fig})"]
    (out / "ladder.json").write_text(
        json.dumps(
            {
                "command": command,
                "wall_seconds": wall,
                "seeds": result.seeds,
                "blocks": blocks,
                "steps": result.experiment.steps,
                "table": table,
                "summaries": s,
            },
            indent=2,
            default=L.nan_to_none,
        )
    )
    path = out / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _ladder_figure(result: ExperimentResult, out: Path, finals: list[dict]) -> str:
    """Accuracy and entropy per rung over the run, and each rung's final accuracy with the
    interval of the report's table (``finals``: :func:`toybench.ladder.ladder_steps` rows),
    drawn, not computed again."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    rows = [
        {
            "rung": arm,
            "seed": seed,
            "step": m["step"],
            "accuracy": m["toy/expected_accuracy"],
            "entropy": m["actor/entropy"],
        }
        for arm, runs in result.logs.items()
        for seed, log in runs.items()
        for m in log
    ]
    df = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    for ax, y in zip(axes[:2], ("accuracy", "entropy")):
        draw_arms(ax, df, "step", y, "rung", list(result.logs))
        ax.set_title(y, fontsize=9)
    rungs = [r for r in finals if r["rung"] in PRESETS]
    x = list(range(len(rungs)))
    mean = [r["mean"] for r in rungs]
    err = [[r["mean"] - r["low"] for r in rungs], [r["high"] - r["mean"] for r in rungs]]
    axes[2].errorbar(x, mean, yerr=err, fmt="o-", color="C0", capsize=3)
    axes[2].set_xticks(x, [r["rung"] for r in rungs], rotation=30, ha="right")
    axes[2].set_title("final accuracy per rung (mean, 95% bootstrap interval)", fontsize=9)
    legend_below(fig, list(axes[:2]))
    fig.savefig(out / "ladder.png", dpi=100)
    plt.close(fig)
    return "ladder.png"


def write_factorial(result: ExperimentResult, wall: float, out: Path, command: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    s = result.summaries
    lines = [
        "# The 2^5 factorial on the composite toy",
        "",
        f"Command: `{command}`  ",
        f"Wall time: {wall:.1f} s for {len(result.experiment.arms)} cells x "
        f"{len(result.seeds)} paired seeds; horizon {result.experiment.steps} steps.",
        "",
        "Switches, in the paper's order of addition: " + ", ".join(f"`{k}`" for k in SWITCHES) + ". "
        "Effects use +-1 coding: mean over the cells with the switch on minus the cells with it off "
        "(interactions: cells where the two agree minus where they differ). Intervals: 95% bootstrap over "
        "seeds, paired across cells. Main effects are given on each seed block; interactions and Shapley "
        "values pool both blocks.",
        "",
    ]
    blocks = result.blocks
    pos = {seed: i for i, seed in enumerate(result.seeds)}
    payload = {
        "command": command,
        "wall_seconds": wall,
        "seeds": result.seeds,
        "blocks": blocks,
        "steps": result.experiment.steps,
    }
    for metric in ("accuracy_final", "accuracy_mean"):
        eff = L.factorial_effects(s[metric])
        per_block = {
            b: L.factorial_effects(s[metric], [pos[x] for x in m])["main"] for b, m in blocks.items()
        }
        sh = L.shapley(s[metric])
        payload[metric] = {
            "effects": {k: [e.__dict__ for e in v] for k, v in eff.items()},
            "shapley": sh,
            "main_per_block": {b: [e.__dict__ for e in v] for b, v in per_block.items()},
        }
        heads = " | ".join(f"effect, {b} | 95% CI" for b in blocks)
        lines += [
            f"## Response: {L.RESPONSES[metric].description}",
            "",
            "### Main effects",
            "",
            f"| technique | {heads} | holds |",
            "|---|" + "---|---|" * len(blocks) + "---|",
        ]
        for i, e in enumerate(eff["main"]):
            es = [per_block[b][i] for b in blocks]
            holds = L.holds([1 if x.low > 0 else -1 if x.high < 0 else 0 for x in es])
            cells = " | ".join(f"{x.mean:+.3f} | {_ci(x.low, x.high)}" for x in es)
            lines.append(f"| {e.name} | {cells} | {holds} |")
        lines += [
            "",
            "### Two-way interactions",
            "",
            "| pair | interaction | 95% CI | excludes 0 |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {e.name} | {e.mean:+.3f} | {_ci(e.low, e.high)} | {'yes' if e.low > 0 or e.high < 0 else ''} |"
            for e in eff["interactions"]
        ]
        lines += [
            "",
            "### Contribution by order of addition",
            "",
            "Shapley value: the gain from adding a technique, averaged over all 120 orders; its range "
            "over orders; and its gain in the paper's order (the ladder).",
            "",
            "| technique | Shapley | 95% CI | min over orders | max over orders | paper's order |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {k} | {v['shapley']:+.3f} | {_ci(v['low'], v['high'])} | {v['min_over_orders']:+.3f} | "
            f"{v['max_over_orders']:+.3f} | {v['paper_order']:+.3f} |"
            for k, v in sh.items()
        ]
        lines.append("")
    cells = sorted(result.experiment.arms, key=lambda n: -float(np.mean(s["accuracy_final"][n])))
    lines += [
        "## Cells (final accuracy, mean over seeds)",
        "",
        "| cell | accuracy | entropy | truncation |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {c} | {np.mean(s['accuracy_final'][c]):.3f} | {np.nanmean(s['entropy_final'][c]):.3f} | "
        f"{np.nanmean(s['truncation_final'][c]):.3f} |"
        for c in cells
    ]
    if plotting_available():
        lines += ["", f"![effects]({_factorial_figure(payload, out)})"]
    (out / "factorial.json").write_text(json.dumps(payload, indent=2, default=L.nan_to_none))
    (out / "cells.json").write_text(json.dumps(s, indent=2, default=L.nan_to_none))
    path = out / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _factorial_figure(payload: dict, out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", font_scale=0.8)
    eff = payload["accuracy_final"]["effects"]["main"]
    sh = payload["accuracy_final"]["shapley"]
    inter = payload["accuracy_final"]["effects"]["interactions"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    names = [e["name"] for e in eff]
    axes[0].barh(
        names,
        [e["mean"] for e in eff],
        xerr=[[e["mean"] - e["low"] for e in eff], [e["high"] - e["mean"] for e in eff]],
        color="C0",
    )
    axes[0].set_title("main effects on final accuracy (95% CI)")
    ks = list(sh)
    axes[1].barh(ks, [sh[k]["shapley"] for k in ks], color="C2", label="Shapley")
    for i, k in enumerate(ks):
        axes[1].plot([sh[k]["min_over_orders"], sh[k]["max_over_orders"]], [i, i], color="k", lw=1)
        axes[1].plot(sh[k]["paper_order"], i, "o", color="C3", label="paper's order" if i == 0 else None)
    axes[1].legend(fontsize=7)
    axes[1].set_title("contribution: Shapley (bar), range over orders (line)")
    switches = list(SWITCHES)
    grid = np.zeros((len(switches), len(switches)))
    for e in inter:
        a, b = e["name"].split(" x ")
        i, j = switches.index(a), switches.index(b)
        grid[i, j] = grid[j, i] = e["mean"]
    sns.heatmap(
        grid,
        xticklabels=switches,
        yticklabels=switches,
        center=0,
        annot=True,
        fmt=".3f",
        ax=axes[2],
        cmap="vlag",
        cbar=False,
    )
    axes[2].set_title("two-way interactions")
    fig.tight_layout()
    fig.savefig(out / "factorial.png", dpi=100)
    plt.close(fig)
    return "factorial.png"


def _write_reference(result: ExperimentResult, path: Path) -> None:
    """Bands of the healthy reference (the dapo rung) for ``dapo diagnose --reference``."""
    from dapo.health import references_from_runs

    runs = list(result.logs["dapo"].values())
    refs = references_from_runs(
        runs,
        [
            "actor/entropy",
            "rollout/length_mean",
            "rollout/truncation_rate",
            "rollout/accuracy",
            "actor/mean_prob",
            "rollout/groups_all_wrong",
        ],
        source=f"toybench composite task, dapo rung, {len(runs)} seeds (min..max)",
    )
    path.write_text(
        json.dumps(
            {
                k: {
                    "source": r.source,
                    "progress": r.progress,
                    "low": r.low,
                    "high": r.high,
                    "note": "toy reference: compare toy runs only",
                }
                for k, r in refs.items()
            },
            indent=2,
        )
    )
