"""Bounded staleness between generation and training: which policy version samples which
batch, and what the overlap buys (pure; no processes, no clocks).

Versions count training steps: version 0 is the initial policy, version ``v`` the policy
after step ``v``. Step ``s`` (from 1) trains on batch ``s``. With at most ``k`` versions
between the sampler and the learner, batch ``s`` is sampled by

    v(s) = max(0, s - 1 - k)                                           (behaviour version)

so the learner, which holds version ``s - 1`` when it trains step ``s``, trains on tokens
exactly ``min(k, s - 1)`` versions old. With partial rollouts (:func:`partial_version`) a
response's tokens after its first segment come from the next version, one fresher. ``k = 0`` is the synchronous loop (generate with the
current weights, then train); ``k = 1`` is verl's one-step-off pipeline. The version is a
function of the step alone, never of timing, so a run is the same whatever the speed of its
processes, and a checkpoint after step ``s`` that holds batches ``s+1 .. s+k`` (sampled by
versions ``s-k .. s-1``, which the checkpoint no longer has) resumes exactly: the next batch
to sample, ``s + k + 1``, needs version ``s``, the checkpoint's own weights.

A resumed run has no version older than its checkpoint's: after a resume at step ``s`` the
oldest version that exists is ``s`` (the *floor*). A batch the checkpoint does not hold and
whose behaviour version is below the floor (a finished run extended with more steps, a resume
with a larger k, batches dropped because they break a smaller k) is sampled by the floor
instead,

    v(b) = max(floor, b - 1 - k)                                       (after a resume)

which is fresher than the schedule asks (its staleness ``b - 1 - floor`` is below k): the bound
still holds for every token, and from batch ``floor + k + 1`` on the schedule is the usual one.

:func:`simulate` is the clock of that pipeline (one generator side, one learner side): the
generator starts batch ``s`` once its previous batch is done and version ``v(s)`` exists;
the learner starts step ``s`` once step ``s - 1`` is done and batch ``s`` has arrived, and
publishes its weights after each step. It is what the planner and the benchmarks compare
against, and the toys' simulated clock (:mod:`toybench.off_policy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def behaviour_version(step: int, k: int, floor: int = 0) -> int:
    """The policy version that samples the batch of training step ``step`` (from 1); ``floor``:
    the oldest version that exists (a resumed run's checkpoint step; 0 for a fresh run)."""
    if step < 1 or k < 0 or not 0 <= floor <= step - 1:
        raise ValueError(
            f"step must be >= 1, k >= 0 and 0 <= floor < step (got step={step}, k={k}, floor={floor})"
        )
    return max(floor, step - 1 - k)


def staleness(step: int, k: int, floor: int = 0) -> int:
    """Versions between the sampler of batch ``step`` and the learner that trains it."""
    return step - 1 - behaviour_version(step, k, floor)


def oldest_token_ages(step: int, k: int, *, partial: bool, rounds: int, floor: int = 0) -> tuple[int, ...]:
    """The ages (versions) the oldest token a learner trains on in step ``step`` can have:
    :func:`staleness` when a group of the batch's first generation round is kept. With partial
    rollouts the rounds after the first run wholly under :func:`partial_version`, so when
    dynamic sampling dropped every group of the first round (``rounds > 1``) the oldest kept
    token is one version younger. Which it is depends on the samples, not on the schedule."""
    age = staleness(step, k, floor)
    if partial and rounds > 1 and partial_version(step, k, floor) is not None:
        return (age - 1, age)
    return (age,)


def partial_version(step: int, k: int, floor: int = 0) -> int | None:
    """With partial rollouts, the version that continues batch ``step``'s responses after the
    first segment: the next one, ``behaviour_version + 1``, which samples the next batch too
    (versions never go back) and which the learner has before it trains this step (None
    otherwise: the first k batches, the batches sampled by the floor, and k = 0). Its tokens are
    one version fresher, so the bound k still holds for every token."""
    if k < 1 or step - k <= floor:  # the next batch is sampled by the same clamped version
        return None
    return step - k  # = behaviour_version(step, k) + 1 = behaviour_version(step + 1, k)


def versions_needed(first: int, last: int, k: int, partial: bool = False, floor: int = 0) -> range:
    """The policy versions that batches ``first .. last`` are sampled by (consecutive)."""
    if last < first:
        return range(0)
    top = behaviour_version(last, k, floor)
    if partial and (p := partial_version(last, k, floor)) is not None:
        top = p
    return range(behaviour_version(first, k, floor), top + 1)


@dataclass(frozen=True)
class Timeline:
    """What :func:`simulate` found; times in the unit of its inputs."""

    generated: list[float]
    """When each batch was ready."""
    trained: list[float]
    """When each training step (and the weight sync after it) ended."""
    generator_idle: float
    """Time the generator side waited for weights."""
    learner_idle: float
    """Time the learner waited for batches."""

    @property
    def total(self) -> float:
        return self.trained[-1] if self.trained else 0.0


def simulate(
    generate: Sequence[float], train: Sequence[float] | float, k: int, sync: float = 0.0
) -> Timeline:
    """The clock of ``len(generate)`` steps: ``generate[i]`` is the generation time of batch
    ``i + 1``, ``train`` the time of a training step (one value or one per step), ``sync`` the
    learner's time to publish a version after its step. ``k = 0`` is generate-then-train;
    colocated (one set of devices for both) is ``k = 0`` by construction."""
    n = len(generate)
    steps = [float(train)] * n if isinstance(train, (int, float)) else [float(t) for t in train]
    if len(steps) != n:
        raise ValueError(f"{len(steps)} training times for {n} batches")
    g_end: list[float] = []
    t_end: list[float] = []
    g_idle = l_idle = 0.0
    for i in range(n):
        v = behaviour_version(i + 1, k)
        weights_at = t_end[v - 1] if v >= 1 else 0.0  # version v exists once step v has ended
        free_at = g_end[-1] if g_end else 0.0
        g_idle += max(0.0, weights_at - free_at)
        g_end.append(max(free_at, weights_at) + generate[i])
        prev = t_end[-1] if t_end else 0.0
        l_idle += max(0.0, g_end[-1] - prev)
        t_end.append(max(prev, g_end[-1]) + steps[i] + sync)
    return Timeline(g_end, t_end, g_idle, l_idle)


__all__ = ["Timeline", "behaviour_version", "partial_version", "simulate", "staleness", "versions_needed"]
