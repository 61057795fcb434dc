"""The multi-process test support: failures are reported with the rank's own stderr, a hung
rank costs seconds, nothing outlives a test, and a process group that survives teardown
(the cause of CI's SIGABRT at exit) is caught every time, not some of the time."""

import json
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from multiproc import LEAK_STATUS, MultiprocessError, run_function, run_script

from scale.dist.topology import communication_threads, dist_timeout

_KEEP = []  # a module global: what keeps a process group alive past destroy_process_group()


# ---- rank functions (run in the ranks by run_function) -----------------------------


def sum_ranks(rank, world, out):
    x = torch.tensor([float(rank + 1)])
    dist.all_reduce(x)
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)  # imports torch._dynamo after init
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{x.item()} {world}")


def fail_on_rank_1(rank, world):
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")
    dist.barrier()


def abort_on_rank_1(rank, world):
    if rank == 1:
        os.abort()
    dist.barrier()


def hang_on_rank_1(rank, world, token):
    if rank == 1:
        time.sleep(3600)
    dist.all_reduce(torch.zeros(1))


def hang_everywhere(rank, world, token):
    time.sleep(3600)


def keep_the_group(rank, world):
    _KEEP.append(dist.group.WORLD)


def late_teardown(rank, world, delay_s, barrier):
    """Rank 0 ends its run ``delay_s`` after the others (as rank 0 of a disaggregated run
    stopping its generator processes); ``barrier``: then a collective barrier (the control)."""
    dist.all_reduce(torch.zeros(1))  # the run's last collective
    if rank == 0:
        time.sleep(delay_s)
    if barrier:
        dist.barrier()


# ---- tests --------------------------------------------------------------------------


@pytest.mark.multiprocess
def test_ranks_run_in_one_group_and_tear_down_cleanly(tmp_path):
    out = tmp_path / "sum"
    run_function("test_multiproc:sum_ranks", nproc=2, out=str(out))
    assert [(tmp_path / f"sum.{r}").read_text() for r in range(2)] == ["3.0 2", "3.0 2"]


@pytest.mark.multiprocess
def test_a_failing_rank_is_named_with_its_traceback():
    with pytest.raises(MultiprocessError) as err:
        run_function("test_multiproc:fail_on_rank_1", nproc=2, dist_timeout_s=10)
    msg = str(err.value)
    assert "rank 1 stderr" in msg and "ValueError: rank 1 fails on purpose" in msg


@pytest.mark.multiprocess
def test_a_rank_killed_by_a_signal_is_reported_with_its_stack():
    with pytest.raises(MultiprocessError) as err:
        run_function("test_multiproc:abort_on_rank_1", nproc=2, dist_timeout_s=10)
    msg = str(err.value)
    assert "rank 1: SIGABRT" in msg  # from torchrun's summary (rank 0 may end either way)
    assert "Fatal Python error: Aborted" in msg and "abort_on_rank_1" in msg  # faulthandler, rank 1's stderr


def _alive(token: str) -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


@pytest.mark.multiprocess
def test_a_hung_peer_fails_within_the_process_group_timeout():
    token = uuid.uuid4().hex
    t0 = time.monotonic()
    with pytest.raises(MultiprocessError) as err:
        run_function("test_multiproc:hang_on_rank_1", nproc=2, dist_timeout_s=3, timeout_s=120, token=token)
    assert time.monotonic() - t0 < 60  # 3 s timeout + start-up, far below the 120 s limit
    assert "Timed out waiting 3000ms" in str(err.value)  # rank 0's collective gave up after 3 s
    assert not _alive(token)


@pytest.mark.multiprocess
def test_the_wall_clock_limit_kills_every_rank():
    token = uuid.uuid4().hex
    with pytest.raises(MultiprocessError, match="did not finish within 8 s; every rank was killed"):
        run_function("test_multiproc:hang_everywhere", nproc=2, timeout_s=8, token=token)
    assert not _alive(token)


@pytest.mark.multiprocess
def test_a_process_group_that_survives_teardown_fails_the_run():
    with pytest.raises(MultiprocessError) as err:
        run_function("test_multiproc:keep_the_group", nproc=2)
    msg = str(err.value)
    assert "outlived destroy_process_group()" in msg and "pt_gloo_runloop" in msg
    # the first rank to find the leak exits 3; torchrun may then stop the other with SIGTERM
    assert f": exit status {LEAK_STATUS}" in msg


@pytest.mark.multiprocess
def test_a_rank_that_ends_its_run_later_than_the_collective_timeout_still_tears_down_cleanly():
    """CI saw a finished 2-learner run fail with "Timed out waiting 4000ms" in the teardown's
    barrier: rank 0 was still stopping the generator processes. The teardown waits on the host
    (scale.dist.topology.shutdown); the control, a collective barrier at the same point, fails
    after the 2 s timeout, so the delay really exceeds it."""
    run_function("test_multiproc:late_teardown", nproc=2, dist_timeout_s=2, delay_s=6, barrier=False)
    with pytest.raises(MultiprocessError, match="Timed out|timed out|Timeout|timeout"):
        run_function("test_multiproc:late_teardown", nproc=2, dist_timeout_s=2, delay_s=6, barrier=True)


def test_the_teardown_wait_names_the_ranks_that_never_arrive_and_has_an_end():
    from scale.dist.topology import await_ranks

    store = dist.HashStore()
    t0 = time.monotonic()
    assert await_ranks(store, "k/0", 0, 3, "peers", wait_s=0.3) == [1, 2]
    assert 0.3 <= time.monotonic() - t0 < 5
    store.set("k/1/1", b"")
    store.set("k/1/2", b"")
    assert await_ranks(store, "k/1", 0, 3, "peers", wait_s=60) == []


@pytest.mark.multiprocess
def test_a_late_rank_joins_the_learners_group_and_collectives_stay_bounded(tmp_path):
    """``train.startup_timeout_s`` bounds the ranks' arrival, ``train.dist_timeout_s`` each
    collective: a rank 9 s late (3 timeouts) no longer fails the group's construction (CI saw
    "wait timeout after 4000ms, keys: /default_pg/0//cpu//0/0"), and a collective whose peer is
    silent still gives up after the 3 s timeout, not the 30-minute start-up bound."""
    out = tmp_path / "result.json"
    run_script(["tests/startup_worker.py", str(out)], nproc=2, dist_timeout_s=3, timeout_s=120)
    got = json.loads(out.read_text())
    assert got["built"] and got["collective"] == "gave up"
    assert 2.0 < got["waited_s"] < 8.0, got


def test_no_communication_threads_in_a_single_process():
    assert communication_threads() == []


def test_dist_timeout_reads_the_environment(monkeypatch):
    monkeypatch.delenv("DAPO_DIST_TIMEOUT_S", raising=False)
    assert dist_timeout(60) == timedelta(seconds=60)
    monkeypatch.setenv("DAPO_DIST_TIMEOUT_S", "2.5")
    assert dist_timeout(60) == timedelta(seconds=2.5)
    for bad in ("abc", "0", "-1"):
        monkeypatch.setenv("DAPO_DIST_TIMEOUT_S", bad)
        with pytest.raises(ValueError, match="DAPO_DIST_TIMEOUT_S"):
            dist_timeout(60)


def test_every_multiprocess_test_goes_through_the_helper():
    """A test that starts ranks by itself (mp.spawn, its own torchrun, its own process group)
    would miss the free port, the timeouts and the teardown check."""
    from pathlib import Path

    here = Path(__file__).parent
    banned = (
        "mp.spawn",
        "torch.multiprocessing",
        "torch.distributed.run",
        "init_process_group(",
        "MASTER_PORT",
    )
    # a rank entry that measures process-group creation itself (launched through run_script),
    # one that must create its group after a freeze (tests/test_startup.py, run_script too),
    # and the NCCL double, which makes the default group anew inside a rank the helper launched
    measures_init = {
        "lazy_init_worker.py": {"init_process_group("},
        "freeze_worker.py": {"init_process_group("},
        "nccl_double.py": {"init_process_group("},
    }
    offenders = []
    for path in sorted(here.glob("*.py")):
        if path.name in ("multiproc.py", Path(__file__).name):
            continue
        text = path.read_text()
        allowed = measures_init.get(path.name, set())
        offenders += [f"{path.name}: {b}" for b in banned if b in text and b not in allowed]
    assert not offenders, offenders


@pytest.mark.parametrize("lazy", ["1", "0"])
def test_lazy_gloo_init_makes_group_creation_no_barrier(tmp_path, monkeypatch, lazy):
    """The rehearsal's premise (``TORCH_GLOO_LAZY_INIT=1``, scale/rehearsal/run.py): with it, gloo
    behaves as NCCL and ``init_process_group`` returns before the other ranks have joined, so
    a missing barrier shows up on CPU; without it, creation waits for every rank."""
    monkeypatch.setenv("TORCH_GLOO_LAZY_INIT", lazy)
    out = tmp_path / "rank1.txt"
    run_script([str(Path(__file__).parent / "lazy_init_worker.py"), str(out)], nproc=2)
    assert out.read_text() == ("did not wait" if lazy == "1" else "waited")
