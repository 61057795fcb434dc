"""Training and evaluation problems: loading, validation, prompt template, contamination.

Accepted records (JSONL, JSON, parquet, or a hub dataset through ``datasets``):

* flat: ``{"prompt": "...", "answer": 42}`` (also ``problem`` / ``question``);
* DAPO-Math-17K / verl: ``{"prompt": [{"role": "user", "content": "..."}],
  "reward_model": {"ground_truth": "42"}, ...}``.

Every malformed record is reported with its file and row, and loading refuses to go on:
nothing is dropped silently.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo.rewards import normalize_integer

DAPO_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
PROMPT_KEYS = ("prompt", "problem", "question")
ANSWER_KEYS = ("answer", "reward_model.ground_truth", "ground_truth")


class DataError(ValueError):
    """Malformed records; ``problems`` lists ``(source, row, field, reason)`` for each."""

    def __init__(self, problems: list[tuple[str, int, str, str]]):
        self.problems = problems
        head = "\n".join(f"  {src}:{row}: {fld}: {why}" for src, row, fld, why in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{len(problems)} malformed record(s); refusing to start:\n{head}{more}")


@dataclass(frozen=True)
class Problem:
    """One prompt with its integer answer, and where it came from."""

    prompt: str
    answer: str
    """Canonical integer string (see :func:`dapo.rewards.normalize_integer`)."""
    source: str
    row: int
    """1-based row (line for JSONL) in the source."""


def _read_raw(spec: str, split: str) -> tuple[list[Any], str]:
    path = Path(spec)
    if path.suffix == ".jsonl" or (path.is_file() and path.suffix == ".json"):
        if not path.is_file():
            raise FileNotFoundError(f"data file not found: {path}")
        rows: list[Any] = []
        if path.suffix == ".json":
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as err:
                raise DataError([(str(path), err.lineno, "<json>", f"not valid JSON: {err.msg}")]) from None
            if not isinstance(data, list):
                raise DataError([(str(path), 1, "<json>", "a .json file must hold a list of records")])
            return data, str(path)
        bad = []
        with path.open() as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append((i, json.loads(line)))
                except json.JSONDecodeError as err:
                    bad.append((str(path), i, "<json>", f"not valid JSON: {err.msg}"))
        if bad:
            raise DataError(bad)
        return rows, str(path)
    if path.suffix == ".parquet":
        if not path.is_file():
            raise FileNotFoundError(f"data file not found: {path}")
        import datasets

        ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
        return list(ds), str(path)
    import datasets

    ds = datasets.load_dataset(spec, split=split)
    return list(ds), f"{spec}[{split}]"


def _get(record: dict, dotted: str) -> Any:
    cur: Any = record
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _prompt_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        users = [m.get("content") for m in value if m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    return None


def apply_template(problem: str, template: str) -> str:
    if template == "none" or "Answer:" in problem:
        return problem
    return DAPO_TEMPLATE.format(problem=problem.strip())


def load_problems(
    spec: str,
    *,
    split: str = "train",
    prompt_key: str | None = None,
    answer_key: str | None = None,
    template: str = "dapo",
    tokenizer: Any = None,
    max_prompt_tokens: int | None = None,
) -> list[Problem]:
    """Load and validate every record; raise :class:`DataError` listing all bad rows."""
    raw, source = _read_raw(spec, split)
    problems, bad = [], []
    for i, item in enumerate(raw, 1):
        row, record = item if isinstance(item, tuple) else (i, item)
        if not isinstance(record, dict):
            bad.append((source, row, "<record>", f"expected an object, got {type(record).__name__}"))
            continue
        pk = prompt_key or next((k for k in PROMPT_KEYS if _get(record, k) is not None), None)
        ak = answer_key or next((k for k in ANSWER_KEYS if _get(record, k) is not None), None)
        if pk is None:
            bad.append((source, row, "prompt", f"missing (looked for {', '.join(PROMPT_KEYS)})"))
            continue
        if ak is None:
            bad.append((source, row, "answer", f"missing (looked for {', '.join(ANSWER_KEYS)})"))
            continue
        text = _prompt_text(_get(record, pk))
        if text is None or not text.strip():
            bad.append((source, row, pk, "must be a non-empty string or a chat list with a user message"))
            continue
        ans_raw = _get(record, ak)
        ans = (
            normalize_integer(str(ans_raw))
            if isinstance(ans_raw, (int, str)) and not isinstance(ans_raw, bool)
            else None
        )
        if ans is None:
            bad.append((source, row, ak, f"must be an integer, got {ans_raw!r}"))
            continue
        prompt = apply_template(text, template)
        if tokenizer is not None and max_prompt_tokens is not None:
            n = len(tokenizer(prompt).input_ids)
            if n > max_prompt_tokens:
                bad.append((source, row, pk, f"{n} tokens > max_prompt_tokens={max_prompt_tokens}"))
                continue
        problems.append(Problem(prompt=prompt, answer=ans, source=source, row=row))
    if bad:
        raise DataError(bad)
    if not problems:
        raise DataError([(source, 0, "<file>", "no records")])
    return problems


# ---- contamination ----------------------------------------------------------------------

_WORD = re.compile(r"\w+")


def _ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


@dataclass(frozen=True)
class Overlap:
    train_row: int
    eval_row: int
    shared_ngrams: int
    fraction_of_eval: float


def contamination(
    train: Iterable[Problem], evals: Iterable[Problem], n: int = 13, template_free: bool = True
) -> list[Overlap]:
    """Training prompts sharing word n-grams with evaluation prompts (the instruction
    template is removed first so that it does not count as overlap)."""

    def strip(p: Problem) -> str:
        if template_free:
            for part in DAPO_TEMPLATE.split("{problem}"):
                p_text = p.prompt.replace(part, " ")
                p = Problem(p_text, p.answer, p.source, p.row)
        return p.prompt

    eval_grams = [(e.row, _ngrams(strip(e), n)) for e in evals]
    index: dict[tuple[str, ...], list[int]] = {}
    for row, grams in eval_grams:
        for g in grams:
            index.setdefault(g, []).append(row)
    sizes = {row: len(g) for row, g in eval_grams}
    out = []
    for t in train:
        hits: dict[int, int] = {}
        for g in _ngrams(strip(t), n):
            for row in index.get(g, ()):
                hits[row] = hits.get(row, 0) + 1
        for row, count in sorted(hits.items()):
            out.append(Overlap(t.row, row, count, count / max(1, sizes[row])))
    return out


# ---- the training stream ------------------------------------------------------------------


class PromptStream:
    """Epoch-wise shuffled problems with a resumable position ``(epoch, index)``."""

    def __init__(self, problems: list[Problem], seed: int = 0):
        self.problems = problems
        self.seed = seed
        self.epoch = 0
        self.index = 0
        self._order = self._shuffle(0)

    def _shuffle(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def take(self, n: int) -> list[Problem]:
        out = []
        for _ in range(n):
            if self.index >= len(self._order):
                self.epoch += 1
                self.index = 0
                self._order = self._shuffle(self.epoch)
            out.append(self.problems[self._order[self.index]])
            self.index += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "size": len(self.problems)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["size"] != len(self.problems) or state["seed"] != self.seed:
            raise ValueError("the checkpoint's data position belongs to another dataset or seed")
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._shuffle(self.epoch)
