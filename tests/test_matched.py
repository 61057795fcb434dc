"""Reading a curve at equal learning (toybench.matched): the invariants `dapo toy check`
relies on, on random trajectories."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from toybench.matched import LEVEL, crossing, gain, read_matched

ACC = "toy/expected_accuracy"


def log_of(acc, curve):
    return [{ACC: a, "y": y} for a, y in zip(acc, curve)]


trajectories = st.integers(12, 60).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n),
        st.lists(st.floats(-5.0, 5.0), min_size=n, max_size=n),
    )
)


def y(m):
    return m["y"]


@settings(max_examples=80)
@given(trajectories, trajectories)
def test_each_arm_is_read_after_reaching_the_common_level_over_equal_windows(a, b):
    """Every arm is read from its first crossing of LEVEL x the smallest gain, over the same
    number of steps: with the step index as the curve the reading is the window's midpoint."""
    logs = {"a": log_of(*a), "b": log_of(*b)}
    common = min(gain(x) for x in logs.values())
    starts = {k: crossing(v, LEVEL * max(common, 0.0)) for k, v in logs.items()}
    indexed = {k: [{**m, "y": float(t)} for t, m in enumerate(v)] for k, v in logs.items()}
    got = read_matched(indexed, y)
    if any(t is None for t in starts.values()):
        assert all(math.isnan(v) for v in got.values())
        return
    width = min(len(logs[k]) - t for k, t in starts.items())
    for k, t in starts.items():
        assert got[k] == (t + t + width - 1) / 2


@given(trajectories, st.floats(-3.0, 3.0))
def test_identical_arms_read_alike_and_a_shifted_curve_reads_shifted(a, shift):
    """Two arms that are the same run read the same; adding a constant to one arm's curve adds
    it to its reading (a paired difference measures the curve, nothing else)."""
    log = log_of(*a)
    same = read_matched({"x": log, "y": log}, y)
    if math.isnan(same["x"]):
        return
    assert same["x"] == same["y"]
    moved = [{**m, "y": m["y"] + shift} for m in log]
    got = read_matched({"x": log, "y": moved}, y)
    assert math.isclose(got["y"] - got["x"], shift, abs_tol=1e-9)


def test_an_arm_that_does_not_learn_reads_every_arm_from_its_start():
    """A flat arm makes the common gain 0: every arm is read from step 0 over the whole run, so
    the reading compares no learning at all (the learning gate, not this reading, judges it)."""
    n = 30
    flat = log_of([0.2] * n, [1.0] * n)
    rising = log_of([0.2 + 0.7 * t / n for t in range(n)], [1.0 - t / n for t in range(n)])
    got = read_matched({"flat": flat, "rising": rising}, y)
    assert got["flat"] == 1.0
    assert math.isclose(got["rising"], sum(1.0 - t / n for t in range(n)) / n)


def test_a_slow_learner_is_read_later_not_earlier():
    """Equal learning: the arm that needs twice the steps to reach the level is read from its
    own later crossing, so both are compared at the same accuracy."""
    n = 40
    fast = log_of([min(1.0, t / 10) for t in range(n)], [float(t) for t in range(n)])
    slow = log_of([min(1.0, t / 20) for t in range(n)], [float(t) for t in range(n)])
    t_fast, t_slow = crossing(fast, LEVEL * 1.0), crossing(slow, LEVEL * 1.0)
    assert t_fast is not None and t_slow is not None and t_slow > t_fast
    got = read_matched({"fast": fast, "slow": slow}, y)
    assert got["slow"] - got["fast"] == t_slow - t_fast
