"""scale/dist/heartbeat.py: a dead or stopped rank is named by every other rank within the heartbeat
timeout, a finished one never is, and a lost store ends the rank too. The SIGKILL and SIGSTOP
cases with real launches are in the rehearsal (scale/rehearsal/run.py)."""

import threading
import time

import pytest
import torch.distributed as dist

from scale.dist.heartbeat import DONE, Heartbeat


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class FlakyStore:
    """A dict store whose ``add`` can be made to fail (the store's host died)."""

    def __init__(self):
        self.values = {}
        self.down = False

    def add(self, key, n):
        if self.down:
            raise RuntimeError("Connection reset by peer")
        self.values[key] = self.values.get(key, 0) + n
        return self.values[key]


def beats(store, clock, world=3, **kw):
    return [Heartbeat(store, r, world, interval_s=1, timeout_s=5, clock=clock, **kw) for r in range(world)]


def test_a_silent_rank_is_named_after_the_timeout_and_not_before():
    store, clock = FlakyStore(), Clock()
    hb = beats(store, clock)
    for _ in range(10):  # everyone beats
        clock.t += 1
        assert all(h.beat_and_check() is None for h in hb)
    stopped = clock.t  # rank 2's last beat
    for _ in range(4):  # 4 s of silence is not yet a failure
        clock.t += 1
        assert hb[0].beat_and_check() is None and hb[1].beat_and_check() is None
    # named within one interval after the timeout (the watchers saw its last beat one read late)
    msgs = []
    while not msgs:
        clock.t += 1
        msgs = [m for m in (h.beat_and_check() for h in hb[:2]) if m]
    assert clock.t - stopped <= 5 + 1
    for h in hb[:2]:
        msg = h.beat_and_check()
        assert f"rank {h.rank}: rank 2 stopped answering (no heartbeat for 5 s" in msg


def test_several_silent_ranks_are_all_named():
    store, clock = FlakyStore(), Clock()
    hb = beats(store, clock, world=4)
    clock.t += 1
    assert all(h.beat_and_check() is None for h in hb)
    for _ in range(6):
        clock.t += 1
        msg = hb[0].beat_and_check()
    assert "ranks 1, 2, 3 stopped answering" in msg


def test_ranks_that_went_quiet_together_are_named_together():
    """A killed rank and the node-mate its launcher ends a moment later: the watcher saw the
    mate's last beat one read earlier, so it crosses the timeout first; both are named
    (the rehearsal's SIGKILL check once failed on naming only the mate)."""
    store, clock = FlakyStore(), Clock()
    hb = beats(store, clock, world=4)
    clock.t += 1
    assert all(h.beat_and_check() is None for h in hb)
    clock.t += 0.5  # ranks 0, 1 and 3 beat; rank 2 has just been ended by its launcher
    for r in (0, 1, 3):
        hb[r].beat_and_check()
    clock.t += 0.5  # rank 3 is killed after its beat; rank 0 reads both as silent from here on
    msg = None
    while msg is None:
        clock.t += 1
        hb[1].beat_and_check()
        msg = hb[0].beat_and_check()
    assert "ranks 2, 3 stopped answering" in msg, msg
    # a rank silent for less than timeout - interval is not named with them
    assert "rank 1" not in msg.split(":", 1)[1]


def test_a_rank_that_finished_is_never_reported():
    store, clock = FlakyStore(), Clock()
    hb = beats(store, clock, world=2)
    clock.t += 1
    assert hb[0].beat_and_check() is None and hb[1].beat_and_check() is None
    hb[1].stop()
    assert store.values["dapo/heartbeat/1"] > DONE
    for _ in range(20):
        clock.t += 1
        assert hb[0].beat_and_check() is None


def test_a_rank_that_never_started_is_reported():
    store, clock = FlakyStore(), Clock()
    h = Heartbeat(store, 0, 2, interval_s=1, timeout_s=5, clock=clock)
    for _ in range(4):
        clock.t += 1
        assert h.beat_and_check() is None
    clock.t += 1
    assert "rank 1 stopped answering" in h.beat_and_check()


def test_a_lost_store_ends_the_rank_after_the_timeout():
    store, clock = FlakyStore(), Clock()
    h = Heartbeat(store, 0, 2, interval_s=1, timeout_s=5, clock=clock)
    clock.t += 1
    store.add("dapo/heartbeat/1", 1)
    assert h.beat_and_check() is None
    store.down = True
    for _ in range(4):
        clock.t += 1
        assert h.beat_and_check() is None
    clock.t += 1
    msg = h.beat_and_check()
    assert "rendezvous store has not answered for 5 s (Connection reset by peer)" in msg


def test_bad_intervals_are_refused():
    with pytest.raises(ValueError, match="interval_s"):
        Heartbeat(FlakyStore(), 0, 2, interval_s=10, timeout_s=5)


def test_threads_over_a_real_store_catch_a_rank_that_stops():
    """Two heartbeat threads over torch's own store; one stops beating without finishing (as a
    SIGSTOPped process): the other's failure handler runs with its rank, within the timeout."""
    store = dist.HashStore()
    failed = []
    done = threading.Event()

    def on_failure(msg):
        failed.append((time.monotonic(), msg))
        done.set()

    a = Heartbeat(store, 0, 2, interval_s=0.05, timeout_s=0.5, on_failure=on_failure).start()
    b = Heartbeat(store, 1, 2, interval_s=0.05, timeout_s=0.5, on_failure=on_failure).start()
    time.sleep(0.4)
    assert not failed
    t0 = time.monotonic()
    b._stop.set()  # rank 1 goes silent, not done
    assert done.wait(5)
    assert "rank 0: rank 1 stopped answering" in failed[0][1]
    assert failed[0][0] - t0 < 2.0
    a.stop()
    b.stop()


def test_await_verdict_returns_when_every_peer_beats_and_exits_when_one_is_silent(monkeypatch):
    """After a collective error: with every peer beating, the caller's own error is reported
    (await_verdict returns after one timeout); with a silent peer the heartbeat's line ends
    the rank first."""
    from scale.dist import heartbeat

    store = dist.HashStore()
    b = Heartbeat(store, 1, 2, interval_s=0.05, timeout_s=0.4).start()
    a = Heartbeat(store, 0, 2, interval_s=0.05, timeout_s=0.4).start()  # this process's own
    t0 = time.monotonic()
    heartbeat.await_verdict()
    assert 0.4 <= time.monotonic() - t0 < 3 and a.failed is None
    fired = []
    a.on_failure = fired.append  # instead of os._exit
    b._stop.set()
    heartbeat.await_verdict()
    assert fired and "rank 1 stopped answering" in fired[0]
    a.stop()
    b.stop()
    assert not heartbeat._ACTIVE
