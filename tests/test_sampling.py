import math
import warnings

import pytest
import torch
from factories import random_batch
from hypothesis import given
from hypothesis import strategies as st

from dapo.batch import RolloutBatch
from dapo.sampling import DynamicSampler, SamplingWarning, balance_groups, trim_round_major


def _groups(pattern, g):
    """A batch whose group k has pattern[k] correct answers."""
    b = random_batch(n_groups=len(pattern), group_size=g, seed=len(pattern))
    correct = torch.cat([torch.arange(g) < c for c in pattern])
    # shaped reward: an all-wrong group has non-zero reward std (length penalty)
    rewards = torch.where(correct, 1.0, -1.0).double() - 0.1 * torch.arange(len(correct)).double() % 0.3
    return RolloutBatch(
        old_logp=b.old_logp,
        mask=b.mask,
        lengths=b.lengths,
        truncated=b.truncated,
        correct=correct,
        rewards=rewards,
        group_ids=b.group_ids,
        group_size=g,
    )


@given(
    st.integers(2, 5),
    st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=5), min_size=1, max_size=6),
    st.integers(1, 6),
    st.integers(1, 4),
)
def test_never_accepts_uniform_and_never_raises(g, rounds, target, max_rounds):
    s = DynamicSampler(target_groups=target, group_size=g, max_rounds=max_rounds)
    fed = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        for pattern in rounds:
            if s.done:
                break
            s.add(_groups([min(c, g) for c in pattern], g))
            fed += 1
        out = s.take()
    m = s.metrics()
    if out is not None:
        per_group = out.correct.view(-1, g).sum(1)
        assert torch.all((per_group > 0) & (per_group < g))
        assert out.num_groups <= target
    assert m["sampling/rounds"] == fed <= max_rounds
    assert m["sampling/generated_groups"] == sum(len(p) for p in rounds[:fed])


def test_informative_is_judged_on_correctness_not_on_the_reward():
    # a correct but overlong answer can score <= 0 (Eq. 13): its group is still all-correct
    b = _groups([4, 0, 2], 4)
    rewards = b.rewards.clone()
    rewards[:2] = torch.tensor([0.0, -0.5], dtype=rewards.dtype)
    b = RolloutBatch(**{**b.__dict__, "rewards": rewards})
    s = DynamicSampler(target_groups=3, group_size=4, max_rounds=1)
    s.add(b)
    with pytest.warns(SamplingWarning, match="1/3 informative groups"):
        out = s.take()
    assert out.num_groups == 1 and out.correct.tolist() == [True, True, False, False]
    m = s.metrics()
    assert m["sampling/rejected_all_correct"] == 1 and m["sampling/rejected_all_wrong"] == 1


def test_reject_reasons_costs_and_surplus():
    s = DynamicSampler(target_groups=2, group_size=4, max_rounds=5)
    s.add(_groups([0, 4, 2], 4))
    assert not s.done
    s.add(_groups([4, 1, 3, 0], 4))
    assert s.done
    out = s.take()
    m = s.metrics()
    assert out.num_groups == 2
    assert out.correct.view(-1, 4).sum(1).tolist() == [2, 1]
    assert m["sampling/rejected_all_correct"] == 2 and m["sampling/rejected_all_wrong"] == 2
    assert m["sampling/surplus_groups"] == 1 and m["sampling/accepted_groups"] == 2
    assert m["sampling/generated_groups"] == 7
    assert m["sampling/tokens_per_accepted_group"] == m["sampling/generated_tokens"] / 2
    # rollout metrics cover everything generated, before filtering
    assert m["rollout/groups_all_correct"] == pytest.approx(2 / 7)
    assert m["rollout/accuracy"] == pytest.approx((0 + 4 + 2 + 4 + 1 + 3 + 0) / 28)
    rewards = torch.cat([_groups([0, 4, 2], 4).rewards, _groups([4, 1, 3, 0], 4).rewards])
    assert m["rollout/reward_mean"] == pytest.approx(float(rewards.mean()))


def test_round_limit_warns_and_hands_back():
    s = DynamicSampler(target_groups=3, group_size=2, max_rounds=2)
    s.add(_groups([0, 1], 2))
    s.add(_groups([2, 2], 2))
    assert s.done
    with pytest.warns(SamplingWarning, match="1/3"):
        out = s.take()
    assert out.num_groups == 1
    s = DynamicSampler(target_groups=3, group_size=2, max_rounds=1)
    s.add(_groups([0, 0], 2))
    with pytest.warns(SamplingWarning):
        assert s.take() is None


def test_disabled_accepts_everything_in_one_round():
    s = DynamicSampler(target_groups=3, group_size=2, max_rounds=10, enabled=False)
    s.add(_groups([0, 2, 1], 2))
    assert s.done
    assert s.take().num_groups == 3
    assert s.metrics()["sampling/rejected_all_wrong"] == 0


def test_exactly_full_is_not_underfilled_and_token_costs_add_up():
    s = DynamicSampler(target_groups=2, group_size=4, max_rounds=5)
    first, second = _groups([0, 1], 4), _groups([3, 4], 4)
    s.add(first)
    s.add(second)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a full batch must not warn
        out = s.take()
    assert out.num_groups == 2
    m = s.metrics()
    assert m["sampling/underfilled"] == 0.0 and m["sampling/surplus_groups"] == 0.0
    assert m["sampling/generated_tokens"] == int(first.lengths.sum()) + int(second.lengths.sum())


def test_metrics_before_any_round():
    m = DynamicSampler(target_groups=2, group_size=4, max_rounds=5).metrics()
    assert m["sampling/rounds"] == 0 and m["sampling/generated_tokens"] == 0
    assert m["sampling/underfilled"] == 1.0
    for key in (
        "rollout/accuracy",
        "rollout/length_mean",
        "rollout/reward_mean",
        "rollout/truncation_rate",
        "sampling/tokens_per_accepted_group",
    ):
        assert math.isnan(m[key]), key


def test_errors_name_the_argument():
    s = DynamicSampler(target_groups=2, group_size=2, max_rounds=1)
    assert DynamicSampler(target_groups=1, group_size=1, max_rounds=1).group_size == 1  # legal, if useless
    for kw in ({"target_groups": 0}, {"group_size": 0}, {"max_rounds": 0}):
        with pytest.raises(ValueError, match="^target_groups, group_size and max_rounds must be >= 1$"):
            DynamicSampler(**{"target_groups": 2, "group_size": 2, "max_rounds": 1, **kw})
    with pytest.raises(ValueError, match="^batch group_size 4 != sampler's 2$"):
        s.add(_groups([1], 4))


def test_uniform_groups_can_leave_truncated_responses_out():
    from dapo import AlgoConfig
    from dapo.sampling import uniform_groups

    correct = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool).view(-1)
    truncated = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool).view(-1)
    all_c, all_w = uniform_groups(correct, 4)
    assert all_c.tolist() == [False, False, False] and all_w.tolist() == [False, False, True]
    all_c, all_w = uniform_groups(correct, 4, truncated)
    # group 0: its terminated responses are all right; group 1: its only terminated one is right;
    # group 2: nothing terminated (counts as all wrong)
    assert all_c.tolist() == [True, True, False] and all_w.tolist() == [False, False, True]
    # leading run dimension
    c2, w2 = uniform_groups(torch.stack([correct, correct]), 4, torch.stack([truncated, truncated]))
    assert c2.tolist() == [[True, True, False]] * 2 and w2.tolist() == [[False, False, True]] * 2

    cfg = AlgoConfig(group_size=4, train_groups=2, mini_batch_groups=1, expected_len=4, cache_len=2)
    assert DynamicSampler.for_config(cfg).exclude_truncated is False
    s = DynamicSampler.for_config(cfg.replace(filtered_group_stats="excluded"))
    assert s.exclude_truncated is True and s.target_groups == 2 and s.max_rounds == cfg.max_gen_rounds
    assert (
        DynamicSampler.for_config(
            cfg.replace(filtered_group_stats="excluded", overlong_filter=False), target_groups=1
        ).exclude_truncated
        is False
    )
    b = _groups([2, 1], 4)
    b = RolloutBatch(**{**b.__dict__, "correct": correct[:8], "truncated": truncated[:8]})
    s.add(b)
    assert s.accepted_groups == 0 and s.rejected_all_correct == 2


def test_uniform_groups_counts_only_terminated_correct_answers():
    """With ``truncated``: a truncated correct answer does not make its group all-correct or
    rescue it from all-wrong (known values)."""
    from dapo.sampling import uniform_groups

    correct = torch.tensor([False, True, True, False, True, True])
    truncated = torch.tensor([False, True, False, True, False, False])
    all_c, all_w = uniform_groups(correct, 2, truncated)
    assert all_c.tolist() == [False, True, True] and all_w.tolist() == [True, False, False]


def test_for_config_uses_a_given_target():
    from dapo import AlgoConfig

    cfg = AlgoConfig(train_groups=8, mini_batch_groups=8, group_size=2)
    assert DynamicSampler.for_config(cfg).target_groups == 8
    assert DynamicSampler.for_config(cfg, target_groups=3).target_groups == 3


# ---- dynamic sampling over many ranks: the pure decisions ------------------------------------

counts_st = st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=5), min_size=1, max_size=6).filter(
    lambda rows: len({len(r) for r in rows}) == 1
)


@given(counts_st, st.integers(0, 80))
def test_trim_round_major_keeps_the_first_target_groups(counts, target):
    kept = trim_round_major(counts, target)
    flat = [k for row in kept for k in row]
    assert all(0 <= k <= n for row_k, row_n in zip(kept, counts) for k, n in zip(row_k, row_n))
    assert sum(flat) == min(target, sum(map(sum, counts)))
    # round-major: nothing of a later slot is kept while an earlier slot lost a group
    avail = [n for row in counts for n in row]
    first_short = next((i for i, (k, n) in enumerate(zip(flat, avail)) if k < n), len(flat))
    assert all(k == 0 for k in flat[first_short + 1 :])


@given(st.lists(st.integers(0, 10_000), max_size=60), st.integers(1, 9))
def test_balance_groups_partitions_with_equal_counts(tokens, parts):
    out = balance_groups(tokens, parts)
    assert len(out) == parts
    assert sorted(i for p in out for i in p) == list(range(len(tokens)))
    sizes = [len(p) for p in out]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert balance_groups(tokens, parts) == out  # deterministic
    if len(tokens) >= parts and tokens:
        loads = [sum(tokens[i] for i in p) for p in out]
        # greedy bound: no part exceeds the mean by more than the largest group
        assert max(loads) <= sum(tokens) / parts + max(tokens)


def test_balance_groups_beats_contiguous_chunks_on_skewed_lengths():
    tokens = [1000, 900, 800, 700, 10, 20, 30, 40]
    loads = [sum(tokens[i] for i in p) for p in balance_groups(tokens, 2)]
    assert max(loads) - min(loads) <= 20 and sum(loads) == 3500  # contiguous halves: 3400 vs 100
