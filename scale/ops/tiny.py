"""A tiny random-weight Qwen2 and a word-level tokenizer, built locally (no downloads), for
tests, the CPU smoke run and benchmarks. head_dim is 64: vLLM's CPU attention rejects 16."""

from __future__ import annotations

import sys
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<pad>", "<unk>"]
WORDS = [str(d) for d in range(10)] + ["Answer:", "\n", "+", "-", "=", "Q:", "?", ",", "."]


def build_tiny_model(
    path: str | Path,
    *,
    vocab: int = 24,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    intermediate: int = 256,
    seed: int = 0,
    max_positions: int = 512,
    format_steps: int = 150,
    filler_mean: float | None = None,
) -> Path:
    """Write a small Qwen2 (tied embeddings) and its tokenizer to ``path``; return it.

    Weights are random, then ``format_steps`` of supervised steps teach the *format* only:
    "Q: a + b = ?" -> a few filler words, "Answer:", a uniformly random digit, EOS. The
    result is a base model that answers in the right form and is right about 1 time in 10,
    so groups of responses mix right and wrong answers as in real RL runs. ``filler_mean``:
    the filler's length is exponential with this mean instead of 0-3 words, so response
    lengths have a long tail and a round waits for its longest response (the benchmarks)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    words = SPECIAL + WORDS
    words += [f"w{i}" for i in range(vocab - len(words))]
    if len(words) != vocab:
        raise ValueError(f"vocab must be >= {len(SPECIAL) + len(WORDS)}")
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", behavior="isolated"), pre_tokenizers.WhitespaceSplit()]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(path)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        eos_token_id=0,
        pad_token_id=1,
        bos_token_id=None,
        head_dim=hidden // heads,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    if format_steps:
        _teach_format(model, fast, format_steps, seed, filler_mean)
    model.save_pretrained(path, safe_serialization=True)
    return path


def _teach_format(model, tokenizer, steps: int, seed: int, filler_mean: float | None = None) -> None:
    import random

    import torch

    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        rows, labels = [], []
        for _ in range(16):
            a, b = rng.randrange(5), rng.randrange(5)
            prompt = tokenizer(f"Q: {a} + {b} = ?").input_ids
            words = rng.randrange(4) if filler_mean is None else int(rng.expovariate(1.0 / filler_mean))
            filler = " ".join(rng.choice(["w0", "w1", ",", "."]) for _ in range(words))
            answer = [*tokenizer(f"{filler} Answer: {rng.randrange(10)}").input_ids, tokenizer.eos_token_id]
            rows.append(prompt + answer)
            labels.append([-100] * len(prompt) + answer)
        width = max(map(len, rows))
        ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
        loss = model(
            input_ids=ids, attention_mask=(lab != -100) | (ids != tokenizer.pad_token_id), labels=lab
        ).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def build_tiny_data(path: str | Path, n_train: int = 32, n_eval: int = 8, seed: int = 0) -> tuple[Path, Path]:
    """Addition problems with single-digit answers in the flat JSONL format, words the tiny
    tokenizer knows (so a random model is right by chance, often enough to train on). Each file
    is written whole and then renamed into place, so a process reading it while another builds
    it (CI runs the smoke run beside the tests) never sees it half written."""
    import json
    import os
    import random

    rng = random.Random(seed)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    files = []
    for name, n in (("train", n_train), ("eval", n_eval)):
        f = path / f"{name}.jsonl"
        tmp = path / f".{name}.jsonl.{os.getpid()}.tmp"
        with tmp.open("w") as out:
            for _ in range(n):
                a = rng.randrange(5)
                b = rng.randrange(5)
                out.write(json.dumps({"prompt": f"Q: {a} + {b} = ?", "answer": a + b}) + "\n")
        os.replace(tmp, f)
        files.append(f)
    return files[0], files[1]


TINY_DATA_FILES = ("train.jsonl", "eval.jsonl")
"""The files :func:`build_tiny_data` writes into a ``tiny-data`` directory."""


def is_tiny_data(spec: str | Path) -> bool:
    """Whether ``spec`` names one of the tiny preset's data files (``.../tiny-data/train.jsonl``
    or ``eval.jsonl``), which :func:`ensure_tiny` builds when it is missing."""
    path = Path(spec)
    return path.parent.name == "tiny-data" and path.name in TINY_DATA_FILES


def ensure_tiny(cfg, model: bool = True) -> None:
    """The tiny-cpu preset builds its random model and data on first use, saying so on stdout
    (stderr stays for the one line of a refusal)."""
    path = Path(cfg.model.path)
    if model and path.name == "tiny-model" and not path.exists():
        print(f"building the tiny random model {path} (once)", flush=True)
        build_tiny_model(path)
    for spec in (cfg.data.train, cfg.data.eval):
        if spec and is_tiny_data(spec) and not Path(spec).exists():
            print(f"building the tiny data {Path(spec).parent} (once)", flush=True)
            build_tiny_data(Path(spec).parent)


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs")
    print(build_tiny_model(root / "tiny-model"))
    print(*build_tiny_data(root / "tiny-data"))
