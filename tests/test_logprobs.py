import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dapo.logprobs import chunked_logprobs, naive_logprobs


@given(
    st.integers(0, 1000),
    st.integers(1, 40),
    st.integers(2, 50),
    st.integers(1, 16),
    st.integers(1, 64),
    st.sampled_from([1.0, 0.7, 1.3]),
)
def test_values_and_gradients_equal_the_naive_path(seed, n, v, hdim, chunk, temp):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hdim, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(v, hdim, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, v, (n,), generator=g)
    gl, ge = torch.randn(n, generator=g), torch.randn(n, generator=g)
    lp, ent = chunked_logprobs(h, w, y, chunk=chunk, temperature=temp)
    (lp * gl + ent * ge).sum().backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad, w.grad = None, None
    lp2, ent2 = naive_logprobs(h, w, y, temperature=temp)
    (lp2 * gl + ent2 * ge).sum().backward()
    assert torch.allclose(lp, lp2.float(), atol=1e-5) and torch.allclose(ent, ent2.float(), atol=1e-5)
    assert torch.allclose(gh, h.grad, atol=1e-4) and torch.allclose(gw, w.grad, atol=1e-4)


def test_leading_shape_and_only_logp_gradient():
    h = torch.randn(2, 3, 8, requires_grad=True)
    w = torch.randn(11, 8, requires_grad=True)
    y = torch.randint(0, 11, (2, 3))
    lp, ent = chunked_logprobs(h, w, y, chunk=4)
    assert lp.shape == (2, 3) and ent.shape == (2, 3)
    lp.sum().backward()
    assert h.grad.shape == h.shape and w.grad.shape == w.shape
    ref = naive_logprobs(h.detach(), w.detach(), y)[0]
    assert torch.allclose(lp.detach(), ref, atol=1e-5)


@pytest.mark.parametrize("frozen", ["weight", "hidden"])
@pytest.mark.parametrize("which", ["logp", "entropy"])
def test_gradient_of_one_input_when_the_other_is_frozen(frozen, which):
    # a frozen output layer (LoRA, a frozen head) must still pass gradients to the hidden states
    g = torch.Generator().manual_seed(7)
    h = torch.randn(9, 5, generator=g, dtype=torch.float64, requires_grad=frozen != "hidden")
    w = torch.randn(13, 5, generator=g, dtype=torch.float64, requires_grad=frozen != "weight")
    y = torch.randint(0, 13, (9,), generator=g)
    live = h if frozen == "weight" else w
    out = chunked_logprobs(h, w, y, chunk=4, temperature=0.8)[which == "entropy"]
    (out * torch.arange(9)).sum().backward()
    got = live.grad.clone()
    live.grad = None
    ref = naive_logprobs(h, w, y, temperature=0.8)[which == "entropy"]
    (ref * torch.arange(9)).sum().backward()
    assert torch.allclose(got, live.grad, atol=1e-4)
    assert got.dtype == live.dtype and got.abs().sum() > 0


def test_bf16_inputs_get_bf16_gradients_and_fp32_values():
    h = torch.randn(6, 4, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(7, 4, dtype=torch.bfloat16, requires_grad=True)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the outputs are fp32 whatever the default
    try:
        lp, ent = chunked_logprobs(h, w, torch.randint(0, 7, (6,)), chunk=4)
    finally:
        torch.set_default_dtype(previous)
    assert lp.dtype == ent.dtype == torch.float32
    (lp.sum() + ent.sum()).backward()
    assert h.grad.dtype == w.grad.dtype == torch.bfloat16


def test_bad_arguments_name_themselves():
    h, w, y = torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="^chunk must be >= 1$"):
        chunked_logprobs(h, w, y, chunk=0)
    with pytest.raises(ValueError, match="^temperature must be > 0$"):
        chunked_logprobs(h, w, y, temperature=0.0)


def _fp32_reference(h, w, y, gl, ge, temp):
    """Values and gradients of the naive path on fp32 copies of ``h`` and ``w``."""
    h32, w32 = h.detach().float().requires_grad_(True), w.detach().float().requires_grad_(True)
    lp, ent = naive_logprobs(h32, w32, y, temperature=temp)
    (lp * gl + ent * ge).sum().backward()
    return lp.detach(), ent.detach(), h32.grad, w32.grad


def _rel(a, b):
    return float((a.detach().float() - b).norm() / b.norm())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temp", [1.0, 0.7])
@pytest.mark.parametrize("hidden_dtype", ["same", "fp32"])
def test_half_precision_weight_is_close_to_the_fp32_path(dtype, temp, hidden_dtype):
    # the matmuls run in the weight's dtype and the logits are rounded to it before the fp32
    # softmax (module docstring): the fp32 path is matched to half-precision tolerance, and
    # the gradients keep each input's dtype
    g = torch.Generator().manual_seed(3)
    n, v, hdim = 70, 300, 32
    w = (torch.randn(v, hdim, generator=g) * 0.3).to(dtype).requires_grad_(True)
    h = torch.randn(n, hdim, generator=g).to(dtype if hidden_dtype == "same" else torch.float32)
    h.requires_grad_(True)
    y = torch.randint(0, v, (n,), generator=g)
    gl, ge = torch.randn(n, generator=g), torch.randn(n, generator=g)
    lp, ent = chunked_logprobs(h, w, y, chunk=16, temperature=temp)  # 5 chunks: grad_W accumulates
    (lp * gl + ent * ge).sum().backward()
    ref_lp, ref_ent, ref_gh, ref_gw = _fp32_reference(h.to(dtype), w, y, gl, ge, temp)
    assert lp.dtype == ent.dtype == torch.float32
    assert h.grad.dtype == h.dtype and w.grad.dtype == dtype
    eps = torch.finfo(dtype).eps  # 2**-7 for bf16, 2**-10 for fp16
    assert (lp - ref_lp).abs().max() < 8 * eps and (ent - ref_ent).abs().max() < 8 * eps
    assert _rel(lp, ref_lp) < eps and _rel(ent, ref_ent) < eps
    assert _rel(h.grad, ref_gh) < 2 * eps and _rel(w.grad, ref_gw) < 2 * eps


class _WideTensors(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every op (forward and backward: on CPU autograd runs in the calling thread)
    and every op output wider than ``dtype`` with at least ``numel`` elements."""

    def __init__(self, dtype, numel):
        super().__init__()
        self.itemsize, self.numel = dtype.itemsize, numel
        self.ops, self.wide = set(), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.add(func.overloadpacket.__name__)
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                if t.dtype.itemsize > self.itemsize and t.numel() >= self.numel:
                    self.wide.append((func.overloadpacket.__name__, t.dtype, tuple(t.shape)))
        return out


@pytest.mark.parametrize("outputs", ["both", "logp", "entropy"])
def test_a_bf16_weight_is_never_copied_to_fp32(outputs):
    # the issue: weight.float() per chunk was a 3.1 GB fp32 copy of Qwen2.5-32B's lm_head,
    # and grad_W a full fp32 [V, H] accumulator. No op of forward + backward may output a
    # tensor wider than bf16 with V * H elements or more; the [chunk, V] fp32 logits are
    # smaller because chunk < H here.
    g = torch.Generator().manual_seed(0)
    n, v, hdim, chunk = 40, 512, 64, 16
    h = torch.randn(n, hdim, generator=g).to(torch.bfloat16).requires_grad_(True)
    w = (torch.randn(v, hdim, generator=g) * 0.1).to(torch.bfloat16).requires_grad_(True)
    y = torch.randint(0, v, (n,), generator=g)
    with _WideTensors(torch.bfloat16, v * hdim) as seen:
        lp, ent = chunked_logprobs(h, w, y, chunk=chunk, temperature=0.9)
        loss = {"both": lp.sum() + ent.sum(), "logp": lp.sum(), "entropy": ent.sum()}[outputs]
        loss.backward()
    assert seen.wide == []
    assert "addmm_" in seen.ops  # the backward ran under the mode: grad_W accumulated in bf16
    assert w.grad.dtype == torch.bfloat16 and h.grad.dtype == torch.bfloat16
    # the check itself sees an fp32 copy of the weight when there is one
    with _WideTensors(torch.bfloat16, v * hdim) as control:
        w.detach().float()
    assert control.wide == [("_to_copy", torch.float32, (v, hdim))]
