"""Data files shaped like BytedTsinghua-SIA/DAPO-Math-17k (17k prompts, each in 100 rows) and
BytedTsinghua-SIA/AIME-2024 (30 problems, each in 32 rows), in their exact schema, smaller:

    data_source  str                       "math_dapo"
    prompt       [{"content": str, "role": "user"}]   (the instruction already in the content)
    ability      str                       "MATH"
    reward_model {"ground_truth": str, "style": "rule-lang"}
    extra_info   {"index": str}            (a uuid; AIME-2024: an int)

Parquet (what the hub serves) or JSONL. The copies of a problem are spread over the file
(seeded shuffle), so the first row of each problem is not simply its index."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def problem_text(i: int, kind: str = "dapo") -> str:
    return (
        f"[{kind} {i}] Let $n = {i + 7}$. Find the number of ordered pairs $(a, b)$ of positive "
        f"integers with $a + b = n$ and $a < {3 * i + 5}$."
    )


def answer(i: int) -> int:
    return 3 * i + 11


def rows(unique: int, copies: int, *, kind: str = "dapo", seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    ids = [uuid.UUID(int=rng.getrandbits(128)).hex if kind == "dapo" else i for i in range(unique)]
    for i in range(unique):
        for _ in range(copies):
            out.append(
                {
                    "data_source": "math_dapo",
                    "prompt": [
                        {"content": INSTRUCTION.format(problem=problem_text(i, kind)), "role": "user"}
                    ],
                    "ability": "MATH",
                    "reward_model": {"ground_truth": str(answer(i)), "style": "rule-lang"},
                    "extra_info": {"index": ids[i] if kind == "dapo" else i},
                }
            )
    rng.shuffle(out)
    return out


def write(path: Path, records: list[dict]) -> Path:
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def dapo_math(path: Path, unique: int = 170, copies: int = 100) -> Path:
    """DAPO-Math-17k's shape at 1/100: 170 prompts x 100 = 17,000 rows."""
    return write(path, rows(unique, copies, kind="dapo"))


def aime_2024(path: Path, unique: int = 30, copies: int = 32) -> Path:
    """AIME-2024's shape: 30 problems x 32 = 960 rows."""
    return write(path, rows(unique, copies, kind="aime", seed=1))


def first_rows(records: list[dict]) -> dict[str, int]:
    """The 1-based row at which each prompt first appears."""
    out: dict[str, int] = {}
    for i, r in enumerate(records, 1):
        out.setdefault(r["prompt"][0]["content"], i)
    return out


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A Qwen2.5-like chat template (ChatML), small enough to read."""


def tokenizer(chat_template: str | None = CHAT_TEMPLATE, extra_words: tuple[str, ...] = ()):
    """A fast word-level tokenizer (transformers) over the words of the files above, with the
    ChatML special tokens and, unless None, ``chat_template``."""
    import re

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = set(re.findall(r"\w+|[^\w\s]", INSTRUCTION + problem_text(0) + problem_text(0, "aime")))
    words |= set(extra_words)
    vocab = {w: i for i, w in enumerate(["<unk>", "<|endoftext|>", *sorted(words)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def model_dir(path: Path, chat_template: str | None = CHAT_TEMPLATE) -> Path:
    """A directory that ``dapo eval`` and ``dapo train --validate-only`` take for a model: the
    :func:`tokenizer` and a config.json (no weights: enough for everything before generation)."""
    path = Path(path)
    tokenizer(chat_template).save_pretrained(path)
    (path / "config.json").write_text("{}\n")
    return path
