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

**Tolerated staleness** of a configuration: :mod:`toybench.noninferiority`'s fixed-sequence
procedure on the paired differences (arm - the same base at k = 0) in accuracy and entropy at
the horizon, on both seed blocks (:func:`verdicts`).
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
from .noninferiority import Verdict, judge

STALENESS = (0, 1, 2, 4, 8)
"""Policy versions (training steps) between the weights that sample and the weights that
learn."""
STEPS = 150
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

SEEDS = 45
"""Paired seeds per block: :func:`toybench.noninferiority.plan_seeds` at the pilot's 80th-percentile
paired standard deviations (:data:`toybench.noninferiority.PILOT`), the fewest with which a
configuration whose staleness costs nothing is tolerated up to k = 8 with 80% probability."""
SEED_START = 64
"""The table's first seed: the pilot that fixed the margins and the seed count ran seeds 0..63."""
SUMMARY_OF = {"accuracy": "accuracy_final", "entropy": "entropy_final"}
"""The summary each metric of :data:`toybench.noninferiority.METRICS` is judged on."""


def _contrast(result: ExperimentResult, name: str):
    return next(c for c in result.contrasts if c.contrast.name == name)


def differences(
    result: ExperimentResult, config: Config, staleness: Sequence[int] = STALENESS
) -> dict[str, dict[int, dict[str, list[float]]]]:
    """Per metric, k >= 1 and seed block, the per-seed paired differences (arm - the same base at
    k = 0) that :func:`toybench.noninferiority.judge` reads."""
    return {
        metric: {
            k: {
                b: [float(x) for x in _contrast(result, f"{config.arm(k)} {summary}").blocks[b].per_seed]
                for b in result.blocks
            }
            for k in staleness
            if k
        }
        for metric, summary in SUMMARY_OF.items()
    }


def verdicts(result: ExperimentResult, staleness: Sequence[int] = STALENESS) -> dict[str, Verdict]:
    """Every configuration's place on the ladder (:func:`toybench.noninferiority.judge`)."""
    return {c.label: judge(differences(result, c, staleness)) for c in configs()}


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
    "SEEDS",
    "SEED_START",
    "STALENESS",
    "SUMMARY_OF",
    "Config",
    "arm_name",
    "configs",
    "differences",
    "generation_times",
    "grid_experiment",
    "pipeline_time",
    "protection_experiments",
    "verdicts",
]
