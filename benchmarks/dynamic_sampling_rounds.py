"""Benchmark: generation rounds per training step, dynamic sampling per rank against global.

Simulated, no model: each of ``--ranks`` rollout groups generates ``gen_groups / ranks``
prompts per round, and each prompt's group is informative (accepted) with probability
``p`` (independent draws). Two policies:

* **per rank** (the trainer before): every rank fills its own ``train_groups / ranks``
  quota; the step lasts as long as its slowest rank (the others wait in a collective), so
  the step's rounds are the maximum over ranks;
* **global** (:class:`scale.generator.rollout.GlobalDynamicSampler`): ranks count the accepted groups
  of all ranks after each round and stop together at ``train_groups``
  (:func:`dapo.sampling.trim_round_major` trims the surplus).

Both stop at ``--max-rounds`` (the step is then underfilled). Also reported: the token
imbalance over ranks (largest rank's tokens / mean) of the kept groups, each rank training
its own groups (per rank) against :func:`dapo.sampling.balance_groups` (global), with group
token counts drawn log-uniform between 16 x 200 and 16 x 20,480 (G = 16 responses of DAPO's
length range). Defaults are the paper's 32B run: 512 training prompts, 3 x 512 generated per
round (verl's DAPO recipe), 128 GPUs as 128 rollout groups (the worst case; with TP 4 there
are 32). Writes benchmarks/results/dynamic_sampling_rounds.json.

    python benchmarks/dynamic_sampling_rounds.py [--ranks 128] [--steps 2000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dapo.sampling import balance_groups, trim_round_major


def _ci(x: np.ndarray) -> list[float]:
    """Mean and a normal 95% interval of the mean."""
    m = float(x.mean())
    h = 1.96 * float(x.std(ddof=1)) / np.sqrt(len(x)) if len(x) > 1 else 0.0
    return [round(m, 3), round(m - h, 3), round(m + h, 3)]


def simulate(
    p: float, ranks: int, train: int, gen: int, max_rounds: int, steps: int, seed: int, balance_steps: int
) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    quota, per_round = train // ranks, gen // ranks
    # accepted[s, r, k]: groups rank k accepts in round r of step s
    accepted = rng.binomial(per_round, p, size=(steps, max_rounds, ranks))
    cum = accepted.cumsum(1)
    # per rank: the first round at which each rank holds its quota; the step waits for the slowest
    filled = cum >= quota
    rank_rounds = np.where(filled.any(1), filled.argmax(1) + 1, max_rounds)
    per_rank_rounds = rank_rounds.max(1)
    per_rank_short = (~filled[:, -1, :]).any(1)
    # global: the first round at which all ranks together hold train_groups
    total = cum.sum(2)
    gfilled = total >= train
    global_rounds = np.where(gfilled.any(1), gfilled.argmax(1) + 1, max_rounds)
    global_short = ~gfilled[:, -1]
    # token imbalance of the kept groups (a subset of steps: the partition is exact, not vectorised)
    lo, hi = np.log(16 * 200), np.log(16 * 20480)
    imb_own, imb_bal = [], []
    for s in range(min(balance_steps, steps)):
        r = int(global_rounds[s])
        kept = trim_round_major(accepted[s, :r].tolist(), train)
        n = sum(map(sum, kept))
        tokens = np.exp(rng.uniform(lo, hi, size=n)).astype(int)
        # per rank: each rank trains its own quota of groups (equal counts, its own lengths)
        own = tokens[: quota * ranks].reshape(ranks, quota).sum(1) if n >= quota * ranks else None
        if own is not None:
            imb_own.append(own.max() / own.mean())
        parts = balance_groups(tokens.tolist(), ranks)
        loads = np.array([tokens[q].sum() for q in parts])
        imb_bal.append(loads.max() / loads.mean())
    return {
        "acceptance": p,
        "rounds_per_step_per_rank": _ci(per_rank_rounds.astype(float)),
        "rounds_per_step_global": _ci(global_rounds.astype(float)),
        "ratio_per_rank_over_global": round(float(per_rank_rounds.mean() / global_rounds.mean()), 3),
        "underfilled_steps_per_rank": round(float(per_rank_short.mean()), 4),
        "underfilled_steps_global": round(float(global_short.mean()), 4),
        "mean_rank_rounds_per_rank": round(float(rank_rounds.mean()), 3),
        "token_imbalance_own_groups": _ci(np.array(imb_own)) if imb_own else None,
        "token_imbalance_balanced": _ci(np.array(imb_bal)) if imb_bal else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=128)
    ap.add_argument("--train-groups", type=int, default=512)
    ap.add_argument("--gen-groups", type=int, default=1536)
    ap.add_argument("--max-rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=2000, help="simulated training steps per acceptance rate")
    ap.add_argument("--balance-steps", type=int, default=100, help="steps whose token balance is computed")
    ap.add_argument("--acceptance", type=float, nargs="+", default=[0.1, 0.25, 0.5, 0.75])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "dynamic_sampling_rounds.json"
    )
    a = ap.parse_args()
    rows = [
        simulate(p, a.ranks, a.train_groups, a.gen_groups, a.max_rounds, a.steps, a.seed + i, a.balance_steps)
        for i, p in enumerate(a.acceptance)
    ]
    result = {
        "benchmark": "dynamic_sampling_rounds",
        "command": " ".join(["python", "benchmarks/dynamic_sampling_rounds.py", *sys.argv[1:]]),
        "settings": {k: v for k, v in vars(a).items() if k != "out"},
        "python": platform.python_version(),
        "rows": rows,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{'p':>5} {'per-rank rounds':>16} {'global rounds':>14} {'ratio':>6} {'imbalance own':>14} {'balanced':>9}"
    )
    for r in rows:
        own, bal = r["token_imbalance_own_groups"], r["token_imbalance_balanced"]
        print(
            f"{r['acceptance']:>5} {r['rounds_per_step_per_rank'][0]:>16} {r['rounds_per_step_global'][0]:>14} "
            f"{r['ratio_per_rank_over_global']:>6} {own[0] if own else float('nan'):>14} "
            f"{bal[0] if bal else float('nan'):>9}"
        )
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
