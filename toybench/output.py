"""Writing experiment results: per-step JSONL, JSON summaries, the printed table."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from typing import Any

from .experiment import ExperimentResult


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_metrics(result: ExperimentResult, path: Path) -> None:
    """One JSON line per (arm, seed, step): the ``dapo.metrics`` schema plus ids."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for arm, runs in result.logs.items():
            for seed in result.seeds:
                for m in runs[seed]:
                    row = {"experiment": result.experiment.name, "arm": arm, "seed": seed}
                    row.update({k: _clean(v) for k, v in m.items()})
                    f.write(json.dumps(row) + "\n")


def summary_dict(result: ExperimentResult) -> dict[str, Any]:
    e = result.experiment
    return {
        "experiment": e.name,
        "title": e.title,
        "paper": e.paper,
        "task": e.task,
        "policy": result.policy,
        "horizon_steps": e.steps,
        "seeds": result.seeds,
        "blocks": result.blocks,
        "arms": {
            name: {
                "lr": a.lr,
                "task": a.task or e.task,
                "task_kwargs": a.task_kwargs,
                "config": a.cfg.to_dict(),
            }
            for name, a in e.arms.items()
        },
        "summaries": {
            name: {
                "description": e.summaries[name].description,
                "per_arm": {
                    arm: {"mean": _clean(_mean(v)), "per_seed": [_clean(x) for x in v]}
                    for arm, v in per_arm.items()
                },
            }
            for name, per_arm in result.summaries.items()
        },
        "contrasts": [
            {
                "name": c.contrast.name,
                "role": c.contrast.role,
                "a": c.contrast.a,
                "b": c.contrast.b,
                "summary": c.contrast.summary,
                "summary_b": c.contrast.summary_b,
                "expect": c.contrast.expect,
                "verdict": c.verdict,
                "blocks": {
                    name: {
                        "seeds": result.blocks[name],
                        "mean_diff": _clean(b.interval.mean),
                        "ci95": [_clean(b.interval.low), _clean(b.interval.high)],
                        "n": b.interval.n,
                        "verdict": b.verdict,
                        "per_seed_diff": [_clean(x) for x in b.per_seed],
                    }
                    for name, b in c.blocks.items()
                },
                "note": c.contrast.note,
            }
            for c in result.contrasts
        ],
        "verdict": result.primary.verdict,
        "cpu_seconds": round(result.cpu_seconds, 2),
        "sampled_tokens": result.sampled_tokens(),
    }


def _mean(v: list[float]) -> float:
    f = [x for x in v if not math.isnan(x)]
    return sum(f) / len(f) if f else math.nan


def _block_label(result: ExperimentResult) -> str:
    return ", ".join(f"{name} seeds {m[0]}..{m[-1]}" for name, m in result.blocks.items())


NAME_WIDTH = 58
"""Characters of a contrast's name per line of the table."""


def format_table(results: list[ExperimentResult]) -> str:
    """Each contrast's mean and 95% interval on every seed block, and the verdict: the
    block verdict where the blocks agree, ``fragile`` where they do not."""
    lines = []
    for r in results:
        e = r.experiment
        names = list(r.blocks)
        lines.append(f"\n== {e.name}: {e.title}")
        lines.append(f"   {e.paper}; {_block_label(r)}; horizon {e.steps} steps, {r.policy} policy")
        head = "".join(f" {name[:12] + ' (mean, 95% CI)':>33}" for name in names)
        lines.append(f"   {'role':<9} {'contrast (b - a)':<{NAME_WIDTH}}{head}  verdict")
        for c in r.contrasts:
            cells = ""
            for name in names:
                iv = c.blocks[name].interval
                cells += f" {iv.mean:>+9.3f} [{iv.low:+.3f}, {iv.high:+.3f}]"
            verdict = c.verdict
            if c.fragile:
                verdict += " (" + " / ".join(c.blocks[n].verdict for n in names) + ")"
            # a long name wraps at a word onto the lines below, never cut
            first, *rest = textwrap.wrap(c.contrast.name, NAME_WIDTH) or [""]
            lines.append(f"   {c.contrast.role:<9} {first:<{NAME_WIDTH}}{cells}  {verdict}")
            lines += [f"   {'':<9} {more}" for more in rest]
    lines.append("\n== verdicts (primary contrasts; reproduced = on every seed block)")
    for r in results:
        p = r.primary
        ivs = "; ".join(
            f"{n} {b.interval.mean:+.3f} [{b.interval.low:+.3f}, {b.interval.high:+.3f}]"
            for n, b in p.blocks.items()
        )
        lines.append(f"   {r.experiment.name:<18} {p.verdict:<15} {p.contrast.name} ({ivs})")
    return "\n".join(lines)


def run_settings(results: list[ExperimentResult], steps: int | None) -> dict[str, Any]:
    """What makes two runs' contrasts comparable: the seed blocks, the policy and the horizon
    override (``--steps``; None: each experiment's own horizon)."""
    return {"blocks": results[0].blocks, "policy": results[0].policy, "steps": steps}


def write_all(
    results: list[ExperimentResult],
    out: Path,
    wall_seconds: float,
    steps: int | None = None,
    merge: bool = False,
) -> dict[str, Any]:
    """Each experiment's ``metrics.jsonl`` and ``summary.json`` under ``out/<experiment>/``,
    and ``out/summary.json``: every experiment's verdict and contrasts, the run's settings
    (:func:`run_settings`) and the paper's experiments it lacks (``missing``: the gate refuses
    a summary that lacks one).

    ``merge`` (a run of some experiments, not ``all``): an ``out/summary.json`` written at the
    same settings keeps its other experiments and takes these; one written at other settings
    (or by an older version, without settings) is left as it was, so that one summary never
    mixes settings and another command's results are never lost. The returned mapping says
    which: ``summary`` is ``written``, ``merged`` or ``kept``."""
    from .experiments import REGISTRY

    out.mkdir(parents=True, exist_ok=True)
    summaries = []
    for r in results:
        d = out / r.experiment.name
        write_metrics(r, d / "metrics.jsonl")
        s = summary_dict(r)
        (d / "summary.json").write_text(json.dumps(s, indent=2))
        summaries.append(s)
    settings = run_settings(results, steps)
    experiments = {
        s["experiment"]: {
            "verdict": s["verdict"],
            "contrasts": s["contrasts"],
            "sampled_tokens": s["sampled_tokens"],
        }
        for s in summaries
    }
    path, state = out / "summary.json", "written"
    before = _read_summary(path) if merge and path.is_file() else None
    if before is not None and before.get("settings") == settings:
        experiments = {**before["experiments"], **experiments}
        wall_seconds += before.get("wall_seconds", 0.0)
        state = "merged"
    elif merge and path.is_file():
        state = "kept"
    total = {
        "wall_seconds": round(wall_seconds, 2),
        "sampled_tokens": sum(e.get("sampled_tokens", 0.0) for e in experiments.values()),
        "settings": settings,
        "missing": [name for name in REGISTRY if name not in experiments],
        "experiments": experiments,
    }
    if state != "kept":
        path.write_text(json.dumps(total, indent=2))
    return {**total, "sampled_tokens": sum(s["sampled_tokens"] for s in summaries), "summary": state}


def _read_summary(path: Path) -> dict[str, Any] | None:
    """``out/summary.json`` as :func:`write_all` wrote it, or None (unreadable, another shape)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and isinstance(data.get("experiments"), dict)
    return data if ok else None


def markdown_as_text(markdown: str, tables: int | None = None) -> str:
    """A Markdown report as plain terminal text: headings and prose kept, tables aligned in
    columns without pipes, images and emphasis marks dropped. ``tables`` keeps only the
    first N tables (and the text before each)."""
    out: list[str] = []
    rows: list[list[str]] = []
    seen = 0

    def flush() -> None:
        if rows:
            widths = [max(len(r[i]) if i < len(r) else 0 for r in rows) for i in range(len(rows[0]))]
            out.extend("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
            rows.clear()

    for raw in markdown.splitlines():
        line = raw.strip()
        if line.startswith("|"):
            cells = [c.strip().replace("**", "").replace("`", "") for c in line.strip("|").split("|")]
            if all(set(c) <= set("-: ") for c in cells):
                continue  # the header separator
            if not rows:
                seen += 1
            rows.append(cells)
            continue
        flush()
        if tables is not None and seen >= tables and line.startswith("#"):
            break
        if line.startswith("!["):
            continue
        out.append(line.lstrip("#").strip().replace("**", "").replace("`", ""))
    flush()
    while out and not out[-1]:
        out.pop()
    return "\n".join(out)
