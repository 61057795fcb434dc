"""ScaleFreeSGD (toybench.optim), the check's optimizer: a constant factor on the loss changes
no step, a skipped step leaves its state alone, and the batched engine takes the per-run
loop's steps with it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_toy_engine import _engine_with_tables, _loop_with_tables, assert_logs_match

from toybench import engine, runner
from toybench.experiments import REGISTRY
from toybench.optim import BETA, EPS, ScaleFreeSGD, make


def _trajectory(grads: list[torch.Tensor], c: float) -> torch.Tensor:
    p = torch.nn.Parameter(torch.zeros(grads[0].shape, dtype=torch.float64))
    opt = ScaleFreeSGD([p], lr=0.7)
    for g in grads:
        p.grad = g * c
        opt.step()
    return p.detach()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.floats(-3, 3), min_size=4, max_size=4), min_size=1, max_size=12),
    st.floats(0.01, 100.0),
)
def test_a_constant_factor_on_the_gradient_changes_no_step(rows, c):
    """g -> c g: v -> c^2 v, and every step is the same, up to AdamW's eps (relative eps / (c ||g||))."""
    grads = [torch.tensor(r, dtype=torch.float64) + 0.5 for r in rows]  # no all-zero gradient
    a, b = _trajectory(grads, 1.0), _trajectory(grads, c)
    assert torch.allclose(
        a, b, rtol=1e-5, atol=1e-5 * float(a.abs().max())
    )  # eps / (c ||g||) <= 1e-8 / (0.01 x 0.5)


def test_the_first_step_has_length_lr_and_sgd_is_plain_sgd():
    """At t = 1 the bias-corrected v is ||g||^2: the step is lr x g / ||g|| (+ eps)."""
    g = torch.tensor([3.0, 4.0], dtype=torch.float64)
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = make("scale_free", [p], 0.5)
    p.grad = g.clone()
    opt.step()
    assert torch.allclose(p.detach(), -0.5 * g / (5.0 + EPS))
    q = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    sgd = make("sgd", [q], 0.5)
    q.grad = g.clone()
    sgd.step()
    assert torch.equal(q.detach(), -0.5 * g)
    assert 0 < BETA < 1
    with pytest.raises(ValueError, match="optimizer 'adam'"):
        make("adam", [q], 0.5)


def test_a_step_without_a_gradient_leaves_the_state_alone():
    """dapo.update skips a non-finite step by dropping the gradients: no step, and v and t
    do not move (a skipped step is not a step the loss took)."""
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = ScaleFreeSGD([p], lr=1.0)
    opt.step()
    assert (
        float(opt.t) == 0
        and float(opt.v) == 0
        and torch.equal(p.detach(), torch.zeros(2, dtype=torch.float64))
    )


@pytest.mark.parametrize("exp_name", ["entropy_collapse", "length_bias"])
def test_the_engine_takes_the_loops_scale_free_steps_bit_for_bit_whatever_shares_its_batch(exp_name):
    """The batched engine's per-run ScaleFreeSGD against the loop's optimizer: the same
    trajectory bit for bit (the exact expected accuracy at every step is a function of the
    table), and a run trained alone is the run trained beside others (the memo of dapo toy
    check reuses runs across batches, so it must be)."""
    exp = REGISTRY[exp_name]
    arm = next(iter(exp.arms))
    specs = [
        replace(exp.spec(arm, seed, steps=8), optimizer="scale_free", lr=0.5, loss=loss)
        for loss in ("dapo", "gspo")
        for seed in (0, 3)
    ]
    assert len({engine.batch_key(s) for s in specs}) == 1
    ref, ref_tables = _loop_with_tables(specs)
    got, table = _engine_with_tables(specs)
    for i, s in enumerate(specs):
        assert_logs_match(ref[i], got[i], (exp_name, s.loss, s.seed))
        assert torch.equal(ref_tables[i], table[i]), (s.loss, s.seed)  # the trajectory, bit for bit
    alone, alone_table = _engine_with_tables([specs[3]])
    assert torch.equal(alone_table[0], table[3])  # the same trajectory alone as in its batch
    assert_logs_match(alone[0], got[3], "alone")
    sgd = engine._Engine([replace(specs[0], optimizer="sgd")])
    sgd_log = sgd.run(None)[0]
    assert sgd_log[-1]["toy/expected_accuracy"] != got[0][-1]["toy/expected_accuracy"]  # another optimizer


def test_the_gru_policy_refuses_another_optimizer():
    exp = REGISTRY["entropy_collapse"]
    spec = replace(exp.spec("symmetric", 0, policy="gru", steps=2), optimizer="scale_free")
    with pytest.raises(ValueError, match="needs the tabular policy"):
        runner.train(spec)


def _row(mode, k, shown, share, share_u):
    block = {"shown": shown, "gain_share": share, "gain_share_u": share_u}
    return {"mode": mode, "factor": k, "discovery": dict(block), "confirmation": dict(block)}


def test_the_learning_margin_is_the_least_gain_where_every_fix_still_shows():
    """toybench.step_sweep.margin: the smallest factor down to which every mode shows its fix
    on both blocks (a factor below a gap does not count), and there the smaller arm's share."""
    from toybench.step_sweep import margin

    rows = [
        _row("a", 1.0, True, 1.0, 0.9),
        _row("a", 0.5, True, 0.85, 0.8),
        _row("a", 0.3, False, 0.7, 0.7),
        _row("a", 0.1, True, 0.4, 0.4),  # shown again below a gap: not counted
        _row("b", 1.0, True, 1.0, 1.0),
        _row("b", 0.5, True, 0.97, 0.98),
        _row("b", 0.3, True, 0.95, 0.95),
        _row("b", 0.1, True, 0.7, 0.7),
    ]
    assert margin(rows) == (0.5, 0.8)


def test_the_step_sweep_refuses_bad_arguments_in_one_line(capsys):
    from toybench.step_sweep import main

    for argv, words in (
        (["--seeds", "2"], "--seeds: must be >= 6"),
        (["--jobs", "0"], "--jobs: must be >= 1"),
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert words in err and "\n" not in err
