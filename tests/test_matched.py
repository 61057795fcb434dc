"""Reading a curve at equal learning (toybench.matched): the invariants `dapo toy check`
relies on, on random trajectories."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from toybench.matched import LAST, LEVEL, crossing, gain, read_against, read_matched, reference_window

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
    starts = {k: crossing(v, LEVEL * common) for k, v in logs.items()}
    indexed = {k: [{**m, "y": float(t)} for t, m in enumerate(v)] for k, v in logs.items()}
    got = read_matched(indexed, y)
    if not common > 0 or any(t is None for t in starts.values()):  # no window: nothing is read
        assert all(math.isnan(v) for v in got.values())
        return
    width = min(len(logs[k]) - t for k, t in starts.items())
    if width < LAST:  # a window shorter than the steps that define a gain: nothing is read
        assert all(math.isnan(v) for v in got.values())
        return
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


def test_an_arm_that_does_not_learn_leaves_the_seed_unread():
    """A flat arm makes the common gain 0: there is no level to read at, so the seed reads NaN
    for every arm (before issue 69 every arm was read from step 0, and a frozen candidate
    collected the difference as a windfall) and reference_window says why."""
    n = 30
    flat = log_of([0.2] * n, [1.0] * n)
    rising = log_of([0.2 + 0.7 * t / n for t in range(n)], [1.0 - t / n for t in range(n)])
    got = read_matched({"flat": flat, "rising": rising}, y)
    assert all(math.isnan(v) for v in got.values())
    assert isinstance(reference_window({"flat": flat, "rising": rising}), str)


@given(trajectories, trajectories, trajectories)
def test_a_candidate_is_read_in_the_references_window_and_a_copy_reads_as_its_original(a, b, c):
    """read_against: a candidate that is a copy of a reference reads exactly as that reference
    (the yardstick's own reading, re-read over the same steps), and a candidate that never
    rises to the references' level is not read (a reason, never a number)."""
    refs = {"u": log_of(*a), "f": log_of(*b)}
    window = reference_window(refs)
    if isinstance(window, str):
        return
    got = read_against(refs, refs["u"], y, window)
    assert isinstance(got, dict) and got[""] == got["u"]
    flat = log_of([c[0][0]] * len(c[0]), c[1])
    assert isinstance(read_against(refs, flat, y, window), str)


@given(st.floats(0.0, 1.0), st.integers(12, 60), st.floats(5e-324, 1.0))
def test_a_flat_log_neither_gains_nor_crosses_however_small_the_rise(level, n, rise):
    """A log whose accuracy never moves gains exactly 0 and never crosses a positive rise: the
    mean of equal values can differ from them by a rounding error (CI, stop 81: a flat 0.206
    "crossed" a rise of 2e-297 built from two references' denormal gains and was read)."""
    flat = log_of([level] * n, [0.0] * n)
    assert gain(flat) == 0.0
    assert crossing(flat, rise) is None
    assert crossing(log_of([0.20614048703635596] * 12, [0.0] * 12), 1.959843219532604e-297) is None


def test_a_late_learner_is_read_over_a_shorter_window_and_so_are_the_references():
    """A candidate that crosses the level with fewer steps left than the references' window is
    read over the steps it has (at least 10), and the references over as many from their own
    crossings: the three are read for the same time after reaching the same accuracy."""
    n = 60
    fast = log_of([min(1.0, t / 5) for t in range(n)], [float(t) for t in range(n)])
    late = log_of([min(1.0, max(0.0, (t - 35) / 5)) for t in range(n)], [float(t) for t in range(n)])
    window = reference_window({"u": fast, "f": fast})
    assert not isinstance(window, str)
    got = read_against({"u": fast, "f": fast}, late, y, window)
    assert isinstance(got, dict)
    t_fast, t_late = crossing(fast, window.rise), crossing(late, window.rise)
    width = n - t_late
    assert width < window.width
    assert got[""] == (t_late + t_late + width - 1) / 2 and got["u"] == (t_fast + t_fast + width - 1) / 2
    too_late = log_of([min(1.0, max(0.0, (t - 52) / 2)) for t in range(n)], [0.0] * n)
    assert "fewer than 10 steps" in read_against({"u": fast, "f": fast}, too_late, y, window)


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
