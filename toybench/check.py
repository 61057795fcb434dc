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

Before any verdict, the **learning gate**: in each failure mode's task the candidate's
expected accuracy must rise above a no-update control (its own step-0 policy, paired by
seed) on both seed blocks, and at most :data:`MAX_SKIPPED_SHARE` of its optimizer steps may
be skipped for a non-finite loss; a loss that fails it gets ``does not learn`` and no
protection verdict or share (a policy that learns nothing, or un-learns, moves some
contrasts too). A **contract probe** (:func:`toybench.losses.probe_contract`) checks
finiteness on empty rows and fully masked micro-batches, invariance to padding and the
gradient's sign.

Per failure mode and loss it then reports **protects** (the paired difference candidate -
unprotected in the experiment's primary summary, in the direction of the fix, with its
bootstrap interval; a verdict must hold on the discovery and the confirmation seed
block) and **vs DAPO's fix** (candidate - fix: ``as fix`` when the interval lies within
+-25% of the fix's own effect, ``better``/``weaker`` when it excludes zero, else
``inconclusive``); an interval within :data:`NOISE` of the metric's scale is no effect. A
knob probe (:func:`toybench.losses.probe_knobs`) names each knob the loss says it acts on
but ignores. A loss fails the check when it breaks its contract, does not learn, skips
steps, does not protect against a failure mode it claims, or ignores a knob it honours.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dapo.offpolicy import correction_fields

from .experiment import Arm, Contrast, Experiment, ExperimentResult, Log, Summary, final, run_experiments
from .losses import (
    FAILURE_MODES,
    KNOBS,
    Loss,
    LossSpecError,
    knob_values,
    probe_contract,
    probe_knobs,
    probe_line,
    resolve,
    uses_weights,
)
from .stats import Interval

EQUIVALENCE_MARGIN = 0.25
"""``as fix`` needs the candidate - fix interval inside +-this fraction of the fix's effect."""

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

DOES_NOT_LEARN = "does not learn"


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
    ),
}
assert tuple(MODES) == FAILURE_MODES

PROTECTS = "protects"
FRAGILE = "fragile"


@dataclass
class Learning:
    """The learning gate in one failure mode's task: the candidate's expected accuracy over
    the run (last 10 steps minus step 0, paired by seed). A run that never updates keeps
    its step-0 policy, so step 0 *is* the no-update control of the same seed, exactly."""

    gain: dict[str, Interval]
    """Per seed block: final expected accuracy - the no-update control's."""
    learns: bool
    """The gain excludes 0 upwards, beyond :data:`NOISE`, on every block."""
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
    """``protects``, ``no effect``, ``harms``, ``fragile`` (the seed blocks disagree) or
    ``does not learn`` (the learning gate failed: no protection verdict)."""
    vs_fix: str
    """``as fix``, ``better``, ``weaker``, ``inconclusive``, ``fragile`` or ``n/a``."""
    effect: dict[str, Interval]
    """Per seed block: candidate - unprotected."""
    gap: dict[str, Interval]
    """Per seed block: candidate - fix."""
    fix_effect: dict[str, Interval]
    """Per seed block: fix - unprotected (the reference effect)."""
    claimed: bool
    learning: Learning
    values: dict[str, float] = field(default_factory=dict)
    """The summary's mean over every seed for ``unprotected``, ``fix`` and ``candidate``
    (the absolute levels behind the paired differences)."""

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
        out += [probe_line(k) for k in self.ignored]
        for m in self.modes.values():
            lg = m.learning
            if not lg.learns:
                block, iv = min(lg.gain.items(), key=lambda kv: kv[1].low if kv[1].n else -math.inf)
                out.append(
                    f"{DOES_NOT_LEARN} on {m.mode}'s task: expected accuracy {_fmt_gain(iv)} over the run "
                    f"against no update ({block} seeds)"
                )
            if lg.skips:
                out.append(
                    f"skips {lg.skipped} of {lg.steps} optimizer steps ({lg.skipped_share:.0%}) in {m.mode}'s "
                    "runs: the loss or its gradient is not finite there"
                )
            if m.failed and lg.learns:
                out.append(f"claims to protect against {m.mode} but {m.protection}")
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
            (DOES_NOT_LEARN, [m.mode for m in self.modes.values() if not m.learning.learns]),
            ("skips steps", [m.mode for m in self.modes.values() if m.learning.skips]),
            (
                "does not protect",
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
            "source": self.loss.source,
            "knobs": self.knobs,
            "params": self.loss.params,
            "claims": list(self.claims),
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
                    "skipped_steps": m.learning.skipped,
                    "values": m.values,
                    "optimizer_steps": m.learning.steps,
                    "effect": {b: iv(i) for b, i in m.effect.items()},
                    "gap_to_fix": {b: iv(i) for b, i in m.gap.items()},
                    "fix_effect": {b: iv(i) for b, i in m.fix_effect.items()},
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


def _protection(interval: Interval, better: str, tol: float = 0.0) -> str:
    if interval.n == 0 or _negligible(interval, tol) or not interval.excludes_zero():
        return "no effect"
    return PROTECTS if (interval.low > 0) == (better == "+") else "harms"


def _vs_fix(gap: Interval, fix_effect: Interval, better: str, tol: float = 0.0) -> str:
    margin = EQUIVALENCE_MARGIN * abs(fix_effect.mean)
    if gap.n == 0:
        return "inconclusive"
    if _negligible(gap, tol) or (margin > 0 and -margin <= gap.low and gap.high <= margin):
        return "as fix"
    if gap.excludes_zero():
        return "better" if (gap.low > 0) == (better == "+") else "weaker"
    return "inconclusive"


def _learned(gain: Interval, tol: float = 0.0) -> bool:
    return gain.n > 0 and gain.low > 0 and not _negligible(gain, tol)


def _combine(labels: Sequence[str]) -> str:
    return labels[0] if len(set(labels)) == 1 else FRAGILE


def _accuracy_gain(log: Log) -> float:
    return final(LEARNING_METRIC)(log) - log[0][LEARNING_METRIC]


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
    with the learning gate (candidate's accuracy gain against no update) as contrasts;
    every arm off-policy as ``off_policy`` says."""
    from .experiments import REGISTRY

    exp = REGISTRY[mode.experiment]
    base = exp.arms[mode.unprotected]
    arms = {mode.unprotected: off_policy.arm(base), mode.fix: off_policy.arm(exp.arms[mode.fix])}
    for i, loss in enumerate(losses):
        knobs = knob_values(loss, overrides)
        arms[_arm_name(i)] = off_policy.arm(replace(base, cfg=base.cfg.replace(**knobs), loss=loss.spec))
    summaries = {
        mode.summary: exp.summaries[mode.summary],
        LEARNED: Summary(_accuracy_gain, "expected accuracy, last 10 steps minus step 0 (= no update)"),
    }
    contrasts = [Contrast("fix", mode.unprotected, mode.fix, mode.summary, "?")]
    for i in range(len(losses)):
        contrasts.append(Contrast(f"effect {i}", mode.unprotected, _arm_name(i), mode.summary, "?"))
        contrasts.append(Contrast(f"gap {i}", mode.fix, _arm_name(i), mode.summary, "?"))
        contrasts.append(Contrast(f"learns {i}", None, _arm_name(i), LEARNED, "+"))
    return replace(exp, arms=arms, summaries=summaries, contrasts=tuple(contrasts))


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
) -> list[LossResult]:
    """Run the check for every loss in ``specs`` at once (the unprotected and fix arms are
    shared). ``overrides`` sets knobs of :data:`~toybench.losses.KNOBS` for every
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
        results.append(
            LossResult(
                loss,
                knob_values(loss, overrides),
                chosen_claims,
                probe_knobs(loss, overrides),
                probe_contract(loss, overrides),
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
    done = run_experiments(
        experiments, seeds=seeds, seed_start=seed_start, confirm=confirm, jobs=jobs, progress=progress
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


def _judge(mode: FailureMode, res: ExperimentResult, results: list[LossResult]) -> None:
    by_name = {c.contrast.name: c for c in res.contrasts}
    fix = by_name["fix"]
    fix_eff = {b: r.interval for b, r in fix.blocks.items()}
    tol = NOISE * _scale(res, mode.summary)
    tol_learned = NOISE * _scale(res, LEARNED)
    for i, r in enumerate(results):
        eff = {b: x.interval for b, x in by_name[f"effect {i}"].blocks.items()}
        gap = {b: x.interval for b, x in by_name[f"gap {i}"].blocks.items()}
        gain = {b: x.interval for b, x in by_name[f"learns {i}"].blocks.items()}
        learning = Learning(
            gain, all(_learned(iv, tol_learned) for iv in gain.values()), *_skipped(res.logs[_arm_name(i)])
        )
        if learning.learns:
            protection = _combine([_protection(iv, mode.better, tol) for iv in eff.values()])
            vs_fix = _combine([_vs_fix(gap[b], fix_eff[b], mode.better, tol) for b in gap])
        else:
            protection, vs_fix = DOES_NOT_LEARN, "n/a"
        per_arm = res.summaries[mode.summary]
        values = {
            role: _mean(per_arm[arm])
            for role, arm in (
                ("unprotected", mode.unprotected),
                ("fix", mode.fix),
                ("candidate", _arm_name(i)),
            )
        }
        r.modes[mode.name] = ModeResult(
            mode.name, protection, vs_fix, eff, gap, fix_eff, mode.name in r.claims, learning, values
        )


def assert_protects(
    loss: str | Loss,
    against: str | Sequence[str],
    *,
    seeds: int = 6,
    seed_start: int = 0,
    overrides: dict[str, Any] | None = None,
    knobs: Sequence[str] | None = None,
    jobs: int | None = 1,
) -> LossResult:
    """Assert in a test that ``loss`` keeps its contract, learns on each task of ``against``
    (names of :data:`MODES`), protects against each on both seed blocks and acts on every
    knob it honours (``knobs``, default its own declaration); raise ``AssertionError``
    naming what failed. Returns the result for further checks::

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


def _learns_cell(m: ModeResult) -> str:
    lg = m.learning
    cell = ("yes " if lg.learns else "**NO** ") + _fmt_gain(lg.gain["discovery"])
    if lg.skipped:
        cell += f", {lg.skipped_share:.0%} of steps skipped"
    return cell


def _share(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "n/a"


def format_table(results: Sequence[LossResult]) -> str:
    """A markdown table: one row per loss and failure mode (learning gate first), and the
    knob and contract probes."""
    lines = [
        "| loss | failure mode (DAPO's fix) | claimed | learns (accuracy vs no update) | protects "
        "| candidate - unprotected (discovery) | vs DAPO's fix | share of fix |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for name, m in r.modes.items():
            mode = MODES[name]
            dagger = "" if mode.loss_can_act else " †"
            fail = m.failed or not m.learning.learns
            lines.append(
                f"| `{r.loss.spec}` | {name}{dagger} ({mode.fix_name}, {mode.summary} {mode.better}) "
                f"| {'yes' if m.claimed else ''} | {_learns_cell(m)} | {m.protection}{' **FAIL**' if fail else ''} "
                f"| {_fmt_iv(m.effect['discovery'])} | {m.vs_fix} | {_share(m.recovered)} |"
            )
    if any(not MODES[n].loss_can_act for r in results for n in r.modes):
        lines.append("")
        lines.append(
            "† DAPO's fix here is not a property of the loss (sampling, reward shaping): a candidate "
            "that differs from the unprotected arm does so by learning faster or slower, not by "
            "removing the failure mode."
        )
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
    return "\n".join(lines)
