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
