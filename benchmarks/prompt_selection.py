"""Benchmark: generated groups and tokens per informative group, by prompt selection policy.

The stationary arms of the toy ``prompt_selection`` experiment (64 prompts of graded
difficulty, :mod:`toybench.experiments.prompt_selection`): no filtering, dynamic sampling
alone, and dynamic sampling after each selection policy of :mod:`dapo.prompt_selection`
(GRESO, retire-when-solved, difficulty pools), on paired seeds (two blocks pooled). Per arm:
groups and tokens generated per informative group (mean and a normal 95% interval over
seeds), the ratio to dynamic sampling alone measured on the same seeds, the acceptance rate
(informative groups / generated groups, what ``dapo plan --acceptance`` and
``--selection-acceptance`` take), and accuracy at equal generated tokens and at the horizon.
Then the planner's generation time per step for the 32B preset on 128 GPUs at dynamic
sampling's acceptance and at each policy's. Writes benchmarks/results/prompt_selection.json.

    python benchmarks/prompt_selection.py [--seeds 10]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ARMS = ("no_filter", "ds", "greso", "retire", "pools")


def _ci(values: list[float]) -> list[float]:
    n = len(values)
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    h = 1.96 * sd / math.sqrt(n)
    return [round(m, 3), round(m - h, 3), round(m + h, 3)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="seeds per block (two blocks, pooled)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "prompt_selection.json")
    args = ap.parse_args(argv)

    from dataclasses import replace

    from scale.config import load
    from scale.ops.plan import Cluster, Strategy, plan
    from toybench.experiment import run_experiments
    from toybench.experiments.prompt_selection import EXPERIMENT

    exp = replace(EXPERIMENT, arms={a: EXPERIMENT.arms[a] for a in ARMS}, contrasts=())
    t0 = time.perf_counter()
    (result,) = run_experiments([exp], seeds=args.seeds, jobs=1, progress=False)
    wall = time.perf_counter() - t0
    s = result.summaries
    arms: dict[str, dict[str, object]] = {}
    for arm in ARMS:
        groups, tokens = s["groups_per_informative"][arm], s["tokens_per_informative"][arm]
        ratio = [t / d for t, d in zip(tokens, s["tokens_per_informative"]["ds"])]
        arms[arm] = {
            "groups_per_informative": _ci(groups),
            "tokens_per_informative": _ci(tokens),
            "tokens_per_informative_vs_ds": _ci(ratio),
            "acceptance": round(len(groups) / sum(groups), 3),
            "accuracy_at_equal_tokens": _ci(s["accuracy_at_equal_tokens"][arm]),
            "accuracy_at_horizon": _ci(s["accuracy_final"][arm]),
        }
    cfg = load("qwen2.5-32b-dapo", [])
    cluster = Cluster(nodes=16, gpus_per_node=8, gpu_mem_gib=80)
    planner = {}
    for arm in ("ds", "greso", "retire", "pools"):
        step = plan(cfg, cluster, Strategy(acceptance=float(arms[arm]["acceptance"]))).step_seconds  # type: ignore[arg-type]
        planner[arm] = {k: round(v, 1) for k, v in step.items()}
    out = {
        "command": "python benchmarks/prompt_selection.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "seeds": result.seeds,
        "horizon_steps": exp.steps,
        "wall_s": round(wall, 1),
        "arms": arms,
        "planner_32b_128_gpus_step_seconds": planner,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(
        f"{'arm':<10} {'groups/inf':>18} {'tokens/inf':>24} {'vs ds':>20} {'accept':>7} {'32B gen min/step':>17}"
    )
    for arm in ARMS:
        a = arms[arm]
        g, t, r = a["groups_per_informative"], a["tokens_per_informative"], a["tokens_per_informative_vs_ds"]
        gen = planner.get(arm, {}).get("generation")
        print(
            f"{arm:<10} {g[0]:>6.2f} [{g[1]:.2f}, {g[2]:.2f}] {t[0]:>8.1f} [{t[1]:.1f}, {t[2]:.1f}] "  # type: ignore[index]
            f"{r[0]:>6.2f}x [{r[1]:.2f}, {r[2]:.2f}] {a['acceptance']:>7.3f} "  # type: ignore[index]
            f"{'' if gen is None else f'{gen / 60:.1f}':>17}"
        )
    print(f"{wall:.0f} s; {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
