"""The successor losses (GSPO, CISPO, Clip-Cov, KL-Cov): their defining properties, and
equality with verl 0.9.1's implementations on values and gradients; the loss registry and
the peer adapters (verl's and TRL's own code) against this project's losses."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.loss import ClipAgg, policy_loss, ratio_stats, window_denominator
from dapo.losses import cispo_loss, clip_cov_loss, gspo_loss, kl_cov_loss, per_run
from dapo.registry import LossSpecError, parse_spec, resolve
from toybench.losses import CONTRACT, probe_contract, probe_knobs

AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def batch(seed: int, B: int = 6, T: int = 7, spread: float = 0.6, empty_row: bool = False):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.05
    logp = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * spread).requires_grad_(True)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    if empty_row:
        lengths[0] = 0
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    return logp, old, adv, mask


def clip_and_own(kw):
    """Keyword-form knobs (eps_low=..., agg=...) as the ClipAgg, and the loss's own parameters."""
    legacy = ClipAgg(0.0, 0.0).keywords()
    own = {k: v for k, v in kw.items() if k not in legacy}
    return ClipAgg.from_keywords(**{k: v for k, v in kw.items() if k in legacy}), own


def value_grad(fn, logp, old, adv, mask, **kw):
    lp = logp.detach().clone().requires_grad_(True)
    clip, own = clip_and_own(kw)
    out = fn(lp, old, adv, mask, clip, **own)
    loss = out[0] if isinstance(out, tuple) else out
    loss.backward()
    return float(loss.detach()), lp.grad.clone()


KNOBS = dict(eps_low=0.2, eps_high=0.28, clip_ratio_c=None, norm_const=7)


# ---- defining properties ------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), agg=st.sampled_from(AGGS))
def test_gspo_and_cispo_on_policy_equal_the_policy_gradient(seed, agg):
    """At r = 1 (logp = old) nothing is clipped: GSPO's gradient is the plain policy
    gradient, as DAPO's is; CISPO's is too (its weight sg[clip(1)] = 1)."""
    logp, _, adv, mask = batch(seed)
    old = logp.detach().clone()
    ref_v, ref_g = value_grad(policy_loss, logp, old, adv, mask, agg=agg, **KNOBS)
    for fn in (gspo_loss, cispo_loss):
        v, g = value_grad(fn, logp, old, adv, mask, agg=agg, **KNOBS)
        assert torch.allclose(g, ref_g, atol=1e-12)
    v, _ = value_grad(gspo_loss, logp, old, adv, mask, agg=agg, **KNOBS)
    assert v == pytest.approx(ref_v, abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), shift=st.floats(0.3, 2.0))
def test_gspo_clips_whole_sequences(seed, shift):
    """A response whose length-normalised ratio is beyond the bound on the side of its
    advantage gets zero gradient on every token; one inside gets a gradient on all of them."""
    logp, old, adv, mask = batch(seed, spread=0.0)
    adv = adv.abs() + 0.1
    with torch.no_grad():
        logp[0] = old[0] + shift  # s_0 = e^shift > 1 + eps_high
        logp[1] = old[1]  # s_1 = 1
    _, g = value_grad(gspo_loss, logp, old, adv, mask, agg="seq-mean-token-mean", **KNOBS)
    assert torch.all(g[0] == 0)
    assert torch.all(g[1][mask[1]] != 0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_cispo_keeps_a_gradient_on_every_token_ppo_drops(seed):
    """CISPO's per-token gradient is -sg[clip(r)] A / N for every loss token, clipped or
    not; PPO's (DAPO's) is exactly zero on tokens beyond the bound."""
    logp, old, adv, mask = batch(seed, spread=1.5)
    _, g = value_grad(cispo_loss, logp, old, adv, mask, agg="token-mean", **KNOBS)
    r = torch.exp(logp.detach() - old)
    expect = -r.clamp(0.8, 1.28) * adv.unsqueeze(-1) / mask.sum()
    assert torch.allclose(g[mask], expect[mask], atol=1e-12)
    _, g_ppo = value_grad(policy_loss, logp, old, adv, mask, agg="token-mean", **KNOBS)
    a = adv.unsqueeze(-1).expand_as(r)
    clipped = mask & (((a > 0) & (r > 1.28)) | ((a < 0) & (r < 0.8)))
    assert torch.all(g_ppo[clipped] == 0)
    assert torch.all(g[clipped] != 0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), ratio=st.floats(1e-4, 0.5))
def test_clip_cov_detaches_at_most_its_share_of_eligible_tokens(seed, ratio):
    logp, old, adv, mask = batch(seed, spread=0.3)
    torch.manual_seed(seed)
    _, g = value_grad(
        clip_cov_loss,
        logp,
        old,
        adv,
        mask,
        agg="token-mean",
        clip_cov_ratio=ratio,
        clip_cov_lb=-10.0,
        clip_cov_ub=10.0,
        **KNOBS,
    )
    _, g_ppo = value_grad(policy_loss, logp, old, adv, mask, agg="token-mean", **KNOBS)
    differs = (g != g_ppo) & mask
    assert int(differs.sum()) <= max(int(ratio * int(mask.sum())), 1)
    assert torch.all(g[differs] == 0)  # a chosen token's gradient is removed, nothing else changes


def test_clip_cov_with_no_eligible_token_is_ppo():
    logp, old, adv, mask = batch(3)
    v, g = value_grad(
        clip_cov_loss, logp, old, adv, mask, agg="token-mean", clip_cov_lb=1e6, clip_cov_ub=2e6, **KNOBS
    )
    v0, g0 = value_grad(policy_loss, logp, old, adv, mask, agg="token-mean", **KNOBS)
    assert v == pytest.approx(v0, abs=1e-12) and torch.allclose(g, g0, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), ratio=st.floats(1e-4, 0.5))
def test_kl_cov_penalises_exactly_k_top_covariance_tokens(seed, ratio):
    logp, old, adv, mask = batch(seed, spread=0.3)
    v, _ = value_grad(
        kl_cov_loss, logp, old, adv, mask, agg="token-mean", kl_cov_ratio=ratio, ppo_kl_coef=1.0, **KNOBS
    )
    r = torch.exp(logp.detach() - old)
    a = adv.unsqueeze(-1).expand_as(r)
    base = (-a * r)[mask].sum()
    k = max(1, int(int(mask.sum()) * ratio))
    lp = logp.detach()
    m = mask.double()
    cov = ((a - (a * m).sum() / m.sum()) * (lp - (lp * m).sum() / m.sum()))[mask]
    top = torch.topk(cov, k).indices
    penalty = (lp - old).abs()[mask][top].sum()
    assert v == pytest.approx(float((base + penalty) / mask.sum()), rel=1e-10)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), agg=st.sampled_from(AGGS))
def test_leading_run_dims_equal_one_run_at_a_time(seed, agg):
    """gspo/cispo take [R, B, T] natively, the covariance losses through per_run; either way
    each run's loss and gradient are its own."""
    runs = [batch(seed + i) for i in range(3)]
    stacked = [torch.stack([r[j].detach() for r in runs]) for j in range(4)]
    for fn in (gspo_loss, cispo_loss, per_run(kl_cov_loss), per_run(policy_loss)):
        lp = stacked[0].clone().requires_grad_(True)
        loss, stats = fn(lp, stacked[1], stacked[2], stacked[3], ClipAgg.from_keywords(agg=agg, **KNOBS))
        assert loss.shape == (3,) and stats["n_tokens"].shape == (3,)
        loss.sum().backward()
        for i, r in enumerate(runs):
            v, g = value_grad(fn, *r, agg=agg, **KNOBS)
            assert float(loss[i].detach()) == pytest.approx(v, abs=1e-12)
            assert torch.allclose(lp.grad[i], g, atol=1e-12)


def _counted(fn):
    """``fn`` and the list its calls are counted in."""
    calls = []

    def counted(*args, **kw):
        calls.append(1)
        return fn(*args, **kw)

    return counted, calls


def _item_branch(logp, old_logp, advantages, mask, clip):
    """A loss written for one batch that branches on a value (vmap cannot run it)."""
    loss, stats = policy_loss(logp, old_logp, advantages, mask, clip)
    return (loss * 2.0 if float(mask.sum()) > 20 else loss), stats


def _stacked_value_grad(fn, runs, agg):
    stacked = [torch.stack([r[j].detach() for r in runs]) for j in range(4)]
    lp = stacked[0].clone().requires_grad_(True)
    den = window_denominator(stacked[3], agg, KNOBS["norm_const"])
    loss, stats = fn(lp, *stacked[1:], ClipAgg.from_keywords(agg=agg, agg_denominator=den, **KNOBS))
    loss.sum().backward()
    return loss.detach(), stats, lp.grad


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), agg=st.sampled_from(AGGS), n_runs=st.integers(1, 4))
def test_per_run_makes_one_call_where_vmap_gives_the_loop_bit_for_bit(seed, agg, n_runs):
    """A loss vmap can run is called once for all runs (after a first call that checks it
    against the loop), one vmap cannot run or that vmap changes is called once per run; either
    way every run's loss, stats and gradient are bit for bit the one-by-one calls'."""
    runs = [batch(seed + i, empty_row=i == 1) for i in range(n_runs)]
    calls_made = 0
    for fn, vectorised in ((policy_loss, True), (_item_branch, False)):
        ref = _stacked_value_grad(per_run(fn, vectorise=False), runs, agg)
        counted, calls = _counted(fn)
        lifted = per_run(counted)
        for call in range(3):
            loss, stats, grad = _stacked_value_grad(lifted, runs, agg)
            assert torch.equal(loss, ref[0]) and torch.equal(grad, ref[2]), (fn.__name__, call)
            for k, v in ref[1].items():
                assert torch.equal(stats[k].nan_to_num(), v.nan_to_num()), k
        # first call: the loop, then one vmap attempt (it raises at once for _item_branch)
        first = n_runs + 1
        calls_made = len(calls)
        assert calls_made == (first + 2 if vectorised else first + 2 * n_runs), fn.__name__


def _bare(logp, old_logp, advantages, mask, clip):
    """A loss written for one batch that returns no stats at all."""
    return policy_loss(logp, old_logp, advantages, mask, clip)[0]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), agg=st.sampled_from(AGGS), n_runs=st.integers(1, 4))
def test_per_run_measures_the_stats_a_loss_leaves_out_as_each_run_alone_gives_them(seed, agg, n_runs):
    """The keys a loss does not return are measured once over all runs, outside its calls:
    each run's values are bit for bit ratio_stats on that run alone (so a metric does not
    depend on which runs share a call), on the loop and, from the second call, under vmap;
    the keys a loss returns are its own."""
    runs = [batch(seed + i, empty_row=i == 1) for i in range(n_runs)]
    alone = [
        ratio_stats(lp.detach(), old, adv, m, ClipAgg(eps_low=0.2, eps_high=0.28)) for lp, old, adv, m in runs
    ]

    def own_n_tokens(logp, old_logp, advantages, mask, clip):
        return _bare(logp, old_logp, advantages, mask, clip), {"n_tokens": mask.sum() * 0 + 7.0}

    for vectorise in (False, True):
        lifted = per_run(_bare, vectorise=vectorise)
        for _ in range(2):  # with vectorise: the checking first call, then vmap alone
            _, stats, _ = _stacked_value_grad(lifted, runs, agg)
            assert list(stats) == list(alone[0])
            for i in range(n_runs):
                for k, v in alone[i].items():
                    assert torch.equal(stats[k][i].nan_to_num(), v.nan_to_num()), (k, i, vectorise)
        _, stats, _ = _stacked_value_grad(per_run(own_n_tokens, vectorise=vectorise), runs, agg)
        assert torch.equal(stats["n_tokens"], torch.full((n_runs,), 7.0, dtype=stats["n_tokens"].dtype))
        assert torch.equal(stats["approx_kl"], torch.stack([a["approx_kl"] for a in alone]))


def test_per_run_keeps_the_loop_for_a_loss_whose_calls_differ():
    """A loss with state across calls (each call scaled by its count) runs under vmap but not
    as the loop runs it: the first call sees the difference and the loss stays one call per
    run."""
    runs = [batch(i) for i in range(3)]
    count = [0]

    def scaled_by_call(logp, old_logp, advantages, mask, clip):
        count[0] += 1
        loss, stats = policy_loss(logp, old_logp, advantages, mask, clip)
        return loss * count[0], stats

    lifted = per_run(scaled_by_call)
    loss, _, _ = _stacked_value_grad(lifted, runs, "token-mean")
    assert count[0] == 4  # three runs, one vmap attempt that differed
    loss2, _, _ = _stacked_value_grad(lifted, runs, "token-mean")
    assert count[0] == 7  # one call per run from then on
    assert torch.allclose(
        loss2 / torch.tensor([5.0, 6.0, 7.0]), loss / torch.tensor([1.0, 2.0, 3.0]), rtol=1e-12
    )


# ---- against verl's code --------------------------------------------------------------------

need_verl = pytest.mark.skipif(
    not os.environ.get("DAPO_REQUIRE_PEERS") and not __import__("importlib").util.find_spec("verl"),
    reason="verl not installed (the peers extra; DAPO_REQUIRE_PEERS=1 makes this an error)",
)


@need_verl
@pytest.mark.parametrize(
    "name,fn",
    [
        ("vanilla", policy_loss),
        ("gspo", gspo_loss),
        ("cispo", cispo_loss),
        ("clip_cov", clip_cov_loss),
        ("kl_cov", kl_cov_loss),
    ],
)
@pytest.mark.parametrize("agg", AGGS)
def test_matches_verl_values_and_gradients(name, fn, agg):
    from dapo.peers import verl_loss

    verl = verl_loss(name)
    for seed in range(25):
        logp, old, adv, mask = batch(seed, B=8, T=9, spread=0.5 + seed / 20, empty_row=seed % 5 == 0)
        kw = dict(KNOBS, norm_const=9, agg=agg)
        extra = {}
        if name == "clip_cov":  # widen the covariance window and the share so tokens are chosen
            extra = dict(clip_cov_ratio=0.2, clip_cov_lb=-1.0, clip_cov_ub=5.0)
            verl = verl_loss(name, extra)
        if name == "kl_cov":
            extra = dict(kl_cov_ratio=0.2, ppo_kl_coef=0.1)
            verl = verl_loss(name, extra)
        torch.manual_seed(seed)
        ours = value_grad(fn, logp, old, adv, mask, **kw, **extra)
        torch.manual_seed(seed)
        theirs = value_grad(verl, logp, old, adv, mask, **kw)
        # verl divides each response's token sum by (count + 1e-8) in seq-mean-token-mean
        rel = 1e-7 if agg == "seq-mean-token-mean" else 1e-10
        assert ours[0] == pytest.approx(theirs[0], rel=rel, abs=1e-12), (name, agg, seed)
        assert torch.allclose(ours[1], theirs[1], rtol=rel, atol=1e-12), (name, agg, seed)


# ---- TRL's code against this project's aggregations -------------------------------------------

need_trl = pytest.mark.skipif(
    not os.environ.get("DAPO_REQUIRE_PEERS") and not __import__("importlib").util.find_spec("trl"),
    reason="trl not installed (the peers extra; DAPO_REQUIRE_PEERS=1 makes this an error)",
)


@need_trl
@pytest.mark.parametrize(
    "loss_type,agg",
    [
        ("dapo", "token-mean"),
        ("bnpo", "token-mean"),
        ("grpo", "seq-mean-token-mean"),
        ("dr_grpo", "seq-mean-token-sum-norm"),
    ],
)
def test_trl_loss_types_are_dapo_aggregations(loss_type, agg):
    """TRL's own _compute_loss (through the stand-in) equals policy_loss with the matching
    aggregation when every response has a loss token."""
    from dapo.peers import trl_loss

    trl = trl_loss(loss_type)
    for seed in range(10):
        logp, old, adv, mask = batch(seed, spread=0.8)
        kw = dict(eps_low=0.2, eps_high=0.28, norm_const=7)
        ours = value_grad(policy_loss, logp, old, adv, mask, agg=agg, **kw)
        theirs = value_grad(trl, logp, old, adv, mask, agg=agg, **kw)
        assert ours[0] == pytest.approx(theirs[0], rel=1e-9)
        assert torch.allclose(ours[1], theirs[1], rtol=1e-9, atol=1e-12)


@need_trl
def test_trl_dr_grpo_counts_responses_without_loss_tokens():
    """A peer difference kept on record: TRL's dr_grpo divides by every row of the batch
    (B x max_completion_length), responses with no loss token included (e.g. truncated ones
    under mask_truncated_completions); DAPO's seq-mean-token-sum-norm counts the responses
    that have one."""
    from dapo.peers import trl_loss

    logp, old, adv, mask = batch(1, empty_row=True)
    kw = dict(eps_low=0.2, eps_high=0.2, norm_const=7)
    ours, _ = value_grad(policy_loss, logp, old, adv, mask, agg="seq-mean-token-sum-norm", **kw)
    theirs, _ = value_grad(trl_loss("dr_grpo"), logp, old, adv, mask, **kw)
    n = mask.shape[0]
    assert theirs == pytest.approx(ours * (n - 1) / n, rel=1e-9)


@need_trl
def test_trl_cispo_caps_the_ratio_at_epsilon_high_absolute():
    """TRL's cispo reads epsilon_high as the cap of the ratio itself (5.0 recommended), not
    1 + eps, and has no lower bound: it equals cispo_loss with eps_high = cap - 1, eps_low ~ 1."""
    from dapo.peers import trl_loss

    logp, old, adv, mask = batch(2, spread=1.0)
    theirs = value_grad(trl_loss("cispo"), logp, old, adv, mask, eps_low=0.2, eps_high=1.5, norm_const=7)
    ours = value_grad(cispo_loss, logp, old, adv, mask, eps_low=1 - 1e-300, eps_high=0.5, agg="token-mean")
    assert ours[0] == pytest.approx(theirs[0], rel=1e-9)
    assert torch.allclose(ours[1], theirs[1], rtol=1e-9, atol=1e-12)


# ---- registry, specs, knob probe --------------------------------------------------------------


def test_spec_parsing_and_one_line_errors():
    assert parse_spec("clip_cov[clip_cov_ratio=0.02, clip_cov_lb=-1]") == (
        "clip_cov",
        {"clip_cov_ratio": 0.02, "clip_cov_lb": -1},
    )
    assert resolve("clip_cov[clip_cov_ratio=0.02]").params == {"clip_cov_ratio": 0.02}
    for bad, words in [
        ("nope", "not a built-in"),
        ("clip_cov[nope=1]", "unknown parameter 'nope'"),
        ("clip_cov[x]", "not key=value"),
        ("no_such_module_xyz:fn", "cannot import module"),
        ("dapo.loss:no_such_fn", "has no function"),
        ("dapo.loss:aggregate", "fewer than 4 positional"),
    ]:
        with pytest.raises(LossSpecError) as e:
            resolve(bad)
        assert words in str(e.value) and "\n" not in str(e.value)


def test_knob_probe_sees_every_knob_of_dapo_and_names_the_ones_a_loss_ignores():
    assert probe_knobs(resolve("dapo")) == dict.fromkeys(
        ("eps_low", "eps_high", "clip_ratio_c", "loss_agg"), True
    )
    sym = probe_knobs(resolve("broken_losses:symmetric_clip"))
    assert sym["eps_high"] is False and sym["eps_low"] is True
    per_seq = probe_knobs(resolve("broken_losses:per_sequence"))
    assert per_seq["loss_agg"] is False and per_seq["eps_high"] is True


def test_knob_probe_cannot_be_fooled_by_nan():
    """NaN != NaN: a loss that is NaN everywhere used to read as acting on every knob."""
    assert probe_knobs(resolve("broken_losses:always_nan")) == dict.fromkeys(
        ("eps_low", "eps_high", "clip_ratio_c", "loss_agg"), None
    )


def test_every_builtin_and_peer_loss_keeps_the_contract():
    """What every correct loss must satisfy, including the peers' own code (verl through
    global_batch_info, as its trainer calls it: its default 0 / 0 on a micro-batch with no
    loss token is not reached)."""
    from toybench.check_cli import all_specs

    specs, _ = all_specs()
    assert len(specs) >= 9
    import broken_losses

    specs += [f"broken_losses:{n}" for n in broken_losses.CORRECT]
    for spec in specs:
        assert probe_contract(resolve(spec)) == {}, spec


@pytest.mark.parametrize(
    "name,clause",
    [
        ("sign_flip", "gradient_sign"),
        ("inverted_ratio", "gradient_sign"),
        ("always_nan", "finite"),
        ("nan_on_empty_rows", "empty_rows"),
        ("nan_when_fully_masked", "fully_masked"),
        ("padding_counted", "padding"),
        ("mask_shifted", "padding"),
        ("dual_clip_everywhere", "dual_clip"),
        ("eos_dropped", "every_token"),
        ("dual_clip_below_one", "every_token"),
        ("first_token_only", "every_token"),
    ],
)
def test_the_contract_probe_names_each_broken_clause(name, clause):
    broken = probe_contract(resolve(f"broken_losses:{name}"))
    assert clause in broken and set(broken) <= set(CONTRACT)
    assert all("\n" not in text for text in broken.values())


def test_the_every_token_probe_names_what_it_measured_and_spares_a_few_detached_tokens():
    """EOS dropped from the loss is named by the tokens it measured (the last of each response),
    and the one-token sign row, which loses its only token to the same bug, does not add a
    second line blaming the sign; a loss that detaches a single token (Clip-Cov's selection,
    by design) keeps the clause."""
    import torch

    eos = probe_contract(resolve("broken_losses:eos_dropped"))
    assert set(eos) == {"every_token"}
    assert "d loss / d logp is 0 at the last token of each response (16 responses" in eos["every_token"]

    from dapo.registry import Loss

    dapo = resolve("dapo")

    def one_detached(logp, old_logp, advantages, mask, clip, *, is_weights=None):
        held = logp.clone()
        if logp.shape[-2] > 3 and logp.shape[-1] > 2:  # (the sign probe's batch has one token)
            held[..., 3, 2] = logp[..., 3, 2].detach()  # one token of one response
        return dapo.fn(held, old_logp, advantages, mask, clip)

    loss = Loss("test:one_detached", one_detached, dict(dapo.knobs), dapo.honours, (), "test", {}, None)
    assert "every_token" not in probe_contract(loss)

    def every_third_row_detached(logp, old_logp, advantages, mask, clip, *, is_weights=None):
        keep = (torch.arange(logp.shape[-2]) % 3 != 0).view(-1, 1)
        return dapo.fn(torch.where(keep, logp, logp.detach()), old_logp, advantages, mask, clip)

    rows = Loss("test:rows", every_third_row_detached, dict(dapo.knobs), dapo.honours, (), "test", {}, None)
    assert "every_token" not in probe_contract(rows)  # no class is zero on *every* response


def test_a_detached_loss_is_refused_in_one_line():
    with pytest.raises(LossSpecError, match="no gradient with respect to logp") as e:
        probe_contract(resolve("broken_losses:detached_output"))
    assert "\n" not in str(e.value)


def test_user_signatures_star_args_and_declared_knobs(tmp_path, monkeypatch):
    """A wrapper taking *args/**kwargs is a loss; dapo_knobs declares what it honours and a
    bad declaration is one line."""
    assert resolve("broken_losses:symmetric_only").honours == (
        "eps_low",
        "eps_high",
        "clip_ratio_c",
        "loss_agg",
    )
    assert resolve("broken_losses:decoupled_clip_no_dual").honours == ("eps_low", "eps_high")
    (tmp_path / "declares_badly.py").write_text(
        "from dapo.loss import policy_loss\n"
        "def f(*args, **kw):\n    return policy_loss(*args, **kw)\n"
        "f.dapo_knobs = ('eps_high', 'temperature')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(LossSpecError, match=r"dapo_knobs = .* must be a tuple of knob names"):
        resolve("declares_badly:f")


@pytest.mark.parametrize(
    "source,words",
    [
        (
            "raise RuntimeError('needs a GPU')\n",
            "cannot import module 'import_fails_{i}' (RuntimeError: needs a GPU)",
        ),
        ("def f(:\n", "cannot import module 'import_fails_{i}' (SyntaxError: invalid syntax at"),
        ("import no_such_dependency_xyz\n", "ModuleNotFoundError: No module named 'no_such_dependency_xyz'"),
        ("raise SystemExit(3)\n", "cannot import module 'import_fails_{i}' (SystemExit: 3)"),
    ],
)
def test_a_module_that_fails_at_import_is_one_line(source, words, tmp_path, monkeypatch):
    i = abs(hash(source)) % 10**6
    (tmp_path / f"import_fails_{i}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(LossSpecError) as e:
        resolve(f"import_fails_{i}:f")
    assert words.format(i=i) in str(e.value) and "\n" not in str(e.value)


def test_builtin_names_use_the_core_functions():
    assert resolve("dapo").fn is policy_loss
    assert resolve("dapo").knobs["eps_high"] == 0.28
    assert resolve("grpo").knobs["loss_agg"] == "seq-mean-token-mean"


def test_a_missing_peer_is_one_line_naming_the_install():
    from dapo.peers import PEERS_HINT, _require

    with pytest.raises(LossSpecError) as e:
        _require("no_such_peer_package.core")
    assert PEERS_HINT in str(e.value) and "\n" not in str(e.value)


@need_verl
def test_verl_divides_0_by_0_without_the_window_denominator():
    """On record: verl's agg_loss normalises by the mask it is given, so a micro-batch with
    no loss token is NaN unless the trainer passes the window's count (global_batch_info),
    which the adapter does from agg_denominator; then micro-batches sum to the window."""
    from dapo.peers import verl_loss

    for agg in AGGS:
        fn = verl_loss("vanilla")
        kw = dict(eps_low=0.2, eps_high=0.28, agg=agg, norm_const=7.0)
        logp, old, adv, mask = batch(3, B=6, T=7, empty_row=True)
        empty = torch.zeros_like(mask)
        assert torch.isnan(fn(logp, old, adv, empty, ClipAgg.from_keywords(**kw))[0])
        den = window_denominator(mask, agg, 7.0)
        value = fn(logp, old, adv, empty, ClipAgg.from_keywords(agg_denominator=den, **kw))[0]
        assert value == 0 and torch.isfinite(torch.autograd.grad(value, logp)[0]).all()
        whole = fn(logp, old, adv, mask, ClipAgg.from_keywords(**kw))[0]
        parts = sum(
            fn(logp[s], old[s], adv[s], mask[s], ClipAgg.from_keywords(agg_denominator=den, **kw))[0]
            for s in (slice(0, 2), slice(2, 6))
        )
        assert float(parts.detach()) == pytest.approx(float(whole.detach()), rel=1e-7), agg


def _keyword_form(
    logp, old_logp, advantages, mask, *, eps_low, eps_high, clip_ratio_c=None, agg="token-mean",
    agg_denominator=None, norm_const=None, is_weights=None,
):  # fmt: skip
    """A loss written against the keyword form of before (``dapo.loss.policy_loss``'s old signature)."""
    clip = ClipAgg(eps_low, eps_high, clip_ratio_c, agg, norm_const, agg_denominator)
    return policy_loss(logp, old_logp, advantages, mask, clip, is_weights=is_weights)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    agg=st.sampled_from(AGGS),
    dual=st.sampled_from([None, 1.5, 3.0]),
    weighted=st.booleans(),
    den=st.sampled_from([None, 5.0, 40.0]),
)
def test_the_keyword_form_runs_as_the_clip_form(seed, agg, dual, weighted, den):
    """``as_policy_loss``: a loss in the keyword form gets every setting of ``clip`` under its
    old name (value and gradient bit for bit the clip form's), off-policy weights only where it
    takes them, and a clip-form loss is left as it is."""
    from dapo.offpolicy import takes_weights
    from dapo.registry import as_policy_loss

    logp, old, adv, mask = batch(seed)
    clip = ClipAgg(0.2, 0.28, dual, agg, 7, den)
    w = {"is_weights": torch.linspace(0.5, 1.5, mask.numel(), dtype=torch.float64).view(mask.shape)}
    w = w if weighted else {}
    adapted = as_policy_loss(_keyword_form)
    assert as_policy_loss(policy_loss) is policy_loss and takes_weights(adapted)
    for a, b in zip(value_grad(adapted, logp, old, adv, mask, **clip.keywords(), **w),
                    value_grad(policy_loss, logp, old, adv, mask, **clip.keywords(), **w)):  # fmt: skip
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))

    def unweighted(logp, old_logp, advantages, mask, *, eps_low, eps_high, clip_ratio_c=None, agg="token-mean",
                   agg_denominator=None, norm_const=None):  # fmt: skip
        return _keyword_form(logp, old_logp, advantages, mask, **ClipAgg(eps_low, eps_high).keywords())

    assert not takes_weights(as_policy_loss(unweighted))  # tis_cap refuses it by name, not at a call
    assert ClipAgg.from_keywords(**clip.keywords()) == clip
