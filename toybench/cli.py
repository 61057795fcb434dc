"""``dapo toy ...``: run the failure-mode experiments from the command line."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dapo.cliargs import Int, OutDir, OutFile, Parser, Text, UsageError

from .check_words import MIN_SEEDS, VERDICTS
from .run_config import presets

QUIET_HELP = (
    "no progress bar; still a plain progress line every 30 s ($DAPO_QUIET_PROGRESS_S): never silent minutes"
)
"""``--quiet`` of the toy commands (:func:`toybench.scheduler.quiet_every`)."""


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="dapo toy", description="Toy regime: DAPO's failure modes on a CPU.")
    sub = p.add_subparsers(
        dest="cmd", required=True, metavar="{run,suite,list,check,ladder,factorial,off-policy,health}"
    )
    run = sub.add_parser(
        "run",
        help="run experiments and print their verdicts",
        description="Run failure-mode experiments (paired seeds, a discovery and a confirmation block) "
        "and print each arm's verdict against the paper's claim.",
        epilog="exit status: 0 the experiments ran, whatever their verdicts (those are in the table and "
        "summary.json; `dapo gate write` refuses a summary with a failed claim or a missing experiment); "
        "2 bad input. One experiment joins OUT/summary.json only if that was written at the same seeds, "
        "--steps and policy; otherwise summary.json is left as it was.",
    )
    run.add_argument("experiment", type=Text(), help="an experiment name (see `dapo toy list`) or `all`")
    _seed_args(run, 10)
    _common(run, "runs/toy")
    run.add_argument(
        "--policy",
        choices=["tabular", "gru"],
        default="tabular",
        help="tabular softmax + SGD (default) or GRU + Adam",
    )
    run.add_argument(
        "--steps", type=Int(lo=1), default=None, help="override every experiment's horizon (exploration only)"
    )
    run.add_argument(
        "--engine",
        choices=["batched", "loop"],
        default="batched",
        help="batched: runs stacked in one tensor computation (default); loop: one run at a time "
        "(the reference; same results)",
    )
    run.add_argument(
        "--no-plots", action="store_true", help="skip the PNG figures even if seaborn is installed"
    )
    run.add_argument(
        "--brief", action="store_true", help="print only the verdicts (the full table goes to summary.json)"
    )
    su = sub.add_parser(
        "suite",
        help="the main job's families in one pass: failure modes, ladder, prompt selection",
        description="Run the four failure modes, the Table-1 ladder and prompt selection as one set of "
        "runs over the cores, then write what each family's own command writes under OUT/toy, "
        "OUT/ladder and OUT/prompt_selection (what `nox -s toy` runs). The off-policy family is its "
        "own job (`dapo toy off-policy`, `nox -s off_policy`): its table needs 45 + 45 seeds.",
        epilog="exit status: 0 the runs finished, whatever their verdicts (`dapo gate write` judges "
        "OUT/toy/summary.json); 2 bad input.",
    )
    _seed_args(su, 10)
    _common(su, "runs")
    su.add_argument(
        "--no-plots", action="store_true", help="skip the PNG figures even if matplotlib is installed"
    )
    su.add_argument(
        "--steps", type=Int(lo=10), default=None, help="override every horizon (exploration and tests only)"
    )
    su.add_argument(
        "--config",
        type=Text(),
        default=None,
        help=f"a run config (a YAML file or a bundled preset: {', '.join(presets())}) whose algo.policy_loss "
        "is checked after the families, at its algo knobs, into OUT/toy/check.json (what `dapo gate write` records); default: "
        "DAPO's loss at DAPO's knobs",
    )
    sub.add_parser(
        "list", help="list the experiments", description="List the failure-mode experiments and their arms."
    )
    c = sub.add_parser(
        "check",
        help="does a policy loss protect against each failure mode? (this project's, verl's, TRL's or yours)",
        description="Probe a policy loss's contract and knobs, check that it learns on each failure mode's "
        "task, then whether it protects against each failure mode (paired seeds, two blocks).",
        epilog="exit status: 0 every loss passes; 1 a loss fails (broken contract, ignored knob, learns "
        "less than 0.82 of DAPO's accuracy gain, skipped steps, or an unprotected claimed failure mode); "
        "2 bad input (a spec, option or loss that cannot be run: import error, wrong signature, raises, "
        "no gradient). Claims: a built-in's own, DAPO's (entropy_collapse, length_bias) for a user "
        "function, or --claims. Verdicts: "
        + "; ".join(f"{word}: {text}" for word, text in VERDICTS.items())
        + ".",
    )
    c.add_argument(
        "loss",
        nargs="*",
        type=Text(),
        help="loss specs: a built-in (dapo, grpo, dr_grpo, gspo, cispo, clip_cov, kl_cov), verl:NAME, "
        "trl:LOSS_TYPE or module:function, optionally with parameters NAME[key=value,...]",
    )
    c.add_argument(
        "--config",
        type=Text(),
        default=None,
        help=f"a run config (a YAML file or a bundled preset: {', '.join(presets())}): with no LOSS named, "
        "check its algo.policy_loss; "
        "every loss runs at its algo knobs (eps_low, eps_high, clip_ratio_c, loss_agg), as `dapo train` "
        "would run it (`dapo gate write` records the result for the loss)",
    )
    c.add_argument(
        "--all",
        action="store_true",
        help="every built-in loss, and every verl and TRL loss with a recipe when the peers are installed",
    )
    c.add_argument(
        "--set",
        action="append",
        default=[],
        type=Text(),
        metavar="KNOB=VALUE",
        help="override a loss knob for every candidate (eps_low, eps_high, clip_ratio_c, loss_agg); repeatable",
    )
    c.add_argument(
        "--claims",
        type=Text(),
        default=None,
        help="comma-separated failure modes the loss claims to fix (entropy_collapse, zero_gradient, "
        "length_bias, truncation_noise), or `none`; default: each loss's own claims",
    )
    c.add_argument(
        "--knobs",
        type=Text(),
        default=None,
        help="comma-separated knobs the losses honour (eps_low, eps_high, clip_ratio_c, loss_agg), or "
        "`none`; the knob probe fails a loss that ignores one; default: each loss's own (for "
        "module:function its dapo_knobs attribute, else all four, as DAPO's loss)",
    )
    c.add_argument(
        "--modes",
        type=Text(),
        default=",".join(("entropy_collapse", "zero_gradient", "length_bias", "truncation_noise")),
        help="comma-separated failure modes to run (default: all four)",
    )
    c.add_argument(
        "--staleness",
        type=Int(lo=0, hi=64),
        default=0,
        metavar="K",
        help="run every arm off-policy: rollouts from the policy K versions (training steps) old, each "
        "token with its sampler's log-prob, as an asynchronous trainer at max staleness K (default 0)",
    )
    c.add_argument(
        "--partial",
        action="store_true",
        help="with --staleness: partial rollouts (a weight update interrupts each response; its tokens "
        "come from two versions, K and K + 1 old)",
    )
    c.add_argument(
        "--correction",
        type=Text(),
        default="none",
        help="the off-policy correction of every arm (dapo.offpolicy.CORRECTIONS: none, bypass, token_tis, "
        "seq_tis, icepop, seq_mis, geo_rs, k3_rs, decoupled; default none)",
    )
    _seed_args(c, 10, MIN_SEEDS)  # toybench.check_words.MIN_SEEDS
    c.add_argument("--json", type=OutFile(), default=None, help="also write the results as JSON to this file")
    c.add_argument(
        "--out",
        type=OutDir(),
        default=None,
        help="write a report directory (README.md, results.json, heatmap.png); the committed one: "
        "--all --out reports/losses",
    )
    c.add_argument("--jobs", type=Int(lo=1), default=None, help="worker processes (default: the CPU count)")
    c.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    for name, help_, seeds in (
        ("ladder", "the six Table-1 presets in order on the composite task", 10),
        ("factorial", "all 2^5 combinations of the five techniques", 5),
    ):
        q = sub.add_parser(name, help=help_, description=help_[0].upper() + help_[1:] + ".")
        _seed_args(q, seeds)
        _common(q, f"runs/{name}", f"; the committed report: --out reports/{name}")
        q.add_argument(
            "--steps", type=Int(lo=1), default=None, help="override the 150-step horizon (exploration only)"
        )
    o = sub.add_parser(
        "off-policy",
        help="staleness, partial rollouts and engine precision against each correction",
        description="The off_policy family: GRPO and DAPO at staleness 0, 1, 2, 4, 8 with and without partial "
        "rollouts under each correction, bf16/fp8 engines, DAPO's fixes at each staleness, and the simulated "
        "clock; writes the tolerated-staleness table.",
    )
    # toybench.noninferiority.plan_seeds at the pilot's sd; the pilot's seeds 0..63 left out
    _seed_args(o, 45, start=64)
    _common(o, "runs/off_policy", "; the committed report: --out reports/off_policy")
    o.add_argument(
        "--steps", type=Int(lo=10), default=None, help="override the 150-step horizon (exploration only)"
    )
    h = sub.add_parser(
        "health",
        help="diagnose toy runs with known failure modes (confusion matrix)",
        description="Run toy cases whose failure mode is known, diagnose each with `dapo diagnose`'s "
        "rules, and write the confusion matrix of rule verdicts against the truth.",
    )
    h.add_argument(
        "--seeds", type=Int(lo=1), default=10, help="seeds per case (default 10; one block, verdict counts)"
    )
    h.add_argument(
        "--seed-start",
        type=Int(lo=0),
        default=0,
        help="first seed of the block (default 0; --seed-start 10 is the second block)",
    )
    _common(h, "runs/health", "; the committed report: --out reports/health")
    return p


def _common(p: argparse.ArgumentParser, out: str, note: str = "") -> None:
    p.add_argument("--out", type=OutDir(), default=out, help=f"output directory (default {out}{note})")
    p.add_argument("--jobs", type=Int(lo=1), default=None, help="worker processes (default: the CPU count)")
    p.add_argument("--quiet", action="store_true", help=QUIET_HELP)


def _seed_args(p: argparse.ArgumentParser, default: int, least: int = 2, start: int = 0) -> None:
    why = "paired intervals need at least two" if least == 2 else "a verdict needs that many judged seeds"
    p.add_argument(
        "--seeds",
        type=Int(lo=least, why=why),
        default=default,
        help=f"paired seeds per block, >= {least} (default {default}): a discovery block and a disjoint "
        "confirmation block are both run, and a finding must hold on both",
    )
    p.add_argument(
        "--seed-start",
        type=Int(lo=0),
        default=start,
        help=f"first seed of the discovery block (default {start}); the confirmation block follows it",
    )
    p.add_argument("--no-confirm", action="store_true", help="run the discovery block only (exploration)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # before any torch import: --help stays instant
    from .experiments import BEYOND, REGISTRY

    if args.cmd in ("ladder", "factorial"):
        return _ladder(args, argv)
    if args.cmd == "off-policy":
        return _off_policy(args, argv)
    if args.cmd == "suite":
        return _suite(args, argv)
    if args.cmd == "health":
        from .health_suite import run_suite, write_report

        t0 = time.perf_counter()
        suite = run_suite(
            seeds=args.seeds, jobs=args.jobs, progress=not args.quiet, seed_start=args.seed_start
        )
        command = "dapo toy " + " ".join(argv if argv is not None else sys.argv[2:])
        path = write_report(suite, args.out, command, time.perf_counter() - t0)
        from .output import markdown_as_text

        print(markdown_as_text(path.read_text(), tables=1))
        print(f"\nreport: {path}")
        return 0
    if args.cmd == "check":
        from .check_cli import main as check_main

        return check_main(args, argv)
    if args.cmd == "list":
        for name, e in {**REGISTRY, **BEYOND}.items():
            print(f"{name:<18} {e.title}\n{'':<18} {e.paper}; arms: {', '.join(e.arms)}")
        return 0
    if args.experiment == "all":
        chosen = list(REGISTRY.values())
    elif args.experiment in {**REGISTRY, **BEYOND}:
        chosen = [{**REGISTRY, **BEYOND}[args.experiment]]
    else:
        raise UsageError(
            f"run: unknown experiment {args.experiment!r}; choose from: all (the paper's four), "
            f"{', '.join([*REGISTRY, *BEYOND])}"
        )
    return run(
        chosen,
        args.seeds,
        args.out,
        args.jobs,
        args.policy,
        args.steps,
        plots=not args.no_plots,
        seed_start=args.seed_start,
        confirm=not args.no_confirm,
        engine=args.engine,
        quiet=args.quiet,
        brief=args.brief,
    )


def run(
    chosen,
    seeds: int,
    out: Path,
    jobs: int | None,
    policy: str,
    steps: int | None,
    plots: bool = True,
    seed_start: int = 0,
    confirm: bool = True,
    engine: str = "batched",
    quiet: bool = False,
    brief: bool = False,
) -> int:
    from .experiment import run_experiments
    from .experiments import REGISTRY
    from .output import format_table, write_all
    from .plots import plot_experiment, plotting_available

    t0 = time.perf_counter()
    results = run_experiments(
        chosen,
        seeds=seeds,
        jobs=jobs,
        policy=policy,
        steps=steps,
        seed_start=seed_start,
        confirm=confirm,
        engine=engine,
        progress=not quiet,
    )
    wall = time.perf_counter() - t0
    # `all` writes the gate's summary; one experiment is merged into it only at the same settings
    total = write_all(results, out, wall, steps=steps, merge={e.name for e in chosen} != set(REGISTRY))
    table = format_table(results)
    if brief and "== verdicts" in table:
        table = (
            table[table.index("== verdicts") :]
            + f"\n   (every contrast: {out}/summary.json, or run without --brief)"
        )
    print(table)
    print(
        f"\n{len(results)} experiment(s), {len(results[0].seeds)} seeds per arm, {total['sampled_tokens']:.0f} "
        f"sampled tokens in {wall:.1f} s wall ({total['sampled_tokens'] / wall:.0f} tokens/s); results in {out}/"
    )
    if total["summary"] == "merged":
        print(f"{out}/summary.json: merged with the experiments run before at the same settings")
    elif total["summary"] == "kept":
        print(
            f"{out}/summary.json left as it was: it was written at other settings (seeds, --steps, "
            f"policy) or by another version; this run's: "
            + ", ".join(f"{out}/{r.experiment.name}/summary.json" for r in results)
        )
    if plots:
        if plotting_available():
            paths = [
                plot_experiment(r, out / r.experiment.name / f"{r.experiment.name}.png") for r in results
            ]
            print("figures: " + ", ".join(str(p) for p in paths))
        else:
            print("figures skipped: install the report extra (pip install 'dapo-repro[report]')")
    return 0


def _ladder(args, argv) -> int:
    from . import ladder as L
    from .ladder_report import write_factorial, write_ladder
    from .output import markdown_as_text

    result, wall = L.run(
        args.cmd,
        args.seeds,
        args.jobs,
        args.steps or L.STEPS,
        seed_start=args.seed_start,
        confirm=not args.no_confirm,
        progress=not args.quiet,
    )
    command = "dapo toy " + " ".join(argv if argv is not None else sys.argv[2:])
    writer = write_ladder if args.cmd == "ladder" else write_factorial
    path = writer(result, wall, args.out, command)
    print(markdown_as_text(path.read_text(), tables=1))
    print(f"\n{args.cmd}: {wall:.1f} s wall; full report (Markdown, figures): {path}")
    return 0


def _off_policy(args, argv) -> int:
    from . import off_policy as O
    from .experiment import run_experiments
    from .off_policy_report import write_report
    from .output import markdown_as_text

    t0 = time.perf_counter()
    grid = O.grid_experiment(args.steps or O.STEPS)
    results = run_experiments(
        [grid, *O.protection_experiments()],
        seeds=args.seeds,
        jobs=args.jobs,
        seed_start=args.seed_start,
        confirm=not args.no_confirm,
        progress=not args.quiet,
    )
    wall = time.perf_counter() - t0
    command = "dapo toy " + " ".join(argv if argv is not None else sys.argv[2:])
    path = write_report(results[0], results[1:], wall, args.out, command)
    print(markdown_as_text(path.read_text(), tables=1))
    print(f"\noff-policy: {wall:.1f} s wall; full report (Markdown, figure, JSON): {path}")
    return 0


def _suite(args, argv) -> int:
    from .output import format_table, markdown_as_text
    from .suite import closing_summary, run_suite, write_suite

    result = run_suite(
        seeds=args.seeds,
        jobs=args.jobs,
        seed_start=args.seed_start,
        confirm=not args.no_confirm,
        progress=not args.quiet,
        steps=args.steps,
    )
    command = "dapo toy " + " ".join(argv if argv is not None else sys.argv[2:])
    paths = write_suite(result, args.out, command, plots=not args.no_plots, steps=args.steps)
    print(markdown_as_text(paths["ladder"].read_text(), tables=1))
    table = format_table(result.families["prompt_selection"])
    print(table[: table.index("\n== verdicts")] if "\n== verdicts" in table else table)
    print(closing_summary(result, paths))
    from .check_cli import check_config_loss

    return check_config_loss(args, Path(args.out) / "toy" / "check.json", command)
