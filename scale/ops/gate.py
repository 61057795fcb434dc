"""The toy gate: a full-scale run starts only after the toy checks passed for this exact
commit and algorithm config.

``dapo gate write --config FILE --toy-summary runs/toy/summary.json`` records, when every
toy experiment's primary effect was reproduced and every control showed no effect,
``runs/gate/<commit>.json`` with the commit, whether the tree was dirty, and the hash of the
config's ``algo`` section. ``dapo gate check --config FILE`` exits 0 only if such a record
matches the current commit (clean tree) and config; otherwise it says why.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

GATE_DIR = Path("runs/gate")


def algo_hash(cfg) -> str:
    blob = json.dumps(cfg.algo.to_dict(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def git_state(cwd: Path | None = None) -> tuple[str, bool]:
    """(commit, dirty) of the working tree; ('unknown', True) outside git."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=cwd
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                check=True,
                cwd=cwd,
            ).stdout.strip()
        )
        return commit, dirty
    except (OSError, subprocess.CalledProcessError):
        return "unknown", True


def toy_verdicts(summary: dict) -> tuple[bool, list[str]]:
    """Did every primary reproduce on both seed blocks and every control stay quiet?"""
    problems = []
    for name, exp in summary.get("experiments", {}).items():
        for c in exp["contrasts"]:
            if c["role"] == "primary" and c["verdict"] != "reproduced":
                problems.append(f"{name}: primary '{c['name']}' {c['verdict']}")
            if c["role"] == "primary" and len(c.get("blocks", {})) < 2:
                problems.append(
                    f"{name}: primary '{c['name']}' has no confirmation block "
                    "(run dapo toy run without --no-confirm)"
                )
            if c["role"] == "control" and c["verdict"] != "no effect (as expected)":
                problems.append(f"{name}: control '{c['name']}' {c['verdict']}")
    if not summary.get("experiments"):
        problems.append("the toy summary holds no experiments")
    missing = summary.get("missing") or []  # the paper's experiments it lacks (toybench.output.write_all)
    if missing:
        names = ", ".join(map(str, missing)) if isinstance(missing, list) else str(missing)
        problems.append(f"the toy summary lacks {names} (run `dapo toy run all` or `nox -s toy`)")
    return not problems, problems


def write(cfg, toy_summary: Path, gate_dir: Path = GATE_DIR) -> Path:
    summary = json.loads(Path(toy_summary).read_text())
    if not isinstance(summary, dict) or not isinstance(summary.get("experiments"), dict):
        raise MalformedSummary(f"{toy_summary}: not a toy summary (no 'experiments' mapping)")
    try:
        ok, problems = toy_verdicts(summary)
    except (KeyError, TypeError, AttributeError) as err:
        raise MalformedSummary(f"{toy_summary}: not a toy summary (malformed contrast: {err!r})") from None
    if not ok:
        raise GateError("toy checks did not pass:\n  " + "\n  ".join(problems))
    commit, dirty = git_state()
    gate_dir.mkdir(parents=True, exist_ok=True)
    path = gate_dir / f"{commit}.json"
    # one record per commit; each config written for it adds its algo hash (the rungs of the
    # presets share the toy checks, which do not depend on the algo section)
    before = _read(path) if path.is_file() else {}
    hashes = [] if before.get("dirty", True) != dirty else list(_hashes(before))
    if algo_hash(cfg) not in hashes:
        hashes.append(algo_hash(cfg))
    record = {
        "commit": commit,
        "dirty": dirty,
        "algo_hash": algo_hash(cfg),
        "algo_hashes": hashes,
        "written": time.time(),
        "toy_summary": str(toy_summary),
        "verdicts": {k: v["verdict"] for k, v in summary["experiments"].items()},
    }
    path.write_text(json.dumps(record, indent=2))
    return path


def _read(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _hashes(record: dict) -> list[str]:
    """The algo hashes a gate record was written for (older records hold one, ``algo_hash``)."""
    found = record.get("algo_hashes") or [record.get("algo_hash")]
    return [h for h in found if isinstance(h, str)]


class GateError(RuntimeError):
    """The gate does not allow the run (the reason is the message)."""


class MalformedSummary(GateError):
    """The toy summary given to ``gate write`` is not one (bad input: exit 2)."""


def check(cfg, gate_dir: Path = GATE_DIR) -> dict:
    """The matching gate record, or :class:`GateError` saying what is missing."""
    commit, dirty = git_state()
    if dirty:
        raise GateError(
            f"the working tree has uncommitted changes: the gate is keyed by commit ({commit[:10]}); "
            "commit first, then run `nox -s toy`"
        )
    path = gate_dir / f"{commit}.json"
    if not path.is_file():
        have = sorted(p.stem[:10] for p in gate_dir.glob("*.json")) if gate_dir.is_dir() else []
        raise GateError(
            f"no toy gate for commit {commit[:10]} (run `nox -s toy`); gates exist for: {have or 'none'}"
        )
    record = json.loads(path.read_text())
    if record.get("dirty"):
        raise GateError(f"{path}: the toy checks ran on a dirty tree; rerun `nox -s toy` on the clean commit")
    if algo_hash(cfg) not in _hashes(record):
        raise GateError(
            f"{path}: the toy gate was written for another algo config "
            f"({', '.join(_hashes(record))} != {algo_hash(cfg)}); rerun `nox -s toy -- --config ...` "
            "or `dapo gate write --config ...` with the toy summary"
        )
    return record


WHAT_THE_GATE_IS = (
    "the toy gate: a full-scale run (`dapo train --require-gate`, `nox -s scale`) starts only on "
    "the commit and config algo section a record was written for, and a record is written only "
    "when every primary claim reproduced on both seed blocks and every control stayed quiet"
)


def verdict_block(toy_summary: Path, summary: dict) -> str:
    """The block ``dapo gate write`` prints first (the last lines of ``nox -s toy``): each
    failure mode's verdict and primary claim, and where the figures are."""
    lines = [f"== the four failure modes ({toy_summary}; reproduced = on both seed blocks)"]
    for name, exp in summary.get("experiments", {}).items():
        primary = next((c for c in exp.get("contrasts", []) if c.get("role") == "primary"), {})
        lines.append(f"   {name:<18} {exp.get('verdict', '?'):<15} {primary.get('name', '')}")
    here = Path(toy_summary).parent
    figures = sorted(here.glob("*/*.png"))  # runs/toy/<experiment>/<experiment>.png
    # the other families of `dapo toy suite`, when the summary is the suite's (runs/toy)
    figures += sorted(p for fam in ("ladder", "prompt_selection") for p in (here.parent / fam).rglob("*.png"))
    lines.append("== figures")
    lines += [f"   {p}" for p in figures] or ["   none (plots need matplotlib; drawn unless --no-plots)"]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from dapo.cliargs import InFile, Parser, Text

    from ..config import presets

    ap = Parser(prog="dapo gate", description="The toy gate in front of full-scale runs.")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{write,check}")
    w = sub.add_parser(
        "write",
        help="record that the toy checks passed for this commit and config",
        description="Record, under runs/gate/, that every toy claim held for this commit and this "
        "config's algo section (refused when a claim failed).",
    )
    c = sub.add_parser(
        "check",
        help="exit 0 only if a gate matches this commit and config",
        description="Exit 0 only if a toy gate was written for this commit and this config's algo section.",
    )
    for q in (w, c):
        q.add_argument(
            "--config",
            type=Text(),
            required=True,
            help=f"a YAML file or a bundled preset ({', '.join(presets())}); its algo section is hashed",
        )
    w.add_argument(
        "--toy-summary",
        type=InFile("json"),
        default="runs/toy/summary.json",
        help="summary.json of `dapo toy run all` (default runs/toy/summary.json)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from dapo.config import ConfigError

    from ..config import load

    try:
        cfg = load(args.config)
        if args.cmd == "write":
            try:
                block = verdict_block(args.toy_summary, json.loads(Path(args.toy_summary).read_text()))
            except (ValueError, AttributeError, TypeError):
                block = ""  # not a summary: write() says so
            try:
                path = write(cfg, args.toy_summary)
            except GateError as err:
                if block and not isinstance(err, MalformedSummary):
                    print(block)  # the verdicts, then the refusal below
                raise
            print(f"{block}\n== {WHAT_THE_GATE_IS}\n   gate written: {path}")
        else:
            rec = check(cfg)
            print(
                f"gate ok: commit {rec['commit'][:10]}, algo {rec['algo_hash']}, toy verdicts {rec['verdicts']}"
            )
        return 0
    except (MalformedSummary, ConfigError) as err:
        print(f"dapo gate {args.cmd}: {err}", file=sys.stderr)
        return 2
    except GateError as err:
        print(f"dapo gate {args.cmd}: {err}", file=sys.stderr)
        return 1
