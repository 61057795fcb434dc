"""Toy runs with known failure modes, diagnosed by ``dapo.health``: the confusion matrix.

Each case names the rule it is about, the toy runs that exhibit the failure (a baseline
arm of an experiment, cut at a declared horizon, or a run with an injected fault) and the
runs where DAPO's knob for it is on. Every generated run is diagnosed by every rule, so
the matrix also shows rules firing where they were not expected.

Where the toy cannot show a failure mode (unhealthy length growth: every toy policy
learns to shorten, see the length-bias experiment), the rule is checked on a synthetic
log shaped like the paper's Figure 4 instead, and the matrix says so.

Precision, recall and lead time (:func:`detection`): the failure runs and the runs made to
fail late (a fault injected at a known step, :data:`LATE`: engine noise, NaN log-probs, the
learning rate x30, rollouts 32 versions stale) are the positives of their rule, the fixed runs its negatives. The lead
time is the delay from the injection step to the first step the rule, run on the log as it
grows (the trainer's live diagnosis), says warning or failing.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from dapo import AlgoConfig
from dapo.health import RULES, SEVERITY, diagnose
from dapo.offpolicy import correction_fields

from .experiment import Arm, Experiment, ExperimentResult, run_experiments
from .experiments import REGISTRY


@dataclass(frozen=True)
class Case:
    rule: str
    failing: tuple[str, str]
    """(experiment, arm) whose runs exhibit the failure."""
    fixed: tuple[str, str]
    """(experiment, arm) with the DAPO knob for it on."""
    horizon: int | None = None
    """Diagnose the first N steps only (the failure shows early, then the toy task is solved)."""
    note: str = ""


FAULTS_BASE = AlgoConfig(
    group_size=8,
    train_groups=16,
    mini_batch_groups=4,
    expected_len=12,
    cache_len=4,
    max_grad_norm=1.0,
    dynamic_sampling=False,
)
FAULTS = Experiment(
    name="faults",
    title="Injected faults on the composite task",
    paper="-",
    task="composite",
    steps=60,
    arms={
        "clean": Arm(
            FAULTS_BASE, 20.0, faults={"engine_noise": 1e-7}
        ),  # an engine that agrees to fp precision
        "engine_noise": Arm(FAULTS_BASE, 20.0, faults={"engine_noise": 0.3}),
        "nan_steps": Arm(FAULTS_BASE, 20.0, faults={"nan_steps": tuple(range(5, 60, 5))}),
        # faults that appear late, at a known step: the lead time of the rule that should see them
        "engine_noise_late": Arm(FAULTS_BASE, 20.0, faults={"engine_noise": 0.3, "engine_noise_from": 30}),
        "nan_late": Arm(FAULTS_BASE, 20.0, faults={"nan_steps": tuple(range(30, 60, 5))}),
        # the learning rate x30 from step 30: the policy sharpens at once (entropy collapse, a KL spike)
        "lr_late": Arm(FAULTS_BASE, 20.0, faults={"lr_boost": 30.0, "lr_boost_from": 30}),
        # an asynchronous run whose generator falls behind at step 30: rollouts 32 versions old,
        # no correction; the run stalls (accuracy at steps 50-60 about 0.1 below on-policy)
        "stale_late": Arm(FAULTS_BASE, 20.0, faults={"staleness": 32, "staleness_from": 30}),
        # bounded staleness with a correction from the start: a constant engine-trainer gap
        "stale_bounded": Arm(
            FAULTS_BASE.replace(**correction_fields("token_tis")), 20.0, faults={"staleness": 2}
        ),
    },
    summaries={},
    contrasts=(),
)

CASES = (
    Case(
        "entropy_collapse",
        ("entropy_collapse", "symmetric"),
        ("entropy_collapse", "clip_higher"),
        note="Clip-Higher slows the toy's noise-driven collapse but does not stop it",
    ),
    Case(
        "vanishing_signal",
        ("zero_gradient", "no_ds"),
        ("zero_gradient", "dynamic_sampling"),
        note="with dynamic sampling the rule reports the cost instead: rounds grow and the batch underfills "
        "once the toy task is solved (knob: filter the data)",
    ),
    Case("truncation_noise", ("truncation_noise", "punish"), ("truncation_noise", "soft"), horizon=50),
    Case("rollout_mismatch", ("faults", "engine_noise"), ("faults", "clean")),
    Case("gradients", ("faults", "nan_steps"), ("faults", "clean")),
    Case(
        "off_policy_drift",
        ("faults", "stale_late"),
        ("faults", "stale_bounded"),
        note="staleness 32 from step 30 without correction, against staleness 2 with token TIS from the start",
    ),
    Case(
        "kl_blowup",
        ("faults", "lr_late"),
        ("faults", "clean"),
        note="the learning rate x30 from step 30 (an injected fault; no experiment arm blows up its KL)",
    ),
)


LATE = (
    ("rollout_mismatch", ("faults", "engine_noise_late"), 30),
    ("gradients", ("faults", "nan_late"), 30),
    ("entropy_collapse", ("faults", "lr_late"), 30),
    ("kl_blowup", ("faults", "lr_late"), 30),
    ("off_policy_drift", ("faults", "stale_late"), 30),
)
"""(rule, (experiment, arm) whose runs fail from a known step, that step): the lead times."""


def _first_alarm(log: list[dict[str, float]], rule: str, after: int) -> int | None:
    """The first step at or after ``after`` where ``rule``, judging the log up to that step (as
    the trainer's live diagnosis does), says warning or failing."""
    for end in range(len(log)):
        step = int(log[end]["step"])
        if step < after:
            continue
        (finding,) = diagnose(log[: end + 1], rules=[r for r in RULES if r.name == rule])
        status = finding.status
        if SEVERITY[status] >= 1:
            return step
    return None


def detection(rows: list[dict], late: dict[str, list[dict]]) -> dict[str, dict]:
    """Per rule: precision and recall of its final verdict (warning or failing = an alarm) on
    its failure runs and late-fault runs (positives) and its fixed runs (negatives), and the
    lead time from the injected fault's step to the first alarm on the growing log."""
    out: dict[str, dict] = {}
    for case in [*CASES, Case("length_growth", ("", ""), ("", ""))]:
        rule = case.rule
        mine = [r for r in rows if r["case"] == rule]
        runs = {r["run"] for r in mine}
        mine += [r for r in late.get(rule, []) if r["run"] not in runs]  # a late arm may be the case's own
        alarm = [SEVERITY[r["statuses"][rule]] >= 1 for r in mine]
        positive = [r["role"] in ("failing", "late") for r in mine]
        tp = sum(a and p for a, p in zip(alarm, positive))
        fp = sum(a and not p for a, p in zip(alarm, positive))
        fn = sum(p and not a for a, p in zip(alarm, positive))
        timed = late.get(rule, [])
        leads = [r["lead"] for r in timed if r["lead"] is not None]
        out[rule] = {
            "positives": sum(positive),
            "negatives": len(mine) - sum(positive),
            "precision": tp / (tp + fp) if tp + fp else None,
            "recall": tp / (tp + fn) if tp + fn else None,
            "lead_median": statistics.median(leads) if leads else None,
            "lead_min": min(leads) if leads else None,
            "lead_max": max(leads) if leads else None,
            "lead_runs": len(leads),
            "lead_missed": len(timed) - len(leads),
        }
    return out


def synthetic_length_growth() -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Paper Fig. 4 shape: without token-level loss length climbs faster and entropy rises
    with it while accuracy stalls; with it both stay level and accuracy improves."""
    bad, good = [], []
    for s in range(100):
        p = s / 99
        bad.append(
            {
                "step": s,
                "rollout/length_mean": 1000 + 4000 * p**1.2,
                "actor/entropy": 0.6 + 0.5 * p,
                "rollout/accuracy": 0.30 + 0.005 * (s % 3),
            }
        )
        good.append(
            {
                "step": s,
                "rollout/length_mean": 1000 + 800 * p,
                "actor/entropy": 0.62 - 0.02 * p,
                "rollout/accuracy": 0.30 + 0.15 * p,
            }
        )
    return bad, good


def run_suite(
    results: dict[str, ExperimentResult] | None = None,
    seeds: int = 10,
    jobs: int | None = None,
    progress: bool = True,
    seed_start: int = 0,
) -> dict:
    """Diagnose every run of the four experiments and the fault runs (seeds ``seed_start`` ..
    ``seed_start + seeds - 1``: one block); return the matrix and the detection figures."""
    needed = [
        REGISTRY[n]
        for n in ("entropy_collapse", "zero_gradient", "truncation_noise")
        if results is None or n not in results
    ]
    fresh = run_experiments(
        [*needed, FAULTS], seeds=seeds, jobs=jobs, confirm=False, progress=progress, seed_start=seed_start
    )  # counts, not intervals
    block = range(seed_start, seed_start + seeds)
    results = {**(results or {}), **{r.experiment.name: r for r in fresh}}
    horizon = {(c.failing[0], c.failing[1]): c.horizon for c in CASES}
    horizon.update({(c.fixed[0], c.fixed[1]): c.horizon for c in CASES})
    rows = []
    for case in CASES:
        for role, (exp, arm) in (("failing", case.failing), ("fixed", case.fixed)):
            for seed, log in results[exp].logs[arm].items():
                if seed not in block:  # results may hold both blocks: one at a time
                    continue
                log = log[: case.horizon] if case.horizon else log
                findings = {f.rule: f for f in diagnose(log)}
                rows.append(
                    {
                        "case": case.rule,
                        "role": role,
                        "run": f"{exp}/{arm}/seed={seed}",
                        "statuses": {r: f.status for r, f in findings.items()},
                        "evidence": findings[case.rule].evidence,
                    }
                )
    late: dict[str, list[dict]] = {}
    for rule, (exp, arm), onset in LATE:
        for seed, log in results[exp].logs[arm].items():
            if seed not in block:
                continue
            findings = {f.rule: f for f in diagnose(log)}
            first = _first_alarm(log, rule, onset)
            late.setdefault(rule, []).append(
                {
                    "case": rule,
                    "role": "late",
                    "run": f"{exp}/{arm}/seed={seed}",
                    "statuses": {r: f.status for r, f in findings.items()},
                    "onset": onset,
                    "lead": None if first is None else first - onset,
                }
            )
    bad, good = synthetic_length_growth()
    for role, log in (("failing", bad), ("fixed", good)):
        findings = {f.rule: f for f in diagnose(log)}
        rows.append(
            {
                "case": "length_growth",
                "role": role,
                "run": f"synthetic/{role}",
                "statuses": {r: f.status for r, f in findings.items()},
                "evidence": findings["length_growth"].evidence,
            }
        )
    return {
        "rows": rows,
        "late": [r for rs in late.values() for r in rs],
        "matrix": confusion(rows),
        "detection": detection(rows, late),
    }


def confusion(rows: list[dict]) -> dict:
    """case -> role -> status of the matching rule (counts), and off-target firings."""
    out: dict = {}
    for r in rows:
        cell = out.setdefault(r["case"], {}).setdefault(r["role"], Counter())
        cell[r["statuses"][r["case"]]] += 1
        off = out[r["case"]].setdefault(f"{r['role']}_other_rules_firing", Counter())
        for rule, status in r["statuses"].items():
            if rule != r["case"] and SEVERITY[status] >= 1:
                off[rule] += 1
    return {c: {k: dict(v) for k, v in d.items()} for c, d in out.items()}


def write_report(suite: dict, out: Path, command: str, wall: float) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "health_suite.json").write_text(json.dumps(suite, indent=2))
    notes = {c.rule: c.note for c in CASES}
    notes["length_growth"] = "no toy run shows it (toy policies shorten); synthetic Fig.-4-shaped logs"
    lines = [
        "# dapo.health on runs with known failure modes",
        "",
        f"Command: `{command}` ({wall:.0f} s)",
        "",
        "Per case: the matching rule's verdicts on runs that exhibit the failure and on runs with DAPO's "
        "knob for it on (counts over seeds), and other rules that fired.",
        "",
        "| rule | failure runs: matching rule | fixed runs: matching rule | other rules firing (failure / fixed) "
        "| note |",
        "|---|---|---|---|---|",
    ]
    for rule in [r.name for r in RULES]:
        m = suite["matrix"].get(rule, {})
        fmt = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "-"  # noqa: E731
        lines.append(
            f"| {rule} | {fmt(m.get('failing', {}))} | {fmt(m.get('fixed', {}))} | "
            f"{fmt(m.get('failing_other_rules_firing', {}))} / {fmt(m.get('fixed_other_rules_firing', {}))} "
            f"| {notes.get(rule, '')} |"
        )
    lines += [
        "",
        "Precision and recall of each rule's final verdict (warning or failing counts as an alarm) on the runs that "
        "exhibit its failure, the runs made to fail late (a fault injected at step 30) and the runs with DAPO's knob "
        "on (negatives); lead time: steps from the injection step to the first alarm of the rule judging the log "
        "as it grows (the trainer's live diagnosis). Entropy collapse: Clip-Higher slows the toy's collapse without "
        "stopping it, so its 'negatives' collapse too and its precision is a floor.",
        "",
        "| rule | positives / negatives | precision | recall | lead time, steps: median [min, max] (runs; missed) |",
        "|---|---|---|---|---|",
    ]
    for rule, d in suite.get("detection", {}).items():
        pr = "-" if d["precision"] is None else f"{d['precision']:.2f}"
        rc = "-" if d["recall"] is None else f"{d['recall']:.2f}"
        lead = (
            "-"
            if d["lead_median"] is None
            else f"{d['lead_median']:g} [{d['lead_min']:g}, {d['lead_max']:g}] ({d['lead_runs']}; {d['lead_missed']})"
        )
        lines.append(f"| {rule} | {d['positives']} / {d['negatives']} | {pr} | {rc} | {lead} |")
    path = out / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path
