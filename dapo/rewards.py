"""Rule-based outcome reward (Eq. 7) and soft overlong punishment (Eq. 13).

Eq. 7 gives +1 when ``is_equivalent(ŷ, y)`` and -1 otherwise. For the integer answers of
DAPO-Math-17k, ŷ is read from the response the way verl's ``math_dapo`` (the paper's
reference scorer) reads it: the last ``Answer:`` (any case, spaces allowed before the
colon; the answer on the same line or, when that is empty, on the next non-empty line),
and only when the response has no ``Answer:`` at all, the last ``\\boxed{}``. The answer
is then compared as a canonical integer (:func:`normalize_integer`). Where this scorer and
verl's differ, and which is right, is measured on a corpus of model outputs in
``reports/scorer/parity.md`` (``python benchmarks/scorer_parity.py``).

Parsing model text never evaluates it: answers are compared as canonical digit strings,
so a 10,000-digit answer costs linear time and no ``int()`` conversion limit applies.
Every step is linear in the length of the response (a bounded number of passes), and no
text makes the scorer raise.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .config import AlgoConfig

ANSWER_MARKER = "Answer:"
"""The marker the prompt asks for; :func:`extract_answer` also reads its variants."""
# "Answer" in any case, spaces (and a markdown "**") allowed before the colon; or the
# marker inside \textbf{...}, whose closing brace then belongs to the marker. Each match
# attempt is bounded, so finding the last marker is linear.
_MARKER = re.compile(
    r"\\(?:textbf|text|mathbf)\{[^{}\n]{0,16}?answer[ \t]*:[ \t]*\}|answer[ \t]*(?:\*\*[ \t]*)?:",
    re.IGNORECASE,
)
_NONBLANK = re.compile(r"\S")
_DISPLAY = {"\\[": "\\]", "$$": "$$"}
_INTEGER = re.compile(r"[+-]?[0-9]+")
_WS = " \t\r\n\u00a0\u2009\u202f"
# Spaces dropped inside the number ("1 234"), and markdown stripped from its ends.
_DROP = str.maketrans("", "", _WS)
_EDGE = _WS + "*`"
# Wrappers peeled off when they enclose the whole answer (braces balanced).
_WRAPS = (
    ("\\boxed{", "}"),
    ("\\text{", "}"),
    ("\\textbf{", "}"),
    ("\\mathbf{", "}"),
    ("\\mathrm{", "}"),
    ("\\mbox{", "}"),
    ("\\(", "\\)"),
    ("\\[", "\\]"),
)
_PEEL_ROUNDS = 8
# A trailing unit: a degree mark, or 1-3 words (in \text{}/\mbox{}/\mathrm{}, or bare
# after a space), optionally squared or cubed. Searched only in the last _UNIT_TAIL
# characters, so its cost is bounded whatever the answer's length.
_UNIT = re.compile(
    r"(?<=[0-9}])(?P<sep>(?:\s|~|\\[,;:! ])*)"
    r"(?:(?P<deg>\^\s*\{?\s*\\circ\s*\}?|°|\\degree)"
    r"|\\(?:text|mbox|mathrm|textrm)\s*\{(?P<text>[^{}]*)\}"
    r"|(?P<bare>[A-Za-z]+(?:\s+[A-Za-z]+){0,2}))"
    r"(?:\s*\^\s*\{?\s*[23]\s*\}?)?\s*\Z"
)
_UNIT_TAIL = 100
_UNIT_WORD = re.compile(r"[A-Za-z]+")
# Words that change the number or make the answer more than one number: never a unit.
_NOT_UNITS = frozenset(
    """and or nor not no but to than plus minus times over divided by mod modulo choose
    equals equal is are was were at least most more less fewer greater smaller larger
    below under negative pi sqrt root roots squared cubed factorial log ln sin cos tan exp
    hundred hundreds thousand thousands million millions billion billions trillion
    trillions dozen dozens half halves third thirds quarter quarters fourth fourths fifth
    fifths tenth tenths hundredth hundredths thousandth thousandths percent percentage
    percents th st nd rd""".split()
)
_NOT_SINGLE_LETTER_UNITS = frozenset("kKMBie")  # 42 \text{k} is 42,000; 2 \text{i} is 2i


def extract_answer(text: str) -> str | None:
    """The raw answer, or None when the response has neither an answer marker nor a box.

    The last ``Answer:`` wins, matched case-insensitively with optional spaces before the
    colon (``answer: 42``, ``ANSWER : 42``, ``**Answer:** 42``, ``\\textbf{Answer:} 42``);
    the raw answer is the rest of its line. When that rest is empty (or only markdown),
    the answer is the next non-empty line (``Answer:\\n\\n42``; the prompt asks for the
    answer "on its own line after Answer:"), or the body of a display block opened there
    (``Answer:\\n\\[\\n\\boxed{42}\\n\\]``); ``""`` when nothing follows. Without any marker,
    the content of the last ``\\boxed{...}`` whose braces close. Linear time."""
    if not isinstance(text, str):
        return None
    markers = deque(_MARKER.finditer(text), maxlen=1)  # the last one, in one pass
    if not markers:
        return _last_boxed(text)
    start = markers[0].end()
    end = text.find("\n", start)
    rest = text[start:] if end < 0 else text[start:end]
    if end < 0 or rest.strip(_EDGE):
        return rest
    return _next_line(text, end + 1)


def _next_line(text: str, pos: int) -> str:
    m = _NONBLANK.search(text, pos)
    if m is None:
        return ""
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.start())
    line = text[start:] if end < 0 else text[start:end]
    closer = _DISPLAY.get(line.strip())
    if closer is not None and end >= 0:
        close = text.find(closer, end)
        if close >= 0:
            return text[end + 1 : close]
    return line


def _last_boxed(text: str) -> str | None:
    # One pass pairs every brace (linear even on many unclosed "\\boxed{"), then the
    # last \\boxed whose opening brace is closed wins.
    close: dict[int, int] = {}
    stack: list[int] = []
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            close[stack.pop()] = i
    pos = text.rfind("\\boxed")
    while pos >= 0:
        i = pos + len("\\boxed")
        while i < len(text) and text[i] == " ":
            i += 1
        if i in close:
            return text[i + 1 : close[i]]
        pos = text.rfind("\\boxed", 0, pos)
    return None


def _closing_brace(s: str, i: int) -> int:
    """Index of the brace closing the ``{`` at ``i``; -1 when it never closes."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return -1


def _peel(s: str) -> str:
    """Strip spaces, markdown and one trailing period, and unwrap a wrapper enclosing the
    whole answer; repeated a bounded number of times (nested wrappers)."""
    for _ in range(_PEEL_ROUNDS):
        t = s.strip(_EDGE).removesuffix(".").strip(_EDGE)
        for left, right in _WRAPS:
            if (
                len(t) >= len(left) + len(right)
                and t.startswith(left)
                and t.endswith(right)
                and (right != "}" or _closing_brace(t, len(left) - 1) == len(t) - 1)
            ):
                t = t[len(left) : len(t) - len(right)]
                break
        if t == s:
            break
        s = t
    return s


def _is_unit(words: list[str], in_text: bool) -> bool:
    if not 1 <= len(words) <= 3 or not all(_UNIT_WORD.fullmatch(w) for w in words):
        return False
    if any(len(w) == 1 for w in words):  # a letter alone is a unit only in \text{} (12 \text{m})
        return in_text and len(words) == 1 and words[0] not in _NOT_SINGLE_LETTER_UNITS
    lowered = [w.lower() for w in words]
    # "8 units squared" is a unit; "5 squared" is 25
    return lowered[0] not in _NOT_UNITS and not (_NOT_UNITS - {"squared", "cubed"}).intersection(lowered[1:])


def _strip_unit(s: str) -> str:
    """``s`` without a trailing unit (see :func:`normalize_integer`); ``s`` when none."""
    offset = max(0, len(s) - _UNIT_TAIL)
    m = _UNIT.search(s, offset)
    if m is None:
        return s
    if m["deg"] is None:
        if m["text"] is not None:
            words = re.sub(r"~|\\[,;:! ]", " ", m["text"]).split()
            if not _is_unit(words, in_text=True):
                return s
        elif not m["sep"] or not _is_unit(m["bare"].split(), in_text=False):
            return s
    return s[: m.start()]


def _strip(s: str) -> str:
    """``s`` without decorations around the number and without a trailing unit."""
    return _peel(_strip_unit(_peel(s)))


def _sole_box(s: str) -> str | None:
    """The content of the only ``\\boxed{}`` in ``s`` when no digit stands outside it."""
    pos = s.find("\\boxed")
    if pos < 0 or s.find("\\boxed", pos + 1) >= 0:
        return None
    i = pos + len("\\boxed")
    while i < len(s) and s[i] == " ":
        i += 1
    end = _closing_brace(s, i) if i < len(s) and s[i] == "{" else -1
    if end < 0 or any(c.isdigit() for c in s[:pos]) or any(c.isdigit() for c in s[end + 1 :]):
        return None
    return s[i + 1 : end]


def _sole_math(s: str) -> str | None:
    """The content of the only inline math span (``$...$`` or ``\\(...\\)``) in ``s`` when
    no digit stands outside it."""
    if s.count("$") == 2:
        i, j, k = s.find("$"), s.rfind("$"), 1
    elif s.count("\\(") == 1 and s.count("\\)") == 1:
        i, j, k = s.find("\\("), s.find("\\)"), 2
    else:
        return None
    if j <= i or any(c.isdigit() for c in s[:i]) or any(c.isdigit() for c in s[j + k :]):
        return None
    return s[i + k : j]


def normalize_integer(raw: str) -> str | None:
    """Canonical form of an integer answer (``"-7"``, ``"1234"``) or None if ``raw`` is not
    one. Nothing is evaluated: the digits are compared as a string.

    Accepted around the integer:

    * math and markdown: ``$``, ``\\$`` (an escaped dollar sign: ``\\$50``), ``\\(...\\)``,
      ``\\[...\\]``, ``**``, backticks, spaces, one trailing period, and wrappers
      enclosing the whole answer: ``\\boxed{}``, ``\\text{}``, ``\\textbf{}``,
      ``\\mathbf{}``, ``\\mathrm{}``, ``\\mbox{}``;
    * in the number: thousands separators (``1,234``, ``1{,}234``, ``1\\,234``; a comma
      only after a first group of 1-3 digits and between groups of three, so ``3, 4`` and
      ``0,123`` are not numbers), a leading ``+`` or ``-``, leading zeros (``062``);
    * a trailing unit: a degree mark (``90^\\circ``, ``90^{\\circ}``, ``90°``) or, the
      general rule, one to three alphabetic words after a space, or any such words inside
      ``\\text{}``, ``\\mbox{}``, ``\\mathrm{}`` or ``\\textrm{}`` (``42 degrees``,
      ``50 dollars``, ``12 \\text{ cm}``, ``8 square units``, ``19 apples``), optionally
      squared or cubed (``12 cm^2``). Not a unit: a word that changes the number or adds
      another (``and``, ``or``, ``to``, ``times``, ``squared`` first, ``thousand``,
      ``half``, ``percent``, ``pi``, ...: the set ``_NOT_UNITS``), a bare single letter
      (``2 i``), a word glued to the number (``5x``), anything holding a digit;
    * a sentence around a single ``\\boxed{}``, or else around a single inline math span
      (``$...$``, ``\\(...\\)``), when no digit stands outside it (``The final answer is
      $\\boxed{42}$.``, Minerva's ``The final answer is $42$. I hope it is correct.``).

    Rejected: everything else, e.g. ``19.5``, ``19/2``, ``x = 19``, ``2+17``, ``3, 4``,
    ``42 or 43``, ``42\\%``, ``\\boxed{19} \\boxed{20}``.
    """
    if not isinstance(raw, str):
        return None
    for s in _readings(raw):
        s = s.translate(_DROP).replace("{,}", ",").replace("\\,", ",").replace("\\!", "")
        # thousands separators: a first group of 1-3 digits (no leading zero), then groups of three
        if "," in s:
            head, *tail = s.split(",")
            lead = head.lstrip("+-")
            if (
                not 1 <= len(lead) <= 3
                or lead[0] == "0"
                or not all(len(t) == 3 and t.isdigit() for t in tail)
            ):
                continue
            s = head + "".join(tail)
        if not _INTEGER.fullmatch(s):
            continue
        sign = "-" if s[0] == "-" else ""
        digits = s.lstrip("+-").lstrip("0") or "0"
        return ("" if digits == "0" else sign) + digits
    return None


def _readings(raw: str) -> Iterator[str]:
    """What may hold the integer, in order: the whole answer; else the only box in it, or
    the only inline math span (computed only when the whole answer is not an integer)."""
    math = raw.replace("\\$", "")
    s = math.replace("$", "")
    yield _strip(s)
    box = _sole_box(s)
    if box is None:
        box = _sole_math(math)
        if box is not None and "\\boxed" in box:
            box = _sole_box(box)
    if box is not None:
        yield _strip(box.replace("$", ""))


def score_integer_answer(text: str, truth: int | str) -> bool:
    """Eq. 7's is_equivalent for integer answers: does the response's final answer equal
    ``truth``? The answer is the last ``Answer:`` (see :func:`extract_answer`), or, only
    when the response has no ``Answer:``, the last ``\\boxed{}``; it is equal when its
    :func:`normalize_integer` form is ``truth``'s. Never raises on any ``text``; raises
    ValueError when ``truth`` is not an integer."""
    want = normalize_integer(str(truth))
    if want is None:
        raise ValueError(f"ground truth {truth!r} is not an integer")
    raw = extract_answer(text)
    if raw is None:
        return False
    got = normalize_integer(raw)
    return got is not None and got == want


def soft_overlong_penalty(lengths: Tensor, expected_len: int, cache_len: int, factor: float = 1.0) -> Tensor:
    """Eq. 13, the soft overlong punishment, as a float tensor shaped like ``lengths``.

    0 for ``L <= expected_len``; ``(expected_len - L) / cache_len`` on the ramp up to
    ``expected_len + cache_len`` (the generation ceiling); -1 beyond; times ``factor``.
    The paper writes the ramp's start as L_max - L_cache with L_max = 20,480 the
    generation ceiling, i.e. 16,384 = ``expected_len``. (One seed document reads
    L_max = 16,384 and starts the ramp at 12,288; we follow the paper's Section 4.1 and
    verl's recipe.)
    """
    if expected_len <= 0 or cache_len <= 0:
        raise ValueError("expected_len and cache_len must be > 0")
    lengths = torch.as_tensor(lengths)
    over = (lengths.to(torch.float64) - expected_len) / cache_len
    return (0.0 - over.clamp(0.0, 1.0) * factor).to(torch.get_default_dtype())


def outcome_reward(
    correct: Tensor,
    lengths: Tensor,
    *,
    soft_overlong: bool,
    expected_len: int,
    cache_len: int,
    factor: float = 1.0,
) -> Tensor:
    """Eq. 7 (+1 correct, -1 incorrect) plus, when ``soft_overlong``, the Eq. 13 penalty."""
    correct = torch.as_tensor(correct, dtype=torch.bool)
    base = torch.where(correct, 1.0, -1.0).to(torch.get_default_dtype())
    if soft_overlong:
        base = base + soft_overlong_penalty(lengths, expected_len, cache_len, factor)
    return base


def config_reward(correct: Tensor, lengths: Tensor, cfg: AlgoConfig) -> Tensor:
    """:func:`outcome_reward` with the shaping knobs of an ``AlgoConfig``."""
    return outcome_reward(
        correct,
        lengths,
        soft_overlong=cfg.soft_overlong,
        expected_len=cfg.expected_len,
        cache_len=cfg.cache_len,
        factor=cfg.overlong_penalty_factor,
    )
