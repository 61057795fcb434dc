"""The ``off_policy`` report: tolerated staleness per configuration, protection of DAPO's
fixes under staleness, engine precision, the simulated clock, and what goes the other way
(README.md, off_policy.json, off_policy.png)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from dapo.offpolicy import CORRECTIONS

from . import noninferiority as N
from . import off_policy as O
from .check import MODES
from .experiment import ExperimentResult
from .plots import plotting_available
from .stats import Interval, paired_interval


def _iv(iv: Interval) -> str:
    if iv.n == 0 or not math.isfinite(iv.mean):
        return "n/a"
    return f"{iv.mean:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}]"


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _sd(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.stdev(finite) if len(finite) > 1 else math.nan


def _collapse(steps: list[float], horizon: int) -> str:
    """How many seeds' entropy collapsed, and the median step among those that did."""
    hit = sorted(v for v in steps if math.isfinite(v) and v < horizon)
    if not hit:
        return f"0/{len(steps)}"
    return f"{len(hit)}/{len(steps)} at {statistics.median(hit):.0f}"


def _c(result: ExperimentResult, name: str):
    return next(c for c in result.contrasts if c.contrast.name == name)


def grid_rows(result: ExperimentResult, staleness: tuple[int, ...] = O.STALENESS) -> list[dict[str, Any]]:
    """One row per configuration and k >= 1: the paired differences against the base at
    k = 0 on both blocks, and the arm's means."""
    s = result.summaries
    rows = []
    for cfg in O.configs():
        for k in staleness:
            if k == 0:
                continue
            arm = cfg.arm(k)
            acc = _c(result, f"{arm} accuracy_final")
            ent = _c(result, f"{arm} entropy_final")
            rows.append(
                {
                    "config": cfg.label,
                    "arm": arm,
                    "k": k,
                    "accuracy": {b: acc.blocks[b].interval for b in result.blocks},
                    "accuracy_sd": {b: _sd(acc.blocks[b].per_seed) for b in result.blocks},
                    "entropy": {b: ent.blocks[b].interval for b in result.blocks},
                    "accuracy_mean": _mean(s["accuracy_final"][arm]),
                    "accuracy_at_tokens": _mean(s["accuracy_at_tokens"][arm]),
                    "entropy_mean": _mean(s["entropy_mean"][arm]),
                    "collapse_step": _mean(s["collapse_step"][arm]),
                    "collapse": _collapse(s["collapse_step"][arm], result.experiment.steps),
                    "diverged": _mean(s["diverged"][arm]),
                    "k3_kl": _mean(s["k3_kl"][arm]),
                }
            )
    return rows


def clock_rows(result: ExperimentResult, staleness: tuple[int, ...] = O.STALENESS) -> list[dict[str, Any]]:
    """For DAPO with no correction and with token TIS, with and without partial rollouts:
    the paired speed-up of the pipeline over the synchronous loop (median over seeds, for
    each training cost of :data:`CLOCK_TRAIN`), and accuracy at equal wall clock (half the
    synchronous run's time at the middle training cost) against k = 0."""
    rows = []
    base_logs = result.logs["dapo_k0"]
    seeds = result.seeds
    gen0 = {seed: O.generation_times(base_logs[seed], False) for seed in seeds}
    unit = _mean([_mean(g) for g in gen0.values()])  # mean on-policy generation time per step
    for partial in (False, True):
        for corr in ("none", "token_tis"):
            if partial and corr not in O.PARTIAL_CORRECTIONS:
                continue
            for k in staleness:
                if k == 0 and (partial or corr != "none"):
                    continue  # one synchronous reference row
                arm = O.arm_name("dapo", k, partial, corr)
                if arm not in result.logs:
                    continue
                logs = result.logs[arm]
                speed = {}
                for c in O.CLOCK_TRAIN:
                    ratios = []
                    for seed in seeds:
                        sync = O.pipeline_time(gen0[seed], c * unit, 0)[-1]
                        mine = O.pipeline_time(O.generation_times(logs[seed], partial), c * unit, k)[-1]
                        ratios.append(sync / mine)
                    speed[c] = statistics.median(ratios)
                diffs = []
                for seed in seeds:
                    sync_t = O.pipeline_time(gen0[seed], unit, 0)
                    budget = 0.5 * sync_t[-1]
                    mine_t = O.pipeline_time(O.generation_times(logs[seed], partial), unit, k)
                    diffs.append(
                        _acc_at(logs[seed], mine_t, budget) - _acc_at(base_logs[seed], sync_t, budget)
                    )
                acc_steps = (
                    _c(result, f"{arm} accuracy_final").blocks["discovery"].interval
                    if arm != "dapo_k0"
                    else None
                )
                rows.append(
                    {
                        "arm": arm,
                        "k": k,
                        "partial": partial,
                        "correction": corr,
                        "speedup": speed,
                        "accuracy_equal_steps": acc_steps,
                        "accuracy_equal_clock": paired_interval(diffs),
                    }
                )
    return rows


def _acc_at(log: list[dict[str, float]], times: list[float], budget: float) -> float:
    for m, t in zip(log, times):
        if t >= budget:
            return m["toy/expected_accuracy"]
    return log[-1]["toy/expected_accuracy"]


def other_way(rows: list[dict[str, Any]], result: ExperimentResult) -> list[str]:
    """Findings against the expectation that staleness only hurts and corrections only help,
    on both blocks."""
    out = []
    blocks = list(result.blocks)
    for r in rows:
        acc, ent = r["accuracy"], r["entropy"]
        if all(acc[b].n and acc[b].low > 0 for b in blocks):
            out.append(f"{r['arm']}: accuracy above its base at k = 0 ({_iv(acc['discovery'])} discovery)")
        if all(ent[b].n and ent[b].low > 0 for b in blocks):
            out.append(f"{r['arm']}: entropy above its base at k = 0 ({_iv(ent['discovery'])} discovery)")
    by = {(r["config"], r["k"]): r for r in rows}
    for r in rows:
        if r["config"].startswith("dapo,") and not r["config"].endswith(" none"):
            none = by.get(("dapo, none", r["k"]))
            if none and all(
                r["accuracy"][b].n
                and none["accuracy"][b].n
                and r["accuracy"][b].high < none["accuracy"][b].low
                for b in blocks
            ):
                out.append(
                    f"{r['arm']}: the correction loses accuracy against no correction at k = {r['k']} "
                    f"({r['accuracy_mean']:.3f} vs {none['accuracy_mean']:.3f}, intervals disjoint on both blocks)"
                )
    return out


def _plan(diffs: dict[str, Any], n: int) -> dict[str, Any]:
    """The procedure's planned and observed operating characteristics (simulated)."""
    import numpy as np

    sds: dict[str, list[float]] = {mt: [] for mt in N.METRICS}
    rhos: list[float] = []
    for per in diffs.values():
        for mt in N.METRICS:
            ks = sorted(per[mt])
            for b in per[mt][ks[0]]:
                arr = np.asarray([per[mt][k][b] for k in ks], dtype=np.float64)
                arr = arr[:, np.isfinite(arr).all(0)]
                sds[mt] += [float(x) for x in arr.std(1, ddof=1)]
                c = np.corrcoef(arr)
                rhos += [float(c[i, j]) for i in range(len(ks)) for j in range(i) if np.isfinite(c[i, j])]
    observed_sd = {mt: statistics.median(v) for mt, v in sds.items()}
    rho = statistics.median(rhos) if rhos else N.RHO
    p80 = N.PILOT["paired_sd_p80"]
    twice = {mt: [2 * N.MARGINS[mt]] * 4 for mt in ("accuracy",)}
    return {
        "seeds_per_block": n,
        "planned_seeds": O.SEEDS,
        "planned": N.simulate(O.SEEDS, p80),
        "observed_sd": observed_sd,
        "observed_rho": rho,
        "observed": N.simulate(n, observed_sd, rho=max(0.0, min(0.99, rho))),
        "twice_margin": N.simulate(n, p80, cost=twice),
    }


def write_report(
    grid: ExperimentResult, protection: list[ExperimentResult], wall: float, out: Path, command: str
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    blocks = grid.blocks
    names = " | ".join(f"{b} ({m[0]}..{m[-1]})" for b, m in blocks.items())
    rows = grid_rows(grid)
    lines = [
        "# Off-policy on the toys: staleness, partial rollouts, engine precision, corrections",
        "",
        f"Command: `{command}`  ",
        f"Wall time: {wall:.0f} s; {len(grid.seeds)} paired seeds per arm in two blocks ({names}); "
        f"horizon {grid.experiment.steps} steps on the composite task; tabular policy, SGD.",
        "",
        "Staleness k: the engine samples step s with the policy version s - k (versions are training steps); "
        "each token keeps the log-prob of the version that sampled it; the trainer recomputes its own. "
        "Partial rollouts: each response is cut at a weight update, its prefix from version s - k - 1. "
        "Corrections: `dapo.offpolicy.CORRECTIONS`, each a verl or AReaL preset with its defaults. "
        "Differences are paired by seed against the same base (GRPO or DAPO) at k = 0, mean [95% BCa interval].",
        "",
        "## Tolerated staleness",
        "",
        "One procedure, planned and applied at one error rate (`toybench.noninferiority`): at each k, "
        "accuracy and entropy at the horizon (the outcome, and the health DAPO's Clip-Higher protects) "
        "must each be non-inferior to the same base at k = 0 within their margin, on both seed blocks: the "
        f"one-sided {1 - N.ALPHA:.0%} lower bound (Student's t) of the paired mean difference above minus the "
        "margin. The ladder is walked k = 1, 2, 4, 8 and stops at the first k not shown (fixed-sequence "
        f"testing: family-wise one-sided error {N.ALPHA} over the ladder, no correction needed). "
        "**Tolerated up to** the last k shown; **harmful from** the first k where a loss beyond the margin "
        "(the one-sided upper bound below minus the margin) is shown on both blocks on either metric; between "
        "them, cannot tell. `dapo train` reads these two columns (it refuses to start at a harmful k).",
        "",
        "| configuration | tolerated up to k | harmful from k | where the ladder stopped | "
        + " | ".join(f"acc. at k=8 - k=0, {b}" for b in blocks)
        + " | entropy at k=8 - k=0 | entropy collapsed at k=8 (k=0) |",
        "|---|---|---|---|" + "---|" * len(blocks) + "---|---|",
    ]
    judged = O.verdicts(grid)
    verdicts: dict[str, dict[str, Any]] = {}
    diffs: dict[str, Any] = {}
    s = grid.summaries
    for cfg in O.configs():
        v = judged[cfg.label]
        verdicts[cfg.label] = {
            "upto": v.upto,
            "stop": v.stop,
            "harmful_from": v.harmful_from,
            "why": v.why,
        }
        diffs[cfg.label] = O.differences(grid, cfg)
        r8 = next(r for r in rows if r["arm"] == cfg.arm(8))
        cells = " | ".join(_iv(r8["accuracy"][b]) for b in blocks)
        k0 = _collapse(s["collapse_step"][O.arm_name(cfg.base, 0)], grid.experiment.steps)
        lines.append(
            f"| {cfg.label} | {v.upto} | {v.harmful_from if v.harmful_from is not None else '-'} | "
            f"{v.why or 'the whole ladder shown'} | {cells} | {_iv(r8['entropy']['discovery'])} | "
            f"{r8['collapse']} ({k0}) |"
        )
    plan = _plan(diffs, len(grid.seeds) // max(1, len(blocks)))
    m = N.MARGINS
    lines += [
        "",
        f"**The margins** (fixed before this table's seeds were run): {N.MARGIN_SHARE:.0%} of DAPO's own figure at "
        f"k = 0, measured on the pilot's seeds ({N.PILOT['seeds']}): accuracy {m['accuracy']:g} "
        f"({N.MARGIN_SHARE:.0%} of its gain over the run, {N.PILOT['dapo_k0_first_accuracy']:.3f} -> "
        f"{N.PILOT['dapo_k0_final_accuracy']:.3f}), entropy {m['entropy']:g} nats ({N.MARGIN_SHARE:.0%} of its "
        f"{N.PILOT['dapo_k0_final_entropy']:.3f} at the horizon). Why {N.MARGIN_SHARE:.0%}: the smallest gain the "
        "DAPO paper credits to one technique is the token-level loss's, 1 AIME point of the 20 the four add over "
        "naive GRPO (Table 1); a staleness cost below that share cannot undo any one fix's reported effect.",
        "",
        f"**Power, by simulating the procedure itself** (`toybench.noninferiority.simulate`, 4,000 tables): "
        f"planned at the pilot's 80th-percentile paired sd (accuracy {N.PILOT['paired_sd_p80']['accuracy']}, "
        f"entropy {N.PILOT['paired_sd_p80']['entropy']}) and correlation {N.RHO} between k's, {O.SEEDS} seeds per "
        f"block tolerate a configuration whose staleness costs nothing up to k = 8 with probability "
        f"{plan['planned']['tolerated_all']:.0%} (`plan_seeds`); this run has {plan['seeds_per_block']} per block. "
        f"Observed here (median over rows and blocks): paired sd accuracy {plan['observed_sd']['accuracy']:.4f}, "
        f"entropy {plan['observed_sd']['entropy']:.4f}; correlation between k's {plan['observed_rho']:.2f}; at "
        f"those, the probability is {plan['observed']['tolerated_all']:.0%}. A cost of twice the margin at every "
        f"k is called harmful at k = 1 in {plan['twice_margin']['harmful_at_k1']:.0%} of tables; with no cost, "
        f"some k is called harmful in {plan['planned']['harmful']:.1%}.",
    ]
    lines += [
        "",
        "## Every arm",
        "",
        "Per configuration and k: the paired change against the same base at k = 0 in accuracy and in "
        "entropy at the horizon (last 10 steps), on each block; the arm's means over all seeds; entropy "
        f"collapse (below {O.COLLAPSE:.0%} of its first value): seeds whose entropy collapsed, and the median "
        "step among them.",
        "",
        f"| arm | k | acc. - k=0 ({', '.join(blocks)}) | entropy - k=0 ({', '.join(blocks)}) | acc. | "
        f"acc. at {O.TOKEN_BUDGET:,.0f} tokens | entropy (run mean) | entropy collapsed | diverged | k3 KL |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    s = grid.summaries
    for base in ("grpo", "dapo"):
        arm = f"{base}_k0"
        lines.append(
            f"| {arm} | 0 | (reference) | (reference) | {_mean(s['accuracy_final'][arm]):.3f} | "
            f"{_mean(s['accuracy_at_tokens'][arm]):.3f} | {_mean(s['entropy_mean'][arm]):.3f} | "
            f"{_collapse(s['collapse_step'][arm], grid.experiment.steps)} | {_mean(s['diverged'][arm]):.2f} | 0 |"
        )
    for r in rows:
        acc = "; ".join(_iv(r["accuracy"][b]) for b in blocks)
        ent = "; ".join(_iv(r["entropy"][b]) for b in blocks)
        lines.append(
            f"| {r['arm']} | {r['k']} | {acc} | {ent} | {r['accuracy_mean']:.3f} | {r['accuracy_at_tokens']:.3f} | "
            f"{r['entropy_mean']:.3f} | {r['collapse']} | {r['diverged']:.2f} | {r['k3_kl']:.2e} |"
        )
    lines += [
        "",
        "## Engine precision (k = 0): an engine that rounds its logits",
        "",
        "| engine, correction | acc. - exact engine (" + ", ".join(blocks) + ") | mean k3 KL |",
        "|---|---|---|",
    ]
    for precision in O.PRECISIONS:
        for corr in O.PRECISION_CORRECTIONS:
            arm = O.arm_name("dapo", 0, correction=corr, precision=precision)
            c = _c(grid, f"{arm} accuracy_final")
            lines.append(
                f"| {precision}, {corr} | {'; '.join(_iv(c.blocks[b].interval) for b in blocks)} | "
                f"{_mean(s['k3_kl'][arm]):.2e} |"
            )
    lines += [
        "",
        "## Do DAPO's fixes keep protecting under staleness? (no correction)",
        "",
        "Each failure mode's experiment, its unprotected and fixed arm both at staleness k: fix - unprotected "
        "in the experiment's primary summary (the direction of the fix is the expected one).",
        "",
        "| failure mode (fix, summary) | k | " + " | ".join(blocks) + " | verdict |",
        "|---|---|" + "---|" * len(blocks) + "---|",
    ]
    prot_json = {}
    for mode, res in zip(MODES.values(), protection):
        for c in res.contrasts:
            k = int(c.contrast.name.rsplit("=", 1)[1])
            prot_json.setdefault(mode.name, {})[k] = {
                "verdict": c.verdict,
                **{b: _iv(c.blocks[b].interval) for b in blocks},
            }
            lines.append(
                f"| {mode.name} ({mode.fix_name}, {mode.summary} {mode.better}) | {k} | "
                f"{' | '.join(_iv(c.blocks[b].interval) for b in blocks)} | {c.verdict} |"
            )
    clock = clock_rows(grid)
    lines += [
        "",
        "## The clock: what each staleness buys and costs",
        "",
        "One generator and one trainer, at most k versions apart (the generator starts batch s once the trainer "
        "has finished step s - k - 1); generation times are the toys' simulated ones with a long tail "
        "(per-response slowdown exp(z), each round waits for its slowest response; with partial rollouts a "
        "round costs its responses' mean instead: the generator is interrupted, never idle). Training costs "
        + ", ".join(f"{c:g}" for c in O.CLOCK_TRAIN)
        + " x the mean on-policy generation time per step. Speed-up: the synchronous loop's time over the "
        "pipeline's for the whole run (median over seeds). Accuracy at equal wall clock: at half the "
        "synchronous run's time (training cost 1), paired against k = 0, discovery and confirmation seeds "
        "together.",
        "",
        "| arm | speed-up, train " + " / ".join(f"{c:g}" for c in O.CLOCK_TRAIN) + " | acc. at equal steps "
        "(discovery) | acc. at equal wall clock |",
        "|---|---|---|---|",
    ]
    for r in clock:
        eq = _iv(r["accuracy_equal_steps"]) if r["accuracy_equal_steps"] is not None else "(reference)"
        lines.append(
            f"| {r['arm']} | {' / '.join(f'{v:.2f}x' for v in r['speedup'].values())} | {eq} | "
            f"{_iv(r['accuracy_equal_clock'])} |"
        )
    other = other_way(rows, grid)
    lines += ["", "## What goes the other way (on both seed blocks)", ""]
    lines += [f"- {o}" for o in other] or ["- nothing: no arm beats its base at k = 0 on both blocks"]
    fig = _figure(rows, out) if plotting_available() else None
    if fig:
        lines += ["", f"![off-policy]({fig})"]
    payload = {
        "command": command,
        "wall_seconds": wall,
        "seeds": grid.seeds,
        "blocks": blocks,
        "steps": grid.experiment.steps,
        "procedure": {
            "alpha": N.ALPHA,
            "power": N.POWER,
            "metrics": list(N.METRICS),
            "margins": N.MARGINS,
            "margin_share": N.MARGIN_SHARE,
            "pilot": N.PILOT,
            **plan,
        },
        "verdicts": verdicts,
        "differences": diffs,
        "grid": [_jsonable(r) for r in rows],
        "protection": prot_json,
        "clock": [_jsonable(r) for r in clock],
        "other_way": other,
    }
    (out / "off_policy.json").write_text(json.dumps(payload, indent=2, default=_none) + "\n")
    path = out / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _none(x: Any) -> Any:
    return None


def _jsonable(x: Any) -> Any:
    if isinstance(x, Interval):
        return {"mean": x.mean, "low": x.low, "high": x.high, "n": x.n}
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _figure(rows: list[dict[str, Any]], out: Path) -> str:
    import matplotlib.pyplot as plt

    fig = off_policy_figure(rows)
    fig.savefig(out / "off_policy.png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "off_policy.png"


def off_policy_figure(rows: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    """Small multiples: a column per family of corrections (:data:`toybench.off_policy.FIGURE_FAMILIES`,
    each beside ``none``), accuracy and entropy (each minus k = 0) against staleness; a
    correction keeps its colour in every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = O.FIGURE_FAMILIES
    fig, axes = plt.subplots(2, len(fams), figsize=(4.2 * len(fams), 7.4), sharex=True, squeeze=False)
    palette = plt.get_cmap("tab10")
    for col, (title, partial, corrections) in enumerate(fams):
        for row, what in enumerate(("accuracy", "entropy")):
            ax = axes[row][col]
            for i, corr in enumerate(corrections):
                label = f"dapo{' +partial' if partial else ''}, {corr}"
                pts = [r for r in rows if r["config"] == label]
                ks = [r["k"] * (1 + 0.03 * (i - (len(corrections) - 1) / 2)) for r in pts]
                iv = [r[what]["discovery"] for r in pts]
                ax.errorbar(
                    ks,
                    [v.mean for v in iv],
                    yerr=[[v.mean - v.low for v in iv], [v.high - v.mean for v in iv]],
                    marker="o",
                    ms=3,
                    capsize=2,
                    color=palette(list(CORRECTIONS).index(corr) % 10),
                    label=O.CORRECTION_LABELS.get(corr, corr),
                )
            ax.axhline(0, color="k", lw=0.6)
            ax.axhline(-N.MARGINS[what], color="grey", lw=0.6, ls="--")
            ax.set_xscale("log", base=2)
            ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
            ax.set_title(f"DAPO, {title}: {what} - k=0", fontsize=9)
            if row == 1:
                ax.set_xlabel("staleness k (versions)")
        axes[1][col].legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, frameon=False)
    fig.suptitle(
        "Off-policy corrections under staleness (discovery seeds, 95% CI; dashed: the margin)", fontsize=10
    )
    fig.tight_layout()
    return fig
