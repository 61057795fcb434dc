"""Benchmark: memory-bounded log-probs/entropy (dapo.logprobs.chunked_logprobs) against the
naive full-logits path at Qwen2.5's vocabulary (152,064), forward + backward.

Each path runs in a fresh subprocess; peak memory is the process's peak RSS above its
level after the inputs were allocated (CPU), or torch.cuda.max_memory_allocated (GPU).
Values and gradients of the two paths are compared in the parent. Writes
benchmarks/results/logprobs_memory.json.

    python benchmarks/logprobs_memory.py [--tokens 2048] [--hidden 896] [--chunk 512]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

VOCAB = 152_064


def _inputs(tokens: int, hidden: int, device: str):
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(tokens, hidden, generator=g) * 0.5).to(device).requires_grad_(True)
    w = (torch.randn(VOCAB, hidden, generator=g) * 0.02).to(device).requires_grad_(True)
    y = torch.randint(0, VOCAB, (tokens,), generator=g).to(device)
    gl = torch.randn(tokens, generator=g).to(device)
    return h, w, y, gl


def child(path: str, tokens: int, hidden: int, chunk: int, out: str) -> None:
    from dapo.logprobs import chunked_logprobs, naive_logprobs

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(max(1, torch.get_num_threads()))
    h, w, y, gl = _inputs(tokens, hidden, device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    if path == "chunked":
        logp, ent = chunked_logprobs(h, w, y, chunk=chunk)
    else:
        logp, ent = naive_logprobs(h, w, y)
    (logp * gl).sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    secs = time.perf_counter() - t0
    torch.save(
        {
            "logp": logp.detach().cpu(),
            "entropy": ent.detach().cpu(),
            "grad_h": h.grad.cpu(),
            "grad_w": w.grad.cpu(),
            "peak_bytes": peak,
            "seconds": secs,
            "device": device,
        },
        out,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--child", nargs=2, metavar=("PATH", "OUT"))
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.tokens, args.hidden, args.chunk, args.child[1])
        return
    res = {}
    tmp = Path(__file__).parent / "results"
    tmp.mkdir(exist_ok=True)
    for path in ("naive", "chunked"):
        out = tmp / f".{path}.pt"
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--tokens",
                str(args.tokens),
                "--hidden",
                str(args.hidden),
                "--chunk",
                str(args.chunk),
                "--child",
                path,
                str(out),
            ],
            check=True,
        )
        res[path] = torch.load(out, weights_only=True)
        out.unlink()
    a, b = res["naive"], res["chunked"]
    diffs = {
        k: float((a[k].double() - b[k].double()).abs().max()) for k in ("logp", "entropy", "grad_h", "grad_w")
    }
    logits_bytes = args.tokens * VOCAB * 4
    report = {
        "benchmark": "chunked vs naive log-prob + entropy, forward + backward",
        "command": f"python benchmarks/logprobs_memory.py --tokens {args.tokens} --hidden {args.hidden} "
        f"--chunk {args.chunk}",
        "device": a["device"],
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "vocab": VOCAB,
        "tokens": args.tokens,
        "hidden": args.hidden,
        "chunk": args.chunk,
        "fp32_logits_bytes": logits_bytes,
        "naive": {"peak_bytes": a["peak_bytes"], "seconds": round(a["seconds"], 3)},
        "chunked": {"peak_bytes": b["peak_bytes"], "seconds": round(b["seconds"], 3)},
        "peak_memory_ratio_chunked_over_naive": round(b["peak_bytes"] / max(1, a["peak_bytes"]), 4),
        "time_ratio_chunked_over_naive": round(b["seconds"] / a["seconds"], 3),
        "max_abs_diff": diffs,
        "tolerance": {"logp": 1e-4, "entropy": 1e-4, "grad_h": 1e-5, "grad_w": 1e-5},
    }
    report["within_tolerance"] = all(diffs[k] <= report["tolerance"][k] for k in diffs)
    name = "logprobs_memory.json" if a["device"] == "cpu" else "logprobs_memory_gpu.json"
    (tmp / name).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
