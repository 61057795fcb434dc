"""The tolerated-staleness procedure (toybench/noninferiority.py): its operating characteristics
by simulation of the procedure itself (a harmless configuration is tolerated, a harmful one is
not, health counts as much as accuracy), its error rate at the margin, the invariances of its
verdict, and the committed table recomputed from its own per-seed differences."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toybench import noninferiority as N
from toybench import off_policy as O

P80 = N.PILOT["paired_sd_p80"]
M = N.MARGINS
LADDER = (1, 2, 4, 8)


def test_a_harmless_staleness_is_tolerated_up_to_the_top_at_the_planned_power():
    """Zero true cost at every k, the planned seeds and sd: tolerated up to k = 8 >= 80% of the time
    (the issue's bar), and called harmful anywhere in few tables."""
    sim = N.simulate(O.SEEDS, P80, reps=4000, seed=1)  # a seed the plan did not use
    assert sim["tolerated_all"] >= N.POWER
    assert sim["harmful"] < 0.05


@pytest.mark.parametrize("metric", N.METRICS)
def test_a_cost_twice_the_margin_is_not_tolerated(metric):
    """On either metric alone (health counts as much as accuracy): not tolerated at k = 1 in >= 95%
    of tables, and a loss beyond the margin shown on the ladder in >= 95% (at k = 1 alone: about 95%
    on accuracy at the planned sd, the docs' figure); at three margins, at k = 1 in >= 99%."""
    sim = N.simulate(O.SEEDS, P80, cost={metric: [2 * M[metric]] * 4}, reps=4000, seed=2)
    assert sim["tolerated_k1"] <= 0.05
    assert sim["harmful"] >= 0.95
    sim = N.simulate(O.SEEDS, P80, cost={metric: [3 * M[metric]] * 4}, reps=4000, seed=2)
    assert sim["harmful_at_k1"] >= 0.99


def test_entropy_collapsing_at_the_top_stops_the_ladder_below_it():
    """The k3_rs pattern: accuracy unharmed (even better), entropy falling at k = 8 only: never
    tolerated up to 8, mostly up to 4."""
    sim = N.simulate(
        O.SEEDS,
        P80,
        cost={"accuracy": [-0.03] * 4, "entropy": [0, 0, 0, 4 * M["entropy"]]},
        reps=4000,
        seed=3,
    )
    assert sim["tolerated_all"] <= 0.01
    assert sim["mean_tolerated_k"] > 3


def test_the_ladder_keeps_its_error_rate_at_the_margin():
    """A cost exactly the margin at every k (the boundary of the null): some k is called tolerated in
    at most alpha of tables (fixed sequence: no correction for four k, two blocks, two metrics)."""
    sim = N.simulate(O.SEEDS, P80, cost={"accuracy": [M["accuracy"]] * 4}, reps=8000, seed=4)
    assert sim["tolerated_k1"] <= N.ALPHA + 0.01


def test_the_seed_count_is_the_plan_and_the_pilot_is_left_out():
    from toybench.cli import build_parser

    assert N.plan_seeds(P80) == O.SEEDS
    assert N.simulate(O.SEEDS - 1, P80)["tolerated_all"] < N.POWER  # one fewer falls short
    args = build_parser().parse_args(["off-policy"])
    assert (args.seeds, args.seed_start) == (O.SEEDS, O.SEED_START)
    assert O.SEED_START > 63  # the pilot's seeds 0..63 fixed the margins and the count


def test_the_margins_are_the_stated_share_of_the_pilots_dapo():
    p = N.PILOT
    assert M["accuracy"] == pytest.approx(
        N.MARGIN_SHARE * (p["dapo_k0_final_accuracy"] - p["dapo_k0_first_accuracy"]), abs=1e-4
    )
    assert M["entropy"] == pytest.approx(N.MARGIN_SHARE * p["dapo_k0_final_entropy"], abs=1e-4)


def _diffs(rng, n=12, shift=None):
    shift = shift or {}
    return {
        mt: {
            k: {b: list(rng.normal(shift.get((mt, k), 0.0), 0.01, n)) for b in ("discovery", "confirmation")}
            for k in LADDER
        }
        for mt in N.METRICS
    }


def _map(d, f):
    return {
        mt: {k: {b: [f(x) for x in v] for b, v in per.items()} for k, per in ks.items()}
        for mt, ks in d.items()
    }


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.floats(0.1, 50.0), cost=st.floats(-0.05, 0.05))
def test_the_verdict_is_unit_free_and_seed_order_free(seed, scale, cost):
    """Scaling every difference and margin by one factor, reordering the seeds the same way in every
    cell, or swapping the two blocks changes nothing."""
    rng = np.random.default_rng(seed)
    d = _diffs(rng, shift={("accuracy", 4): -cost, ("accuracy", 8): -2 * cost, ("entropy", 8): cost})
    v = N.judge(d)
    scaled = N.judge(_map(d, lambda x: x * scale), {mt: m * scale for mt, m in M.items()})
    assert (scaled.upto, scaled.stop, scaled.harmful_from) == (v.upto, v.stop, v.harmful_from)
    order = rng.permutation(12)
    shuffled = {
        mt: {k: {b: [per[b][i] for i in order] for b in per} for k, per in ks.items()} for mt, ks in d.items()
    }
    assert N.judge(shuffled).upto == v.upto
    swapped = {
        mt: {k: {"confirmation": per["discovery"], "discovery": per["confirmation"]} for k, per in ks.items()}
        for mt, ks in d.items()
    }
    w = N.judge(swapped)
    assert (w.upto, w.harmful_from) == (v.upto, v.harmful_from)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), better=st.floats(0.0, 0.1))
def test_a_run_better_at_every_seed_never_tolerates_less(seed, better):
    rng = np.random.default_rng(seed)
    d = _diffs(rng, shift={("accuracy", 2): -0.03, ("entropy", 4): -0.05})
    v = N.judge(d)
    w = N.judge(_map(d, lambda x: x + better))
    assert w.upto >= v.upto
    assert w.harmful_from is None or (v.harmful_from is not None and w.harmful_from >= v.harmful_from)


def test_the_reason_names_the_metric_the_block_and_the_k():
    rng = np.random.default_rng(0)
    d = _diffs(rng, shift={("entropy", 4): -0.2})
    v = N.judge(d)
    assert (v.upto, v.stop, v.harmful_from) == (2, 4, 4)
    assert "at k = 4 not shown: entropy on discovery" in v.why and "entropy on confirmation" in v.why
    assert "harmful from k = 4" in v.why and "accuracy on" not in v.why
    assert [v.at(k) for k in LADDER] == ["tolerated", "tolerated", "not tolerated", "not tolerated"]
    clean = N.judge(_diffs(rng))
    assert (clean.upto, clean.stop, clean.why) == (8, None, "")
    nan = _diffs(rng)
    nan["accuracy"][1]["discovery"] = [float("nan")] * 12  # a metric undefined on a block
    assert N.judge(nan).upto == 0


def test_the_committed_table_is_its_own_per_seed_differences_judged():
    """Every row's verdict recomputed from the per-seed differences the table stores; the k3_rs row
    (accuracy up, entropy collapsing on most seeds at k = 4 and 8) is not tolerated to the top."""
    data = json.loads(O_TABLE.read_text())
    assert data["procedure"]["margins"] == M and data["procedure"]["alpha"] == N.ALPHA
    for label, per in data["differences"].items():
        d = {mt: {int(k): cells for k, cells in ks.items()} for mt, ks in per.items()}
        v = N.judge(d)
        stored = data["verdicts"][label]
        assert (v.upto, v.stop, v.harmful_from, v.why) == (
            stored["upto"],
            stored["stop"],
            stored["harmful_from"],
            stored["why"],
        ), label
    assert data["verdicts"]["dapo, k3_rs"]["upto"] < 8


from scale.ops.staleness_table import TABLE as O_TABLE  # noqa: E402
