"""Off-policy corrections (dapo.offpolicy): equal to verl 0.9.1's rollout_corr_helper on
weights, rejection masks and mismatch metrics, to AReaL's decoupled PPO on loss and
gradient, and the properties a user relies on (detached, zero off the mask, identity when
the engine agrees with the trainer, per-run equal to one run)."""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dapo.batch import RolloutBatch
from dapo.config import REJECTION_OPTIONS, AlgoConfig, ConfigError
from dapo.loss import ClipAgg, policy_loss
from dapo.offpolicy import (
    CORRECTIONS,
    correct,
    correction_fields,
    finish,
    is_weights,
    mismatch_sums,
    rejection_mask,
)
from dapo.update import update

need_verl = pytest.mark.skipif(
    not os.environ.get("DAPO_REQUIRE_PEERS") and not __import__("importlib").util.find_spec("verl"),
    reason="verl not installed (the peers extra; DAPO_REQUIRE_PEERS=1 makes this an error)",
)


def _batch(seed: int, b: int = 6, t: int = 7, scale: float = 0.3, empty_rows: bool = False):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    roll = (old + scale * torch.randn(b, t, generator=g, dtype=torch.float64)).clamp(max=0)
    lengths = torch.randint(0 if empty_rows else 1, t + 1, (b,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    return old, roll, mask


# (rollout_is, threshold) pairs as verl's presets spell them, and arbitrary ones
IS_SPECS = [("token", 2.0), ("sequence", 2.0), ("token", "0.5_5.0"), ("sequence", "0.5_2.0"), ("token", 1.3)]


def _ours_is(log_ratio, mask, level, spec):
    if isinstance(spec, str) and "_" in spec:
        lo, hi = (float(x) for x in spec.split("_"))
        return is_weights(log_ratio, mask, level, hi, lo)
    return is_weights(log_ratio, mask, level, float(spec))


@need_verl
@given(st.integers(0, 10_000), st.sampled_from(IS_SPECS), st.floats(0.01, 2.0))
def test_weights_equal_verls(seed, spec, scale):
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    old, roll, mask = _batch(seed, scale=scale)
    level, threshold = spec
    ours = _ours_is(old - roll, mask, level, threshold)
    if not bool(ours.any()):
        # on record (verl 0.9.1): when a band zeroes every weight of the batch, verl's
        # effective-sample-size metric divides by zero and the step dies
        with pytest.raises(ZeroDivisionError):
            compute_rollout_correction_weights(old - roll, mask.double(), level, threshold)
        return
    theirs, _ = compute_rollout_correction_weights(old - roll, mask.double(), level, threshold)
    assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-12)


RS_SPECS = [
    ("token_k1", "0.5_2.0"),
    ("token_k2", "0.05"),
    ("token_k3", "0.02"),
    ("seq_sum_k1", "0.5_2.0"),
    ("seq_sum_k3", "0.2"),
    ("seq_mean_k1", "0.999_1.001"),
    ("seq_mean_k1", "0.9_1.1"),
    ("seq_mean_k1", 1.2),
    ("seq_mean_k2", "0.01"),
    ("seq_mean_k3", "0.01"),
    ("seq_max_k2", "0.1"),
    ("seq_max_k3", "0.1"),
    ("token_k1,seq_mean_k3", "0.8_1.25,0.02"),
]


@need_verl
@given(st.integers(0, 10_000), st.sampled_from(RS_SPECS), st.floats(0.01, 1.0))
def test_rejection_equals_verls(seed, spec, scale):
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask

    old, roll, mask = _batch(seed, scale=scale, empty_rows=True)
    options, threshold = spec
    theirs, _ = compute_rollout_rejection_mask(old - roll, mask.double(), options, threshold)
    ours = rejection_mask(old - roll, mask, options, threshold)
    assert torch.equal(ours, theirs.bool())


@need_verl
@given(st.integers(0, 10_000), st.floats(0.0, 2.0))
def test_mismatch_metrics_equal_verls(seed, scale):
    from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics

    old, roll, mask = _batch(seed, scale=scale)  # every row has a token (verl averages over rows)
    theirs = compute_offpolicy_metrics(old, roll, mask.double())
    ours = {
        k.split("/")[1]: finish(k, float(s), float(c)) for k, (s, c) in mismatch_sums(old, roll, mask).items()
    }
    for name in ("kl", "k3_kl", "chi2_token", "chi2_seq", "ppl_ratio", "log_ppl_abs_diff"):
        assert ours[name] == pytest.approx(theirs[name], rel=1e-6, abs=1e-7), name


@need_verl
def test_every_rejection_option_of_verl_is_ours():
    from verl.trainer.ppo.rollout_corr_helper import SUPPORTED_ROLLOUT_RS_OPTIONS

    assert set(REJECTION_OPTIONS) == SUPPORTED_ROLLOUT_RS_OPTIONS


@need_verl
def test_weighted_dapo_loss_equals_verls_vanilla_with_rollout_is_weights():
    """The weights reach the loss as verl's trainer applies them (after the clip and the
    dual clip), value and gradient."""
    from dapo.peers import verl_loss

    old, roll, mask = _batch(3, scale=0.5)
    g = torch.Generator().manual_seed(4)
    logp = (old + 0.3 * torch.randn(old.shape, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(old.shape[0], generator=g, dtype=torch.float64)
    w = is_weights(old - roll, mask, "sequence", 2.0)
    clip = ClipAgg(0.2, 0.28, clip_ratio_c=3.0, agg="token-mean")
    ours, _ = policy_loss(logp, old, adv, mask, clip, is_weights=w)
    (g_ours,) = torch.autograd.grad(ours, logp)
    theirs, _ = verl_loss("vanilla")(logp, old, adv, mask, clip, is_weights=w)
    (g_theirs,) = torch.autograd.grad(theirs, logp)
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-9)
    assert torch.allclose(g_ours, g_theirs, atol=1e-12)


def _areal_decoupled_loss(logp, prox, behav, adv, mask, eps_low, eps_high, cap):
    """AReaL's ``ppo_actor_loss_fn`` with ``use_decoupled_loss`` (areal/utils/functional.py,
    token level, no dual clip), restated: the clipped ratio against the proximal policy,
    times ``exp(prox - behav)`` where that is <= cap and 0 elsewhere, summed over the loss
    mask / its count."""
    ratio = torch.where(mask, torch.exp(logp - prox), torch.zeros_like(logp))
    adv = adv.unsqueeze(-1).expand_as(logp)
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high))
    w = torch.exp(prox - behav)
    keep = (w <= cap) & mask
    pg = pg * torch.where(keep, w, torch.zeros_like(w))
    return torch.where(mask, pg, torch.zeros_like(pg)).sum() / mask.sum()


@given(st.integers(0, 10_000), st.floats(1.5, 10.0), st.floats(0.05, 1.5))
def test_decoupled_preset_equals_areals_decoupled_ppo(seed, cap, scale):
    old, roll, mask = _batch(seed, scale=scale)
    g = torch.Generator().manual_seed(seed + 1)
    logp = (old + 0.3 * torch.randn(old.shape, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(old.shape[0], generator=g, dtype=torch.float64)
    cfg = AlgoConfig(**{**correction_fields("decoupled"), "tis_cap": cap})
    corr = correct(old, roll, mask, mask, cfg)
    ours, _ = policy_loss(
        logp, old, adv, corr.mask, ClipAgg(eps_low=0.2, eps_high=0.28), is_weights=corr.weights
    )
    theirs = _areal_decoupled_loss(logp, old, roll, adv, mask, 0.2, 0.28, cap)
    (g1,) = torch.autograd.grad(ours, logp)
    (g2,) = torch.autograd.grad(theirs, logp)
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-9, abs=1e-12)
    assert torch.allclose(g1, g2, atol=1e-12)


# ---- properties ------------------------------------------------------------------------------


@given(st.integers(0, 10_000), st.sampled_from(IS_SPECS))
def test_weights_are_detached_bounded_and_zero_off_the_mask(seed, spec):
    old, roll, mask = _batch(seed, scale=1.0, empty_rows=True)
    old.requires_grad_(True)
    w = _ours_is(old - roll, mask, *spec)
    upper = float(str(spec[1]).split("_")[-1])
    assert not w.requires_grad
    assert torch.all(w[~mask] == 0) and torch.all(w >= 0) and torch.all(w <= upper * (1 + 1e-12))
    if spec[0] == "sequence":  # one weight per response
        for row, m in zip(w, mask):
            assert len(set(row[m].tolist())) <= 1


@given(st.integers(0, 10_000), st.sampled_from(sorted(CORRECTIONS)))
def test_an_engine_that_agrees_changes_nothing(seed, name):
    """rollout_logp == old_logp: every weight 1, nothing rejected, metrics at their ideal."""
    old, _, mask = _batch(seed, empty_rows=True)
    cfg = AlgoConfig(**correction_fields(name))
    corr = correct(old, old, mask, mask, cfg)
    assert torch.equal(corr.mask, mask)
    if corr.weights is not None:
        assert torch.equal(corr.weights[mask], torch.ones(int(mask.sum()), dtype=torch.float64))
    values = {k: finish(k, float(s), float(c)) for k, (s, c) in corr.sums.items()}
    for k in (
        "mismatch/kl",
        "mismatch/k3_kl",
        "mismatch/chi2_token",
        "mismatch/chi2_seq",
        "mismatch/logp_gap",
    ):
        assert values[k] == pytest.approx(0.0, abs=1e-12), k
    assert values["mismatch/ppl_ratio"] == pytest.approx(1.0)


@given(st.integers(0, 10_000), st.sampled_from(sorted(CORRECTIONS)))
def test_leading_run_dimensions_equal_one_run_at_a_time(seed, name):
    cfg = AlgoConfig(**correction_fields(name))
    runs = [_batch(seed + r, scale=0.4, empty_rows=True) for r in range(3)]
    old, roll, mask = (torch.stack([r[i] for r in runs]) for i in range(3))
    both = correct(old, roll, mask, mask, cfg)
    for r, (o, ro, m) in enumerate(runs):
        one = correct(o, ro, m, m, cfg)
        assert torch.equal(both.mask[r], one.mask)
        if one.weights is not None:
            assert torch.allclose(both.weights[r], one.weights, rtol=0, atol=0)
        for k, (s, c) in one.sums.items():
            assert float(both.sums[k][0][r]) == pytest.approx(float(s), rel=1e-12, abs=1e-12), k
            assert float(both.sums[k][1][r]) == float(c)


def test_sequence_rejection_removes_whole_responses_and_known_values():
    # one response matches the trainer, one is off by log 2 on a single token
    old = torch.zeros(2, 3, dtype=torch.float64)
    roll = torch.tensor([[0.0, 0.0, 0.0], [0.0, -math.log(2.0), 0.0]], dtype=torch.float64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    kept = rejection_mask(old - roll, mask, "seq_mean_k1", "0.9_1.1")  # geometric mean 2^(1/3)
    assert kept.tolist() == [[True] * 3, [False] * 3]
    # verl compares k1 = -log rho with the logs of the band, so "lower_upper" keeps rho in
    # [1/upper, 1/lower]: rho = 2 passes "0.5_1.9" and fails "0.6_2.5"
    assert rejection_mask(old - roll, mask, "token_k1", "0.5_1.9").all()
    kept = rejection_mask(old - roll, mask, "token_k1", "0.6_2.5")
    assert kept.tolist() == [[True] * 3, [True, False, True]]
    w = is_weights(old - roll, mask, "sequence", 5.0)
    assert w[1].tolist() == pytest.approx([2.0, 2.0, 2.0])
    assert is_weights(old - roll, mask, "token", 5.0, 0.0)[1].tolist() == pytest.approx([1.0, 2.0, 1.0])
    assert is_weights(old - roll, mask, "token", 1.5, 0.0)[1].tolist() == pytest.approx([1.0, 0.0, 1.0])
    assert is_weights(old - roll, mask, "token", 1.5)[1].tolist() == pytest.approx([1.0, 1.5, 1.0])


@pytest.mark.parametrize(
    "changes, field, message",
    [
        (
            {"rejection": "seq_mean_k4", "rejection_threshold": "0.01"},
            "rejection",
            "unknown rejection option",
        ),
        ({"rejection": "seq_mean_k1"}, "rejection_threshold", "is required with rejection"),
        (
            {"rejection": "seq_mean_k1", "rejection_threshold": "2_1"},
            "rejection",
            "threshold '2_1' of seq_mean_k1",
        ),
        ({"rejection": "seq_mean_k3", "rejection_threshold": "0.1_1"}, "rejection", "positive upper bound"),
        (
            {"rejection": "token_k1,seq_mean_k3", "rejection_threshold": "1,2,3"},
            "rejection",
            "3 thresholds for 2",
        ),
        ({"is_lower": 0.5}, "is_lower", "needs tis_cap"),
        ({"tis_cap": 2.0, "is_lower": 1.5}, "is_lower", "must lie in [0, 1]"),
        ({"is_level": "seq"}, "is_level", "must be 'token' or 'sequence'"),
        ({"behaviour_clip": True, "tis_cap": 2.0}, "behaviour_clip", "takes no tis_cap or rejection"),
    ],
)
def test_bad_correction_configs_name_the_field(changes, field, message):
    with pytest.raises(ConfigError) as e:
        AlgoConfig(**changes)
    assert e.value.field == field and message in e.value.message


def test_unknown_correction_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown correction 'tis'; known: none, bypass"):
        correction_fields("tis")


# ---- through dapo.update ---------------------------------------------------------------------


class _Table(torch.nn.Module):
    def __init__(self, t: int = 7, v: int = 5):
        super().__init__()
        self.logits = torch.nn.Parameter(
            torch.randn(t, v, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        )

    def __call__(self, mb):
        lp = torch.log_softmax(self.logits, -1)
        tok = mb.extras["tokens"]
        return lp.unsqueeze(0).expand(tok.shape[0], -1, -1).gather(-1, tok.unsqueeze(-1)).squeeze(-1), None


def _rollout(scale: float = 0.5):
    g = torch.Generator().manual_seed(7)
    b, t = 8, 7
    tokens = torch.randint(0, 5, (b, t), generator=g)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    with torch.no_grad():
        old, _ = _Table()(type("M", (), {"extras": {"tokens": tokens}}))
    old = torch.where(mask, old, torch.zeros_like(old))
    roll = torch.where(
        mask, (old + scale * torch.randn(b, t, generator=g, dtype=torch.float64)).clamp(max=0), 0.0
    )
    correct_ = torch.tensor([True, False] * 4)
    return RolloutBatch(
        old_logp=old,
        mask=mask,
        lengths=lengths,
        truncated=torch.zeros(b, dtype=torch.bool),
        correct=correct_,
        rewards=correct_.double(),
        group_ids=torch.arange(b) // 4,
        group_size=4,
        rollout_logp=roll,
        extras={"tokens": tokens},
    )


def _step(batch, **changes):
    pol = _Table()
    cfg = AlgoConfig(
        group_size=4, train_groups=2, mini_batch_groups=2, expected_len=4, cache_len=3, **changes
    )
    m = update(batch, pol, torch.optim.SGD(pol.parameters(), lr=1.0), cfg)
    return pol.logits.detach().clone(), m


def test_bypass_is_the_ratio_against_the_engine():
    batch = _rollout()
    bypass, m = _step(batch, behaviour_clip=True)
    swapped = RolloutBatch(**{**batch.__dict__, "old_logp": batch.rollout_logp, "rollout_logp": None})
    plain, _ = _step(swapped)
    assert torch.equal(bypass, plain)
    assert m["mismatch/k3_kl"] > 0  # still measured against the trainer's recomputation


def test_rejecting_everything_takes_no_step_and_says_so():
    batch = _rollout(scale=2.0)
    _, m = _step(batch, rejection="seq_mean_k3", rejection_threshold="1e-9")
    assert m["mismatch/rejected_seq_frac"] == 1.0 and m["actor/optimizer_steps"] == 0
    assert m["actor/empty_windows"] == 1 and m["actor/loss_tokens"] == 0


def test_weights_for_a_loss_that_cannot_take_them_is_one_clear_error():
    from dapo.losses import gspo_loss

    pol = _Table()
    cfg = AlgoConfig(
        group_size=4, train_groups=2, mini_batch_groups=2, expected_len=4, cache_len=3, tis_cap=2.0
    )
    with pytest.raises(ValueError, match="^tis_cap: the policy loss gspo_loss takes no is_weights keyword"):
        update(_rollout(), pol, torch.optim.SGD(pol.parameters(), lr=1.0), cfg, loss_fn=gspo_loss)
    # a rejection needs no weights: any loss
    update(
        _rollout(),
        pol,
        torch.optim.SGD(pol.parameters(), lr=1.0),
        cfg.replace(tis_cap=None, rejection="token_k1", rejection_threshold="0.5_2"),
        loss_fn=gspo_loss,
    )
