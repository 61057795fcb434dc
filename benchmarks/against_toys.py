"""Measurement: ``dapo diagnose RUN --against REF ...`` (:mod:`dapo.health.against`) on toy runs
made to fail at a known step, with healthy toy runs of the same recipe as references.

The runs are the health suite's (:data:`toybench.health_suite.FAULTS`, the composite task, 60
steps): four arms made to fail from step 30 (engine noise, NaN log-probs every 5 steps, the
learning rate x30, rollouts 32 versions stale) and two healthy arms, each the recipe of some of
them without the fault: ``clean`` (an engine that agrees with the trainer to 1e-7: the recipe of
``engine_noise_late``) and ``base`` (no engine at all: the recipe of the other three, whose
logs have no engine/trainer gap until the fault). Seeds ``0 .. refs-1`` of the healthy arm are
the references; seeds from ``refs`` on are judged, so no judged run is a reference.

Measured, with 1, 2 and ``refs`` references (the first seeds):

* lead time: steps from the fault (step 30) to the first departure found at or after it (its
  start step, the "onset" of the module's docstring, step 5), and to the step that confirms it
  (where a log growing step by step would first show it); the metric that left first; runs
  with a departure before the fault (a false alarm on the part of the run that is still
  healthy) and runs with none after it (missed); the comparison's level (warning, failing);
* false alarms: the share of healthy runs (seeds not used as references, both healthy arms)
  that the comparison calls warning or failing, with a 95% Wilson interval.

    python benchmarks/against_toys.py            # ~1 minute on 2 cores; writes reports/health/against.{md,json}
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from dapo.health.against import AgainstConfig, Reference, compare
from toybench.experiment import Arm, run_experiments
from toybench.health_suite import FAULTS, FAULTS_BASE

ROOT = Path(__file__).resolve().parents[1]
ONSET = 30
LATE = {  # fault arm -> the healthy arm of its recipe
    "engine_noise_late": "clean",
    "nan_late": "base",
    "lr_late": "base",
    "stale_late": "base",
}
WHAT = {
    "engine_noise_late": "engine noise 0.3 from step 30 (engine/trainer log-prob gap; training unchanged)",
    "nan_late": "NaN log-probs at steps 30, 35, ..., 55 (those steps' update metrics are NaN)",
    "lr_late": "learning rate x30 from step 30 (the policy sharpens at once; accuracy rises)",
    "stale_late": "rollouts 32 versions stale from step 30, uncorrected (accuracy falls, then climbs again)",
}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k/n."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def measure(logs: dict, refs: int, held: range, late: range, counts: tuple[int, ...]) -> dict:
    cfg = AgainstConfig()
    out: dict = {"references": {}, "faults": {}, "false_alarms": {}}
    for n in counts:
        chosen = {arm: list(range(min(n, refs))) for arm in ("clean", "base")}
        reference = {
            arm: [Reference(f"{arm}/seed={s}", Path(arm), str(s), logs[arm][s]) for s in seeds]
            for arm, seeds in chosen.items()
        }
        out["references"][n] = {arm: [f"{arm}/seed={s}" for s in seeds] for arm, seeds in chosen.items()}
        faults = {}
        for arm, healthy in LATE.items():
            rows = []
            for seed in late:
                c = compare(f"{arm}/seed={seed}", logs[arm][seed], reference[healthy], cfg)
                ds = c.departures
                # found: shown by a block that ends at or after the fault (its estimated start may lie
                # a step or two before it: the change point's own error, a negative lead); early: shown
                # by a block that ends before the fault (a false alarm on the still-healthy part)
                after = [d for d in ds if d.confirmed >= ONSET]
                before = [d for d in ds if d.confirmed < ONSET]
                first = min(after, key=lambda d: (d.step, d.confirmed)) if after else None
                confirm = min(after, key=lambda d: d.confirmed) if after else None
                outcome = [d for d in after if d.metric in cfg.outcomes]
                rows.append(
                    {
                        "seed": seed,
                        "status": c.status,
                        "lead": None if first is None else first.step - ONSET,
                        "lead_confirmed": None if confirm is None else confirm.confirmed - ONSET,
                        "first_metric": None if first is None else f"{first.metric} {first.direction}",
                        "early": [f"{d.metric} {d.direction} at step {d.step:g}" for d in before],
                        "outcome": [f"{d.metric} {d.direction} at step {d.step:g}" for d in outcome],
                        "departures": [f"{d.metric} {d.direction} at step {d.step:g}" for d in ds],
                    }
                )
            faults[arm] = {"rows": rows, **_summary(rows)}
        out["faults"][n] = faults
        out["false_alarms"][n] = {}
        for kind, change in OFFSETS.items():
            alarms = []
            for arm in ("clean", "base"):
                for seed in held:
                    c = compare(f"{arm}/seed={seed}", change(logs[arm][seed]), reference[arm], cfg)
                    alarms.append(
                        {
                            "run": f"{arm}/seed={seed}",
                            "status": c.status,
                            "departures": [
                                f"{d.metric} {d.direction} at step {d.step:g}" for d in c.departures
                            ],
                        }
                    )
            k = sum(a["status"] != "healthy" for a in alarms)
            bad = sum(a["status"] == "failing" for a in alarms)
            lo, hi = wilson(k, len(alarms))
            out["false_alarms"][n][kind] = {
                "runs": len(alarms),
                "alarms": k,
                "failing": bad,
                "rate": k / len(alarms),
                "low": lo,
                "high": hi,
                "rows": alarms,
            }
    return out


def _times(metric: str, factor: float):
    def change(rows: list[dict]) -> list[dict]:
        return [
            {**r, metric: r[metric] * factor} if isinstance(r.get(metric), (int, float)) else r for r in rows
        ]

    return change


OFFSETS = {
    "as run": lambda rows: rows,
    "grad norm x1.15": _times("actor/grad_norm", 1.15),
    "length x1.15": _times("rollout/length_mean", 1.15),
}
"""The healthy runs judged as they ran, and with a 15% level offset in grad norm or mean length
at every row (another batch size or prompt set: not a fault, issue 70)."""


def _summary(rows: list[dict]) -> dict:
    leads = [r["lead"] for r in rows if r["lead"] is not None]
    conf = [r["lead_confirmed"] for r in rows if r["lead_confirmed"] is not None]
    firsts: dict[str, int] = {}
    for r in rows:
        if r["first_metric"]:
            firsts[r["first_metric"]] = firsts.get(r["first_metric"], 0) + 1
    return {
        "runs": len(rows),
        "found": len(leads),
        "missed": len(rows) - len(leads),
        "early": sum(bool(r["early"]) for r in rows),
        "lead_median": statistics.median(leads) if leads else None,
        "lead_min": min(leads) if leads else None,
        "lead_max": max(leads) if leads else None,
        "confirmed_median": statistics.median(conf) if conf else None,
        "confirmed_min": min(conf) if conf else None,
        "confirmed_max": max(conf) if conf else None,
        "first_metric": firsts,
        "status": {s: sum(r["status"] == s for r in rows) for s in ("healthy", "warning", "failing")},
        "outcome_below": sum(any(" below " in o for o in r["outcome"]) for r in rows),
    }


RULE_OF = {
    "engine_noise_late": ("rollout_mismatch",),
    "nan_late": ("gradients",),
    "lr_late": ("kl_blowup", "entropy_collapse"),
    "stale_late": ("off_policy_drift",),
}


def _notes() -> list[str]:
    """What the table does not say by itself, and the rules' own lead times on the same fault
    arms (seeds 0-9, from the committed reports/health/health_suite.json) for comparison."""
    notes = [
        "Notes:",
        "",
        "- `nan_late` is missed by design: a NaN row is left out of every series, and the NaN steps change no "
        "metric enough to leave the band; the gradients rule reports the non-finite values themselves.",
        "- `lr_late`: the outcome leaves the band *above* (accuracy rises as the policy sharpens), so the comparison "
        "says warning (health metrics departed, the outcome did not follow), never failing.",
        "- With 1 reference no between-run spread is known: the band is the noise alone (the output says so), and "
        "a seed's own course reads as a departure; with 2 or more the spread is the references' own, on Student's t "
        "with their degrees of freedom.",
    ]
    suite = ROOT / "reports" / "health" / "health_suite.json"
    if suite.is_file():
        det = json.loads(suite.read_text()).get("detection", {})
        parts = []
        for arm, rules in RULE_OF.items():
            for rule in rules:
                d = det.get(rule)
                if d and d.get("lead_median") is not None:
                    parts.append(
                        f"`{arm}` -> {rule} {d['lead_median']:g} [{d['lead_min']:g}, {d['lead_max']:g}]"
                    )
        notes.append(
            "- The rules' own lead times on these fault arms, judging the log as it grows (seeds 0-9, "
            "`reports/health/health_suite.json`, `dapo toy health`): "
            + "; ".join(parts)
            + ". Compare them with the "
            "'confirmed' column: a rule knows what a fault looks like; the comparison only knows the references."
        )
    return notes


def _range(d: dict, key: str) -> str:
    if d[f"{key}_median"] is None:
        return "-"
    return f"{d[f'{key}_median']:g} [{d[f'{key}_min']:g}, {d[f'{key}_max']:g}]"


def write(result: dict, out: Path, command: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "against.json").write_text(json.dumps(result, indent=2) + "\n")
    cfg = result["config"]
    lines = [
        "# `dapo diagnose --against` on toy runs made to fail at a known step",
        "",
        f"Command: `{command}` ({result['wall_s']:.0f} s wall, {result['cpu_count']} CPU cores, 1-minute load "
        f"average {result['load_before']:.1f} before it; {result['trained_runs']} toy runs trained)",
        "",
        "Runs: the health suite's fault arms (`toybench.health_suite.FAULTS`, composite task, 60 steps), made to fail "
        f"from step {ONSET}; references: healthy runs of the same recipe without the fault (`clean`: an engine that "
        "agrees to 1e-7, the recipe of `engine_noise_late`; `base`: no engine, the recipe of the other three), seeds "
        f"0..n-1; judged: seeds {result['late_seeds'][0]}..{result['late_seeds'][-1]} of each fault arm and seeds "
        f"{result['held_seeds'][0]}..{result['held_seeds'][-1]} of both healthy arms (never a reference). Method and "
        f"defaults: `dapo.health.against.AgainstConfig` (false-alarm rate {cfg['alpha']:g} over every metric and "
        f"block, blocks of an eighth of the run, aligned by {cfg['align']}).",
        "",
        "Lead time: steps from the fault to the estimated start of the first departure shown at or after it (the "
        "whole log judged; negative: the change point estimated a step or two early), and to the step that shows it "
        "(the end of the first block beyond the quantile), median [min, max] over the runs where one was found. "
        "Early: runs with a departure shown by a block that ends before the fault (a false alarm on the "
        "still-healthy part). Missed: runs with none shown at or after it.",
        "",
        "| references | fault | lead (onset found) | lead (confirmed) | found / runs | missed | early | first to leave "
        "(runs) | level: healthy / warning / failing |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, faults in result["faults"].items():
        for arm, d in faults.items():
            first = ", ".join(
                f"{k} ({v})" for k, v in sorted(d["first_metric"].items(), key=lambda kv: -kv[1])
            )
            st = d["status"]
            lines.append(
                f"| {n} | {arm} | {_range(d, 'lead')} | {_range(d, 'confirmed')} | {d['found']} / {d['runs']} | "
                f"{d['missed']} | {d['early']} | {first or '-'} | {st['healthy']} / {st['warning']} / {st['failing']} |"
            )
    lines += [
        "",
        "False alarms: healthy runs of the references' own arm (seeds not used as references) that the comparison "
        "calls warning or failing (any departure of any metric, any direction), with a 95% Wilson interval; as they "
        "ran, and with a 15% level offset in grad norm or mean length at every row (not a fault).",
        "",
        "| references | runs judged | runs | alarms (failing) | rate [95% CI] | what departed (first runs) |",
        "|---|---|---|---|---|---|",
    ]
    for n, kinds in result["false_alarms"].items():
        for kind, d in kinds.items():
            seen = [f"{a['run']}: {', '.join(a['departures'][:3])}" for a in d["rows"] if a["departures"]][:4]
            lines.append(
                f"| {n} | {kind} | {d['runs']} | {d['alarms']} ({d['failing']}) | {d['rate']:.0%} "
                f"[{d['low']:.0%}, {d['high']:.0%}] | {'; '.join(seen) or '-'} |"
            )
    lines += ["", "Faults:", ""] + [f"- `{arm}`: {what}" for arm, what in WHAT.items()]
    lines += ["", *result["notes"]]
    path = out / "against.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--refs", type=int, default=8, help="reference seeds per healthy arm (default 8)")
    p.add_argument("--held", type=int, default=20, help="healthy seeds judged per healthy arm (default 20)")
    p.add_argument("--late", type=int, default=10, help="seeds judged per fault arm (default 10)")
    p.add_argument("--jobs", type=int, default=None, help="processes (default: CPU count)")
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "health")
    args = p.parse_args(argv)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    healthy = replace(
        FAULTS, name="against_healthy", arms={"clean": FAULTS.arms["clean"], "base": Arm(FAULTS_BASE, 20.0)}
    )
    late = replace(FAULTS, name="against_late", arms={k: FAULTS.arms[k] for k in LATE})
    held = range(args.refs, args.refs + args.held)
    late_seeds = range(args.refs, args.refs + args.late)
    (h,) = run_experiments(
        [healthy], seeds=list(range(args.refs + args.held)), jobs=args.jobs, confirm=False, progress=False
    )
    (f,) = run_experiments([late], seeds=list(late_seeds), jobs=args.jobs, confirm=False, progress=False)
    logs = {**h.logs, **f.logs}
    trained = sum(len(v) for v in logs.values())
    counts = tuple(sorted({1, 2, 4, args.refs}))
    result = measure(logs, args.refs, held, late_seeds, counts)
    result.update(
        config=AgainstConfig().__dict__,
        late_seeds=list(late_seeds),
        held_seeds=list(held),
        trained_runs=trained,
        cpu_count=os.cpu_count(),
        load_before=load,
        wall_s=time.perf_counter() - t0,
        notes=_notes(),
    )
    command = "python benchmarks/against_toys.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:])
    )
    path = write(result, args.out, command)
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
