"""A generator process's policy versions (scale/placement/receive.py): received at points every
generator process passes in the same order, never beside generation (issue 71: a receive
thread per tensor-parallel process queued its weight broadcast among the engine's all-reduces
wherever its clock put it; NCCL's kernels block their stream, so two ranks that queued it at
different places wait for each other). The stream model is tests/nccl_double.py's StreamOrder."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from nccl_double import StreamOrder

import scale.dist.bridge as bridge
from dapo.pipeline import behaviour_version, versions_needed
from scale.placement.receive import Receiver

# ---- the stream model -----------------------------------------------------------------------


def _queue(order: StreamOrder, device: str, ops: list[str]) -> None:
    for comm in ops:
        order.record(device, comm)


def test_the_model_hangs_on_the_old_order_and_runs_the_agreed_one():
    """Two tensor-parallel ranks of one engine (all-reduces on ``tp``) and the learner (the
    weights broadcast on ``weights``). The old receive thread put the broadcast after all-reduce
    2 on rank 0 and after all-reduce 3 on rank 1: each waits for the other. Queued at the same
    place on both, it runs."""
    old = StreamOrder()
    _queue(old, "gen0/tp0", ["tp", "tp", "weights", "tp", "tp"])
    _queue(old, "gen0/tp1", ["tp", "tp", "tp", "weights", "tp"])
    _queue(old, "learner", ["weights"])
    stuck = old.hang()
    assert stuck == {"gen0/tp0": ("weights", 0), "gen0/tp1": ("tp", 2), "learner": ("weights", 0)}
    agreed = StreamOrder()
    _queue(agreed, "gen0/tp0", ["tp", "tp", "weights", "tp", "tp"])
    _queue(agreed, "gen0/tp1", ["tp", "tp", "weights", "tp", "tp"])
    _queue(agreed, "learner", ["weights"])
    assert agreed.hang() is None


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 6), st.integers(0, 6), st.integers(1, 3))
def test_a_broadcast_among_all_reduces_hangs_exactly_when_the_ranks_place_it_differently(p0, p1, tp):
    """The model's property: with ``tp`` all-reduce rounds of 6 each side of nothing else, the
    broadcast placed after all-reduce ``p0`` on rank 0 and ``p1`` on rank 1 hangs iff p0 != p1."""
    order = StreamOrder()
    for rank, p in enumerate((p0, p1)):
        ops = ["tp"] * 6
        ops.insert(p, "weights")
        _queue(order, f"tp{rank}", ops * tp)
    _queue(order, "learner", ["weights"] * tp)
    assert (order.hang() is not None) == (p0 != p1)


# ---- the receiver, with threads for processes ----------------------------------------------------

GENERATORS, TP, ROUNDS, REDUCES = 2, 2, 2, 3
FIRST, LAST, K = 1, 4, 1
HEADER = [("w", [4], "float32"), ("b", [2], "bfloat16")]


def _tensors(v: int) -> list[tuple[str, torch.Tensor]]:
    return [("w", torch.full((4,), float(v))), ("b", torch.full((2,), float(v), dtype=torch.bfloat16))]


def _run(seed: int) -> tuple[StreamOrder, dict[int, list[int]], list[BaseException]]:
    """A learner and GENERATORS x TP generator processes (threads) over real gloo groups: the
    learner publishes version v after "training" step v (once batch v arrived); each generator
    process takes the version each batch needs, runs ROUNDS rounds of REDUCES all-reduces on
    its engine's communicator, and all-gathers with the other generators after each round
    (dynamic sampling). Every device's queue goes to a StreamOrder; each process's batches'
    versions are returned."""
    rng = random.Random(seed)
    procs = GENERATORS * TP
    master = bridge.store("127.0.0.1", 0, is_master=True, members=procs + 1, timeout_s=30)
    kvs = [master] + [
        bridge.store("127.0.0.1", master.port, is_master=False, members=procs + 1, timeout_s=30)
        for _ in range(procs)
    ]
    due = versions_needed(FIRST, LAST, K)
    order = StreamOrder()
    seen: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    delays = [[rng.uniform(0, 0.01) for _ in range(64)] for _ in range(procs + 1)]

    def learner() -> None:
        w = bridge.group(kvs[0], "weights", 0, procs + 1, 20)
        for v in due:
            if v >= 1:  # trained step v on batch v: wait for it
                w.wait(f"batch/{v}", f"batch {v}")
            time.sleep(delays[0][v])
            order.record("learner", "weights")
            bridge.send_weights(w, v, iter(_tensors(v)), HEADER)

    def generator(g: int) -> None:
        i, j = divmod(g, TP)
        w = bridge.group(kvs[g + 1], "weights", g + 1, procs + 1, 20)
        peers = bridge.group(kvs[g + 1], "generators", g, procs, 20)
        device = f"gen{i}/tp{j}"

        def recv(group: bridge.Group, v: int) -> list[tuple[str, torch.Tensor]]:
            order.record(device, "weights")
            return bridge.recv_weights(group, v)

        versions = Receiver(w, due, leader=g == 0, recv=recv)
        mine = seen.setdefault(g, [])
        n = 0
        for b in range(FIRST, LAST + 1):
            v = behaviour_version(b, K)
            got = versions.take(v)
            assert torch.equal(got[0][1], torch.full((4,), float(v))), (g, b, v)
            mine.append(v)
            for _ in range(ROUNDS):
                versions.point()
                for _ in range(REDUCES):
                    time.sleep(delays[g + 1][n % 64])
                    n += 1
                    order.record(device, f"tp{i}")
                bridge.PickledComm(peers).all_gather(g, "dynamic sampling")
            if g == 0:
                w.post(f"batch/{b}")

    def guarded(fn: Any, *a: Any) -> None:
        try:
            fn(*a)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(learner,), daemon=True)]
    threads += [threading.Thread(target=guarded, args=(generator, g), daemon=True) for g in range(procs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a member hung"
    return order, seen, errors


@pytest.mark.parametrize("seed", range(3))
def test_versions_received_at_agreed_points_never_hang_a_stream(seed):
    """Every generator process receives each version at the same point (same all-reduce count on
    both ranks of an engine): the stream model runs every queue to its end, every batch got the
    version it needs, and the run ends (no host wait across the generators' all-gather)."""
    order, seen, errors = _run(seed)
    assert not errors, errors
    assert order.hang() is None
    want = [behaviour_version(b, K) for b in range(FIRST, LAST + 1)]
    assert all(v == want for v in seen.values()) and len(seen) == GENERATORS * TP
    # each engine's ranks queued the broadcast at the same place among their all-reduces
    for i in range(GENERATORS):
        assert order.queues[f"gen{i}/tp0"] == order.queues[f"gen{i}/tp1"]


def test_the_receivers_refusals():
    kv = bridge.store("127.0.0.1", 0, is_master=True, members=1, timeout_s=5)
    w = bridge.Group(None, 1, 2, torch.device("cpu"), kv)
    got: list[int] = []
    r = Receiver(w, range(2, 5), leader=True, recv=lambda g, v: got.append(v) or [("w", torch.zeros(1))])
    with pytest.raises(RuntimeError, match="policy version 7 is not one this generator's batches need"):
        r.take(7)
    w.post("version/2")
    w.post("version/3")
    r.point()  # 2 and 3 are posted: taken now, not when a batch asks
    assert got == [2, 3] and kv.get("point/0") == b"3"
    threading.Timer(0.2, lambda: w.post("version/4")).start()
    r.take(4)  # a version still due is waited for on the host
    assert got == [2, 3, 4] and sorted(r.held) == [4]
    with pytest.raises(RuntimeError, match="policy version 3 was asked for after version 4"):
        r.take(3)
