"""Turn a finished ``mutmut run`` into the committed mutation report.

Reads every mutant's status (``mutmut results --all true``) and, for each one not killed,
its diff (``mutmut show``). Every survivor must be explained by a rule in
``tests/mutation/explained.toml``: a module, a function-name prefix, the exact mutated line
(after) and why it cannot matter (an equivalent mutant) or why it is not worth a test.
Rules match on text, not on mutmut's numbering, so they survive unrelated edits; a rule
that no longer matches anything is reported as stale.

Writes ``REPORT.md`` and ``mutants.json`` under ``--out``; exits 1 when a group's score
is under its goal or a survivor is unexplained.

    python tests/mutation/report.py --out reports/mutation
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
GROUPS = {
    "objective": (
        "dapo.advantages",
        "dapo.loss",
        "dapo.rewards",
        "dapo.sampling",
        "dapo.update",
        "dapo.logprobs",
    ),
    "toy verdict path": ("toybench.stats", "toybench.tasks", "toybench.runner"),
}
GOAL = 0.90
# A mutant that makes the tests hang (an endless loop) is detected: CI would stop on it. It
# counts as killed, as in Stryker and PIT, and is listed in the report.
DETECTED = {"killed", "timeout"}


@dataclass
class Mutant:
    name: str
    status: str
    removed: str = ""
    added: str = ""
    why: str = ""

    @property
    def module(self) -> str:
        return self.name.split(".x")[0]

    @property
    def function(self) -> str:
        fn = self.name.split(".x", 1)[1].rsplit("__mutmut_", 1)[0]
        if fn.startswith("ǁ"):  # a method: xǁClassǁmethod
            return fn.replace("ǁ", ".").strip(".")
        return fn.removeprefix("_")  # a function: x_name


def _mutmut(*args: str) -> str:
    return subprocess.run(["mutmut", *args], check=True, capture_output=True, text=True).stdout


def load_mutants() -> list[Mutant]:
    out = []
    for line in _mutmut("results", "--all", "true").splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep:
            out.append(Mutant(name, status))
    return out


def _diff(m: Mutant) -> None:
    lines = _mutmut("show", m.name).splitlines()
    m.removed = " / ".join(x[1:].strip() for x in lines if x.startswith("-") and not x.startswith("---"))
    m.added = " / ".join(x[1:].strip() for x in lines if x.startswith("+") and not x.startswith("+++"))


def explain(mutants: list[Mutant], rules: list[dict]) -> Counter:
    used: Counter = Counter()
    for m in mutants:
        for i, rule in enumerate(rules):
            if (
                m.module == rule["module"]
                and m.function.startswith(rule.get("function", ""))
                and re.search(rule["added"], m.added)
                and re.search(rule.get("removed", ""), m.removed)
            ):
                m.why = rule["why"]
                used[i] += 1
                break
    return used


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("reports/mutation"))
    ap.add_argument("--rules", type=Path, default=HERE / "explained.toml")
    args = ap.parse_args(argv)
    rules = tomllib.loads(args.rules.read_text())["rule"]
    mutants = [m for m in load_mutants() if any(m.module in mods for mods in GROUPS.values())]
    if not mutants:
        print("mutation report: no mutmut results here; run `mutmut run` first", file=sys.stderr)
        return 2
    unchecked = [m for m in mutants if m.status == "not checked"]
    if unchecked:  # a partial run (e.g. `mutmut run "dapo.loss*"`): no score to report
        print(
            f"mutation report: {len(unchecked)} of {len(mutants)} mutants not checked; run `mutmut run` "
            "over all of them first",
            file=sys.stderr,
        )
        return 2
    alive = [m for m in mutants if m.status not in DETECTED]
    timeouts = [m for m in mutants if m.status == "timeout"]
    for m in alive:
        _diff(m)
    used = explain(alive, rules)
    ok = True
    lines = [
        "# Mutation report",
        "",
        "Produced by `nox -s mutation` (mutmut over the modules below, core and toy test subsets; "
        "configuration in `pyproject.toml` `[tool.mutmut]`). A mutant is *killed* when some test fails "
        "on it (or hangs, which counts as detected). Every survivor is listed with the rule that explains it "
        "(`tests/mutation/explained.toml`).",
        "",
        "| group | mutants | killed | survived | no test | score | goal |",
        "|---|---|---|---|---|---|---|",
    ]
    summary = {}
    for group, mods in GROUPS.items():
        ms = [m for m in mutants if m.module in mods]
        killed = sum(m.status in DETECTED for m in ms)
        score = killed / len(ms) if ms else float("nan")
        survived = sum(m.status == "survived" for m in ms)
        no_test = sum(m.status == "no tests" for m in ms)
        summary[group] = {
            "mutants": len(ms),
            "killed": killed,
            "survived": survived,
            "no_tests": no_test,
            "score": round(score, 4),
        }
        lines.append(
            f"| {group} | {len(ms)} | {killed} | {survived} | {no_test} | {score:.1%} | {GOAL:.0%} |"
        )
        ok &= score >= GOAL
    unexplained = [m for m in alive if not m.why]
    stale = [r for i, r in enumerate(rules) if not used[i]]
    lines += [
        "",
        f"Unexplained survivors: {len(unexplained)}. Stale rules (matching nothing): {len(stale)}. "
        f"Timeouts (detected): {', '.join(f'`{m.module}.{m.function}`' for m in timeouts) or 'none'}.",
        "",
    ]
    by_why: dict[str, list[Mutant]] = {}
    for m in alive:
        by_why.setdefault(m.why or "UNEXPLAINED", []).append(m)
    lines += ["## Survivors by explanation", ""]
    for why, ms in sorted(by_why.items(), key=lambda kv: (kv[0] != "UNEXPLAINED", -len(kv[1]))):
        lines += [f"### {why} ({len(ms)})", ""]
        lines += [f"- `{m.module}.{m.function}` ({m.status}): `{m.removed}` -> `{m.added}`" for m in ms]
        lines.append("")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "REPORT.md").write_text("\n".join(lines))
    (args.out / "mutants.json").write_text(
        json.dumps(
            {
                "summary": summary,
                "goal": GOAL,
                "not_killed": [
                    {
                        "name": m.name,
                        "status": m.status,
                        "removed": m.removed,
                        "added": m.added,
                        "why": m.why or None,
                    }
                    for m in alive
                ],
                "stale_rules": stale,
            },
            indent=1,
        )
        + "\n"
    )
    for group, s in summary.items():
        print(
            f"{group}: {s['killed']}/{s['mutants']} killed ({s['score']:.1%}), {s['survived']} survived, "
            f"{s['no_tests']} without a test"
        )
    print(
        f"unexplained survivors: {len(unexplained)}; stale rules: {len(stale)}; report: {args.out / 'REPORT.md'}"
    )
    for m in unexplained:
        print(f"  UNEXPLAINED {m.name}: {m.removed!r} -> {m.added!r}")
    return 0 if ok and not unexplained else 1


if __name__ == "__main__":
    sys.exit(main())
