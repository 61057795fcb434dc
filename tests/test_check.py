"""`dapo toy check`: every loss of the broken corpus (tests/broken_losses.py) fails or is
refused with its reason, every correct one passes, DAPO's own loss passes, and the
command's output, JSON and exit status are what a CI job relies on."""

from __future__ import annotations

import json
import math

import broken_losses
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dapo.cli import main as dapo_main
from toybench.check import (
    DOES_NOT_LEARN,
    MAX_SKIPPED_SHARE,
    MIN_SEEDS,
    MIN_SHARE,
    MODES,
    _protection,
    _vs_fix,
    assert_protects,
    check,
)
from toybench.stats import Interval

pytestmark = pytest.mark.slow


def test_hard_coded_symmetric_clip_is_caught_by_name():
    (r,) = check(["broken_losses:symmetric_clip"], seeds=5, modes=["entropy_collapse"], jobs=1)
    assert r.ignored == ["eps_high"]
    assert r.modes["entropy_collapse"].protection != "protects"
    assert not r.passed
    assert any(
        "ignores eps_high: eps_high=0.1 and eps_high=1.0 give the same value (loss" in f for f in r.failures
    )
    assert any("entropy_collapse" in f for f in r.failures)


def test_per_sequence_aggregation_is_caught_by_name():
    (r,) = check(["broken_losses:per_sequence"], seeds=5, modes=["length_bias"], jobs=1)
    assert r.ignored == ["loss_agg"]
    assert r.modes["length_bias"].protection != "protects"
    assert any(
        "ignores loss_agg: loss_agg='token-mean' and loss_agg='seq-mean-token-mean'" in f for f in r.failures
    )
    assert any("length_bias" in f for f in r.failures)


def _same_logs(a, b):
    return repr(a) == repr(b)  # NaN-safe: a metric with no tokens to average is NaN in both


def test_a_later_check_reuses_the_built_in_arms_and_its_results_equal_a_fresh_run(monkeypatch):
    """What an earlier call in this process trained (the unprotected and fix arms, a built-in
    candidate) is not trained again; a user's loss is (its module may have changed). Every log is
    the one a call without the memo gives, and a caller that edits a log it got edits no one else's."""
    from dapo.registry import resolve
    from toybench import memo
    from toybench.check import derived_experiment
    from toybench.experiment import run_experiments, with_steps

    monkeypatch.setenv(
        "DAPO_TOY_CACHE", "off"
    )  # this process's memo alone (tests/test_toy_cache.py: the disk)
    memo.clear()
    losses = [resolve("cispo"), resolve("broken_losses:symmetric_clip")]
    exp = with_steps(derived_experiment(MODES["entropy_collapse"], losses, {}), 12)
    kw = dict(seeds=2, jobs=1, progress=False)
    fresh = run_experiments([exp], **kw)[0]  # without the memo: nothing kept
    first, second = {}, {}
    run_experiments([exp], memo=True, stats=first, **kw)
    again = run_experiments([exp], memo=True, stats=second, **kw)[0]
    assert (first["runs"], first["reused"]) == (16, 0)  # 4 arms x 4 seeds, trained
    assert (second["runs"], second["reused"]) == (4, 12)  # the user's loss alone, trained again
    assert _same_logs(again.logs, fresh.logs) and _same_logs(again.summaries, fresh.summaries)
    again.logs[MODES["entropy_collapse"].fix][0][0]["actor/entropy"] = -1.0
    third = run_experiments([exp], memo=True, **kw)[0]
    assert _same_logs(third.logs, fresh.logs)
    memo.clear()


def test_dapo_loss_is_its_own_fix_and_cannot_fix_sampling():
    """DAPO's loss with its recipe *is* the fix arm on the two loss failure modes (share of
    the fix exactly 1, zero-width gap) and changes nothing where the fix is sampling."""
    (r,) = check(["dapo"], seeds=6, modes=["entropy_collapse", "length_bias", "zero_gradient"], jobs=1)
    for mode in ("entropy_collapse", "length_bias"):
        m = r.modes[mode]
        assert m.protection == "protects" and m.vs_fix == "as fix"
        assert m.recovered == pytest.approx(1.0)
    z = r.modes["zero_gradient"]
    assert z.protection == "no effect shown" and z.effect["discovery"].mean == 0.0
    assert r.passed


def test_assert_protects_raises_with_the_reason():
    with pytest.raises(AssertionError, match=r"ignores eps_high.*entropy_collapse"):
        assert_protects("broken_losses:symmetric_clip", "entropy_collapse", seeds=4)


def test_overrides_reach_the_candidate():
    """--set eps_high=0.2 turns DAPO's loss back into the symmetric baseline."""
    (r,) = check(["dapo"], seeds=6, modes=["entropy_collapse"], overrides={"eps_high": 0.2}, jobs=1)
    assert r.knobs["eps_high"] == 0.2
    assert r.modes["entropy_collapse"].protection == "no effect shown"
    assert r.modes["entropy_collapse"].effect["discovery"].mean == 0.0


def test_cli_table_json_and_exit_status(tmp_path, capsys):
    out = tmp_path / "r.json"
    args = ["toy", "check", "--modes", "entropy_collapse", "--seeds", "6", "--jobs", "1", "--quiet"]
    assert dapo_main([*args, "dapo", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "protects" in text and "1 of 1 losses pass" in text
    data = json.loads(out.read_text())
    (res,) = data["results"]
    assert res["loss"] == "dapo" and res["passed"] is True
    assert set(res["modes"]) == {"entropy_collapse"}
    assert dapo_main([*args, "broken_losses:symmetric_clip"]) == 1
    assert "IGNORED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,words",
    [
        (["toy", "check"], "name at least one LOSS"),
        (["toy", "check", "nope"], "not a built-in"),
        (["toy", "check", "verl:nope"], "verl"),
        (["toy", "check", "dapo", "--set", "eps_high=abc"], "--set 'eps_high=abc'"),
        (["toy", "check", "dapo", "--set", "foo=1"], "KNOB one of"),
        (["toy", "check", "dapo", "--set", "loss_agg=mean"], "loss_agg must be one of"),
        (["toy", "check", "dapo", "--modes", "entropy"], "--modes 'entropy'"),
        (["toy", "check", "dapo", "--claims", "speed"], "--claims 'speed'"),
        (["toy", "check", "clip_cov[ratio=1]"], "unknown parameter 'ratio'"),
        (["toy", "check", "broken_losses:raises"], "raised: RuntimeError: shape"),
        (["toy", "check", "broken_losses:not_scalar"], "must return a scalar tensor"),
        (["toy", "check", "broken_losses:detached_output"], "no gradient with respect to logp"),
        (["toy", "check", "dapo", "--knobs", "temperature"], "--knobs 'temperature'"),
        (["toy", "check", "dapo", "--partial"], "--partial needs --staleness K >= 1"),
        (["toy", "check", "dapo", "--correction", "tis"], "--correction 'tis': choose from none, bypass"),
        (
            ["toy", "check", "gspo", "--staleness", "1", "--correction", "token_tis"],
            "gspo takes no is_weights keyword or ignores it",
        ),
        # raises only on the experiments' 128-response batches, inside a worker process
        (
            ["toy", "check", "broken_losses:fixed_buffer", "--jobs", "2", "--quiet"],
            "loss 'broken_losses:fixed_buffer' raised: RuntimeError: The expanded size",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, words, capsys):
    assert dapo_main(argv) == 2
    # a run that fails after --quiet's first progress line (10 s in, on a loaded machine) has
    # printed that line before the refusal: the refusal is still one line
    lines = capsys.readouterr().err.strip().splitlines()
    err = [line for line in lines if not line.startswith("toy runs: ")]
    assert len(err) == 1 and words in err[0] and "Traceback" not in "\n".join(lines), lines


def test_every_mode_names_arms_and_summaries_that_exist():
    from toybench.experiments import REGISTRY

    for m in MODES.values():
        e = REGISTRY[m.experiment]
        assert {m.unprotected, m.fix} <= set(e.arms) and m.summary in e.summaries
        primary = next(c for c in e.contrasts if c.role == "primary")
        # the primary contrast compares these two arms, in the fix's direction
        assert {primary.a, primary.b} == {m.unprotected, m.fix}
        direction = primary.expect if primary.b == m.fix else {"+": "-", "-": "+"}[primary.expect]
        assert direction == m.better


@pytest.mark.parametrize("name", list(broken_losses.REFUSED))
def test_every_unrunnable_loss_is_refused_in_one_line(name, capsys):
    """Exit 2 with the loss's name and its error, never an internal error (exit 70), under
    the default --jobs."""
    assert dapo_main(["toy", "check", f"broken_losses:{name}", "--seeds", "6", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"broken_losses:{name}" in err and broken_losses.REFUSED[name] in err
    assert "\n" not in err and "internal error" not in err


def test_the_learning_gate_on_all_four_tasks():
    """A loss that un-learns (sign flip) gets `cannot judge: learns too little` on every task and no share of
    the fix (it used to be rated better than DAPO's fix on entropy and length); a loss that
    is NaN in windows of uniform groups passes every probe and is caught by its skipped steps;
    DAPO's loss learns everywhere."""
    dapo, flip, nan_rows = check(
        ["dapo", "broken_losses:sign_flip", "broken_losses:nan_on_uniform_windows"], seeds=6, jobs=2
    )
    assert dapo.learns and dapo.passed, dapo.failures
    for mode in MODES:
        m = flip.modes[mode]
        assert m.protection == DOES_NOT_LEARN and not m.learning.learns and math.isnan(m.recovered)
        assert m.learning.gain["discovery"].high < 0  # it un-learns
        assert any(
            f.startswith(f"cannot judge protection on {mode}'s task: learns too little")
            for f in flip.failures
        )
    assert not nan_rows.contract  # the probes' batches all carry a non-zero advantage
    skipping = [m.mode for m in nan_rows.modes.values() if m.learning.skipped_share > MAX_SKIPPED_SHARE]
    assert "zero_gradient" in skipping  # its unprotected arm keeps uniform groups
    for mode in skipping:
        assert any(f.startswith("skips ") and f"in {mode}'s runs" in f for f in nan_rows.failures)
    assert dapo.modes["zero_gradient"].learning.skipped == 0


def test_assert_protects_fails_a_loss_that_does_not_learn():
    with pytest.raises(
        AssertionError, match=r"contract \(gradient_sign\).*cannot judge protection on entropy_collapse"
    ):
        assert_protects("broken_losses:sign_flip", "entropy_collapse", seeds=3)


def test_declared_knobs_pass_a_loss_without_dual_clip(capsys):
    """A correct decoupled-clip loss without dual clip fails only until it says so; the
    probe line names the values probed, not the run's (None)."""
    args = ["toy", "check", "--modes", "entropy_collapse", "--seeds", "6", "--jobs", "1", "--quiet"]
    assert dapo_main([*args, "broken_losses:decoupled_clip_undeclared"]) == 1
    out = capsys.readouterr().out
    assert "ignores clip_ratio_c: clip_ratio_c=None and clip_ratio_c=1.5 give the same value" in out
    assert dapo_main([*args, "broken_losses:decoupled_clip_undeclared", "--knobs", "eps_low,eps_high"]) == 0
    assert dapo_main([*args, "broken_losses:decoupled_clip_no_dual"]) == 0  # declared by dapo_knobs


def _iv(lo, hi, n=10):
    return Interval((lo + hi) / 2, lo, hi, n)


@given(a=st.floats(-1e-10, 1e-10), b=st.floats(-1e-10, 1e-10), scale=st.floats(1e-3, 1e3))
def test_effects_below_numerical_noise_are_no_effect(a, b, scale):
    """Zero-width intervals at 1e-17 (two algebraically equal losses) are no effect, and an
    equal-within-noise gap is as fix, however the interval lies."""
    lo, hi = min(a, b) * scale, max(a, b) * scale
    iv = _iv(lo, hi)
    tol = 1e-9 * scale
    assert _protection(iv, iv, iv, 1.0, tol) == "no effect shown"
    assert _vs_fix(iv, Interval(1.0, 0.5, 1.5, 10), 1.0, tol) == "as fix"


@given(
    fix=st.floats(0.1, 10.0),
    share=st.floats(0.0, 2.0),
    half_width=st.floats(0.0, 0.3),
    sign=st.sampled_from([1.0, -1.0]),
)
def test_protects_needs_the_effect_beyond_half_the_fix_and_harms_its_mirror(fix, share, half_width, sign):
    """With the fix's effect f (in its direction) and a candidate effect of share x f, known to
    +-half_width x f: protects exactly when the whole interval lies beyond f / 2 in the fix's
    direction, harms when beyond f / 2 against it, else no effect shown; flipping the metric's
    direction (sign) flips nothing but the sign of every number."""
    f = sign * fix
    eff = _iv(sign * fix * (share - half_width), sign * fix * (share + half_width))
    eff = Interval(sign * fix * share, min(eff.low, eff.high), max(eff.low, eff.high), 10)
    shifted = Interval(eff.mean - MIN_SHARE * f, eff.low - MIN_SHARE * f, eff.high - MIN_SHARE * f, 10)
    mirrored = Interval(eff.mean + MIN_SHARE * f, eff.low + MIN_SHARE * f, eff.high + MIN_SHARE * f, 10)
    got = _protection(eff, shifted, mirrored, sign, 1e-12)
    if share - half_width > MIN_SHARE + 1e-9:
        assert got == "protects"
    elif share + half_width < MIN_SHARE - 1e-9:
        assert got != "protects"
    neg = Interval(-eff.mean, -eff.high, -eff.low, 10)
    harm = Interval(neg.mean + MIN_SHARE * f, neg.low + MIN_SHARE * f, neg.high + MIN_SHARE * f, 10)
    share_neg = Interval(neg.mean - MIN_SHARE * f, neg.low - MIN_SHARE * f, neg.high - MIN_SHARE * f, 10)
    got_neg = _protection(neg, share_neg, harm, sign, 1e-12)
    if share - half_width > MIN_SHARE + 1e-9:
        assert got_neg == "harms"
    elif share + half_width < MIN_SHARE - 1e-9:
        assert got_neg != "harms"


def test_a_block_with_fewer_judged_seeds_than_the_minimum_is_not_judged():
    """Five seeds all on one side still make no verdict (a sign test cannot exclude 0 at 5%)."""
    few = Interval(1.0, 0.9, 1.1, MIN_SEEDS - 1)
    assert _protection(few, few, few, 1.0) == "cannot judge: too few seeds"
    enough = Interval(1.0, 0.9, 1.1, MIN_SEEDS)
    assert _protection(enough, enough, enough, 1.0) == "protects"


def test_the_staleness_axis_on_built_in_peer_and_user_losses(tmp_path):
    """``--staleness K --correction NAME``: every arm trains on rollouts K versions old with
    the correction; the weights reach a built-in, a peer's and a user's loss."""
    import importlib.util

    specs = ["dapo", "broken_losses:per_sequence"]
    if importlib.util.find_spec("verl"):
        specs.append("verl:vanilla")
    out = tmp_path / "check.json"
    args = ["toy", "check", *specs, "--modes", "entropy_collapse", "--seeds", "6", "--no-confirm"]
    args += ["--jobs", "1", "--quiet", "--staleness", "2", "--correction", "token_tis", "--json", str(out)]
    args += ["--set", "eps_high=0.28"]  # every candidate at DAPO's clip
    dapo_main(args)
    data = json.loads(out.read_text())
    assert (data["staleness"], data["partial"], data["correction"]) == (2, False, "token_tis")
    by = {r["loss"]: r["modes"]["entropy_collapse"] for r in data["results"]}
    assert by["dapo"]["protection"] == "protects" and by["dapo"]["learns"]
    assert set(by) == set(specs)
    if "verl:vanilla" in by:  # verl's vanilla loss is DAPO's at the same knobs, weights included
        assert by["verl:vanilla"]["values"]["candidate"] == pytest.approx(
            by["dapo"]["values"]["candidate"], rel=1e-6
        )


def test_a_user_loss_that_declares_no_claims_is_said_to_be_held_to_dapos(capsys):
    """A ``module:function`` claims nothing itself: wherever the output names a claim it says
    the claim is DAPO's, by default; with ``--claims`` the claim is the user's own."""
    args = ["toy", "check", "broken_losses:swapped_bounds", "--modes", "entropy_collapse", "--seeds", "6"]
    args += ["--no-confirm", "--jobs", "1", "--quiet"]
    assert dapo_main(args) == 1
    out = capsys.readouterr().out
    assert "- claims (DAPO's, by default) to protect against entropy_collapse but " in out
    assert "  yes (DAPO's, by default)  " in out  # the table's "claimed" column
    assert "FAIL: does not protect (DAPO's claims, by default): entropy_collapse" in out
    assert "- claims to protect against" not in out
    assert dapo_main([*args, "--claims", "entropy_collapse"]) == 1
    out = capsys.readouterr().out
    assert "- claims to protect against entropy_collapse but " in out and "(claims: --claims)" in out
    assert "DAPO's, by default" not in out


def test_with_no_loss_named_the_check_runs_the_configs_loss_at_its_knobs(tmp_path, capsys):
    """``--config``: the loss is the config's ``algo.policy_loss`` and every arm runs at the
    config's knobs, as ``dapo train`` would run it; the JSON names both, and the loss's source
    hash (what the gate compares)."""
    from dapo.registry import resolve, source_hash

    cfg = tmp_path / "run.yaml"
    cfg.write_text("algo:\n  policy_loss: grpo\n  eps_high: 0.3\n  clip_ratio_c: 3.0\n")
    out = tmp_path / "check.json"
    argv = ["toy", "check", "--config", str(cfg), "--modes", "entropy_collapse", "--seeds", "6", "--quiet"]
    dapo_main([*argv, "--no-confirm", "--json", str(out)])
    (result,) = json.loads(out.read_text())["results"]
    assert result["loss"] == "grpo" and result["source_hash"] == source_hash(resolve("grpo"))
    assert result["knobs"] == {"eps_low": 0.2, "eps_high": 0.3, "clip_ratio_c": 3.0, "loss_agg": "token-mean"}
    capsys.readouterr()
    for text, words in (
        ("algo:\n  policy_loss: broken_losses:not_scalar\n", "must return a scalar tensor"),
        ("algo:\n  policy_loss: 'a[b'\n", "policy_loss: loss 'a[b': expected NAME"),
        ("algo:\n  eps_high: -1\n", "algo.eps_high: must be > 0"),
        ("algo: [1]\n", "its algo section is not a mapping"),
    ):
        cfg.write_text(text)
        assert dapo_main(["toy", "check", "--config", str(cfg)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
    assert dapo_main(["toy", "check", "--config", "no-such-preset"]) == 2
    assert "--config 'no-such-preset': no such file, nor a bundled preset" in capsys.readouterr().err


def test_fewer_seeds_than_a_verdict_needs_are_refused_in_one_line(capsys):
    """Five seeds a block cannot exclude 0 even when all agree: refused before anything runs."""
    assert dapo_main(["toy", "check", "dapo", "--seeds", "5", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--seeds: must be >= 6" in err
