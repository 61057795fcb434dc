import math
import threading

import pytest
import torch
import torch.distributed as dist
from multiproc import run_function

from dapo.batch import RolloutBatch
from dapo.config import AlgoConfig
from dapo.metrics import SCHEMA
from dapo.update import DataParallel, LogProbs, update

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
        old_logp=old,
        mask=mask,
        lengths=lengths,
        truncated=truncated,
        correct=correct,
        rewards=torch.where(correct, 1.0, -1.0).double() - 0.1 * lengths.double() / T,
        group_ids=torch.arange(n_groups).repeat_interleave(g),
        group_size=g,
        extras={"tokens": tokens},
    )


def cfg_for(agg="token-mean", **kw):
    base = dict(
        group_size=4,
        train_groups=4,
        mini_batch_groups=2,
        loss_agg=agg,
        max_grad_norm=None,
        eps_high=0.28,
        clip_ratio_c=3.0,
    )
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


def _one_window_reference(batch, cfg, **loss_kw):
    """The gradient of the hand-built full-batch loss at the initial policy."""
    from dapo.advantages import group_advantages
    from dapo.loss import ClipAgg, policy_loss

    ref = PositionPolicy()
    loss_mask = batch.mask & ~batch.truncated.unsqueeze(-1) if cfg.overlong_filter else batch.mask
    loss, _ = policy_loss(
        ref(batch).logp,
        batch.old_logp,
        group_advantages(batch.rewards, 4, eps=cfg.adv_eps, std_norm=cfg.adv_std_norm),
        loss_mask,
        ClipAgg(
            eps_low=cfg.eps_low,
            eps_high=cfg.eps_high,
            clip_ratio_c=cfg.clip_ratio_c,
            agg=cfg.loss_agg,
            norm_const=cfg.norm_const,
        ),
        **loss_kw,
    )
    loss.backward()
    return ref.logits.grad.detach()


def test_first_window_gradient_equals_hand_computed_full_window_loss():
    from dapo.advantages import group_advantages
    from dapo.loss import ClipAgg, policy_loss

    pol, ref = PositionPolicy(), PositionPolicy()
    batch = make_batch(ref)
    cfg = cfg_for(mini_batch_groups=4)  # one window = whole batch
    opt = torch.optim.SGD(pol.parameters(), lr=1.0)
    m = update(batch, pol, opt, cfg, micro_batch_size=3)
    adv = group_advantages(batch.rewards, 4)
    loss_mask = batch.mask & ~batch.truncated.unsqueeze(-1)
    loss, _ = policy_loss(
        ref(batch).logp, batch.old_logp, adv, loss_mask, ClipAgg(eps_low=0.2, eps_high=0.28, clip_ratio_c=3.0)
    )
    loss.backward()
    assert torch.allclose(pol.logits.detach(), (ref.logits - ref.logits.grad).detach(), atol=1e-10)
    assert m["actor/loss"] == pytest.approx(float(loss.detach()), abs=1e-12)
    assert all(p.grad is None for p in pol.parameters())  # no gradient memory held between steps
    assert m["actor/grad_norm"] == m["actor/grad_norm_max"] == pytest.approx(float(ref.logits.grad.norm()))
    # the advantage knobs of the config reach the update
    for knobs in ({"adv_eps": 0.5}, {"adv_std_norm": False}):
        pol, knob_cfg = PositionPolicy(), cfg_for(mini_batch_groups=4, **knobs)
        update(batch, pol, torch.optim.SGD(pol.parameters(), lr=1.0), knob_cfg)
        grad = _one_window_reference(batch, knob_cfg)
        assert torch.allclose(pol.logits.detach(), PositionPolicy().logits.detach() - grad, atol=1e-10), knobs


def test_overlong_filter_removes_truncated_responses_from_the_gradient():
    ref = PositionPolicy()
    batch = make_batch(ref, seed=3)
    assert batch.truncated.any()
    keep = (~batch.truncated).nonzero().view(-1)
    grads = {}
    for filt in (True, False):
        pol = PositionPolicy()
        captured = {}

        def fn(mb, pol=pol, captured=captured):
            out = pol(mb)
            out.logp.retain_grad()
            captured["logp"], captured["rows"] = out.logp, mb.extras["tokens"]
            return out

        opt = torch.optim.SGD(pol.parameters(), lr=0.0)
        m = update(batch, fn, opt, cfg_for(mini_batch_groups=4, overlong_filter=filt), micro_batch_size=None)
        grads[filt] = captured["logp"].grad
        assert m["actor/filtered_responses"] == (float(batch.truncated.sum()) if filt else 0.0)
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
    for key in (
        "actor/loss",
        "actor/grad_norm",
        "actor/grad_norm_max",
        "actor/clipfrac_upper",
        "actor/approx_kl",
        "actor/entropy",
        "actor/upclip_old_prob",
    ):
        assert math.isnan(m[key]), key  # no step taken: undefined, not 0


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
    m = update(b, pol, opt, cfg_for(tis_cap=1.2, max_grad_norm=1.0))
    assert set(m) <= set(SCHEMA), set(m) - set(SCHEMA)
    assert 0 < m["actor/mean_prob"] < 1
    assert 0 < m["actor/entropy"] <= math.log(V) + 1e-9
    assert m["mismatch/logp_gap"] > 0
    assert 0 < m["mismatch/tis_weight_mean"] <= 1.2
    assert m["actor/optimizer_steps"] == 2
    assert m["actor/filtered_responses"] == float(b.truncated.sum())
    from dapo.offpolicy import is_weights

    w = is_weights(b.old_logp - noisy, b.mask, "token", 1.2)[b.mask]
    assert m["mismatch/tis_weight_mean"] == pytest.approx(float(w.mean()))
    capped = float((w >= 1.2 * (1 - 1e-6)).double().mean())
    assert 0 < capped < 1 and m["mismatch/tis_capped_frac"] == pytest.approx(capped)


def test_empty_or_missing_batch():
    pol = PositionPolicy()
    opt = torch.optim.SGD(pol.parameters(), lr=0.1)
    for nothing in (None, make_batch(PositionPolicy()).select(torch.arange(0), group_size=4)):
        m = update(nothing, pol, opt, cfg_for())
        assert m == {"actor/optimizer_steps": 0.0, "actor/skipped_steps": 0.0}
    single = make_batch(PositionPolicy(), n_groups=1, g=1)  # one response: A = 0, a step of zero
    m = update(single, pol, opt, cfg_for())
    assert m["actor/optimizer_steps"] == 1
    batch = make_batch(PositionPolicy())
    loose = RolloutBatch(**{**batch.__dict__, "group_size": None})
    with pytest.raises(ValueError, match=r"^update needs a batch of whole groups \(group_size set\)$"):
        update(loose, pol, opt, cfg_for())


# ---- behaviours pinned by known values (each kills a mutant the suite once missed) ----


def test_tis_weights_scale_the_gradient_exactly():
    from dapo.offpolicy import is_weights

    batch = make_batch(PositionPolicy())
    gen = torch.Generator().manual_seed(1)
    roll = torch.where(
        batch.mask,
        (batch.old_logp + 0.5 * torch.randn(batch.old_logp.shape, generator=gen, dtype=torch.float64)).clamp(
            max=0
        ),
        0.0,
    )
    batch = RolloutBatch(**{**batch.__dict__, "rollout_logp": roll})
    cfg = cfg_for(mini_batch_groups=4, tis_cap=2.0)
    pol = PositionPolicy()
    update(batch, pol, torch.optim.SGD(pol.parameters(), lr=1.0), cfg, micro_batch_size=5)
    step = PositionPolicy().logits.detach() - pol.logits.detach()
    with_w = _one_window_reference(
        batch, cfg, is_weights=is_weights(batch.old_logp - roll, batch.mask, "token", 2.0)
    )
    without = _one_window_reference(batch, cfg)
    assert torch.allclose(step, with_w, atol=1e-12)
    assert not torch.allclose(step, without, atol=1e-3)


def test_grad_clip_bounds_the_step_and_reports_the_norm_before_clipping():
    batch = make_batch(PositionPolicy())
    bound = 1e-3
    pol = PositionPolicy()
    m = update(
        batch,
        pol,
        torch.optim.SGD(pol.parameters(), lr=1.0),
        cfg_for(mini_batch_groups=4, max_grad_norm=bound),
    )
    step = PositionPolicy().logits.detach() - pol.logits.detach()
    grad = _one_window_reference(batch, cfg_for(mini_batch_groups=4))
    assert m["actor/grad_norm"] == pytest.approx(float(grad.norm()), rel=1e-12)
    assert m["actor/grad_norm"] > 100 * bound
    # clip_grad_norm_ scales by bound / (norm + 1e-6): the direction is kept, the norm is the bound
    assert float(step.norm()) <= bound * (1 + 1e-9)
    assert float(step.norm()) == pytest.approx(bound, rel=1e-3)
    assert torch.allclose(step / step.norm(), grad / grad.norm(), atol=1e-12)


def test_seq_mean_denominator_skips_fully_filtered_responses():
    # overlong filtering empties whole rows; under seq-mean they must not count as sequences
    batch = make_batch(PositionPolicy(), seed=3)
    n_trunc = int(batch.truncated.sum())
    assert 0 < n_trunc < batch.size
    cfg = cfg_for("seq-mean-token-mean", mini_batch_groups=4, overlong_filter=True)
    pol = PositionPolicy()
    update(batch, pol, torch.optim.SGD(pol.parameters(), lr=1.0), cfg, micro_batch_size=4)
    step = PositionPolicy().logits.detach() - pol.logits.detach()
    # the reference divides the per-response means by the count of unfiltered responses
    grad_all = _one_window_reference(batch, cfg)
    assert torch.allclose(step, grad_all, atol=1e-12)
    from dapo.loss import window_denominator

    loss_mask = batch.mask & ~batch.truncated.unsqueeze(-1)
    assert float(window_denominator(loss_mask, "seq-mean-token-mean")) == batch.size - n_trunc


def test_token_statistics_are_the_full_batch_statistics():
    # lr 0: every micro-batch sees the same policy, so the token-weighted combination over
    # windows and micro-batches must equal the statistics of one policy_loss over the batch
    from dapo.advantages import group_advantages
    from dapo.loss import ClipAgg, policy_loss

    batch = make_batch(PositionPolicy(seed=1), n_groups=4)
    pol = PositionPolicy()
    cfg = cfg_for(clip_ratio_c=1.5)
    m = update(batch, pol, torch.optim.SGD(pol.parameters(), lr=0.0), cfg, micro_batch_size=3)
    loss_mask = batch.mask & ~batch.truncated.unsqueeze(-1)
    _, st_ = policy_loss(
        pol(batch).logp,
        batch.old_logp,
        group_advantages(batch.rewards, 4),
        loss_mask,
        ClipAgg(eps_low=0.2, eps_high=0.28, clip_ratio_c=1.5),
    )
    for key in ("clipfrac_upper", "clipfrac_lower", "dual_clipfrac", "approx_kl", "upclip_old_prob"):
        assert m[f"actor/{key}"] == pytest.approx(float(st_[key]), abs=1e-12), key
    # loss and grad norm: per-step values (each window with its own normaliser), averaged over steps
    losses, norms = [], []
    adv = group_advantages(batch.rewards, 4)
    for rows in (torch.arange(0, 8), torch.arange(8, 16)):
        ref = PositionPolicy()
        w = batch.select(rows)
        loss, _ = policy_loss(
            ref(w).logp,
            w.old_logp,
            adv[rows],
            loss_mask[rows],
            ClipAgg(eps_low=0.2, eps_high=0.28, clip_ratio_c=1.5),
        )
        loss.backward()
        losses.append(float(loss.detach()))
        norms.append(float(ref.logits.grad.norm()))
    assert m["actor/loss"] == pytest.approx(sum(losses) / 2, abs=1e-12)
    assert m["actor/grad_norm"] == pytest.approx(sum(norms) / 2) and m[
        "actor/grad_norm_max"
    ] == pytest.approx(max(norms))
    assert 0 < m["actor/clipfrac_upper"] < 1 and 0 < m["actor/clipfrac_lower"] < 1
    assert m["actor/dual_clipfrac"] > 0 and m["actor/empty_windows"] == 0
    assert m["actor/loss_tokens"] == float(loss_mask.sum())


def test_fully_filtered_window_is_counted_not_stepped():
    batch = make_batch(PositionPolicy(), n_groups=4)
    trunc = batch.truncated.clone()
    trunc[:8] = True  # window 1 (groups 0-1) entirely overlong
    batch = RolloutBatch(**{**batch.__dict__, "truncated": trunc})
    pol = PositionPolicy()
    m = update(
        batch, pol, torch.optim.SGD(pol.parameters(), lr=0.1), cfg_for(overlong_filter=True, ppo_epochs=2)
    )
    assert m["actor/empty_windows"] == 2 and m["actor/optimizer_steps"] == 2 and m["actor/skipped_steps"] == 0
    assert m["actor/filtered_responses"] == float(trunc.sum())


def test_windows_are_shuffled_by_the_generator_only():
    batch = make_batch(PositionPolicy(), n_groups=4)
    cfg = cfg_for(ppo_epochs=2)
    pol = PositionPolicy()
    torch.manual_seed(123)  # the global RNG must not matter
    update(
        batch, pol, torch.optim.SGD(pol.parameters(), lr=0.5), cfg, generator=torch.Generator().manual_seed(7)
    )
    # the same thing by hand: each epoch, permute the groups with the same generator, windows in order
    ref, gen = PositionPolicy(), torch.Generator().manual_seed(7)
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    perms = []
    for _ in range(2):
        order = torch.randperm(4, generator=gen)
        perms.append(order.tolist())
        rows = (order.view(-1, 1) * 4 + torch.arange(4)).view(-1)
        update(batch.select(rows, group_size=4), ref, opt, cfg_for(ppo_epochs=1))
    assert perms[0] != [0, 1, 2, 3] or perms[1] != [0, 1, 2, 3]
    assert torch.allclose(pol.logits.detach(), ref.logits.detach(), atol=1e-10)


def test_entropy_metric_is_the_first_epochs():
    batch = make_batch(PositionPolicy(), truncate_some=False)
    pol = PositionPolicy()
    m = update(
        batch, pol, torch.optim.SGD(pol.parameters(), lr=5.0), cfg_for(mini_batch_groups=4, ppo_epochs=3)
    )
    first = PositionPolicy()(batch).entropy.detach()[batch.mask].mean()
    later = pol(batch).entropy.detach()[batch.mask].mean()
    assert abs(float(later - first)) > 1e-3  # the policy moved, so a wrong epoch would show
    assert m["actor/entropy"] == pytest.approx(float(first), abs=1e-12)


def test_skipped_window_statistics_stay_out_of_the_metrics():
    # window 1 = groups 0-1: its second micro-batch has a NaN loss, so the step is skipped;
    # window 2 steps. The metrics must be window 2's alone (at the initial policy).
    batch = make_batch(PositionPolicy(), truncate_some=False)
    bad_rows = torch.arange(4, 8)
    pol = PositionPolicy()

    def fn(mb):
        out = pol(mb)
        rows = mb.extras["row"]
        poison = torch.isin(rows, bad_rows).unsqueeze(-1).expand_as(out.logp)
        # added, not where(): where's backward would spread the NaN to every row's gradient
        return LogProbs(out.logp + torch.where(poison, math.nan, 0.0), out.entropy)

    batch = RolloutBatch(**{**batch.__dict__, "extras": {**batch.extras, "row": torch.arange(batch.size)}})
    m = update(batch, fn, torch.optim.SGD(pol.parameters(), lr=0.0), cfg_for(), micro_batch_size=4)
    assert m["actor/skipped_steps"] == 1 and m["actor/optimizer_steps"] == 1
    from dapo.advantages import group_advantages
    from dapo.loss import ClipAgg, policy_loss

    w2 = batch.select(torch.arange(8, 16))
    ref = PositionPolicy()(w2)
    _, st_ = policy_loss(
        ref.logp,
        w2.old_logp,
        group_advantages(batch.rewards, 4)[8:],
        w2.mask,
        ClipAgg(eps_low=0.2, eps_high=0.28, clip_ratio_c=3.0),
    )
    assert m["actor/approx_kl"] == pytest.approx(float(st_["approx_kl"]), abs=1e-12)
    assert m["actor/clipfrac_upper"] == pytest.approx(float(st_["clipfrac_upper"]), abs=1e-12)
    assert m["actor/entropy"] == pytest.approx(float(ref.entropy.detach()[w2.mask].mean()), abs=1e-12)
    assert m["actor/entropy"] != pytest.approx(
        float(PositionPolicy()(batch).entropy.detach()[batch.mask].mean())
    )


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


def _single_process_reference(agg):
    """Windows of 2 groups over 4 groups in one process. Rank r of 2 holds groups [2r, 2r+1];
    a window on each rank holds 1 group, so the global window is groups {0, 2} then {1, 3}:
    the single-process batch is reordered the same way."""
    pol = PositionPolicy()
    batch = make_batch(PositionPolicy(), n_groups=4)
    opt = torch.optim.SGD(pol.parameters(), lr=0.5)
    order = torch.tensor([0, 2, 1, 3])
    rows = (order.view(-1, 1) * 4 + torch.arange(4)).view(-1)
    update(batch.select(rows, group_size=4), pol, opt, cfg_for(agg, mini_batch_groups=2))
    return pol.logits.detach()


class _ThreadGroup:
    """An in-process stand-in for a 2-rank process group (one thread per rank): the DP
    arithmetic of :func:`update` checked in the fast suite. The gloo test below runs the
    same ranks as real processes."""

    def __init__(self, world):
        self.world, self.slots = world, [None] * world
        self.barrier = threading.Barrier(world, timeout=60)

    def all_reduce(self, rank, x):
        self.slots[rank] = x.detach().clone()
        self.barrier.wait()
        total = self.slots[0].clone()
        for other in self.slots[1:]:
            total += other
        self.barrier.wait()
        return total


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_ranks_as_threads_match_single_process(agg):
    world, group, results, errors = 2, _ThreadGroup(2), {}, []
    batch = make_batch(PositionPolicy(), n_groups=4)

    def rank_main(rank):
        try:
            pol = PositionPolicy()
            shard = batch.select(torch.arange(rank * 8, (rank + 1) * 8), group_size=4)

            def backward(loss):
                loss.backward()
                for p in pol.parameters():  # what DDP does: average gradients over ranks
                    p.grad.copy_(group.all_reduce(rank, p.grad) / world)

            m = update(
                shard,
                pol,
                torch.optim.SGD(pol.parameters(), lr=0.5),
                cfg_for(agg, mini_batch_groups=2),
                dp=DataParallel(world, lambda x: group.all_reduce(rank, x)),
                backward=backward,
            )
            results[rank] = (pol.logits.detach(), m)
        except BaseException as e:
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    ref = _single_process_reference(agg)
    for rank in range(world):
        assert torch.allclose(results[rank][0], ref, atol=1e-10)
        assert results[rank][1]["actor/optimizer_steps"] == 2


@pytest.mark.multiprocess
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_two_gloo_ranks_match_single_process(tmp_path, agg):
    ref = _single_process_reference(agg)
    out = tmp_path / "w.pt"
    run_function("test_update:ranks_update", nproc=2, agg=agg, out=str(out))
    assert torch.allclose(torch.load(out, weights_only=True), ref, atol=1e-10)
