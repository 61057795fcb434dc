"""The collective-device check (scale/dist/collective_devices.py) and the device-side clip norm."""

import json
import math
from pathlib import Path

import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from multiproc import run_function

from scale.dist.collective_devices import CollectiveDeviceCheck, CollectiveDeviceError, checked
from scale.learner.sharding import clip_sharded


def device_checks(rank, world, out):
    """In a gloo group (run_function): a declared compute device CUDA (what NCCL serves) and
    a host tensor reaching an all-reduce or a broadcast: the check names the operator and the
    device, and the collective never runs; on the right device collectives pass and are
    counted."""
    found = {}
    x = torch.ones(3)
    for name, op in (("allreduce", lambda: dist.all_reduce(x)), ("broadcast", lambda: dist.broadcast(x, 0))):
        try:
            with CollectiveDeviceCheck(torch.device("cuda")):
                op()
            found[name] = None
        except CollectiveDeviceError as err:
            found[name] = str(err)
    found["untouched"] = x.tolist()
    check = CollectiveDeviceCheck("cpu")
    with check:
        y = torch.ones(3)
        dist.all_reduce(y)
        got = [None] * world
        dist.all_gather_object(got, {"a": 1})
        dist.barrier()
        z = y * 2  # not a collective: not counted
    found["sum"] = z.tolist()
    found["seen"] = check.seen
    Path(f"{out}.rank{rank}.json").write_text(json.dumps(found))


def test_a_collective_on_another_device_is_refused_before_it_runs_and_others_pass(tmp_path):
    out = tmp_path / "checks"
    run_function("test_collective_devices:device_checks", nproc=2, out=str(out))
    found = json.loads(Path(f"{out}.rank0.json").read_text())
    assert (
        "collective c10d.allreduce_ on tensors on cpu, not on the compute device cuda" in found["allreduce"]
    )
    assert "NCCL serves only CUDA tensors" in found["allreduce"]
    assert "c10d.broadcast_" in found["broadcast"]
    assert found["untouched"] == [1.0, 1.0, 1.0]  # refused before it ran (no sum over 2 ranks)
    assert found["sum"] == [4.0, 4.0, 4.0]
    seen = found["seen"]
    assert seen["c10d.allreduce_"] == 1 and seen["c10d.barrier"] == 1 and seen["c10d.allgather_"] >= 1


def test_the_check_is_off_unless_asked(monkeypatch):
    monkeypatch.delenv("DAPO_CHECK_COLLECTIVES", raising=False)
    assert not isinstance(checked("cuda"), CollectiveDeviceCheck)
    monkeypatch.setenv("DAPO_CHECK_COLLECTIVES", "0")
    assert not isinstance(checked("cuda"), CollectiveDeviceCheck)
    monkeypatch.setenv("DAPO_CHECK_COLLECTIVES", "1")
    assert isinstance(checked("cuda"), CollectiveDeviceCheck)


@settings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    scale=st.floats(1e-3, 1e3),
    max_norm=st.floats(1e-2, 1e2),
    seed=st.integers(0, 2**16),
)
def test_clip_sharded_is_torchs_clip_grad_norm(shapes, scale, max_norm, seed):
    """On plain tensors the device-side clip gives torch's norm and torch's clipped gradients."""
    g = torch.Generator().manual_seed(seed)
    a = [torch.nn.Parameter(torch.zeros(n)) for n in shapes]
    b = [torch.nn.Parameter(torch.zeros(n)) for n in shapes]
    for p, q in zip(a, b):
        p.grad = torch.randn(p.shape, generator=g) * scale
        q.grad = p.grad.clone()
    want = torch.nn.utils.clip_grad_norm_(a, max_norm)
    got = clip_sharded(b, max_norm, torch.device("cpu"))
    assert math.isclose(float(got), float(want), rel_tol=1e-6)
    for p, q in zip(a, b):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7)


def test_clip_sharded_leaves_non_finite_gradients_to_the_skip():
    """A non-finite norm is returned as is (dapo.update skips that optimizer step) and the
    gradients are not scaled by NaN."""
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([1.0, math.inf])
    assert not math.isfinite(float(clip_sharded([p], 1.0, torch.device("cpu"))))
    assert p.grad[0] == 1.0
    assert float(clip_sharded([torch.nn.Parameter(torch.zeros(1))], 1.0, torch.device("cpu"))) == 0.0
