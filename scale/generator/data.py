"""Training and evaluation problems: loading, validation, de-duplication, prompt and chat
templates, tokenisation, a cache of the prepared set, contamination.

Accepted records (JSONL, JSON, parquet, or a hub dataset through ``datasets``):

* flat: ``{"prompt": "...", "answer": 42}`` (also ``problem`` / ``question``);
* DAPO-Math-17K / verl: ``{"prompt": [{"role": "user", "content": "..."}],
  "reward_model": {"ground_truth": "42"}, ...}``.

Every malformed record is reported with its file and row, and loading refuses to go on:
nothing is dropped silently. :func:`prepare_problems` is what training and evaluation use:
it keeps one problem per (prompt, answer), the first row that holds it (DAPO-Math-17k ships
its 17k prompts 100 times each, AIME-2024 its 30 problems 32 times), applies the chat
template as verl's DAPO recipe does, tokenises, and caches the result under a key of
everything that changes it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
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
CACHE_VERSION = 1
"""Part of every cache key: bump it when :func:`prepare_problems` changes what it produces."""
_BATCH = 4096
"""Rows per parquet/hub batch read, and prompts per batched tokenizer call."""


class DataError(ValueError):
    """Malformed records; ``problems`` lists ``(source, row, field, reason)`` for each."""

    def __init__(self, problems: list[tuple[str, int, str, str]]):
        self.problems = problems
        head = "\n".join(f"  {src}:{row}: {fld}: {why}" for src, row, fld, why in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{len(problems)} malformed record(s); refusing to start:\n{head}{more}")


class ChatTemplateError(DataError):
    """The chat template asked for cannot be used (found before any record is read). ``str()``
    names ``data.chat_template``; ``reason`` is the rest, for a command-line option's message."""

    def __init__(self, reason: str, option: str = "data.chat_template"):
        self.problems = []
        self.reason = reason
        ValueError.__init__(self, f"{option}: {reason}")


@dataclass(frozen=True)
class Problem:
    """One prompt with its integer answer, and where it came from."""

    prompt: str
    """What the model is given: the problem in the instruction template, then in the chat
    template when one is applied."""
    answer: str
    """Canonical integer string (see :func:`dapo.rewards.normalize_integer`)."""
    source: str
    row: int
    """1-based row (line for JSONL) in the source; the first row holding this problem."""
    question: str = ""
    """The problem text as the record holds it (the last user message of a chat list), before
    any template: what the contamination check compares."""


@dataclass(frozen=True)
class ProblemSet:
    """The unique problems of a data source, in the order of their first rows."""

    problems: list[Problem]
    prompt_ids: list[list[int]] | None
    """Token ids of each problem's prompt (None when prepared without a tokenizer)."""
    rows: int
    """Records read (valid rows, duplicates included)."""
    source: str
    conflicts: list[tuple[int, ...]] = field(default_factory=list)
    """Prompts held with different answers: for each, the first row of every answer (each
    (prompt, answer) pair is kept; the data's own labels decide, not the loader)."""
    cache: str | None = None
    """The cache file written or read (None: not cached)."""
    from_cache: bool = False

    def __len__(self) -> int:
        return len(self.problems)

    def summary(self) -> str:
        """``N unique problems from M rows (source)``, then the conflicting answers, if any."""
        out = f"{len(self.problems)} unique problems from {self.rows} rows ({self.source})"
        if self.conflicts:
            rows = ", ".join("/".join(map(str, c)) for c in self.conflicts[:5])
            more = ", ..." if len(self.conflicts) > 5 else ""
            out += (
                f"; warning: {len(self.conflicts)} prompt(s) appear with different answers, each "
                f"kept (rows {rows}{more})"
            )
        return out

    def longest_prompt(self) -> int:
        """Tokens of the longest prompt in the whole set (0 without token ids)."""
        return max(map(len, self.prompt_ids), default=0) if self.prompt_ids else 0

    def check_context(self, ceiling: int, max_model_len: int, ceiling_name: str) -> None:
        """Refuse, naming each row, the prompts that leave fewer than ``ceiling`` response
        tokens within the engine's context ``max_model_len``: vLLM would stop them early and
        the reward would score them as truncated (a silent length cut, not the model's)."""
        bad = [
            (
                p.source,
                p.row,
                "prompt",
                f"{len(ids)} prompt tokens + {ceiling_name}={ceiling} exceed rollout.max_model_len="
                f"{max_model_len}",
            )
            for p, ids in zip(self.problems, self.prompt_ids or [])
            if len(ids) + ceiling > max_model_len
        ]
        if bad:
            raise DataError(bad)

    def head(self, n: int | None) -> ProblemSet:
        """The first ``n`` problems (all for None): ``eval.limit``, ``dapo eval --limit``."""
        if n is None:
            return self
        ids = self.prompt_ids[:n] if self.prompt_ids is not None else None
        return replace(self, problems=self.problems[:n], prompt_ids=ids)


# ---- reading ------------------------------------------------------------------------------


def _hub_unreachable(err: BaseException) -> bool:
    """A Hub dataset that could not be fetched (no network, offline mode, unknown or gated)."""
    names = {type(e).__name__ for e in type(err).__mro__}
    return isinstance(err, (ConnectionError, OSError, TimeoutError)) or bool(
        names
        & {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "HfHubHTTPError", "RepositoryNotFoundError"}
    )


class _Reader:
    """One data source: its records as ``(row, record)``, read lazily, and its fingerprint."""

    def __init__(self, spec: str, split: str):
        path = Path(spec)
        self.spec, self.split = spec, split
        self.path: Path | None = None
        self.ds: Any = None
        self.json_bad: list[tuple[str, int, str, str]] = []
        if path.suffix in (".jsonl", ".json", ".parquet"):
            if not path.is_file():
                raise FileNotFoundError(f"data file not found: {path}")
            self.path, self.name = path, str(path)
        else:
            import datasets

            try:
                self.ds = datasets.load_dataset(spec, split=split)
            except FileNotFoundError:
                raise
            except Exception as err:  # offline, a name the Hub does not know, no access
                if not _hub_unreachable(err):
                    raise
                first = (str(err).strip().splitlines() or [""])[0][:200]
                raise FileNotFoundError(
                    f"data source {spec!r}: not a local .jsonl/.json/.parquet file, and the Hub could not "
                    f"provide it ({type(err).__name__}: {first}); give a local file or stage it (`dapo stage`)"
                ) from err
            self.name = f"{spec}[{split}]"

    def fingerprint(self) -> str:
        """sha256 of the file's bytes; for a hub dataset, its ``datasets`` fingerprint."""
        if self.path is None:
            return f"datasets:{self.spec}:{self.split}:{self.ds._fingerprint}"
        h = hashlib.sha256()
        with self.path.open("rb") as f:
            while chunk := f.read(1 << 23):
                h.update(chunk)
        return f"sha256:{h.hexdigest()}"

    def records(self) -> Iterator[tuple[int, Any]]:
        if self.path is None:
            start = 1
            for batch in self.ds.with_format("arrow").iter(batch_size=_BATCH):
                yield from enumerate(batch.to_pylist(), start)
                start += batch.num_rows
        elif self.path.suffix == ".parquet":
            yield from self._parquet(self.path)
        elif self.path.suffix == ".json":
            try:
                data = json.loads(self.path.read_text())
            except json.JSONDecodeError as err:
                raise DataError([(self.name, err.lineno, "<json>", f"not valid JSON: {err.msg}")]) from None
            if not isinstance(data, list):
                raise DataError([(self.name, 1, "<json>", "a .json file must hold a list of records")])
            yield from enumerate(data, 1)
        else:
            with self.path.open() as f:
                for i, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        yield i, json.loads(line)
                    except json.JSONDecodeError as err:
                        self.json_bad.append((self.name, i, "<json>", f"not valid JSON: {err.msg}"))

    def _parquet(self, path: Path) -> Iterator[tuple[int, Any]]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            batches = pq.ParquetFile(path).iter_batches(batch_size=_BATCH)
            start = 1
            for batch in batches:
                yield from enumerate(batch.to_pylist(), start)
                start += batch.num_rows
        except (pa.ArrowException, OSError) as err:
            why = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise DataError([(self.name, 0, "<parquet>", f"not a readable parquet file: {why}")]) from None


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


@dataclass
class _Row:
    row: int
    text: str
    """The problem as the record holds it (the last user message of a chat list)."""
    answer: str
    field: str
    messages: list[dict] | None
    """The record's chat list, when its prompt is one."""


def _rows(reader: _Reader, prompt_key: str | None, answer_key: str | None) -> Iterator[_Row]:
    """Every valid record; after the last, :class:`DataError` listing every malformed one
    (JSON syntax errors alone when there are any: nothing else in such a file is trusted)."""
    source, bad, n = reader.name, [], 0
    canonical: dict[str, str | None] = {}
    for row, record in reader.records():
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
        value = _get(record, pk)
        text = _prompt_text(value)
        if text is None or not text.strip():
            bad.append((source, row, pk, "must be a non-empty string or a chat list with a user message"))
            continue
        ans_raw = _get(record, ak)
        ans = None
        if isinstance(ans_raw, (int, str)) and not isinstance(ans_raw, bool):
            raw = str(ans_raw)
            ans = canonical.get(raw, "")
            if ans == "":  # each distinct answer is parsed once (1.79M rows hold ~17k answers)
                ans = canonical[raw] = normalize_integer(raw)
        if ans is None:
            bad.append((source, row, ak, f"must be an integer, got {ans_raw!r}"))
            continue
        n += 1
        yield _Row(row, text, ans, pk, value if isinstance(value, list) else None)
    if reader.json_bad:
        raise DataError(reader.json_bad)
    if bad:
        raise DataError(bad)
    if not n:
        raise DataError([(source, 0, "<file>", "no records")])


# ---- preparing: chat template, de-duplication, tokens, cache ------------------------------


def _chat_template(chat_template: bool | str, tokenizer: Any) -> tuple[bool, str | None]:
    """``(apply, text)``: whether a chat template is applied, and the Jinja text passed as
    ``chat_template=`` (None: the tokenizer's own)."""
    if isinstance(chat_template, bool):
        if not chat_template:
            return False, None
        if tokenizer is None:
            raise ValueError("chat_template=True needs a tokenizer (pass chat_template=False without one)")
        if not getattr(tokenizer, "chat_template", None):
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise ChatTemplateError(
                f"true, but the tokenizer ({name}) has no chat template; use false (prompts as plain "
                "text) or the path of a Jinja chat template file"
            )
        return True, None
    if isinstance(chat_template, str) and chat_template.strip():
        if tokenizer is None:
            raise ValueError("a chat template file needs a tokenizer (pass chat_template=False without one)")
        path = Path(chat_template).expanduser()
        if not path.is_file():
            raise ChatTemplateError(
                f"no such file: {chat_template!r} (true, false or the path of a Jinja chat template file)"
            )
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise ChatTemplateError(f"cannot read {chat_template!r}: {err}") from None
        if not text.strip():
            raise ChatTemplateError(f"{chat_template!r} is empty")
        return True, text
    raise ChatTemplateError(
        f"must be true, false or the path of a Jinja chat template file (got {chat_template!r})"
    )


def tokenizer_fingerprint(tokenizer: Any) -> str | None:
    """sha256 of what decides a tokenizer's ids: a fast tokenizer's whole serialised state
    (vocabulary, merges, normalizer, added tokens, post-processor), else its vocabulary.
    None when neither can be read (then nothing is cached)."""
    if tokenizer is None:
        return "none"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and callable(getattr(backend, "to_str", None)):
        return "fast:" + hashlib.sha256(backend.to_str().encode()).hexdigest()
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if callable(get_vocab):
        blob = json.dumps(sorted(get_vocab().items()), ensure_ascii=False)
        return "vocab:" + hashlib.sha256(f"{type(tokenizer).__name__}\n{blob}".encode()).hexdigest()
    return None


def _cache_key(reader: _Reader, tok_fp: str, chat: str | None, options: dict[str, Any]) -> str:
    parts = {
        "cache_version": CACHE_VERSION,
        "data": reader.fingerprint(),
        "tokenizer": tok_fp,
        "chat_template": chat,
        "instruction": DAPO_TEMPLATE,
        **options,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def _read_cache(path: Path, key: str, source: str, log: Callable[[str], None]) -> ProblemSet | None:
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text())
        if d["cache_version"] != CACHE_VERSION or d["key"] != key:
            raise ValueError("another key or version")
        p = d["problems"]
        cols = (p["prompt"], p["answer"], p["row"], p["question"])
        n = len(cols[0])
        ids = d["prompt_ids"]
        if any(not isinstance(c, list) or len(c) != n for c in cols) or not n:
            raise ValueError("columns of unequal length")
        if ids is not None and (
            not isinstance(ids, list) or len(ids) != n or not all(isinstance(x, list) for x in ids)
        ):
            raise ValueError("prompt ids do not match the problems")
        if not all(isinstance(x, str) for c in (cols[0], cols[1], cols[3]) for x in c):
            raise ValueError("prompts, answers and questions must be text")
        if not isinstance(d["rows"], int) or d["rows"] < n:
            raise ValueError("row count")
        problems = [Problem(a, b, source, int(c), q) for a, b, c, q in zip(*cols)]
        conflicts = [tuple(int(r) for r in c) for c in d["conflicts"]]
    except Exception as err:  # whatever is wrong with a cache file, it is rebuilt
        why = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        log(f"warning: data cache {path} is unreadable ({type(err).__name__}: {why}); rebuilding it")
        return None
    return ProblemSet(problems, ids, d["rows"], source, conflicts, cache=str(path), from_cache=True)


def _write_cache(path: Path, key: str, ps: ProblemSet, log: Callable[[str], None]) -> bool:
    """Atomically (a temporary file, then ``os.replace``): processes writing the same key at
    once leave one whole file."""
    payload = {
        "cache_version": CACHE_VERSION,
        "key": key,
        "source": ps.source,
        "rows": ps.rows,
        "problems": {
            "prompt": [p.prompt for p in ps.problems],
            "answer": [p.answer for p in ps.problems],
            "row": [p.row for p in ps.problems],
            "question": [p.question for p in ps.problems],
        },
        "prompt_ids": ps.prompt_ids,
        "conflicts": [list(c) for c in ps.conflicts],
    }
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, separators=(",", ":"), ensure_ascii=False)
        os.replace(tmp, path)
        return True
    except OSError as err:
        log(f"warning: cannot write the data cache {path} ({err}); continuing without it")
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return False


def _encode(tokenizer: Any, prompts: list[str], plain: bool) -> list[list[int]]:
    """Token ids as verl's RLHFDataset makes them: a chat-templated prompt already holds its
    special tokens (``add_special_tokens=False``); a plain one is encoded as the tokenizer
    does by default."""
    kwargs = {} if plain else {"add_special_tokens": False}
    if getattr(tokenizer, "is_fast", False):
        out: list[list[int]] = []
        for i in range(0, len(prompts), _BATCH):
            out += [list(x) for x in tokenizer(prompts[i : i + _BATCH], **kwargs)["input_ids"]]
        return out
    return [list(tokenizer(p, **kwargs).input_ids) for p in prompts]


def _render(tokenizer: Any, messages: list[dict], chat_text: str | None) -> str:
    kwargs = {} if chat_text is None else {"chat_template": chat_text}
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
    if not isinstance(out, str):
        raise TypeError(f"apply_chat_template returned {type(out).__name__}, not text")
    return out


def prepare_problems(
    spec: str,
    *,
    chat_template: bool | str,
    split: str = "train",
    prompt_key: str | None = None,
    answer_key: str | None = None,
    template: str = "dapo",
    tokenizer: Any = None,
    max_prompt_tokens: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> ProblemSet:
    """The unique problems of ``spec``, ready to train or evaluate on.

    Loads and validates every record (all malformed rows in one :class:`DataError`), puts each
    problem in the instruction ``template``, then in the chat template (``chat_template``:
    True, the tokenizer's own; False, none; a str, the path of a Jinja template file). A
    record whose prompt is a chat list keeps all its messages (a system message too), with the
    instruction template in its last user message; the text is what
    ``tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)``
    gives, as verl's DAPO recipe. Then one problem per (prompt text, answer), the first row
    that holds it; the prompts' token ids with a ``tokenizer`` (a prompt longer than
    ``max_prompt_tokens`` is a malformed row, every row that holds it reported).

    With ``cache_dir``, the result is cached in a file named by a hash of the data (file bytes,
    or the hub dataset's fingerprint), the tokenizer, the chat template, every option above
    and :data:`CACHE_VERSION`; a later call with the same inputs reads it instead of reading,
    templating and tokenising again. A corrupt cache file is rebuilt (one warning line through
    ``log``, stderr by default). Every rank may call this: writes are atomic."""
    log = log or _stderr
    apply_chat, chat_text = _chat_template(chat_template, tokenizer)
    reader = _Reader(spec, split)
    source = reader.name
    cache: Path | None = None
    key = ""
    if cache_dir is not None:
        tok_fp = tokenizer_fingerprint(tokenizer)
        if tok_fp is None:
            log(f"warning: {type(tokenizer).__name__} cannot be fingerprinted; {source} is not cached")
        else:
            if not apply_chat:
                chat_id = None
            else:
                own = chat_text if chat_text is not None else getattr(tokenizer, "chat_template", None)
                chat_id = json.dumps(own, sort_keys=True)
            options = {
                "split": split if reader.path is None else None,
                "prompt_key": prompt_key,
                "answer_key": answer_key,
                "template": template,
                "max_prompt_tokens": max_prompt_tokens if tokenizer is not None else None,
            }
            key = _cache_key(reader, tok_fp, chat_id, options)
            cache = Path(cache_dir).expanduser() / f"problems-{key[:40]}.json"  # not the path: a copy hits
            hit = _read_cache(cache, key, source, log)
            if hit is not None:
                return hit

    # pass 1, over the records: one group per (record prompt, answer); templates come later,
    # once per group (DAPO-Math-17k: 17k groups for 1.79M rows)
    index: dict[tuple[str, str], int] = {}
    groups: list[tuple[_Row, list[int]]] = []
    rows = 0
    for r in _rows(reader, prompt_key, answer_key):
        rows += 1
        k = (repr(r.messages) if apply_chat and r.messages is not None else r.text, r.answer)
        i = index.get(k)
        if i is None:
            index[k] = len(groups)
            groups.append((r, [r.row]))
        else:
            groups[i][1].append(r.row)
    del index

    # pass 2, over the groups: the final prompt text; one problem per (text, answer)
    unique: dict[tuple[str, str], int] = {}
    kept: list[tuple[str, _Row, list[int]]] = []
    bad: list[tuple[str, int, str, str]] = []
    for r, members in groups:
        prompt = apply_template(r.text, template)
        if apply_chat:
            if r.messages is None:
                messages = [{"role": "user", "content": prompt}]
            else:
                last = max(i for i, m in enumerate(r.messages) if m.get("role") == "user")
                messages = [dict(m) for m in r.messages]
                messages[last]["content"] = prompt
            try:
                prompt = _render(tokenizer, messages, chat_text)
            except Exception as err:  # a Jinja template's own errors (raise_exception, syntax)
                why = str(err).splitlines()[0] if str(err) else type(err).__name__
                bad += [(source, row, r.field, f"chat template failed: {why}") for row in members]
                continue
        i = unique.get((prompt, r.answer))
        if i is None:
            unique[(prompt, r.answer)] = len(kept)
            kept.append((prompt, r, list(members)))
        else:
            kept[i][2].extend(members)
    del groups

    ids = None
    if tokenizer is not None:
        ids = _encode(tokenizer, [p for p, _, _ in kept], plain=not apply_chat)
        if max_prompt_tokens is not None:
            for (_, r, members), x in zip(kept, ids):
                if len(x) > max_prompt_tokens:
                    why = f"{len(x)} tokens > max_prompt_tokens={max_prompt_tokens}"
                    bad += [(source, row, r.field, why) for row in members]
    if bad:
        raise DataError(sorted(bad, key=lambda b: b[1]))

    answers: dict[str, list[int]] = {}
    for prompt, r, _ in kept:
        answers.setdefault(prompt, []).append(r.row)
    conflicts = [tuple(rs) for rs in answers.values() if len(rs) > 1]
    problems = [Problem(prompt, r.answer, source, r.row, r.text) for prompt, r, _ in kept]
    ps = ProblemSet(problems, ids, rows, source, conflicts)
    if cache is not None and _write_cache(cache, key, ps, log):
        ps = replace(ps, cache=str(cache))
    return ps


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
    """Training prompts sharing word n-grams with evaluation prompts. Each problem's
    ``question`` is compared (its ``prompt`` when that is empty), the instruction template
    removed first so that it does not count as overlap."""

    def strip(p: Problem) -> str:
        text = p.question or p.prompt  # the raw problem, without a chat template's wrapping
        if template_free:
            for part in DAPO_TEMPLATE.split("{problem}"):
                text = text.replace(part, " ")
        return text

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
        return [self.problems[i] for i in itertools.islice(self.offers(), n)]

    def offers(self) -> Iterator[int]:
        """The stream as problem indices; the position advances only as far as it is read
        (prompt selection decides on each offer and never takes one it has not decided on)."""
        while True:
            if self.index >= len(self._order):
                self.epoch += 1
                self.index = 0
                self._order = self._shuffle(self.epoch)
            i = self._order[self.index]
            self.index += 1
            yield i

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "size": len(self.problems)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["size"] != len(self.problems) or state["seed"] != self.seed:
            raise ValueError("the checkpoint's data position belongs to another dataset or seed")
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._shuffle(self.epoch)
