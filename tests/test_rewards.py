import time

import pytest
import torch
from hypothesis import given, strategies as st

from dapo.rewards import outcome_reward, score_integer_answer, soft_overlong_penalty


@pytest.mark.parametrize(
    "text,truth",
    [
        ("reasoning...\nAnswer: 42", 42),
        ("Answer: $42$", 42),
        ("Answer:  1,234 ", 1234),
        ("Answer: 1{,}234", 1234),
        ("Answer: 42.", 42),
        ("Answer: **42**", 42),
        ("Answer: \\boxed{42}", 42),
        ("Answer: $\\boxed{1,000}$.", 1000),
        ("Answer: 007", 7),
        ("Answer: -5", -5),
        ("no marker, so the box counts: \\boxed{17}", 17),
        ("\\boxed{3} then later \\boxed{ 18 }", 18),
        ("Answer: 5\nsecond thought\nAnswer: 6", 6),
    ],
)
def test_accepts_listed_formats(text, truth):
    assert score_integer_answer(text, truth)
    assert score_integer_answer(text, str(truth))


@pytest.mark.parametrize(
    "text,truth",
    [
        ("Answer: 190", 19),
        ("Answer: 19", 190),
        ("Answer: 19.5", 19),
        ("Answer: 19/2", 19),
        ("Answer: x = 19", 19),
        ("Answer: 1,23", 123),
        ("Answer: 6\nAnswer: 5", 6),  # the last line wins
        ("Answer: \\boxed{19} \\boxed{20}", 19),
        ("\\boxed{19", 19),  # unclosed
        ("the answer is 19", 19),  # no marker, no box
        ("Answer: 2+17", 19),  # never evaluated
        ("Answer: __import__('os')", 0),
    ],
)
def test_rejects_look_alikes(text, truth):
    assert not score_integer_answer(text, truth)


@given(st.text(), st.integers(-10**6, 10**6))
def test_never_raises(text, truth):
    assert score_integer_answer(text, truth) in (True, False)


@given(st.integers(-10**30, 10**30), st.sampled_from(["", "$", "**"]), st.booleans())
def test_roundtrip_any_integer(n, deco, period):
    s = f"{n:,}" if n % 2 else str(n)
    text = f"work\nAnswer: {deco}{s}{deco}{'.' if period else ''}"
    assert score_integer_answer(text, n)
    assert not score_integer_answer(text, n + 1)


def test_bad_truth_raises():
    with pytest.raises(ValueError):
        score_integer_answer("Answer: 1", "one")


@pytest.mark.parametrize(
    "text",
    ["\\boxed{" * 100_000, "Answer:" * 100_000, "{" * 200_000 + "}" * 200_000, "1," * 200_000, "\\boxed" * 100_000],
)
def test_linear_time_on_adversarial_input(text):
    def cost(t):  # CPU time of this process, best of 3: other processes' load does not count
        runs = []
        for _ in range(3):
            t0 = time.process_time()
            score_integer_answer(t, 1)
            runs.append(time.process_time() - t0)
        return min(runs)

    small, big = cost(text), cost(text * 4)
    # quadratic would be ~16x; allow generous noise above linear (4x)
    assert big < 10 * small + 0.05


@given(st.integers(1, 20000), st.integers(1, 8000), st.floats(0, 3))
def test_soft_penalty_shape(expected, cache, factor):
    L = torch.arange(0, expected + cache + 50)
    p = soft_overlong_penalty(L, expected, cache, factor)
    assert torch.all(p[: expected + 1] == 0)
    assert abs(float(p[expected + cache]) + factor) < 1e-9 * max(1, factor) + 1e-6
    assert torch.all(p[expected + cache :] == p[expected + cache])
    assert torch.all(p[1:] <= p[:-1] + 1e-12)  # non-increasing
    # continuous: Lipschitz with constant factor / cache
    assert torch.all((p[1:] - p[:-1]).abs() <= factor / cache + 1e-6)


def test_paper_numbers():
    p = soft_overlong_penalty(torch.tensor([16384, 18432, 20480, 25000]), 16384, 4096)
    assert p.tolist() == [0.0, -0.5, -1.0, -1.0]
    r = outcome_reward(torch.tensor([True, False, True]), torch.tensor([100, 100, 18432]),
                       soft_overlong=True, expected_len=16384, cache_len=4096)
    assert r.tolist() == [1.0, -1.0, 0.5]
    r = outcome_reward(torch.tensor([True, False]), torch.tensor([30000, 30000]),
                       soft_overlong=False, expected_len=16384, cache_len=4096)
    assert r.tolist() == [1.0, -1.0]
