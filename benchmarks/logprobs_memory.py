"""Benchmark: memory-bounded log-probs/entropy (dapo.logprobs.chunked_logprobs) against the
naive full-logits path at Qwen2.5's vocabulary (152,064), forward + backward, with the
output layer in bf16 (default) or fp32.

naive: the full [tokens, V] logits (matmul in the weight's dtype, upcast to fp32) through
log_softmax with autograd (dapo.logprobs.naive_logprobs). chunked: chunked_logprobs, which
holds at most ``chunk`` rows of fp32 logits and never copies the weight to fp32. The loss
is sum(logp * g1 + entropy * g2) with random g1, g2, so both gradient terms run.

Each path runs in a fresh subprocess. The number reported is the extra memory beyond the
inputs and the weight: on CPU the process's peak RSS (VmHWM, reset through
/proc/self/clear_refs once the inputs exist) minus its RSS at that point; on GPU
torch.cuda.max_memory_allocated minus memory_allocated at that point. Both paths' extra
includes the gradients they return (hidden.grad, weight.grad). Values and gradients of the
two paths are compared in the parent. Writes benchmarks/results/logprobs_memory.json
(logprobs_memory_gpu.json on GPU).

    python benchmarks/logprobs_memory.py [--tokens 2048] [--hidden 896] [--chunk 256]
        [--dtype bfloat16|float32] [--out PATH]

Defaults: 2048 tokens, Qwen2.5-0.5B's hidden size 896, chunk 256, bf16: about 1.5 minutes
on a shared 2-core CPU with AMX (4096 tokens took 3.3 minutes there, most of it the naive
path). The issue's goal is chunked/naive extra memory <= 1/8. The chunked extra is about
weight.grad + 2 x chunk x V x 4 bytes whatever the token count, the naive one grows with
the tokens (about 5 x the fp32 logits), so the ratio falls as tokens grow: chunk 512 meets
the goal at 4096 tokens (0.084 measured) but not at 2048 (0.169); chunk 256 meets it at
2048. --dtype float32 keeps the old fp32 comparison (exact tolerances instead of bf16 ones)
and writes logprobs_memory_float32.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

VOCAB = 152_064
GOAL_RATIO = 1 / 8
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _inputs(tokens: int, hidden: int, dtype: torch.dtype, device: str):
    """Created block by block so no full-size fp32 temporary of the weight ever exists."""
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(tokens, hidden, generator=g) * 0.5).to(dtype).to(device).requires_grad_(True)
    w = torch.empty(VOCAB, hidden, dtype=dtype, device=device)
    for s in range(0, VOCAB, 8192):
        rows = min(8192, VOCAB - s)
        w[s : s + rows] = torch.randn(rows, hidden, generator=g) * 0.02
    w.requires_grad_(True)
    y = torch.randint(0, VOCAB, (tokens,), generator=g).to(device)
    g1 = torch.randn(tokens, generator=g).to(device)
    g2 = torch.randn(tokens, generator=g).to(device)
    return h, w, y, g1, g2


def _proc_status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _reset_peak_rss() -> bool:
    """Linux: writing 5 to /proc/self/clear_refs resets VmHWM (the peak RSS) to VmRSS."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def child(path: str, tokens: int, hidden: int, chunk: int, dtype: torch.dtype, out: str) -> None:
    from dapo.logprobs import chunked_logprobs, naive_logprobs

    device = "cuda" if torch.cuda.is_available() else "cpu"

    def run(h, w, y, g1, g2):
        if path == "chunked":
            logp, ent = chunked_logprobs(h, w, y, chunk=chunk)
        else:
            logp, ent = naive_logprobs(h, w, y)
        (logp * g1 + ent * g2).sum().backward()
        return logp, ent

    # warm-up on a small problem: one-time library setup (thread pools, kernels) stays
    # out of the measurement
    g = torch.Generator().manual_seed(1)
    h = torch.randn(8, hidden, generator=g).to(dtype).to(device).requires_grad_(True)
    w = (torch.randn(1024, hidden, generator=g) * 0.02).to(dtype).to(device).requires_grad_(True)
    y = torch.randint(0, 1024, (8,), generator=g).to(device)
    run(h, w, y, torch.ones(8, device=device), torch.ones(8, device=device))
    h, w, y, g1, g2 = _inputs(tokens, hidden, dtype, device)
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        method = "torch.cuda.max_memory_allocated - memory_allocated after the inputs"
    elif _reset_peak_rss():
        base = _proc_status_bytes("VmRSS")
        method = "VmHWM (reset via /proc/self/clear_refs after the inputs) - VmRSS after the inputs"
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        method = "ru_maxrss after the run - ru_maxrss after the inputs"
    t0 = time.perf_counter()
    logp, ent = run(h, w, y, g1, g2)
    if device == "cuda":
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
    elif method.startswith("VmHWM"):
        extra = _proc_status_bytes("VmHWM") - base
    else:
        extra = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    secs = time.perf_counter() - t0
    torch.save(
        {
            "logp": logp.detach().cpu(),
            "entropy": ent.detach().cpu(),
            "grad_h": h.grad.cpu(),
            "grad_w": w.grad.cpu(),
            "extra_bytes": extra,
            "seconds": secs,
            "device": device,
            "method": method,
        },
        out,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--out", type=Path, help="the JSON report (default: benchmarks/results/...)")
    ap.add_argument("--child", nargs=2, metavar=("PATH", "OUT"))
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    if args.child:
        child(args.child[0], args.tokens, args.hidden, args.chunk, dtype, args.child[1])
        return
    res = {}
    tmp = Path(__file__).parent / "results"
    tmp.mkdir(exist_ok=True)
    for path in ("naive", "chunked"):
        out = tmp / f".{path}.pt"
        cmd = [sys.executable, __file__, "--tokens", str(args.tokens), "--hidden", str(args.hidden)]
        cmd += ["--chunk", str(args.chunk), "--dtype", args.dtype, "--child", path, str(out)]
        subprocess.run(cmd, check=True)
        res[path] = torch.load(out, weights_only=True)
        out.unlink()
    a, b = res["naive"], res["chunked"]
    keys = ("logp", "entropy", "grad_h", "grad_w")
    diffs = {k: float((a[k].double() - b[k].double()).abs().max()) for k in keys}
    rel = {k: float((a[k].double() - b[k].double()).norm() / a[k].double().norm()) for k in keys}
    if dtype == torch.float32:
        tol = {"max_abs_diff": {"logp": 1e-4, "entropy": 1e-4, "grad_h": 1e-5, "grad_w": 1e-5}}
        ok = all(diffs[k] <= tol["max_abs_diff"][k] for k in keys)
    else:
        # bf16 logits and gradients: judged relative to the naive path's norm, as in
        # tests/test_logprobs.py (eps = 2**-7 for values, 2 eps for gradients)
        eps = torch.finfo(dtype).eps
        tol = {"rel_diff": {"logp": eps, "entropy": eps, "grad_h": 2 * eps, "grad_w": 2 * eps}}
        ok = all(rel[k] <= tol["rel_diff"][k] for k in keys)
    ratio = b["extra_bytes"] / max(1, a["extra_bytes"])
    gib = 1024**3
    itemsize = dtype.itemsize
    report = {
        "benchmark": "chunked vs naive log-prob + entropy, forward + backward (loss uses both)",
        "command": f"python benchmarks/logprobs_memory.py --tokens {args.tokens} --hidden {args.hidden} "
        f"--chunk {args.chunk} --dtype {args.dtype}",
        "device": a["device"],
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "dtype": args.dtype,
        "vocab": VOCAB,
        "tokens": args.tokens,
        "hidden": args.hidden,
        "chunk": args.chunk,
        "memory_measure": a["method"],
        "weight_bytes": VOCAB * args.hidden * itemsize,
        "grads_bytes": (VOCAB + args.tokens) * args.hidden * itemsize,
        "fp32_logits_bytes": args.tokens * VOCAB * 4,
        "fp32_chunk_logits_bytes": min(args.chunk, args.tokens) * VOCAB * 4,
        "naive": {
            "extra_bytes": a["extra_bytes"],
            "extra_gib": round(a["extra_bytes"] / gib, 3),
            "seconds": round(a["seconds"], 3),
        },
        "chunked": {
            "extra_bytes": b["extra_bytes"],
            "extra_gib": round(b["extra_bytes"] / gib, 3),
            "seconds": round(b["seconds"], 3),
        },
        "extra_memory_ratio_chunked_over_naive": round(ratio, 4),
        "goal_ratio": GOAL_RATIO,
        "meets_goal": ratio <= GOAL_RATIO,
        "time_ratio_chunked_over_naive": round(b["seconds"] / a["seconds"], 3),
        "max_abs_diff": diffs,
        "rel_diff": rel,
        "tolerance": tol,
        "within_tolerance": ok,
    }
    name = "logprobs_memory" + ("" if args.dtype == "bfloat16" else f"_{args.dtype}")
    name += "" if a["device"] == "cpu" else "_gpu"
    (args.out or tmp / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
