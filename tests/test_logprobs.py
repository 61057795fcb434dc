import torch
from hypothesis import given, strategies as st

from dapo.logprobs import chunked_logprobs, naive_logprobs


@given(st.integers(0, 1000), st.integers(1, 40), st.integers(2, 50), st.integers(1, 16), st.integers(1, 64),
       st.sampled_from([1.0, 0.7, 1.3]))
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
