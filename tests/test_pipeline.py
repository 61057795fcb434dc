"""Bounded staleness (dapo.pipeline): which version samples which batch, and its clock; the
learner's staleness check (scale.disaggregated) and the run config's placement rules."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.pipeline import behaviour_version, simulate, staleness, versions_needed

times = st.lists(st.floats(0.01, 10.0, allow_nan=False), min_size=1, max_size=40)


@given(st.integers(1, 500), st.integers(0, 16))
def test_a_batch_is_never_more_than_k_versions_old(step, k):
    v = behaviour_version(step, k)
    assert 0 <= v <= step - 1  # sampled by a version the learner already had
    assert staleness(step, k) == min(step - 1, k)
    assert behaviour_version(step, 0) == step - 1  # k = 0: the current weights, synchronous


@given(st.integers(1, 60), st.integers(0, 40), st.integers(0, 8))
def test_versions_needed_are_consecutive_and_cover_every_batch(first, n, k):
    last = first + n
    need = versions_needed(first, last, k)
    assert {behaviour_version(b, k) for b in range(first, last + 1)} == set(need)
    assert versions_needed(first, first - 1, k) == range(0)
    # a resume after step s with k batches in flight starts at s + k + 1, sampled by version s
    assert behaviour_version(first + k, k) == first - 1


@settings(max_examples=200)
@given(times, st.floats(0.01, 10.0), st.integers(0, 8), st.floats(0.0, 1.0))
def test_clock_across_random_timings(gen, train, k, sync):
    """Whatever the timings: every batch is generated only once its version exists and before
    it is trained; steps run in order; k = 0 is generate-then-train; more staleness is never
    slower; a step's batch waits at most as long as the synchronous loop would."""
    t = simulate(gen, train, k, sync)
    n = len(gen)
    for i in range(n):
        v = behaviour_version(i + 1, k)
        start = t.generated[i] - gen[i]
        assert start >= (t.trained[v - 1] if v else 0.0) - 1e-9  # the version existed
        assert t.generated[i] <= t.trained[i] - train - sync + 1e-9  # ready before its step ran
        if i:
            assert t.trained[i] >= t.trained[i - 1] + train + sync - 1e-9
    sync_loop = simulate(gen, train, 0, sync)
    assert math.isclose(sync_loop.total, sum(gen) + n * (train + sync), rel_tol=1e-9)
    assert sync_loop.generator_idle >= 0 and sync_loop.learner_idle >= 0
    assert t.total <= sync_loop.total + 1e-9
    assert simulate(gen, train, k + 1, sync).total <= t.total + 1e-9


def test_overlap_bound_one_step_off():
    """k >= 1 with equal times per step: the step costs max(generate, train), not their sum,
    once the pipeline is full."""
    t = simulate([2.0] * 20, 3.0, 1)
    assert math.isclose(t.trained[-1] - t.trained[-2], 3.0)
    t = simulate([3.0] * 20, 2.0, 1)
    assert math.isclose(t.trained[-1] - t.trained[-2], 3.0)
    with pytest.raises(ValueError, match="training times"):
        simulate([1.0, 1.0], [1.0], 1)
    with pytest.raises(ValueError, match="step must be"):
        behaviour_version(0, 1)


def _message(version, token_versions):
    v = torch.tensor(token_versions, dtype=torch.int32).view(1, -1)
    mask = torch.ones_like(v, dtype=torch.bool)
    return {
        "version": version,
        "groups": {"extras": {"version": v}, "mask": mask, "lengths": torch.tensor([v.numel()])},
    }


def test_learner_refuses_a_batch_older_than_k():
    """The learner checks every token's version before training on it (adversarial batches a
    buggy generator could send)."""
    from scale.disaggregated import GeneratorPool, StalenessError

    pool = GeneratorPool.__new__(GeneratorPool)
    import threading

    pool.k, pool.cond, pool.procs, pool.error = 2, threading.Condition(), [], None
    pool.received = {5: [_message(2, [2, 2, 2])]}
    parts, idle = pool.take(5)  # batch 5 is sampled by version 2
    assert len(parts) == 1 and idle >= 0
    pool.received = {5: [_message(1, [1, 1])]}
    with pytest.raises(StalenessError, match="version 1, not 2"):
        pool.take(5)
    pool.received = {5: [_message(2, [2, 1])]}  # one token too old
    with pytest.raises(StalenessError, match="versions 1..2"):
        pool.take(5)
    pool.received = {5: [_message(2, [2, 5])]}  # a token from the future
    with pytest.raises(StalenessError):
        pool.take(5)


@given(st.integers(1, 300), st.integers(0, 12))
def test_partial_rollouts_switch_forward_to_a_version_the_learner_has(step, k):
    """The version that continues a batch after the weight update is the next batch's own
    (a generator never goes back to an older version), exists before the learner trains the
    batch, and keeps every token within k."""
    from dapo.pipeline import partial_version

    p = partial_version(step, k)
    if p is None:
        assert k == 0 or step <= k
        return
    assert p == behaviour_version(step, k) + 1 == behaviour_version(step + 1, k)
    assert step - 1 - k <= p <= step - 1
    assert p in versions_needed(1, step, k, partial=True)
    assert versions_needed(1, step, k, partial=False)[-1] == p - 1


@given(st.integers(1, 16), st.integers(1, 16), st.integers(1, 8))
def test_generator_gpus_own_devices_when_there_are_enough_else_shared_and_said(gpus, learners, n):
    """Each generator gets a GPU no learner uses when the node has enough (weights over NCCL);
    otherwise the placement says it shares (weights through host memory), and every device
    named exists on the node."""
    from scale.disaggregated import generator_gpus

    placed, shared = generator_gpus(gpus, learners, n)
    assert len(placed) == n and all(0 <= g < gpus for g in placed)
    if gpus >= learners + n:
        assert not shared and sorted(placed) == list(range(learners, learners + n))
    else:
        assert shared


def test_generator_gpus_refuses_a_node_without_gpus():
    from scale.disaggregated import generator_gpus

    with pytest.raises(ValueError, match="no GPU"):
        generator_gpus(0, 1, 1)
