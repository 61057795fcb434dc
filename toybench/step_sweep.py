"""Where the check's constants come from, measured on DAPO's own loss only (no candidate):
``python -m toybench.step_sweep [--lengths] [--seeds N] [--out FILE]``.

``--lengths``: each failure mode's step length for :class:`toybench.optim.ScaleFreeSGD`
(:data:`toybench.check.STEP_ENTROPY` ...): the step plain SGD takes in the experiment with
DAPO's loss, ``lr x`` the root mean square of the gradient norm over the run, on the arm
that runs DAPO's loss in the candidate's conditions (:attr:`toybench.check.FailureMode.reference`).

The sweep (default): the check's two reference arms of each mode a loss can fix (DAPO's loss
with and without DAPO's fix), at the check's step times each factor of :data:`FACTORS`, on a
discovery and a confirmation block. Per factor it reports the fix's effect read at equal
learning per block (the yardstick: does it still exclude 0 in the fix's direction?) and
each reference arm's accuracy gain as a share of the fix arm's gain at factor 1 (the
learning gate's reference). The learning gate's margin
(:data:`toybench.check_words.LEARNING_MARGIN`) is the smaller arm's gain share at the
smallest factor whose verdicts still match factor 1's (both fixes shown on both blocks):
the least a run learned in which the check still sees the failure modes.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace

FACTORS = (1.0, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05)
"""Multiples of each mode's check step, from the check's own down to a twentieth."""


def lengths(seeds: int = 6) -> dict[str, float]:
    """Each mode's ``lr x`` RMS gradient norm of DAPO's loss under SGD (seeds ``0 .. seeds-1``)."""
    from .check import MODES
    from .engine import train_many
    from .experiments import REGISTRY

    out = {}
    for name, mode in MODES.items():
        exp = REGISTRY[mode.experiment]
        logs = train_many([exp.spec(mode.reference, s) for s in range(seeds)])
        norms = [m["actor/grad_norm"] for log in logs for m in log if m.get("actor/optimizer_steps", 0) > 0]
        out[name] = exp.arms[mode.reference].lr * math.sqrt(sum(v * v for v in norms) / len(norms))
    return out


def sweep(seeds: int = 10, factors: tuple[float, ...] = FACTORS, jobs: int | None = None) -> list[dict]:
    """One row per (mode, factor): the fix's effect per block and DAPO's gain share."""
    from .check import MODES, derived_experiment, yardstick
    from .experiment import run_experiments
    from .matched import gain
    from .stats import paired_interval

    modes = [m for m in MODES.values() if m.loss_can_act]
    exps = []
    for mode in modes:
        for k in factors:
            exp = derived_experiment(replace(mode, step=mode.step * k), [], {})
            exps.append(replace(exp, name=f"{exp.name}@{k:g}"))
    done = run_experiments(exps, seeds=seeds, jobs=jobs, progress=False)
    rows = []
    base: dict[tuple[str, str], float] = {}
    for exp, res in zip(exps, done):
        mode = next(m for m in modes if exp.name.startswith(m.experiment + "@"))
        k = float(exp.name.split("@")[1])
        u, f = mode.unprotected, mode.fix
        readings, _ = yardstick(mode, res)
        row: dict = {"mode": mode.name, "factor": k, "step": mode.step * k}
        for block, members in res.blocks.items():
            diffs = [v[1] - v[0] for s in members if not isinstance(v := readings[s], str)]
            iv = paired_interval(diffs)
            shown = iv.n > 0 and (iv.low > 0 if mode.better == "+" else iv.high < 0)
            g = sum(gain(res.logs[f][s]) for s in members) / len(members)
            g_u = sum(gain(res.logs[u][s]) for s in members) / len(members)
            if k == 1.0:
                base[(mode.name, block)] = g
            row[block] = {
                "effect": [iv.mean, iv.low, iv.high],
                "n": iv.n,
                "shown": shown,
                "gain": g,
                "gain_u": g_u,
            }
        rows.append(row)
    for row in rows:
        for block in ("discovery", "confirmation"):
            row[block]["gain_share"] = row[block]["gain"] / base[(row["mode"], block)]
            row[block]["gain_share_u"] = row[block]["gain_u"] / base[(row["mode"], block)]
    return rows


def margin(rows: list[dict]) -> tuple[float, float]:
    """(the smallest factor at which every mode shows its fix on both blocks at it and at
    every larger factor, the smallest gain share there over modes, blocks and the two
    reference arms: the least a run learned in which the check still sees the failure
    modes)."""
    factors = sorted({r["factor"] for r in rows}, reverse=True)
    last = factors[0]
    for k in factors:
        at = [r for r in rows if r["factor"] == k]
        if not all(r[b]["shown"] for r in at for b in ("discovery", "confirmation")):
            break
        last = k
    share = min(
        min(r[b]["gain_share"], r[b]["gain_share_u"])
        for r in rows
        if r["factor"] == last
        for b in ("discovery", "confirmation")
    )
    return last, share


def report(rows: list[dict], seeds: int) -> str:
    k, share = margin(rows)
    lines = [
        "# The check's step sweep: DAPO's own loss at smaller steps",
        "",
        f"Reproduce: `python -m toybench.step_sweep --seeds {seeds} --out reports/losses/step_sweep.md` "
        f"({seeds} + {seeds} seeds). Each row runs the check's two reference arms of a mode (DAPO's loss "
        "with and without DAPO's fix) with ScaleFreeSGD at the check's step times the factor; *fix effect*: "
        "fix - unprotected read at equal learning (toybench.matched), mean [95% interval]; *shown*: it "
        "excludes 0 in the fix's direction; *gain share*: each reference arm's accuracy gain (with the fix / "
        "without) over the fix arm's gain at factor 1 (the learning gate's reference).",
        "",
        "| mode | factor | step | fix effect (discovery) | shown | fix effect (confirmation) | shown "
        "| gain share, fix arm (disc. / conf.) | gain share, unprotected arm (disc. / conf.) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def fmt(x: dict) -> str:
        m, lo, hi = x["effect"]
        return f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}] (n {x['n']})"

    for r in rows:
        d, c = r["discovery"], r["confirmation"]
        lines.append(
            f"| {r['mode']} | {r['factor']:g} | {r['step']:.3g} | {fmt(d)} | {'yes' if d['shown'] else 'no'} "
            f"| {fmt(c)} | {'yes' if c['shown'] else 'no'} | {d['gain_share']:.2f} / {c['gain_share']:.2f} "
            f"| {d['gain_share_u']:.2f} / {c['gain_share_u']:.2f} |"
        )
    lines += [
        "",
        f"Both fixes are shown on both blocks down to factor {k:g}; there the reference arm that learns "
        f"least gains {share:.2f} of the fix arm's gain at factor 1 (the smallest over modes, blocks and "
        "the two arms): the least a run learned in which the check still sees both failure modes. The "
        "learning gate's margin (toybench.check_words.LEARNING_MARGIN) is set from it.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from dapo.cliargs import Int, OutFile, Parser

    from .check_words import MIN_SEEDS

    ap = Parser(prog="python -m toybench.step_sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", action="store_true", help="print each mode's step length and stop")
    ap.add_argument(
        "--seeds",
        type=Int(lo=MIN_SEEDS, why="a block's fix effect needs that many seeds"),
        default=10,
        help=f"seeds per block, >= {MIN_SEEDS} (default 10)",
    )
    ap.add_argument("--out", type=OutFile(), help="write the report (markdown) here")
    ap.add_argument("--jobs", type=Int(lo=1), default=None, help="worker processes (default: the CPU count)")
    args = ap.parse_args(argv)
    if args.lengths:
        for name, value in lengths().items():
            print(f"{name}: {value:.3f}")
        return 0
    text = report(sweep(args.seeds, jobs=args.jobs), args.seeds)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
