"""Bounded staleness (dapo.pipeline): which version samples which batch, and its clock; the
learner's staleness check (scale.placement.disaggregated) and the run config's placement rules."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo import RolloutBatch
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
    from scale.placement.disaggregated import GeneratorPool, StalenessError

    pool = GeneratorPool.__new__(GeneratorPool)
    import threading

    pool.k, pool.cond, pool.procs, pool.error = 2, threading.Condition(), [], None
    pool.floor, pool.restored = 0, set()
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


@given(st.integers(1, 300), st.integers(0, 12), st.integers(1, 6), st.booleans(), st.integers(0, 299))
def test_the_oldest_token_is_the_schedules_or_one_younger_only_after_a_dropped_first_round(
    step, k, rounds, partial, floor
):
    """The age of a batch's oldest kept token: :func:`staleness` exactly without partial
    rollouts or with one round; with them and more rounds also one younger (the later rounds
    run on the partial version), never older than k, never negative."""
    from dapo.pipeline import oldest_token_ages, partial_version

    floor = min(floor, step - 1)
    ages = oldest_token_ages(step, k, partial=partial, rounds=rounds, floor=floor)
    exact = staleness(step, k, floor)
    assert exact in ages and all(0 <= a <= k for a in ages)
    if not partial or rounds == 1 or partial_version(step, k, floor) is None:
        assert ages == (exact,)
    else:
        assert ages == (exact - 1, exact) and exact - 1 == step - 1 - partial_version(step, k, floor)


@given(st.integers(1, 16), st.integers(1, 16), st.integers(1, 8))
def test_generator_gpus_own_devices_when_there_are_enough_else_shared_and_said(gpus, learners, n):
    """Each generator gets a GPU no learner uses when the node has enough (weights over NCCL);
    otherwise the placement says it shares (weights through host memory), and every device
    named exists on the node."""
    from scale.placement.disaggregated import generator_gpus

    placed, shared = generator_gpus(gpus, learners, n)
    assert len(placed) == n and all(0 <= g < gpus for g in placed)
    if gpus >= learners + n:
        assert not shared and sorted(placed) == list(range(learners, learners + n))
    else:
        assert shared


@given(st.integers(1, 16), st.integers(1, 8), st.integers(1, 4), st.integers(2, 4))
def test_tensor_parallel_generators_get_devices_of_their_own_or_are_refused(gpus, learners, n, tp):
    """Generator ``i``'s ``tp`` processes get ``tp`` distinct GPUs after the learners' when the
    node has them; a tensor-parallel generator never shares (it would put two members of the
    weights group on one device): too few GPUs is one line naming the count."""
    from scale.placement.disaggregated import generator_gpus

    if gpus >= learners + n * tp:
        placed, shared = generator_gpus(gpus, learners, n, tp)
        assert not shared and placed == list(range(learners, learners + n * tp))
    else:
        with pytest.raises(ValueError, match=f"need {n * tp} GPUs of their own"):
            generator_gpus(gpus, learners, n, tp)


def test_generator_gpus_refuses_a_node_without_gpus():
    from scale.placement.disaggregated import generator_gpus

    with pytest.raises(ValueError, match="no GPU"):
        generator_gpus(0, 1, 1)


@given(st.integers(1, 300), st.integers(0, 12), st.integers(0, 300))
def test_after_a_resume_no_batch_waits_for_a_version_older_than_the_checkpoint(step, k, floor):
    """A resumed run holds no version older than its checkpoint's step (the floor): every
    batch is sampled by a version that exists, is never staler than k (fresher where the floor
    lifts it), the partial continuation never goes back and is the next batch's own version,
    and from batch floor + k + 1 on the schedule is the uninterrupted one."""
    from dapo.pipeline import partial_version

    floor = min(floor, step - 1)
    v = behaviour_version(step, k, floor)
    assert floor <= v <= step - 1 and staleness(step, k, floor) <= k
    if step >= floor + k + 1:
        assert v == behaviour_version(step, k)
    p = partial_version(step, k, floor)
    if p is not None:
        assert p == v + 1 == behaviour_version(step + 1, k, floor) and p <= step - 1
    else:
        assert k == 0 or v == floor
    need = versions_needed(floor + 1, step, k, partial=True, floor=floor)
    assert need.start == floor and {
        behaviour_version(b, k, floor) for b in range(floor + 1, step + 1)
    } <= set(need)
    with pytest.raises(ValueError, match="floor"):
        behaviour_version(step, k, step)  # version `step` does not exist before step `step` ends


def _held(step, versions):
    """A checkpoint's batches in flight after ``step``: batch step + 1 + i sampled by
    versions[i] (one generator, one group of two tokens)."""
    out = {}
    for i, v in enumerate(versions):
        msg = _message(v, [v, v])
        msg["stream"] = {"position": i}
        out[step + 1 + i] = [msg]
    return out


def test_a_smaller_k_keeps_the_held_batches_it_allows_and_samples_the_rest_again():
    from scale.placement.disaggregated import in_flight_to_continue

    held = _held(4, [2, 3])  # after step 4 with k = 2: batch 5 by version 2, batch 6 by version 3
    kept, dropped = in_flight_to_continue(held, 4, 2)
    assert list(kept) == [5, 6] and dropped == []
    kept, dropped = in_flight_to_continue(held, 4, 3)  # a larger k allows everything held
    assert list(kept) == [5, 6] and dropped == []
    kept, dropped = in_flight_to_continue(held, 4, 1)  # k = 1: batch 5 needs >= 3, batch 6 >= 4
    assert kept == {} and dropped == [5, 6]
    kept, dropped = in_flight_to_continue(_held(1, [0, 0]), 1, 1)  # early, clamped batches
    assert list(kept) == [2] and dropped == [3]
    kept, dropped = in_flight_to_continue(held, 4, 0)
    assert kept == {} and dropped == [5, 6]
    with pytest.raises(ValueError, match="not consecutive"):
        in_flight_to_continue({6: held[6]}, 4, 2)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.2, 0.9), st.integers(1, 4), st.integers(1, 5))
def test_a_held_batch_split_again_for_another_learner_count_is_the_generators_own_plan(
    seed, acceptance, written, learners
):
    """A batch planned for ``written`` learner ranks and resumed on ``learners``: the split
    made again from the message equals the one its generator makes for that many ranks."""
    import random

    from dapo import AlgoConfig
    from scale.dist.topology import Comm, Ranks
    from scale.generator.rollout import GlobalDynamicSampler, batch_state
    from scale.placement.disaggregated import replan

    g, t = 4, 6
    rng = random.Random(seed)
    algo = AlgoConfig(group_size=g, train_groups=6, mini_batch_groups=6, max_gen_rounds=4)
    ranks = Ranks(0, 1)
    sampler = GlobalDynamicSampler(algo, ranks, Comm(ranks), step=0)
    while not sampler.done:
        n = torch.tensor([1 + rng.randrange(t) for _ in range(8 * g)])
        c = torch.tensor([rng.random() < acceptance for _ in range(8 * g)])
        mask = torch.arange(t).unsqueeze(0) < n.unsqueeze(1)
        logp = torch.where(mask, -torch.rand(len(n), t), torch.zeros(len(n), t))
        sampler.add(
            RolloutBatch(
                old_logp=logp,
                rollout_logp=logp.clone(),
                mask=mask,
                lengths=n,
                truncated=n == t,
                correct=c,
                rewards=torch.where(c, 1.0, -1.0),
                group_ids=torch.arange(8).repeat_interleave(g),
                group_size=g,
                extras={"prompt_len": torch.tensor([1 + rng.randrange(5) for _ in range(8 * g)])},
            ),
            "x",
        )
    keys, mine, plan = sampler.kept(written)
    msg = {"keys": [list(x) for x in keys], "groups": batch_state(mine), "plan": plan}
    want = sampler.kept(learners)[2]
    assert replan([msg], learners, g) == [[list(x) for x in part] for part in want]
