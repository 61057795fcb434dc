"""Experiments as data: arms, a horizon, summaries declared before running, paired
contrasts with an expected direction, and the machinery that runs them over seeds."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from dapo import AlgoConfig

from .runner import RunSpec, train
from .stats import Interval, paired_interval, verdict

Log = list[dict[str, float]]


@dataclass(frozen=True)
class Arm:
    """One treatment: an algorithm config and how to train it."""

    cfg: AlgoConfig
    lr: float
    """Learning rate of the tabular policy (plain SGD on logits)."""
    lr_gru: float = 3e-3
    """Learning rate of the GRU policy (Adam)."""
    task: str | None = None
    """Task override (defaults to the experiment's task)."""
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, Any] = field(default_factory=dict)
    """Fault injection passed to :class:`RunSpec` (``engine_noise``, ``nan_steps``)."""


@dataclass(frozen=True)
class Summary:
    """A scalar computed from one run's per-step log."""

    fn: Callable[[Log], float]
    description: str


@dataclass(frozen=True)
class Contrast:
    """Paired difference ``summary_b(arm b) - summary(arm a)`` over seeds.

    ``a=None`` compares arm b's summary against zero (a within-arm claim, such as a
    metric's change over training)."""

    name: str
    a: str | None
    b: str
    summary: str
    expect: str
    """``+`` / ``-``: the direction the paper predicts for b - a; ``0``: a negative control
    (no effect expected); ``?``: no prediction, the direction is reported."""
    role: str = "primary"
    """``primary`` (the experiment's claim), ``secondary`` (reported, also asserted in tests
    when the direction is predicted) or ``control``."""
    summary_b: str | None = None
    """Summary for arm b when it differs from ``summary`` (e.g. two metrics of one arm)."""
    note: str = ""


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    paper: str
    """What in the paper this reproduces (figure, section)."""
    task: str
    steps: int
    """The horizon, declared before running."""
    arms: dict[str, Arm]
    summaries: dict[str, Summary]
    contrasts: tuple[Contrast, ...]
    notes: str = ""
    """What the design isolates and where the effect is known to vanish or reverse."""
    curves: tuple[str, ...] = ("actor/entropy",)
    """Metrics drawn per arm in the report figure."""
    x_axis: str = "step"

    def spec(self, arm: str, seed: int, policy: str = "tabular", steps: int | None = None) -> RunSpec:
        a = self.arms[arm]
        lr = a.lr if policy == "tabular" else a.lr_gru
        return RunSpec(task=a.task or self.task, cfg=a.cfg, steps=steps or self.steps, lr=lr, seed=seed,
                       policy=policy, task_kwargs=dict(a.task_kwargs), **a.faults)


# ---- summaries ---------------------------------------------------------------------------

def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def final(metric: str, last: int = 10) -> Callable[[Log], float]:
    """Mean of ``metric`` over the last ``last`` steps (NaN steps ignored)."""

    def fn(log: Log) -> float:
        vals = _finite([m.get(metric, math.nan) for m in log[-last:]])
        return sum(vals) / len(vals) if vals else math.nan

    return fn


def change(metric: str, window: int = 10) -> Callable[[Log], float]:
    """Mean of the last ``window`` steps minus mean of the first ``window`` steps."""

    def fn(log: Log) -> float:
        head = _finite([m.get(metric, math.nan) for m in log[:window]])
        tail = _finite([m.get(metric, math.nan) for m in log[-window:]])
        if not head or not tail:
            return math.nan
        return sum(tail) / len(tail) - sum(head) / len(head)

    return fn


def mean_over_run(metric: str) -> Callable[[Log], float]:
    def fn(log: Log) -> float:
        vals = _finite([m.get(metric, math.nan) for m in log])
        return sum(vals) / len(vals) if vals else math.nan

    return fn


def first_reaching(metric: str, threshold: float, x: str, smooth: int = 1) -> Callable[[Log], float]:
    """The value of ``x`` at the first step where ``metric`` (mean of the last ``smooth``
    steps) reaches ``threshold``; censored at the horizon's value of ``x`` if never."""

    def fn(log: Log) -> float:
        for i in range(len(log)):
            window = _finite([m.get(metric, math.nan) for m in log[max(0, i - smooth + 1) : i + 1]])
            if window and sum(window) / len(window) >= threshold:
                return log[i][x]
        return log[-1][x]

    return fn


def at_budget(metric: str, x: str, budget: float) -> Callable[[Log], float]:
    """``metric`` at the first step where ``x`` (a cumulative cost) reaches ``budget``,
    or at the horizon if the run never spends that much."""

    def fn(log: Log) -> float:
        for m in log:
            if m[x] >= budget:
                return m.get(metric, math.nan)
        return log[-1].get(metric, math.nan)

    return fn


# ---- running -------------------------------------------------------------------------------

def _cost(spec: RunSpec) -> float:
    """Rough relative cost of a run, for scheduling only."""
    c = spec.cfg
    windows = -(-c.train_groups // c.mini_batch_groups) * c.ppo_epochs
    rounds = 3 if c.dynamic_sampling else 1
    return spec.steps * (windows + rounds) * c.train_groups * c.group_size


def _run_job(job: tuple[str, str, int, RunSpec]) -> tuple[str, str, int, Log, float]:
    import torch

    torch.set_num_threads(1)
    name, arm, seed, spec = job
    t0 = time.perf_counter()
    log = train(spec)
    return name, arm, seed, log, time.perf_counter() - t0


@dataclass
class ContrastResult:
    contrast: Contrast
    interval: Interval
    verdict: str
    per_seed: list[float]


@dataclass
class ExperimentResult:
    experiment: Experiment
    seeds: list[int]
    logs: dict[str, dict[int, Log]]
    summaries: dict[str, dict[str, list[float]]]
    """summary -> arm -> value per seed (in ``seeds`` order)."""
    contrasts: list[ContrastResult]
    cpu_seconds: float
    policy: str = "tabular"

    @property
    def primary(self) -> ContrastResult:
        return next(c for c in self.contrasts if c.contrast.role == "primary")

    def sampled_tokens(self) -> float:
        return sum(log[-1]["cost/tokens_total"] for runs in self.logs.values() for log in runs.values())


def evaluate(exp: Experiment, seeds: list[int], logs: dict[str, dict[int, Log]], cpu: float,
             policy: str = "tabular") -> ExperimentResult:
    summaries = {
        name: {arm: [s.fn(logs[arm][seed]) for seed in seeds] for arm in exp.arms}
        for name, s in exp.summaries.items()
    }
    results = []
    for c in exp.contrasts:
        b = summaries[c.summary_b or c.summary][c.b]
        a = summaries[c.summary][c.a] if c.a is not None else [0.0] * len(b)
        diffs = [y - x for x, y in zip(a, b)]
        iv = paired_interval(diffs)
        results.append(ContrastResult(c, iv, verdict(iv, c.expect), diffs))
    return ExperimentResult(exp, seeds, logs, summaries, results, cpu, policy)


def run_experiments(
    experiments: Sequence[Experiment],
    seeds: int | Sequence[int] = 10,
    jobs: int | None = None,
    policy: str = "tabular",
    steps: int | None = None,
) -> list[ExperimentResult]:
    """Run every arm of every experiment on the same seeds (paired) and evaluate them.

    ``jobs`` worker processes (default: CPU count, at most 2 threads' worth on a laptop);
    results do not depend on ``jobs``."""
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    todo = [
        (e.name, arm, s, e.spec(arm, s, policy, steps))
        for e in experiments
        for arm in e.arms
        for s in seed_list
    ]
    # longest jobs first, so no worker idles at the end (results do not depend on order)
    todo.sort(key=lambda j: -_cost(j[3]))
    jobs = jobs or os.cpu_count() or 1
    if jobs > 1:
        with mp.get_context("spawn").Pool(jobs) as pool:
            done = list(pool.imap_unordered(_run_job, todo, chunksize=1))
    else:
        done = [_run_job(j) for j in todo]
    logs: dict[str, dict[str, dict[int, Log]]] = {e.name: {a: {} for a in e.arms} for e in experiments}
    cpu: dict[str, float] = {e.name: 0.0 for e in experiments}
    for name, arm, seed, log, secs in done:
        logs[name][arm][seed] = log
        cpu[name] += secs
    return [evaluate(e, seed_list, logs[e.name], cpu[e.name], policy) for e in experiments]


def with_steps(exp: Experiment, steps: int) -> Experiment:
    return replace(exp, steps=steps)
