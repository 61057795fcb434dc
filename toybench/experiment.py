"""Experiments as data: arms, a horizon, summaries declared before running, paired
contrasts with an expected direction, and the machinery that runs them over seeds."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dapo import AlgoConfig

from .runner import RunSpec
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
    """Fault injection passed to :class:`RunSpec` (``engine_noise``, ``engine_noise_from``,
    ``lr_boost``, ``lr_boost_from``, ``nan_steps``)."""
    loss: str = "dapo"
    """The policy loss (a :func:`dapo.registry.resolve` spec; see ``dapo toy check``)."""
    selection: str | None = None
    """Prompt selection before generation (:attr:`toybench.runner.RunSpec.selection`)."""
    drift_at: int | None = None
    """The step the task drifts at (:attr:`toybench.runner.RunSpec.drift_at`)."""
    optimizer: str = "sgd"
    """The tabular policy's optimizer (:attr:`toybench.runner.RunSpec.optimizer`)."""


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
    labels: dict[str, str] = field(default_factory=dict)
    """Legend text per arm in the figures (an arm without one is shown by its name)."""

    def spec(self, arm: str, seed: int, policy: str = "tabular", steps: int | None = None) -> RunSpec:
        a = self.arms[arm]
        lr = a.lr if policy == "tabular" else a.lr_gru
        return RunSpec(
            task=a.task or self.task,
            cfg=a.cfg,
            steps=steps or self.steps,
            lr=lr,
            seed=seed,
            policy=policy,
            task_kwargs=dict(a.task_kwargs),
            loss=a.loss,
            selection=a.selection,
            drift_at=a.drift_at,
            optimizer=a.optimizer if policy == "tabular" else "sgd",
            **a.faults,
        )


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


def seed_blocks(n: int, start: int = 0, confirm: bool = True) -> dict[str, list[int]]:
    """The discovery block ``start .. start + n - 1`` and the disjoint confirmation block
    that follows it (``start + n .. start + 2n - 1``); without ``confirm``, discovery only."""
    if n < 1 or start < 0:
        raise ValueError(f"need n >= 1 seeds and start >= 0, got n={n}, start={start}")
    blocks = {"discovery": list(range(start, start + n))}
    if confirm:
        blocks["confirmation"] = list(range(start + n, start + 2 * n))
    return blocks


@dataclass
class BlockResult:
    interval: Interval
    verdict: str
    per_seed: list[float]


@dataclass
class ContrastResult:
    contrast: Contrast
    blocks: dict[str, BlockResult]
    verdict: str
    """The block verdict when every block agrees; ``fragile`` when they differ."""

    @property
    def interval(self) -> Interval:
        """The discovery block's interval."""
        return self.blocks["discovery"].interval

    @property
    def fragile(self) -> bool:
        return self.verdict == FRAGILE


FRAGILE = "fragile"


def combine(verdicts: Sequence[str]) -> str:
    """A finding holds only where every seed block gives the same verdict."""
    return verdicts[0] if len(set(verdicts)) == 1 else FRAGILE


@dataclass
class ExperimentResult:
    experiment: Experiment
    seeds: list[int]
    """Every seed run (all blocks, in order)."""
    logs: dict[str, dict[int, Log]]
    summaries: dict[str, dict[str, list[float]]]
    """summary -> arm -> value per seed (in ``seeds`` order)."""
    contrasts: list[ContrastResult]
    cpu_seconds: float
    policy: str = "tabular"
    blocks: dict[str, list[int]] = field(default_factory=dict)
    """Seed blocks (``discovery``, ``confirmation``) the contrasts are judged on."""

    @property
    def primary(self) -> ContrastResult:
        return next(c for c in self.contrasts if c.contrast.role == "primary")

    def sampled_tokens(self) -> float:
        return sum(log[-1]["cost/tokens_total"] for runs in self.logs.values() for log in runs.values())


def evaluate(
    exp: Experiment,
    seeds: list[int],
    logs: dict[str, dict[int, Log]],
    cpu: float,
    policy: str = "tabular",
    blocks: dict[str, list[int]] | None = None,
) -> ExperimentResult:
    blocks = blocks or {"discovery": list(seeds)}
    summaries = {
        name: {arm: [s.fn(logs[arm][seed]) for seed in seeds] for arm in exp.arms}
        for name, s in exp.summaries.items()
    }
    position = {seed: i for i, seed in enumerate(seeds)}
    results = []
    for c in exp.contrasts:
        b = summaries[c.summary_b or c.summary][c.b]
        a = summaries[c.summary][c.a] if c.a is not None else [0.0] * len(b)
        per_block = {}
        for block, members in blocks.items():
            diffs = [b[position[s]] - a[position[s]] for s in members]
            iv = paired_interval(diffs)
            per_block[block] = BlockResult(iv, verdict(iv, c.expect), diffs)
        results.append(ContrastResult(c, per_block, combine([r.verdict for r in per_block.values()])))
    return ExperimentResult(exp, seeds, logs, summaries, results, cpu, policy, blocks)


def run_experiments(
    experiments: Sequence[Experiment],
    seeds: int | Sequence[int] = 10,
    jobs: int | None = None,
    policy: str = "tabular",
    steps: int | None = None,
    *,
    seed_start: int = 0,
    confirm: bool = True,
    engine: str = "batched",
    progress: bool = True,
    stats: dict[str, int] | None = None,
    memo: bool = False,
    blocks: dict[str, list[int]] | None = None,
) -> list[ExperimentResult]:
    """Run every arm of every experiment on the same seeds (paired) and evaluate them.

    ``seeds`` is the block size: the discovery block ``seed_start ..`` and, unless
    ``confirm=False``, the disjoint confirmation block after it; an explicit list of seeds
    is one block. ``jobs`` processes (default: CPU count) share the work; ``engine``
    ``batched`` stacks runs that can share a tensor computation (:mod:`toybench.engine`),
    ``loop`` trains every run on its own (:func:`toybench.runner.train`). Results depend
    on neither. A run two experiments share (the same :class:`RunSpec`) is trained once;
    with ``memo``, so is a run of a built-in loss that an earlier call trained, in this
    process or another (:mod:`toybench.memo`). ``stats``, when given, receives ``runs`` (trained), ``run_ids``
    (asked for) and ``reused`` (taken from the memo). ``blocks`` names the seed blocks
    outright (``{"discovery": [...], "confirmation": [...]}``) in place of ``seeds``."""
    from . import memo as kept
    from .scheduler import execute, plan

    if steps is not None:
        experiments = [with_steps(e, steps) for e in experiments]
    if blocks is not None:
        blocks = {name: list(members) for name, members in blocks.items()}
    elif isinstance(seeds, int):
        blocks = seed_blocks(seeds, seed_start, confirm)
    else:
        blocks = {"discovery": list(seeds)}
    seed_list = [s for members in blocks.values() for s in members]
    # a run two experiments share (the same spec: a control arm, a k = 0 arm) is trained once
    same: dict[str, list[tuple[str, str, int]]] = {}
    runs = []
    reused: dict[str, Log] = {}
    keep: set[str] = set()  # the specs of trained runs the memo keeps
    for e in experiments:
        for arm in e.arms:
            for s in seed_list:
                spec = e.spec(arm, s, policy)
                key = repr(spec)
                if key not in same:
                    same[key] = []
                    kept_here = memo and kept.keeps(spec)
                    log = kept.get((engine, key)) if kept_here else None
                    if log is not None:
                        reused[key] = log
                    else:
                        runs.append(((e.name, arm, s), spec))
                        if kept_here:
                            keep.add(key)
                same[key].append((e.name, arm, s))
    if stats is not None:
        stats.update(runs=len(runs), run_ids=sum(len(v) for v in same.values()), reused=len(reused))
    job_list = plan(runs, engine)
    done = execute(job_list, jobs or os.cpu_count() or 1, show_progress=progress) if job_list else []
    logs: dict[str, dict[str, dict[int, Log]]] = {e.name: {a: {} for a in e.arms} for e in experiments}
    cpu: dict[str, float] = {e.name: 0.0 for e in experiments}
    for key, log in reused.items():
        for name, arm, seed in same[key]:
            logs[name][arm][seed] = log
    for job, (pairs, secs) in zip(job_list, done):
        for (_, log), (_, spec) in zip(pairs, job.runs):
            key = repr(spec)
            if key in keep:
                kept.put((engine, key), log)
            users = same[key]
            for name, arm, seed in users:
                logs[name][arm][seed] = log
            for name, _, _ in users:  # a job's CPU time, split by its runs and their users
                cpu[name] += secs / len(job.runs) / len(users)
    for per_arm in logs.values():  # in the seeds' order, whichever runs were read back
        for arm, by_seed in per_arm.items():
            per_arm[arm] = {s: by_seed[s] for s in seed_list if s in by_seed}
    return [evaluate(e, seed_list, logs[e.name], cpu[e.name], policy, blocks) for e in experiments]


def with_steps(exp: Experiment, steps: int) -> Experiment:
    return replace(exp, steps=steps)
