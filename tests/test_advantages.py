import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dapo.advantages import group_advantages

rewards_st = st.integers(2, 8).flatmap(
    lambda g: st.tuples(
        st.just(g),
        st.lists(
            st.lists(
                st.sampled_from([-1.0, 1.0, -1.5, 0.5, 0.25, -1.25]) | st.floats(-5, 5),
                min_size=g,
                max_size=g,
            ),
            min_size=1,
            max_size=6,
        ),
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
    r[g : 2 * g] = 0.1
    r[2 * g :] = 2.0 ** torch.arange(g, dtype=torch.float64)  # an informative group beside them (no A = 0)
    adv = group_advantages(r, g, std_norm=std_norm)
    assert torch.equal(adv[: 2 * g], torch.zeros(2 * g, dtype=torch.float64))
    assert torch.all(adv[2 * g :] != 0)


def test_eps_is_added_to_the_std_not_under_the_root():
    r = torch.tensor([1.0, -1.0, -1.0, -1.0], dtype=torch.float64)  # mean -0.5, sample std 1
    a = group_advantages(r, 4, eps=0.5)
    assert torch.allclose(a, torch.tensor([1.5, -0.5, -0.5, -0.5], dtype=torch.float64) / 1.5, atol=1e-15)
    r = torch.tensor([3.0, 1.0], dtype=torch.float64)  # sample std sqrt(2)
    assert torch.allclose(
        group_advantages(r, 2, eps=0.1),
        torch.tensor([1.0, -1.0], dtype=torch.float64) / (math.sqrt(2) + 0.1),
        atol=1e-15,
    )


def test_known_values_and_errors():
    a = group_advantages(torch.tensor([1.0, -1.0, -1.0, -1.0]), 4, eps=0.0)
    # mean -0.5, sample std 1.0
    assert torch.allclose(a, torch.tensor([1.5, -0.5, -0.5, -0.5]))
    assert torch.equal(group_advantages(torch.tensor([3.0, -1.0]), 1), torch.zeros(2))  # G = 1: no contrast
    with pytest.raises(ValueError, match="^B = 5 is not a multiple of group_size = 4$"):
        group_advantages(torch.zeros(5), 4)
    with pytest.raises(ValueError, match="group_size = 0"):
        group_advantages(torch.zeros(4), 0)
    with pytest.raises(ValueError, match=r"^rewards must be 1-D \[B\] \(or \[\.\.\., B\]\), got shape \(\)$"):
        group_advantages(torch.tensor(1.0), 1)


# ---- leading run dimensions and which responses enter the group statistics --------------

from dapo import AlgoConfig  # noqa: E402
from dapo.advantages import config_advantages  # noqa: E402


@given(rewards_st, st.booleans(), st.integers(1, 3))
def test_leading_run_dimensions_are_independent_rows(data, std_norm, runs):
    g, rows = data
    r = torch.tensor(rows, dtype=torch.float64).view(-1)
    stacked = torch.stack([r * (i + 1) for i in range(runs)])
    adv = group_advantages(stacked, g, std_norm=std_norm)
    for i in range(runs):  # equal up to rounding: a reduction kernel may order a batch of rows differently
        assert torch.allclose(
            adv[i], group_advantages(r * (i + 1), g, std_norm=std_norm), rtol=1e-12, atol=1e-12
        )


@given(rewards_st, st.booleans(), st.data())
def test_included_responses_alone_make_the_group_statistics(data, std_norm, draw):
    g, rows = data
    r = torch.tensor(rows, dtype=torch.float64).view(-1)
    include = torch.tensor(draw.draw(st.lists(st.booleans(), min_size=len(r), max_size=len(r))))
    adv = group_advantages(r, g, std_norm=std_norm, include=include).view(-1, g)
    everyone = group_advantages(r, g, std_norm=std_norm, include=torch.ones_like(include)).view(-1, g)
    assert torch.allclose(everyone, group_advantages(r, g, std_norm=std_norm).view(-1, g), atol=1e-9)
    for k, (row, inc) in enumerate(zip(r.view(-1, g), include.view(-1, g))):
        assert torch.all(adv[k][~inc] == 0), "an excluded response carries no advantage"
        kept = row[inc]
        if kept.numel() >= 2 and len(set(kept.tolist())) > 1:
            alone = group_advantages(kept, kept.numel(), std_norm=std_norm)
            assert torch.allclose(adv[k][inc], alone, atol=1e-9)
        else:  # one member, or all equal: no contrast, exactly zero
            assert torch.all(adv[k] == 0)


def test_filtered_group_stats_known_values():
    # one group: two right (+1), one terminated wrong (-1), one truncated wrong with the full
    # soft penalty (-2)
    rewards = torch.tensor([1.0, 1.0, -1.0, -2.0], dtype=torch.float64)
    correct = torch.tensor([True, True, False, False])
    truncated = torch.tensor([False, False, False, True])
    lengths = torch.tensor([3, 4, 2, 6])
    cfg = AlgoConfig(group_size=4, expected_len=4, cache_len=2, overlong_filter=True, soft_overlong=True)

    def adv(mode, **kw):
        return config_advantages(
            rewards, correct, lengths, truncated, 4, cfg.replace(filtered_group_stats=mode, **kw)
        )

    shaped = adv("shaped")
    assert torch.allclose(shaped, group_advantages(rewards, 4))
    unpen = adv("unpenalized")  # the truncated response enters at -1
    assert torch.allclose(
        unpen, group_advantages(torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64), 4)
    )
    excl = adv("excluded")  # mean 1/3 and sample std of (1, 1, -1) over the three that terminated
    assert excl[3] == 0
    assert torch.allclose(excl[:3], group_advantages(rewards[:3], 3))
    # the short wrong answer: -2 in the group raises its advantage above the other two modes
    assert shaped[2] > unpen[2] and shaped[2] > excl[2]
    # without overlong filtering nothing is filtered and the knob does nothing
    for mode in ("unpenalized", "excluded"):
        assert torch.equal(adv(mode, overlong_filter=False), shaped)


# ---- leading run dimensions (the toy engine trains several seeds as one tensor) -----------


@given(
    runs=st.integers(2, 3),
    groups=st.integers(1, 3),
    g=st.integers(2, 4),
    stats=st.sampled_from(["shaped", "unpenalized", "excluded"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_leading_run_dims_equal_one_run_at_a_time(runs, groups, g, stats, seed):
    """group_advantages, config_advantages and uniform_groups over [R, B] equal the same
    call run by run (each run's groups are its own)."""
    from dapo.rewards import config_reward
    from dapo.sampling import uniform_groups

    gen = torch.Generator().manual_seed(seed)
    n = groups * g
    correct = torch.rand(runs, n, generator=gen) < 0.5
    lengths = torch.randint(1, 30, (runs, n), generator=gen)
    truncated = lengths >= 25
    cfg = AlgoConfig(group_size=g, expected_len=20, cache_len=8, filtered_group_stats=stats)
    rewards = config_reward(correct, lengths, cfg)
    include = ~truncated
    adv = group_advantages(rewards, g)
    adv_inc = group_advantages(rewards, g, include=include)
    cfg_adv = config_advantages(rewards, correct, lengths, truncated, g, cfg)
    all_c, all_w = uniform_groups(correct, g)
    all_c_t, all_w_t = uniform_groups(correct, g, truncated)
    assert adv.shape == (runs, n) and all_c.shape == (runs, groups)
    for r in range(runs):
        assert torch.equal(adv[r], group_advantages(rewards[r], g))
        assert torch.equal(adv_inc[r], group_advantages(rewards[r], g, include=include[r]))
        assert torch.equal(
            cfg_adv[r], config_advantages(rewards[r], correct[r], lengths[r], truncated[r], g, cfg)
        )
        one_c, one_w = uniform_groups(correct[r], g)
        assert torch.equal(all_c[r], one_c) and torch.equal(all_w[r], one_w)
        one_c, one_w = uniform_groups(correct[r], g, truncated[r])
        assert torch.equal(all_c_t[r], one_c) and torch.equal(all_w_t[r], one_w)


def test_include_path_edge_cases():
    """The ``include`` path: all included equals the plain path (same eps, same std); equal
    included rewards give exactly 0 even where the mean has a rounding residue; the dtype is
    the rewards'; a mask of the wrong size is refused by name."""
    g = 4
    r = torch.tensor([0.3, -1.0, 0.7, 2.0, 1.0, 1.0, -1.0, 0.5], dtype=torch.float64)
    full = torch.ones_like(r, dtype=torch.bool)
    assert torch.allclose(group_advantages(r, g, include=full), group_advantages(r, g), rtol=1e-12, atol=0)
    tenth = torch.tensor([0.1, 0.1, 0.1, 5.0] * 2, dtype=torch.float64)  # mean(0.1 x 3) != 0.1 in floats
    inc = torch.tensor([True, True, True, False] * 2)
    assert (tenth[:3].sum() / 3) != 0.1
    assert torch.equal(group_advantages(tenth, g, include=inc), torch.zeros_like(tenth))
    one = torch.tensor([True, False, False, False, False, False, False, False])
    assert torch.equal(group_advantages(r, g, include=one), torch.zeros_like(r))
    out = group_advantages(r.float(), g, include=inc)
    assert out.dtype == torch.float32
    with pytest.raises(ValueError, match=r"include shape \(12,\) != rewards shape \(8,\)"):
        group_advantages(r, g, include=torch.ones(12, dtype=torch.bool))


def test_config_advantages_keep_the_rewards_dtype():
    cfg = AlgoConfig(group_size=2, expected_len=20, cache_len=8, filtered_group_stats="unpenalized")
    correct = torch.tensor([True, False, True, True])
    lengths = torch.tensor([28, 5, 10, 12])
    truncated = lengths >= 28
    rewards = torch.tensor([-0.5, -1.0, 1.0, 1.0], dtype=torch.float32)
    out = config_advantages(rewards, correct, lengths, truncated, 2, cfg)
    assert out.dtype == torch.float32
