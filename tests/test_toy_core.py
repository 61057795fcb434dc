"""Known values for the toy regime's verdict path: the verifier, the rollout batch, the
training loop's accounting and the statistics that turn paired runs into a verdict. A bug
in any of them would silently change what `dapo toy run` reports."""

import dataclasses
import hashlib
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dapo import AlgoConfig
from dapo.metrics import SCHEMA
from dapo.rewards import config_reward
from toybench import runner
from toybench import stats as stats_module
from toybench.policies import TabularPolicy
from toybench.runner import RunSpec, make_policy, make_task, rollout_round, train
from toybench.stats import Interval, paired_interval, verdict
from toybench.tasks import EOS, TASKS, TokenTask, episode_end, verify

# ---- tasks: episode ends and the verifier -------------------------------------------


def test_episode_end_known_values():
    tokens = torch.tensor(
        [
            [3, 2, EOS, 1, 1],  # EOS third: length 3
            [1, 2, 3, 4, EOS],  # EOS beyond max_len = 4: truncated at 4
            [EOS, 1, 1, 1, 1],  # empty answer: length 1
            [2, 2, 2, EOS, 1],  # EOS exactly at the ceiling: length 4, not truncated
        ]
    )
    lengths, truncated = episode_end(tokens, 4)
    assert lengths.tolist() == [3, 4, 1, 4]
    assert truncated.tolist() == [False, True, False, False]


def _task():
    # one prompt, three paths: sure but needs 2 work tokens / dead end / coin flip needing 1
    return TokenTask(
        name="t",
        quality=torch.tensor([[1.0, 0.0, 0.5]], dtype=torch.float64),
        need_work=torch.tensor([[2, 0, 1]]),
        max_len=5,
        prior_path=torch.zeros(1, 3, dtype=torch.float64),
    )


def test_verify_known_values():
    task = _task()
    tokens = torch.tensor(
        [
            [1, 4, 4, EOS, 0],  # path 1, 2 work tokens: correct
            [1, 4, EOS, 0, 0],  # path 1, 1 work token: too short
            [2, EOS, 0, 0, 0],  # dead-end path
            [3, 4, EOS, 0, 0],  # coin flip, u = 0.4 < 0.5: correct
            [3, 4, EOS, 0, 0],  # coin flip, u = 0.6: wrong
            [3, 4, EOS, 0, 0],  # coin flip, u = 0.5 = quality: wrong (correct needs u < quality)
            [EOS, 0, 0, 0, 0],  # empty
            [1, 4, 4, 4, 4],  # truncated on a sound path: on track, 4 work tokens, wrong
            [2, 4, 4, 4, 4],  # truncated on a dead end: not on track
        ]
    )
    lengths, truncated = episode_end(tokens, 5)
    u = torch.tensor([0.0, 0.0, 0.0, 0.4, 0.6, 0.5, 0.0, 0.0, 0.0], dtype=torch.float64)
    out = verify(task, torch.zeros(9, dtype=torch.long), tokens, lengths, truncated, u)
    assert out.correct.tolist() == [True, False, False, True, False, False, False, False, False]
    assert out.on_track.tolist() == [False] * 7 + [True, False]
    assert out.path.tolist() == [1, 1, 2, 3, 3, 3, 0, 1, 2]
    assert out.work.tolist() == [2, 1, 0, 1, 1, 1, 0, 4, 4]


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("need_work", torch.zeros(1, 2, dtype=torch.long), "must all be"),
        ("prior_path", torch.zeros(2, 3), "must all be"),
        ("quality", torch.tensor([[1.0, 0.0, 1.5]]), "quality must lie in"),
        ("quality", torch.tensor([[1.0, -0.1, 0.5]]), "quality must lie in"),
        ("max_len", 1, "max_len must be >= 2"),
    ],
)
def test_task_validation_names_the_field(field, value, message):
    with pytest.raises(ValueError, match=f"^t: .*{message}"):
        dataclasses.replace(_task(), **{field: value})


def _first_token_probs(task):
    return (
        TabularPolicy(task, torch.Generator().manual_seed(0), init_noise=0.0)
        .first_token_probs(torch.arange(task.num_prompts))
        .detach()[:, 1:]
    )


def test_tasks_have_their_documented_design():
    # what each task's docstring promises, and what its experiment relies on
    e = TASKS["entropy"]()
    assert (
        e.quality.shape == (8, 6) and torch.all(e.quality[:, :5] == 0.5) and torch.all(e.quality[:, 5] == 0.9)
    )
    rare = _first_token_probs(e)[:, 5]
    assert torch.all((rare > 0.005) & (rare < 0.02)) and torch.all(e.need_work == 0)
    z = TASKS["zero_grad"]()
    assert torch.equal((z.quality == 1).sum(1), torch.ones(16, dtype=torch.long)) and set(
        z.quality.unique().tolist()
    ) == {0, 1}
    right = _first_token_probs(z)[z.quality == 1]
    assert (
        0.85 < float(right[0]) < 0.95 and 0.01 < float(right[-1]) < 0.03 and torch.all(right[1:] < right[:-1])
    )
    n = TASKS["length"]()
    right = _first_token_probs(n)[n.quality == 1]
    assert torch.all((right > 0.09) & (right < 0.37)) and torch.all(n.need_work == 0) and n.max_len == 24
    t = TASKS["truncation"]()
    assert t.max_len == 12 and torch.all(t.need_work[:4, :2] == 8) and torch.all(t.need_work[4:, :2] == 1)
    assert torch.all(t.quality == torch.tensor([0.9, 0.5, 0.0], dtype=torch.float64))
    c = TASKS["composite"]()
    assert c.max_len == 16 and torch.all(c.need_work[::3] == 7) and torch.all(c.need_work[1::3] == 2)
    assert torch.all(c.need_work[2::3] == 0)
    assert torch.all((_first_token_probs(c)[:, 1] > 0.03) & (_first_token_probs(c)[:, 1] < 0.05))
    assert torch.all(c.quality[:, 1] >= 0.8) and torch.all(c.quality[:, 2] == 0)


# A change to a task is a change to its experiment: the committed toy results and the
# docs' result tables were measured on these exact tasks. Update the digest together with them.
TASK_DIGESTS = {
    "entropy": "5926f09dafbca6cc",
    "zero_grad": "828f47830209a168",
    "length": "7c301621c4187adb",
    "truncation": "43e8175ed4b1a045",
    "composite": "3212f9238798656a",
    "prompt_pool": "3044fc125e36511d",  # reports/prompt_selection/ (dapo toy run prompt_selection)
}


@pytest.mark.parametrize("name", sorted(TASK_DIGESTS))
def test_task_definitions_match_the_committed_results(name):
    task = TASKS[name]()
    h = hashlib.sha256()
    for x in (task.quality, task.need_work, task.prior_path):
        h.update(str(x.dtype).encode())
        h.update(x.numpy().tobytes())
    h.update(repr((task.name, task.max_len, task.prior_stop, task.prior_empty)).encode())
    assert h.hexdigest()[:16] == TASK_DIGESTS[name], (
        f"task {name!r} changed: rerun `dapo toy run all --seeds 10` and the ladder, update the committed "
        "reports and README tables, then this digest"
    )


def test_monte_carlo_metrics_agree_with_the_exact_ones(monkeypatch):
    # _monte_carlo serves the GRU policy; on the tabular policy it must agree with the exact values
    monkeypatch.setattr(runner, "MC_SAMPLES", 3000)
    task = TASKS["composite"]()
    pol = TabularPolicy(task, torch.Generator().manual_seed(1), init_noise=0.5)
    acc, lengths = runner._monte_carlo(pol, task, torch.Generator().manual_seed(2))
    with torch.no_grad():
        exact_acc, exact_len = pol.exact_accuracy(), pol.exact_lengths()
    assert acc.shape == (12,) and lengths.shape == (12, 4)
    assert torch.allclose(acc, exact_acc, atol=4 * math.sqrt(0.25 / 3000))
    assert torch.allclose(lengths, exact_len, atol=0.3)
    # the tabular policy's metrics are the exact ones, per prompt then averaged
    with torch.no_grad():
        m = runner._policy_metrics(pol, torch.arange(12), runner._best_paths(task), step=0)
    q = task.quality
    assert m["toy/expected_accuracy"] == pytest.approx(float(exact_acc.mean()))
    assert m["toy/length_best_path"] == pytest.approx(
        float(exact_len.gather(1, q.argmax(1, keepdim=True)).mean())
    )
    assert m["toy/length_worst_path"] == pytest.approx(
        float(exact_len.gather(1, q.argmin(1, keepdim=True)).mean())
    )
    best = pol.first_token_probs(torch.arange(12)).detach().gather(1, runner._best_paths(task).unsqueeze(1))
    assert m["toy/best_path_prob"] == pytest.approx(float(best.mean()))


def test_gru_training_reports_monte_carlo_metrics():
    cfg = dataclasses.replace(CFG, expected_len=9, cache_len=3, dynamic_sampling=False)
    log = train(RunSpec(task="truncation", cfg=cfg, steps=2, lr=1e-2, policy="gru"))
    for m in log:
        assert 0 <= m["toy/expected_accuracy"] <= 1 and 0 <= m["toy/expected_accuracy_long"] <= 1
        assert 2 <= m["toy/length_best_path"] <= 12 and 2 <= m["toy/length_worst_path"] <= 12
    assert "toy/expected_accuracy_long" not in train(RunSpec(task="zero_grad", cfg=CFG, steps=1, lr=1.0))[0]


def test_task_sizes():
    task = _task()
    assert (task.num_prompts, task.num_paths, task.vocab_size) == (1, 3, 4)
    assert dataclasses.replace(task, max_len=2).max_len == 2  # path token + EOS is the shortest answer


def test_best_path_is_the_best_feasible_one_and_long_prompts():
    # path 1 is best but needs 11 work tokens: 11 + 2 > 12 tokens, infeasible; path 2 next best
    task = dataclasses.replace(
        _task(),
        quality=torch.tensor([[1.0, 0.7, 0.5]], dtype=torch.float64),
        need_work=torch.tensor([[11, 10, 1]]),
        max_len=12,
    )
    assert runner._best_paths(task).tolist() == [2]
    assert runner._best_paths(dataclasses.replace(task, max_len=13)).tolist() == [1]
    assert runner._long_prompts(task).tolist() == [True]  # best path needs 10 of 12: long
    t = TASKS["truncation"]()
    assert runner._long_prompts(t).tolist() == [True] * 4 + [False] * 4
    assert not runner._long_prompts(TASKS["truncation"](need_long=5)).any()  # 5 * 2 < 12
    assert runner._long_prompts(TASKS["truncation"](need_long=6)).tolist() == [True] * 4 + [False] * 4


# ---- runner: one rollout round and the training loop -----------------------------------

CFG = AlgoConfig(
    group_size=4,
    train_groups=4,
    mini_batch_groups=2,
    ppo_epochs=1,
    expected_len=4,
    cache_len=2,
    max_grad_norm=None,
    max_gen_rounds=3,
    dynamic_sampling=True,
    soft_overlong=True,
    overlong_filter=False,
)


def test_rollout_round_builds_whole_groups_with_consistent_tensors():
    spec = RunSpec(task="zero_grad", cfg=CFG, steps=1, lr=1.0)
    task = make_task(spec)
    gen = torch.Generator().manual_seed(0)
    policy = make_policy(spec, task, gen)
    rb = rollout_round(policy, task, CFG, 5, gen)
    prompts = rb.extras["prompts"]
    assert rb.size == 20 and rb.group_size == 4 and rb.num_groups == 5
    assert torch.equal(prompts.view(5, 4), prompts.view(5, 4)[:, :1].expand(5, 4))
    assert torch.equal(rb.group_ids, prompts)
    lengths, truncated = episode_end(rb.extras["tokens"], task.max_len)
    assert torch.equal(rb.lengths, lengths) and torch.equal(rb.truncated, truncated)
    assert torch.equal(rb.mask.sum(1), lengths)
    logp, _ = policy.logp_entropy(prompts, rb.extras["tokens"])
    assert torch.equal(rb.old_logp, torch.where(rb.mask, logp.detach(), torch.zeros_like(logp)))
    assert torch.equal(rb.rewards, config_reward(rb.correct, rb.lengths, CFG).double())
    assert rb.rewards.dtype == torch.float64 and not rb.old_logp.requires_grad
    assert torch.equal(rb.extras["path"], rb.extras["tokens"][:, 0])  # no empty answers at this prior


def test_runs_depend_on_their_generator_only():
    # paired arms share a seed: every draw must come from the run's generator, none from torch's global RNG
    cfg = dataclasses.replace(CFG, expected_len=9, cache_len=3)
    spec = RunSpec(task="truncation", cfg=cfg, steps=1, lr=1.0, init_noise=0.5)  # coin-flip qualities
    task = make_task(spec)
    batches = []
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        gen = torch.Generator().manual_seed(5)
        policy = make_policy(spec, task, gen)
        torch.manual_seed(global_seed + 10)
        batches.append((policy.state_dict(), rollout_round(policy, task, cfg, 40, gen)))
    (s0, a), (s1, b) = batches
    assert all(torch.equal(s0[k], s1[k]) for k in s0)
    for name in ("old_logp", "lengths", "correct", "rewards", "group_ids"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_make_policy_uses_the_spec():
    spec = RunSpec(task="zero_grad", cfg=CFG, steps=1, lr=1.0, init_noise=0.0)
    task = make_task(spec)
    probs = make_policy(spec, task, torch.Generator().manual_seed(0)).first_token_probs(torch.arange(16))
    assert torch.allclose(
        probs.detach(),
        torch.softmax(
            torch.cat([torch.full((16, 1), task.prior_empty, dtype=torch.float64), task.prior_path], 1), 1
        ).to(probs.dtype),
        atol=1e-6,
    )
    gru = make_policy(dataclasses.replace(spec, policy="gru"), task, torch.Generator().manual_seed(0))
    assert type(gru).__name__ == "GRUPolicy" and gru.task is task


def test_train_accounting_over_steps(monkeypatch):
    rounds = []
    real_round = runner.rollout_round

    def recording_round(*a, **kw):
        rounds.append(real_round(*a, **kw))
        return rounds[-1]

    monkeypatch.setattr(runner, "rollout_round", recording_round)
    cfg = dataclasses.replace(CFG, expected_len=9, cache_len=3, max_gen_rounds=4)
    log = train(RunSpec(task="truncation", cfg=cfg, steps=4, lr=5.0, seed=2))
    at = 0
    for m in log:  # the truncation share is over every round of the step, not the last
        mine = rounds[at : at + int(m["sampling/rounds"])]
        at += len(mine)
        trunc = sum(int(r.truncated.sum()) for r in mine)
        on = sum(int(r.extras["on_track"].sum()) for r in mine)
        assert m["toy/truncated_on_track"] == pytest.approx(on / trunc)
    assert at == len(rounds) and any(m["sampling/rounds"] > 1 for m in log)
    monkeypatch.undo()
    log = train(RunSpec(task="zero_grad", cfg=CFG, steps=4, lr=20.0, seed=3))
    assert [m["step"] for m in log] == [0.0, 1.0, 2.0, 3.0]
    responses = tokens = steps = 0.0
    for m in log:
        core = {k for k in m if not k.startswith(("toy/", "cost/"))} - {"step"}
        assert core <= set(SCHEMA), core - set(SCHEMA)
        responses += m["sampling/generated_groups"] * CFG.group_size
        tokens += m["sampling/generated_tokens"]
        steps += m["actor/optimizer_steps"]
        assert m["cost/responses_total"] == responses
        assert m["cost/tokens_total"] == tokens
        assert m["cost/optimizer_steps_total"] == steps
        assert 1 <= m["sampling/rounds"] <= CFG.max_gen_rounds
        assert m["sampling/generated_groups"] == m["sampling/rounds"] * CFG.train_groups
        assert 0 <= m["toy/best_path_prob"] <= 1 and 0 <= m["toy/expected_accuracy"] <= 1
    assert steps > 0
    assert (
        sum(m["sampling/rejected_all_correct"] + m["sampling/rejected_all_wrong"] for m in log) > 0
    )  # DS on
    assert log[-1]["toy/expected_accuracy"] > log[0]["toy/expected_accuracy"]  # lr 20 learns fast
    for m in log:
        assert (m["rollout/truncation_rate"] == 0) == math.isnan(m["toy/truncated_on_track"])
    eager = dataclasses.replace(CFG, expected_len=36, cache_len=4)  # a base model that stops at once
    short = train(
        RunSpec(task="truncation", cfg=eager, steps=1, lr=1.0, task_kwargs={"max_len": 40, "prior_stop": 3.0})
    )
    assert short[0]["rollout/truncation_rate"] == 0 and math.isnan(short[0]["toy/truncated_on_track"])
    assert log == train(RunSpec(task="zero_grad", cfg=CFG, steps=4, lr=20.0, seed=3))
    assert log != train(RunSpec(task="zero_grad", cfg=CFG, steps=4, lr=20.0, seed=4))


def test_train_fault_injection_and_truncation_metric(monkeypatch):
    cfg = dataclasses.replace(CFG, dynamic_sampling=False, expected_len=9, cache_len=3)
    spec = RunSpec(task="truncation", cfg=cfg, steps=3, lr=1.0, nan_steps=(1,), engine_noise=0.3)
    seen = []
    real_update = runner.update

    def recording_update(batch, *a, **kw):
        seen.append(batch)
        return real_update(batch, *a, **kw)

    monkeypatch.setattr(runner, "update", recording_update)
    log = train(spec)
    monkeypatch.undo()
    for b in seen:  # the simulated engine: old_logp + N(0, 0.3^2), clamped to <= 0, zero on padding
        assert b.rollout_logp.dtype == torch.float64
        assert torch.all(b.rollout_logp[b.mask] <= 0) and torch.all(b.rollout_logp[~b.mask] == 0)
        gap = (b.rollout_logp - b.old_logp)[b.mask & (b.rollout_logp < 0)]
        assert 0.2 < float(gap.std()) < 0.4
    assert [m["actor/skipped_steps"] for m in log] == [0.0, 2.0, 0.0]
    assert all(m["mismatch/logp_gap"] > 0 for m in log)
    assert "mismatch/logp_gap" not in train(dataclasses.replace(spec, engine_noise=0.0))[0]
    for m in log:
        if m["rollout/truncation_rate"] > 0:
            assert 0 <= m["toy/truncated_on_track"] <= 1
        else:
            assert math.isnan(m["toy/truncated_on_track"])


def test_train_rejects_bad_specs():
    with pytest.raises(ValueError, match="^unknown task 'nope'; known: "):
        train(RunSpec(task="nope", cfg=CFG, steps=1, lr=1.0))
    with pytest.raises(ValueError, match="^unknown policy 'mlp'; known: "):
        train(RunSpec(task="zero_grad", cfg=CFG, steps=1, lr=1.0, policy="mlp"))
    with pytest.raises(
        ValueError, match="^cfg.expected_len \\+ cfg.cache_len = 7 must equal the task's max_len 6$"
    ):
        train(RunSpec(task="zero_grad", cfg=dataclasses.replace(CFG, cache_len=3), steps=1, lr=1.0))


# ---- statistics: paired intervals and verdicts -----------------------------------------


def test_paired_interval_degenerate_cases():
    assert paired_interval([0.5] * 6) == Interval(0.5, 0.5, 0.5, 6)
    assert paired_interval([2.0]) == Interval(2.0, 2.0, 2.0, 1)
    assert paired_interval([1e6, 1e6 + 1e-7, 1e6]).low == paired_interval([1e6, 1e6 + 1e-7, 1e6]).high
    two = paired_interval([0.0, 1.0])
    assert two.low < two.high  # two different values are not degenerate
    empty = paired_interval([math.nan, math.nan])
    assert empty.n == 0 and all(math.isnan(x) for x in (empty.mean, empty.low, empty.high))


def test_paired_interval_is_the_committed_bootstrap():
    # BCa, 95%, 9999 resamples, seed 12345: the committed toy tables were computed this way
    d = [0.12, -0.03, 0.08, 0.15, 0.02, 0.09, -0.01, 0.11, 0.05, 0.07]
    iv = paired_interval(d)
    assert (iv.low, iv.high) == (pytest.approx(0.03, abs=1e-9), pytest.approx(0.098, abs=1e-9))
    assert paired_interval(d) == iv  # seeded: the same data give the same interval


def test_paired_interval_falls_back_to_percentiles_when_bca_fails(monkeypatch):
    class Failed:
        confidence_interval = type("CI", (), {"low": math.nan, "high": 0.1})()

    import scipy.stats

    monkeypatch.setattr(scipy.stats, "bootstrap", lambda *a, **kw: Failed())
    d = np.random.default_rng(0).normal(0.2, 1.0, size=12)  # continuous: every percentile distinct
    means = (
        np.random.default_rng(stats_module.BOOTSTRAP_SEED)
        .choice(d, (stats_module.BOOTSTRAP_RESAMPLES, 12))
        .mean(1)
    )
    lo, hi = np.percentile(means, [2.5, 97.5])
    assert paired_interval(d) == Interval(pytest.approx(d.mean()), pytest.approx(lo), pytest.approx(hi), 12)
    assert lo < d.mean() < hi
    assert paired_interval([1.0, math.nan, 3.0, 2.0]).n == 3


@given(st.lists(st.floats(-10, 10), min_size=3, max_size=12))
def test_paired_interval_brackets_the_mean_within_the_data(diffs):
    d = np.asarray(diffs)
    iv = paired_interval(d)
    assert iv.n == len(diffs)
    assert iv.mean == pytest.approx(float(d.mean()))
    assert iv.low <= iv.mean + 1e-9 and iv.mean <= iv.high + 1e-9
    assert iv.low >= d.min() - 1e-9 and iv.high <= d.max() + 1e-9


def test_paired_interval_known_verdicts():
    clear = paired_interval([0.9, 1.1, 1.0, 0.95, 1.05, 1.0, 0.98, 1.02, 1.01, 0.99])
    assert clear.low > 0.9 and clear.high < 1.1 and clear.excludes_zero()
    noisy = paired_interval([1.0, -1.0, 0.5, -0.5, 0.2, -0.2, 0.1, -0.1, 0.3, -0.3])
    assert noisy.low < 0 < noisy.high and not noisy.excludes_zero()


@pytest.mark.parametrize(
    "iv,expect,want",
    [
        (Interval(0.5, 0.1, 0.9, 10), "+", "reproduced"),
        (Interval(0.5, 0.1, 0.9, 10), "-", "reversed"),
        (Interval(-0.5, -0.9, -0.1, 10), "-", "reproduced"),
        (Interval(-0.5, -0.9, -0.1, 10), "+", "reversed"),
        (Interval(0.1, -0.2, 0.4, 10), "+", "not reproduced"),
        (Interval(0.0, 0.0, 0.0, 10), "+", "not reproduced"),
        (Interval(0.0, 0.0, 0.0, 10), "0", "no effect (as expected)"),
        (Interval(0.3, 0.1, 0.5, 10), "0", "EFFECT IN CONTROL"),
        (Interval(-0.3, -0.5, -0.1, 10), "0", "EFFECT IN CONTROL"),
        (Interval(0.3, 0.1, 0.5, 10), "?", "b > a"),
        (Interval(-0.3, -0.5, -0.1, 10), "?", "b < a"),
        (Interval(0.1, -0.1, 0.3, 10), "?", "no significant difference"),
        (Interval(math.nan, math.nan, math.nan, 0), "+", "undefined"),
    ],
)
def test_verdict_table(iv, expect, want):
    assert verdict(iv, expect) == want


def test_a_ladder_rung_that_lowers_accuracy_is_reversed_not_yes():
    """Each Table-1 technique raises accuracy in the paper: a rung whose step is a loss on both
    seed blocks reads ``reversed``, never ``yes``; a variant (no paper claim) reads ``lower``."""
    from dapo import PRESETS
    from toybench.ladder import ladder_steps

    rng = np.random.default_rng(0)
    seeds = list(range(20))
    gain = {"soft_overlong": -0.1, "clip_higher": 0.0}
    level, values = 0.5, {}
    for rung in PRESETS:
        level += gain.get(rung, 0.05)
        values[rung] = list(level + rng.normal(0, 0.01, 20) * (rung != "clip_higher"))
    values["dapo+excluded"] = list(np.array(values["dapo"]) - 0.1)
    rows = ladder_steps(values, seeds, {"discovery": seeds[:10], "confirmation": seeds[10:]})
    holds = {r["rung"]: r.get("holds") for r in rows}
    assert holds["soft_overlong"] == "reversed"
    assert holds["token_level"] == "yes" and holds["overlong_filter"] == "yes"
    assert holds["dapo+excluded"] == "lower"
