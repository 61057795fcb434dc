"""Calibration of ``dapo diagnose`` against the verdicts authors gave their own public runs.

``SOURCES.json`` in the calibration directory lists each log with its provenance, the
authors' verdict (``healthy`` / ``warning`` / ``failing``, or null where nobody judged the
run) and the problem they named; ``expected`` holds the verdict this tool is held to, and
``why`` explains every case where that is not the authors' verdict. This module diagnoses
each log and writes the confusion table (authors against ours) to ``reports/health/``:

    python -m dapo.health.calibration [--data tests/data/health/calibration] [--out reports/health]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from .config import HealthConfig
from .readers import RunLogError, read_runs
from .verdict import VERDICTS, diagnose, verdict

PROBLEM_RULES = {"truncation": "truncation_noise", "gradients": "gradients"}
"""Authors' problem names that differ from a rule's name."""
DATA = Path("tests/data/health/calibration")


def diagnose_log(path: Path, config: HealthConfig = HealthConfig()) -> dict[str, Any]:
    """Our verdict on one log: ``unreadable`` (with the reader's message) when no reader can
    take it."""
    try:
        runs, notes, fmt = read_runs(path)
    except RunLogError as err:
        return {"verdict": "unreadable", "format": None, "flagged": [], "headline": str(err), "notes": []}
    (run,) = runs.values()
    fs = diagnose(run, config)
    v = verdict(fs, config)
    return {
        "verdict": v.status,
        "format": fmt,
        "flagged": [f"{f.rule}:{f.status}" for f in fs if f.status in ("warning", "failing")],
        "headline": v.headline(),
        "notes": notes,
    }


def calibrate(data: Path = DATA) -> list[dict[str, Any]]:
    """Each source with our verdict and whether it agrees with the authors'."""
    sources = json.loads((data / "SOURCES.json").read_text())
    rows = []
    for src in sources:
        ours = diagnose_log(data / src["file"])
        problem = src.get("problem")
        rule = PROBLEM_RULES.get(problem, problem) if problem else None
        rows.append(
            {
                **src,
                "ours": ours,
                "agrees": src["authors_verdict"] == ours["verdict"],
                "problem_named": None
                if rule is None
                else any(flag.split(":")[0] == rule for flag in ours["flagged"]),
            }
        )
    return rows


def confusion(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """authors' verdict -> our verdict -> count."""
    table: dict[str, Counter[str]] = {}
    for r in rows:
        table.setdefault(str(r["authors_verdict"] or "not judged"), Counter())[r["ours"]["verdict"]] += 1
    return {k: dict(v) for k, v in table.items()}


def _count(rows: list[dict[str, Any]], authors: str, ours: str) -> int:
    return sum(r["authors_verdict"] == authors and r["ours"]["verdict"] == ours for r in rows)


def write(rows: list[dict[str, Any]], out: Path, command: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(rows, indent=2) + "\n")
    table = confusion(rows)
    ours = [*VERDICTS, "unreadable"]
    judged = [r for r in rows if r["authors_verdict"]]
    lines = [
        "# `dapo diagnose` against the authors' verdicts on real public logs",
        "",
        f"Command: `{command}`. Logs, provenance and the authors' words: `tests/data/health/calibration/SOURCES.json`.",
        "",
        f"{len(rows)} logs, {len(judged)} with a verdict from their authors or a maintainer, "
        f"{len({r['framework'].split()[0].lower().strip('(,') for r in rows})} frameworks or trainers. Ours is the same on "
        f"{sum(r['agrees'] for r in judged)} ({sum(r['agrees'] for r in judged) / max(1, len(judged)):.0%}); it calls healthy {_count(judged, 'failing', 'healthy') + _count(judged, 'warning', 'healthy')} "
        f"run(s) their authors call failing or warning, and failing {_count(judged, 'healthy', 'failing')} run(s) their "
        "authors call healthy (each with its reason below). Where a verdict differs, `why` in SOURCES.json says why.",
        "",
        "| authors \\ ours | " + " | ".join(ours) + " |",
        "|---|" + "---|" * len(ours),
    ]
    for authors in ("healthy", "warning", "failing", "not judged"):
        if authors in table:
            lines.append(f"| {authors} | " + " | ".join(str(table[authors].get(o, 0)) for o in ours) + " |")
    lines += [
        "",
        "| log | framework, format | steps | authors | ours | rules flagged | why they differ |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        flagged = ", ".join(r["ours"]["flagged"]) or "-"
        named = (
            ""
            if r["problem_named"] is None
            else (" (their problem named)" if r["problem_named"] else " (their problem NOT named)")
        )
        lines.append(
            f"| [{r['file']}]({r['url']}) | {r['framework']}, {r['ours']['format'] or r['format']} | {r['steps']} | "
            f"{r['authors_verdict'] or 'not judged'}{': ' + r['problem'] if r.get('problem') else ''} | "
            f"{r['ours']['verdict']}{named} | {flagged} | {r.get('why') or ''} |"
        )
    path = out / "calibration.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dapo.health.calibration", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--data", type=Path, default=DATA, help="directory with SOURCES.json and the logs")
    p.add_argument("--out", type=Path, default=Path("reports/health"), help="where calibration.md/json go")
    p.add_argument(
        "--check", action="store_true", help="exit 1 if a verdict differs from the source's 'expected'"
    )
    args = p.parse_args(argv)
    if not (args.data / "SOURCES.json").is_file():
        print(f"--data {args.data}: no SOURCES.json there (run from the repository root)", file=sys.stderr)
        return 2
    rows = calibrate(args.data)
    path = write(rows, args.out, "python -m dapo.health.calibration")
    print(path.read_text())
    wrong = [r["file"] for r in rows if r["ours"]["verdict"] != r.get("expected")]
    if args.check and wrong:
        print(f"verdicts differ from 'expected': {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
