import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dapo.config import AlgoConfig
from dapo.rewards import (
    _NOT_UNITS,
    ANSWER_MARKER,
    config_reward,
    extract_answer,
    normalize_integer,
    outcome_reward,
    score_integer_answer,
    soft_overlong_penalty,
)


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
        # the marker: any case, spaces before the colon, markdown / LaTeX bold, last one wins
        ("answer: 42", 42),
        ("ANSWER: 42", 42),
        ("Answer : 42", 42),
        ("Final Answer:\t42", 42),
        ("**Answer:** 42", 42),
        ("**Answer**: 42", 42),
        ("\\textbf{Answer:} 42", 42),
        ("### Answer: 42", 42),
        ("answer: 5\nANSWER : 6", 6),
        # the answer on the next non-empty line, or in a display block opened there
        ("Answer:\n42", 42),
        ("Answer:\n\n42", 42),
        ("Answer: \n  \n $42$ \nthe end", 42),
        ("**Answer:**\n42", 42),
        ("Answer:\n\\[\n\\boxed{42}\n\\]", 42),
        ("Answer:\n$$\n42\n$$", 42),
        # dollars, degrees, units
        ("Answer: \\$50", 50),
        ("Answer: $\\$50$", 50),
        ("Answer: \\boxed{\\$1,050}", 1050),
        ("Answer: 90^\\circ", 90),
        ("Answer: $90^{\\circ}$", 90),
        ("Answer: 90°", 90),
        ("Answer: \\boxed{90^\\circ}.", 90),
        ("Answer: 42 degrees", 42),
        ("Answer: 50 dollars", 50),
        ("Answer: 12 \\text{ cm}", 12),
        ("Answer: 12\\,\\text{cm}", 12),
        ("Answer: 12 \\mbox{cm}", 12),
        ("Answer: 12 \\mathrm{~cm}^{2}", 12),
        ("Answer: 12 cm^2", 12),
        ("Answer: 8 square units", 8),
        ("Answer: 8 units squared", 8),
        ("Answer: 5 ways.", 5),
        ("Answer: 19 apples", 19),
        ("Answer: 60 miles per hour", 60),
        ("Answer: 3 \\text{m}", 3),
        ("Answer: 1,234 dollars", 1234),
        ("Answer: -5 degrees", -5),
        ("Answer: \\boxed{42} \\text{ cm}", 42),
        # other LaTeX spellings
        ("Answer: \\(42\\)", 42),
        ("Answer: \\( \\boxed{42} \\)", 42),
        ("Answer: \\[42\\]", 42),
        ("Answer: $\\mathbf{42}$", 42),
        ("Answer: \\textbf{42}", 42),
        ("Answer: 1\\,234", 1234),
        ("Answer: 062", 62),
        ("Answer: +42", 42),
        # a sentence around the only box / the only inline math span
        ("Answer: The final answer is $\\boxed{42}$.", 42),
        ("Answer: x = \\boxed{19}", 19),
        ("Final Answer: The final answer is $42$. I hope it is correct.", 42),
        ("Answer: there are \\(42\\) ways", 42),
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
        # kept rejections, now that units and sentences around a box are read
        ("Answer: x = 19", 19),
        ("Answer: $x = 19$", 19),
        ("Answer: x = 19 degrees", 19),
        ("Answer: 3, 4", 34),
        ("Answer: 3, 4", 3),
        ("Answer: 42 or 43", 42),
        ("Answer: $42$ or $43$", 42),
        ("Answer: 42 \\text{ or } 43", 42),
        ("Answer: \\boxed{42} or 43", 42),
        ("Answer: 2+17=\\boxed{19}", 19),
        ("Answer: 19.0", 19),
        ("Answer: 19.5 cm", 19),
        ("Answer: \\frac{38}{2}", 19),
        ("Answer: 2*3", 23),  # markdown is stripped at the ends only
        # words that change the number are not units
        ("Answer: 42 or more", 42),
        ("Answer: 5 squared", 5),
        ("Answer: 4 thousand", 4),
        ("Answer: 4 \\text{ thousand}", 4),
        ("Answer: 42 \\text{k}", 42),
        ("Answer: 5 and a half", 5),
        ("Answer: 2 \\pi", 2),
        ("Answer: 2 pi", 2),
        ("Answer: 2 i", 2),
        ("Answer: 42 percent", 42),
        ("Answer: 42\\%", 42),
        ("Answer: 42 is the answer", 42),
        ("Answer: 42 a b c", 42),  # single letters
        ("Answer: 42 aa bb cc dd", 42),  # more than three words
        ("Answer: 5x", 5),  # glued to the number: an expression, not a unit
        ("Answer: 12^2", 12),
        ("Answer: forty-two", 42),
        # markers
        ("The answer is: 42", 42),  # no marker, no box
        ("Answer: 42\nAnswer:", 42),  # the last marker is empty
        ("Answer:\n\nThe number of ways is 42.", 42),
        ("Answer:\n\\[\n42 + 1\n\\]", 42),
        ("Answer: 41\n\\boxed{42}", 42),  # the Answer: line wins over a box
    ],
)
def test_rejects_look_alikes(text, truth):
    assert not score_integer_answer(text, truth)


@given(st.text(), st.integers(-(10**6), 10**6))
def test_never_raises(text, truth):
    assert score_integer_answer(text, truth) in (True, False)


@given(st.integers(-(10**30), 10**30), st.sampled_from(["", "$", "**"]), st.booleans())
def test_roundtrip_any_integer(n, deco, period):
    s = f"{n:,}" if n % 2 else str(n)
    text = f"work\nAnswer: {deco}{s}{deco}{'.' if period else ''}"
    assert score_integer_answer(text, n)
    assert not score_integer_answer(text, n + 1)


@pytest.mark.parametrize(
    "raw,canonical",
    [
        ("42", "42"),
        ("+5", "5"),
        ("-5", "-5"),
        ("-0", "0"),
        ("+0", "0"),
        ("000", "0"),
        ("-007", "-7"),
        ("1\\,234", "1234"),
        ("1\\!234", "1234"),
        ("1{,}234", "1234"),
        ("\\text{42}", "42"),
        ("\\mathbf{-3}", "-3"),
        ("\\boxed{42}.", "42"),
        ("\\boxed{42.}", "42"),
        ("$-12$", "-12"),
        ("123456789}", None),
        ("5-", None),
        ("--5", None),
        ("4 2.5", None),
        ("1,23", None),
        ("0,123", None),
        ("1{,}23", None),
        ("1\\,23", None),
        ("12\\,345\\,678", "12345678"),
        ("1 234", "1234"),
        ("1234,567", None),
        ("-1,234", "-1234"),
        ("", None),
        (".", None),
    ],
)
def test_normalize_integer_known_values(raw, canonical):
    assert normalize_integer(raw) == canonical


@pytest.mark.parametrize(
    "text,raw",
    [
        ("Answer: 42\nThat is all.\nDone", " 42"),
        ("x\nAnswer:7", "7"),
        ("\\boxed{5}", "5"),
        ("\\boxed {7} and more", "7"),
        ("\\boxed  {8}", "8"),
        ("first \\boxed{3} then an unclosed \\boxed{", "3"),
        ("\\boxed{3} \\boxed{4} \\boxed{", "4"),
        ("\\boxed{3} \\boxed{", "3"),
        ("nothing here", None),
        ("Answer:\n\n  42  \nmore", "  42  "),
        ("ANSWER :7", "7"),
        ("**Answer**: 5", " 5"),
        ("\\textbf{Answer:} 6", " 6"),
        ("\\textbf{Final Answer:}\n8", "8"),
        ("Answer:\n\\[\n\\boxed{9}\n\\]\ntail", "\\boxed{9}\n"),
        ("Answer:\n\\[\n\\boxed{9}", "\\["),  # display block never closed
        ("Answer:", ""),
        ("Answer:  \n\n", ""),
        ("a \\boxed{1}\nAnswer: 2", " 2"),
    ],
)
def test_extract_answer_known_values(text, raw):
    assert extract_answer(text) == raw


def test_answer_marker_constant():
    assert ANSWER_MARKER == "Answer:"
    assert extract_answer(f"x\n{ANSWER_MARKER} 3") == " 3"


_UNITS = ["degrees", "dollars", "cm", "apples", "square units", "years old", "ways", "km", "miles per hour"]


@given(
    st.integers(-(10**12), 10**12),
    st.sampled_from(_UNITS),
    st.sampled_from(["{u}", "\\text{{ {u}}}", "\\mbox{{{u}}}"]),
)
def test_any_integer_with_a_unit(n, unit, form):
    text = f"work\nAnswer: {n:,} {form.format(u=unit)}"
    assert score_integer_answer(text, n)
    assert not score_integer_answer(text, n + 1)


@given(st.integers(0, 10**6), st.sampled_from(sorted(_NOT_UNITS)))
def test_no_word_that_changes_the_number_is_a_unit(n, word):
    assert not score_integer_answer(f"Answer: {n} {word}", n)
    assert not score_integer_answer(f"Answer: {n} \\text{{ {word}}}", n)


@given(
    st.integers(1, 10**6),
    st.integers(0, 10**6),
    st.sampled_from([" or ", ", ", " and ", " to ", "/", "+", " = ", " \\text{ or } ", "$ or $"]),
)
def test_two_numbers_are_never_one_answer(a, b, sep):
    text = f"Answer: {a}{sep}{b}"
    assert not score_integer_answer(text, a) and not score_integer_answer(text, b)


_PIECES = [
    "Answer",
    "answer",
    ":",
    " ",
    "\n",
    "\\boxed",
    "{",
    "}",
    "$",
    "\\(",
    "\\)",
    "\\[",
    "\\]",
    "1",
    "23",
    ",",
    "-",
    "+",
    ".",
    "**",
    "degrees",
    "\\text{",
    "^\\circ",
    "~",
    "\\,",
    "or",
]


@given(st.lists(st.sampled_from(_PIECES), max_size=40), st.integers(-50, 50))
def test_never_raises_on_answer_like_text(pieces, truth):
    text = "".join(pieces)
    assert score_integer_answer(text, truth) in (True, False)
    raw = extract_answer(text)
    assert raw is None or isinstance(raw, str)
    assert normalize_integer(text) is None or normalize_integer(text).lstrip("-").isdigit()


def test_sign_and_zero_matter():
    assert not score_integer_answer("Answer: -5", 5) and not score_integer_answer("Answer: 5", -5)
    assert score_integer_answer("Answer: -0", 0) and score_integer_answer("Answer: 0", "-0")


def test_bad_truth_raises():
    with pytest.raises(ValueError, match="^ground truth 'one' is not an integer$"):
        score_integer_answer("Answer: 1", "one")


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" * 100_000,
        "Answer:" * 100_000,
        "{" * 200_000 + "}" * 200_000,
        "1," * 200_000,
        "\\boxed" * 100_000,
        "Answer: " + "\\boxed{" * 50_000 + "}" * 50_000,
        "Answer: " + "\\text{" * 50_000 + "}" * 50_000 + " cm",
        "answer " * 100_000 + ":",
        "Answer **" * 100_000,
        "\\textbf{" * 100_000 + "Answer:",
        "Answer:\n" + "\\[\n" * 100_000,
        "Answer:" + "\n" * 200_000,
        "Answer: 1" + " a" * 100_000,
        "Answer: 1" + " degrees" * 50_000,
        "Answer: " + "9" * 200_000 + " degrees",
        "Answer: " + "$" * 200_000,
        "Answer: " + "\\(" * 100_000,
        "Answer: " + "1 " * 100_000 + "\\boxed{1}",
        "Answer: x" + "\\boxed{1}" * 50_000,
    ],
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
    assert p.tolist() == [0.0, -0.5, -1.0, -1.0] and p.dtype == torch.get_default_dtype()
    r = outcome_reward(
        torch.tensor([True, False, True]),
        torch.tensor([100, 100, 18432]),
        soft_overlong=True,
        expected_len=16384,
        cache_len=4096,
    )
    assert r.tolist() == [1.0, -1.0, 0.5]
    r = outcome_reward(
        torch.tensor([True, False]),
        torch.tensor([30000, 30000]),
        soft_overlong=False,
        expected_len=16384,
        cache_len=4096,
    )
    assert r.tolist() == [1.0, -1.0]


def test_penalty_factor_reaches_the_reward_and_config_knobs_are_used():
    r = outcome_reward(
        torch.tensor([1, 0]),
        torch.tensor([18432, 20480]),
        soft_overlong=True,
        expected_len=16384,
        cache_len=4096,
        factor=0.5,
    )
    assert r.tolist() == [0.75, -1.5]  # 0/1 integers are read as booleans
    cfg = AlgoConfig(expected_len=10, cache_len=4, overlong_penalty_factor=2.0)
    assert config_reward(torch.tensor([True, True, False]), torch.tensor([10, 12, 14]), cfg).tolist() == [
        1.0,
        0.0,
        -3.0,
    ]
    off = AlgoConfig(expected_len=10, cache_len=4, soft_overlong=False)
    assert config_reward(torch.tensor([True]), torch.tensor([14]), off).tolist() == [1.0]


@pytest.mark.parametrize("expected,cache", [(0, 4), (16, 0), (-1, -1)])
def test_penalty_needs_positive_lengths(expected, cache):
    with pytest.raises(ValueError, match="^expected_len and cache_len must be > 0$"):
        soft_overlong_penalty(torch.tensor([1]), expected, cache)
