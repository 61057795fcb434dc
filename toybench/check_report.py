"""The committed loss report (``dapo toy check --all --out reports/losses``): README.md with
the table, results.json, and a heat-map of the share of DAPO's fix each loss recovers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .check import (
    DOES_NOT_LEARN,
    FRAGILE,
    LEARNING_MARGIN,
    MAX_SKIPPED_SHARE,
    MODES,
    LossResult,
    format_table,
)
from .plots import plotting_available

HEATMAP = "heatmap.png"


def plot_heatmap(results: list[LossResult], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    modes = list(results[0].modes)
    frame = pd.DataFrame(
        [[r.modes[m].recovered for m in modes] for r in results],
        index=[r.loss.spec for r in results],
        columns=[m.replace("_", " ") + ("" if MODES[m].loss_can_act else " †") for m in modes],
    )
    labels = [
        [
            f"{r.modes[m].recovered:.2f}\n{_mark(r.modes[m].protection)}"
            if math.isfinite(r.modes[m].recovered)
            else "n/a"
            for m in modes
        ]
        for r in results
    ]
    fig, ax = plt.subplots(figsize=(1.9 * len(modes) + 2.5, 0.42 * len(results) + 1.6))
    sns.heatmap(
        frame.clip(-1.5, 1.5),
        annot=labels,
        fmt="",
        cmap="RdBu",
        center=0.0,
        vmin=-1.5,
        vmax=1.5,
        cbar_kws={"label": "share of DAPO's fix recovered (1 = as much as the fix)"},
        ax=ax,
        annot_kws={"fontsize": 7},
    )
    ax.set_title(
        "Policy losses against the four failure modes (paired seeds, both blocks)\n"
        "† fixed by sampling or reward in DAPO: a loss only changes how fast the run learns",
        fontsize=9,
    )
    ax.set_ylabel("")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _mark(protection: str) -> str:
    return {
        "protects": "protects",
        "harms": "harms",
        FRAGILE: "blocks differ",
        DOES_NOT_LEARN: "learns too little",
    }.get(protection, "")


def write_report(results: list[LossResult], payload: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    figure = ""
    if plotting_available():
        plot_heatmap(results, out / HEATMAP)
        figure = f"![heat-map]({HEATMAP})\n\n"
    modes = ", ".join(
        f"{m.name} ({m.fix_name}; {m.summary}, {m.unprotected} vs {m.fix})" for m in MODES.values()
    )
    text = (
        "# Policy losses against the four failure modes\n\n"
        f"Reproduce: `{payload['command']}` ({payload['seconds']:.0f} s; "
        f"{payload['seeds_per_block']} paired seeds per block, discovery and confirmation).\n\n"
        "Each candidate runs the experiment's *unprotected* arm with its policy loss swapped in and "
        "the clip/aggregation knobs set to the loss's own recipe; sampling and reward stay unprotected. "
        "*learns*: the learning gate, judged first: the candidate's exact expected-accuracy gain, last 10 "
        "steps minus step 0 (a run without updates keeps its step-0 policy, so this is the gain over a "
        f"no-update control of the same seed), must be at least {LEARNING_MARGIN:.0%} of the gain of "
        "DAPO's own loss in the same conditions on the same seeds (the interval of candidate - "
        f"{LEARNING_MARGIN:g} x DAPO above 0 on both seed blocks), with at most "
        f"{MAX_SKIPPED_SHARE:.0%} of its optimizer steps skipped for a non-finite loss; a loss that fails "
        "it gets *cannot judge: learns too little* and no protection verdict or share (a policy that "
        "hardly moves keeps its entropy and its length gap by standing still). *contract*: finite on "
        "empty rows and on a micro-batch with no loss token, unchanged by padding, a positive advantage "
        "raises its token's log-prob, a dual clip that leaves positive advantages alone "
        "(`toybench.losses.probe_contract`). *Equal learning* (entropy collapse, length bias: DAPO's fix "
        "there is a loss property): each arm's entropy, or its wrong path's length minus the right "
        "one's, is read from the step it reaches 90% of the accuracy gain all three compared arms reach "
        "on that seed, over the same number of steps (`toybench.matched`). The two † modes (fixed by "
        "sampling or reward) are read at equal steps: their summaries measure learning itself. "
        "*protects*: candidate - unprotected excludes 0 in the direction of DAPO's fix on both seed "
        "blocks (*differs between seed blocks* fails a claim). *vs DAPO's fix*: candidate - fix inside "
        "+-25% of the fix's effect (`as fix`), or excluding 0 (`better`/`weaker`). *share of fix*: mean "
        "(candidate - unprotected) / (fix - unprotected), only where the candidate passed the learning "
        "gate. An interval within 1e-9 of the metric's scale is *no effect*. "
        "Failure modes (fix; summary; arms): "
        f"{modes}.\n\n"
        f"{figure}"
        f"{format_table(results)}\n"
    )
    path = out / "README.md"
    path.write_text(text)
    return path
