import itertools
import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from dapo.config import AGG_MODES
from dapo.loss import ClipAgg, aggregate, policy_loss, window_denominator

KW = dict(eps_low=0.2, eps_high=0.28)
CLIP = ClipAgg(**KW)


def clip(**kw):
    """DAPO's clip (0.2 / 0.28) with ``kw`` in the keyword form (``agg=``, ``clip_ratio_c=``...)."""
    return ClipAgg.from_keywords(**{**KW, **kw})


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
    a, _ = policy_loss(old + delta, old, adv, mask, clip(agg="token-mean"))
    s, _ = policy_loss(old + delta, old, adv, mask, clip(agg="seq-mean-token-mean"))
    assert torch.allclose(a, s, atol=1e-12)


def test_token_mean_differs_from_sample_mean_for_unequal_lengths():
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    per_tok = torch.tensor([[1.0, 0, 0, 0], [0.0, 0, 0, 0]], dtype=torch.float64)
    assert float(aggregate(per_tok, mask, "token-mean")) == pytest.approx(1 / 5)
    assert float(aggregate(per_tok, mask, "seq-mean-token-mean")) == pytest.approx(1 / 2)
    assert float(aggregate(per_tok, mask, "seq-mean-token-sum-norm", norm_const=4)) == pytest.approx(1 / 8)


@given(
    st.integers(0, 10_000),
    st.integers(2, 9),
    st.integers(1, 6),
    st.sampled_from(AGG_MODES),
    st.integers(1, 4),
    st.booleans(),
)
def test_accumulated_micro_batches_equal_full_batch(seed, b, t, agg, n_micro, with_is):
    mask, old, delta, adv = _setup(seed, b, t)
    w = (
        torch.rand(b, t, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) + 0.5
        if with_is
        else None
    )
    kw = dict(KW, agg=agg, norm_const=7.0, clip_ratio_c=3.0)

    theta = delta.clone().requires_grad_(True)
    full, _ = policy_loss(old + theta, old, adv, mask, clip(**kw), is_weights=w)
    full.backward()
    g_full = theta.grad.clone()

    theta = delta.clone().requires_grad_(True)
    denom = window_denominator(mask, agg, 7.0)
    total = 0.0
    bounds = torch.linspace(0, b, n_micro + 1).long().tolist()
    for lo, hi in itertools.pairwise(bounds):
        if hi == lo:
            continue
        part, _ = policy_loss(
            old[lo:hi] + theta[lo:hi],
            old[lo:hi],
            adv[lo:hi],
            mask[lo:hi],
            clip(agg_denominator=denom, **kw),
            is_weights=None if w is None else w[lo:hi],
        )
        part.backward()
        total = total + part.detach()
    assert torch.allclose(total, full.detach(), atol=1e-6)
    assert torch.allclose(theta.grad, g_full, atol=1e-6)


def test_micro_batch_default_denominator_is_the_known_bug():
    """Without the window denominator, averaging per-micro-batch token means is wrong."""
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    old = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    full, _ = policy_loss(old, old, adv, mask, CLIP)
    naive = (
        sum(
            policy_loss(old[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1], CLIP)[0]
            for i in range(2)
        )
        / 2
    )
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
    loss, stats = policy_loss(x, old, adv, mask, ClipAgg(eps_low=eps_low, eps_high=eps_high))
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
    loss, _ = policy_loss(x, old, adv, mask, clip(clip_ratio_c=c))
    assert float(loss.detach()) <= -a * c + 1e-9
    plain, _ = policy_loss(x, old, adv, mask, CLIP)
    assert float(loss.detach()) == pytest.approx(min(float(plain.detach()), -a * c))
    loss.backward()
    if math.exp(log_r) > c:
        assert float(x.grad) == 0.0


def test_dual_clip_leaves_positive_advantages_alone():
    old = torch.zeros(1, 1, dtype=torch.float64)
    x = torch.full((1, 1), 0.1, dtype=torch.float64)
    adv = torch.tensor([2.0], dtype=torch.float64)
    mask = torch.ones(1, 1, dtype=torch.bool)
    a, _ = policy_loss(x, old, adv, mask, clip(clip_ratio_c=1.5))
    b, _ = policy_loss(x, old, adv, mask, CLIP)
    assert float(a) == float(b)


def test_upclip_old_prob_and_padding_with_nan():
    old = torch.log(torch.tensor([[0.05, 0.9, float("nan")]], dtype=torch.float64))
    new = old + torch.tensor([[1.0, 0.5, 0.0]], dtype=torch.float64)  # ratios e, 1.65
    mask = torch.tensor([[True, True, False]])
    loss, st_ = policy_loss(new, old, torch.tensor([1.0], dtype=torch.float64), mask, CLIP)
    assert torch.isfinite(loss)
    assert float(st_["clipfrac_upper"]) == 1.0
    assert float(st_["upclip_old_prob"]) == pytest.approx((0.05 + 0.9) / 2)
    assert float(st_["approx_kl"]) > 0


def test_clip_fractions_ignore_padding():
    # padded positions hold finite values that *would* be clipped: they must not count
    old = torch.zeros(2, 4, dtype=torch.float64)
    new = torch.tensor([[0.0, 1.0, 5.0, 5.0], [-1.0, 0.0, -5.0, -5.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False, False], [True, True, False, False]])
    _, up = policy_loss(new, old, torch.tensor([1.0, 1.0], dtype=torch.float64), mask, clip(clip_ratio_c=3.0))
    assert float(up["clipfrac_upper"]) == 0.25 and float(up["n_tokens"]) == 4
    assert float(up["n_upclip"]) == 1
    _, low = policy_loss(
        new, old, torch.tensor([-1.0, -1.0], dtype=torch.float64), mask, clip(clip_ratio_c=1.5)
    )
    assert float(low["clipfrac_lower"]) == 0.25  # only [1, 0]: ratio e^-1 < 0.8
    assert float(low["dual_clipfrac"]) == 0.25  # only [0, 1]: ratio e > 1.5
    assert float(low["ratio_mean"]) == pytest.approx((1 + math.e + math.exp(-1) + 1) / 4)
    assert float(low["approx_kl"]) == pytest.approx((math.e - 2 + math.exp(-1)) / 4)
    # zero advantages (a uniform group) are never clipped on either side
    _, zero = policy_loss(
        new, old, torch.tensor([0.0, 0.0], dtype=torch.float64), mask, clip(clip_ratio_c=1.5)
    )
    assert (
        float(zero["clipfrac_upper"]) == float(zero["clipfrac_lower"]) == float(zero["dual_clipfrac"]) == 0.0
    )


def test_log_ratio_is_clamped_before_exp():
    # |log r| = 100 overflows exp() in float32; the clamp at 20 keeps the loss finite
    old = torch.zeros(1, 2, dtype=torch.float32)
    new = torch.tensor([[100.0, -100.0]], dtype=torch.float32, requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, st_ = policy_loss(new, old, torch.tensor([-1.0], dtype=torch.float64), mask, CLIP)
    # token 0: max(e^20, 1.28) = e^20; token 1: max(e^-20, 0.8) = 0.8; token mean
    assert float(loss.detach()) == pytest.approx((math.exp(20) + 0.8) / 2, rel=1e-6)
    assert loss.dtype == torch.float32  # the log-probs' dtype, whatever the advantages' dtype
    k3 = (math.exp(20) - 1 - 20) + (math.exp(-20) - 1 + 20)  # both sides clamped at |log r| = 20
    assert float(st_["approx_kl"]) == pytest.approx(k3 / 2, rel=1e-5)
    assert float(st_["ratio_mean"]) == pytest.approx((math.exp(20) + math.exp(-20)) / 2, rel=1e-5)
    _, low = policy_loss(new[:, 1:].detach(), old[:, 1:], torch.tensor([-1.0]), mask[:, 1:], CLIP)
    assert float(low["approx_kl"]) == pytest.approx(math.exp(-20) - 1 + 20)  # the lower side is clamped too
    loss.backward()
    assert torch.equal(new.grad, torch.zeros_like(new))  # beyond the clamp: no gradient


@given(st.lists(st.lists(st.booleans(), min_size=4, max_size=4), min_size=1, max_size=6))
def test_seq_denominators_count_responses_with_a_loss_token(rows):
    mask = torch.tensor(rows)
    n_live = sum(any(r) for r in rows)
    assert float(window_denominator(mask, "token-mean")) == sum(map(sum, rows))
    assert float(window_denominator(mask, "seq-mean-token-mean")) == n_live
    assert float(window_denominator(mask, "seq-mean-token-sum-norm", norm_const=7)) == 7 * n_live


def test_seq_mean_with_an_empty_row_known_value():
    per_tok = torch.tensor([[2.0, 4.0, 0.0], [9.0, 9.0, 9.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, False]])
    assert float(aggregate(per_tok, mask, "seq-mean-token-mean")) == pytest.approx((3.0 + 1.0) / 2)
    assert float(aggregate(per_tok, mask, "seq-mean-token-sum-norm", norm_const=3)) == pytest.approx(7.0 / 6)
    assert float(aggregate(per_tok, mask, "token-mean")) == pytest.approx(7.0 / 3)


def test_empty_mask_gives_zero_connected_loss():
    x = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    loss, _ = policy_loss(
        x,
        torch.zeros(2, 3, dtype=torch.float64),
        torch.ones(2, dtype=torch.float64),
        torch.zeros(2, 3, dtype=torch.bool),
        CLIP,
    )
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert torch.all(x.grad == 0)


def test_is_weights_multiply_each_token_loss():
    old = torch.zeros(2, 3, dtype=torch.float64)
    new = torch.tensor([[0.1, -0.1, 0.0], [0.05, 0.0, 0.2]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    w = torch.tensor([[2.0, 0.5, 7.0], [1.0, 1.5, 0.25]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    plain, _ = policy_loss(new, old, adv, mask, clip(agg="seq-mean-token-mean"))
    weighted, _ = policy_loss(new, old, adv, mask, clip(agg="seq-mean-token-mean"), is_weights=w)
    r = new.exp()
    per_tok = torch.maximum(-adv[:, None] * r, -adv[:, None] * r.clamp(0.8, 1.28))
    want = ((per_tok[0, :2] * w[0, :2]).mean() + (per_tok[1] * w[1]).mean()) / 2
    assert float(weighted) == pytest.approx(float(want), rel=1e-12)
    assert float(plain) != pytest.approx(float(weighted))
    mixed, _ = policy_loss(
        new.float(), old.float(), adv, mask, CLIP, is_weights=w
    )  # fp64 weights, fp32 log-probs
    assert mixed.dtype == torch.float32


def test_zero_window_denominator_gives_a_zero_loss():
    # a window whose responses were all filtered (on every rank) contributes nothing
    per_tok = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 3, dtype=torch.bool)
    loss = aggregate(per_tok, mask, "token-mean", denominator=0.0)
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert torch.all(per_tok.grad == 0)


def test_argument_errors_name_the_argument():
    from dapo.offpolicy import is_weights

    on = torch.ones(1, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="^is_level must be 'token' or 'sequence', got 'tok'$"):
        is_weights(torch.zeros(1, 1), on, "tok", 2.0)
    assert torch.equal(is_weights(torch.zeros(1, 1), on, "token", 1.0), torch.ones(1, 1))
    assert (
        float(window_denominator(torch.ones(1, 2, dtype=torch.bool), "seq-mean-token-sum-norm", 0.5)) == 0.5
    )
    for bad in (None, 0.0, -2.0):
        with pytest.raises(ValueError, match="^seq-mean-token-sum-norm needs norm_const > 0$"):
            window_denominator(torch.ones(1, 2, dtype=torch.bool), "seq-mean-token-sum-norm", bad)
    with pytest.raises(
        ValueError, match=r"^advantages shape \(3,\) fits neither \[B\] nor \[B, T\] = \(2, 3\)$"
    ):
        policy_loss(
            torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3, dtype=torch.bool), CLIP
        )


def test_shape_errors():
    with pytest.raises(ValueError, match="shape"):
        policy_loss(
            torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3, dtype=torch.bool), CLIP
        )
    with pytest.raises(ValueError, match="agg"):
        policy_loss(
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.zeros(1),
            torch.ones(1, 1, dtype=torch.bool),
            clip(agg="mean"),
        )


# ---- leading run dimensions (the toy engine trains several seeds as one tensor) -----------


@given(
    runs=st.integers(2, 3),
    b=st.integers(1, 4),
    t=st.integers(1, 5),
    agg=st.sampled_from(AGG_MODES),
    seed=st.integers(0, 2**31 - 1),
)
def test_leading_run_dims_equal_one_run_at_a_time(runs, b, t, agg, seed):
    """aggregate / window_denominator over [R, B, T] give, run by run, exactly what a single
    run [B, T] gives, values and gradients; a run with no loss token gets a zero loss (not
    nan) and a zero gradient, without touching the other runs."""
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(runs, b, t, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(runs, b, t, generator=g) < 0.6
    mask[0] = False
    mask[-1, 0, 0] = True
    nc = float(t)
    denom = window_denominator(mask, agg, nc)
    assert denom.shape == (runs,)
    for r in range(runs):
        assert torch.equal(denom[r], window_denominator(mask[r], agg, nc))
    together = aggregate(loss, mask, agg, norm_const=nc)
    explicit = aggregate(loss, mask, agg, denominator=denom)
    assert together.shape == (runs,) and torch.equal(together, explicit)
    assert together[0] == 0.0
    (grad,) = torch.autograd.grad(together.sum(), loss)
    for r in range(runs):
        one = loss[r].detach().clone().requires_grad_(True)
        alone = aggregate(one, mask[r], agg, norm_const=nc)
        assert torch.allclose(together[r], alone, rtol=1e-12, atol=0.0)
        (g_one,) = torch.autograd.grad(alone, one)
        assert torch.allclose(grad[r], g_one, rtol=1e-12, atol=0.0)
    assert torch.isfinite(grad).all() and (grad[0] == 0).all()
    # a scalar denominator applies to every run alike
    scalar = aggregate(loss, mask, agg, denominator=2.0)
    for r in range(runs):
        assert torch.allclose(scalar[r], aggregate(loss[r], mask[r], agg, denominator=2.0), rtol=1e-12)


def test_multi_run_loss_keeps_its_dtype_and_no_upclip_gives_nan():
    loss = torch.randn(2, 3, 4, dtype=torch.float32)
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    for agg in AGG_MODES:
        assert aggregate(loss, mask, agg, norm_const=4.0).dtype == torch.float32
    logp = torch.zeros(2, 3)
    adv = torch.tensor([1.0, -1.0])
    _, stats = policy_loss(logp, logp, adv, torch.ones(2, 3, dtype=torch.bool), clip(agg="token-mean"))
    assert math.isnan(float(stats["upclip_old_prob"]))  # no up-clipped token: undefined, not 0
