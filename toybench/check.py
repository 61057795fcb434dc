"""``dapo toy check LOSS``: does a policy loss protect against each failure mode?

For each of the four failure-mode experiments (:mod:`toybench.experiments`) the check runs
three kinds of arm on the same seeds (paired), on the batched toy engine:

* the experiment's *unprotected* arm (symmetric clip, sample-level loss, no dynamic
  sampling, -1 for truncation);
* DAPO's *fix* for that failure mode (Clip-Higher, token-level loss, dynamic sampling,
  overlong filtering);
* one *candidate* arm per loss: the unprotected arm with its policy loss replaced by the
  candidate and the clip/aggregation knobs set to the loss's own recipe (plus
  ``--set`` overrides). Sampling and reward knobs stay unprotected: a loss is judged on
  what the loss does.

**The step.** Every arm trains with :class:`toybench.optim.ScaleFreeSGD`: SGD's direction,
with a step length a constant factor on the loss does not change, as under the trainer's
AdamW. Under plain SGD a loss times 0.15 is the same loss at 0.15 times the learning rate,
and the check judged that step size (issue 69: the unprotected symmetric clip passed as an
entropy protection at x0.15). Each mode's step (:data:`STEP_ENTROPY` ...) is the one SGD
takes with DAPO's loss in the experiment.

Before any verdict, the **learning gate**, against DAPO's own loss: in each failure mode's
task the candidate's expected-accuracy gain over the run (last 10 steps minus step 0; a run
without updates keeps its step-0 policy, so this is the gain over a no-update control of the
same seed) must not be shown to fall short of :data:`LEARNING_MARGIN` of the gain of DAPO's
loss run in the same conditions, on the same seeds (the fix arm where the fix is a loss
property, else the unprotected arm, which runs DAPO's loss without the sampling or reward
fix): the interval of ``candidate - margin x DAPO`` must not lie below 0 on either seed
block. (A gate that asked the interval to lie *above* 0 failed DAPO's own loss at the
symmetric clip, which gains 0.89-0.91 of it; the per-seed reading below already keeps a
loss that learns too little on a seed from being read there.) At most
:data:`MAX_SKIPPED_SHARE` of its optimizer steps may be skipped for a non-finite loss. A loss
that fails gets ``cannot judge: learns too little`` and no protection verdict or share. A
**contract probe** (:func:`toybench.losses.probe_contract`) checks finiteness on empty rows and
fully masked micro-batches, invariance to padding, a gradient on every class of loss token
and the gradient's sign.

**A fixed yardstick.** DAPO's fix against the unprotected arm, both with DAPO's loss, is
measured once per seed block and is the same for every candidate; where it does not exclude
0 in the fix's direction on both blocks, the mode judges no candidate (``cannot judge: DAPO's
fix shows no effect here``). Where the fix is a property of the loss (entropy collapse,
length bias), the curve (entropy; the wrong path's length minus the right one's) is read at
**equal learning** in a window the two reference arms fix on each seed
(:mod:`toybench.matched`), and the candidate in the same window from its own crossing; a seed
it cannot be read on (never reaches the level, too late, a non-finite run) is left out and
named, and a block with fewer than :data:`~toybench.check_words.MIN_SEEDS` judged seeds is
``cannot judge: too few seeds``. Where the fix is sampling or reward shaping (zero gradient,
truncation noise), the summary is itself a measure of learning (steps to 80% accuracy, mean
accuracy) and is read at equal steps.

Per failure mode and loss it then reports **protects** (the paired difference candidate -
unprotected lies beyond :data:`~toybench.check_words.MIN_SHARE` of the fix's effect in its
direction; ``harms`` beyond it against; else ``no effect shown``; a verdict must hold on the
discovery and the confirmation seed block, else it is ``differs between seed blocks``, which
fails a claim) and **vs DAPO's fix** (candidate - fix: ``as fix`` when the interval lies
within +-``MIN_SHARE`` of the fix's effect, ``better``/``weaker`` when it excludes zero, else
``inconclusive``). A knob probe (:func:`toybench.losses.probe_knobs`) names each knob the loss
says it acts on but ignores. A loss fails the check when it breaks its contract, learns too
little, skips steps, does not protect against a failure mode it claims, or ignores a knob it
honours.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dapo.offpolicy import correction_fields
from dapo.registry import FAILURE_MODES, KNOBS, Loss, LossSpecError, knob_values, resolve, source_hash

from .check_words import (
    DOES_NOT_LEARN,
    FRAGILE,
    LEARNING_MARGIN,
    MIN_SEEDS,
    MIN_SHARE,
    NO_EFFECT,
    NO_YARDSTICK,
    PROTECTS,
    TOO_FEW,
    legend,
)
from .experiment import Arm, Experiment, ExperimentResult, Log, Summary, run_experiments
from .losses import knob_readings, probe_contract, probe_knobs, probe_line, uses_weights
from .matched import Window, gain, read, read_against, reference_window
from .stats import Interval, paired_interval

STEP_ENTROPY, STEP_LENGTH, STEP_ZERO_GRADIENT, STEP_TRUNCATION = 1.0, 0.45, 1.0, 0.6
"""Each failure mode's step length under :class:`toybench.optim.ScaleFreeSGD` (every arm of
the mode's check): the step plain SGD takes with DAPO's own loss in the experiment at its
learning rate, ``lr x`` the root mean square of the gradient norm over the run, on the arm
that runs DAPO's loss in the candidate's conditions (:attr:`FailureMode.reference`):
entropy collapse 50 x 0.0202 = 1.01, length bias 20 x 0.0227 = 0.45, zero gradient
20 x 0.0482 = 0.96, truncation 20 x 0.0304 = 0.61 (seeds 0-5; ``python -m
toybench.step_sweep --lengths`` prints them). So DAPO's own arms move about as far per step
as in the experiments; no candidate enters it."""

NOISE = 1e-9
"""An effect whose interval lies within +-``NOISE`` x the metric's scale (the largest
absolute value of that summary over the experiment's arms and seeds) is no effect, whatever
the interval says: two algebraically equal losses differ by rounding (1e-17), and a
zero-width interval at 1e-17 would otherwise "exclude 0"."""

MAX_SKIPPED_SHARE = 0.01
"""A candidate whose optimizer steps are skipped (non-finite loss or gradient) more often
than this, in any failure mode's runs, fails: skipped steps are steps it did not learn
from, and they bias every summary (a run that skips looks as if it learned less, or, on
"steps to 80%", can look faster)."""

LEARNING_METRIC = "toy/expected_accuracy"
"""The learning gate's metric: the policy's exact expected accuracy (no sampling noise)."""


@dataclass(frozen=True)
class FailureMode:
    name: str
    experiment: str
    unprotected: str
    """The experiment's arm without DAPO's fix."""
    fix: str
    """The experiment's arm with DAPO's fix."""
    fix_name: str
    summary: str
    """The experiment's primary summary."""
    better: str
    """``+`` or ``-``: the direction in which the fix moves ``summary``."""
    loss_can_act: bool
    """Whether DAPO's fix for it is a loss property (else sampling or reward shaping)."""
    curve: Callable[[dict[str, Any]], float] | None = None
    """The per-step value ``summary`` reads, for modes judged at equal learning
    (:mod:`toybench.matched`); None: judged at equal steps (the summary measures learning)."""
    step: float = 1.0
    """Every arm's step length under :class:`toybench.optim.ScaleFreeSGD` (:data:`STEP_ENTROPY`)."""

    @property
    def reference(self) -> str:
        """The arm that runs DAPO's own loss in the candidate's conditions (the learning gate's
        reference): the fix where it is a loss property, else the unprotected arm."""
        return self.fix if self.loss_can_act else self.unprotected


MODES: dict[str, FailureMode] = {
    "entropy_collapse": FailureMode(
        "entropy_collapse",
        "entropy_collapse",
        "symmetric",
        "clip_higher",
        "Clip-Higher",
        "entropy_final",
        "+",
        True,
        lambda m: m["actor/entropy"],
        STEP_ENTROPY,
    ),
    "zero_gradient": FailureMode(
        "zero_gradient",
        "zero_gradient",
        "no_ds",
        "dynamic_sampling",
        "dynamic sampling",
        "steps_to_target",
        "-",
        False,
        step=STEP_ZERO_GRADIENT,
    ),
    "length_bias": FailureMode(
        "length_bias",
        "length_bias",
        "sample_level",
        "token_level",
        "token-level loss",
        "length_gap",
        "-",
        True,
        lambda m: m["toy/length_worst_path"] - m["toy/length_best_path"],
        STEP_LENGTH,
    ),
    "truncation_noise": FailureMode(
        "truncation_noise",
        "truncation_noise",
        "punish",
        "filter",
        "overlong filtering",
        "accuracy_mean",
        "+",
        False,
        step=STEP_TRUNCATION,
    ),
}
assert tuple(MODES) == FAILURE_MODES


@dataclass
class Learning:
    """The learning gate in one failure mode's task: the candidate's expected-accuracy gain
    over the run (last 10 steps minus step 0, the gain over a no-update control of the same
    seed) against :data:`LEARNING_MARGIN` x the gain of DAPO's loss on the same seeds."""

    gain: dict[str, Interval]
    """Per seed block: the candidate's gain."""
    reference: dict[str, Interval]
    """Per seed block: the gain of DAPO's loss in the same conditions (:attr:`FailureMode.reference`)."""
    margin: dict[str, Interval]
    """Per seed block: candidate gain - :data:`LEARNING_MARGIN` x DAPO's, paired by seed."""
    learns: bool
    """On no block does the margin's interval lie below 0 (beyond :data:`NOISE`): the candidate
    is not shown to learn less than :data:`LEARNING_MARGIN` x DAPO's gain."""
    skipped: int
    """Optimizer steps skipped for a non-finite loss or gradient, over every seed."""
    steps: int
    """Optimizer steps taken or skipped, over every seed."""

    @property
    def skipped_share(self) -> float:
        return self.skipped / self.steps if self.steps else 0.0

    @property
    def skips(self) -> bool:
        """More than :data:`MAX_SKIPPED_SHARE` of the steps skipped: a failure."""
        return self.skipped_share > MAX_SKIPPED_SHARE


@dataclass
class ModeResult:
    mode: str
    protection: str
    """A word of :data:`VERDICTS`: ``protects``, ``no effect shown``, ``harms``, ``differs
    between seed blocks``, or one of the ``cannot judge`` verdicts (learns too little, DAPO's
    fix shows no effect here, too few seeds): no protection verdict."""
    vs_fix: str
    """``as fix``, ``better``, ``weaker``, ``inconclusive``, ``differs between seed blocks`` or ``n/a``."""
    effect: dict[str, Interval]
    """Per seed block: candidate - unprotected."""
    gap: dict[str, Interval]
    """Per seed block: candidate - fix."""
    fix_effect: dict[str, Interval]
    """Per seed block: fix - unprotected, DAPO's fix's own effect (the yardstick: measured
    with DAPO's loss, the same for every candidate)."""
    claimed: bool
    learning: Learning
    values: dict[str, float] = field(default_factory=dict)
    """The reading's mean over every seed for ``unprotected``, ``fix`` and ``candidate``
    (the absolute levels behind the paired differences)."""
    matched: bool = False
    """Read at equal learning (:mod:`toybench.matched`), not at equal steps."""
    blocks: dict[str, str] = field(default_factory=dict)
    """Per seed block: its own protection verdict (they differ where ``protection`` says so)."""
    unjudged: dict[int, str] = field(default_factory=dict)
    """Seeds left out of the protection verdict, each with why (no yardstick on it, the
    candidate never reaches DAPO's level or too late, a non-finite run)."""
    judged: dict[str, int] = field(default_factory=dict)
    """Per seed block: the seeds the protection verdict was read on."""

    @property
    def recovered(self) -> float:
        """Mean share of the fix's effect the candidate recovers (1 = as much as DAPO's fix,
        0 = none, < 0 = harm), pooled over the seed blocks; NaN for a candidate that does
        not learn (a run that learns nothing moves some contrasts too, e.g. the length gap)."""
        if not self.learning.learns:
            return math.nan
        eff = [iv.mean for iv in self.effect.values()]
        ref = [iv.mean for iv in self.fix_effect.values()]
        num, den = sum(eff) / len(eff), sum(ref) / len(ref)
        return num / den if den != 0 and math.isfinite(den) else math.nan

    @property
    def failed(self) -> bool:
        return self.claimed and self.protection != PROTECTS


@dataclass
class LossResult:
    loss: Loss
    knobs: dict[str, Any]
    """The knobs the candidate arms ran with."""
    claims: tuple[str, ...]
    probe: dict[str, bool | None]
    """Knob -> whether the loss's value or gradient moves with it (None: not finite)."""
    contract: dict[str, str] = field(default_factory=dict)
    """Clause of :data:`toybench.losses.CONTRACT` -> what the loss does wrong."""
    modes: dict[str, ModeResult] = field(default_factory=dict)
    claims_from: str = "its declaration"
    """Where :attr:`claims` come from: ``--claims``, the loss's declaration, or DAPO's claims
    (the default for a user function that declares none)."""

    @property
    def dapo_claims(self) -> bool:
        """The claims are DAPO's, given by default to a user function that declares none (not
        the loss's own, nor chosen with ``--claims``): the output says so wherever it names one."""
        return self.claims_from.startswith("DAPO's")

    @property
    def ignored(self) -> list[str]:
        """Knobs the loss says it acts on but does not."""
        return [k for k in self.loss.honours if self.probe[k] is False]

    @property
    def learns(self) -> bool:
        return all(m.learning.learns for m in self.modes.values())

    @property
    def failures(self) -> list[str]:
        out = [f"contract ({clause}): {text}" for clause, text in self.contract.items()]
        out += [probe_line(k, knob_readings(self.loss, k, self.knobs)) for k in self.ignored]
        for m in self.modes.values():
            lg = m.learning
            if not lg.learns:
                block, _ = min(lg.margin.items(), key=lambda kv: kv[1].high if kv[1].n else -math.inf)
                out.append(
                    f"cannot judge protection on {m.mode}'s task: learns too little (expected accuracy "
                    f"gain {_fmt_gain(lg.gain[block])} against DAPO's {_fmt_iv(lg.reference[block])} on "
                    f"the same {block} seeds: shown to be less than {LEARNING_MARGIN:.0%} of it)"
                )
            if lg.skips:
                out.append(
                    f"skips {lg.skipped} of {lg.steps} optimizer steps ({lg.skipped_share:.0%}) in {m.mode}'s "
                    "runs: the loss or its gradient is not finite there"
                )
            if m.failed and lg.learns:
                whose = " (DAPO's, by default)" if self.dapo_claims else ""
                detail = ""
                if m.protection == FRAGILE:
                    detail = f" ({_block_verdicts(m)})"
                elif m.protection == NO_YARDSTICK:
                    detail = (
                        " (fix - unprotected: "
                        + ", ".join(f"{b} {_fmt_iv(i)}" for b, i in m.fix_effect.items())
                        + ")"
                    )
                elif m.protection == TOO_FEW:
                    detail = f" ({_seeds_left_out(m)})"
                out.append(
                    f"claims{whose} to protect against {m.mode} but {m.protection}{detail} (claims: {self.claims_from})"
                )
        return out

    @property
    def reasons(self) -> list[str]:
        """:attr:`failures` in a few words each (the table's verdict column)."""
        out = []
        if self.contract:
            out.append("contract: " + ", ".join(self.contract))
        if self.ignored:
            out.append("ignores " + ", ".join(self.ignored))
        for label, names in (
            ("learns too little", [m.mode for m in self.modes.values() if not m.learning.learns]),
            ("skips steps", [m.mode for m in self.modes.values() if m.learning.skips]),
            (
                "does not protect" + (" (DAPO's claims, by default)" if self.dapo_claims else ""),
                [f"{m.mode} ({m.protection})" for m in self.modes.values() if m.failed and m.learning.learns],
            ),
        ):
            if names:
                out.append(f"{label}: {', '.join(names)}")
        return out

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        def iv(i: Interval) -> dict[str, float]:
            return {"mean": i.mean, "low": i.low, "high": i.high, "n": i.n}

        return {
            "loss": self.loss.spec,
            "source_hash": source_hash(self.loss),
            "source": self.loss.source,
            "knobs": self.knobs,
            "params": self.loss.params,
            "claims": list(self.claims),
            "claims_from": self.claims_from,
            "honours": list(self.loss.honours),
            "knob_probe": self.probe,
            "ignored_knobs": self.ignored,
            "contract": self.contract,
            "learns": self.learns,
            "modes": {
                name: {
                    "protection": m.protection,
                    "vs_fix": m.vs_fix,
                    "recovered": m.recovered,
                    "claimed": m.claimed,
                    "learns": m.learning.learns,
                    "accuracy_gain": {b: iv(i) for b, i in m.learning.gain.items()},
                    "dapo_accuracy_gain": {b: iv(i) for b, i in m.learning.reference.items()},
                    "learning_margin": {b: iv(i) for b, i in m.learning.margin.items()},
                    "at_equal_learning": m.matched,
                    "skipped_steps": m.learning.skipped,
                    "values": m.values,
                    "optimizer_steps": m.learning.steps,
                    "effect": {b: iv(i) for b, i in m.effect.items()},
                    "gap_to_fix": {b: iv(i) for b, i in m.gap.items()},
                    "fix_effect": {b: iv(i) for b, i in m.fix_effect.items()},
                    "judged_seeds": m.judged,
                    "seeds_left_out": {str(s): why for s, why in sorted(m.unjudged.items())},
                }
                for name, m in self.modes.items()
            },
            "passed": self.passed,
            "failures": self.failures,
        }


def _arm_name(i: int) -> str:
    return f"candidate_{i}"


def _negligible(interval: Interval, tol: float) -> bool:
    return interval.n > 0 and max(abs(interval.low), abs(interval.high)) <= tol


def _beyond(interval: Interval, at: float, sign: float) -> bool:
    """The interval excludes ``at`` on the ``sign`` side (+1: above it, -1: below it)."""
    return interval.n > 0 and (interval.low > at if sign > 0 else interval.high < at)


def _protection(effect: Interval, share: Interval, harm: Interval, sign: float, tol: float = 0.0) -> str:
    """One block's verdict from candidate - unprotected (``effect``), the same less
    :data:`MIN_SHARE` of the fix's effect (``share``) and plus it (``harm``), paired by seed:
    ``protects`` beyond the share in the fix's direction, ``harms`` beyond it in the other."""
    if effect.n < MIN_SEEDS:
        return TOO_FEW
    if _negligible(effect, tol):
        return NO_EFFECT
    if _beyond(share, 0.0, sign):
        return PROTECTS
    if _beyond(harm, 0.0, -sign):
        return "harms"
    return NO_EFFECT


def _vs_fix(gap: Interval, fix_effect: Interval, sign: float, tol: float = 0.0) -> str:
    margin = MIN_SHARE * abs(fix_effect.mean)
    if gap.n == 0:
        return "inconclusive"
    if _negligible(gap, tol) or (margin > 0 and -margin <= gap.low and gap.high <= margin):
        return "as fix"
    if gap.excludes_zero():
        return "better" if _beyond(gap, 0.0, sign) else "weaker"
    return "inconclusive"


def _learned(margin: Interval, tol: float = 0.0) -> bool:
    """Not shown to learn less than the margin: the interval of candidate - margin x DAPO does
    not lie below 0 (beyond ``tol``). The burden is on the evidence of too little learning;
    a candidate that passes is still read only on the seeds where it reaches DAPO's level."""
    return margin.n > 0 and (margin.high >= 0 or _negligible(margin, tol))


def _combine(labels: Sequence[str]) -> str:
    return labels[0] if len(set(labels)) == 1 else FRAGILE


@dataclass(frozen=True)
class OffPolicy:
    """``dapo toy check --staleness K [--partial] [--correction NAME]``: every arm (the
    unprotected one, DAPO's fix and each candidate) trains on rollouts ``staleness``
    versions old (:attr:`toybench.runner.RunSpec.staleness`) with the named correction of
    :data:`dapo.offpolicy.CORRECTIONS`, so each verdict is the one at that staleness."""

    staleness: int = 0
    partial: bool = False
    correction: str = "none"

    @property
    def active(self) -> bool:
        return self.staleness > 0 or self.partial or self.correction != "none"

    def arm(self, arm: Arm) -> Arm:
        if not self.active:
            return arm
        faults = {**arm.faults, "staleness": self.staleness, "partial": self.partial}
        return replace(arm, cfg=arm.cfg.replace(**correction_fields(self.correction)), faults=faults)


LEARNED = "learned"
"""The learning gate's summary, added to every derived experiment."""


def derived_experiment(
    mode: FailureMode, losses: Sequence[Loss], overrides: dict[str, Any], off_policy: OffPolicy = OffPolicy()
) -> Experiment:
    """The mode's experiment cut to its unprotected and fix arms plus one candidate per loss,
    with the learning gate's summary (accuracy gain against no update); every arm off-policy
    as ``off_policy`` says. No contrasts: the learning gate and the readings pair arms
    themselves (:func:`_judge`). Every arm trains with
    :class:`toybench.optim.ScaleFreeSGD` at the mode's :attr:`FailureMode.step`."""
    from .experiments import REGISTRY

    exp = REGISTRY[mode.experiment]

    def scale_free(arm: Arm) -> Arm:
        return off_policy.arm(replace(arm, lr=mode.step, optimizer="scale_free"))

    base = exp.arms[mode.unprotected]
    arms = {mode.unprotected: scale_free(base), mode.fix: scale_free(exp.arms[mode.fix])}
    for i, loss in enumerate(losses):
        knobs = knob_values(loss, overrides)
        arms[_arm_name(i)] = scale_free(replace(base, cfg=base.cfg.replace(**knobs), loss=loss.spec))
    summaries = {
        mode.summary: exp.summaries[mode.summary],
        LEARNED: Summary(gain, "expected accuracy, last 10 steps minus step 0 (= no update)"),
    }
    return replace(exp, arms=arms, summaries=summaries, contrasts=())


def check(
    specs: Sequence[str | Loss],
    *,
    seeds: int = 10,
    seed_start: int = 0,
    confirm: bool = True,
    modes: Sequence[str] = FAILURE_MODES,
    overrides: dict[str, Any] | None = None,
    claims: Sequence[str] | None = None,
    knobs: Sequence[str] | None = None,
    jobs: int | None = None,
    progress: bool = False,
    off_policy: OffPolicy = OffPolicy(),
    blocks: dict[str, list[int]] | None = None,
    stats: dict[str, int] | None = None,
) -> list[LossResult]:
    """Run the check for every loss in ``specs`` at once (the unprotected and fix arms are
    shared; runs of built-in losses an earlier check trained are read back,
    :mod:`toybench.memo`, and counted in ``stats`` as ``reused``). ``blocks`` names the seed blocks outright (``discovery``, ``confirmation``) in
    place of ``seeds`` and ``seed_start``. ``overrides`` sets knobs of :data:`~dapo.registry.KNOBS` for every
    candidate; ``claims`` replaces each loss's own claims and ``knobs`` the knobs each says
    it honours; ``off_policy`` runs every arm on stale rollouts with a correction."""
    overrides = dict(overrides or {})
    unknown = [k for k in overrides if k not in KNOBS]
    if unknown:
        raise ValueError(f"--set: {', '.join(unknown)} is not a loss knob ({', '.join(KNOBS)})")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown failure mode(s) {', '.join(bad)}; choose from {', '.join(MODES)}")
    if knobs is not None and any(k not in KNOBS for k in knobs):
        raise ValueError(f"knobs {', '.join(knobs)}: choose from {', '.join(KNOBS)}")
    losses = [s if isinstance(s, Loss) else resolve(s) for s in specs]
    if knobs is not None:
        losses = [replace(loss, honours=tuple(k for k in KNOBS if k in knobs)) for loss in losses]
    results = []
    for loss in losses:  # the probes run first: a loss they refuse never starts an experiment
        chosen_claims = tuple(loss.claims if claims is None else claims)
        if claims is not None:
            source = "--claims"
        elif loss.source.startswith("user function"):
            source = "DAPO's claims, the default for a loss that declares none; choose with --claims"
        else:
            source = "its declaration; choose with --claims"
        results.append(
            LossResult(
                loss,
                knob_values(loss, overrides),
                chosen_claims,
                probe_knobs(loss, overrides),
                probe_contract(loss, overrides),
                claims_from=source,
            )
        )
    if correction_fields(off_policy.correction)["tis_cap"] is not None:
        for loss in losses:
            if not uses_weights(loss, overrides):
                raise LossSpecError(
                    f"--correction {off_policy.correction} weights the loss, but {loss.spec} takes no "
                    "is_weights keyword or ignores it; choose a correction without weights (none, bypass, "
                    "geo_rs, k3_rs) or multiply is_weights into the per-token loss"
                )
    experiments = [derived_experiment(MODES[m], losses, overrides, off_policy) for m in modes]
    # the unprotected and fix arms (built-in losses) of an earlier check on these seeds are reused
    done = run_experiments(
        experiments,
        seeds=seeds,
        seed_start=seed_start,
        confirm=confirm,
        jobs=jobs,
        progress=progress,
        memo=True,
        blocks=blocks,
        stats=stats,
    )
    for m, res in zip(modes, done):
        _judge(MODES[m], res, results)
    return results


def _scale(res: ExperimentResult, summary: str) -> float:
    """The summary's scale in this experiment: its largest finite |value| over arms and seeds."""
    values = [abs(v) for per_arm in res.summaries[summary].values() for v in per_arm if math.isfinite(v)]
    return max(values, default=0.0)


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _skipped(logs: dict[int, Log]) -> tuple[int, int]:
    skipped = sum(m.get("actor/skipped_steps", 0.0) for log in logs.values() for m in log)
    taken = sum(m.get("actor/optimizer_steps", 0.0) for log in logs.values() for m in log)
    return int(skipped), int(skipped + taken)


def _seeds_left_out(m: ModeResult) -> str:
    """The judged seed count per block and each seed left out, with why (grouped by reason)."""
    why: dict[str, list[int]] = {}
    for seed, reason in sorted(m.unjudged.items()):
        why.setdefault(reason, []).append(seed)
    counts = ", ".join(f"{b}: {n} judged" for b, n in m.judged.items())
    left = "; ".join(f"seed{'s' if len(v) > 1 else ''} {', '.join(map(str, v))}: {r}" for r, v in why.items())
    return counts + (f", left out: {left}" if left else "") + f"; a block needs {MIN_SEEDS}"


def _block_verdicts(m: ModeResult) -> str:
    return ", ".join(f"{b}: {v}" for b, v in m.blocks.items())


def _per_seed(res: ExperimentResult, summary: str, arm: str) -> dict[int, float]:
    return dict(zip(res.seeds, res.summaries[summary][arm]))


def _intervals(res: ExperimentResult, diffs: dict[int, float]) -> dict[str, Interval]:
    return {b: paired_interval([diffs[s] for s in seeds]) for b, seeds in res.blocks.items()}


def _per_block(
    res: ExperimentResult,
    read: dict[int, tuple[float, float, float]],
    fn: Callable[[tuple[float, float, float]], float],
) -> dict[str, Interval]:
    """Per seed block: the interval of ``fn(unprotected, fix, candidate)`` over its read seeds."""
    return {b: paired_interval([fn(read[s]) for s in seeds if s in read]) for b, seeds in res.blocks.items()}


def yardstick(
    mode: FailureMode, res: ExperimentResult
) -> tuple[dict[int, tuple[float, float] | str], dict[int, Window | str]]:
    """Per seed, DAPO's loss without and with DAPO's fix, (unprotected, fix): read in the window
    the two fix (:func:`toybench.matched.reference_window`; the windows are returned too) or,
    for a mode read at equal steps, their summaries; a reason (str) for a seed without one."""
    u, f = mode.unprotected, mode.fix
    base: dict[int, tuple[float, float] | str] = {}
    windows: dict[int, Window | str] = {}
    if mode.curve is None:  # the summary measures learning itself: read at equal steps
        vu, vf = _per_seed(res, mode.summary, u), _per_seed(res, mode.summary, f)
        for s in res.seeds:
            finite = math.isfinite(vu[s]) and math.isfinite(vf[s])
            base[s] = (vu[s], vf[s]) if finite else "DAPO's arms' summary is not finite"
        return base, windows
    for s in res.seeds:
        w = windows[s] = reference_window({u: res.logs[u][s], f: res.logs[f][s]})
        if isinstance(w, str):
            base[s] = w
            continue
        ru, rf = read(res.logs[u][s], mode.curve, w), read(res.logs[f][s], mode.curve, w)
        base[s] = (
            (ru, rf)
            if isinstance(ru, float) and isinstance(rf, float)
            else str(ru if isinstance(ru, str) else rf)
        )
    return base, windows


def _judge(mode: FailureMode, res: ExperimentResult, results: list[LossResult]) -> None:
    """Every candidate's verdicts in one failure mode. The yardstick first, with DAPO's loss
    only (the same for every candidate): per seed, the unprotected and the fix arm read in
    the window they fix (:func:`toybench.matched.reference_window`) or, for a mode read at
    equal steps, their summaries. Then each candidate, read in the same window on each seed
    (a seed it cannot be read on is left out and named), against it."""
    u, f = mode.unprotected, mode.fix
    sign = 1.0 if mode.better == "+" else -1.0
    ref_gain = _per_seed(res, LEARNED, mode.reference)
    ref_interval = _intervals(res, ref_gain)
    base, windows = yardstick(mode, res)
    ok = {s: v for s, v in base.items() if not isinstance(v, str)}
    fix_eff = {
        b: paired_interval([ok[s][1] - ok[s][0] for s in seeds if s in ok]) for b, seeds in res.blocks.items()
    }
    # the yardstick stands when it is read on enough seeds and shows the fix on every block
    few = any(iv.n < MIN_SEEDS for iv in fix_eff.values())
    standing = not few and all(_beyond(iv, 0.0, sign) for iv in fix_eff.values())
    tol_learned = NOISE * _scale(res, LEARNED)
    for i, r in enumerate(results):
        c = _arm_name(i)
        cand_gain = _per_seed(res, LEARNED, c)
        gains = _intervals(res, cand_gain)
        margin = _intervals(res, {s: cand_gain[s] - LEARNING_MARGIN * ref_gain[s] for s in res.seeds})
        learning = Learning(
            gains,
            ref_interval,
            margin,
            all(_learned(iv, tol_learned) for iv in margin.values()),
            *_skipped(res.logs[c]),
        )
        unjudged: dict[int, str] = {}
        cand: dict[int, tuple[float, float, float]] = {}
        summary = _per_seed(res, mode.summary, c)
        for s in res.seeds:
            skipped, _ = _skipped({s: res.logs[c][s]})
            if isinstance(base[s], str):
                unjudged[s] = f"no yardstick: {base[s]}"
            elif skipped:
                unjudged[s] = f"{skipped} optimizer steps skipped (a non-finite loss or gradient)"
            elif mode.curve is None:
                v = summary[s]
                if not math.isfinite(v):
                    unjudged[s] = "its summary is not finite"
                elif not cand_gain[s] > 0:
                    unjudged[s] = "learns nothing on this seed (accuracy gain <= 0)"
                else:
                    cand[s] = (ok[s][0], ok[s][1], v)
            else:
                w = windows[s]
                assert isinstance(w, Window)
                got = read_against({u: res.logs[u][s], f: res.logs[f][s]}, res.logs[c][s], mode.curve, w)
                if isinstance(got, str):
                    unjudged[s] = got
                else:  # the references re-read over the candidate's window where it is shorter
                    cand[s] = (got[u], got[f], got[""])
        eff = _per_block(res, cand, lambda v: v[2] - v[0])
        gap = _per_block(res, cand, lambda v: v[2] - v[1])
        # (candidate - unprotected) -/+ MIN_SHARE x (fix - unprotected): beyond the share, paired
        share = _per_block(res, cand, lambda v: (v[2] - v[0]) - MIN_SHARE * (v[1] - v[0]))
        harm = _per_block(res, cand, lambda v: (v[2] - v[0]) + MIN_SHARE * (v[1] - v[0]))
        values = {
            role: _mean([v[k] for v in cand.values()])
            for k, role in enumerate(("unprotected", "fix", "candidate"))
        }
        tol = NOISE * max((abs(x) for v in cand.values() for x in v if math.isfinite(x)), default=0.0)
        blocks: dict[str, str] = {}
        if not learning.learns:
            protection, vs_fix = DOES_NOT_LEARN, "n/a"
        elif not standing:
            protection, vs_fix = (TOO_FEW if few else NO_YARDSTICK), "n/a"
        else:
            blocks = {b: _protection(eff[b], share[b], harm[b], sign, tol) for b in eff}
            protection = TOO_FEW if TOO_FEW in blocks.values() else _combine(list(blocks.values()))
            vs_fix = (
                "n/a"
                if protection == TOO_FEW
                else _combine([_vs_fix(gap[b], fix_eff[b], sign, tol) for b in gap])
            )
        r.modes[mode.name] = ModeResult(
            mode.name,
            protection,
            vs_fix,
            eff,
            gap,
            dict(fix_eff),
            mode.name in r.claims,
            learning,
            values,
            matched=mode.curve is not None,
            blocks=blocks,
            unjudged=unjudged,
            judged={b: iv.n for b, iv in eff.items()},
        )


def assert_protects(
    loss: str | Loss,
    against: str | Sequence[str],
    *,
    seeds: int = 8,
    seed_start: int = 0,
    overrides: dict[str, Any] | None = None,
    knobs: Sequence[str] | None = None,
    jobs: int | None = 1,
) -> LossResult:
    """Assert in a test that ``loss`` keeps its contract, learns on each task of ``against``
    (names of :data:`MODES`), protects against each on both seed blocks and acts on every
    knob it honours (``knobs``, default its own declaration); raise ``AssertionError``
    naming what failed. ``seeds`` per block defaults to 8: a verdict needs 6 judged seeds
    (:data:`~toybench.check_words.MIN_SEEDS`), and a loss that learns a little slower than
    DAPO's may not be read on a seed or two. Returns the result for further checks::

        from toybench.check import assert_protects

        def test_my_loss_keeps_entropy():
            assert_protects("mypkg.losses:my_loss", "entropy_collapse")
    """
    modes = [against] if isinstance(against, str) else list(against)
    (result,) = check(
        [loss],
        seeds=seeds,
        seed_start=seed_start,
        modes=modes,
        overrides=overrides,
        claims=modes,
        knobs=knobs,
        jobs=jobs,
    )
    if not result.passed:
        raise AssertionError(f"{result.loss.spec}: " + "; ".join(result.failures))
    return result


# ---- output -----------------------------------------------------------------------------------


def _fmt_iv(iv: Interval) -> str:
    if iv.n == 0 or math.isnan(iv.mean):
        return "n/a"
    return f"{iv.mean:+.3g} [{iv.low:+.3g}, {iv.high:+.3g}]"


def _fmt_gain(iv: Interval) -> str:
    """An accuracy gain; one within rounding of 0 (a run that never stepped) reads as such."""
    if _negligible(iv, 1e-12):
        return "+0 (unchanged)"
    return _fmt_iv(iv)


def _claimed_cell(r: LossResult, m: ModeResult) -> str:
    """``yes`` where the loss claims the mode; ``yes (DAPO's, by default)`` where the claim is
    DAPO's, given to a user function that declares none."""
    if not m.claimed:
        return ""
    return "yes (DAPO's, by default)" if r.dapo_claims else "yes"


def _learns_cell(m: ModeResult) -> str:
    lg = m.learning
    mine, dapo = lg.gain["discovery"], lg.reference["discovery"]
    cell = ("yes " if lg.learns else "**NO** ") + _fmt_gain(mine)
    if dapo.n and dapo.mean and math.isfinite(dapo.mean):
        cell += f" ({mine.mean / dapo.mean:.2f}x DAPO's)"
    if lg.skipped:
        cell += f", {lg.skipped_share:.0%} of steps skipped"
    return cell


def _share_cell(m: ModeResult) -> str:
    """The share of the fix, only where it means something."""
    if not m.learning.learns:
        return "n/a (learns too little)"
    if m.protection == FRAGILE:
        return f"{_share(m.recovered)} (blocks differ)"
    return _share(m.recovered)


def _share(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "n/a"


def format_table(results: Sequence[LossResult]) -> str:
    """A markdown table: one row per loss and failure mode (learning gate first), and the
    knob and contract probes."""
    lines = [
        "| loss | failure mode (DAPO's fix) | claimed | learns (accuracy gain vs DAPO's) | protects "
        "| candidate - unprotected (discovery) | vs DAPO's fix | share of fix |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for name, m in r.modes.items():
            mode = MODES[name]
            dagger = "" if m.matched else " †"
            read = f"{mode.summary.removesuffix('_final')} at equal learning" if m.matched else mode.summary
            fail = m.failed or not m.learning.learns
            lines.append(
                f"| `{r.loss.spec}` | {name}{dagger} ({mode.fix_name}, {read} {mode.better}) "
                f"| {_claimed_cell(r, m)} | {_learns_cell(m)} | {m.protection}{' **FAIL**' if fail else ''} "
                f"| {_fmt_iv(m.effect['discovery'])} | {m.vs_fix} | {_share_cell(m)} |"
            )
    if any(not MODES[n].loss_can_act for r in results for n in r.modes):
        lines.append("")
        lines.append(
            "† DAPO's fix here is not a property of the loss (sampling, reward shaping): a candidate "
            "that differs from the unprotected arm does so by learning faster or slower, not by "
            "removing the failure mode; read at equal steps. *Equal learning*: each arm read from "
            "the step it reaches 90% of the accuracy gain both reference arms (DAPO's loss with and without "
            "the fix) reach on that seed, over the steps they have left (toybench.matched); a seed the "
            "candidate cannot be read on is left out and named. Every arm trains with "
            "toybench.optim.ScaleFreeSGD (a constant factor on the loss changes no step). *learns*: at "
            f"least {LEARNING_MARGIN:.0%} of DAPO's accuracy gain on the same seeds, on both blocks."
        )
    lines.append("")
    lines.append("Verdicts:")
    lines.append(legend())
    lines.append("")
    lines.append(
        "| loss | knobs it takes, as run | acts on eps_low / eps_high / clip_ratio_c / loss_agg "
        "| contract | verdict |"
    )
    lines.append("|---|---|---|---|---|")

    def acts(r: LossResult, k: str) -> str:
        if r.probe[k] is None:
            return "n/a (not finite)"
        if r.probe[k]:
            return "yes"
        return "**IGNORED**" if k in r.loss.honours else "no (by design)"

    for r in results:
        knobs = (
            ", ".join(f"{k}={r.knobs[k]}" for k in KNOBS if k in r.loss.honours) or "none (fixed by the loss)"
        )
        contract = ", ".join(f"**{c}**" for c in r.contract) or "kept"
        verdict = "pass" if r.passed else "FAIL: " + "; ".join(r.reasons)
        lines.append(
            f"| `{r.loss.spec}` | {knobs} | {' / '.join(acts(r, k) for k in KNOBS)} | {contract} | {verdict} |"
        )
    for r in results:
        if not r.passed:
            lines.append("")
            lines.append(f"`{r.loss.spec}` fails:")
            lines.extend(f"- {f}" for f in r.failures)
    left = [(r, m) for r in results for m in r.modes.values() if m.unjudged and m.learning.learns]
    if left:
        lines.append("")
        lines.append("Seeds left out of a protection verdict:")
        lines.extend(f"- `{r.loss.spec}`, {m.mode}: {_seeds_left_out(m)}" for r, m in left)
    return "\n".join(lines)
