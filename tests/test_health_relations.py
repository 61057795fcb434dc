"""Metamorphic relations of `dapo diagnose` on every real log in the calibration corpus: what
must not change a verdict (steps relabelled by a factor, every second row logged, the outcome's
own noise added) and what must (a collapse appended; the run cut at its best is not a fall).

Relabelling is exact (windows are shares of the run). Thinning halves the evidence and adding
noise moves a statistic, so a verdict that sits at a threshold may move one level; the tests
hold that it never moves two (healthy <-> failing) and that it holds on at least 85% of the
logs (measured on the 72 logs before held-out-6 and -7: 26 of 30 thinned, 38 of 42 noised;
docs/results/diagnose-calibration.md)."""

import json
import random
from pathlib import Path

import pytest

from dapo.health import diagnose, verdict
from dapo.health.noise import estimate
from dapo.health.readers import read_log
from dapo.health.rules.base import outcome

DATA = Path(__file__).parent / "data" / "health" / "calibration"
SOURCES = json.loads((DATA / "SOURCES.json").read_text())
LEVEL = {"healthy": 0, "warning": 1, "failing": 2}


def _runs():
    out = []
    for src in SOURCES:
        for label, run in read_log(DATA / src["file"]).runs.items():
            out.append((f"{src['file']}:{label}", sorted(run, key=lambda r: r.get("step", 0))))
    return out


RUNS = _runs()


def v(run):
    return verdict(diagnose(run)).status


def _outcome_key(run):
    name, out = outcome(run)
    return ("rollout/accuracy" if name == "accuracy" else "rollout/reward_mean"), out


@pytest.mark.parametrize("factor", [3.0, 0.01])
def test_steps_relabelled_by_a_factor_change_no_verdict_and_no_finding(factor):
    for name, run in RUNS:
        a = diagnose(run)
        b = diagnose([{**r, "step": factor * r["step"]} if "step" in r else r for r in run])
        assert [f.status for f in a] == [f.status for f in b], name


def _tolerated(pairs, what):
    swings = [(n, a, b) for n, a, b in pairs if a in LEVEL and b in LEVEL and abs(LEVEL[a] - LEVEL[b]) > 1]
    assert not swings, (what, swings)
    held = sum(a == b for _, a, b in pairs)
    assert held >= 0.85 * len(pairs), (what, [(n, a, b) for n, a, b in pairs if a != b])


def test_logging_every_second_row_moves_a_verdict_one_level_at_most():
    pairs = [(n, v(run), v(run[::2])) for n, run in RUNS if len(run) >= 40]
    assert len(pairs) >= 25
    _tolerated(pairs, "thinned")


def test_noise_at_half_the_outcomes_own_level_moves_a_verdict_one_level_at_most():
    pairs = []
    for n, run in RUNS:
        key, out = _outcome_key(run)
        base = v(run)
        if len(out) < 10 or base == "inconclusive":
            continue
        sd = estimate(out.values).sd
        rng = random.Random(0)
        noisy = [
            {**r, key: r[key] + rng.gauss(0, 0.5 * sd)} if isinstance(r.get(key), (int, float)) else r
            for r in run
        ]
        pairs.append((n, base, v(noisy)))
    assert len(pairs) >= 30
    _tolerated(pairs, "noised")


def test_a_collapse_appended_fails_and_a_run_cut_at_its_best_has_not_fallen():
    judged = 0
    for n, run in RUNS:
        key, out = _outcome_key(run)
        if len(out) < 10 or v(run) == "inconclusive":
            continue
        judged += 1
        steps = [r["step"] for r in run]
        gap = (steps[-1] - steps[0]) / max(1, len(steps) - 1)
        fallen = [
            {**run[-1 - (i % 5)], "step": steps[-1] + gap * (i + 1), key: min(out.values)}
            for i in range(len(run) // 2)
        ]
        assert v(run + fallen) == "failing", n
        means = [
            sum(out.values[max(0, i - 2) : i + 1]) / len(out.values[max(0, i - 2) : i + 1])
            for i in range(len(out))
        ]
        best = out.steps[max(range(len(out)), key=means.__getitem__)]
        cut = diagnose([r for r in run if r.get("step", 0) <= best])
        assert not [
            f.rule for f in cut if f.rule in ("reward_collapse", "validation") and f.status == "failing"
        ], n
    assert judged >= 30
