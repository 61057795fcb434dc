"""``dapo diagnose RUN``: is this run healthy, and if not, what should change?

Exit status: 0, or 1 when a run reaches ``--fail-on``; 3 when ``--fail-on`` is given and a run
is inconclusive (too few rules could judge it) without reaching that level; 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from ..cliargs import Float, InFile, Int, OutDir, Parser, Text, UsageError
from .config import HealthConfig
from .follow import follow
from .knobs import merge
from .readers import FORMATS, READERS, RunLogError, parse_map, read_log, user_names
from .references import PAPER_REFERENCES, ReferenceCurve
from .report import write_report
from .series import Run
from .verdict import SEVERITY, Finding, diagnose, run_notes, verdict

EXIT_FAIL, EXIT_USAGE, EXIT_INCONCLUSIVE = 1, 2, 3


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="dapo diagnose",
        description=(
            "Diagnose a training log: one verdict per failure mode (healthy / warning / failing / unknown), the "
            "step it started, the evidence and what to change; the run's verdict is healthy only when most rules "
            "could judge it (otherwise inconclusive). Exit: 1 when a run reaches --fail-on, 3 when --fail-on is "
            "given and a run is inconclusive, 2 for bad input."
        ),
    )
    p.add_argument(
        "run",
        type=Text(),
        help="a log file or run directory: "
        + "; ".join(f"{r.describe}" for r in READERS.values())
        + " (format detected from the file)",
    )
    p.add_argument(
        "--format", choices=FORMATS, default="auto", help="read the log as this format (default: detect)"
    )
    p.add_argument(
        "--map",
        action="append",
        default=[],
        type=Text(),
        metavar="COLUMN=METRIC[,...] | FILE",
        help="read a column this tool does not know as a metric it does, e.g. --map 'Pre=reward,GradN=grad_norm' "
        "(METRIC: a schema name or a logged name such as reward, accuracy, grad_norm, kl, entropy, loss); or a "
        "YAML/JSON file of COLUMN: METRIC lines. The notes list the numeric columns left unread",
    )
    p.add_argument(
        "--run-label",
        type=Text(),
        default=None,
        help="only the runs of a multi-run file whose label holds each /-part of this one (e.g. "
        "arm=symmetric/seed=0 selects experiment=entropy_collapse/arm=symmetric/seed=0; arm=symmetric "
        "every seed of that arm)",
    )
    p.add_argument(
        "--report", type=OutDir(), default=None, help="write report.md and one figure per run here"
    )
    p.add_argument(
        "--max-figures",
        type=Int(lo=0),
        default=12,
        help="figures for at most this many runs (default 12; the report says so)",
    )
    p.add_argument(
        "--reference",
        type=Text(),
        default="paper",
        help="reference bands for the figures (drawn only where the run is in their units): 'paper' (Fig. 7 "
        "shapes; the default), 'none', or a JSON file {metric: {source, progress, low, high, note?}}",
    )
    p.add_argument(
        "--against",
        nargs="+",
        action="extend",  # `--against a b` and `--against a --against b` both give two references
        type=Text(),
        default=[],
        metavar="REF",
        help="compare the run with reference runs of the same recipe (any log this tool reads; FILE#LABEL: the "
        "runs of a multi-run file whose label holds LABEL, e.g. runs/toy/x/metrics.jsonl#arm=clip_higher): per "
        "metric, the first step its change from its first rows leaves the references' (at a false-alarm rate of "
        "0.05 over every metric and block; with one reference, against the noise alone), by how much, and "
        "whether the outcome followed (dapo.health.against)",
    )
    p.add_argument(
        "--align",
        choices=["step", "share"],
        default="step",
        help="--against: align by training step (default) or by share of the run (step / last step), for "
        "references of another length",
    )
    p.add_argument(
        "--fail-on",
        choices=["warning", "failing"],
        default=None,
        help="exit 1 if any run reaches this level; exit 3 if a run is inconclusive instead",
    )
    p.add_argument("--json", action="store_true", help="print verdicts and findings as JSON")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        type=Text(),
        metavar="THRESHOLD=VALUE",
        help="override a HealthConfig threshold, e.g. --set entropy_fail_frac=0.4",
    )
    p.add_argument(
        "--eval-items",
        type=Int(lo=1),
        default=None,
        metavar="N",
        help="items in the evaluation set behind eval/score (an AIME set: 30): its noise is then "
        "binomial, not estimated from the evaluations",
    )
    p.add_argument(
        "--knob",
        action="append",
        default=[],
        type=Text(),
        metavar="NAME=VALUE",
        help="the run's own setting, for the advice (e.g. --knob eps_high=0.28); a run directory's "
        "config.json is read too",
    )
    p.add_argument(
        "--follow", action="store_true", help="keep re-reading the log; print a line when a verdict changes"
    )
    p.add_argument(
        "--interval",
        type=Float(lo=0, lo_open=True),
        default=10.0,
        help="--follow: seconds between reads (default 10)",
    )
    p.add_argument(
        "--until-idle",
        type=Float(lo=0, lo_open=True),
        default=None,
        help="--follow: stop once the log has not changed for this many seconds (default: until interrupted)",
    )
    return p


def _config(items: list[str]) -> HealthConfig:
    """``--set NAME=VALUE`` items as a checked :class:`HealthConfig`."""
    values: dict[str, Any] = {}
    defaults = HealthConfig()
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise UsageError(f"--set {item!r}: expected THRESHOLD=VALUE")
        if key not in HealthConfig.__dataclass_fields__:
            raise UsageError(
                f"--set: unknown threshold {key!r}; known: {', '.join(sorted(HealthConfig.__dataclass_fields__))}"
            )
        kind = type(getattr(defaults, key))
        try:
            value = kind(raw)
        except ValueError:
            raise UsageError(f"--set {key}: expected {kind.__name__}, got {raw!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"--set {key}: must be finite, got {raw!r}")
        values[key] = value
    try:
        return HealthConfig(**values)
    except ValueError as err:
        raise UsageError(f"--set: {err}") from None


def _names(items: list[str]) -> dict[str, str]:
    """``--map`` items: ``COLUMN=METRIC`` pairs, or files (JSON, or YAML with pyyaml) of ``COLUMN: METRIC``."""
    out: dict[str, str] = {}
    for item in items:
        path = Path(item)
        if "=" not in item and not path.is_file():
            raise UsageError(f"--map {item!r}: neither COLUMN=METRIC pairs nor a file")
        try:
            out.update(
                parse_map([item]) if "=" in item else parse_map(_map_file(item, path), where=f"--map {item}")
            )
        except ValueError as err:
            raise UsageError(str(err)) from None
    return out


def _map_file(item: str, path: Path) -> dict[str, Any]:
    """A ``--map`` file's mapping: JSON by its ``.json`` suffix, else YAML (``yaml.safe_load``)."""
    text = path.read_text()
    if path.suffix == ".json":
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as err:
            raise UsageError(f"--map {item}: not valid JSON ({err.msg}, line {err.lineno})") from None
    else:
        try:
            import yaml
        except ImportError:
            raise UsageError(
                f"--map {item}: a YAML file needs pyyaml (pip install 'dapo-repro[gate]'); "
                "or give a .json file, or COLUMN=METRIC pairs"
            ) from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise UsageError(f"--map {item}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(loaded, dict):
        raise UsageError(f"--map {item}: expected a mapping of COLUMN: METRIC lines")
    return loaded


def _references(spec: str) -> dict[str, ReferenceCurve]:
    if spec == "none":
        return {}
    if spec == "paper":
        return PAPER_REFERENCES
    try:
        path = InFile("json")(spec)
    except argparse.ArgumentTypeError as err:
        raise UsageError(f"--reference: expected 'paper', 'none' or a JSON file; {err}") from None
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise UsageError(f"--reference {spec}: expected a JSON object of metric -> curve")
    curves = {}
    for k, v in data.items():
        try:
            curves[k] = ReferenceCurve(
                metric=k,
                source=str(v["source"]),
                progress=tuple(float(x) for x in v["progress"]),
                low=tuple(float(x) for x in v["low"]),
                high=tuple(float(x) for x in v["high"]),
                note=str(v.get("note", "")),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise UsageError(
                f"--reference {spec}: curve {k!r}: needs source, progress, low and high (lists of numbers): {err!r}"
            ) from None
        if not len(curves[k].progress) == len(curves[k].low) == len(curves[k].high):
            raise UsageError(f"--reference {spec}: curve {k!r}: progress, low and high differ in length")
    return curves


def _steps(run: Run) -> float:
    """Steps a log covers: its last logged step (from step 1), else its rows."""
    steps = [float(r["step"]) for r in run if isinstance(r.get("step"), (int, float))]
    return max(steps) if steps else float(len(run))


def format_findings(
    label: str,
    findings: list[Finding],
    config: HealthConfig = HealthConfig(),
    notes: list[str] | None = None,
    steps: float | None = None,
) -> str:
    """``steps``: the steps the log covers (an inconclusive run is told how many it needs)."""
    v = verdict(findings, config)
    lines = [f"== {label}: {v.headline()}"]
    if steps is not None and v.advice(steps):
        lines.append(f"  {v.advice(steps)}")
    lines += [f"  note: {n}" for n in notes or []]
    for f in findings:
        since = f" since step {f.start_step:g}" if f.start_step is not None else ""
        lines.append(f"  {f.status:<8} {f.title}{since}")
        lines.append(f"           evidence: {f.evidence}")
        if f.status in ("warning", "failing"):
            lines.append(f"           do:       {f.advice}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = _config(args.set + ([f"eval_items={args.eval_items}"] if args.eval_items else []))
    if args.against and args.follow:
        raise UsageError("--against judges a whole log: not with --follow")
    references = _references(args.reference)  # checked even without --report: a typo is not ignored
    try:
        knobs = merge(Path(args.run), args.knob)
    except ValueError as err:
        raise UsageError(f"--knob {err}") from None
    names = _names(args.map)
    try:
        with user_names(names):
            return _judge(args, cfg, knobs, references)
    except BrokenPipeError:
        raise  # the reader closed the pipe (`| head`): dapo.cli ends quietly
    except (RunLogError, OSError) as err:
        print(f"dapo diagnose: {err}", file=sys.stderr)
        return EXIT_USAGE


def _judge(args: argparse.Namespace, cfg: HealthConfig, knobs: Any, references: Any) -> int:
    """Read, judge and print (with the user's ``--map`` names in force)."""
    try:
        if args.follow:
            follow(
                args.run,
                args.format,
                cfg,
                knobs,
                args.interval,
                args.until_idle,
                lambda s: print(s, flush=True),
            )
            return 0
        reading = read_log(args.run, args.format)
        runs, notes, fmt = reading.runs, reading.notes + reading.columns_said(), reading.format
    except (RunLogError, OSError) as err:
        print(f"dapo diagnose: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 0
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.run_label:
        from .against import label_matches

        chosen = {label: run for label, run in runs.items() if label_matches(label, args.run_label)}
        if not chosen:
            shown = ", ".join(list(runs)[:5]) + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")
            print(
                f"dapo diagnose: --run-label {args.run_label!r} matches no run; runs: {shown}",
                file=sys.stderr,
            )
            return EXIT_USAGE
        runs = chosen
    results = {label: diagnose(run, cfg, knobs) for label, run in runs.items()}
    comparisons: dict[str, Any] = {}
    if args.against:
        from .against import AgainstConfig, AgainstError, compare_all, load_references

        try:
            refs = load_references(args.against)
            comparisons = compare_all(args.run, runs, refs, AgainstConfig(align=args.align))
        except AgainstError as err:
            print(f"dapo diagnose: {err}", file=sys.stderr)
            return EXIT_USAGE
        for label, comparison in comparisons.items():
            results[label].append(comparison.finding())  # the verdict, --fail-on and the report take it in
    verdicts = {label: verdict(fs, cfg) for label, fs in results.items()}
    if args.json:
        out = {
            label: {
                "format": fmt,
                "policy_loss": knobs.get("policy_loss"),
                "verdict": verdicts[label].status,
                "notes": run_notes(runs[label]),
                "reading": notes,
                "judged": verdicts[label].judged,
                "unknown": verdicts[label].unknown,
                "findings": [f.__dict__ for f in fs],
                **({"against": comparisons[label].as_dict()} if label in comparisons else {}),
            }
            for label, fs in results.items()
        }
        print(json.dumps(out, indent=2))
    else:
        print(f"format: {fmt}")
        if knobs.get("policy_loss"):  # from the run's config.json, or --knob policy_loss=...
            print(f"policy loss: {knobs['policy_loss']}")
        print(
            "\n\n".join(
                format_findings(label, fs, cfg, run_notes(runs[label]), _steps(runs[label]))
                + "".join(
                    "\n" + line for line in (comparisons[label].lines() if label in comparisons else [])
                )
                for label, fs in results.items()
            )
        )
    if args.report:
        path = write_report(
            args.report,
            args.run,
            runs,
            results,
            references,
            cfg,
            args.max_figures,
            policy_loss=knobs.get("policy_loss"),
        )
        if comparisons:
            from .against import append_report

            append_report(path, comparisons, args.max_figures)
        print(f"\nreport: {args.report / 'report.md'}")
    if args.fail_on:
        level = SEVERITY[args.fail_on]
        if any(SEVERITY[f.status] >= level for fs in results.values() for f in fs):
            return EXIT_FAIL
        if any(v.status == "inconclusive" for v in verdicts.values()):
            return EXIT_INCONCLUSIVE
    return 0
