import pytest
import torch
from factories import random_batch

from dapo.batch import BatchError, RolloutBatch


def _fields(b):
    return dict(
        old_logp=b.old_logp,
        mask=b.mask,
        lengths=b.lengths,
        truncated=b.truncated,
        correct=b.correct,
        rewards=b.rewards,
        group_ids=b.group_ids,
        group_size=b.group_size,
    )


@pytest.mark.parametrize(
    "change,field",
    [
        (lambda f: f.update(old_logp=f["old_logp"][0]), "old_logp"),
        (lambda f: f.update(old_logp=f["old_logp"].long()), "old_logp"),
        (lambda f: f.update(mask=f["mask"][:, :-1]), "mask"),
        (lambda f: f.update(mask=f["mask"].float() * 2), "mask"),
        (lambda f: f.update(lengths=f["lengths"] + 1), "lengths"),
        (lambda f: f.update(lengths=f["lengths"].float()), "lengths"),
        (lambda f: f.update(truncated=f["truncated"].long()), "truncated"),
        (lambda f: f.update(correct=f["correct"][:-1]), "correct"),
        (lambda f: f.update(rewards=f["rewards"].clone().fill_(float("inf"))), "rewards"),
        (lambda f: f.update(rewards=f["correct"].long()), "rewards"),
        (lambda f: f.update(group_ids=torch.arange(len(f["group_ids"]))), "group_ids"),
        (lambda f: f.update(group_size=5), "group_size"),
        (lambda f: f.update(old_logp=f["old_logp"].clone().fill_(0.5)), "old_logp"),
        (lambda f: f.update(old_logp=torch.where(f["mask"], float("nan"), 0.0).double()), "old_logp"),
        (lambda f: f.update(extras={"x": torch.zeros(2)}), "extras['x']"),
        (lambda f: f.update(rollout_logp=torch.zeros(1, 1)), "rollout_logp"),
    ],
)
def test_errors_name_the_field(change, field):
    f = _fields(random_batch())
    change(f)
    with pytest.raises(BatchError) as err:
        RolloutBatch(**f)
    assert err.value.field == field
    assert f"RolloutBatch.{field}" in str(err.value)


def test_nan_in_padding_is_fine_and_float_mask_converted():
    b = random_batch(rollout=True)
    f = _fields(b)
    f["old_logp"] = torch.where(b.mask, b.old_logp, float("nan"))
    f["mask"] = b.mask.float()
    nb = RolloutBatch(**f)
    assert nb.mask.dtype == torch.bool


def test_select_concat_roundtrip():
    a, b = random_batch(seed=1, max_len=4, rollout=True), random_batch(seed=2, max_len=7, rollout=True)
    c = RolloutBatch.concat([a, b])
    assert c.size == a.size + b.size and c.old_logp.shape[1] == 7
    assert c.num_groups == a.num_groups + b.num_groups
    back = c.select(torch.arange(a.size), group_size=a.group_size)
    assert torch.equal(back.old_logp[:, :4], a.old_logp)
    assert not back.mask[:, 4:].any()
    assert torch.equal(back.extras["row"], a.extras["row"])
    groups = list(c.groups())
    assert len(groups) == c.num_groups and all(g.size == c.group_size for g in groups)
    sub = c.select([0, 5])
    assert sub.group_size is None
    with pytest.raises(BatchError):
        _ = sub.num_groups


def test_concat_rejects_mixed():
    a, b = random_batch(rollout=True), random_batch(rollout=False)
    with pytest.raises(BatchError, match="rollout_logp"):
        RolloutBatch.concat([a, b])
    with pytest.raises(BatchError, match="group size"):
        RolloutBatch.concat([random_batch(group_size=2), random_batch(group_size=4)])
