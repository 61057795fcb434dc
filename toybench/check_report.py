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
    MIN_SEEDS,
    MIN_SHARE,
    MODES,
    NO_YARDSTICK,
    TOO_FEW,
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
        NO_YARDSTICK: "no yardstick",
        TOO_FEW: "too few seeds",
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
        "Every arm trains with `toybench.optim.ScaleFreeSGD`: SGD's direction with a step a constant "
        "factor on the loss does not change, as under the trainer's AdamW (a loss x 0.15 is judged as "
        "the loss; under plain SGD it was a smaller learning rate), at each mode's step "
        "(`toybench.check.STEP_ENTROPY` ...: the step SGD takes with DAPO's loss in the experiment). "
        "*learns*: the learning gate, judged first: the candidate's exact expected-accuracy gain, last 10 "
        "steps minus step 0 (the gain over a no-update control of the same seed), must not be shown to "
        f"fall short of {LEARNING_MARGIN:.0%} of the gain of DAPO's own loss on the same seeds (the "
        f"interval of candidate - {LEARNING_MARGIN:g} x DAPO not below 0 on either seed block; the share "
        "is derived from DAPO's loss alone, [step_sweep.md](step_sweep.md)), with at most "
        f"{MAX_SKIPPED_SHARE:.0%} of its optimizer steps skipped for a non-finite loss; a loss that fails "
        "it gets *cannot judge: learns too little* and no protection verdict or share. *contract*: finite "
        "on empty rows and on a micro-batch with no loss token, unchanged by padding, a gradient on every "
        "class of loss token, a positive advantage raises its token's log-prob, a dual clip that leaves "
        "positive advantages alone (`toybench.losses.probe_contract`). *The yardstick*: DAPO's fix "
        "against the unprotected arm, both with DAPO's loss, measured once per seed block and the same "
        "for every candidate; a mode where it does not exclude 0 in the fix's direction on both blocks "
        "judges no candidate (*cannot judge: DAPO's fix shows no effect here*). *Equal learning* "
        "(entropy collapse, length bias: DAPO's fix there is a loss property): on each seed the two "
        "reference arms fix a window (from the step each reaches 90% of the smaller of their accuracy "
        "gains, over the steps both have left); the candidate is read from its own crossing of that "
        "level over the same steps (fewer if it has fewer left, at least 10, the references re-read over "
        "as many), and a seed where it never gets there, or a run skips steps, is left out and named "
        f"(`toybench.matched`); a block with fewer than {MIN_SEEDS} judged seeds is *cannot judge: too "
        "few seeds*. The two † modes (fixed by sampling or reward) are read at equal steps: their "
        f"summaries measure learning itself. *protects*: candidate - unprotected beyond {MIN_SHARE:.0%} "
        "of the fix's effect in its direction, paired by seed, on both seed blocks; *harms*: beyond it "
        "against (*differs between seed blocks* fails a claim). *vs DAPO's fix*: candidate - fix inside "
        f"+-{MIN_SHARE:.0%} of the fix's effect (`as fix`), or excluding 0 (`better`/`weaker`). *share "
        "of fix*: mean (candidate - unprotected) / (fix - unprotected), only where the candidate passed "
        "the learning gate. "
        "Failure modes (fix; summary; arms): "
        f"{modes}.\n\n"
        f"{figure}"
        f"{format_table(results)}\n"
    )
    path = out / "README.md"
    path.write_text(text)
    return path
