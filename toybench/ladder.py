"""The Table-1 ladder and the full 2^5 factorial on the composite toy task.

The paper's Table 1 is cumulative: each rung inherits the ones above, so it cannot say
what a technique contributes on its own, with the others, or in another order. Here:

* :func:`run_ladder`: the six presets of ``dapo.config.PRESETS`` in the paper's order;
* :func:`run_factorial`: all 32 combinations of the five switches; main effects and
  two-way interactions with bootstrap intervals (resampling seeds, paired across cells);
  and every technique's contribution averaged over all 120 orders of addition
  (Shapley values) with the range over orders, so a reader sees how much the paper's
  order matters.

Every cell runs the same seeds (paired). The response is the exact expected accuracy of
the tabular policy (mean over the last 10 steps, and averaged over the run).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dapo import PRESETS, SWITCHES, AlgoConfig, with_switches

from .experiment import Arm, Experiment, Summary, final, mean_over_run, run_experiments
from .stats import paired_interval

TASK = "composite"
STEPS = 150
LR = 20.0
TOY = dict(
    group_size=8,
    train_groups=16,
    mini_batch_groups=4,
    expected_len=12,
    cache_len=4,
    max_grad_norm=None,
    max_gen_rounds=5,
)
"""The composite task's geometry (ceiling 16 tokens, soft ramp 12..16 above the 9-token
answers the long prompts need); everything else comes from the preset or the switches."""

RESPONSES: dict[str, Summary] = {
    "accuracy_final": Summary(final("toy/expected_accuracy"), "exact expected accuracy, last 10 steps"),
    "accuracy_mean": Summary(
        mean_over_run("toy/expected_accuracy"), "exact expected accuracy averaged over the run"
    ),
    "entropy_final": Summary(final("actor/entropy"), "token entropy, last 10 steps"),
    "truncation_final": Summary(final("rollout/truncation_rate"), "truncation rate, last 10 steps"),
    "length_final": Summary(final("rollout/length_mean"), "mean response length, last 10 steps"),
    "uniform_groups_final": Summary(
        final("rollout/groups_all_wrong"), "share of all-wrong groups, last 10 steps"
    ),
    "best_path_final": Summary(
        final("toy/best_path_prob"), "probability of the rare better path, last 10 steps"
    ),
    "responses_total": Summary(
        lambda log: log[-1]["cost/responses_total"], "responses generated over the run"
    ),
}


def toy_config(cfg: AlgoConfig) -> AlgoConfig:
    return cfg.replace(**TOY)


VARIANTS: dict[str, dict[str, str]] = {
    "dapo+unpenalized": {"filtered_group_stats": "unpenalized"},
    "dapo+excluded": {"filtered_group_stats": "excluded"},
}
"""The dapo rung with truncated responses spared the length penalty in the group
statistics, or left out of them (``AlgoConfig.filtered_group_stats``), compared with the
dapo rung (``shaped``, the default)."""


def ladder_experiment(steps: int = STEPS) -> Experiment:
    arms = {rung: Arm(toy_config(cfg), LR) for rung, cfg in PRESETS.items()}
    arms.update(
        {name: Arm(toy_config(PRESETS["dapo"].replace(**change)), LR) for name, change in VARIANTS.items()}
    )
    return Experiment(
        name="ladder",
        title="Table-1 ladder on the composite toy",
        paper="Table 1 (cumulative)",
        task=TASK,
        steps=steps,
        arms=arms,
        summaries=RESPONSES,
        contrasts=(),
        curves=("toy/expected_accuracy", "actor/entropy", "rollout/truncation_rate"),
    )


def cell_name(on: Sequence[str]) -> str:
    return "+".join(on) if on else "none"


def factorial_experiment(steps: int = STEPS) -> Experiment:
    arms = {}
    for mask in itertools.product([False, True], repeat=len(SWITCHES)):
        on = [s for s, m in zip(SWITCHES, mask) if m]
        arms[cell_name(on)] = Arm(toy_config(with_switches(on)), LR)
    return Experiment(
        name="factorial",
        title="2^5 factorial on the composite toy",
        paper="Table 1 (decomposed)",
        task=TASK,
        steps=steps,
        arms=arms,
        summaries=RESPONSES,
        contrasts=(),
    )


# ---- analysis ---------------------------------------------------------------------------------


@dataclass
class Effect:
    name: str
    mean: float
    low: float
    high: float


def _bootstrap(
    stat: Callable[[np.ndarray], float], table: np.ndarray, seed: int = 0, n: int = 2000
) -> tuple[float, float]:
    """Percentile interval of ``stat(table[:, resampled seeds])`` (seeds are the columns)."""
    rng = np.random.default_rng(seed)
    k = table.shape[1]
    vals = [stat(table[:, rng.integers(0, k, k)]) for _ in range(n)]
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return float(lo), float(hi)


def _design() -> tuple[list[str], np.ndarray]:
    names, rows = [], []
    for mask in itertools.product([False, True], repeat=len(SWITCHES)):
        names.append(cell_name([s for s, m in zip(SWITCHES, mask) if m]))
        rows.append([1.0 if m else -1.0 for m in mask])
    return names, np.array(rows)


def factorial_effects(
    values: dict[str, list[float]], columns: Sequence[int] | None = None
) -> dict[str, list[Effect]]:
    """Main effects and two-way interactions (difference of means between the +1 and -1
    halves of the design, +-1 coding) with bootstrap intervals over seeds (``columns``:
    the positions of one seed block; default all)."""
    names, x = _design()
    table = np.array([values[n] for n in names])  # [cells, seeds]
    if columns is not None:
        table = table[:, list(columns)]
    switches = list(SWITCHES)

    def effect(col: np.ndarray) -> Callable[[np.ndarray], float]:
        return lambda t: float(t[col > 0].mean() - t[col < 0].mean())

    main, inter = [], []
    for i, s in enumerate(switches):
        f = effect(x[:, i])
        lo, hi = _bootstrap(f, table)
        main.append(Effect(s, f(table), lo, hi))
    for i, j in itertools.combinations(range(len(switches)), 2):
        f = effect(x[:, i] * x[:, j])
        lo, hi = _bootstrap(f, table)
        inter.append(Effect(f"{switches[i]} x {switches[j]}", f(table), lo, hi))
    return {"main": main, "interactions": inter}


def shapley(values: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Each technique's contribution f(S + i) - f(S), averaged over all orders of addition
    (the Shapley value), with its range over orders, its value in the paper's order, and a
    bootstrap interval over seeds of the Shapley value."""
    switches = list(SWITCHES)
    names, _ = _design()
    index = {n: i for i, n in enumerate(names)}
    table = np.array([values[n] for n in names])

    def contributions(col_means: np.ndarray) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {s: [] for s in switches}
        for order in itertools.permutations(switches):
            on: list[str] = []
            for s in order:
                before = col_means[index[cell_name([t for t in switches if t in on])]]
                on.append(s)
                after = col_means[index[cell_name([t for t in switches if t in on])]]
                out[s].append(after - before)
        return out

    base = contributions(table.mean(axis=1))
    rng = np.random.default_rng(0)
    boot = {s: [] for s in switches}
    k = table.shape[1]
    for _ in range(500):
        c = contributions(table[:, rng.integers(0, k, k)].mean(axis=1))
        for s in switches:
            boot[s].append(float(np.mean(c[s])))
    paper_order_index = list(itertools.permutations(switches)).index(tuple(switches))
    res = {}
    for s in switches:
        lo, hi = np.percentile(boot[s], [2.5, 97.5])
        res[s] = {
            "shapley": float(np.mean(base[s])),
            "low": float(lo),
            "high": float(hi),
            "min_over_orders": float(np.min(base[s])),
            "max_over_orders": float(np.max(base[s])),
            "paper_order": float(base[s][paper_order_index]),
        }
    return res


def holds(signs: list[int], paper: int | None = 1) -> str:
    """Whether an effect holds on every seed block (``signs``: per block, +1/-1 when the 95%
    interval excludes zero above/below, 0 when it holds zero). Each technique of the paper's
    Table 1 raises accuracy (``paper`` = +1): ``yes`` when every block agrees with it,
    ``reversed`` when every block goes against it; a comparison the paper makes no claim on
    (``paper`` None, the variants) reads ``higher``/``lower``. ``no effect`` when no block
    excludes zero, ``fragile`` when the blocks disagree."""
    if len(set(signs)) != 1:
        return "fragile"
    if signs[0] == 0:
        return "no effect"
    if paper is None:
        return "higher" if signs[0] > 0 else "lower"
    return "yes" if signs[0] == paper else "reversed"


def ladder_steps(
    values: dict[str, list[float]], seeds: list[int], blocks: dict[str, list[int]]
) -> list[dict[str, float | str]]:
    """Per rung: mean with a 95% interval (all seeds), and the paired step from the rung
    before on each seed block (``step_<block>``, ``low_<block>``, ``high_<block>``) with
    ``holds`` (:func:`holds`: ``yes`` only in the paper's direction, a gain; ``reversed``
    for a loss). The variants (:data:`VARIANTS`) follow, each compared with the dapo rung
    (``higher``/``lower``: the paper has no such claim)."""
    out = []
    prev = None
    pos = {s: i for i, s in enumerate(seeds)}
    for rung in [*PRESETS, *(v for v in VARIANTS if v in values)]:
        v = np.array(values[rung])
        lo, hi = _bootstrap(lambda t: float(t.mean()), v[None, :])
        row: dict[str, float | str] = {"rung": rung, "mean": float(v.mean()), "low": lo, "high": hi}
        base = prev if rung in PRESETS else "dapo"
        if base is not None:
            row["vs"] = base
            signs = []
            for block, members in blocks.items():
                idx = [pos[s] for s in members]
                iv = paired_interval(list(v[idx] - np.array(values[base])[idx]))
                row.update({f"step_{block}": iv.mean, f"low_{block}": iv.low, f"high_{block}": iv.high})
                signs.append(1 if iv.low > 0 else -1 if iv.high < 0 else 0)
            row["holds"] = holds(signs, 1 if rung in PRESETS else None)
        out.append(row)
        if rung in PRESETS:
            prev = rung
    return out


def timed(fn: Callable, *args, **kwargs):
    t0 = time.perf_counter()
    res = fn(*args, **kwargs)
    return res, time.perf_counter() - t0


def run(
    kind: str,
    seeds: int,
    jobs: int | None = None,
    steps: int = STEPS,
    seed_start: int = 0,
    confirm: bool = True,
    progress: bool = True,
):
    exp = ladder_experiment(steps) if kind == "ladder" else factorial_experiment(steps)
    (result,), wall = timed(
        run_experiments,
        [exp],
        seeds=seeds,
        jobs=jobs,
        seed_start=seed_start,
        confirm=confirm,
        progress=progress,
    )
    return result, wall


def nan_to_none(x: float) -> float | None:
    return None if isinstance(x, float) and math.isnan(x) else x
