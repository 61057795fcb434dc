"""The learner/generator bridge (scale/dist/bridge.py) under NCCL's rules (tests/nccl_double.py), and
its waits across the boundary: on the host, however long, never inside a collective."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from nccl_double import NCCL_HOST_TENSOR, FakeCuda, OnDevice, nccl_group

import scale.dist.bridge as bridge


def _together(*members: Callable[[], Any], limit_s: float = 60.0) -> list[Any]:
    """Run each member in its own thread; their results, or the first error raised."""
    out: list[Any] = [None] * len(members)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = members[i]()
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(members))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(limit_s)
    assert not any(t.is_alive() for t in threads), "a member hung"
    if errors:
        raise errors[0]
    return out


def _stores(n: int, timeout_s: float = 20.0) -> list[Any]:
    master = bridge.store("127.0.0.1", 0, is_master=True, members=n, timeout_s=timeout_s)
    return [master] + [
        bridge.store("127.0.0.1", master.port, is_master=False, members=n, timeout_s=timeout_s)
        for _ in range(n - 1)
    ]


@pytest.fixture
def nccl(monkeypatch):
    """The bridge's NCCL groups are the double (member i on pretend GPU i)."""
    monkeypatch.setattr(bridge, "_nccl", nccl_group)


def _member(i: int, body: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        with FakeCuda(i):
            return body()

    return run


# ---- the double itself --------------------------------------------------------------------------


def test_the_double_refuses_a_host_tensor_and_delivers_device_tensors(nccl):
    kv = _stores(2)

    def member(r: int) -> Any:
        g = bridge.group(kv[r], "w", r, 2, 10, backend="nccl")
        assert g.device == torch.device("cuda", r)
        t = (
            torch.arange(4, device=g.device) * (r + 1)
            if r == 0
            else torch.zeros(4, dtype=torch.long, device=g.device)
        )
        assert isinstance(t, OnDevice)
        g.broadcast_tensor(t, 0, "a device tensor")
        with pytest.raises(dist.DistBackendError, match=NCCL_HOST_TENSOR):
            g.pg.broadcast([torch.zeros(4, dtype=torch.long)], bridge._bopts(0))
        with pytest.raises(TypeError, match="numpy"):
            t.numpy()
        return t.cpu()

    a, b = _together(_member(0, lambda: member(0)), _member(1, lambda: member(1)))
    assert torch.equal(a, torch.arange(4)) and torch.equal(b, torch.arange(4))
    assert type(a) is torch.Tensor


def test_the_double_refuses_two_members_on_one_device(nccl):
    kv = _stores(2)
    with pytest.raises(dist.DistBackendError, match="Duplicate GPU"):
        _together(
            *[_member(0, lambda r=r: bridge.group(kv[r], "w", r, 2, 10, backend="nccl")) for r in range(2)]
        )


def test_the_double_sees_the_bridge_s_old_host_headers(nccl):
    """What the bridge did before (sizes and payloads built on the host whatever the group):
    NCCL's refusal, on a CPU."""
    kv = _stores(2)

    def member(r: int) -> None:
        g = bridge.group(kv[r], "w", r, 2, 10, backend="nccl")
        size = torch.tensor([3], dtype=torch.long)  # what send_bytes built before
        g.pg.broadcast([size], bridge._bopts(0)).wait()

    with pytest.raises(dist.DistBackendError, match=NCCL_HOST_TENSOR):
        _together(_member(0, lambda: member(0)), _member(1, lambda: member(1)), limit_s=30)


def test_the_double_refuses_a_count_or_dtype_mismatch_as_nccl_would_hang(nccl):
    """NCCL defines one count and one dtype per operation on every member: a bf16[4] broadcast
    into an fp32[4] 'succeeds' with garbage on GPUs, into a bf16[2] it hangs. The double raises,
    naming both sides; agreeing members pass."""
    from nccl_double import Mismatch

    def member(r: int, theirs: tuple[torch.dtype, int], kv: list[Any]) -> str:
        g = bridge.group(kv[r], "w", r, 2, 10, backend="nccl")
        dtype, n = (torch.bfloat16, 4) if r == 0 else theirs
        try:
            g.broadcast_tensor(torch.zeros(n, dtype=dtype, device=g.device), 0, "weights")
        except RuntimeError as err:  # the bridge reports it as a failed collective, the double's words in it
            assert isinstance(err.__cause__ or err, Mismatch)
            return str(err)
        return "ok"

    def both(theirs: tuple[torch.dtype, int]) -> list[str]:
        kv = _stores(2)
        return _together(*[_member(r, lambda r=r: member(r, theirs, kv)) for r in range(2)])

    for theirs in [(torch.float32, 4), (torch.bfloat16, 2)]:
        said = both(theirs)
        assert all("torch.bfloat16[4]" in x and f"{theirs[0]}[{theirs[1]}]" in x for x in said), said
    assert both((torch.bfloat16, 4)) == ["ok", "ok"]

    kv = _stores(2)

    def pair(r: int) -> str:
        g = bridge.group(kv[r], "p", r, 2, 10, backend="nccl")
        try:
            if r == 0:
                g.pg.send([torch.zeros(3, device=g.device)], 1, 0).wait()
            else:
                g.pg.recv([torch.zeros(3, dtype=torch.float16, device=g.device)], 0, 0).wait()
        except RuntimeError as err:  # the receiver refuses; the sender's send then fails (NCCL: hangs)
            return str(err)
        return "sent"

    _, got = _together(_member(0, lambda: pair(0)), _member(1, lambda: pair(1)))
    assert "receives into ['torch.float16[3]'] what rank 0 sends as ['torch.float32[3]']" in got


# ---- the bridge under NCCL's rules ------------------------------------------------------------


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_every_bridge_operation_keeps_the_group_s_device_rules(nccl, backend):
    kv = _stores(3)
    header = [("a", [2, 3], "float32"), ("b", [5], "bfloat16"), ("empty", [0], "float32")]
    full = {
        "a": torch.arange(6, dtype=torch.float32).view(2, 3),
        "b": torch.linspace(-1, 1, 5).to(torch.bfloat16),
        "empty": torch.zeros(0),
    }

    def member(r: int) -> dict[str, Any]:
        g = bridge.group(kv[r], "w", r, 3, 10, backend=backend)
        got: dict[str, Any] = {}
        if r == 0:
            g.send_bytes(b"to one", 1, "p2p")
            g.send_bytes(b"", 2, "p2p empty")
        elif r == 1:
            got["p2p"] = g.recv_bytes(0, "p2p")
        else:
            got["p2p"] = g.recv_bytes(0, "p2p empty")
        got["bcast"] = g.broadcast({"x": [1, 2]} if r == 0 else None, 0, "bcast")
        got["gather"] = g.all_gather_bytes(b"m" * (r + 1), "gather")
        if r == 0:
            bridge.send_weights(g, 0, iter(full.items()), header)
        else:
            got["weights"] = bridge.recv_weights(g, 0)
        return got

    out = _together(*[_member(r, lambda r=r: member(r)) for r in range(3)])
    assert out[1]["p2p"] == b"to one" and out[2]["p2p"] == b""
    assert all(o["bcast"] == {"x": [1, 2]} for o in out)
    assert all(o["gather"] == [b"m", b"mm", b"mmm"] for o in out)
    for r in (1, 2):
        names = [n for n, _ in out[r]["weights"]]
        assert names == ["a", "b", "empty"]
        for name, t in out[r]["weights"]:
            assert type(t) is torch.Tensor and t.device.type == "cpu"  # held in host memory
            assert t.dtype == full[name].dtype and torch.equal(t, full[name])


# ---- waits across the boundary --------------------------------------------------------------


def test_a_wait_longer_than_the_collective_timeout_ends_when_the_other_side_is_ready(nccl):
    """The group's timeout is 1 s; the learner reaches version 1 only after 3 s of training and
    the generator's batch is ready only after a 3 s round: both waits end, on the host."""
    kv = _stores(2)
    header = [("w", [4], "float32")]

    def learner() -> Any:
        w = bridge.group(kv[0], "w", 0, 2, 1.0, backend="nccl")
        b = bridge.group(kv[0], "b", 0, 2, 1.0)
        bridge.send_weights(w, 0, iter([("w", torch.zeros(4))]), header)
        time.sleep(3.0)  # a training step longer than the timeout
        bridge.send_weights(w, 1, iter([("w", torch.ones(4))]), header)
        b.wait("batch/1/0", "generator 0's batch 1")
        return b.recv(1, "batch 1")

    def generator() -> Any:
        w = bridge.group(kv[1], "w", 1, 2, 1.0, backend="nccl")
        b = bridge.group(kv[1], "b", 1, 2, 1.0)
        v0 = bridge.recv_weights(w, 0)
        v1 = bridge.recv_weights(w, 1)
        time.sleep(3.0)  # a generation round longer than the timeout
        b.post("batch/1/0")
        b.send({"batch": 1}, 0, "the learner to take batch 1")
        return v0, v1

    got, (v0, v1) = _together(_member(0, learner), _member(1, generator))
    assert got == {"batch": 1}
    assert torch.equal(v0[0][1], torch.zeros(4)) and torch.equal(v1[0][1], torch.ones(4))


def test_a_generation_round_longer_than_the_collective_timeout_ends_in_the_all_gather():
    """The generators' all-gather ends each round; the group's timeout is 1 s and one generator's
    round takes 3 s: the others wait on the host, then gather (before: gloo gave up after 1 s)."""
    kv = _stores(3)

    def generator(r: int) -> list[Any]:
        comm = bridge.PickledComm(bridge.group(kv[r], "generators", r, 3, 1.0))
        out = []
        for n in range(2):
            if r == 2 and n == 1:
                time.sleep(3.0)  # a round longer than the timeout
            out.append(comm.all_gather({"rank": r, "round": n}, f"round {n}"))
        return out

    got = _together(*[lambda r=r: generator(r) for r in range(3)])
    want = [[{"rank": r, "round": n} for r in range(3)] for n in range(2)]
    assert got == [want] * 3


def _dies_after(polls: int) -> Callable[[], None]:
    """An ``alive`` check whose other side has died: it raises from the ``polls + 1``-th call."""
    calls = []

    def alive() -> None:
        calls.append(1)
        if len(calls) > polls:
            raise RuntimeError("generator 0 exited with status 1")

    return alive


def test_a_member_that_arrives_after_the_timeout_still_builds_the_group_then_collectives_are_bounded():
    """A generator still importing when the learner builds the group (seconds, on a loaded
    node) is waited for on the host; the group's 1 s timeout then bounds its collectives.
    Before, construction itself gave up after 1 s ("wait timeout ... keys: /dapo-bridge/...")."""
    kv = _stores(2)

    def learner() -> Any:
        b = bridge.group(kv[0], "b", 0, 2, 1.0)
        data = b.recv_bytes(1, "the late member's message")
        t0 = time.monotonic()
        with pytest.raises(RuntimeError):  # the other member sends nothing more
            b.recv_bytes(1, "a message never sent")
        return data, time.monotonic() - t0

    def late() -> Any:
        time.sleep(3.0)  # three timeouts' worth of start-up
        b = bridge.group(kv[1], "b", 1, 2, 1.0)
        b.send_bytes(b"here", 0, "the learner")
        time.sleep(4.0)  # alive and silent while the learner's next receive gives up

    (data, gave_up_after), _ = _together(learner, late)
    assert data == b"here"
    assert gave_up_after < 3.5


def test_a_member_that_dies_before_arriving_ends_the_wait_with_its_error():
    kv = _stores(2)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="generator 0 exited"):
        bridge.group(kv[0], "b", 0, 2, 60.0, alive=_dies_after(3))
    assert time.monotonic() - t0 < 10.0


def test_a_host_wait_ends_at_once_when_the_other_side_has_died():
    kv = _stores(1)
    g = bridge.group(kv[0], "b", 0, 1, 5.0)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="generator 0 exited"):
        g.wait("never", "a key nobody sets", _dies_after(3))
    assert time.monotonic() - t0 < 5.0


# ---- the learners' default group under NCCL's rules ----------------------------------------------


def comm_ranks_under_nccl(rank, world):
    """``scale.dist.topology.Comm`` (all-gather of objects, the point-to-point exchange) and
    ``all_max`` over the default group as NCCL: each passes on the rank's device, and the same
    exchange staged on the host is refused with NCCL's words."""
    from nccl_double import instead_of_gloo

    from scale.dist.topology import Comm, Ranks, all_max

    with instead_of_gloo(rank, world) as device:
        comm = Comm(Ranks(rank, world, 1), device)
        assert comm.all_gather({"rank": rank}, "test") == [{"rank": r} for r in range(world)]
        other = 1 - rank
        assert comm.exchange({other: bytes([rank]) * 5}, {other: 5}, "x") == {other: bytes([other]) * 5}
        assert all_max(float(rank), device) == float(world - 1)
        with pytest.raises(dist.DistBackendError, match=NCCL_HOST_TENSOR):
            Comm(Ranks(rank, world, 1), "cpu").exchange({other: b"abc"}, {other: 3}, "x")


@pytest.mark.multiprocess
def test_the_learners_collectives_keep_nccl_s_rules():
    from multiproc import run_function

    run_function("test_bridge:comm_ranks_under_nccl", nproc=2, timeout_s=120)
