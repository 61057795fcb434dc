"""``dapo toy check``: argument handling and output around :func:`toybench.check.check`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dapo.cliargs import UsageError
from dapo.config import AGG_MODES, AlgoConfig, ConfigError
from dapo.offpolicy import CORRECTIONS
from dapo.registry import BUILTIN, KNOBS, Loss, LossSpecError, of_config, resolve

from .check import MODES, OffPolicy, check, format_table
from .run_config import load_algo


def _knob(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or key not in KNOBS:
        raise UsageError(f"--set {item!r}: expected KNOB=VALUE with KNOB one of {', '.join(KNOBS)}")
    text = text.strip()
    if key == "loss_agg":
        if text not in AGG_MODES:
            raise UsageError(f"--set {item!r}: loss_agg must be one of {', '.join(AGG_MODES)}")
        return key, text
    if key == "clip_ratio_c" and text.lower() in ("none", "null", ""):
        return key, None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--set {item!r}: {key} must be a number") from None
    try:  # the ranges are AlgoConfig's own
        AlgoConfig().replace(**{key: value})
    except ConfigError as e:
        raise UsageError(f"--set {item!r}: {e}") from None
    return key, value


def _names(
    text: str, option: str, choices: Sequence[str] = tuple(MODES), allow_none: bool = False
) -> list[str]:
    if allow_none and text.strip().lower() == "none":
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in choices]
    if bad or not names:
        raise UsageError(
            f"{option} {text!r}: choose from {', '.join(choices)}" + (" or none" if allow_none else "")
        )
    return names


SCALED = ("clip_cov[clip_cov_ratio=0.02]", "kl_cov[kl_cov_ratio=0.02]")
"""Clip-Cov and KL-Cov with the share of tokens raised 100x: at the papers' 2e-4 a toy
window of ~500 tokens gets one token (``max(1, int(2e-4 * n))``)."""


def all_specs() -> tuple[list[str], str]:
    """Every built-in (and the covariance losses at a toy-sized share), plus the verl and
    TRL losses with a recipe when importable."""
    from dapo import peers

    specs = [*BUILTIN, *SCALED]
    notes = []
    for prefix, names in (("verl", peers.VERL_NAMES), ("trl", peers.TRL_NAMES)):
        try:
            resolve(f"{prefix}:{names[0]}")
        except LossSpecError as e:
            notes.append(f"{prefix} losses skipped: {e}")
            continue
        specs += [f"{prefix}:{n}" for n in names]
    return specs, "; ".join(notes)


def config_knobs(algo: AlgoConfig) -> dict[str, Any]:
    """The loss knobs of a config, as ``--set`` gives them."""
    return {k: getattr(algo, k) for k in KNOBS}


def check_config_loss(args: argparse.Namespace, path: Path, command: str) -> int:
    """``dapo toy suite``'s last part: the loss of ``--config`` (default: DAPO's) checked at the
    config's knobs on the suite's seeds, written to ``path`` as ``dapo toy check --json`` writes
    it, its verdict printed. 0 whatever the verdict (``dapo gate write`` judges it); 2 when the
    config or its loss cannot be used."""
    algo = AlgoConfig() if args.config is None else load_algo(args.config)
    loss = _config_loss(algo)
    t0 = time.perf_counter()
    try:
        (result,) = check(
            [loss],
            seeds=args.seeds,
            seed_start=args.seed_start,
            confirm=not args.no_confirm,
            overrides=config_knobs(algo),
            jobs=args.jobs,
            progress=not args.quiet,
        )
    except LossSpecError as e:
        raise UsageError(f"check: {e}") from None
    seconds = time.perf_counter() - t0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_payload(args, command, seconds, [result]), indent=2, default=str) + "\n")
    verdict = "passes" if result.passed else "FAILS: " + "; ".join(result.reasons)
    print(f"== the config's policy loss: {loss.spec} {verdict} ({seconds:.0f} s; {path})")
    return 0


def _config_loss(algo: AlgoConfig) -> Loss:
    try:
        return of_config(algo)
    except LossSpecError as e:
        raise UsageError(f"--config: {e}") from None


def _payload(args: argparse.Namespace, command: str, seconds: float, results: list[Any]) -> dict[str, Any]:
    return {
        "command": command,
        "config": getattr(args, "config", None),
        "seeds_per_block": args.seeds,
        "seed_start": args.seed_start,
        "confirm": not args.no_confirm,
        "staleness": getattr(args, "staleness", 0),
        "partial": getattr(args, "partial", False),
        "correction": getattr(args, "correction", "none"),
        "seconds": round(seconds, 1),
        "results": [r.to_json() for r in results],
    }


def main(args: argparse.Namespace, argv: list[str] | None) -> int:
    if not args.loss and not args.all and args.config is None:
        raise UsageError(
            "check: name at least one LOSS (e.g. dapo, verl:clip_cov, mypkg.losses:my_loss), --config FILE "
            "(its algo.policy_loss) or --all"
        )
    overrides = {}
    algo = None
    if args.config is not None:
        algo = load_algo(args.config)
        overrides = config_knobs(algo)
    overrides.update(_knob(item) for item in args.set)
    if args.correction not in CORRECTIONS:
        raise UsageError(f"--correction {args.correction!r}: choose from {', '.join(CORRECTIONS)}")
    if args.partial and not args.staleness:
        raise UsageError("--partial needs --staleness K >= 1 (a partial rollout spans two policy versions)")
    modes = _names(args.modes, "--modes")
    claims = None if args.claims is None else _names(args.claims, "--claims", allow_none=True)
    knobs = None if args.knobs is None else _names(args.knobs, "--knobs", KNOBS, allow_none=True)
    if os.getcwd() not in sys.path:  # `module:function` from the current directory, as pytest finds tests
        sys.path.insert(0, os.getcwd())
    specs = list(args.loss)
    if algo is not None and not specs and not args.all:
        specs = [_config_loss(algo).spec]
    note = ""
    if args.all:
        extra, note = all_specs()
        specs += [s for s in extra if s not in specs]
    try:
        losses = [resolve(s) for s in specs]
    except LossSpecError as e:
        raise UsageError(f"check: {e}") from None
    if note:
        print(note, file=sys.stderr)
    t0 = time.perf_counter()
    stats: dict[str, int] = {}
    try:
        results = check(
            losses,
            seeds=args.seeds,
            seed_start=args.seed_start,
            confirm=not args.no_confirm,
            modes=modes,
            overrides=overrides,
            claims=claims,
            knobs=knobs,
            jobs=args.jobs,
            progress=not args.quiet,
            off_policy=OffPolicy(args.staleness, args.partial, args.correction),
            stats=stats,
        )
    except LossSpecError as e:  # a user's loss that raises on the toy's tensors
        raise UsageError(f"check: {e}") from None
    seconds = time.perf_counter() - t0
    from .output import markdown_as_text

    if args.staleness or args.partial or args.correction != "none":
        partial = ", partial rollouts" if args.partial else ""
        print(f"every arm off-policy: staleness {args.staleness}{partial}, correction {args.correction}\n")
    print(markdown_as_text(format_table(results), tables=2))
    command = "dapo toy " + " ".join(argv if argv is not None else sys.argv[2:])
    payload = _payload(args, command, seconds, results)
    if args.json is not None:
        args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        print(f"\njson: {args.json}")
    if args.out is not None:
        from .check_report import write_report

        path = write_report(results, payload, args.out)
        print(f"report: {path}")
    failed = [r for r in results if not r.passed]
    print(f"\n{len(results) - len(failed)} of {len(results)} losses pass ({seconds:.0f} s{_reused(stats)})")
    return 1 if failed else 0


def _reused(stats: dict[str, int]) -> str:
    """Where the runs the check did not train came from (toybench.memo), for the closing line."""
    if not stats.get("reused"):
        return ""
    from .memo import cache_dir

    where = cache_dir()
    source = "this process" if where is None else f"{where}; DAPO_TOY_CACHE=off trains them"
    return f"; {stats['reused']} of {stats['reused'] + stats['runs']} runs of built-in losses read back from {source}"
