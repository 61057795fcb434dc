import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scale.evaluation import ProblemResult, majority_answer, pass_at_k, summarize


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_exhaustive_subset_average(nck):
    n, c, k = nck
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_k_edges():
    assert pass_at_k(32, 0, 1) == 0.0 and pass_at_k(32, 32, 32) == 1.0
    assert pass_at_k(32, 8, 1) == pytest.approx(8 / 32)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_majority_and_summary():
    assert majority_answer(["3", None, "4", "4", "3"]) == "3"  # tie: earliest to reach the top count
    assert majority_answer([None, None]) is None
    rs = [
        ProblemResult("4", ["4", "4", "1", None]),
        ProblemResult("7", ["1", "2", "7", "1"]),
        ProblemResult("9", ["0", "0", "0", "0"]),
    ]
    s = summarize(rs, ks=[1, 2, 4])
    assert s["eval/avg@4"] == pytest.approx((0.5 + 0.25 + 0) / 3)
    assert s["eval/pass@1"] == pytest.approx(s["eval/avg@4"])
    assert s["eval/pass@4"] == pytest.approx(2 / 3)
    assert s["eval/cons@4"] == pytest.approx(1 / 3)
    assert s["eval/avg@4_lo"] <= s["eval/avg@4"] <= s["eval/avg@4_hi"]
    assert not math.isnan(s["eval/pass@2"])
