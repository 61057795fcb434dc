"""Benchmark: rollout throughput of the vllm engine against hf generate, at a size where
generation dominates: a ~50M-parameter random Qwen2, 64 prompts x 8 samples x 256 new
tokens (EOS ignored so every sample has the same length). Each engine runs in its own
subprocess on the same model and prompts (vLLM's CPU worker pins the process to one
thread, which would handicap hf generate in the same process). Writes
benchmarks/results/rollout_throughput.json.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python benchmarks/rollout_throughput.py
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

PROMPTS, SAMPLES, NEW_TOKENS, PROMPT_LEN = 64, 8, 256, 32


def build(path: Path) -> int:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from scale.ops.tiny import build_tiny_model

    build_tiny_model(path, format_steps=0)  # tokenizer; the model is replaced below
    cfg = Qwen2Config(
        vocab_size=32768,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=0,
        pad_token_id=1,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(path, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def run_vllm(model: Path, prompts: list[list[int]]) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(model),
        dtype="float32",
        enforce_eager=True,
        gpu_memory_utilization=0.3,
        max_model_len=PROMPT_LEN + NEW_TOKENS + 8,
        seed=0,
    )
    params = SamplingParams(n=SAMPLES, temperature=1.0, max_tokens=NEW_TOKENS, ignore_eos=True, seed=0)
    llm.generate([{"prompt_token_ids": p} for p in prompts[:2]], params, use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    secs = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    return {"seconds": round(secs, 2), "tokens": tokens, "tokens_per_second": round(tokens / secs, 1)}


def run_hf(model: Path, prompts: list[list[int]]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    ids = torch.tensor(prompts)
    with torch.no_grad():
        lm.generate(input_ids=ids[:2], do_sample=True, max_new_tokens=4, min_new_tokens=4, pad_token_id=1)
        t0 = time.perf_counter()
        out = lm.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            top_k=0,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            num_return_sequences=SAMPLES,
            pad_token_id=1,
        )
        secs = time.perf_counter() - t0
    tokens = int(out[:, PROMPT_LEN:].numel())
    return {
        "seconds": round(secs, 2),
        "tokens": tokens,
        "tokens_per_second": round(tokens / secs, 1),
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    import subprocess
    import sys

    import torch

    if len(sys.argv) == 4 and sys.argv[1] in ("vllm", "hf"):  # child
        model, out = Path(sys.argv[2]), Path(sys.argv[3])
        g = torch.Generator().manual_seed(0)
        prompts = torch.randint(3, 32768, (PROMPTS, PROMPT_LEN), generator=g).tolist()
        res = (run_vllm if sys.argv[1] == "vllm" else run_hf)(model, prompts)
        out.write_text(json.dumps(res))
        return
    tmp = Path(tempfile.mkdtemp())
    n_params = build(tmp)
    results = {}
    for engine in ("hf", "vllm"):
        out = tmp / f"{engine}.json"
        subprocess.run([sys.executable, __file__, engine, str(tmp), str(out)], check=True)
        results[engine] = json.loads(out.read_text())
    report = {
        "benchmark": "rollout throughput, vllm engine vs hf generate",
        "command": "VLLM_ENABLE_V1_MULTIPROCESSING=0 python benchmarks/rollout_throughput.py",
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "cuda": torch.cuda.is_available(),
        },
        "model_parameters": n_params,
        "prompts": PROMPTS,
        "samples": SAMPLES,
        "new_tokens": NEW_TOKENS,
        "prompt_len": PROMPT_LEN,
        **results,
        "speedup_vllm_over_hf": round(
            results["vllm"]["tokens_per_second"] / results["hf"]["tokens_per_second"], 2
        ),
    }
    out_path = Path(__file__).parent / "results" / "rollout_throughput.json"
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
