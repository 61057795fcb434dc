"""Dynamic sampling over every rank of a run (Section 3.2, Eq. 11's constraint, at scale).

Each rollout group (the ``tensor_parallel`` ranks that share one engine,
:class:`scale.dist.topology.Ranks`) generates a round, keeps its informative groups
(``0 < #correct < G``) and tells every rank, in one small all-gather, what it accepted, how
long those groups are, and the per-response outcomes. From the same reports every rank then
decides the same thing:

* **when to stop**: when the accepted groups of *all* ranks reach ``algo.train_groups``, or at
  ``algo.max_gen_rounds`` (then it warns and trains on what it has, never raising). Every
  rank runs the same number of rounds; no rank waits in a collective for one that is still
  filling its own quota (per-rank filling needed 2.0 rounds for the slowest of 128 ranks at
  acceptance 0.5 where a global count needs 1.0: ``benchmarks/dynamic_sampling_rounds.py``);
* **what to keep**: the first ``train_groups`` accepted groups in round-major order
  (:func:`dapo.sampling.trim_round_major`; on one rank, exactly
  :meth:`dapo.DynamicSampler.take`);
* **who trains on what**: the kept groups split into equal counts per rank with balanced token
  sums (:func:`dapo.sampling.balance_groups`), then moved point to point
  (:meth:`scale.dist.topology.Comm.exchange`). A rank never holds more than its own share.

The members of a rollout group must have generated the same thing: their reports carry a digest
of prompts, seed and outputs, and a mismatch stops the run with the ranks named.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dapo import RolloutBatch
from dapo.config import AlgoConfig
from dapo.metrics import rollout_metrics
from dapo.microbatch import row_tokens
from dapo.sampling import (
    SamplingWarning,
    balance_groups,
    group_rows,
    informative_groups,
    sampling_metrics,
    trim_round_major,
)

from ..dist.bridge import dump, load
from ..dist.topology import Comm, Ranks


class RolloutDivergence(RuntimeError):
    """The members of a rollout group asked their engine for, or got, different generations."""


def round_digest(
    prompts: Sequence[Sequence[int]], seed: int, outputs: Sequence[Sequence[Sequence[int]]]
) -> str:
    """What a rollout group asked its engine for (prompt token ids, seed) and what came back (token
    ids of every response): equal on every member of a group, or the group diverged."""
    h = hashlib.sha256(str(seed).encode())
    for ids in (*prompts, *(o for row in outputs for o in row)):
        h.update(len(ids).to_bytes(8, "little"))
        h.update(np.asarray(ids, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


@dataclass
class _Report:
    """One rank's account of one round (pickled to every rank)."""

    rank: int
    digest: str
    group_tokens: list[int]
    """Prompt + response tokens of each accepted group, in order."""
    correct: list[bool]
    lengths: list[int]
    truncated: list[bool]
    rewards: list[float]
    rejected_all_correct: int
    rejected_all_wrong: int


Key = tuple[int, int, int]
"""A kept group: (round, rollout group, index among the groups that group accepted that round)."""


@dataclass
class _Candidate:
    round: int
    dp_rank: int
    index: int
    """Position among the groups rollout group ``dp_rank`` accepted in ``round``."""
    tokens: int


def batch_state(batch: RolloutBatch | None) -> dict[str, Any] | None:
    """A batch as plain tensors and numbers (what travels between processes and what a
    checkpoint keeps in flight; :func:`scale.dist.bridge.dump` writes it)."""
    if batch is None:
        return None
    state = {k: v for k, v in batch.__dict__.items() if k != "extras"}
    return {**state, "extras": dict(batch.extras)}


def from_state(state: dict[str, Any]) -> RolloutBatch:
    return RolloutBatch(**state)


def _to_bytes(batch: RolloutBatch) -> bytes:
    return dump(batch_state(batch))


def _from_bytes(data: bytes) -> RolloutBatch:
    return from_state(load(data))


@dataclass
class GlobalDynamicSampler:
    """Dynamic sampling whose rounds, stop and trim are decided over all ranks. Usage per
    training step, on every rank::

        sampler = GlobalDynamicSampler(algo, ranks, comm, step=s)
        while not sampler.done:
            sampler.add(this_groups_round, digest)   # one all-gather of small reports
        batch = sampler.take()                      # this rank's balanced share (or None)
        metrics = sampler.metrics()                 # global: equal on every rank
    """

    algo: AlgoConfig
    ranks: Ranks
    comm: Comm
    step: int = 0
    rounds: int = 0
    _mine: list[RolloutBatch | None] = field(default_factory=list)
    _reports: list[list[_Report]] = field(default_factory=list)
    _parts_tokens: list[int] = field(default_factory=list)
    extra_metrics: dict[str, float] = field(default_factory=dict)
    """Metrics of the step computed elsewhere from the same global reports (prompt selection)."""

    @property
    def target(self) -> int:
        return self.algo.train_groups

    @property
    def accepted(self) -> int:
        """Informative groups accepted so far, over all rollout groups."""
        return sum(len(r.group_tokens) for row in self._reports for r in row)

    @property
    def done(self) -> bool:
        return self.accepted >= self.target or self.rounds >= self.algo.max_gen_rounds

    def add(self, batch: RolloutBatch, digest: str) -> None:
        """This rollout group's round (whole groups, group-major); every rank calls it once per
        round, then every rank knows every group's outcome."""
        g = self.algo.group_size
        if batch.group_size != g:
            raise ValueError(f"batch group_size {batch.group_size} != algo.group_size {g}")
        excl = self.algo.overlong_filter and self.algo.filtered_group_stats == "excluded"
        keep, n_all_correct, n_all_wrong = informative_groups(batch, g, self.algo.dynamic_sampling, excl)
        kept = None
        if bool(keep.any()):
            kept = batch.select(group_rows(keep, g).to(batch.old_logp.device), group_size=g).to("cpu")
        self._mine.append(kept)
        report = _Report(
            rank=self.ranks.rank,
            digest=digest,
            group_tokens=row_tokens(kept).view(-1, g).sum(1).tolist() if kept is not None else [],
            correct=batch.correct.bool().tolist(),
            lengths=batch.lengths.long().tolist(),
            truncated=batch.truncated.bool().tolist(),
            rewards=batch.rewards.double().tolist(),
            rejected_all_correct=n_all_correct,
            rejected_all_wrong=n_all_wrong,
        )
        everyone = self.comm.all_gather(
            report, f"the other rollout groups' round {self.rounds} of step {self.step} (dynamic sampling)"
        )
        self._check_agreement(everyone)
        self._reports.append([everyone[d * self.ranks.tensor_parallel] for d in range(self.ranks.dp_size)])
        self.rounds += 1

    def last_round_correct(self) -> list[int]:
        """Correct responses per group of the last round, over every rollout group in order
        (rollout group 0's groups, then 1's...): the same list on every rank."""
        g = self.algo.group_size
        return [sum(r.correct[i : i + g]) for r in self._reports[-1] for i in range(0, len(r.correct), g)]

    def _check_agreement(self, reports: list[_Report]) -> None:
        tp = self.ranks.tensor_parallel
        for d in range(self.ranks.dp_size):
            group = reports[d * tp : (d + 1) * tp]
            if len({r.digest for r in group}) > 1:
                who = ", ".join(f"rank {r.rank}: {r.digest}" for r in group)
                raise RolloutDivergence(
                    f"rollout group {d} diverged in round {self.rounds} of step {self.step}: its "
                    f"tensor-parallel ranks asked for or got different generations ({who}); they must "
                    "share prompts and seeds"
                )

    def _plan(self, parts: int) -> tuple[list[_Candidate], list[list[int]]]:
        counts = [[len(r.group_tokens) for r in row] for row in self._reports]
        kept = trim_round_major(counts, self.target)
        cands = [
            _Candidate(r, d, i, self._reports[r][d].group_tokens[i])
            for r, row in enumerate(kept)
            for d, k in enumerate(row)
            for i in range(k)
        ]
        plan = balance_groups([c.tokens for c in cands], parts)
        self._parts_tokens = [sum(cands[i].tokens for i in part) for part in plan]
        return cands, plan

    def _warn_if_short(self) -> None:
        if self.accepted < self.target:
            n_ac = sum(r.rejected_all_correct for row in self._reports for r in row)
            n_aw = sum(r.rejected_all_wrong for row in self._reports for r in row)
            warnings.warn(
                f"dynamic sampling: {self.accepted}/{self.target} informative groups over "
                f"{self.ranks.dp_size} rollout group(s) after {self.rounds} round(s) "
                f"(max_gen_rounds={self.algo.max_gen_rounds}); training on what was found "
                f"(rejected {n_ac} all-correct, {n_aw} all-wrong groups)",
                SamplingWarning,
                stacklevel=3,
            )

    def kept(self, parts: int) -> tuple[list[Key], RolloutBatch | None, list[list[Key]]]:
        """For learners in other processes (a disaggregated run, :mod:`scale.generator.role`): this
        rollout group's kept groups, as their keys ``(round, rollout group, index)`` and their
        rows (None when it kept none), and the plan: for each of ``parts`` learner ranks the
        keys of its groups, in canonical order (the order :meth:`take` gives). Warns like
        :meth:`take` when the round limit left the batch short."""
        self._warn_if_short()
        cands, plan = self._plan(parts)
        key = [(c.round, c.dp_rank, c.index) for c in cands]
        mine = [i for i, c in enumerate(cands) if c.dp_rank == self.ranks.dp_rank]
        batch = self._select([cands[i] for i in mine]) if mine else None
        return [key[i] for i in mine], batch, [[key[i] for i in sorted(part)] for part in plan]

    def take(self) -> RolloutBatch | None:
        """This rank's share of the kept groups (None when it gets none). Warns with a
        :class:`dapo.sampling.SamplingWarning` when the round limit left the batch short."""
        self._warn_if_short()
        cands, parts = self._plan(self.ranks.world)
        me, tp = self.ranks, self.ranks.tensor_parallel
        # rollout group d's groups for rank `dst` come from its member with dst's tp position
        outgoing: dict[int, bytes] = {}
        for dst, part in enumerate(parts):
            if dst % tp != me.tp_rank:
                continue
            mine = [cands[i] for i in part if cands[i].dp_rank == me.dp_rank]
            if mine:
                outgoing[dst] = _to_bytes(self._select(mine))
        sizes = self.comm.all_gather(
            {dst: len(b) for dst, b in outgoing.items()}, f"the batch layout of step {self.step}"
        )
        incoming = {src: s[me.rank] for src, s in enumerate(sizes) if me.rank in s}
        got = self.comm.exchange(outgoing, incoming, f"this rank's share of the batch of step {self.step}")
        if not got:
            return None
        # the pieces arrive per rollout group; put the groups back in canonical (round, rollout
        # group, index) order, the order of this rank's part
        by_group = sorted(got, key=lambda src: src // tp)
        batch = RolloutBatch.concat([_from_bytes(got[src]) for src in by_group])
        arrived = [i for src in by_group for i in parts[me.rank] if cands[i].dp_rank == src // tp]
        order = sorted(range(len(arrived)), key=lambda j: arrived[j])
        g = self.algo.group_size
        rows = (torch.tensor(order).view(-1, 1) * g + torch.arange(g)).view(-1)
        return batch.select(rows, group_size=g)

    def _select(self, cands: list[_Candidate]) -> RolloutBatch:
        g = self.algo.group_size
        parts = []
        for c in cands:
            batch = self._mine[c.round]
            assert batch is not None  # a candidate exists only where groups were accepted
            parts.append(batch.select(torch.arange(c.index * g, (c.index + 1) * g), group_size=g))
        return RolloutBatch.concat(parts)

    def metrics(self) -> dict[str, float]:
        """The ``rollout/*`` and ``sampling/*`` metrics of the whole step over every rollout
        group (the same on every rank)."""
        reports = [r for row in self._reports for r in row]
        g = self.algo.group_size
        out = rollout_metrics(
            correct=torch.tensor([c for r in reports for c in r.correct], dtype=torch.bool),
            lengths=torch.tensor([n for r in reports for n in r.lengths], dtype=torch.long),
            truncated=torch.tensor([t for r in reports for t in r.truncated], dtype=torch.bool),
            rewards=torch.tensor([x for r in reports for x in r.rewards], dtype=torch.float64),
            group_size=g,
        )
        generated = sum(len(r.correct) for r in reports) // g
        out.update(
            sampling_metrics(
                rounds=self.rounds,
                generated_groups=generated,
                generated_tokens=sum(sum(r.lengths) for r in reports),
                accepted=self.accepted,
                target=self.target,
                rejected_all_correct=sum(r.rejected_all_correct for r in reports),
                rejected_all_wrong=sum(r.rejected_all_wrong for r in reports),
            )
        )
        loads = self._parts_tokens
        mean_load = sum(loads) / len(loads) if loads else 0.0
        out["sampling/accept_rate"] = self.accepted / generated if generated else math.nan
        out["sampling/rank_token_imbalance"] = max(loads) / mean_load if mean_load else math.nan
        out.update(self.extra_metrics)
        return out
