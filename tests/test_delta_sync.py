"""Delta weight sync (scale/dist/delta.py, rollout.delta_sync): what a generator rebuilds from
the changes equals what the learner sent, bit for bit, version after version, over gloo and
under NCCL's rules (tests/nccl_double.py); a generator that does not hold the version a delta
is against refuses it in one line."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from test_bridge import _member, _stores, _together

import scale.dist.bridge as bridge
from scale.dist import delta

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(delta._bits(a), delta._bits(b))


values = st.floats(allow_nan=True, allow_infinity=True, width=32)


@settings(max_examples=150, deadline=None)
@given(
    old=arrays("float32", st.integers(0, 64), elements=values),
    data=st.data(),
    dtype=st.sampled_from(DTYPES),
)
def test_the_changes_rebuild_the_new_tensor_bit_for_bit_and_leave_the_old_one(old, data, dtype):
    """Any old and new tensor of one shape and dtype (NaNs, infinities, -0.0 against 0.0
    included): the old one with its changed elements set equals the new one bit for bit, the
    old one is untouched, and exactly the elements whose bits differ are counted."""
    n = old.shape[0]
    mask = data.draw(arrays("bool", n))
    other = data.draw(arrays("float32", n, elements=values))
    a = torch.from_numpy(old).to(dtype)
    b = torch.where(torch.from_numpy(mask), torch.from_numpy(other).to(dtype), a)
    before = a.clone()
    index = delta.changed(a, b)
    assert index.dtype == torch.int32
    rebuilt = delta.apply(a, index, b.reshape(-1)[index.long()])
    assert same_bits(rebuilt, b) and same_bits(a, before)
    differ = sum(x != y for x, y in zip(delta._bits(a).tolist(), delta._bits(b).tolist()))
    assert index.numel() == differ


def test_minus_zero_and_a_nan_payload_are_changes():
    a = torch.tensor([0.0, float("nan"), 1.0])
    b = a.clone()
    b[0] = -0.0
    b.view(torch.int32)[1] += 1  # another NaN
    assert delta.changed(a, b).tolist() == [0, 1]


@given(numel=st.integers(1, 10**6), frac=st.floats(0, 1), itemsize=st.sampled_from([2, 4]))
def test_a_delta_is_sent_only_where_it_is_smaller(numel, frac, itemsize):
    count = int(frac * numel)
    sparse = delta.plan(numel, count, itemsize) == delta.SPARSE
    assert sparse == (count * (4 + itemsize) < numel * itemsize)


def test_a_shape_or_dtype_change_is_no_delta():
    with pytest.raises(ValueError, match="delta"):
        delta.changed(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="delta"):
        delta.changed(torch.zeros(3), torch.zeros(3, dtype=torch.bfloat16))


# ---- the bridge: versions sent as changes --------------------------------------------------


def versions() -> list[dict[str, torch.Tensor]]:
    """Four policy versions of three tensors: the first whole; then a few elements changed (a
    delta), none (an empty delta), every element of one tensor (sent whole again)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 32, generator=g).to(torch.bfloat16)
    b = torch.randn(48, generator=g)
    e = torch.zeros(0)
    v0 = {"w": w, "b": b, "empty": e}
    w1 = w.clone()
    w1[3, :5] += 1.0
    w1[7, 0] = -0.0 if w1[7, 0] == 0 else -w1[7, 0]
    v1 = {"w": w1, "b": b.clone(), "empty": e}
    v2 = {k: t.clone() for k, t in v1.items()}
    v3 = {"w": w1.clone(), "b": b + 1.0, "empty": e}
    return [v0, v1, v2, v3]


HEADER = [("w", [64, 32], "bfloat16"), ("b", [48], "float32"), ("empty", [0], "float32")]


@pytest.fixture
def nccl(monkeypatch):
    from nccl_double import nccl_group

    monkeypatch.setattr(bridge, "_nccl", nccl_group)


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_two_generators_rebuild_every_version_and_the_bytes_are_the_changes(nccl, backend):
    kv = _stores(3)
    sent_versions = versions()

    def member(r: int):
        g = bridge.group(kv[r], "w", r, 3, 20, backend=backend)
        g.held = delta.Base()
        if r == 0:
            return [bridge.send_weights(g, v, iter(t.items()), HEADER) for v, t in enumerate(sent_versions)]
        return [bridge.recv_weights(g, v) for v in range(len(sent_versions))]

    sent, *got = _together(*[_member(r, lambda r=r: member(r)) for r in range(3)])
    for received in got:
        for v, named in enumerate(received):
            assert [n for n, _ in named] == ["w", "b", "empty"]
            assert all(same_bits(t, sent_versions[v][n]) for n, t in named), v
            assert bridge.digest(named) == bridge.digest(list(sent_versions[v].items()))
    full = 64 * 32 * 2 + 48 * 4
    assert all(s["bytes"] == full and s["elements"] == 64 * 32 + 48 for s in sent)
    assert [s["changed"] for s in sent] == [64 * 32 + 48, 6, 0, 48]
    plans = 16 * 3
    assert sent[0]["sent_bytes"] == full + plans  # the first version: whole
    assert (
        sent[1]["sent_bytes"] == 6 * (4 + 2) + plans
    )  # w's six changes (index and value); b unchanged: none
    assert sent[2]["sent_bytes"] == plans
    assert sent[3]["sent_bytes"] == 48 * 4 + plans  # b changed whole: sent whole
    assert sent[1]["sent_bytes"] < full / 10


def test_a_generator_that_missed_a_version_refuses_its_changes_in_one_line():
    """The learner's version 1 is changes to version 0; a generator that holds none (a new
    process) must not apply them to anything: one line, before any broadcast."""
    kv = _stores(2)

    def learner():
        g = bridge.group(kv[0], "w", 0, 2, 10)
        g.held = delta.Base(version=0, tensors={"b": torch.zeros(48)})
        return bridge.send_weights(g, 1, None, HEADER)

    def generator(held):
        g = bridge.group(kv[1], "w", 1, 2, 10)
        g.held = held
        with pytest.raises(RuntimeError) as err:
            bridge.recv_weights(g, 1)
        return str(err.value)

    _, said = _together(learner, lambda: generator(delta.Base()))
    assert "\n" not in said and "changes to version 0" in said and "holds none" in said
    kv = _stores(2)
    _, said = _together(learner, lambda: generator(None))
    assert "started without rollout.delta_sync" in said


def test_the_bytes_a_delta_saves_at_a_small_learning_rate():
    """What the sync is for: an fp32 master moved by Adam at lr 1e-6, cast to bf16, changes few
    bf16 values (a bf16 step is 2^-8 of the value). Measured on a 256 x 256 weight of scale
    0.02 after one Adam step: the share of changed elements and the bytes a delta sends."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(256, 256) * 0.02)
    opt = torch.optim.AdamW([w], lr=1e-6, weight_decay=0.0)
    before = w.detach().to(torch.bfloat16)
    w.grad = torch.randn_like(w)
    opt.step()
    after = w.detach().to(torch.bfloat16)
    share = delta.changed(before, after).numel() / w.numel()
    # |update| ~ lr = 1e-6 against a half-ulp of ~2^-9 x |w|: changed where |w| < ~5e-4 (~2%)
    assert 0 < share < 0.05, share
    assert delta.plan(w.numel(), int(share * w.numel()), 2) == delta.SPARSE
