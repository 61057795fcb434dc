"""A run its launcher restarts (scale/ops/restart.py): which attempt a process is, how far the
attempt before it got, and when two deaths at the same step stop the run instead of a third.
The restarts themselves, by torchrun's agent on real processes: tests/test_restart_torchrun.py."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from scale.ops import restart
from scale.ops.restart import Attempt, attempt, crash_loop, last_logged_step, on_restart


def test_the_attempt_is_read_from_both_launchers():
    assert attempt({}) == Attempt(0, 0) and not attempt({}).restarted
    assert attempt({"TORCHELASTIC_RESTART_COUNT": "0"}) == Attempt(0, 0)
    now = attempt({"TORCHELASTIC_RESTART_COUNT": "2", "SLURM_RESTART_COUNT": "1"})
    assert now == Attempt(slurm=1, torchrun=2) and now.restarted
    assert str(now) == "SLURM requeue 1, torchrun restart 2"
    assert attempt({"TORCHELASTIC_RESTART_COUNT": "x", "SLURM_RESTART_COUNT": ""}) == Attempt(0, 0)


def test_how_far_the_last_attempt_got_skips_a_torn_last_line(tmp_path):
    assert last_logged_step(tmp_path) == 0
    rows = [json.dumps({"step": s, "actor/loss": 0.1}) for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + '\n{"step": 4, "actor/lo')
    assert last_logged_step(tmp_path) == 3


def _died_after(tmp_path, step: int) -> None:
    """An attempt that logged steps 1..step, then died."""
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s}) + "\n" for s in range(1, step + 1))
    )


def test_a_crash_at_the_same_step_twice_stops_the_run(tmp_path):
    said = []
    _died_after(tmp_path, 2)  # the first attempt died in step 3
    assert on_restart(tmp_path, Attempt(torchrun=1), 2, log=said.append) is None
    assert (
        "torchrun restart 1: the attempt before reached step 2; resuming from checkpoint step 2" in said[-1]
    )
    _died_after(tmp_path, 2)  # the restart died in step 3 again
    stop = on_restart(tmp_path, Attempt(torchrun=2), 2, log=said.append)
    assert stop is not None and "both died after step 2 was logged, in step 3" in stop
    assert "\n" not in stop
    rows = restart.records(tmp_path)
    assert [(r["torchrun"], r["reached"], r["stopped"]) for r in rows] == [(1, 2, False), (2, 2, True)]
    # every restart the launcher still has stops at once, and says why
    assert on_restart(tmp_path, Attempt(torchrun=3), 2, log=said.append) is not None


def test_a_run_that_moves_on_between_deaths_is_restarted(tmp_path):
    _died_after(tmp_path, 2)
    assert on_restart(tmp_path, Attempt(torchrun=1), 2) is None
    _died_after(tmp_path, 5)  # further this time: another fault
    assert on_restart(tmp_path, Attempt(torchrun=2), 4) is None
    _died_after(tmp_path, 7)
    assert on_restart(tmp_path, Attempt(slurm=1), 6) is None


def test_rank_zero_restarted_alone_records_its_attempt_once(tmp_path):
    _died_after(tmp_path, 3)
    assert on_restart(tmp_path, Attempt(torchrun=1), 3) is None
    assert on_restart(tmp_path, Attempt(torchrun=1), 3) is None  # the same attempt again: not a loop
    assert len(restart.records(tmp_path)) == 1


@given(st.lists(st.integers(0, 6), min_size=1, max_size=8))
def test_the_run_stops_exactly_when_two_deaths_in_a_row_share_a_step(reached):
    """Whatever the sequence of steps the attempts reached: restart n stops iff attempts n-1
    and n-2 died after the same step."""
    rows: list[dict] = []
    for n, step in enumerate(reached):
        stop = crash_loop(rows, step)
        assert (stop is not None) == (n > 0 and reached[n - 1] == step)
        rows.append({"reached": step})
