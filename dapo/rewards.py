"""Rule-based outcome reward (Eq. 7) and soft overlong punishment (Eq. 13).

Parsing model text never evaluates it: answers are compared as canonical digit strings,
so a 10,000-digit answer costs linear time and no ``int()`` conversion limit applies.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .config import AlgoConfig

ANSWER_MARKER = "Answer:"
_INTEGER = re.compile(r"[+-]?[0-9]+")
# Decorations stripped from an answer before it must be a bare integer.
_DROP = str.maketrans("", "", "$*` \t\r\u00a0\u2009\u202f")


def extract_answer(text: str) -> str | None:
    """The raw answer: the rest of the last line holding ``Answer:``, or else the content
    of the last ``\\boxed{...}`` (balanced braces). None when neither is present."""
    if not isinstance(text, str):
        return None
    pos = text.rfind(ANSWER_MARKER)
    if pos >= 0:
        start = pos + len(ANSWER_MARKER)
        end = text.find("\n", start)
        return text[start:] if end < 0 else text[start:end]
    return _last_boxed(text)


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


def normalize_integer(raw: str) -> str | None:
    """Canonical form of an integer answer or None if ``raw`` is not one.

    Tolerates ``$``, markdown ``*``, spaces, a ``\\boxed{}`` wrapper, thousands separators
    (``1,234``, ``1{,}234``, ``1\\,234``), a leading ``+``, leading zeros and one trailing
    period. Rejects anything else (``19.5``, ``19/2``, ``x = 19``, ``19 apples``).
    """
    s = raw.translate(_DROP).replace("{,}", "").replace("\\,", "").replace("\\!", "")
    s = s.removesuffix(".")
    for wrapper in ("\\boxed{", "\\text{", "\\mathbf{"):
        if s.startswith(wrapper) and s.endswith("}"):
            s = s[len(wrapper) : -1]
    s = s.removesuffix(".")
    # thousands separators: only in groups of three digits after the first group
    if "," in s:
        head, *tail = s.split(",")
        if not tail or not all(len(t) == 3 and t.isdigit() for t in tail):
            return None
        s = head + "".join(tail)
    if not _INTEGER.fullmatch(s):
        return None
    sign = "-" if s[0] == "-" else ""
    digits = s.lstrip("+-").lstrip("0") or "0"
    return ("" if digits == "0" else sign) + digits


def score_integer_answer(text: str, truth: int | str) -> bool:
    """Eq. 7's is_equivalent for integer answers: does the response's final answer equal
    ``truth``? Reads the last ``Answer:`` line (falling back to the last ``\\boxed{}``
    only when there is no ``Answer:`` line). Never raises on any ``text``."""
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
