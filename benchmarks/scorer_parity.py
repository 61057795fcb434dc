"""Parity of this project's reward scorer (``dapo.rewards.score_integer_answer``) with verl's
``math_dapo.compute_score``, the DAPO paper's reference scorer, on a corpus of model outputs.

    python benchmarks/scorer_parity.py --write-corpus   # regenerate the corpus, then compare
    python benchmarks/scorer_parity.py                  # compare on the committed corpus

The corpus (tests/data/scorer/corpus.jsonl) is generated here from a fixed seed: responses
in the style of Qwen2.5 math RL rollouts under DAPO's prompt (step-by-step reasoning, then
the final answer), in the answer formats seen in practice. Two parts:

* ``main``: the formats the prompt asks for, drawn with weights that estimate their share
  in rollouts (``MAIN_FORMATS``), about 55% of them correct;
* ``edge``: a few rows of every other format (``EDGE_FORMATS``): trailing periods, markdown,
  units, LaTeX spellings, equations, several values, truncations, text after the answer...

Each row is ``{"id", "text", "truth", "well_formed", "readable", "kind", "stated", "note"}``
(``stated``: the integer the response gives as its final answer, right or wrong):

* ``well_formed``: the response does what DAPO's prompt asks ("The last line of your
  response should be of the form Answer: $Answer", see ``WELL_FORMED``);
* ``readable``: wider: a careful grader reads exactly one integer from the final answer the
  response marks, whatever the decoration (see ``READABLE``).

Both scorers get the row's ``truth`` as a string (DAPO-Math-17k's ground truths are
strings). Writes reports/scorer/parity.md and parity.json; exits 1 when well-formed
agreement is below 99%, when a disagreement has no justification in ``JUSTIFIED`` or
when a justification is stale (its row now agrees), and 2 when verl is missing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dapo.rewards import extract_answer, normalize_integer, score_integer_answer  # noqa: E402

CORPUS = ROOT / "tests/data/scorer/corpus.jsonl"
OUT = ROOT / "reports/scorer"
SEED = 20250317
WELL_FORMED = (
    "the response is complete and follows DAPO's prompt (\"The last line of your response "
    "should be of the form Answer: $Answer ... Remember to put your answer on its own line "
    "after 'Answer:'\"): its last non-empty line is `Answer: A` (the marker in any case, "
    "spaces allowed before the colon), or `A` alone after a line `Answer:`; and `A` is one "
    "integer in a plain form: `n`, `$n$`, `\\boxed{n}` or `$\\boxed{n}$`, with `n` an optional "
    "`-`, digits without leading zeros, optionally grouped in threes by `,` or `{,}`. Nothing "
    "else on the answer (no period, markdown, unit, `\\(...\\)`, words). A response without "
    "`Answer:` (a final `\\boxed{}` only) is not well-formed: it ignores the prompt's format."
)
READABLE = (
    "the response marks a final answer (an `Answer:` or a `\\boxed{}`) from which a careful "
    "grader reads exactly one integer without doubt, whatever the decoration (units, `42.`, "
    "`**42**`, `\\(42\\)`, `1\\,234`, a final box without `Answer:`, text after the answer)."
)
MIN_WELL_FORMED_AGREEMENT = 0.99
N_MAIN = 300
VERL_MISSING = "verl is not installed: pip install --no-deps verl==0.9.1 (then rerun)"

# ---- problems ---------------------------------------------------------------------------------


@dataclass
class Problem:
    """One synthetic problem: its answer, a step-by-step solution ending in any value, and
    the units a model might attach to the answer."""

    truth: int
    solve: Callable[[int], str]
    units: tuple[str, ...] = ()
    """Unit words a response may append (``degrees``, ``square units``...)."""
    text_unit: str = ""
    """The same as a LaTeX unit (``\\text{ cm}``, ``^\\circ``), or empty."""


def _fmt(v: int) -> str:
    return f"({v})" if v < 0 else str(v)


def p_arith_series(r: random.Random) -> Problem:
    a, d, n = r.randint(-5, 20), r.randint(2, 9), r.randint(8, 40)
    s = n * (2 * a + (n - 1) * d) // 2

    def solve(v: int) -> str:
        return (
            f"To find the sum of the first {n} terms of the arithmetic sequence with first term {a} and "
            f"common difference {d}, we use the formula for the sum of an arithmetic series:\n\n"
            f"\\[\nS_n = \\frac{{n}}{{2}} \\left(2a + (n-1)d\\right)\n\\]\n\n"
            f"Here, \\(a = {a}\\), \\(d = {d}\\), and \\(n = {n}\\). Substituting these values:\n\n"
            f"\\[\nS_{{{n}}} = \\frac{{{n}}}{{2}} \\left(2 \\cdot {_fmt(a)} + {n - 1} \\cdot {d}\\right)"
            f" = \\frac{{{n}}}{{2}} \\cdot {2 * a + (n - 1) * d} = {v}\n\\]\n\n"
            f"So the sum of the first {n} terms is {v}."
        )

    return Problem(s, solve)


def p_polygon(r: random.Random) -> Problem:
    n = r.randint(5, 40)

    def solve(v: int) -> str:
        return (
            f"The sum of the interior angles of a polygon with \\(n\\) sides is given by the formula "
            f"\\((n-2) \\times 180^\\circ\\).\n\nFor a polygon with {n} sides:\n\n"
            f"\\[\n(n - 2) \\times 180 = ({n} - 2) \\times 180 = {n - 2} \\times 180 = {v}\n\\]\n\n"
            f"Therefore, the sum of the interior angles is {v} degrees."
        )

    return Problem((n - 2) * 180, solve, ("degrees",), "^\\circ")


def p_triangle(r: random.Random) -> Problem:
    a, b = r.randint(20, 80), r.randint(20, 80)

    def solve(v: int) -> str:
        return (
            f"In triangle \\(ABC\\), we know \\(\\angle A = {a}^\\circ\\) and \\(\\angle B = {b}^\\circ\\).\n\n"
            f"Step 1: The angles of a triangle add up to \\(180^\\circ\\):\n\\[\n\\angle A + \\angle B + "
            f"\\angle C = 180^\\circ\n\\]\n\nStep 2: Solve for \\(\\angle C\\):\n\\[\n\\angle C = 180^\\circ - "
            f"{a}^\\circ - {b}^\\circ = {v}^\\circ\n\\]\n\nThus \\(\\angle C\\) measures {v} degrees."
        )

    return Problem(180 - a - b, solve, ("degrees",), "^\\circ")


def p_shopping(r: random.Random) -> Problem:
    price, qty, fee = r.randint(3, 60), r.randint(2, 30), r.randint(0, 25)

    def solve(v: int) -> str:
        return (
            f"Let's break down the cost step by step.\n\n1. **Cost of the notebooks**: Each notebook costs "
            f"\\${price} and Maria buys {qty} of them, so the cost is \\({qty} \\times {price} = {qty * price}\\) "
            f"dollars.\n2. **Shipping fee**: The store charges a flat fee of \\${fee}.\n3. **Total cost**: "
            f"\\[\n{qty * price} + {fee} = {v}\n\\]\n\nSo Maria pays {v} dollars in total."
        )

    return Problem(price * qty + fee, solve, ("dollars",), "\\$")


def p_rectangle(r: random.Random) -> Problem:
    w, h = r.randint(3, 45), r.randint(3, 45)

    def solve(v: int) -> str:
        return (
            f"The rectangle has length \\({w}\\) cm and width \\({h}\\) cm. The area of a rectangle is the "
            f"product of its length and width:\n\n\\[\n\\text{{Area}} = \\text{{length}} \\times "
            f"\\text{{width}} = {w} \\times {h} = {v}\n\\]\n\nTherefore, the area of the rectangle is "
            f"{v} square centimeters."
        )

    return Problem(w * h, solve, ("square units", "square centimeters"), "\\text{ cm}^2")


def p_perimeter(r: random.Random) -> Problem:
    sides = [r.randint(4, 30) for _ in range(r.randint(3, 6))]

    def solve(v: int) -> str:
        terms = " + ".join(map(str, sides))
        return (
            f"The perimeter of a polygon is the sum of the lengths of its sides. The sides measure "
            f"{', '.join(map(str, sides))} centimeters, so\n\n\\[\nP = {terms} = {v}\n\\]\n\n"
            f"The perimeter is {v} cm."
        )

    return Problem(sum(sides), solve, ("cm", "centimeters"), "\\text{ cm}")


def p_choose(r: random.Random) -> Problem:
    n = r.randint(6, 22)
    k = r.randint(2, min(7, n - 2))

    def solve(v: int) -> str:
        return (
            f"We need to choose {k} members out of {n} people, and the order of selection does not "
            f"matter. This is a combination problem:\n\n\\[\n\\binom{{{n}}}{{{k}}} = "
            f"\\frac{{{n}!}}{{{k}! \\, ({n}-{k})!}}\n\\]\n\nComputing step by step, we get\n\n"
            f"\\[\n\\binom{{{n}}}{{{k}}} = {v}\n\\]\n\nHence there are {v} ways to form the committee."
        )

    return Problem(math.comb(n, k), solve, ("ways",), "\\text{ ways}")


def p_linear(r: random.Random) -> Problem:
    x = r.randint(-40, 40)
    a = r.choice([2, 3, 4, 5, 6, 7, 9, 11])
    b = r.randint(-30, 30)
    c = a * x + b

    def solve(v: int) -> str:
        return (
            f"We solve the equation \\({a}x + {_fmt(b)} = {c}\\) for \\(x\\).\n\n"
            f"First, subtract {_fmt(b)} from both sides:\n\\[\n{a}x = {c} - {_fmt(b)} = {c - b}\n\\]\n\n"
            f"Then divide both sides by {a}:\n\\[\nx = \\frac{{{c - b}}}{{{a}}} = {v}\n\\]\n\n"
            f"Let's verify: \\({a} \\cdot {_fmt(v)} + {_fmt(b)} = {a * v + b}\\)."
        )

    return Problem(x, solve)


def p_lcm(r: random.Random) -> Problem:
    a, b = r.randint(6, 90), r.randint(6, 90)
    lcm = a * b // math.gcd(a, b)

    def solve(v: int) -> str:
        return (
            f"To find the least common multiple of {a} and {b}, we first find their greatest common "
            f"divisor using the Euclidean algorithm: \\(\\gcd({a}, {b}) = {math.gcd(a, b)}\\).\n\n"
            f"Then\n\\[\n\\operatorname{{lcm}}({a}, {b}) = \\frac{{{a} \\cdot {b}}}{{\\gcd({a}, {b})}} = "
            f"\\frac{{{a * b}}}{{{math.gcd(a, b)}}} = {v}\n\\]"
        )

    return Problem(lcm, solve)


def p_modpow(r: random.Random) -> Problem:
    a, k, m = r.randint(2, 19), r.randint(20, 400), r.choice([7, 9, 11, 13, 17, 100, 1000])

    def solve(v: int) -> str:
        return (
            f"We want the remainder when \\({a}^{{{k}}}\\) is divided by {m}.\n\nThe powers of {a} "
            f"modulo {m} repeat with some period, so we look for a cycle. Computing successive powers "
            f"and reducing each time, we find that the sequence of remainders is periodic. Reducing "
            f"the exponent {k} modulo the period and evaluating, we obtain\n\n\\[\n{a}^{{{k}}} \\equiv "
            f"{v} \\pmod{{{m}}}\n\\]\n\nSo the remainder is {v}."
        )

    return Problem(pow(a, k, m), solve)


def p_divisors(r: random.Random) -> Problem:
    exps = [r.randint(1, 5) for _ in range(r.randint(2, 4))]
    primes = [2, 3, 5, 7][: len(exps)]
    n = math.prod(p**e for p, e in zip(primes, exps))

    def solve(v: int) -> str:
        fact = " \\cdot ".join(f"{p}^{{{e}}}" for p, e in zip(primes, exps))
        prod = " \\times ".join(f"({e}+1)" for e in exps)
        return (
            f"First, we find the prime factorization of {n}:\n\\[\n{n} = {fact}\n\\]\n\nThe number of "
            f"positive divisors is the product of one more than each exponent:\n\\[\n{prod} = {v}\n\\]\n\n"
            f"So {n} has {v} positive divisors."
        )

    return Problem(math.prod(e + 1 for e in exps), solve, ("divisors", "positive divisors"))


def p_sum_squares(r: random.Random) -> Problem:
    n = r.randint(10, 60)

    def solve(v: int) -> str:
        return (
            f"We use the formula for the sum of the first \\(n\\) squares:\n\\[\n\\sum_{{k=1}}^{{n}} k^2 = "
            f"\\frac{{n(n+1)(2n+1)}}{{6}}\n\\]\n\nWith \\(n = {n}\\):\n\\[\n\\frac{{{n} \\cdot {n + 1} \\cdot "
            f"{2 * n + 1}}}{{6}} = \\frac{{{n * (n + 1) * (2 * n + 1)}}}{{6}} = {v}\n\\]"
        )

    return Problem(n * (n + 1) * (2 * n + 1) // 6, solve)


def p_age(r: random.Random) -> Problem:
    son = r.randint(4, 20)
    k = r.randint(2, 4)
    father = k * son

    def solve(v: int) -> str:
        return (
            f"Let the son's age be \\(s\\) years. The father is {k} times as old, so his age is "
            f"\\({k}s\\). Together their ages add up to {father + son} years:\n\\[\ns + {k}s = "
            f"{father + son} \\implies {k + 1}s = {father + son} \\implies s = {son}\n\\]\n\nThe father "
            f"is therefore \\({k} \\times {son} = {v}\\) years old."
        )

    return Problem(father, solve, ("years", "years old"), "\\text{ years}")


def p_handshakes(r: random.Random) -> Problem:
    n = r.randint(5, 80)

    def solve(v: int) -> str:
        return (
            f"Each of the {n} people shakes hands with every other person exactly once. Every "
            f"handshake involves 2 people, so the number of handshakes is\n\\[\n\\binom{{{n}}}{{2}} = "
            f"\\frac{{{n} \\cdot {n - 1}}}{{2}} = {v}\n\\]"
        )

    return Problem(n * (n - 1) // 2, solve, ("handshakes",))


def p_distance(r: random.Random) -> Problem:
    speed, hours = r.randint(30, 75), r.randint(2, 9)

    def solve(v: int) -> str:
        return (
            f"The train travels at a constant speed of {speed} miles per hour for {hours} hours. "
            f"Distance equals speed times time:\n\\[\nd = {speed} \\times {hours} = {v}\n\\]\n\n"
            f"So the train covers {v} miles."
        )

    return Problem(speed * hours, solve, ("miles",), "\\text{ miles}")


def p_minutes(r: random.Random) -> Problem:
    h, m = r.randint(1, 12), r.randint(0, 59)

    def solve(v: int) -> str:
        return (
            f"There are 60 minutes in an hour, so {h} hours and {m} minutes is\n\\[\n{h} \\times 60 + "
            f"{m} = {h * 60} + {m} = {v}\n\\]\nminutes in total."
        )

    return Problem(60 * h + m, solve, ("minutes",), "\\text{ minutes}")


def p_multiples(r: random.Random) -> Problem:
    n, k = r.randint(100, 5000), r.randint(3, 17)

    def solve(v: int) -> str:
        return (
            f"We count the positive integers less than or equal to {n} that are divisible by {k}. "
            f"These are \\({k}, {2 * k}, {3 * k}, \\ldots\\), and the largest is "
            f"\\({k} \\cdot \\lfloor {n}/{k} \\rfloor\\). Hence the count is\n\\[\n\\left\\lfloor "
            f"\\frac{{{n}}}{{{k}}} \\right\\rfloor = {v}\n\\]"
        )

    return Problem(n // k, solve, ("integers", "numbers"))


def p_roots(r: random.Random) -> Problem:
    r1, r2 = r.randint(-15, 15), r.randint(-15, 15)
    b, c = -(r1 + r2), r1 * r2

    def solve(v: int) -> str:
        return (
            f"Consider the quadratic \\(x^2 + {_fmt(b)}x + {_fmt(c)} = 0\\). By Vieta's formulas, the "
            f"product of the roots is \\(c/a\\):\n\\[\nr_1 r_2 = \\frac{{{c}}}{{1}} = {v}\n\\]\n\n"
            f"We can check by factoring: \\((x - {_fmt(r1)})(x - {_fmt(r2)}) = 0\\)."
        )

    return Problem(c, solve)


def p_seconds(r: random.Random) -> Problem:
    d = r.randint(2, 30)

    def solve(v: int) -> str:
        return (
            f"One day has 24 hours, each hour has 60 minutes and each minute has 60 seconds, so one "
            f"day has \\(24 \\times 60 \\times 60 = 86400\\) seconds. For {d} days:\n\\[\n{d} \\times 86400 "
            f"= {v}\n\\]"
        )

    return Problem(86400 * d, solve, ("seconds",), "\\text{ s}")


def p_poly_neg(r: random.Random) -> Problem:
    a, b, c, x = r.randint(1, 6), r.randint(-9, 9), r.randint(-20, 20), r.randint(-6, -1)
    val = a * x**3 + b * x + c

    def solve(v: int) -> str:
        return (
            f"We evaluate \\(f(x) = {a}x^3 + {_fmt(b)}x + {_fmt(c)}\\) at \\(x = {x}\\):\n\\[\nf({x}) = "
            f"{a}({x})^3 + {_fmt(b)}({x}) + {_fmt(c)} = {a * x**3} + {_fmt(b * x)} + {_fmt(c)} = {v}\n\\]"
        )

    return Problem(val, solve)


def p_digit_sum(r: random.Random) -> Problem:
    k = r.randint(10, 60)
    n = 2**k

    def solve(v: int) -> str:
        return (
            f"We compute \\(2^{{{k}}} = {n}\\). Adding its digits one at a time:\n\\[\n"
            f"{' + '.join(str(n))} = {v}\n\\]"
        )

    return Problem(sum(map(int, str(n))), solve)


def p_probability(r: random.Random) -> Problem:
    red, blue = r.randint(2, 12), r.randint(2, 12)
    tot = red + blue
    num, den = red * (red - 1), tot * (tot - 1)
    g = math.gcd(num, den)
    m, n = num // g, den // g

    def solve(v: int) -> str:
        return (
            f"A bag has {red} red and {blue} blue marbles. Two are drawn without replacement. The "
            f"probability that both are red is\n\\[\n\\frac{{{red}}}{{{tot}}} \\cdot \\frac{{{red - 1}}}"
            f"{{{tot - 1}}} = \\frac{{{num}}}{{{den}}} = \\frac{{{m}}}{{{n}}}\n\\]\n\nThis fraction is in "
            f"lowest terms, so \\(m = {m}\\) and \\(n = {n}\\), and \\(m + n = {v}\\)."
        )

    return Problem(m + n, solve)


def p_students(r: random.Random) -> Problem:
    total, pct = (
        r.choice([40, 60, 80, 120, 200, 240, 300, 1200, 2400]),
        r.choice([10, 15, 20, 25, 30, 45, 60, 75]),
    )

    def solve(v: int) -> str:
        return (
            f"The school has {total} students, and {pct}\\% of them play chess. The number of students "
            f"who play chess is\n\\[\n\\frac{{{pct}}}{{100}} \\times {total} = {v}\n\\]"
        )

    return Problem(total * pct // 100, solve, ("students",), "\\text{ students}")


def p_big_product(r: random.Random) -> Problem:
    a, b = r.randint(101, 9999), r.randint(11, 999)

    def solve(v: int) -> str:
        return (
            f"Each crate holds {b} bottles and the warehouse has {a} crates. Multiplying,\n\\[\n{a} "
            f"\\times {b} = {v}\n\\]\n\nThe warehouse holds {v} bottles."
        )

    return Problem(a * b, solve, ("bottles",))


PROBLEMS = [
    p_arith_series,
    p_polygon,
    p_triangle,
    p_shopping,
    p_rectangle,
    p_perimeter,
    p_choose,
    p_linear,
    p_lcm,
    p_modpow,
    p_divisors,
    p_sum_squares,
    p_age,
    p_handshakes,
    p_distance,
    p_minutes,
    p_multiples,
    p_roots,
    p_seconds,
    p_poly_neg,
    p_digit_sum,
    p_probability,
    p_students,
    p_big_product,
]
UNIT_PROBLEMS = [p for p in PROBLEMS if p(random.Random(0)).units]

OPENINGS = [
    "",
    "Let's solve this step by step.\n\n",
    "To solve the problem, we proceed as follows.\n\n",
    "We need to carefully work through this problem.\n\n",
]
CLOSINGS_BOXED = [
    "Therefore, the final answer is $\\boxed{{{a}}}$.",
    "The final answer is \\(\\boxed{{{a}}}\\).",
    "Thus, the answer is:\n\\[\n\\boxed{{{a}}}\n\\]",
    "So the answer is \\boxed{{{a}}}.",
    "\\[\n\\boxed{{{a}}}\n\\]",
]
REFLECTION = (
    "Wait, let me double-check this computation, because it is easy to make an arithmetic slip "
    "here. Going back over each step: the setup is right, the formula applies, and substituting "
    "the values again gives the same intermediate results. I also checked the edge cases, and "
    "none of them changes the count. Everything is consistent with the result above, so I am "
    "confident in it. As a final sanity check, the magnitude is reasonable for the problem."
)


def _grouped(v: int, sep: str) -> str:
    s = f"{abs(v):,}".replace(",", sep)
    return ("-" if v < 0 else "") + s


def _int(a: str) -> int:
    """The value of a rendered number (``-1,234``, ``1{,}234``, ``1\\,234``)."""
    return int(a.replace("{,}", "").replace("\\,", "").replace(",", ""))


def _wrong(r: random.Random, truth: int) -> int:
    for _ in range(20):
        w = r.choice(
            [
                truth + 1,
                truth - 1,
                truth + 2,
                truth * 2,
                truth + 10,
                -truth,
                truth // 2,
                truth + r.randint(3, 50),
            ]
        )
        if w != truth:
            return w
    return truth + 1


# ---- formats ----------------------------------------------------------------------------------
# A format renders the end of a response given the number as text. `well`/`readable` are the
# row's labels (see the module docstring); a format is either both, readable only, or neither.


@dataclass
class Format:
    kind: str
    render: Callable[[random.Random, str, Problem], str]
    well: bool
    readable: bool
    note: str
    weight: float = 1.0
    units: bool = False
    """Needs a problem with units."""


def _line(prefix: str, body: str) -> Callable[[random.Random, str, Problem], str]:
    return lambda r, a, p: prefix + body.format(a=a)


MAIN_FORMATS = [
    Format("bare", _line("", "Answer: {a}"), True, True, "plain answer line", 48),
    Format("dollar", _line("", "Answer: ${a}$"), True, True, "answer in inline math", 12),
    Format("boxed", _line("", "Answer: \\boxed{{{a}}}"), True, True, "boxed on the answer line", 6),
    Format("dollar_boxed", _line("", "Answer: $\\boxed{{{a}}}$"), True, True, "boxed in inline math", 7),
    Format("own_line", _line("", "Answer:\n{a}"), True, True, "answer alone on the line after 'Answer:'", 4),
    Format("own_line_blank", _line("", "Answer:\n\n{a}"), True, True, "answer after a blank line", 1),
    Format(
        "case",
        lambda r, a, p: r.choice(
            ["ANSWER: {a}", "answer: {a}", "Answer : {a}", "Final Answer: {a}", "Final answer: ${a}$"]
        ).format(a=a),
        True,
        True,
        "marker in another case / spacing",
        4,
    ),
    Format(
        "self_correct",
        lambda r, a, p: (
            f"Answer: {r.randint(2, 99)}\n\n{REFLECTION[:120]} Actually, I made a mistake above; correcting it:\n\nAnswer: {a}"
        ),
        True,
        True,
        "two Answer lines, the last one corrects the first",
        3,
    ),
    Format(
        "boxed_only",
        lambda r, a, p: r.choice(CLOSINGS_BOXED).format(a=a),
        False,
        True,
        "no Answer line; final box",
        15,
    ),
]


def _unit_word(r: random.Random, a: str, p: Problem) -> str:
    return f"Answer: {a} {r.choice(p.units)}"


def _tail_text(r: random.Random, a: str, p: Problem) -> str:
    return f"Answer: {a}\n\n{REFLECTION}"


def _truncate(text: str, r: random.Random) -> str:
    cut = r.randint(len(text) // 3, max(len(text) // 3 + 1, len(text) - 20))
    return text[:cut]


# Edge formats: (format, rows). Units are attached only to problems that have units.
EDGE_FORMATS: list[tuple[Format, int]] = [
    (Format("period", _line("", "Answer: {a}."), False, True, "trailing period"), 8),
    (Format("dollar_period", _line("", "Answer: ${a}$."), False, True, "inline math, then a period"), 4),
    (Format("bold_value", _line("", "Answer: **{a}**"), False, True, "markdown bold answer"), 6),
    (Format("bold_marker", _line("", "**Answer:** {a}"), False, True, "markdown bold marker"), 6),
    (Format("bold_marker_out", _line("", "**Answer**: {a}"), False, True, "bold marker, colon outside"), 4),
    (Format("textbf_marker", _line("", "\\textbf{{Answer:}} {a}"), False, True, "LaTeX bold marker"), 3),
    (Format("heading_marker", _line("", "### Answer: {a}"), False, True, "markdown heading"), 3),
    (Format("paren", _line("", "Answer: \\({a}\\)"), False, True, "\\( \\) inline math"), 6),
    (Format("paren_boxed", _line("", "Answer: \\(\\boxed{{{a}}}\\)"), False, True, "boxed in \\( \\)"), 4),
    (Format("mathbf", _line("", "Answer: $\\mathbf{{{a}}}$"), False, True, "\\mathbf"), 3),
    (Format("textbf_value", _line("", "Answer: \\textbf{{{a}}}"), False, True, "\\textbf value"), 2),
    (
        Format(
            "display_block",
            _line("", "Answer:\n\\[\n\\boxed{{{a}}}\n\\]"),
            False,
            True,
            "display block after the marker",
        ),
        4,
    ),
    (Format("unit_word", _unit_word, False, True, "integer then a unit word", units=True), 20),
    (
        Format(
            "unit_text",
            lambda r, a, p: (
                f"Answer: {a}{p.text_unit}"
                if p.text_unit and p.text_unit != "\\$"
                else f"Answer: {a} \\text{{ {p.units[0]}}}"
            ),
            False,
            True,
            "LaTeX unit",
            units=True,
        ),
        12,
    ),
    (
        Format(
            "degree_mark",
            lambda r, a, p: r.choice(
                [
                    "Answer: {a}^\\circ",
                    "Answer: ${a}^{{\\circ}}$",
                    "Answer: {a}°",
                    "Answer: \\boxed{{{a}^\\circ}}",
                ]
            ).format(a=a),
            False,
            True,
            "degree mark",
        ),
        6,
    ),
    (
        Format(
            "currency",
            lambda r, a, p: r.choice(
                ["Answer: \\${a}", "Answer: $\\${a}$", "Answer: \\boxed{{\\${a}}}"]
            ).format(a=a),
            False,
            True,
            "escaped dollar sign",
        ),
        5,
    ),
    (
        Format(
            "unit_squared",
            lambda r, a, p: r.choice(
                ["Answer: {a} cm^2", "Answer: ${a}\\,\\text{{cm}}^2$", "Answer: {a} \\mathrm{{~cm}}^{{2}}"]
            ).format(a=a),
            False,
            True,
            "squared unit",
        ),
        4,
    ),
    (
        Format(
            "thin_space", lambda r, a, p: f"Answer: {a}", False, True, "1\\,234 grouping (big answers only)"
        ),
        5,
    ),
    (Format("leading_plus", _line("", "Answer: +{a}"), False, True, "leading plus sign"), 2),
    (
        Format(
            "leading_zeros",
            lambda r, a, p: f"Answer: {_int(a):03d}" if a.isdigit() else f"Answer: {a}",
            False,
            True,
            "AIME-style 3 digits",
        ),
        4,
    ),
    (
        Format(
            "boxed_spaces", _line("\\[\n", "\\boxed{{ {a} }}\n\\]"), False, True, "spaces inside the only box"
        ),
        4,
    ),
    (
        Format(
            "boxed_then_text",
            lambda r, a, p: f"The final answer is $\\boxed{{{a}}}$.\n\n{REFLECTION}",
            False,
            True,
            "box, then >100 characters",
        ),
        4,
    ),
    (Format("text_after", _tail_text, False, True, "answer line, then >300 characters"), 6),
    (
        Format(
            "short_text_after",
            _line("", "Answer: {a}\n\nI hope it is correct."),
            False,
            True,
            "answer line, then a short remark",
        ),
        3,
    ),
    (
        Format(
            "minerva",
            _line("", "Final Answer: The final answer is ${a}$. I hope it is correct."),
            False,
            True,
            "Minerva's sentence",
        ),
        4,
    ),
    (
        Format(
            "sentence_box",
            _line("", "Answer: The final answer is $\\boxed{{{a}}}$."),
            False,
            True,
            "sentence around one box",
        ),
        3,
    ),
    (Format("equation", _line("", "Answer: x = {a}"), False, False, "an equation, not a value"), 5),
    (
        Format(
            "equation_expr",
            lambda r, a, p: f"Answer: {_int(a) - 7} + 7 = {a}",
            False,
            False,
            "a computation ending in the value",
        ),
        3,
    ),
    (
        Format(
            "two_values",
            lambda r, a, p: (
                f"Answer: {str(_int(a))[:-1]}, {str(_int(a))[-1]}"
                if abs(_int(a)) >= 10
                else f"Answer: {a}, {a}"
            ),
            False,
            False,
            "two values (truth may be their concatenation)",
        ),
        4,
    ),
    (
        Format(
            "or_values", lambda r, a, p: f"Answer: {a} or {_int(a) + 1}", False, False, "two candidate values"
        ),
        3,
    ),
    (
        Format(
            "or_dollars",
            lambda r, a, p: f"Answer: ${a}$ or ${_int(a) + 1}$",
            False,
            False,
            "two candidates in inline math",
        ),
        3,
    ),
    (
        Format(
            "two_boxes",
            lambda r, a, p: f"Answer: \\boxed{{{a}}} \\boxed{{{_int(a) + 1}}}",
            False,
            False,
            "two boxes",
        ),
        2,
    ),
    (Format("decimal", _line("", "Answer: {a}.0"), False, False, "decimal form"), 3),
    (Format("percent", _line("", "Answer: {a}\\%"), False, False, "percent sign"), 3),
    (
        Format(
            "scale_word", _line("", "Answer: {a} thousand"), False, False, "a word that scales the number"
        ),
        2,
    ),
    (
        Format(
            "words",
            lambda r, a, p: "Answer: " + r.choice(["forty-two", "twelve", "seven"]),
            False,
            False,
            "number in words",
        ),
        2,
    ),
    (
        Format(
            "no_marker", lambda r, a, p: f"So the final result is {a}.", False, False, "no marker and no box"
        ),
        5,
    ),
    (
        Format("answer_is", lambda r, a, p: f"The answer is: {a}", False, False, "'answer is:' is no marker"),
        3,
    ),
    (Format("empty_marker", _line("", "Answer:"), False, False, "truncated right after the marker"), 3),
    (Format("truncated", lambda r, a, p: "", False, False, "cut off mid-reasoning"), 8),
    (
        Format(
            "truncated_after_answer",
            lambda r, a, p: f"Answer: {a}\n\n{REFLECTION} {REFLECTION[: r.randint(40, 200)]}",
            False,
            False,
            "an early answer line, then reflection cut off",
        ),
        5,
    ),
    (
        Format(
            "unclosed_box",
            lambda r, a, p: f"Therefore, the final answer is $\\boxed{{{a}",
            False,
            False,
            "cut off inside the box",
        ),
        3,
    ),
]


def _number(r: random.Random, v: int, kind: str) -> str:
    if kind == "thin_space":
        return _grouped(v, "\\,")
    if abs(v) >= 1000:
        style = r.choices(["", ",", "{,}"], weights=[60, 30, 10])[0]
        return _grouped(v, style) if style else str(v)
    return str(v)


def _response(r: random.Random, fmt: Format, prob: Problem, correct: bool) -> tuple[str, int]:
    value = prob.truth if correct else _wrong(r, prob.truth)
    body = r.choice(OPENINGS) + prob.solve(value)
    if fmt.kind == "truncated":
        return _truncate(body, r), value
    return body + "\n\n" + fmt.render(r, _number(r, value, fmt.kind), prob), value


def build_corpus(seed: int = SEED) -> list[dict[str, Any]]:
    """The corpus rows, a pure function of ``seed``."""
    r = random.Random(seed)
    rows: list[dict[str, Any]] = []
    weights = [f.weight for f in MAIN_FORMATS]
    counts: Counter[str] = Counter()

    def add(fmt: Format, prob: Problem, correct: bool) -> None:
        text, value = _response(r, fmt, prob, correct)
        rows.append(
            {
                "id": f"{fmt.kind}-{counts[fmt.kind]:03d}",
                "text": text,
                "truth": prob.truth,
                "well_formed": fmt.well,
                "readable": fmt.readable,
                "kind": fmt.kind,
                "stated": value,
                "note": f"{fmt.note}; states {value} ({'correct' if value == prob.truth else 'wrong'})",
            }
        )
        counts[fmt.kind] += 1

    for _ in range(N_MAIN):
        fmt = r.choices(MAIN_FORMATS, weights=weights)[0]
        add(fmt, r.choice(PROBLEMS)(r), r.random() < 0.55)
    for fmt, n in EDGE_FORMATS:
        for i in range(n):
            if fmt.units:
                prob = r.choice(UNIT_PROBLEMS)(r)
            elif fmt.kind == "thin_space":
                prob = r.choice([p_big_product, p_seconds])(r)
            elif fmt.kind == "leading_zeros":
                prob = r.choice([p_triangle, p_divisors, p_modpow])(r)
            else:
                prob = r.choice(PROBLEMS)(r)
            add(fmt, prob, i % 4 != 3)  # three in four correct: the interesting case for parsing
    return rows


def write_corpus(path: Path = CORPUS, seed: int = SEED) -> list[dict[str, Any]]:
    rows = build_corpus(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return rows


def load_corpus(path: Path = CORPUS) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---- justifications ---------------------------------------------------------------------------
# Every row on which the two scorers disagree, by id, with who is right and why. The script
# fails when a disagreement is missing here, or when a listed row no longer disagrees.

REASONS: dict[str, tuple[str, str]] = {
    "verl-box-raw": (
        "ours",
        "no `Answer:` line, so verl falls back to its strict-box check, which compares the box's raw "
        "content with the ground truth, unnormalised: `1,314` != `1314`, ` 70 ` != `70`",
    ),
    "verl-window": (
        "ours",
        "verl reads only the last 300 characters (boxes: the last 100); the answer line or box is "
        "followed by a longer remark, so verl finds no answer at all",
    ),
    "verl-period": ("ours", "verl keeps a trailing period (`126.` != `126`); it ends the sentence"),
    "verl-markdown": (
        "ours",
        "verl does not strip markdown bold: `**24**`, `**Answer:** 13` -> `**13`, and `**Answer**:` "
        "does not match its `Answer\\s*:` at all",
    ),
    "verl-textbf-marker": (
        "ours",
        "`\\textbf{Answer:} 1722`: verl keeps the marker's closing brace (`}1722`)",
    ),
    "verl-paren-math": ("ours", "verl strips `$...$` but not the other inline-math delimiters `\\(...\\)`"),
    "verl-mathbf": ("ours", "verl unwraps `\\text{}`, `\\textbf{}`, `\\boxed{}` but not `\\mathbf{}`"),
    "verl-display": (
        "ours",
        "`Answer:` then a display block: verl's `\\s*` skips the newline and captures the opener line `\\[`",
    ),
    "verl-unit-list": (
        "ours",
        "verl removes only a fixed list of unit words (degrees, dollars, cm, ways, students, ...); "
        "`handshakes`, `years old`, `numbers`, `miles`, `positive divisors` are not on it",
    ),
    "verl-degree-sign": ("ours", "verl removes `^\\circ` and `^{\\circ}` but not the degree sign `°`"),
    "verl-unit-power": (
        "ours",
        "verl removes `cm` but leaves the power (`1820 cm^2` -> `1820^2`; `\\mathrm{~cm}^{2}` -> "
        "`104\\mathrm{~}^{2}`)",
    ),
    "verl-thin-space": (
        "ours",
        "`\\,` (a LaTeX thin space) groups thousands; verl removes `{,}` and `,\\!` but not `\\,`",
    ),
    "verl-sign-zeros": (
        "ours",
        "`+198` and `062` (AIME's three digits) are 198 and 62; verl compares the strings",
    ),
    "equation": (
        "both defensible",
        "verl keeps what follows the last `=` (`x = 648` -> 648, `185 + 7 = 192` -> 192), which also "
        "rewards `2x = 38` -> 38; this project rewards the value the prompt asks for, not an equation",
    ),
    "verl-concatenates": (
        "ours",
        "`8, 0` is two values; verl deletes the space and the comma and reads 80",
    ),
    "verl-first-math": (
        "ours",
        "`$9$ or $10$` names two candidates; verl keeps the first `$...$` and reads 9",
    ),
    "truncated": (
        "both defensible",
        "truncated response whose last `Answer:` line was followed by reflection: we score that last "
        "stated answer, verl's 300-character window sees none; DAPO treats truncation separately "
        "(overlong filtering, Eq. 13)",
    ),
}
_IDS = {
    "verl-box-raw": "boxed_only-007 boxed_only-012 boxed_only-013 boxed_only-018 boxed_only-032 "
    "boxed_only-033 boxed_only-041 boxed_spaces-000 boxed_spaces-001 boxed_spaces-002",
    "verl-window": "boxed_then_text-000 boxed_then_text-001 boxed_then_text-002 text_after-000 "
    "text_after-001 text_after-002 text_after-004 text_after-005",
    "verl-period": "period-000 period-001 period-002 period-004 period-005 period-006",
    "verl-markdown": "bold_value-000 bold_value-001 bold_value-002 bold_value-004 bold_value-005 "
    "bold_marker-000 bold_marker-001 bold_marker-002 bold_marker-004 bold_marker-005 "
    "bold_marker_out-000 bold_marker_out-001 bold_marker_out-002",
    "verl-textbf-marker": "textbf_marker-000 textbf_marker-001 textbf_marker-002",
    "verl-paren-math": "paren-000 paren-001 paren-002 paren-004 paren-005 paren_boxed-000 "
    "paren_boxed-001 paren_boxed-002",
    "verl-mathbf": "mathbf-000 mathbf-001 mathbf-002",
    "verl-display": "display_block-000 display_block-001 display_block-002",
    "verl-unit-list": "unit_word-000 unit_word-001 unit_word-012 unit_word-018 unit_text-001 "
    "unit_text-002 unit_text-008",
    "verl-degree-sign": "degree_mark-001 degree_mark-004",
    "verl-unit-power": "unit_squared-000 unit_squared-001 unit_squared-002",
    "verl-thin-space": "thin_space-000 thin_space-001 thin_space-002 thin_space-004",
    "verl-sign-zeros": "leading_plus-000 leading_plus-001 leading_zeros-000 leading_zeros-001 leading_zeros-002",
    "equation": "equation-000 equation-001 equation-002 equation-004 equation_expr-000 equation_expr-001 "
    "equation_expr-002",
    "verl-concatenates": "two_values-000 two_values-001 two_values-002",
    "verl-first-math": "or_dollars-000 or_dollars-001 or_dollars-002",
    "truncated": "truncated_after_answer-000 truncated_after_answer-001 truncated_after_answer-002 "
    "truncated_after_answer-004",
}
JUSTIFIED: dict[str, str] = {i: reason for reason, ids in _IDS.items() for i in ids.split()}
"""Row id -> key of its justification in ``REASONS``."""


# ---- comparison -------------------------------------------------------------------------------


def verl_compute_score() -> Callable[..., Any] | None:
    try:
        from verl.utils.reward_score.math_dapo import compute_score
    except ImportError:
        return None
    return compute_score


def verl_version() -> str:
    import verl

    return str(getattr(verl, "__version__", "unknown"))


def _short(s: str | None, n: int = 90) -> str | None:
    if s is None:
        return None
    s = s.strip()
    return s if len(s) <= n else s[: n - 3] + "..."


def compare(rows: list[dict[str, Any]], compute_score: Callable[..., Any]) -> dict[str, Any]:
    """Score every row with both scorers; counts, per-kind breakdown and disagreements."""
    results = []
    for row in rows:
        truth = str(row["truth"])
        try:
            out = compute_score(row["text"], truth)
            verl_ok, verl_pred = bool(out["acc"]), out["pred"]
        except Exception as err:  # verl's remove_boxed asserts; record, do not crash
            verl_ok, verl_pred = False, f"<{type(err).__name__}: {err}>"
        raw = extract_answer(row["text"])
        ours_ok = score_integer_answer(row["text"], truth)
        results.append(
            {
                "id": row["id"],
                "kind": row["kind"],
                "well_formed": row["well_formed"],
                "readable": row["readable"],
                "truth": truth,
                "answer_line": _short(raw),
                "ours": {"correct": ours_ok, "answer": normalize_integer(raw) if raw is not None else None},
                "verl": {"correct": verl_ok, "pred": _short(None if verl_pred is None else str(verl_pred))},
                "agree": ours_ok == verl_ok,
                "grader": bool(row["readable"]) and row["stated"] == row["truth"],
            }
        )

    def tally(sel: list[dict[str, Any]]) -> dict[str, Any]:
        agree = sum(r["agree"] for r in sel)
        return {
            "rows": len(sel),
            "agree": agree,
            "disagree": len(sel) - agree,
            "agreement": round(agree / len(sel), 4) if sel else None,
            "ours_correct": sum(r["ours"]["correct"] for r in sel),
            "verl_correct": sum(r["verl"]["correct"] for r in sel),
            "ours_as_grader": sum(r["ours"]["correct"] == r["grader"] for r in sel),
            "verl_as_grader": sum(r["verl"]["correct"] == r["grader"] for r in sel),
        }

    by_kind = {
        k: tally([r for r in results if r["kind"] == k]) for k in dict.fromkeys(r["kind"] for r in results)
    }
    disagreements = []
    for res in results:
        if res["agree"]:
            continue
        reason = JUSTIFIED.get(res["id"])
        right, why = REASONS.get(reason, ("?", None)) if reason else ("?", None)
        disagreements.append({**res, "reason": reason, "right": right, "justification": why})
    stale = sorted(i for i in JUSTIFIED if i not in {d["id"] for d in disagreements})
    unjustified = [d["id"] for d in disagreements if d["justification"] is None]
    well = tally([r for r in results if r["well_formed"]])
    gate_ok = well["agreement"] is not None and well["agreement"] >= MIN_WELL_FORMED_AGREEMENT
    return {
        "verl_version": verl_version(),
        "corpus": str(CORPUS.relative_to(ROOT)),
        "corpus_sha256": hashlib.sha256(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
        ).hexdigest(),
        "seed": SEED,
        "counts": {
            "well_formed": well,
            "well_formed_or_final_box": tally(
                [r for r in results if r["well_formed"] or r["kind"] == "boxed_only"]
            ),
            "readable": tally([r for r in results if r["readable"]]),
            "readable_not_well_formed": tally([r for r in results if r["readable"] and not r["well_formed"]]),
            "not_readable": tally([r for r in results if not r["readable"]]),
            "all": tally(results),
        },
        "by_kind": by_kind,
        "disagreements": disagreements,
        "disagreements_by_reason": dict(
            Counter(d["reason"] or "UNJUSTIFIED" for d in disagreements).most_common()
        ),
        "unjustified": unjustified,
        "stale_justifications": stale,
        "gate": {
            "min_well_formed_agreement": MIN_WELL_FORMED_AGREEMENT,
            "well_formed_ok": gate_ok,
            "all_justified": not unjustified,
            "no_stale": not stale,
            "passed": gate_ok and not unjustified and not stale,
        },
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _cell(s: Any) -> str:
    text = "—" if s is None else str(s)
    return (
        "`" + text.replace("\n", "⏎").replace("|", "\\|").replace("`", "'") + "`" if s is not None else text
    )


def render_markdown(res: dict[str, Any]) -> str:
    c = res["counts"]
    lines = [
        "# Reward scorer parity: `dapo.rewards` vs verl's `math_dapo`",
        "",
        f"verl {res['verl_version']}, `verl.utils.reward_score.math_dapo.compute_score(text, str(truth))` "
        f"(its `acc`) against `dapo.rewards.score_integer_answer(text, truth)`, on "
        f"`{res['corpus']}` ({c['all']['rows']} responses, seed {res['seed']}, sha256 "
        f"`{res['corpus_sha256'][:12]}`). Regenerate: `python benchmarks/scorer_parity.py --write-corpus`.",
        "",
        "| rows | n | agree | disagree | agreement | ours +1 | verl +1 | ours = grader | verl = grader |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    names = {
        "well_formed": "well-formed (the gate)",
        "well_formed_or_final_box": "well-formed, or ending in a box without `Answer:` (`boxed_only`)",
        "readable": "readable (well-formed or not)",
        "readable_not_well_formed": "readable, not well-formed",
        "not_readable": "not readable",
        "all": "all",
    }
    for key, name in names.items():
        t = c[key]
        lines.append(
            f"| {name} | {t['rows']} | {t['agree']} | {t['disagree']} | {_pct(t['agreement'])} | "
            f"{t['ours_correct']} | {t['verl_correct']} | {t['ours_as_grader']} | {t['verl_as_grader']} |"
        )
    g = res["gate"]
    lines += [
        "",
        f"Gate: well-formed agreement >= {_pct(g['min_well_formed_agreement'])}: "
        f"**{'pass' if g['well_formed_ok'] else 'FAIL'}**; every disagreement justified: "
        f"**{'yes' if g['all_justified'] else 'NO'}**; no stale justification: "
        f"**{'yes' if g['no_stale'] else 'NO'}**.",
        "",
        "*grader*: the verdict of a careful grader, +1 exactly when the row is readable and the "
        "integer it states is the truth (the corpus records what each response states). *ours = "
        "grader*, *verl = grader*: rows on which that scorer gives the grader's verdict.",
        "",
        "## Definitions",
        "",
        f"* **well-formed**: {WELL_FORMED}",
        f"* **readable**: {READABLE}",
        "* The corpus: `main` rows in the prompt's formats, drawn with weights estimating their share "
        "in rollouts (55% correct), and a few `edge` rows of every other format (75% correct). The "
        "agreement on *all* rows therefore over-weights the edge formats on purpose; it is not an "
        "estimate of agreement on a real rollout stream.",
        "",
        "## Disagreements by reason",
        "",
        "| reason | rows | right | why |",
        "|---|---:|---|---|",
    ]
    for reason, n in res["disagreements_by_reason"].items():
        right, why = REASONS.get(reason, ("?", "**unjustified**"))
        lines.append(f"| {reason} | {n} | {right} | {why} |")
    lines += [
        "",
        "## Every disagreement",
        "",
        "| id | well-formed | truth | answer (ours extracts) | verl: pred → verdict | ours: answer → verdict | right | justification |",
        "|---|---|---:|---|---|---|---|---|",
    ]
    for d in res["disagreements"]:
        v, o = d["verl"], d["ours"]
        lines.append(
            f"| {d['id']} | {'yes' if d['well_formed'] else 'no'} | {d['truth']} | {_cell(d['answer_line'])} | "
            f"{_cell(v['pred'])} → {'+1' if v['correct'] else '-1'} | {_cell(o['answer'])} → "
            f"{'+1' if o['correct'] else '-1'} | {d['right']} | "
            f"{d['reason'] or '**UNJUSTIFIED**'}: {d['justification'] or ''} |"
        )
    lines += [
        "",
        "## Agreement by format",
        "",
        "| kind | rows | agree | ours correct | verl correct |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind, t in res["by_kind"].items():
        lines.append(f"| {kind} | {t['rows']} | {t['agree']} | {t['ours_correct']} | {t['verl_correct']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--write-corpus", action="store_true", help=f"regenerate {CORPUS.relative_to(ROOT)} first"
    )
    ap.add_argument("--out", type=Path, default=OUT, help="report folder (default reports/scorer)")
    args = ap.parse_args(argv)
    if args.write_corpus:
        rows = write_corpus()
        print(f"wrote {len(rows)} rows to {CORPUS.relative_to(ROOT)}")
    compute_score = verl_compute_score()
    if compute_score is None:
        print(VERL_MISSING, file=sys.stderr)
        return 2
    res = compare(load_corpus(), compute_score)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "parity.json").write_text(
        json.dumps(res, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (args.out / "parity.md").write_text(render_markdown(res), encoding="utf-8")
    c, g = res["counts"], res["gate"]
    print(
        f"well-formed: {c['well_formed']['agree']}/{c['well_formed']['rows']} agree "
        f"({_pct(c['well_formed']['agreement'])}); all: {c['all']['agree']}/{c['all']['rows']} "
        f"({_pct(c['all']['agreement'])}); disagreements {len(res['disagreements'])}"
    )
    if res["unjustified"]:
        print(f"unjustified disagreements: {', '.join(res['unjustified'])}", file=sys.stderr)
    if res["stale_justifications"]:
        print(
            f"stale justifications (rows now agree): {', '.join(res['stale_justifications'])}",
            file=sys.stderr,
        )
    if not g["well_formed_ok"]:
        print(f"well-formed agreement below {_pct(MIN_WELL_FORMED_AGREEMENT)}", file=sys.stderr)
    return 0 if g["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
