"""Calibration of ``dapo diagnose`` against the verdicts authors gave their own public runs.

``SOURCES.json`` in the calibration directory lists each log with its provenance, the
authors' verdict (``healthy`` / ``warning`` / ``failing``, or null where nobody judged the
run) and the problem they named; ``expected`` holds the verdict this tool is held to, and
``why`` explains every case where that is not the authors' verdict. ``batch`` says how the log
came in: ``development`` logs were in view while the rules were shaped; a ``held-out-N`` batch
was gathered by someone who saw neither the rules nor their verdicts, and ``first_pass`` keeps
the verdict the tool gave it the first time, before anything was changed for it. First-pass
agreement on a held-out batch is the figure that says how the rules carry to logs nobody here
chose; what changed after it is said in ``why``. This module diagnoses each log and writes the
confusion tables (authors against ours, per batch and in all) to ``reports/health/``:

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
from .rules import RULES
from .verdict import VERDICTS, diagnose, verdict

RULE_NAMES = {r.name for r in RULES}

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


def batches(rows: list[dict[str, Any]]) -> list[str]:
    """The batches in the order they came in (their order in SOURCES.json)."""
    return list(dict.fromkeys(batch(r) for r in rows))


def batch(row: dict[str, Any]) -> str:
    return str(row.get("batch", "development"))


CRITERION = (
    ("misses", "authors call it failing or warning, we call it healthy", "none"),
    ("flagged", "of the runs whose authors name a problem, flagged warning or failing", ">= 80%"),
    ("same kind", "of those whose problem is a rule's, that rule flagged", ">= 80%"),
    ("false alarms", "of the runs their authors call healthy, called failing", "<= 10%"),
    ("inconclusive", "of the judged logs, inconclusive", "<= 20%"),
    ("readable", "logs read", "all"),
)
"""Issue 70's criterion (issue 48's, with flagged >= 80%), per blind batch and over every
held-out batch: the figure, what it counts, the goal."""


def _first(r: dict[str, Any]) -> tuple[str, list[str] | None] | None:
    """The first-pass verdict and flagged rules (None: not recorded; rules None: verdict only)."""
    fp = r.get("first_pass")
    if fp is None:
        return None
    if isinstance(fp, dict):
        return str(fp["verdict"]), list(fp.get("flagged", []))
    return str(fp), None


def criterion(rows: list[dict[str, Any]], first_pass: bool = False) -> dict[str, str]:
    """The criterion's figures (:data:`CRITERION`) on ``rows``, now or on the first pass
    (``first_pass``: only rows with a recorded first pass; "same kind" needs its flagged rules)."""

    def view(r: dict[str, Any]) -> tuple[str, list[str] | None]:
        if first_pass:
            got = _first(r)
            assert got is not None
            return got
        return r["ours"]["verdict"], r["ours"]["flagged"]

    rows = [r for r in rows if not first_pass or _first(r) is not None]
    judged = [r for r in rows if r["authors_verdict"]]
    named = [r for r in judged if r["authors_verdict"] in ("failing", "warning")]
    healthy = [r for r in judged if r["authors_verdict"] == "healthy"]

    def rule_of(r: dict[str, Any]) -> str | None:
        p = r.get("problem")
        rule = PROBLEM_RULES.get(p, p) if p else None
        return rule if rule in RULE_NAMES else None

    kinds = [r for r in named if rule_of(r)]
    kind_known = [r for r in kinds if view(r)[1] is not None]

    def frac(n: int, d: int) -> str:
        return f"{n}/{d} ({n / d:.0%})" if d else "-"

    return {
        "misses": str(sum(view(r)[0] == "healthy" for r in named)),
        "flagged": frac(sum(view(r)[0] in ("warning", "failing") for r in named), len(named)),
        "same kind": frac(
            sum(any(f.split(":")[0] == rule_of(r) for f in view(r)[1] or []) for r in kind_known),
            len(kind_known),
        )
        if len(kind_known) == len(kinds)
        else f"not recorded ({len(kinds)} runs)",
        "false alarms": frac(sum(view(r)[0] == "failing" for r in healthy), len(healthy)),
        "inconclusive": frac(sum(view(r)[0] == "inconclusive" for r in judged), len(judged)),
        "readable": frac(sum(view(r)[0] != "unreadable" for r in rows), len(rows)),
    }


def criterion_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per batch, the criterion's figures on the first pass (where recorded) and now."""
    lines = [
        "| batch | pass | " + " | ".join(f"{name} ({goal})" for name, _, goal in CRITERION) + " |",
        "|---|---|" + "---|" * len(CRITERION),
    ]
    held = [r for r in rows if batch(r).startswith("held-out")]
    groups = [(name, [r for r in rows if batch(r) == name]) for name in batches(rows)]
    for name, part in [*groups, *([("**every held-out batch**", held)] if held else [])]:
        passes = [("first", True)] if any(_first(r) for r in part) else []
        for label, first in [*passes, ("now", False)]:
            figures = criterion(part, first)
            lines.append(f"| {name} | {label} | " + " | ".join(figures[n] for n, _, _ in CRITERION) + " |")
    return lines


def agreement(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(runs whose verdict is the authors', runs the authors judged)."""
    judged = [r for r in rows if r["authors_verdict"]]
    return sum(r["agrees"] for r in judged), len(judged)


def summary(rows: list[dict[str, Any]]) -> str:
    """One paragraph: the logs, the agreement, the two errors that matter most."""
    same, judged = agreement(rows)
    done = [r for r in rows if r["authors_verdict"]]
    missed = _count(done, "failing", "healthy") + _count(done, "warning", "healthy")
    frameworks = len({r["framework"].split()[0].lower().strip("(,") for r in rows})
    firsts = {id(r): got[0] for r in rows if (got := _first(r)) is not None}
    blind = [r for r in done if id(r) in firsts]
    first = (
        f" The first time the tool saw them, before any change made for them, it agreed on "
        f"{sum(firsts[id(r)] == r['authors_verdict'] for r in blind)} of {len(blind)} "
        f"({sum(v == 'unreadable' for v in firsts.values())} unreadable)."
        if blind
        else ""
    )
    return (
        f"{len(rows)} logs, {judged} with a verdict from their authors or a maintainer, {frameworks} frameworks "
        f"or trainers. Ours is the same on {same} ({same / max(1, judged):.0%}); it calls healthy {missed} run(s) "
        f"their authors call failing or warning, and failing {_count(done, 'healthy', 'failing')} run(s) their "
        "authors call healthy. Where a verdict differs, `why` in SOURCES.json says why." + first
    )


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The confusion table, authors' verdicts in rows, ours in columns."""
    table = confusion(rows)
    ours = [*VERDICTS, "unreadable"]
    lines = ["| authors \\ ours | " + " | ".join(ours) + " |", "|---|" + "---|" * len(ours)]
    for authors in ("healthy", "warning", "failing", "not judged"):
        if authors in table:
            lines.append(f"| {authors} | " + " | ".join(str(table[authors].get(o, 0)) for o in ours) + " |")
    return lines


def write(rows: list[dict[str, Any]], out: Path, command: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [
        "# `dapo diagnose` against the authors' verdicts on real public logs",
        "",
        f"Command: `{command}`. Logs, provenance and the authors' words: `tests/data/health/calibration/SOURCES.json`.",
        "",
    ]
    lines += [
        "## The criterion per batch (issue 48)",
        "",
        "; ".join(f"**{n}**: {what}" for n, what, _ in CRITERION) + ". A batch's first pass is the tool's "
        "verdicts the first time it read the batch, with the rules frozen before; 'now' is after any change "
        "made since. The development batch was in view while the rules were shaped.",
        "",
        *criterion_lines(rows),
        "",
    ]
    for name in [*batches(rows), "all"]:
        part = rows if name == "all" else [r for r in rows if batch(r) == name]
        if part and (name != "all" or len({batch(r) for r in rows}) > 1):
            lines += [f"## {name}", "", summary(part), "", *table_lines(part), ""]
    lines += [
        "## Each log",
        "",
        "| log | batch | framework, format | steps | authors | ours | rules flagged | why they differ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        flagged = ", ".join(r["ours"]["flagged"]) or "-"
        named = (
            ""
            if r["problem_named"] is None
            else (" (their problem named)" if r["problem_named"] else " (their problem NOT named)")
        )
        lines.append(
            f"| [{r['file']}]({r['url']}) | {batch(r)} | {r['framework']}, {r['ours']['format'] or r['format']} | {r['steps']} | "
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
