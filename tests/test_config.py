import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dapo.config import GRPO, LADDER, PRESETS, SWITCHES, AlgoConfig, ConfigError, from_dict, with_switches


def test_ladder_is_cumulative_one_technique_per_rung():
    assert list(PRESETS) == list(LADDER)
    assert PRESETS["dapo"] == AlgoConfig()
    names = list(LADDER)
    for prev, cur, switch in zip(names, names[1:], SWITCHES):
        a, b = PRESETS[prev].to_dict(), PRESETS[cur].to_dict()
        changed = {k for k in a if a[k] != b[k]}
        assert changed == set(SWITCHES[switch]), (prev, cur, changed)


def test_paper_defaults():
    c = AlgoConfig()
    assert (c.eps_low, c.eps_high) == (0.2, 0.28)
    assert c.max_len == 20480 and c.expected_len == 16384 and c.cache_len == 4096
    assert c.group_size == 16 and c.train_groups // c.mini_batch_groups == 16
    assert c.loss_agg == "token-mean" and c.dynamic_sampling
    assert GRPO.eps_high == 0.2 and GRPO.loss_agg == "seq-mean-token-mean"


@pytest.mark.parametrize(
    "field,value",
    [
        ("eps_low", 0.0),
        ("eps_low", 1.0),
        ("eps_low", -0.1),
        ("eps_low", float("nan")),
        ("eps_high", 0.0),
        ("clip_ratio_c", 0.5),
        ("loss_agg", "mean"),
        ("group_size", 1),
        ("adv_eps", 0.0),
        ("expected_len", 0),
        ("cache_len", -1),
        ("max_gen_rounds", 0),
        ("mini_batch_groups", 0),
        ("ppo_epochs", 0),
        ("max_grad_norm", 0.0),
        ("tis_cap", 0.5),
        ("overlong_filter", "yes"),
        ("expected_len", 1.5),
        ("group_size", True),
        ("mini_batch_groups", 1024),
    ],
)
def test_out_of_range_names_the_field(field, value):
    with pytest.raises(ConfigError) as err:
        AlgoConfig(**{field: value})
    assert err.value.field == field
    assert field in str(err.value)


@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(allow_nan=True, allow_infinity=True))
def test_any_clip_pair_is_accepted_iff_in_range(lo, hi):
    ok = 0 < lo < 1 and hi > 0
    try:
        AlgoConfig(eps_low=lo, eps_high=hi)
    except ConfigError as err:
        assert not ok and err.field in ("eps_low", "eps_high")
    else:
        assert ok


def test_unknown_key_is_named():
    with pytest.raises(ConfigError) as err:
        from_dict({"eps_lo": 0.1})
    assert err.value.field == "eps_lo"


def test_with_switches_and_frozen():
    c = with_switches(["clip_higher", "dynamic_sampling"])
    assert c.eps_high == 0.28 and c.dynamic_sampling and not c.overlong_filter
    with pytest.raises(ConfigError):
        with_switches(["nope"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.eps_low = 0.1  # type: ignore[misc]
