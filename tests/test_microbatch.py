"""Token-budget micro-batches: the bin packing (dapo.microbatch), dapo.update's
``micro_batches`` split (the same update as fixed-size micro-batches; empty micro-batches
change nothing) and the scale trainer's splitter."""

import math

import pytest
import torch
from factories import random_batch
from hypothesis import given
from hypothesis import strategies as st
from test_update import cfg_for as update_cfg

from dapo.loss import ClipAgg, policy_loss, window_denominator
from dapo.losses import cispo_loss, clip_cov_loss, gspo_loss, kl_cov_loss
from dapo.microbatch import equalize, token_budget_bins
from dapo.update import LogProbs, update

V, T = 5, 6

tokens_st = st.lists(st.integers(0, 300), max_size=40)
budget_st = st.integers(1, 400)


# ---- token_budget_bins / equalize ----------------------------------------------------


@given(tokens=tokens_st, budget=budget_st)
def test_bins_are_a_partition_within_budget_or_single(tokens, budget):
    bins = token_budget_bins(tokens, budget)
    flat = [i for b in bins for i in b]
    assert sorted(flat) == list(range(len(tokens)))  # every index exactly once
    assert all(b for b in bins)  # no empty bin
    for b in bins:
        assert sum(tokens[i] for i in b) <= budget or len(b) == 1
        assert b == sorted(b)


@given(tokens=tokens_st, budget=budget_st)
def test_bins_are_first_fit_no_two_bins_could_be_merged(tokens, budget):
    """First fit: a later bin's rows did not fit in any earlier bin, so any two bins
    together exceed the budget (a packing that wastes bins fails this)."""
    sums = [sum(tokens[i] for i in b) for b in token_budget_bins(tokens, budget)]
    for i in range(len(sums)):
        for j in range(i + 1, len(sums)):
            assert sums[i] + sums[j] > budget


@given(tokens=tokens_st, budget=budget_st)
def test_bins_are_deterministic_and_take_tensors(tokens, budget):
    a = token_budget_bins(tokens, budget)
    assert token_budget_bins(list(tokens), budget) == a
    assert token_budget_bins(torch.tensor(tokens, dtype=torch.long), budget) == a


@given(tokens=tokens_st, budget=budget_st, extra=st.integers(0, 5))
def test_equalize_pads_with_empty_bins(tokens, budget, extra):
    bins = token_budget_bins(tokens, budget)
    out = equalize(bins, len(bins) + extra)
    assert len(out) == len(bins) + extra
    assert out[: len(bins)] == bins and all(b == [] for b in out[len(bins) :])
    if bins:
        with pytest.raises(ValueError, match="below the number of bins"):
            equalize(bins, len(bins) - 1)


def test_bins_known_values():
    # decreasing order 5, 4, 3, 3, 2, 1 into bins of 8: [5, 3], [4, 3, 1], [2]
    assert token_budget_bins([5, 4, 3, 3, 2, 1], 8) == [[0, 2], [1, 3, 5], [4]]
    assert token_budget_bins([9, 2, 20], 10) == [[2], [0], [1]]  # over budget: alone
    assert token_budget_bins([], 10) == []
    assert token_budget_bins([0, 0, 3], 3) == [[0, 1, 2]]


@pytest.mark.parametrize("budget", [0, -1, 2.5, True])
def test_bad_budget_or_tokens_are_refused(budget):
    with pytest.raises(ValueError, match="budget"):
        token_budget_bins([1, 2], budget)
    with pytest.raises(ValueError, match=">= 0"):
        token_budget_bins([1, -2], 4)


# ---- dapo.update with micro_batches ---------------------------------------------------


class PositionPolicy(torch.nn.Module):
    """logits depend on the position only: tiny, exact (float64), differentiable."""

    def __init__(self, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.logits = torch.nn.Parameter(torch.randn(T, V, generator=g, dtype=torch.float64))
        self.sizes = []

    def __call__(self, mb):
        self.sizes.append(mb.size)
        lp = torch.log_softmax(self.logits, -1)
        tokens = mb.extras["tokens"]
        logp = lp.unsqueeze(0).expand(tokens.shape[0], -1, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        ent = -(lp.exp() * lp).sum(-1).unsqueeze(0).expand(tokens.shape[0], -1)
        return LogProbs(logp, ent)


def make_batch(n_groups=4, g=4, seed=0, rollout=True):
    from dapo.batch import RolloutBatch

    base = random_batch(n_groups, g, max_len=T, seed=seed, rollout=rollout)
    gen = torch.Generator().manual_seed(seed + 7)
    tokens = torch.randint(0, V, (base.size, T), generator=gen)
    with torch.no_grad():
        old = PositionPolicy()(type("M", (), {"size": base.size, "extras": {"tokens": tokens}})).logp
    old = torch.where(base.mask, old, torch.zeros_like(old))
    kw = {**base.__dict__, "old_logp": old, "extras": {"tokens": tokens}}
    if rollout:
        kw["rollout_logp"] = torch.where(base.mask, (old - 0.05).clamp(max=0), torch.zeros_like(old))
    return RolloutBatch(**kw)


def cfg_for(agg="token-mean", **kw):
    """test_update's config, with two epochs and TIS weights (both paths through update)."""
    return update_cfg(agg, **{"ppo_epochs": 2, "tis_cap": 1.5, **kw})


def same_metrics(a, b, tol=1e-10):
    assert a.keys() == b.keys()
    for k in a:
        assert (math.isnan(a[k]) and math.isnan(b[k])) or math.isclose(a[k], b[k], abs_tol=tol), (
            k,
            a[k],
            b[k],
        )


def budget_split(batch, budget, empties=0):
    """micro_batches: a window's rows in token-budget bins (by response length), with
    ``empties`` empty micro-batches spread among them (the first one first)."""

    def split(rows):
        parts = [
            rows[torch.tensor(b, dtype=torch.long)] for b in token_budget_bins(batch.lengths[rows], budget)
        ]
        for k in range(empties):
            parts.insert(k * (len(parts) + 1) // empties, rows[:0])
        return parts

    return split


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_token_budget_micro_batches_give_the_fixed_size_update(agg):
    cfg = cfg_for(agg, loss_norm_const=4)
    runs = []
    for split in ("rows", "budget"):
        batch = make_batch()
        pol = PositionPolicy()
        opt = torch.optim.SGD(pol.parameters(), lr=0.5)
        kw = {"micro_batch_size": 3} if split == "rows" else {"micro_batches": budget_split(batch, 9)}
        m = update(batch, pol, opt, cfg, generator=torch.Generator().manual_seed(1), **kw)
        runs.append((pol.logits.detach().clone(), m, pol.sizes))
    (w0, m0, s0), (w1, m1, s1) = runs
    assert m0["actor/optimizer_steps"] == 4  # 2 windows x 2 epochs
    assert s0 != s1  # the splits really differ
    assert not torch.allclose(w0, PositionPolicy().logits)
    assert torch.allclose(w0, w1, atol=1e-10)
    same_metrics(m0, m1)


def test_empty_micro_batches_change_nothing():
    runs = []
    for empties in (0, 2):
        batch = make_batch(seed=2)
        pol = PositionPolicy()
        opt = torch.optim.SGD(pol.parameters(), lr=0.5)
        m = update(batch, pol, opt, cfg_for(), micro_batches=budget_split(batch, 7, empties))
        runs.append((pol.logits.detach().clone(), m, pol.sizes))
    (w0, m0, s0), (w1, m1, s1) = runs
    assert 0 not in s0 and s1.count(0) == 2 * 4  # 2 per window, 2 windows x 2 epochs
    assert [s for s in s1 if s] == s0
    assert torch.equal(w0, w1)
    same_metrics(m0, m1, tol=0.0)


def test_micro_batches_must_partition_the_window():
    batch = make_batch()
    for bad in (lambda rows: [rows[:-1]], lambda rows: [rows, rows[:1]], lambda rows: []):
        pol = PositionPolicy()
        with pytest.raises(ValueError, match="each exactly once"):
            update(batch, pol, torch.optim.SGD(pol.parameters(), lr=0.1), cfg_for(), micro_batches=bad)


def test_select_of_an_empty_index():
    batch = make_batch()
    for index in ([], torch.tensor([], dtype=torch.long)):
        mb = batch.select(index)
        assert mb.size == 0 and mb.old_logp.shape == (0, T) and mb.mask.shape == (0, T)
        assert mb.lengths.shape == (0,) and mb.extras["tokens"].shape == (0, T)
        assert mb.rollout_logp is not None and mb.rollout_logp.shape == (0, T)


@pytest.mark.parametrize("fn", [policy_loss, gspo_loss, cispo_loss, clip_cov_loss, kl_cov_loss])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_losses_on_empty_inputs_are_a_finite_zero_on_the_graph(fn, agg):
    w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    logp = torch.zeros(0, T, dtype=torch.float64) + w
    mask = torch.zeros(0, T, dtype=torch.bool)
    full = torch.ones(2, T, dtype=torch.bool)
    loss, stats = fn(
        logp,
        logp.detach(),
        torch.zeros(0, dtype=torch.float64),
        mask,
        ClipAgg(0.2, 0.28, agg=agg, denominator=window_denominator(full, agg)),
    )
    assert loss.dim() == 0 and float(loss.detach()) == 0.0 and loss.requires_grad
    loss.backward()
    assert w.grad is not None and float(w.grad) == 0.0
    assert float(stats["n_tokens"]) == 0.0
    assert all(math.isfinite(float(stats[k])) for k in ("clipfrac_upper", "approx_kl", "ratio_mean"))


# ---- the scale trainer's splitter (torch only) ---------------------------------------


def test_token_budget_splitter_counts_prompt_and_response_and_pads_to_the_max():
    from dapo.batch import RolloutBatch
    from scale.learner.policy import row_tokens, token_budget_splitter

    base = make_batch(n_groups=2, g=4, rollout=False)
    plen = torch.tensor([2, 3, 1, 4, 2, 2, 5, 1])
    batch = RolloutBatch(**{**base.__dict__, "extras": {**base.extras, "prompt_len": plen}})
    tokens = torch.where(batch.lengths > 0, plen + batch.lengths, 0)
    assert torch.equal(row_tokens(batch), tokens)
    rows = torch.tensor([7, 1, 4, 2, 6])  # a window's rows, in no particular order
    parts = token_budget_splitter(batch, 6)(rows)
    want = [rows[torch.tensor(b)] for b in token_budget_bins(tokens[rows], 6)]
    assert [p.tolist() for p in parts] == [w.tolist() for w in want]
    assert sorted(torch.cat(parts).tolist()) == sorted(rows.tolist())
    seen = []

    def rank_max(n):
        seen.append(n)
        return n + 3

    padded = token_budget_splitter(batch, 6, all_reduce_max=rank_max)(rows)
    assert seen == [len(want)] and len(padded) == len(want) + 3
    assert [p.tolist() for p in padded[: len(want)]] == [w.tolist() for w in want]
    assert all(p.numel() == 0 and p.dtype == torch.long for p in padded[len(want) :])
