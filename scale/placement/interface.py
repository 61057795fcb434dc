"""What the training loop asks of a placement, and the placements by ``rollout.mode``.

A placement decides where the roles run and how a batch and a policy version travel between
them. The loop (:class:`scale.trainer.Trainer`) builds one with :func:`placement_class` and
calls, each step: :meth:`Placement.collect` (this rank's share of the batch), then
:meth:`Placement.before_update`, the learner's update, :meth:`Placement.publish` (the new
version to whoever generates); every ``eval.every`` steps :meth:`Placement.evaluate`; at a
checkpoint :meth:`Placement.rank_state`; on resume :meth:`Placement.take_in_flight` (what the
checkpoint held of work already under way); around the steps :meth:`Placement.start` and
:meth:`Placement.close`.

``rollout.mode`` names a built-in (:data:`BUILT_IN`) or, as ``module:Class``, a placement of
one's own: a subclass of :class:`Placement` importable on every process of the run, built
as ``Class(cfg, acc=..., ranks=..., comm=..., learner=..., prompts=..., trace=..., log=...)``.
Nothing outside this folder and the config's choice needs to change to add one.

The config lists the built-in names (:data:`scale.config.PLACEMENTS`) and checks a mode
against them before anything loads; this module imports nothing heavy.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from dapo import RolloutBatch

BUILT_IN = {
    "colocated": "scale.placement.colocated:Colocated",
    "disaggregated": "scale.placement.disaggregated:Disaggregated",
}
"""``rollout.mode`` -> ``module:Class`` of the built-in placements (the names of
:data:`scale.config.PLACEMENTS`)."""


class PlacementError(ValueError):
    """``rollout.mode`` names no placement this run can build (said before any model loads)."""


class Placement(ABC):
    """The calls the loop makes, and what every placement shares: a checkpoint's batches in
    flight are sampled again unless the placement keeps them (:meth:`keep_in_flight`)."""

    learners_generate: ClassVar[bool] = True
    """Whether the learner ranks generate (each rollout group of ``rollout.tensor_parallel``
    ranks shares one engine); False where other processes generate."""

    mode: str = ""
    """The ``rollout.mode`` it was built for (set by :func:`placement_class`)."""

    log: Any = print
    """Where its lines go (the trainer's ``log``)."""

    def start(self, step: int, end: int) -> None:  # noqa: B027 (a default: nothing to do)
        """Before step ``step + 1``; the run stops after step ``end``."""

    @abstractmethod
    def collect(self, step_done: int) -> tuple[RolloutBatch | None, dict[str, float]]:
        """This rank's share of batch ``step_done + 1`` (None: none), and its metrics."""

    def before_update(self) -> None:  # noqa: B027 (a default: nothing to do)
        """Just before the learner's update (the colocated engine sleeps)."""

    @abstractmethod
    def publish(self, version: int) -> dict[str, float]:
        """Policy ``version`` (the weights after step ``version``) to whoever generates; metrics."""

    def evaluate(self, step: int) -> dict[str, float]:
        """Scores of the current policy (``eval.every``); {} where the placement cannot."""
        return {}

    def rank_state(self, step: int, state: dict[str, Any]) -> dict[str, Any]:
        """This rank's part of the checkpoint after step ``step``: ``state`` and the placement's own."""
        return state

    def close(self) -> None:  # noqa: B027 (a default: nothing to do)
        """The run has finished."""

    # ---- resume ----------------------------------------------------------------------------
    def keep_in_flight(
        self, held: dict[int, list[dict[str, Any]]], step: int
    ) -> tuple[dict[int, list[dict[str, Any]]], list[int], str]:
        """Of the batches a checkpoint after ``step`` held in flight: those this placement
        trains as they are, those sampled again, and why. Here: none kept."""
        return {}, sorted(held), f"rollout.mode={self.mode} generates each batch with the current weights"

    def take_in_flight(
        self, path: Path, state: dict[str, Any], zero: dict[str, Any], *, step: int, stream: Any, rank: int
    ) -> dict[int, list[dict[str, Any]]]:
        """The batches the checkpoint at ``path`` held (rank 0's part ``zero``): those
        :meth:`keep_in_flight` keeps are returned (rank 0); the others are dropped with the
        prompt stream put back where they began, so that their prompts are drawn again
        (nothing skipped)."""
        held = {int(b): msgs for b, msgs in zero.get("in_flight", {}).items()}
        if not held:
            return {}
        kept, dropped, why = self.keep_in_flight(held, step)
        if dropped:
            if kept:
                stream.load_state_dict(kept[max(kept)][-1]["stream"])
            elif "stream_at_step" in zero:
                stream.load_state_dict(zero["stream_at_step"])
            else:
                from ..learner.checkpoint import ResumeError

                written = state.get("config", {}).get("rollout", {})
                raise ResumeError(
                    f"--resume: {path} holds batches {sorted(held)} in flight but not the prompt "
                    "stream's position before them (an older checkpoint); resume it with "
                    f"rollout.mode={written.get('mode', 'disaggregated')} "
                    f"rollout.max_staleness={written.get('max_staleness', 0)}"
                )
            if rank == 0:
                self.log(
                    f"{path}: batch(es) {dropped} held in flight are sampled again ({why}); "
                    "their prompts are drawn again from the same place of the prompt stream"
                )
        return kept if rank == 0 else {}


def placement_class(mode: str) -> type[Placement]:
    """The placement ``rollout.mode`` names: a built-in, or ``module:Class`` (imported here;
    :class:`PlacementError` in one line when it cannot be)."""
    target = BUILT_IN.get(mode, mode)
    module, sep, name = target.partition(":")
    if not sep or not module or not name:
        raise PlacementError(
            f"rollout.mode={mode!r}: neither a built-in ({', '.join(BUILT_IN)}) nor module:Class"
        )
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise PlacementError(f"rollout.mode={mode!r}: cannot import {target} ({err})") from None
    if not (isinstance(cls, type) and issubclass(cls, Placement)):
        raise PlacementError(
            f"rollout.mode={mode!r}: {target} is not a subclass of scale.placement.interface.Placement"
        )
    if missing := sorted(getattr(cls, "__abstractmethods__", ())):
        raise PlacementError(f"rollout.mode={mode!r}: {target} does not define {', '.join(missing)}")
    cls.mode = mode
    return cls
