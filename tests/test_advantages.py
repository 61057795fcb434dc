import math

import pytest
import torch
from hypothesis import given, strategies as st

from dapo.advantages import group_advantages

rewards_st = st.integers(2, 8).flatmap(
    lambda g: st.tuples(
        st.just(g),
        st.lists(st.lists(st.sampled_from([-1.0, 1.0, -1.5, 0.5, 0.25, -1.25]) | st.floats(-5, 5), min_size=g, max_size=g),
                 min_size=1, max_size=6),
    )
)


@given(rewards_st, st.booleans())
def test_group_sums_zero_and_uniform_groups_exactly_zero(data, std_norm):
    g, rows = data
    r = torch.tensor(rows, dtype=torch.float64).view(-1)
    adv = group_advantages(r, g, std_norm=std_norm).view(-1, g)
    for row, a in zip(rows, adv):
        if len(set(row)) == 1:
            assert torch.all(a == 0), "a zero-std group must give exactly zero"
        else:
            assert abs(float(a.sum())) < 1e-9 * max(1.0, float(a.abs().max()))


@given(rewards_st)
def test_std_normalised_has_unit_sample_std(data):
    g, rows = data
    r = torch.tensor(rows, dtype=torch.float64).view(-1)
    adv = group_advantages(r, g, eps=1e-12).view(-1, g)
    for row, a in zip(rows, adv):
        if torch.tensor(row).std() > 1e-3:
            assert abs(float(a.std()) - 1.0) < 1e-6


@given(rewards_st, st.floats(-3, 3), st.floats(0.1, 10))
def test_invariant_to_shift_and_equivariant_to_scale_without_std(data, shift, scale):
    g, rows = data
    r = torch.tensor(rows, dtype=torch.float64).view(-1)
    a = group_advantages(r, g, std_norm=False)
    b = group_advantages(r * scale + shift, g, std_norm=False)
    assert torch.allclose(a * scale, b, atol=1e-9)
    a = group_advantages(r, g, eps=1e-12)
    b = group_advantages(r + shift, g, eps=1e-12)
    assert torch.allclose(a, b, atol=1e-6)


def test_uniform_group_exact_zero_despite_rounding():
    r = torch.full((3,), 0.1, dtype=torch.float32)  # mean(0.1,0.1,0.1) != 0.1 in float
    assert torch.equal(group_advantages(r, 3), torch.zeros(3))


@given(st.floats(-1e6, 1e6, allow_nan=False), st.integers(2, 9), st.booleans())
def test_float64_uniform_groups_are_exactly_zero(value, g, std_norm):
    # float64 keeps the mean's rounding residue (mean of three 0.1s is 0.1 + 1.4e-17)
    r = torch.full((3 * g,), value, dtype=torch.float64)
    r[g:2 * g] = 0.1
    r[2 * g:] = 2.0 ** torch.arange(g, dtype=torch.float64)  # an informative group beside them (no A = 0)
    adv = group_advantages(r, g, std_norm=std_norm)
    assert torch.equal(adv[:2 * g], torch.zeros(2 * g, dtype=torch.float64))
    assert torch.all(adv[2 * g:] != 0)


def test_eps_is_added_to_the_std_not_under_the_root():
    r = torch.tensor([1.0, -1.0, -1.0, -1.0], dtype=torch.float64)  # mean -0.5, sample std 1
    a = group_advantages(r, 4, eps=0.5)
    assert torch.allclose(a, torch.tensor([1.5, -0.5, -0.5, -0.5], dtype=torch.float64) / 1.5, atol=1e-15)
    r = torch.tensor([3.0, 1.0], dtype=torch.float64)  # sample std sqrt(2)
    assert torch.allclose(group_advantages(r, 2, eps=0.1), torch.tensor([1.0, -1.0], dtype=torch.float64)
                          / (math.sqrt(2) + 0.1), atol=1e-15)


def test_known_values_and_errors():
    a = group_advantages(torch.tensor([1.0, -1.0, -1.0, -1.0]), 4, eps=0.0)
    # mean -0.5, sample std 1.0
    assert torch.allclose(a, torch.tensor([1.5, -0.5, -0.5, -0.5]))
    assert torch.equal(group_advantages(torch.tensor([3.0, -1.0]), 1), torch.zeros(2))  # G = 1: no contrast
    with pytest.raises(ValueError, match="^B = 5 is not a multiple of group_size = 4$"):
        group_advantages(torch.zeros(5), 4)
    with pytest.raises(ValueError, match="group_size = 0"):
        group_advantages(torch.zeros(4), 0)
    with pytest.raises(ValueError, match=r"^rewards must be 1-D \[B\], got shape \(2, 2\)$"):
        group_advantages(torch.zeros(2, 2), 2)
