"""dapo.health: the rules, the verdict, and the toy confusion matrix."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.health import RULES, SEVERITY, HealthConfig, diagnose, judge, references_from_runs, verdict
from dapo.health.callback import HealthMonitor


def s_window(run, c):
    from dapo.health.series import series

    return series(run, "actor/entropy").window(c)


def status(run, rule, knobs=None, **cfg):
    """The rule's own finding (before the hierarchy of verdicts)."""
    return next(f for f in judge(run, HealthConfig(**cfg), knobs) if f.rule == rule)


def ramp(n, a, b):
    return [a + (b - a) * i / (n - 1) for i in range(n)]


# ---- entropy ---------------------------------------------------------------------------------


def test_entropy_collapse_fires_with_start_step_and_clip_evidence():
    ent = [1.0] * 20 + ramp(20, 1.0, 0.3) + [0.3] * 40
    run = [
        {"step": i, "actor/entropy": e, "actor/clipfrac_upper": 0.05, "actor/upclip_old_prob": 0.12}
        for i, e in enumerate(ent)
    ]
    f = status(run, "entropy_collapse")
    assert f.status == "failing" and 30 <= f.start_step <= 40
    assert "old probability 0.12" in f.evidence and "eps_high" in f.advice
    level = [{"step": i, "actor/entropy": 1.0 + 0.01 * (i % 2)} for i in range(80)]
    assert status(level, "entropy_collapse").status == "healthy"
    short = status(level[:5], "entropy_collapse")
    assert short.status == "unknown" and short.reason == "too few steps"


def test_entropy_falling_while_learning_is_convergence_and_a_plateau_short_of_the_top_is_collapse():
    """Falling entropy is judged by what learning does after it began to fall (paper Fig. 2):
    still rising over the later half of that time, or saturated (at the top of its range, or
    the validation score at its best), is a policy converging: healthy, and said so. Rising to
    mid-run and then flat for the second half short of the top is a collapse: the question is
    whether it still rises now, not whether it rose since the onset."""
    ent = ramp(100, 0.3, 0.06)
    rising = [{"step": i, "actor/entropy": e, "rollout/accuracy": 0.5 + 0.004 * i} for i, e in enumerate(ent)]
    f = status(rising, "entropy_collapse")
    assert f.status == "healthy" and "still rising" in f.evidence and "converging" in f.evidence
    stalled = [{**r, "rollout/accuracy": 0.5 + 0.01 * (r["step"] % 2)} for r in rising]
    assert status(stalled, "entropy_collapse").status == "failing"
    # rises until mid-run, then flat at 0.6 for the second half, entropy at 5% of its start
    ent = ramp(50, 1.0, 0.05) + [0.05] * 50
    plateau = [
        {"step": i, "actor/entropy": e, "rollout/accuracy": min(0.2 + 0.008 * i, 0.6) + 0.01 * (i % 2)}
        for i, e in enumerate(ent)
    ]
    f = status(plateau, "entropy_collapse")
    assert f.status == "failing" and "no longer rising" in f.evidence
    top = [
        {**r, "rollout/accuracy": min(0.2 + 0.02 * r["step"], 0.97) + 0.01 * (r["step"] % 2)} for r in plateau
    ]
    f = status(top, "entropy_collapse")
    assert f.status == "healthy" and "of its range" in f.evidence  # saturated: nothing left to explore
    # a reward whose range the log gives (verl's critic/score/min and max), near its maximum
    rewards = [
        {
            "step": r["step"],
            "actor/entropy": r["actor/entropy"],
            "rollout/reward_mean": r["rollout/accuracy"] * 2 - 1,
            "rollout/reward_min": -1.0,
            "rollout/reward_max": 1.0,
        }
        for r in top
    ]
    assert status(rewards, "entropy_collapse").status == "healthy"
    no_range = [
        {k: v for k, v in r.items() if k not in ("rollout/reward_min", "rollout/reward_max")} for r in rewards
    ]
    assert status(no_range, "entropy_collapse").status == "failing"  # flat, and no known top
    with_val = [
        {**r, **({"eval/score": 0.4 + 0.001 * r["step"]} if r["step"] % 10 == 0 else {})} for r in plateau
    ]
    f = status(with_val, "entropy_collapse")
    assert f.status == "healthy" and "validation score" in f.evidence  # held-out score still at its best


def test_entropy_advice_checks_the_runs_own_clip_and_knobs():
    ent = [1.0] * 20 + [0.2] * 40
    never_clipped = [{"step": i, "actor/entropy": e, "actor/clipfrac_upper": 0.0} for i, e in enumerate(ent)]
    f = status(never_clipped, "entropy_collapse")
    assert "clipping never acts" in f.advice and "cannot help" in f.advice and "raise" not in f.advice
    clipped = [{**r, "actor/clipfrac_upper": 0.01} for r in never_clipped]
    assert "already 0.28" in status(clipped, "entropy_collapse", {"eps_high": 0.28}).advice
    assert "raise algo.eps_high" in status(clipped, "entropy_collapse", {"eps_high": 0.2}).advice


def test_entropy_explosion():
    up = [{"step": i, "actor/entropy": e} for i, e in enumerate(ramp(60, 0.6, 1.8))]
    f = status(up, "entropy_explosion")
    assert f.status == "failing" and f.start_step is not None
    assert status(up, "entropy_collapse").status == "healthy"
    mild = [{"step": i, "actor/entropy": e} for i, e in enumerate(ramp(60, 0.6, 1.0))]
    assert status(mild, "entropy_explosion").status == "warning"
    paper = [{"step": i, "actor/entropy": e} for i, e in enumerate(ramp(60, 0.63, 0.70))]  # Fig. 7b
    assert status(paper, "entropy_explosion").status == "healthy"
    bonus = status(up, "entropy_explosion", {"entropy_coeff": 0.01})
    assert "entropy bonus" in bonus.advice


# ---- signal and learning ---------------------------------------------------------------------------


def test_vanishing_signal_with_and_without_dynamic_sampling():
    no_ds = [
        {"step": i, "rollout/groups_all_correct": x, "rollout/groups_all_wrong": 0.1, "sampling/rounds": 1}
        for i, x in enumerate(ramp(60, 0.1, 0.85))
    ]
    f = status(no_ds, "vanishing_signal")
    assert f.status == "failing" and "dynamic_sampling" in f.advice
    ds = [
        {
            "step": i,
            "rollout/groups_all_correct": 0.3,
            "rollout/groups_all_wrong": 0.3,
            "sampling/rounds": r,
            "sampling/underfilled": 0.0,
        }
        for i, r in enumerate(ramp(60, 1, 6))
    ]
    assert status(ds, "vanishing_signal").status == "warning"
    assert "already on" in status(ds, "vanishing_signal").advice
    ds[-15:] = [{**m, "sampling/underfilled": 1.0} for m in ds[-15:]]
    assert status(ds, "vanishing_signal").status == "failing"
    healthy = [
        {"step": i, "rollout/groups_all_correct": 0.2, "rollout/groups_all_wrong": 0.1, "sampling/rounds": 1}
        for i in range(60)
    ]
    assert status(healthy, "vanishing_signal").status == "healthy"


def test_zero_gradients_are_vanishing_signal_even_when_nothing_else_says_so():
    run = [{"step": i, "actor/grad_norm": 0.0 if i >= 10 else 0.4} for i in range(40)]
    f = status(run, "vanishing_signal")  # no outcome logged: below its ceiling is not shown
    assert f.status == "warning" and f.start_step == 10 and "grad norm exactly 0 in 30 of 40" in f.evidence
    stuck = [{**r, "rollout/reward_mean": 0.3 + 0.01 * (r["step"] % 3)} for r in run]
    f = status(stuck, "vanishing_signal")  # a pass rate stuck at 0.3: unrecoverable
    assert f.status == "failing" and f.fatal and "below its ceiling" in f.evidence
    assert status([{**r, "actor/grad_norm": 0.4} for r in run], "vanishing_signal").status == "unknown"


def test_zero_advantages_are_vanishing_signal():
    run = [{"step": i, "rollout/advantage_abs_max": 0.0 if i >= 20 else 1.5} for i in range(40)]
    f = status(run, "vanishing_signal")
    assert f.status == "warning" and f.start_step == 20 and "advantages exactly 0 in 20 of 40" in f.evidence
    stuck = [{**r, "rollout/accuracy": 0.3 + 0.01 * (r["step"] % 3)} for r in run]
    assert status(stuck, "vanishing_signal").status == "failing"


def test_not_learning_at_the_floor_is_failing_never_healthy():
    """The run the old rules called healthy: reward at 0, every group all-wrong."""
    floor = [
        {
            "step": i,
            "rollout/reward_mean": 0.0,
            "rollout/groups_all_wrong": 1.0,
            "rollout/groups_all_correct": 0.0,
        }
        for i in range(50)
    ]
    f = status(floor, "not_learning")
    assert f.status == "failing" and "floor" in f.evidence and "reward function" in f.advice
    assert verdict(diagnose(floor)).status == "failing"
    acc0 = [{"step": i, "rollout/accuracy": 0.0} for i in range(30)]
    assert status(acc0, "not_learning").status == "failing"


def test_not_learning_ceiling_flat_and_learning():
    ceiling = [{"step": i, "rollout/accuracy": 1.0} for i in range(40)]
    f = status(ceiling, "not_learning")
    assert f.status == "warning" and "ceiling" in f.evidence
    noise = [0.31, 0.29, 0.30, 0.32, 0.28]
    flat = [{"step": i, "rollout/reward_mean": noise[i % 5]} for i in range(8)]
    assert status(flat, "not_learning").status != "failing"  # 8 rows: no rise, its absence not shown
    flat = [{"step": i, "rollout/reward_mean": noise[i % 5]} for i in range(80)]
    f = status(flat, "not_learning")  # no rise, and its absence shown against the noise
    assert f.status == "failing" and "not rising over 80 steps" in f.evidence
    learning = [{"step": i, "rollout/reward_mean": 0.1 + 0.005 * i + 0.01 * (i % 2)} for i in range(80)]
    assert status(learning, "not_learning").status == "healthy"


def test_a_flat_outcome_at_the_top_of_its_range_is_the_ceiling_not_a_failure():
    """A resumed PPO run at 95% of its reward range for 100 steps has converged: the entropy
    rule says so, and 'not learning' must not call the same run failing."""
    run = [
        {
            "step": 100 + i,
            "rollout/reward_mean": 0.945 + 0.01 * (i % 3),
            "rollout/reward_min": 0.0,
            "rollout/reward_max": 1.0,
        }
        for i in range(108)
    ]
    f = status(run, "not_learning")
    assert f.status == "warning" and "the ceiling" in f.evidence
    rng = random.Random(0)
    low = [{**r, "rollout/reward_mean": 0.45 + rng.gauss(0, 0.01)} for r in run]
    assert status(low, "not_learning").status == "failing"  # flat at 45% of its range


def test_a_negative_kl_is_no_kl_and_warns():
    """A "KL" that sits at -0.5 (a log-prob difference logged with its sign flipped, as in a
    public custom trainer's log) is a bug, not a healthy small KL; a k1 batch mean that dips
    just below 0 by noise is not."""
    bad = [{"step": i, "actor/ref_kl": -0.5 - 0.02 * (i % 3)} for i in range(1, 41)]
    f = status(bad, "kl_blowup")
    assert f.status == "warning" and "sign" in f.evidence and f.start_step == 1
    noisy = [{"step": i, "actor/ref_kl": 0.002 * ((i % 5) - 2.5)} for i in range(1, 41)]
    assert status(noisy, "kl_blowup").status == "healthy"


def test_not_learning_needs_the_absence_of_a_rise_shown_not_assumed():
    """8 noisy rows whose reward does not rise significantly, but within whose noise a rise that
    counts still lies, cannot say 'not learning' (the author of such a log: 'no clear upward
    trend yet - need more steps'); 6 rows flat to the fourth digit can."""
    noisy = [0.25, 0.03, 0.5, 0.22, 0.31, 0.19, 0.09, 0.41]
    f = status([{"step": i + 1, "rollout/reward_mean": v} for i, v in enumerate(noisy)], "not_learning")
    assert f.status == "unknown" and f.reason == "too few steps" and "neither a rise" in f.evidence
    tight = [0.2056, 0.2061, 0.2058, 0.2064, 0.2059, 0.2062]
    f = status([{"step": 259 + i, "rollout/reward_mean": v} for i, v in enumerate(tight)], "not_learning")
    assert f.status == "warning" and "not rising" in f.evidence
    rising = [0.1, 0.12, 0.2, 0.22, 0.3, 0.33, 0.41, 0.45]
    f = status([{"step": i + 1, "rollout/reward_mean": v} for i, v in enumerate(rising)], "not_learning")
    assert f.status == "healthy"


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.integers(1, 40), min_size=2, max_size=30),
    min_points=st.integers(1, 5),
    window=st.integers(1, 20),
)
def test_head_and_tail_hold_min_points_rows_however_unevenly_logged(gaps, min_points, window):
    """A log sampled unevenly (rows a user picked, a logger that skips) must not leave a window
    of one or two rows whose mean and noise the rules then trust: head and tail are a prefix
    and a suffix of the rows, each with at least ``min_points`` of them (or all there are)."""
    from dapo.health.series import Series

    steps = [1.0]
    for g in gaps:
        steps.append(steps[-1] + g)
    s = Series(steps, [float(i) for i in range(len(steps))])
    c = HealthConfig(window_frac=window / 20, min_points=min_points)
    head, tail = s.head(c), s.tail(c)
    want = min(min_points, len(s))
    assert len(head) >= want and len(tail) >= want
    assert head == s.values[: len(head)] and tail == s.values[len(s) - len(tail) :]


# ---- length, truncation, mismatch ------------------------------------------------------------------


def test_length_growth_needs_length_and_entropy_rising_with_flat_accuracy():
    from toybench.health_suite import synthetic_length_growth

    bad, good = synthetic_length_growth()
    assert status(bad, "length_growth").status in ("warning", "failing")
    assert status(good, "length_growth").status == "healthy"
    improving = [{**m, "rollout/accuracy": 0.3 + 0.4 * m["step"] / 99} for m in bad]
    assert status(improving, "length_growth").status == "healthy"  # growth that pays off is fine


def test_truncation_severity_stands_on_its_own_evidence():
    """100% truncation is failing whether or not entropy was logged."""
    alone = [{"step": i, "rollout/truncation_rate": 1.0} for i in range(40)]
    assert status(alone, "truncation_noise").status == "failing"
    trunc = [{"step": i, "rollout/truncation_rate": 0.3, "actor/entropy": 1.0 - 0.01 * i} for i in range(40)]
    f = status(trunc, "truncation_noise")
    assert f.status == "failing" and "entropy dropping" in f.evidence
    assert (
        status([{**m, "rollout/truncation_rate": 0.12} for m in trunc], "truncation_noise").status
        == "warning"
    )
    assert (
        status([{**m, "rollout/truncation_rate": 0.02} for m in trunc], "truncation_noise").status
        == "healthy"
    )


def test_mismatch():
    gap = [{"step": i, "mismatch/logp_gap": 1e-3 if i < 20 else 0.2} for i in range(40)]
    f = status(gap, "rollout_mismatch")
    assert f.status == "failing" and f.start_step is not None and "tis_cap" in f.advice
    f = status([{"step": 0}], "rollout_mismatch")
    assert f.status == "unknown" and f.reason == "not logged"
    # a disaggregated run with staleness: the gap is mostly policy change, judged elsewhere
    stale = [{**m, "async/staleness_max": 0 if m["step"] < 2 else 2} for m in gap]
    f = status(stale, "rollout_mismatch")
    assert f.status == "unknown" and f.reason == "asynchronous" and "off_policy_drift" in f.evidence
    f = status([{**m, "async/staleness_max": 0} for m in gap], "rollout_mismatch")  # k = 0: judged
    assert f.status == "failing"


# ---- KL and gradients ------------------------------------------------------------------------------------


def test_kl_blowup_early_late_and_steady_growth():
    early = [{"step": i, "actor/ref_kl": 1.1e4 if i == 1 else 0.05} for i in range(40)]
    f = status(early, "kl_blowup")
    assert f.status == "failing" and f.start_step == 1
    growing = [{"step": i, "actor/ref_kl": k} for i, k in enumerate(ramp(100, 0.001, 0.1))]
    assert status(growing, "kl_blowup").status == "healthy"  # a reference KL grows; that is normal
    late = [{"step": i, "actor/approx_kl": 0.002 if i < 40 else 0.05} for i in range(60)]
    f = status(late, "kl_blowup")
    assert f.status == "warning" and f.start_step == 40
    nan = [{"step": i, "actor/approx_kl": math.nan if i == 30 else 0.002} for i in range(40)]
    f = status(nan, "kl_blowup")
    assert f.status == "failing" and "non-finite" in f.evidence and f.start_step == 30


def test_kl_that_explodes_early_and_stays_high_is_judged_from_its_start_and_ceilings():
    """'KL diverged 0.01 -> 3.0': a KL that is high for most of the run becomes its own median, so
    the rule judges against the start and the absolute ceilings, never the median."""
    stays = [{"step": i, "actor/ref_kl": 0.01 if i < 5 else 2.5 + 0.5 * (i % 2)} for i in range(60)]
    f = status(stays, "kl_blowup")
    assert (
        f.status == "failing" and f.start_step is not None and f.start_step <= 6 and "ceilings" in f.evidence
    )
    # old verl prints KL to 3 decimals: judged by the ceilings its resolution can show
    coarse = [{"step": i, "actor/approx_kl": (0.0, 0.001)[i % 2]} for i in range(60)]
    assert status(coarse, "kl_blowup").status == "healthy"
    # recurring spikes the run keeps coming back from while it learns: a warning, not a failure
    spiky = [
        {"step": i, "actor/ref_kl": 30.0 if i % 10 == 5 else 0.01, "rollout/reward_mean": 0.1 + 0.007 * i}
        for i in range(100)
    ]
    f = status(spiky, "kl_blowup")
    assert f.status == "warning" and "kept learning" in f.evidence
    flat = [{**r, "rollout/reward_mean": 0.2 + 0.01 * (r["step"] % 3)} for r in spiky]
    assert status(flat, "kl_blowup").status == "failing"  # the same spikes, and nothing learned


def test_reward_collapse_rose_then_fell_and_stays_down():
    def run(values):
        return [{"step": i, "rollout/accuracy": v + 0.01 * (i % 2)} for i, v in enumerate(values)]

    back = run(ramp(40, 0.1, 0.6) + ramp(20, 0.6, 0.1) + [0.1] * 20)
    f = status(back, "reward_collapse")
    assert f.status == "failing" and "back at its start" in f.evidence and 40 <= f.start_step <= 60
    half = run(ramp(40, 0.1, 0.6) + ramp(20, 0.6, 0.3) + [0.3] * 20)
    f = status(half, "reward_collapse")
    assert f.status == "warning" and "of its gain" in f.evidence
    plateau = run(ramp(40, 0.1, 0.6) + [0.6] * 40)
    assert status(plateau, "reward_collapse").status == "healthy"
    dip = run(ramp(40, 0.1, 0.6) + [0.3] * 5 + [0.6] * 35)  # fell and came back
    assert status(dip, "reward_collapse").status == "healthy"
    assert status(run([0.3] * 6), "reward_collapse").reason == "too few steps"


def test_loss_spikes_and_a_non_finite_loss():
    calm = [{"step": i, "actor/loss": 0.01 * ((i % 5) - 2)} for i in range(60)]
    assert status(calm, "loss_spikes").status == "healthy"
    # GRPO's loss near 0: tiny wiggles are no spikes (an absolute floor), 1e3 is
    near0 = [{"step": i, "actor/loss": 1e-5 * (i % 3)} for i in range(60)]
    assert status(near0, "loss_spikes").status == "healthy"
    spikes = [{**r, "actor/loss": 1083.0 if r["step"] in (10, 30, 50, 55) else r["actor/loss"]} for r in calm]
    f = status(spikes, "loss_spikes")
    assert f.status == "failing" and f.start_step == 10 and "1.08e+03" in f.evidence
    nan = [{**r, "actor/loss": math.nan if r["step"] == 7 else r["actor/loss"]} for r in calm]
    f = status(nan, "loss_spikes")
    assert f.status == "failing" and "non-finite" in f.evidence and f.start_step == 7


def test_validation_score_falling_from_its_best():
    def run(scores):
        return [{"step": 10 * i, "eval/score": v} for i, v in enumerate(scores)]

    assert status(run([0.3, 0.5, 0.6, 0.62, 0.61]), "validation", eval_items=500).status == "healthy"
    f = status(run([0.3, 0.5, 0.6, 0.45, 0.44]), "validation", eval_items=500)
    assert f.status == "warning" and f.start_step == 20 and "best 0.6" in f.evidence
    assert "binomial on 500 items" in f.evidence
    # the same fall on an AIME-sized set (30 items) is within its noise
    assert status(run([0.3, 0.5, 0.6, 0.45, 0.44]), "validation", eval_items=30).status == "healthy"
    assert status(run([0.3, 0.5, 0.2, 0.18]), "validation", eval_items=500).status == "failing"
    assert status(run([0.3, 0.5]), "validation").reason == "too few steps"
    # four evaluations and no item count: their noise cannot be estimated, the rule says so
    f = status(run([0.3, 0.5, 0.2, 0.18]), "validation")
    assert f.status == "unknown" and "--eval-items" in f.evidence


def test_evidence_reads_right():
    """'0.14x its start, still rising' under entropy explosion, and 'needs 1 windows', were said."""
    down = [{"step": i, "actor/entropy": e} for i, e in enumerate([*ramp(60, 0.44, 0.06), 0.06, 0.07, 0.08])]
    assert "still rising" not in status(down, "entropy_explosion").evidence
    one = status([{"step": 0, "rollout/truncation_rate": 0.0}], "truncation_noise")
    assert "1 window of" in one.evidence and "1 windows" not in one.evidence


def test_gradients_early_blowup_zero_runs_nan_and_skips():
    early = [
        {"step": 10 * (i + 1), "actor/grad_norm": 421403.8 if i == 0 else 0.3 + 0.01 * (i % 3)}
        for i in range(40)
    ]
    f = status(early, "gradients")
    assert f.status == "failing" and f.start_step == 10  # a blow-up in the first steps is not missed
    zeros = [0.0] * 49
    for i, v in ((5, 404.0), (12, 3.0), (20, 250.0), (27, 1.0), (33, 2.0), (40, 380.0), (45, 1.5)):
        zeros[i] = v
    f = status([{"step": i, "actor/grad_norm": g} for i, g in enumerate(zeros)], "gradients")
    assert f.status == "failing" and "exactly 0 in 42 of 49 rows" in f.evidence and f.start_step == 0
    nan = [{"step": i, "actor/grad_norm": math.inf if i == 7 else 1.0} for i in range(30)]
    f = status(nan, "gradients")
    assert f.status == "failing" and f.start_step == 7 and "non-finite" in f.evidence
    steady = [{"step": i, "actor/grad_norm": 0.2 + 0.05 * (i % 4)} for i in range(40)]
    assert status(steady, "gradients").status == "healthy"
    one = [{**r, "actor/grad_norm": 6.0 if r["step"] == 16 else r["actor/grad_norm"]} for r in steady]
    f = status(one, "gradients")  # one spike below a blow-up, clipped, recovered: evidence only
    assert f.status == "healthy" and "1 spike(s)" in f.evidence and "isolated" in f.evidence
    two = [{**r, "actor/grad_norm": 6.0 if r["step"] in (16, 30) else r["actor/grad_norm"]} for r in steady]
    assert status(two, "gradients").status == "warning"


def test_a_few_spikes_a_learning_run_came_back_from_need_nothing_done():
    """A reference run (verl's AMD GRPO baseline: 8 spikes in 1,119 rows, one 151x the median,
    reward 0.55 -> 0.98) is healthy with its spikes in the evidence; the same spikes in a run
    that does not learn, or that is still spiking, are not; recurring ones stay a warning."""
    spikes = {102: 1.9, 431: 5.1, 432: 2.9, 557: 1.5, 1036: 19.0}
    learning = [
        {
            "step": i,
            "actor/grad_norm": spikes.get(i, 0.12 + 0.01 * (i % 3)),
            "rollout/reward_mean": 0.55 + 0.4 * i / 1100 + 0.01 * (i % 2),
        }
        for i in range(1, 1100)
    ]
    f = status(learning, "gradients")
    assert f.status == "healthy" and "isolated" in f.evidence and "kept learning" in f.evidence
    flat = [{**r, "rollout/reward_mean": 0.5 + 0.01 * (r["step"] % 2)} for r in learning]
    assert status(flat, "gradients").status == "failing"  # a blow-up, and nothing learned
    still = [{**r, "actor/grad_norm": 3.0 if r["step"] > 1090 else r["actor/grad_norm"]} for r in learning]
    assert status(still, "gradients").status == "failing"  # still spiking at the end
    recurring = [
        {**r, "actor/grad_norm": 5.0 if r["step"] % 10 == 0 else r["actor/grad_norm"]} for r in learning
    ]
    f = status(recurring, "gradients")
    assert f.status == "warning" and "kept learning" in f.evidence
    skipped = [
        {
            "step": i,
            "actor/grad_norm": 1.0,
            "actor/skipped_steps": float(i == 7),
            "actor/optimizer_steps": 4.0,
        }
        for i in range(40)
    ]
    f = status(skipped, "gradients")
    assert f.status == "warning" and f.start_step == 7


# ---- windows are steps, not rows --------------------------------------------------------------------------


def test_windows_and_onsets_are_in_training_steps():
    """The same run logged every step and every 10th step: the onset is reported at the same
    training step (within one logging interval), not 10x later."""

    def ent(s):
        return 1.0 if s < 300 else 0.2

    dense = [{"step": s, "actor/entropy": ent(s)} for s in range(1000)]
    sparse = [{"step": s, "actor/entropy": ent(s)} for s in range(0, 1000, 10)]
    a, b = status(dense, "entropy_collapse"), status(sparse, "entropy_collapse")
    assert a.status == b.status == "failing"
    assert a.start_step == 300 and 300 <= b.start_step <= 310


def test_short_runs_are_too_few_steps_and_sparse_windows_widen():
    c = HealthConfig()
    run = [{"step": 10 * s, "actor/entropy": 1.0} for s in range(5)]  # 5 rows every 10 steps
    f = status(run, "entropy_collapse")
    assert f.status == "unknown" and f.reason == "too few steps" and "3 rows" in f.evidence
    assert s_window(run, c) == 30  # an eighth of 50 steps widened to hold 3 rows, not 1


# ---- the verdict ---------------------------------------------------------------------------------


def test_verdict_inconclusive_when_most_rules_cannot_judge():
    only_trunc = [{"step": i, "rollout/truncation_rate": 0.0} for i in range(40)]
    fs = diagnose(only_trunc)
    v = verdict(fs)
    assert v.status == "inconclusive" and v.judged == 1
    assert "12 of 13 rules could not judge" in v.headline() and "not logged" in v.headline()
    cut = [{**r, "rollout/truncation_rate": 1.0} for r in only_trunc]
    v = verdict(diagnose(cut))  # a mechanism alone, no outcome to follow it: a warning
    assert v.status == "warning" and not v.why
    rng = random.Random(0)
    flat = [
        {"step": i, "rollout/truncation_rate": 1.0, "rollout/reward_mean": 0.3 + rng.gauss(0, 0.01)}
        for i in range(80)
    ]
    v = verdict(diagnose(flat))  # the outcome fails: failing, with truncation as its cause
    assert v.status == "failing" and v.why == ("not_learning", "truncation_noise (cause)")


def test_a_rising_reward_and_a_calm_loss_are_not_enough_to_call_a_run_healthy():
    """A public log whose author calls the run a collapse logged only a reward that rose and a
    policy loss: the loss of a policy-gradient method sits near 0 by construction, so it is no
    evidence that the updates are stable; a gradient norm or a KL is."""
    run = [
        {"step": 20 * i, "rollout/accuracy": 0.5 + 0.005 * i + 0.02 * (i % 2), "actor/loss": 0.01 * (i % 3)}
        for i in range(1, 22)
    ]
    assert verdict(diagnose(run)).status == "inconclusive"
    with_grad = [{**r, "actor/grad_norm": 0.3 + 0.01 * (r["step"] % 3)} for r in run]
    assert verdict(diagnose(with_grad)).status == "healthy"


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 80),
    keys=st.sets(
        st.sampled_from(
            [
                "actor/entropy",
                "rollout/accuracy",
                "rollout/truncation_rate",
                "actor/grad_norm",
                "actor/approx_kl",
            ]
        )
    ),
    value=st.floats(0.01, 5.0),
    every=st.integers(1, 20),
)
def test_no_run_with_a_majority_of_unknown_rules_is_healthy(n, keys, value, every):
    run = [{"step": every * i, **dict.fromkeys(keys, value)} for i in range(n)]
    fs = diagnose(run)
    v = verdict(fs)
    unknown = sum(f.status == "unknown" for f in fs)
    if unknown * 2 >= len(fs):
        assert v.status != "healthy"
    assert v.judged + unknown == len(fs) == len(RULES)
    assert all(f.reason in ("not logged", "too few steps") for f in fs if f.status == "unknown")
    assert all(f.start_step is None for f in fs if f.status in ("healthy", "unknown"))


@settings(max_examples=40, deadline=None)
@given(shift=st.integers(-1000, 1000), seed=st.integers(0, 10**6))
def test_statuses_do_not_depend_on_where_steps_start_or_row_order(shift, seed):
    import random

    rng = random.Random(seed)
    run = [
        {
            "step": i,
            "actor/entropy": 1.0 - 0.01 * i + rng.uniform(-0.02, 0.02),
            "rollout/accuracy": rng.uniform(0, 1),
            "actor/grad_norm": rng.uniform(0.1, 1.0),
            "rollout/truncation_rate": rng.uniform(0, 0.3),
        }
        for i in range(60)
    ]
    moved = [{**r, "step": r["step"] + shift} for r in run]
    rng.shuffle(moved)
    a, b = diagnose(run), diagnose(moved)
    assert [f.status for f in a] == [f.status for f in b]
    assert [f.start_step for f in a] == [None if f.start_step is None else f.start_step - shift for f in b]


def test_config_rejects_bad_thresholds():
    for bad in (
        {"window_frac": 1.5},
        {"entropy_fail_frac": 0.9},
        {"entropy_explode_warn": 3.0},
        {"kl_blowup": 0.5},
        {"min_judged_frac": 1.5},
        {"grad_explode": math.nan},
    ):
        with pytest.raises(ValueError):
            HealthConfig(**bad)


def test_reference_bands_from_runs_and_units():
    from dapo.health import PAPER_REFERENCES

    runs = [[{"step": i, "actor/entropy": 1.0 + k * 0.1} for i in range(10)] for k in range(3)]
    ref = references_from_runs(runs, ["actor/entropy"], "test")["actor/entropy"]
    assert ref.at(0.5) == pytest.approx((1.0, 1.2))
    band = PAPER_REFERENCES["rollout/length_mean"]
    assert band.comparable([900.0, 2500.0]) and not band.comparable([4.0, 6.0])  # 5-token answers


# ---- the trainer callback ------------------------------------------------------------------------------


def test_health_monitor_writes_verdicts_every_n_steps():
    mon = HealthMonitor(every_steps=10)
    outs, lines = [], []
    for i in range(60):  # steps count from 1, as the trainer prints and logs them
        out, line = mon.observe(
            {"step": i + 1, "actor/entropy": 1.0 if i < 20 else 0.2, "rollout/truncation_rate": 0.0}
        )
        outs.append(out)
        if line:
            lines.append((i, line))
    assert all(not o for i, o in enumerate(outs) if (i + 1) % 10)
    assert outs[9]["health/verdict"] == 3.0  # inconclusive after 10 steps
    # entropy at a fifth of its start and no outcome logged: a warning (the outcome decides failing)
    assert outs[59]["health/verdict"] == 1.0 and outs[59]["health/entropy_collapse"] == SEVERITY["warning"]
    assert lines[0][0] == 9 and "warning" in lines[-1][1] and "entropy_collapse warning" in lines[-1][1]
    from dapo.metrics import SCHEMA

    assert set(outs[59]) <= set(SCHEMA)  # every health/* name is documented
    with pytest.raises(ValueError):
        HealthMonitor(every_steps=-1)


def _drift_log(values):
    return [{"step": i, "mismatch/k3_kl": v} for i, v in enumerate(values)]


@pytest.mark.parametrize(
    "values, want",
    [
        ([1e-4] * 30 + [1e-4 * 1.3**i for i in range(30)], "failing"),  # rises steadily to ~0.026
        ([1e-3] * 30 + [0.008] * 30, "warning"),  # grown 8x but still small
        ([0.03] * 60, "warning"),  # high from the start: an offset, not drift
        ([5e-4, 1.5e-3] * 30, "healthy"),  # a bf16-sized gap that wobbles
        ([0.0] * 30 + [0.003] * 30, "healthy"),  # grows from nothing to below the warning level
    ],
)
def test_off_policy_drift_judges_growth_not_an_offset(values, want):
    assert status(_drift_log(values), "off_policy_drift").status == want


def test_off_policy_drift_reads_verls_rollout_corr_metrics(tmp_path):
    from dapo.health.readers import read_runs

    lines = [
        f"step:{i} - rollout_corr/k3_kl:{1e-4 * 1.3 ** max(0, i - 30):.6f} - actor/entropy:0.5 - critic/score/mean:0.3"
        for i in range(1, 61)
    ]
    path = tmp_path / "verl.log"
    path.write_text("\n".join(lines) + "\n")
    runs, _, fmt = read_runs(path)
    assert fmt == "verl-console"
    assert status(runs["run"], "off_policy_drift").status == "failing"
    assert status(_drift_log([]), "off_policy_drift").reason == "not logged"


def test_a_short_inconclusive_run_is_told_how_many_steps_the_rules_need(tmp_path, capsys):
    """The README's 3-step CPU run: inconclusive, and one line says how many steps would give a
    verdict (6: two windows of three rows for the rules on learning and stability); a log of
    that many steps gets a verdict."""
    import json

    from dapo.cli import main

    def log(n):
        rows = [
            {
                "step": s,
                "rollout/accuracy": 0.1 + 0.01 * s,
                "actor/entropy": 1.3,
                "actor/grad_norm": 1.5,
                "actor/approx_kl": 0.001,
                "actor/loss": 0.01,
            }
            for s in range(1, n + 1)
        ]
        path = tmp_path / f"run{n}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)

    main(["diagnose", log(3)])
    out = capsys.readouterr().out
    assert ": inconclusive (" in out
    assert (
        "  inconclusive: 3 steps logged, the rules need at least 6; run longer (dapo train: train.steps=6)"
        in out
    )
    main(["diagnose", log(6)])
    out = capsys.readouterr().out
    assert "inconclusive" not in out and ": healthy (" in out
