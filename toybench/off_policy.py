"""The ``off_policy`` family: what rollout staleness and engine mismatch do to the runs DAPO
fixes, and which correction holds.

Three parts, every arm on the same paired seeds and both seed blocks:

* **Grid** (:func:`grid_experiment`, the composite task of the ladder, all four failure
  modes present): GRPO (unprotected) and DAPO at staleness k in :data:`STALENESS`, with and
  without partial rollouts, under each correction of :data:`dapo.offpolicy.CORRECTIONS`
  (DAPO with every one; GRPO with none and token TIS), and DAPO on an engine that rounds
  its logits to bf16 or fp8 at k = 0. At k = 0 every correction is the same run exactly
  (the engine agrees with the trainer, every weight is 1, nothing is rejected; tested), so
  each base has one k = 0 arm. Summaries: accuracy at the horizon (equal optimizer steps),
  accuracy at a fixed budget of generated tokens (:data:`TOKEN_BUDGET`), entropy, the step
  entropy collapses (below half its start), divergence (a non-finite step, or accuracy
  falling back by 0.1 from its best). Each off-policy arm is compared with its base at
  k = 0 (paired by seed).
* **Protection** (:func:`protection_experiments`): each failure-mode experiment's
  unprotected and fixed arms at every k, no correction: does Clip-Higher, dynamic sampling,
  the token-level loss, overlong filtering still protect when the rollouts are stale?
* **Clock** (:func:`clock`): the simulated generation times the toys already log (a long
  tail of per-response slowdowns) through a bounded-staleness pipeline, so each k's
  wall-clock gain sits beside what it costs in accuracy.

**Tolerated staleness** of a configuration: the largest k such that at k and every smaller
k the paired difference "accuracy at the horizon - the same base at k = 0" still matches by
a criterion of :data:`CRITERIA` (no significant loss; or non-inferior within
:data:`MARGIN`), per seed block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from dapo import PRESETS
from dapo.offpolicy import CORRECTIONS, correction_fields
from dapo.pipeline import simulate

from .check import MODES
from .experiment import (
    Arm,
    Contrast,
    Experiment,
    ExperimentResult,
    Log,
    Summary,
    at_budget,
    final,
    mean_over_run,
)
from .ladder import LR, TASK, toy_config
from .stats import Interval

STALENESS = (0, 1, 2, 4, 8)
"""Policy versions (training steps) between the weights that sample and the weights that
learn."""
STEPS = 150
MARGIN = 0.02
"""Non-inferiority margin on expected accuracy for "still matches k = 0"."""
TOKEN_BUDGET = 150_000.0
"""Generated tokens at which "accuracy at equal generated tokens" is read, fixed before
running (about half of what a DAPO run generates on the composite task in 150 steps)."""
COLLAPSE = 0.5
"""Entropy has collapsed at the first step it falls below this share of its first value."""
FALLBACK = 0.1
"""A run diverged if its accuracy (5-step mean) falls this far below its best, or a step
was skipped for a non-finite loss."""
GRPO_CORRECTIONS = ("none", "token_tis")
PARTIAL_CORRECTIONS = ("none", "token_tis", "decoupled")
PRECISION_CORRECTIONS = ("none", "token_tis", "icepop", "geo_rs")
PRECISIONS = ("bf16", "fp8")
BASES = {"grpo": PRESETS["grpo"], "dapo": PRESETS["dapo"]}
CORRECTION_LABELS = {
    "none": "none (plain async PPO)",
    "bypass": "bypass PPO clip",
    "token_tis": "token TIS (cap 2)",
    "seq_tis": "sequence TIS (cap 2)",
    "icepop": "IcePop (token, [0.5, 5])",
    "seq_mis": "sequence MIS",
    "geo_rs": "geometric-mean rejection",
    "k3_rs": "k3 rejection",
    "decoupled": "decoupled PPO (AReaL)",
}
"""Legend text of each correction of :data:`dapo.offpolicy.CORRECTIONS` in the figures."""
FIGURE_FAMILIES = (
    ("PPO variants", False, ("none", "bypass", "decoupled")),
    ("importance weights", False, ("none", "token_tis", "seq_tis", "icepop")),
    ("rejection", False, ("none", "seq_mis", "geo_rs", "k3_rs")),
    ("partial rollouts", True, ("none", "token_tis", "decoupled")),
)
"""The off-policy figure's columns (DAPO base): a title, partial rollouts or not, and the
corrections drawn, each beside ``none``."""


def arm_name(base: str, k: int, partial: bool = False, correction: str = "none", precision: str = "") -> str:
    if precision:
        return f"{base}_{precision}_{correction}"
    if k == 0 and not partial:
        return f"{base}_k0"
    return f"{base}_k{k}{'_partial' if partial else ''}_{correction}"


@dataclass(frozen=True)
class Config:
    """A configuration whose tolerated staleness is reported: a base, partial or not, a
    correction (or an engine precision at k = 0)."""

    base: str
    partial: bool
    correction: str

    @property
    def label(self) -> str:
        return f"{self.base}{' +partial' if self.partial else ''}, {self.correction}"

    def arm(self, k: int) -> str:
        return arm_name(self.base, k, self.partial, self.correction)


def configs() -> list[Config]:
    out = [Config("dapo", False, c) for c in CORRECTIONS]
    out += [Config("dapo", True, c) for c in PARTIAL_CORRECTIONS]
    out += [Config("grpo", False, c) for c in GRPO_CORRECTIONS]
    out += [Config("grpo", True, "none")]
    return out


def _first_below_half(metric: str) -> Summary:
    def fn(log: Log) -> float:
        start = next((m[metric] for m in log if math.isfinite(m.get(metric, math.nan))), math.nan)
        for m in log:
            v = m.get(metric, math.nan)
            if math.isfinite(v) and v < COLLAPSE * start:
                return m["step"]
        return float(len(log))  # censored at the horizon

    return Summary(fn, f"first step {metric} falls below {COLLAPSE:.0%} of its start (horizon if never)")


def _diverged(log: Log) -> float:
    if any(m.get("actor/skipped_steps", 0.0) > 0 for m in log):
        return 1.0
    acc = [m["toy/expected_accuracy"] for m in log]
    smooth = [sum(acc[max(0, i - 4) : i + 1]) / len(acc[max(0, i - 4) : i + 1]) for i in range(len(acc))]
    return 1.0 if max(smooth) - smooth[-1] > FALLBACK else 0.0


SUMMARIES: dict[str, Summary] = {
    "accuracy_final": Summary(final("toy/expected_accuracy"), "exact expected accuracy, last 10 steps"),
    "accuracy_at_tokens": Summary(
        at_budget("toy/expected_accuracy", "cost/tokens_total", TOKEN_BUDGET),
        f"exact expected accuracy when {TOKEN_BUDGET:,.0f} tokens have been generated",
    ),
    "entropy_final": Summary(final("actor/entropy"), "token entropy, last 10 steps"),
    "entropy_mean": Summary(mean_over_run("actor/entropy"), "token entropy averaged over the run"),
    "collapse_step": _first_below_half("actor/entropy"),
    "diverged": Summary(_diverged, f"1 if a step was skipped or accuracy fell {FALLBACK} below its best"),
    "k3_kl": Summary(mean_over_run("mismatch/k3_kl"), "mean k3 KL(engine || trainer) per token"),
}


def grid_experiment(steps: int = STEPS, staleness: Sequence[int] = STALENESS) -> Experiment:
    """The grid on the composite task (see the module docstring)."""
    arms: dict[str, Arm] = {}
    contrasts: list[Contrast] = []
    for base, cfg in BASES.items():
        arms[arm_name(base, 0)] = Arm(toy_config(cfg), LR)
    for c in configs():
        cfg = toy_config(BASES[c.base]).replace(**correction_fields(c.correction))
        for k in staleness:
            if k == 0:
                continue
            name = c.arm(k)
            arms[name] = Arm(cfg, LR, faults={"staleness": k, "partial": c.partial})
            for summary in ("accuracy_final", "entropy_final"):
                contrasts.append(Contrast(f"{name} {summary}", arm_name(c.base, 0), name, summary, "?"))
    for precision in PRECISIONS:
        for corr in PRECISION_CORRECTIONS:
            name = arm_name("dapo", 0, correction=corr, precision=precision)
            cfg = toy_config(BASES["dapo"]).replace(**correction_fields(corr))
            arms[name] = Arm(cfg, LR, faults={"mismatch": precision})
            contrasts.append(Contrast(f"{name} accuracy_final", "dapo_k0", name, "accuracy_final", "?"))
    contrasts.insert(0, Contrast("DAPO over GRPO on-policy", "grpo_k0", "dapo_k0", "accuracy_final", "+"))
    return Experiment(
        name="off_policy",
        title="Staleness, partial rollouts and engine precision, with each correction",
        paper="DAPO's fixes under asynchronous RL (verl fully-async, AReaL, prime-rl); corrections of verl and AReaL",
        task=TASK,
        steps=steps,
        arms=arms,
        summaries=SUMMARIES,
        contrasts=tuple(contrasts),
        curves=("toy/expected_accuracy", "actor/entropy", "mismatch/k3_kl"),
    )


def protection_experiments(staleness: Sequence[int] = STALENESS) -> list[Experiment]:
    """Each failure mode's unprotected and fixed arm at every k, no correction; contrasts
    fix - unprotected at each k in the fix's direction."""
    from .experiments import REGISTRY

    out = []
    for mode in MODES.values():
        exp = REGISTRY[mode.experiment]
        arms: dict[str, Arm] = {}
        labels: dict[str, str] = {}
        contrasts = []
        for k in staleness:
            for role in (mode.unprotected, mode.fix):
                arm = exp.arms[role]
                arms[f"{role}_k{k}"] = replace(arm, faults={**arm.faults, "staleness": k}) if k else arm
                labels[f"{role}_k{k}"] = f"{exp.labels.get(role, role)}, k={k}"
            contrasts.append(
                Contrast(
                    f"{mode.fix_name} at k={k}",
                    f"{mode.unprotected}_k{k}",
                    f"{mode.fix}_k{k}",
                    mode.summary,
                    mode.better,
                )
            )
        out.append(
            replace(
                exp,
                name=f"off_policy_{mode.name}",
                arms=arms,
                labels=labels,
                summaries={mode.summary: exp.summaries[mode.summary]},
                contrasts=tuple(contrasts),
            )
        )
    return out


# ---- analysis ------------------------------------------------------------------------------


def _contrast(result: ExperimentResult, name: str):
    return next(c for c in result.contrasts if c.contrast.name == name)


CRITERIA = ("no_loss", "non_inferior")
"""How "still matches k = 0" is judged on the interval of (arm - k0) in accuracy:
``no_loss``, the issue's reading, k = 0's value lies within or below the interval (its upper
end >= 0: no significant loss; weak when the interval is wide); ``non_inferior``, the
interval lies above -:data:`MARGIN` (a loss larger than the margin is ruled out; strict,
and with 10 seeds a block's interval is often wider than the margin)."""


def matches(iv: Interval, criterion: str = "no_loss") -> bool:
    if iv.n == 0 or not (math.isfinite(iv.low) and math.isfinite(iv.high)):
        return False
    if criterion == "no_loss":
        return iv.high >= 0
    if criterion == "non_inferior":
        return iv.low > -MARGIN
    raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")


def tolerated(
    result: ExperimentResult,
    config: Config,
    staleness: Sequence[int] = STALENESS,
    criterion: str = "no_loss",
) -> dict[str, int]:
    """Per seed block, the largest k (of ``staleness``) up to which every k still matches
    the same base at k = 0 on accuracy at the horizon, by ``criterion`` (:data:`CRITERIA`)."""
    out = {}
    for block in result.blocks:
        best = 0
        for k in staleness:
            if k == 0:
                continue
            c = _contrast(result, f"{config.arm(k)} accuracy_final")
            if not matches(c.blocks[block].interval, criterion):
                break
            best = k
        out[block] = best
    return out


POWER = 0.8
"""The chance, when staleness costs nothing, that a block establishes non-inferiority within
:data:`MARGIN` (:func:`seeds_for`)."""
ALPHA = 0.05
PLANNED_SD = 0.045
"""The paired standard deviation of (arm - k0) in accuracy at the horizon that the seed count
was planned with: the median over the 120 row-blocks of the 10 + 10-seed run before
(reports/off_policy at 54c8ca2; from each BCa interval's half-width x sqrt(n) / 1.96; 80th
percentile 0.055, largest 0.085)."""


def seeds_for(sd: float, margin: float = MARGIN, alpha: float = ALPHA, power: float = POWER) -> int:
    """Paired seeds per block that establish non-inferiority within ``margin`` (the interval's
    lower end above -margin) with probability ``power`` when the true difference is 0, at
    one-sided level ``alpha`` (a 95% two-sided interval's lower end): the normal approximation
    ``n = ((z_{1-alpha} + z_{power}) sd / margin)^2``."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf
    return math.ceil(((z(1 - alpha) + z(power)) * sd / margin) ** 2)


def power_at(sd: float, n: int, margin: float = MARGIN, alpha: float = ALPHA) -> float:
    """The probability of establishing non-inferiority within ``margin`` with ``n`` paired seeds
    when the true difference is 0 and the paired standard deviation ``sd`` (normal approximation)."""
    from statistics import NormalDist

    if sd <= 0:
        return 1.0
    nd = NormalDist()
    return nd.cdf(margin * math.sqrt(n) / sd - nd.inv_cdf(1 - alpha))


def verdict(intervals: dict[int, dict[str, Interval]], margin: float = MARGIN) -> tuple[int | None, str]:
    """A configuration's tolerated staleness from its intervals ``{k: {block: interval}}`` of
    (arm - k0) in accuracy: the largest k up to which both blocks establish non-inferiority
    within ``margin`` (the interval's lower end above -margin), and what stops it there, in
    words: both blocks (agreed), or one, with whether that block's interval straddles the
    margin (unresolved: too few seeds for that row) or lies wholly below it (a loss beyond the
    margin on one block). None: the blocks disagree at the first k."""
    best = 0
    for k in sorted(intervals):
        ivs = intervals[k]
        bad = [b for b, iv in ivs.items() if not iv.low > -margin]
        if not bad:
            best = k
            continue
        if len(bad) == len(ivs):
            lost = all(iv.high < -margin for iv in ivs.values())
            why = (
                "a loss beyond the margin on both blocks"
                if lost
                else "not shown within the margin on either block"
            )
            return best, f"up to k = {best} (both blocks); at k = {k} {why}"
        b = bad[0]
        iv = ivs[b]
        how = (
            "its interval straddles the margin (unresolved)"
            if iv.high > -margin
            else "a loss beyond the margin"
        )
        return None, f"blocks disagree at k = {k}: {b} {iv.mean:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}], {how}"
    return best, f"up to k = {best} (both blocks)"


CLOCK_TRAIN = (0.5, 1.0, 2.0)
"""Training cost per step, in units of the mean on-policy generation time per step."""


def pipeline_time(gen: Sequence[float], train: float, k: int) -> list[float]:
    """Finish time of each training step when one generator and one trainer overlap with
    at most ``k`` versions between them (:func:`dapo.pipeline.simulate`, the clock the
    full-regime trainer runs on): k = 0 is the synchronous loop (generate, then train)."""
    return simulate(gen, train, k).trained


def generation_times(log: Log, partial: bool) -> list[float]:
    """Per step, the simulated generation time with the long tail (``toy/gen_time_tail1``:
    each round waits for its slowest response); with partial rollouts the generator is
    interrupted instead of waiting, so a step costs its responses' mean time per round
    (``toy/gen_time_tail1_mean``, the work-conserving limit)."""
    key = "toy/gen_time_tail1_mean" if partial else "toy/gen_time_tail1"
    return [m[key] for m in log]


__all__ = [
    "CLOCK_TRAIN",
    "CRITERIA",
    "MARGIN",
    "PLANNED_SD",
    "POWER",
    "STALENESS",
    "Config",
    "arm_name",
    "configs",
    "generation_times",
    "grid_experiment",
    "matches",
    "pipeline_time",
    "protection_experiments",
    "tolerated",
]
