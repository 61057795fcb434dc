"""The toy gate: a full-scale run starts only after the toy checks passed for this exact
commit, algorithm config and policy loss.

``dapo gate write --config FILE`` reads the toy suite's summary (``--toy-summary``, default
``runs/toy/summary.json``) and the toy check of the config's ``algo.policy_loss``
(``--loss-check``, default ``runs/toy/check.json``: what ``dapo toy suite --config FILE`` or
``dapo toy check --config FILE --json ...`` writes). When every toy experiment's primary effect
was reproduced and every control showed no effect, it records ``runs/gate/<commit>.json``:
the commit, whether the tree was dirty, the hash of the config's ``algo`` section, and for
the loss its name, a hash of its source (:func:`dapo.registry.source_hash`: the function and
its module) and its check's verdict per claim. ``dapo gate check --config FILE`` (and
``dapo train --require-gate``) exits 0 only if such a record matches the current commit
(clean tree), config and loss, the loss's source is the one checked, and its check passed;
otherwise it says why, naming the loss and the command to run.
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


LOSS_CHECK = Path("runs/toy/check.json")


def check_command(cfg_name: str) -> str:
    """The commands that make a loss check the gate records, for a config named ``cfg_name``."""
    return (
        f"`dapo toy check --config {cfg_name} --json {LOSS_CHECK}`, then "
        f"`dapo gate write --config {cfg_name}`"
    )


def loss_entry(cfg, loss_check: Path, loss=None) -> dict:
    """What the gate records of the config's loss from its toy check (``dapo toy check
    --json``): name, source hash, knobs, whether it passed and each claimed mode's verdict.
    :class:`MalformedSummary` for a file that is not a check; :class:`GateError` when it holds no
    result for this loss at this config's knobs, or one for another source of it (the loss was
    edited after its check)."""
    from dapo.registry import KNOBS, LossSpecError, of_config, source_hash

    try:
        loss = loss or of_config(cfg.algo)
    except LossSpecError as err:
        raise MalformedSummary(str(err)) from None
    try:
        payload = json.loads(Path(loss_check).read_text())
        results = payload["results"]
        found = [r for r in results if r["loss"] == loss.spec]
    except OSError as err:
        raise GateError(
            f"no toy check of loss {loss.spec!r} ({loss_check}: {err.strerror}); run {check_command('FILE')}"
        ) from None
    except (ValueError, KeyError, TypeError) as err:
        raise MalformedSummary(f"{loss_check}: not a toy check (dapo toy check --json): {err!r}") from None
    want = {k: getattr(cfg.algo, k) for k in KNOBS}
    if not found:
        have = ", ".join(str(r.get("loss")) for r in results if isinstance(r, dict)) or "none"
        raise GateError(
            f"{loss_check} holds no check of loss {loss.spec!r}, the config's algo.policy_loss "
            f"(it checked: {have}); run {check_command('FILE')}"
        )
    r = found[-1]
    if r.get("knobs") != want:
        raise GateError(
            f"{loss_check}: loss {loss.spec!r} was checked at {r.get('knobs')}, the config runs it at {want}; "
            f"run {check_command('FILE')}"
        )
    if r.get("source_hash") != source_hash(loss):
        raise GateError(
            f"{loss_check}: loss {loss.spec!r} changed since this check (source hash {r.get('source_hash')} "
            f"-> {source_hash(loss)}); run {check_command('FILE')}"
        )
    modes = r.get("modes") or {}
    return {
        "source_hash": source_hash(loss),
        "knobs": want,
        "passed": bool(r.get("passed")),
        "claims": {m: v.get("protection") for m, v in modes.items() if v.get("claimed")},
        "failures": list(r.get("failures") or []),
        "check": str(loss_check),
        "command": payload.get("command"),
    }


def write(cfg, toy_summary: Path, gate_dir: Path = GATE_DIR, loss_check: Path = LOSS_CHECK) -> Path:
    """Record that the toy checks passed for this commit, config and loss (see the module
    docstring). A loss whose check failed is recorded as failed (so that ``check`` names what
    failed) and :class:`GateError` says so."""
    summary = json.loads(Path(toy_summary).read_text())
    if not isinstance(summary, dict) or not isinstance(summary.get("experiments"), dict):
        raise MalformedSummary(f"{toy_summary}: not a toy summary (no 'experiments' mapping)")
    try:
        ok, problems = toy_verdicts(summary)
    except (KeyError, TypeError, AttributeError) as err:
        raise MalformedSummary(f"{toy_summary}: not a toy summary (malformed contrast: {err!r})") from None
    if not ok:
        raise GateError("toy checks did not pass:\n  " + "\n  ".join(problems))
    entry = loss_entry(cfg, loss_check)
    commit, dirty = git_state()
    gate_dir.mkdir(parents=True, exist_ok=True)
    path = gate_dir / f"{commit}.json"
    # one record per commit; each config written for it adds its algo hash (the rungs of the
    # presets share the toy checks, which do not depend on the algo section)
    before = _read(path) if path.is_file() else {}
    same = before.get("dirty", True) == dirty
    hashes = list(_hashes(before)) if same else []
    if algo_hash(cfg) not in hashes:
        hashes.append(algo_hash(cfg))
    losses = dict(before.get("losses") or {}) if same else {}
    losses[cfg.algo.policy_loss] = entry
    record = {
        "commit": commit,
        "dirty": dirty,
        "algo_hash": algo_hash(cfg),
        "algo_hashes": hashes,
        "written": time.time(),
        "toy_summary": str(toy_summary),
        "verdicts": {k: v["verdict"] for k, v in summary["experiments"].items()},
        "losses": losses,
    }
    path.write_text(json.dumps(record, indent=2))
    if not entry["passed"]:
        raise GateError(
            f"loss {cfg.algo.policy_loss!r} failed its toy check ({loss_check}), recorded as failed:\n  "
            + "\n  ".join(entry["failures"])
        )
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


def check(cfg, gate_dir: Path = GATE_DIR, loss=None) -> dict:
    """The matching gate record, or :class:`GateError` saying what is missing. ``loss``: the
    config's resolved loss (resolved here when not given)."""
    from dapo.registry import LossSpecError, of_config, source_hash

    try:
        loss = loss or of_config(cfg.algo)
    except LossSpecError as err:
        raise MalformedSummary(str(err)) from None
    commit, dirty = git_state()
    if commit == "unknown":
        raise GateError(
            f"{Path.cwd()} is not inside a git checkout: the gate is keyed by the commit of the code "
            "that ran the toys; run this from the repository's checkout, where `nox -s toy` wrote runs/gate/"
        )
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
    entry = (record.get("losses") or {}).get(loss.spec)
    redo = check_command("FILE")
    if entry is None:
        raise GateError(f"{path}: no toy check of loss {loss.spec!r} at this commit; run {redo}")
    if entry.get("source_hash") != source_hash(loss):
        raise GateError(
            f"{path}: loss {loss.spec!r} changed since its toy check (source hash {entry.get('source_hash')} "
            f"-> {source_hash(loss)}); run {redo}"
        )
    if not entry.get("passed"):
        failed = "; ".join(entry.get("failures") or []) or "see its check"
        raise GateError(
            f"{path}: loss {loss.spec!r} failed its toy check ({failed}); fix it, then run {redo}"
        )
    if algo_hash(cfg) not in _hashes(record):
        raise GateError(
            f"{path}: the toy gate was written for another algo config "
            f"({', '.join(_hashes(record))} != {algo_hash(cfg)}); rerun `nox -s toy -- --config ...` "
            "or `dapo gate write --config ...` with the toy summary"
        )
    return record


WHAT_THE_GATE_IS = (
    "the toy gate: a full-scale run (`dapo train --require-gate`, `nox -s scale`) starts only on "
    "the commit, config algo section and policy loss (its source as checked) a record was written "
    "for, and only when every primary claim reproduced on both seed blocks, every control stayed "
    "quiet and the loss passed its toy check"
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
        q.add_argument(
            "overrides", type=Text(), nargs="*", help="section.field=value, as `dapo train` takes them"
        )
    w.add_argument(
        "--toy-summary",
        type=InFile("json"),
        default="runs/toy/summary.json",
        help="summary.json of `dapo toy run all` (default runs/toy/summary.json)",
    )
    w.add_argument(
        "--loss-check",
        type=Text(),
        default=str(LOSS_CHECK),
        help=f"the toy check of the config's algo.policy_loss, as `dapo toy check --config FILE --json` "
        f"or `dapo toy suite --config FILE` writes it (default {LOSS_CHECK})",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from dapo.config import ConfigError

    from ..config import load

    try:
        cfg = load(args.config, args.overrides)
        if args.cmd == "write":
            try:
                block = verdict_block(args.toy_summary, json.loads(Path(args.toy_summary).read_text()))
            except (ValueError, AttributeError, TypeError):
                block = ""  # not a summary: write() says so
            try:
                path = write(cfg, args.toy_summary, loss_check=args.loss_check)
            except GateError as err:
                if block and not isinstance(err, MalformedSummary):
                    print(block)  # the verdicts, then the refusal below
                raise
            print(f"{block}\n== {WHAT_THE_GATE_IS}\n   gate written: {path}")
        else:
            rec = check(cfg)
            name = cfg.algo.policy_loss
            print(
                f"gate ok: commit {rec['commit'][:10]}, algo {algo_hash(cfg)}, loss {name} "
                f"(source {rec['losses'][name]['source_hash']}, claims {rec['losses'][name]['claims']}), "
                f"toy verdicts {rec['verdicts']}"
            )
        return 0
    except (MalformedSummary, ConfigError) as err:
        print(f"dapo gate {args.cmd}: {err}", file=sys.stderr)
        return 2
    except GateError as err:
        print(f"dapo gate {args.cmd}: {err}", file=sys.stderr)
        return 1
