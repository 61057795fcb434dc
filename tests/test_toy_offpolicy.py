"""Off-policy rollouts in the toy engine: staleness k (the engine samples with the policy
version s - k), partial rollouts (two versions in one response), engine precision; each
token keeps the log-prob of the version that sampled it, and k = 0 is today's run."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dapo import AlgoConfig
from dapo.offpolicy import correction_fields
from toybench import engine
from toybench.engine import engine_precision, partial_cuts, train_many
from toybench.experiments import REGISTRY
from toybench.policies import table_logp_entropy
from toybench.runner import RunSpec, train

CFG = AlgoConfig(
    group_size=4,
    train_groups=8,
    mini_batch_groups=4,
    eps_high=0.2,
    dynamic_sampling=False,
    overlong_filter=False,
    soft_overlong=False,
    expected_len=6,
    cache_len=2,
    max_grad_norm=None,
)


def _spec(**kw) -> RunSpec:
    return RunSpec(**{"task": "entropy", "cfg": CFG, "steps": 12, "lr": 20.0, "seed": 3, **kw})


def _same_logs(a, b) -> bool:
    def same(x, y):
        return x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))

    return all(
        m1.keys() == m2.keys() and all(same(m1[k], m2[k]) for k in m1)
        for l1, l2 in zip(a, b)
        for m1, m2 in zip(l1, l2)
    )


def test_on_policy_runs_are_unchanged_beside_off_policy_ones():
    """k = 0 is today's run bit for bit, alone or batched with stale, partial and bf16 runs."""
    exp = REGISTRY["entropy_collapse"]
    on = [exp.spec("symmetric", s, steps=30) for s in range(2)]
    off = [dataclasses.replace(on[0], staleness=2, partial=True), dataclasses.replace(on[1], mismatch="bf16")]
    alone = train_many(on)
    mixed = train_many(on + off)
    assert _same_logs(alone, mixed[:2])
    assert not any(k.startswith("mismatch/") for m in alone[0] for k in m)
    assert mixed[2][-1]["toy/staleness"] > 2.0 and mixed[3][-1]["mismatch/logp_gap"] > 0


def test_a_frozen_policy_has_no_staleness_to_correct():
    """lr = 0: every version is the same table, so a stale run is the on-policy run and its
    engine agrees with the trainer exactly."""
    on, stale = train_many([_spec(lr=0.0), _spec(lr=0.0, staleness=4, partial=True)])
    for m_on, m_off in zip(on, stale):
        assert m_on["toy/expected_accuracy"] == m_off["toy/expected_accuracy"]
        assert m_on["rollout/accuracy"] == m_off["rollout/accuracy"]
        assert m_off["mismatch/k3_kl"] == 0.0 and m_off["mismatch/logp_gap"] == 0.0


class _Spy(engine._Engine):
    """Records each step's tables and the engine's tables and log-probs."""

    def __init__(self, specs):
        super().__init__(specs)
        self.seen = []

    def correct(self, batch, old_logp, loss_mask):
        new, old = self.behaviour
        versions = {v: t.clone() for v, t in self.versions.items()}
        roll = self.behaviour_logp(batch)
        self.seen.append((self.step, versions, new.clone(), old.clone(), dict(batch), roll))
        return super().correct(batch, old_logp, loss_mask)


@pytest.mark.parametrize("k", [1, 3])
def test_each_token_keeps_the_log_prob_of_the_version_that_sampled_it(k):
    specs = [_spec(staleness=k), _spec(seed=4, staleness=k, partial=True)]
    spy = _Spy(specs)
    spy.run(None)
    for step, versions, new, old, batch, roll in spy.seen:
        for r, spec in enumerate(specs):
            assert torch.equal(new[r], versions[max(step - k, 0)][r])
            want_old = versions[max(step - k - 1, 0)][r] if spec.partial else new[r]
            assert torch.equal(old[r], want_old)
        cut = batch["cut"]
        assert int(cut[0].max()) == 0  # not partial: no cut
        args = (batch["prompts"], batch["tokens"])
        lp_new, _ = table_logp_entropy(new, *args, run=batch["run"], entropy=False)
        lp_old, _ = table_logp_entropy(old, *args, run=batch["run"], entropy=False)
        pos = torch.arange(roll.shape[-1])
        before = pos < cut.unsqueeze(-1)
        assert torch.equal(roll[before], lp_old[before]) and torch.equal(roll[~before], lp_new[~before])
        # the sampled tokens are possible under the version that sampled them
        assert bool((roll[batch["mask"]] > -math.inf).all())
    assert any(bool((b["cut"][1] > 0).any()) for *_, b, _ in spy.seen)


def test_staleness_from_starts_late_and_partial_cuts_have_their_own_stream():
    late = train_many([_spec(staleness=3, staleness_from=6)])[0]
    assert all(m["toy/staleness"] == 0.0 for m in late[:6]) and late[-1]["toy/staleness"] == 3.0
    a, b = partial_cuts(1, 2, 0, 50, 8), partial_cuts(1, 2, 0, 50, 8)
    assert torch.equal(a, b) and int(a.min()) >= 0 and int(a.max()) <= 8
    assert not torch.equal(a, partial_cuts(1, 2, 1, 50, 8))


def test_engine_precision_rounds_like_the_format():
    x = torch.tensor([1.0, 1.0 + 2**-9, 1.0 + 3 * 2**-9, -3.14159, 1000.0], dtype=torch.float64)
    bf = engine_precision(x, "bf16")
    assert bf.tolist()[:3] == [1.0, 1.0, 1.0 + 2**-7] and abs(bf[3] + 3.14159) <= 3.14159 * 2**-8
    f8 = engine_precision(x, "fp8")
    assert f8[0] == 1.0 and abs(f8[3] + 3.14159) <= 3.14159 * 2**-3 and f8[4] == 448.0  # e4m3 saturates
    with pytest.raises(ValueError, match="mismatch must be one of"):
        engine_precision(x, "fp4")
    bf16, fp8 = train_many([_spec(mismatch="bf16"), _spec(mismatch="fp8")])
    gap = [sum(m["mismatch/logp_gap"] for m in log) / len(log) for log in (bf16, fp8)]
    assert 0 < gap[0] < 0.01 < gap[1]


@pytest.mark.parametrize("name", ["token_tis", "seq_mis", "geo_rs", "bypass", "decoupled"])
def test_corrections_act_in_the_engine_as_in_dapo_update(name):
    """A stale run with a correction: the engine's metrics are dapo.offpolicy's, and on a
    frozen policy (nothing to correct) every correction is a no-op."""
    cfg = CFG.replace(**correction_fields(name))
    frozen = train_many([_spec(lr=0.0), _spec(lr=0.0, cfg=cfg, staleness=2)])
    assert frozen[0][-1]["toy/expected_accuracy"] == frozen[1][-1]["toy/expected_accuracy"]
    log = train_many([_spec(cfg=cfg, staleness=4)])[0]
    last = log[-1]
    assert last["mismatch/k3_kl"] > 0
    if cfg.rejection is not None:
        assert 0 <= last["mismatch/rejected_seq_frac"] <= 1
    if cfg.tis_cap is not None:
        assert 0 < last["mismatch/tis_weight_mean"] <= cfg.tis_cap


def test_the_per_run_loop_refuses_staleness_with_injected_engine_noise():
    """Stale log-probs come from the stale version; the health fault's noisy ones would
    silently replace them."""
    with pytest.raises(ValueError, match="without injected engine noise"):
        train(_spec(staleness=1, engine_noise=0.1))
    assert engine.batch_key(_spec(staleness=1)) is not None
