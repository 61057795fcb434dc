import math

import pytest
import torch
import torch.distributed as dist

from dapo.batch import RolloutBatch
from dapo.config import PRESETS, AlgoConfig
from dapo.metrics import SCHEMA
from dapo.update import DataParallel, LogProbs, update
from multiproc import run_function

V, T = 5, 6


class PositionPolicy(torch.nn.Module):
    """logits depend on the position only: tiny, exact, differentiable."""

    def __init__(self, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.logits = torch.nn.Parameter(torch.randn(T, V, generator=g, dtype=torch.float64))

    def __call__(self, mb):
        lp = torch.log_softmax(self.logits, -1)
        tokens = mb.extras["tokens"]
        logp = lp.unsqueeze(0).expand(tokens.shape[0], -1, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        ent = -(lp.exp() * lp).sum(-1).unsqueeze(0).expand(tokens.shape[0], -1)
        return LogProbs(logp, ent)


def make_batch(policy, n_groups=4, g=4, seed=0, truncate_some=True):
    gen = torch.Generator().manual_seed(seed)
    b = n_groups * g
    tokens = torch.randint(0, V, (b, T), generator=gen)
    lengths = torch.randint(1, T + 1, (b,), generator=gen)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    with torch.no_grad():
        old = policy(type("M", (), {"extras": {"tokens": tokens}})).logp
    old = torch.where(mask, old, torch.zeros_like(old))
    correct = torch.rand(b, generator=gen) < 0.5
    truncated = (lengths == T) if truncate_some else torch.zeros(b, dtype=torch.bool)
    return RolloutBatch(
        old_logp=old, mask=mask, lengths=lengths, truncated=truncated, correct=correct,
        rewards=torch.where(correct, 1.0, -1.0).double() - 0.1 * lengths.double() / T,
        group_ids=torch.arange(n_groups).repeat_interleave(g), group_size=g,
        extras={"tokens": tokens},
    )


def cfg_for(agg="token-mean", **kw):
    base = dict(group_size=4, train_groups=4, mini_batch_groups=2, loss_agg=agg, max_grad_norm=None,
                eps_high=0.28, clip_ratio_c=3.0)
    base.update(kw)
    return AlgoConfig(**base)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batching_does_not_change_the_update(agg):
    results = []
    for mbs in (None, 1, 3):
        pol = PositionPolicy()
        batch = make_batch(PositionPolicy())
        opt = torch.optim.SGD(pol.parameters(), lr=0.5)
        m = update(batch, pol, opt, cfg_for(agg, ppo_epochs=2), micro_batch_size=mbs)
        results.append((pol.logits.detach().clone(), m))
    for w, m in results[1:]:
        assert torch.allclose(w, results[0][0], atol=1e-10)
        assert m["actor/optimizer_steps"] == 4  # 2 windows x 2 epochs
        assert m["actor/loss"] == pytest.approx(results[0][1]["actor/loss"], abs=1e-10)


def test_first_window_gradient_equals_hand_computed_full_window_loss():
    from dapo.advantages import group_advantages
    from dapo.loss import policy_loss

    pol, ref = PositionPolicy(), PositionPolicy()
    batch = make_batch(ref)
    cfg = cfg_for(mini_batch_groups=4)  # one window = whole batch
    opt = torch.optim.SGD(pol.parameters(), lr=1.0)
    update(batch, pol, opt, cfg, micro_batch_size=3)
    adv = group_advantages(batch.rewards, 4)
    loss_mask = batch.mask & ~batch.truncated.unsqueeze(-1)
    loss, _ = policy_loss(ref(batch).logp, batch.old_logp, adv, loss_mask, eps_low=0.2, eps_high=0.28,
                          clip_ratio_c=3.0)
    loss.backward()
    assert torch.allclose(pol.logits.detach(), (ref.logits - ref.logits.grad).detach(), atol=1e-10)


def test_overlong_filter_removes_truncated_responses_from_the_gradient():
    ref = PositionPolicy()
    batch = make_batch(ref, seed=3)
    assert batch.truncated.any()
    keep = (~batch.truncated).nonzero().view(-1)
    grads = {}
    for filt in (True, False):
        pol = PositionPolicy()
        captured = {}

        def fn(mb, pol=pol):
            out = pol(mb)
            out.logp.retain_grad()
            captured["logp"], captured["rows"] = out.logp, mb.extras["tokens"]
            return out

        opt = torch.optim.SGD(pol.parameters(), lr=0.0)
        update(batch, fn, opt, cfg_for(mini_batch_groups=4, overlong_filter=filt), micro_batch_size=None)
        grads[filt] = captured["logp"].grad
    assert torch.all(grads[True][batch.truncated] == 0)
    assert torch.any(grads[False][batch.truncated] != 0)
    assert torch.any(grads[True][keep] != 0)


def test_non_finite_loss_is_skipped_and_weights_untouched():
    pol = PositionPolicy()
    batch = make_batch(PositionPolicy())
    before = pol.logits.detach().clone()

    def bad(mb):
        out = pol(mb)
        return LogProbs(out.logp * float("nan"), out.entropy)

    opt = torch.optim.Adam(pol.parameters(), lr=0.1)
    m = update(batch, bad, opt, cfg_for())
    assert m["actor/skipped_steps"] == 2 and m["actor/optimizer_steps"] == 0
    assert torch.equal(pol.logits.detach(), before)
    assert all(p.grad is None for p in pol.parameters())


def test_non_finite_gradient_is_skipped():
    pol = PositionPolicy()
    batch = make_batch(PositionPolicy())

    class Hook(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * float("inf")

    def inf_grad(mb):
        out = pol(mb)
        return LogProbs(Hook.apply(out.logp), out.entropy)

    before = pol.logits.detach().clone()
    opt = torch.optim.SGD(pol.parameters(), lr=0.1)
    m = update(batch, inf_grad, opt, cfg_for(max_grad_norm=1.0))
    assert m["actor/skipped_steps"] == 2 and m["actor/optimizer_steps"] == 0
    assert torch.equal(pol.logits.detach(), before)


def test_metrics_and_tis():
    pol = PositionPolicy()
    b = make_batch(PositionPolicy())
    noisy = torch.where(b.mask, (b.old_logp + 0.3 * torch.randn_like(b.old_logp)).clamp(max=0), 0.0)
    b = RolloutBatch(**{**b.__dict__, "rollout_logp": noisy})
    opt = torch.optim.SGD(pol.parameters(), lr=0.1)
    m = update(b, pol, opt, cfg_for(tis_cap=2.0, max_grad_norm=1.0))
    assert set(m) <= set(SCHEMA), set(m) - set(SCHEMA)
    assert 0 < m["actor/mean_prob"] < 1
    assert 0 < m["actor/entropy"] <= math.log(V) + 1e-9
    assert m["mismatch/logp_gap"] > 0
    assert 0 < m["mismatch/tis_weight_mean"] <= 2.0
    assert m["actor/optimizer_steps"] == 2
    assert m["actor/filtered_responses"] == float(b.truncated.sum())


def test_empty_or_missing_batch():
    pol = PositionPolicy()
    opt = torch.optim.SGD(pol.parameters(), lr=0.1)
    assert update(None, pol, opt, cfg_for())["actor/optimizer_steps"] == 0


# ---- data parallel: 2 gloo ranks == 1 process --------------------------------------

def ranks_update(rank, world, agg, out):
    """One rank of the 2-process run (started by multiproc.run_function in a gloo group)."""
    torch.manual_seed(0)
    pol = PositionPolicy()
    batch = make_batch(PositionPolicy(), n_groups=4)
    per_rank = batch.size // world
    shard = batch.select(torch.arange(rank * per_rank, (rank + 1) * per_rank), group_size=batch.group_size)

    def all_reduce(x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    def backward(loss):
        loss.backward()
        for p in pol.parameters():  # what DDP does: average gradients over ranks
            dist.all_reduce(p.grad)
            p.grad /= world

    opt = torch.optim.SGD(pol.parameters(), lr=0.5)
    cfg = cfg_for(agg, mini_batch_groups=2)  # global window: 1 group from each rank
    update(shard, pol, opt, cfg, dp=DataParallel(world, all_reduce), backward=backward)
    if rank == 0:
        torch.save(pol.logits.detach(), out)


@pytest.mark.multiprocess
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_two_gloo_ranks_match_single_process(tmp_path, agg):
    # single process: windows of 2 groups over 4 groups
    pol = PositionPolicy()
    batch = make_batch(PositionPolicy(), n_groups=4)
    opt = torch.optim.SGD(pol.parameters(), lr=0.5)
    # rank r holds groups [2r, 2r+1]; a window on each rank holds 1 group, so the global
    # window is groups {0, 2} then {1, 3}: reorder the single-process batch the same way
    order = torch.tensor([0, 2, 1, 3])
    rows = (order.view(-1, 1) * 4 + torch.arange(4)).view(-1)
    update(batch.select(rows, group_size=4), pol, opt, cfg_for(agg, mini_batch_groups=2))
    out = tmp_path / "w.pt"
    run_function("test_update:ranks_update", nproc=2, agg=agg, out=str(out))
    assert torch.allclose(torch.load(out, weights_only=True), pol.logits.detach(), atol=1e-10)
