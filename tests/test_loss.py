import math

import pytest
import torch
from hypothesis import assume, given, strategies as st

from dapo.config import AGG_MODES
from dapo.loss import aggregate, policy_loss, tis_weights, window_denominator

KW = dict(eps_low=0.2, eps_high=0.28)


def _setup(seed, b, t, equal=False):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.full((b,), t) if equal else torch.randint(0, t + 1, (b,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 2
    delta = (torch.rand(b, t, generator=g, dtype=torch.float64) - 0.5) * 0.8
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    return mask, old, delta, adv


@given(st.integers(0, 10_000), st.integers(1, 6), st.integers(1, 7))
def test_token_mean_equals_sample_mean_for_equal_lengths(seed, b, t):
    mask, old, delta, adv = _setup(seed, b, t, equal=True)
    a, _ = policy_loss(old + delta, old, adv, mask, agg="token-mean", **KW)
    s, _ = policy_loss(old + delta, old, adv, mask, agg="seq-mean-token-mean", **KW)
    assert torch.allclose(a, s, atol=1e-12)


def test_token_mean_differs_from_sample_mean_for_unequal_lengths():
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    per_tok = torch.tensor([[1.0, 0, 0, 0], [0.0, 0, 0, 0]], dtype=torch.float64)
    assert float(aggregate(per_tok, mask, "token-mean")) == pytest.approx(1 / 5)
    assert float(aggregate(per_tok, mask, "seq-mean-token-mean")) == pytest.approx(1 / 2)
    assert float(aggregate(per_tok, mask, "seq-mean-token-sum-norm", norm_const=4)) == pytest.approx(1 / 8)


@given(st.integers(0, 10_000), st.integers(2, 9), st.integers(1, 6), st.sampled_from(AGG_MODES),
       st.integers(1, 4), st.booleans())
def test_accumulated_micro_batches_equal_full_batch(seed, b, t, agg, n_micro, with_is):
    mask, old, delta, adv = _setup(seed, b, t)
    w = torch.rand(b, t, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) + 0.5 if with_is else None
    kw = dict(KW, agg=agg, norm_const=7.0, clip_ratio_c=3.0)

    theta = delta.clone().requires_grad_(True)
    full, _ = policy_loss(old + theta, old, adv, mask, is_weights=w, **kw)
    full.backward()
    g_full = theta.grad.clone()

    theta = delta.clone().requires_grad_(True)
    denom = window_denominator(mask, agg, 7.0)
    total = 0.0
    bounds = torch.linspace(0, b, n_micro + 1).long().tolist()
    for lo, hi in zip(bounds, bounds[1:]):
        if hi == lo:
            continue
        part, _ = policy_loss(old[lo:hi] + theta[lo:hi], old[lo:hi], adv[lo:hi], mask[lo:hi],
                              is_weights=None if w is None else w[lo:hi], agg_denominator=denom, **kw)
        part.backward()
        total = total + part.detach()
    assert torch.allclose(total, full.detach(), atol=1e-6)
    assert torch.allclose(theta.grad, g_full, atol=1e-6)


def test_micro_batch_default_denominator_is_the_known_bug():
    """Without the window denominator, averaging per-micro-batch token means is wrong."""
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    old = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    full, _ = policy_loss(old, old, adv, mask, **KW)
    naive = sum(policy_loss(old[i:i + 1], old[i:i + 1], adv[i:i + 1], mask[i:i + 1], **KW)[0] for i in range(2)) / 2
    assert not torch.allclose(full, naive)


@given(st.floats(-3, 3), st.floats(-1.5, 1.5), st.floats(0.05, 0.5), st.floats(0.05, 0.5))
def test_clip_gradient_zero_outside_and_unclipped_inside(a, log_r, eps_low, eps_high):
    assume(abs(a) > 1e-3)
    r = math.exp(log_r)
    # keep away from the clip boundaries themselves
    assume(abs(r - (1 + eps_high)) > 1e-6 and abs(r - (1 - eps_low)) > 1e-6)
    old = torch.tensor([[-1.0]], dtype=torch.float64)
    x = torch.tensor([[-1.0 + log_r]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([a], dtype=torch.float64)
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, stats = policy_loss(x, old, adv, mask, eps_low=eps_low, eps_high=eps_high)
    loss.backward()
    grad = float(x.grad)
    clipped_side = (a > 0 and r > 1 + eps_high) or (a < 0 and r < 1 - eps_low)
    if clipped_side:
        assert grad == 0.0
    else:
        # d/dx of -A * exp(x - old) = -A r
        assert grad == pytest.approx(-a * r, rel=1e-9)
    assert float(stats["clipfrac_upper"]) == float(a > 0 and r > 1 + eps_high)
    assert float(stats["clipfrac_lower"]) == float(a < 0 and r < 1 - eps_low)


@given(st.floats(-5, -1e-3), st.floats(-3, 6), st.floats(1.5, 10))
def test_dual_clip_bounds_negative_advantage_loss(a, log_r, c):
    old = torch.zeros(1, 1, dtype=torch.float64)
    x = torch.tensor([[log_r]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([a], dtype=torch.float64)
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, _ = policy_loss(x, old, adv, mask, clip_ratio_c=c, **KW)
    assert float(loss.detach()) <= -a * c + 1e-9
    plain, _ = policy_loss(x, old, adv, mask, **KW)
    assert float(loss.detach()) == pytest.approx(min(float(plain.detach()), -a * c))
    loss.backward()
    if math.exp(log_r) > c:
        assert float(x.grad) == 0.0


def test_dual_clip_leaves_positive_advantages_alone():
    old = torch.zeros(1, 1, dtype=torch.float64)
    x = torch.full((1, 1), 0.1, dtype=torch.float64)
    adv = torch.tensor([2.0], dtype=torch.float64)
    mask = torch.ones(1, 1, dtype=torch.bool)
    a, _ = policy_loss(x, old, adv, mask, clip_ratio_c=1.5, **KW)
    b, _ = policy_loss(x, old, adv, mask, **KW)
    assert float(a) == float(b)


def test_upclip_old_prob_and_padding_with_nan():
    old = torch.log(torch.tensor([[0.05, 0.9, float("nan")]], dtype=torch.float64))
    new = old + torch.tensor([[1.0, 0.5, 0.0]], dtype=torch.float64)  # ratios e, 1.65
    mask = torch.tensor([[True, True, False]])
    loss, st_ = policy_loss(new, old, torch.tensor([1.0], dtype=torch.float64), mask, **KW)
    assert torch.isfinite(loss)
    assert float(st_["clipfrac_upper"]) == 1.0
    assert float(st_["upclip_old_prob"]) == pytest.approx((0.05 + 0.9) / 2)
    assert float(st_["approx_kl"]) > 0


@given(st.integers(0, 1000), st.floats(1.0, 5.0))
def test_tis_weights_capped_and_detached(seed, cap):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(3, 4, generator=g, dtype=torch.float64).requires_grad_(True)
    roll = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    w = tis_weights(old, roll, cap)
    assert not w.requires_grad
    assert torch.all(w <= cap * (1 + 1e-12))
    raw = torch.exp(old.detach() - roll)
    assert torch.allclose(w, torch.minimum(raw, torch.tensor(cap, dtype=torch.float64)))


def test_empty_mask_gives_zero_connected_loss():
    x = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    loss, _ = policy_loss(x, torch.zeros(2, 3, dtype=torch.float64), torch.ones(2, dtype=torch.float64),
                          torch.zeros(2, 3, dtype=torch.bool), **KW)
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert torch.all(x.grad == 0)


def test_shape_errors():
    with pytest.raises(ValueError, match="shape"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3, dtype=torch.bool), **KW)
    with pytest.raises(ValueError, match="agg"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1, dtype=torch.bool),
                    agg="mean", **KW)
