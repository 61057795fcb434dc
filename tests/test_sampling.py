import warnings

import pytest
import torch
from hypothesis import given, strategies as st

from dapo.batch import RolloutBatch
from dapo.sampling import DynamicSampler, SamplingWarning
from factories import random_batch


def _groups(pattern, g):
    """A batch whose group k has pattern[k] correct answers."""
    b = random_batch(n_groups=len(pattern), group_size=g, seed=len(pattern))
    correct = torch.cat([torch.arange(g) < c for c in pattern])
    # shaped reward: an all-wrong group has non-zero reward std (length penalty)
    rewards = torch.where(correct, 1.0, -1.0).double() - 0.1 * torch.arange(len(correct)).double() % 0.3
    return RolloutBatch(old_logp=b.old_logp, mask=b.mask, lengths=b.lengths, truncated=b.truncated,
                        correct=correct, rewards=rewards, group_ids=b.group_ids, group_size=g)


@given(st.integers(2, 5), st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=5), min_size=1, max_size=6),
       st.integers(1, 6), st.integers(1, 4))
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
