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

Per failure mode and loss it reports **protects** (the paired difference candidate -
unprotected in the experiment's primary summary, in the direction of the fix, with its
bootstrap interval; a verdict must hold on the discovery and the confirmation seed
block) and **vs DAPO's fix** (candidate - fix: ``as fix`` when the interval lies within
+-25% of the fix's own effect, ``better``/``weaker`` when it excludes zero, else
``inconclusive``). A knob probe (:func:`toybench.losses.probe_knobs`) names each knob the
loss says it acts on but ignores. A loss fails the check when a failure mode it claims is
not protected, or a knob it honours is ignored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .experiment import Contrast, Experiment, ExperimentResult, run_experiments
from .losses import FAILURE_MODES, KNOBS, Loss, knob_values, probe_knobs, resolve
from .stats import Interval

EQUIVALENCE_MARGIN = 0.25
"""``as fix`` needs the candidate - fix interval inside +-this fraction of the fix's effect."""


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
class ModeResult:
    mode: str
    protection: str
    """``protects``, ``no effect``, ``harms`` or ``fragile`` (the seed blocks disagree)."""
    vs_fix: str
    """``as fix``, ``better``, ``weaker``, ``inconclusive`` or ``fragile``."""
    effect: dict[str, Interval]
    """Per seed block: candidate - unprotected."""
    gap: dict[str, Interval]
    """Per seed block: candidate - fix."""
    fix_effect: dict[str, Interval]
    """Per seed block: fix - unprotected (the reference effect)."""
    claimed: bool

    @property
    def recovered(self) -> float:
        """Mean share of the fix's effect the candidate recovers (1 = as much as DAPO's fix,
        0 = none, < 0 = harm), pooled over the seed blocks."""
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
    probe: dict[str, bool]
    """Knob -> whether the loss's value or gradient moves with it."""
    modes: dict[str, ModeResult] = field(default_factory=dict)

    @property
    def ignored(self) -> list[str]:
        """Knobs the loss says it acts on but does not."""
        return [k for k in self.loss.honours if not self.probe[k]]

    @property
    def failures(self) -> list[str]:
        out = [
            f"ignores {k}={self.knobs[k]!r} (its value and gradient do not change with it)"
            for k in self.ignored
        ]
        for m in self.modes.values():
            if m.failed:
                out.append(f"claims to protect against {m.mode} but {m.protection}")
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
            "modes": {
                name: {
                    "protection": m.protection,
                    "vs_fix": m.vs_fix,
                    "recovered": m.recovered,
                    "claimed": m.claimed,
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


def _protection(interval: Interval, better: str) -> str:
    if interval.n == 0 or not interval.excludes_zero():
        return "no effect"
    return PROTECTS if (interval.low > 0) == (better == "+") else "harms"


def _vs_fix(gap: Interval, fix_effect: Interval, better: str) -> str:
    margin = EQUIVALENCE_MARGIN * abs(fix_effect.mean)
    if gap.n == 0:
        return "inconclusive"
    if margin > 0 and -margin <= gap.low and gap.high <= margin:
        return "as fix"
    if gap.low == gap.high == 0:
        return "as fix"
    if gap.excludes_zero():
        return "better" if (gap.low > 0) == (better == "+") else "weaker"
    return "inconclusive"


def _combine(labels: Sequence[str]) -> str:
    return labels[0] if len(set(labels)) == 1 else FRAGILE


def derived_experiment(mode: FailureMode, losses: Sequence[Loss], overrides: dict[str, Any]) -> Experiment:
    """The mode's experiment cut to its unprotected and fix arms plus one candidate per loss."""
    from .experiments import REGISTRY

    exp = REGISTRY[mode.experiment]
    base = exp.arms[mode.unprotected]
    arms = {mode.unprotected: base, mode.fix: exp.arms[mode.fix]}
    for i, loss in enumerate(losses):
        knobs = knob_values(loss, overrides)
        arms[_arm_name(i)] = replace(base, cfg=base.cfg.replace(**knobs), loss=loss.spec)
    summary = exp.summaries[mode.summary]
    contrasts = [Contrast("fix", mode.unprotected, mode.fix, mode.summary, "?")]
    for i in range(len(losses)):
        contrasts.append(Contrast(f"effect {i}", mode.unprotected, _arm_name(i), mode.summary, "?"))
        contrasts.append(Contrast(f"gap {i}", mode.fix, _arm_name(i), mode.summary, "?"))
    return replace(exp, arms=arms, summaries={mode.summary: summary}, contrasts=tuple(contrasts))


def check(
    specs: Sequence[str | Loss],
    *,
    seeds: int = 10,
    seed_start: int = 0,
    confirm: bool = True,
    modes: Sequence[str] = FAILURE_MODES,
    overrides: dict[str, Any] | None = None,
    claims: Sequence[str] | None = None,
    jobs: int | None = None,
    progress: bool = False,
) -> list[LossResult]:
    """Run the check for every loss in ``specs`` at once (the unprotected and fix arms are
    shared). ``overrides`` sets knobs of :data:`~toybench.losses.KNOBS` for every
    candidate; ``claims`` replaces each loss's own claims."""
    overrides = dict(overrides or {})
    unknown = [k for k in overrides if k not in KNOBS]
    if unknown:
        raise ValueError(f"--set: {', '.join(unknown)} is not a loss knob ({', '.join(KNOBS)})")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown failure mode(s) {', '.join(bad)}; choose from {', '.join(MODES)}")
    losses = [s if isinstance(s, Loss) else resolve(s) for s in specs]
    results = []
    for loss in losses:
        knobs = knob_values(loss, overrides)
        chosen_claims = tuple(loss.claims if claims is None else claims)
        results.append(LossResult(loss, knobs, chosen_claims, probe_knobs(loss, overrides)))
    experiments = [derived_experiment(MODES[m], losses, overrides) for m in modes]
    done = run_experiments(
        experiments, seeds=seeds, seed_start=seed_start, confirm=confirm, jobs=jobs, progress=progress
    )
    for m, res in zip(modes, done):
        _judge(MODES[m], res, results)
    return results


def _judge(mode: FailureMode, res: ExperimentResult, results: list[LossResult]) -> None:
    by_name = {c.contrast.name: c for c in res.contrasts}
    fix = by_name["fix"]
    fix_eff = {b: r.interval for b, r in fix.blocks.items()}
    for i, r in enumerate(results):
        eff = {b: x.interval for b, x in by_name[f"effect {i}"].blocks.items()}
        gap = {b: x.interval for b, x in by_name[f"gap {i}"].blocks.items()}
        r.modes[mode.name] = ModeResult(
            mode.name,
            _combine([_protection(iv, mode.better) for iv in eff.values()]),
            _combine([_vs_fix(gap[b], fix_eff[b], mode.better) for b in gap]),
            eff,
            gap,
            fix_eff,
            mode.name in r.claims,
        )


def assert_protects(
    loss: str | Loss,
    against: str | Sequence[str],
    *,
    seeds: int = 6,
    overrides: dict[str, Any] | None = None,
    jobs: int | None = 1,
) -> LossResult:
    """Assert in a test that ``loss`` protects against each failure mode in ``against``
    (names of :data:`MODES`) on both seed blocks and acts on every knob it honours;
    raise ``AssertionError`` naming what failed. Returns the result for further checks::

        from toybench.check import assert_protects

        def test_my_loss_keeps_entropy():
            assert_protects("mypkg.losses:my_loss", "entropy_collapse")
    """
    modes = [against] if isinstance(against, str) else list(against)
    (result,) = check([loss], seeds=seeds, modes=modes, overrides=overrides, claims=modes, jobs=jobs)
    if not result.passed:
        raise AssertionError(f"{result.loss.spec}: " + "; ".join(result.failures))
    return result


# ---- output -----------------------------------------------------------------------------------


def _fmt_iv(iv: Interval) -> str:
    if iv.n == 0 or math.isnan(iv.mean):
        return "n/a"
    return f"{iv.mean:+.3g} [{iv.low:+.3g}, {iv.high:+.3g}]"


def format_table(results: Sequence[LossResult]) -> str:
    """A markdown table: one row per loss and failure mode, and the knob probe."""
    lines = [
        "| loss | failure mode (DAPO's fix) | claimed | protects | candidate - unprotected (discovery) "
        "| vs DAPO's fix | share of fix |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for name, m in r.modes.items():
            mode = MODES[name]
            dagger = "" if mode.loss_can_act else " †"
            lines.append(
                f"| `{r.loss.spec}` | {name}{dagger} ({mode.fix_name}, {mode.summary} {mode.better}) "
                f"| {'yes' if m.claimed else ''} | {m.protection}{' **FAIL**' if m.failed else ''} "
                f"| {_fmt_iv(m.effect['discovery'])} | {m.vs_fix} | {m.recovered:.2f} |"
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
        "| loss | knobs it takes, as run | acts on eps_low / eps_high / clip_ratio_c / loss_agg | verdict |"
    )
    lines.append("|---|---|---|---|")
    for r in results:
        acts = " / ".join(
            ("yes" if r.probe[k] else ("**IGNORED**" if k in r.loss.honours else "no (by design)"))
            for k in KNOBS
        )
        knobs = (
            ", ".join(f"{k}={r.knobs[k]}" for k in KNOBS if k in r.loss.honours) or "none (fixed by the loss)"
        )
        verdict = "pass" if r.passed else "FAIL: " + "; ".join(r.failures)
        lines.append(f"| `{r.loss.spec}` | {knobs} | {acts} | {verdict} |")
    return "\n".join(lines)
