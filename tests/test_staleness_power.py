"""The off-policy table's power and verdicts (toybench/off_policy.py): the seed count meets the
power it is chosen for, and each row's tolerated staleness is derived from the non-inferiority
test with every disagreement between the blocks said and explained."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from toybench import off_policy as O
from toybench.stats import Interval


@settings(max_examples=200, deadline=None)
@given(sd=st.floats(0.005, 0.2), margin=st.floats(0.005, 0.1))
def test_the_chosen_seed_count_meets_its_power_and_one_fewer_does_not(sd, margin):
    n = O.seeds_for(sd, margin)
    assert O.power_at(sd, n, margin) >= O.POWER - 1e-9
    if n > 1:
        assert O.power_at(sd, n - 1, margin) < O.POWER


def test_the_planned_count_and_a_simulation_agree():
    """At the planned sd, 32 seeds per block; a simulation of normal paired differences with a
    true difference of 0 establishes non-inferiority (a t-interval's lower end above -margin)
    in about 80% of blocks."""
    import numpy as np
    from scipy import stats

    n = O.seeds_for(O.PLANNED_SD)
    assert n == 32
    from toybench.cli import build_parser  # `dapo toy off-policy` runs the planned count by default

    assert build_parser().parse_args(["off-policy"]).seeds == n
    rng = np.random.default_rng(0)
    d = rng.normal(0, O.PLANNED_SD, size=(4000, n))
    low = d.mean(1) - stats.t.ppf(0.95, n - 1) * d.std(1, ddof=1) / math.sqrt(n)
    assert 0.74 < (low > -O.MARGIN).mean() < 0.86


def iv(lo, hi):
    return Interval((lo + hi) / 2, lo, hi, 32)


def test_the_verdict_says_where_the_blocks_agree_and_why_they_do_not():
    ok = {"discovery": iv(-0.01, 0.01), "confirmation": iv(-0.015, 0.005)}
    straddle = {"discovery": iv(-0.01, 0.01), "confirmation": iv(-0.03, -0.005)}
    lost_one = {"discovery": iv(-0.01, 0.01), "confirmation": iv(-0.06, -0.03)}
    lost_both = {"discovery": iv(-0.07, -0.03), "confirmation": iv(-0.06, -0.03)}
    assert O.verdict({1: ok, 2: ok, 4: ok, 8: ok}) == (8, "up to k = 8 (both blocks)")
    k, said = O.verdict({1: ok, 2: ok, 4: lost_both, 8: lost_both})
    assert k == 2 and "at k = 4 a loss beyond the margin on both blocks" in said
    k, said = O.verdict({1: ok, 2: straddle, 4: ok, 8: ok})
    assert k is None and "disagree at k = 2" in said and "straddles the margin (unresolved)" in said
    k, said = O.verdict({1: lost_one})
    assert k is None and "a loss beyond the margin" in said and "straddles" not in said
