"""Benchmark: extra memory of the trainer -> engine weight sync under 2-process FSDP2 on CPU.

A ~200M-parameter random Qwen2 (fp32 masters) is sharded over 2 gloo processes with the
trainer's own FSDP2 path (:func:`scale.learner.sharding.build_policy`). An engine stand-in holds its
own bf16 copy of the model (as vLLM does) and copies every tensor it receives into it. Two
syncs run in the same processes:

* ``streaming``: :func:`scale.learner.sync.sync` with a bounded bucket (``rollout.sync_bucket_mb``);
* ``whole model``: what the trainer did before, every full tensor gathered (and cast) before
  the engine sees the first one.

Extra memory is measured two ways: the sync's own accounting (``sync/peak_bytes``) and the
process's resident memory, sampled every 0.5 ms during the sync, above its level at the
start. Writes benchmarks/results/sync_memory.json (rank 0's numbers; both ranks do the same).

    python benchmarks/sync_memory.py [--bucket-mb 32] [--layers 12]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "sync_memory.json"
PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class RssPeak:
    """Peak resident memory above the level at entry, sampled by a thread."""

    def __enter__(self) -> RssPeak:
        self.start = _rss()
        self.peak = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, _rss() - self.start)
            time.sleep(0.0005)

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join()
        self.peak = max(self.peak, _rss() - self.start)


class EngineStandIn:
    """Holds a bf16 copy of every weight and copies incoming tensors into it."""

    def __init__(self, lm, dtype) -> None:  # type: ignore[no-untyped-def]
        import torch

        self.weights = {}
        for name, t in lm.state_dict().items():
            shape = t.shape
            self.weights[name] = torch.zeros(shape, dtype=dtype)
        self.weights.setdefault("lm_head.weight", self.weights["model.embed_tokens.weight"])

    def sync_weights(self, stream) -> None:  # type: ignore[no-untyped-def]
        for name, t in stream:
            self.weights[name].copy_(t)


def child(model_dir: str, bucket_mb: float, out: str) -> None:
    import torch
    import torch.distributed.nn
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    from scale.config import load
    from scale.dist.topology import dist_timeout, shutdown
    from scale.learner.sharding import build_policy
    from scale.learner.sync import MIB, SyncStats, sync

    acc = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=dist_timeout(300))])
    cfg = load("tiny-cpu-fsdp", [f"model.path={model_dir}"])
    policy = build_policy(cfg, acc)[0]
    lm = policy.lm
    engine = EngineStandIn(lm, torch.bfloat16)
    result = {}
    torch.distributed.barrier()
    with RssPeak() as rss:
        stats = sync(engine, lm, dtype=torch.bfloat16, device="cpu", bucket_mb=bucket_mb)
    result["streaming"] = {
        "accounted_peak_bytes": stats.peak_bytes,
        "rss_peak_bytes": rss.peak,
        "seconds": stats.seconds,
    }
    largest = stats.largest_tensor_bytes
    torch.distributed.barrier()
    whole = SyncStats()
    t0 = time.perf_counter()
    with RssPeak() as rss:
        weights = []
        for name, t in lm.state_dict().items():  # the old path: everything gathered first
            full = t.full_tensor() if hasattr(t, "full_tensor") else t
            weights.append((name, full.to(torch.bfloat16)))
            whole.hold(weights[-1][1].numel() * 2)
        engine.sync_weights(iter(weights))
        del weights
    result["whole_model"] = {
        "accounted_peak_bytes": whole.peak_bytes,
        "rss_peak_bytes": rss.peak,
        "seconds": time.perf_counter() - t0,
    }
    params = sum(p.numel() for p in lm.parameters())  # DTensor.numel() is the global size
    result.update(
        {
            "parameters": int(params),
            "bucket_bytes": int(bucket_mb * MIB),
            "largest_tensor_bytes": largest,
            "processes": acc.num_processes,
        }
    )
    if acc.is_main_process:
        Path(out).write_text(json.dumps(result))
    del policy, lm, engine
    acc.free_memory()
    shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bucket-mb", type=float, default=32.0)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "BUCKET_MB", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], float(args.child[1]), args.child[2])
        return
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from scale.ops.tiny import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="dapo-sync-") as tmp:
        model_dir = Path(tmp) / "model"
        tiny = build_tiny_model(Path(tmp) / "tok", format_steps=0)
        cfg = Qwen2Config(
            vocab_size=8192,
            hidden_size=args.hidden,
            intermediate_size=4 * args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=args.hidden // 64,
            num_key_value_heads=max(1, args.hidden // 512),
            tie_word_embeddings=True,
        )
        torch.manual_seed(0)
        Qwen2ForCausalLM(cfg).save_pretrained(model_dir, safe_serialization=True)
        AutoTokenizer.from_pretrained(tiny).save_pretrained(model_dir)
        res = Path(tmp) / "out.json"
        # a fixed mmap threshold: glibc then returns every large block to the OS when it is
        # freed, so resident memory follows live tensors (its default threshold adapts upward
        # and keeps freed blocks mapped, which would count as sync memory)
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            "MALLOC_MMAP_THRESHOLD_": "131072",
        }
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node=2",
                __file__,
                "--child",
                str(model_dir),
                str(args.bucket_mb),
                str(res),
            ],
            check=True,
            env=env,
            cwd=ROOT,
            timeout=900,
        )
        r = json.loads(res.read_text())
    bound = 2 * max(r["bucket_bytes"], r["largest_tensor_bytes"])
    s, w = r["streaming"], r["whole_model"]
    r["bound_bytes"] = bound
    r["streaming_within_bound"] = {
        "accounted": s["accounted_peak_bytes"] <= bound,
        "rss": s["rss_peak_bytes"] <= bound,
    }
    r["ratio_streaming_to_whole"] = {
        "accounted": s["accounted_peak_bytes"] / w["accounted_peak_bytes"],
        "rss": s["rss_peak_bytes"] / max(1, w["rss_peak_bytes"]),
    }
    r["machine"] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    r["command"] = "python benchmarks/sync_memory.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "child"
    )
    OUT.write_text(json.dumps(r, indent=2) + "\n")
    print(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
