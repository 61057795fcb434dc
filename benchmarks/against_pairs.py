"""Measurement: ``dapo diagnose RUN --against REF`` on the calibration logs that come in pairs,
one run its authors call failed and one of the same trainer and task they call healthy (the
method fixed, or another seed of the same recipe). Each way round: the failed run against the
healthy one as its single reference (it should depart, the outcome below), and the healthy run
against the failed one (its outcome should not depart below). One reference gives the widest
band the method builds (:mod:`dapo.health.against`), so this is the hardest case for finding a
departure and the easiest for a false one.

    python benchmarks/against_pairs.py      # seconds; writes reports/health/against_pairs.{md,json}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dapo.health.against import Reference, compare
from dapo.health.readers import read_runs

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "health" / "calibration"
PAIRS = (
    ("monarch-grpo-run3-not-learning.log", "monarch-grpo-run12-best.log"),
    ("monarch-grpo-run8-gloo-sync.log", "monarch-grpo-run12-best.log"),
    ("monarch-grpo-run10-fsx-sync.log", "monarch-grpo-run12-best.log"),
    ("verifier-reward-mitigated_seed7.jsonl", "verifier-reward-mitigated_seed9.jsonl"),
    ("verifier-reward-mitigated_seed8.jsonl", "verifier-reward-mitigated_seed9.jsonl"),
    ("asycn-verl-sigfrac-slowema-ret0.98.jsonl", "asycn-verl-sigfrac-alpharlim0.05.jsonl"),
)
"""(failed or warned-about run, healthy run of the same trainer), as their authors judge them
(SOURCES.json): the Monarch runs 3, 8 and 10 against run 12, the authors' fix; two collapsed
seeds of the verifier-reward 'mitigated' arm against its healthy seed; a verl run whose
validation falls late against the same recipe with another setting."""


def _run(name: str) -> list[dict[str, float]]:
    (run,) = read_runs(DATA / name)[0].values()
    return run


def judge(run: str, ref: str) -> dict[str, object]:
    c = compare(run, _run(run), [Reference(ref, DATA / ref, "run", _run(ref))])
    outcome_below = [d for d in c.departures if d.metric in c.config.outcomes and d.direction == "below"]
    return {
        "status": c.status,
        "outcome_below_from": outcome_below[0].step if outcome_below else None,
        "departures": [f"{d.metric} {d.direction} from {d.step:g}" for d in c.departures],
    }


def main() -> int:
    rows = [
        {"failed": f, "healthy": h, "failed_vs_healthy": judge(f, h), "healthy_vs_failed": judge(h, f)}
        for f, h in PAIRS
    ]
    out = ROOT / "reports" / "health"
    (out / "against_pairs.json").write_text(json.dumps(rows, indent=2) + "\n")
    departs = sum(r["failed_vs_healthy"]["outcome_below_from"] is not None for r in rows)
    clean = sum(r["healthy_vs_failed"]["outcome_below_from"] is None for r in rows)
    lines = [
        "# `--against` on the calibration pairs",
        "",
        "Command: `python benchmarks/against_pairs.py`. A failed run against the healthy run of its trainer "
        "as the single reference, and the other way round (`benchmarks/against_pairs.py` says why these pairs).",
        "",
        f"The failed run's outcome departs below in {departs} of {len(rows)} pairs; the healthy run's outcome "
        f"stays out of the band's low side in {clean} of {len(rows)}.",
        "",
        "| failed run | healthy run | failed vs healthy | healthy vs failed |",
        "|---|---|---|---|",
    ]
    for r in rows:
        a, b = r["failed_vs_healthy"], r["healthy_vs_failed"]
        lines.append(
            f"| {r['failed']} | {r['healthy']} | {a['status']}: {'; '.join(a['departures']) or 'no departure'} | "
            f"{b['status']}: {'; '.join(b['departures']) or 'no departure'} |"
        )
    (out / "against_pairs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
