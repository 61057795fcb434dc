"""`dapo toy check`: deliberately broken losses are caught by name, DAPO's own loss passes,
and the command's output, JSON and exit status are what a CI job relies on."""

from __future__ import annotations

import json

import pytest

from dapo.cli import main as dapo_main
from toybench.check import MODES, assert_protects, check

pytestmark = pytest.mark.slow


def test_hard_coded_symmetric_clip_is_caught_by_name():
    (r,) = check(["broken_losses:symmetric_clip"], seeds=5, modes=["entropy_collapse"], jobs=1)
    assert r.ignored == ["eps_high"]
    assert r.modes["entropy_collapse"].protection != "protects"
    assert not r.passed
    assert any("ignores eps_high=0.28" in f for f in r.failures)
    assert any("entropy_collapse" in f for f in r.failures)


def test_per_sequence_aggregation_is_caught_by_name():
    (r,) = check(["broken_losses:per_sequence"], seeds=5, modes=["length_bias"], jobs=1)
    assert r.ignored == ["loss_agg"]
    assert r.modes["length_bias"].protection != "protects"
    assert any("ignores loss_agg='token-mean'" in f for f in r.failures)
    assert any("length_bias" in f for f in r.failures)


def test_dapo_loss_is_its_own_fix_and_cannot_fix_sampling():
    """DAPO's loss with its recipe *is* the fix arm on the two loss failure modes (share of
    the fix exactly 1, zero-width gap) and changes nothing where the fix is sampling."""
    (r,) = check(["dapo"], seeds=4, modes=["entropy_collapse", "length_bias", "zero_gradient"], jobs=1)
    for mode in ("entropy_collapse", "length_bias"):
        m = r.modes[mode]
        assert m.protection == "protects" and m.vs_fix == "as fix"
        assert m.recovered == pytest.approx(1.0)
    z = r.modes["zero_gradient"]
    assert z.protection == "no effect" and z.effect["discovery"].mean == 0.0
    assert r.passed


def test_assert_protects_raises_with_the_reason():
    with pytest.raises(AssertionError, match=r"ignores eps_high.*entropy_collapse"):
        assert_protects("broken_losses:symmetric_clip", "entropy_collapse", seeds=4)


def test_overrides_reach_the_candidate():
    """--set eps_high=0.2 turns DAPO's loss back into the symmetric baseline."""
    (r,) = check(["dapo"], seeds=3, modes=["entropy_collapse"], overrides={"eps_high": 0.2}, jobs=1)
    assert r.knobs["eps_high"] == 0.2
    assert r.modes["entropy_collapse"].protection == "no effect"
    assert r.modes["entropy_collapse"].effect["discovery"].mean == 0.0


def test_cli_table_json_and_exit_status(tmp_path, capsys):
    out = tmp_path / "r.json"
    args = ["toy", "check", "--modes", "entropy_collapse", "--seeds", "3", "--jobs", "1", "--quiet"]
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
        (["toy", "check", "broken_losses:raises"], "raised on the toy batch: RuntimeError: shape"),
        (["toy", "check", "broken_losses:not_scalar"], "must return a scalar tensor"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, words, capsys):
    assert dapo_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and "Traceback" not in err


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
