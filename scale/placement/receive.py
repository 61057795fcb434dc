"""How a generator process takes policy versions from the learner: in its main thread, at
points every generator process reaches in the same order, never beside generation.

Why not a thread that receives while the engine generates (the design before issue 71): on
GPUs each weight broadcast is an NCCL kernel on the generator's device, and so are the
all-reduces of a tensor-parallel engine's forward pass (vLLM's own communicator). NCCL's
kernels block until every member of their communicator has launched theirs, and NCCL's
documentation requires operations on different communicators to be "used at different epochs
with a locking mechanism", submitted "in the same order across ranks" (NCCL user guide,
*Using multiple NCCL communicators concurrently*; NVIDIA/nccl#195: "the only safe way of
using two NCCL communicators is to not use them simultaneously"). A receive thread per
tensor-parallel process queues the broadcast wherever its own clock puts it among that
process's all-reduces: rank 0 after its all-reduce 3, rank 1 after its all-reduce 4, and each
waits for the other (``tests/nccl_double.py``'s :class:`StreamOrder` finds the cycle).

So versions are received at **points** (:meth:`Receiver.point`): before each batch, before
each generation round, and where partial rollouts switch versions inside a round; every
generator process passes the same points in the same order (the rounds are global: dynamic
sampling decides them together). At each point generator process 0 (the *leader*) decides
how far to receive (every due version whose header the learner has posted, and at least the
one the batch needs, waited for on the host) and posts its decision in the store; every other
process reads it. All then receive those versions, their engines idle: no vLLM collective is in
flight on any generator device during a weight broadcast. Agreeing across *all* generator
processes, not only within one engine, matters too: the rounds end in a gloo all-gather among
the generators, so a generator that entered a broadcast its peers had not yet seen would wait
for them while they waited for it in the all-gather.

The cost: the learner's publish waits for the generators' next point (at most one generation
round), where the thread received at once. The learner's send is one broadcast per tensor
from its rank 0 (:func:`scale.dist.bridge.send_weights`); on its side no other communicator
interleaves with it (its FSDP all-gathers run between the broadcasts, in one order).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..dist import bridge

Named = list[tuple[str, torch.Tensor]]


class Receiver:
    """Policy versions ``due`` (consecutive, increasing), received at :meth:`point`\\ s.

    ``weights``: the bridge's weights group (its ``kv``: the store where the learner posts each
    version's header and the leader posts its decisions). ``leader``: generator process 0.
    ``recv``: :func:`scale.dist.bridge.recv_weights` (a test records what each call does)."""

    def __init__(
        self,
        weights: bridge.Group,
        due: Sequence[int],
        *,
        leader: bool,
        recv: Callable[[bridge.Group, int], Named] = bridge.recv_weights,
        alive: Callable[[], None] | None = None,
    ):
        self.weights = weights
        self.due = list(due)
        self.leader = leader
        self.recv = recv
        self.alive = alive
        self.held: dict[int, Named] = {}
        self.received = self.due[0] - 1 if self.due else -1
        """The newest version received."""
        self.floor = -1
        """Versions below this were dropped (a generator never goes back)."""
        self.points = 0
        """Points passed: the next one's number."""

    def _posted(self, version: int) -> bool:
        return bool(self.weights.kv.check([f"version/{version}"]))

    def _decide(self, need: int | None) -> int:
        """The leader's decision at this point: the newest due version to have received."""
        newest = self.received
        if need is not None and need > newest:
            self.weights.wait(f"version/{need}", f"the learner's policy version {need}", self.alive)
            newest = need
        for v in self.due:
            if v > newest:
                if not self._posted(v):
                    break
                newest = v
        return newest

    def point(self, need: int | None = None) -> None:
        """A point every generator process passes in the same order: receive what the leader
        decides (at least ``need``, when given), all together."""
        n, self.points = self.points, self.points + 1
        key = f"point/{n}"
        if self.leader:
            newest = self._decide(need)
            self.weights.post(key, str(newest).encode())
        else:
            newest = int(self.weights.wait(key, f"generator 0's decision at point {n}", self.alive).decode())
        for v in self.due:
            if self.received < v <= newest:
                self.held[v] = self.recv(self.weights, v)
                self.received = v

    def take(self, version: int) -> Named:
        """Version ``version`` (a point: received now if it has not been); older ones are
        dropped."""
        if version < self.floor:
            raise RuntimeError(f"policy version {version} was asked for after version {self.floor}")
        if version not in self.due:
            raise RuntimeError(
                f"policy version {version} is not one this generator's batches need: a schedule bug"
            )
        self.point(need=version)
        self.floor = version
        for v in [v for v in self.held if v < version]:
            del self.held[v]
        return self.held[version]


__all__ = ["Receiver"]
