"""A placement of one's own, registered from outside ``scale/`` (``rollout.mode=placement_example:Recorded``):
the colocated placement, recording each call the loop makes in ``<output.dir>/placement_calls.jsonl``.
What ``tests/test_placement_interface.py`` runs to show that adding a placement needs nothing
outside its own module."""

from __future__ import annotations

import json
from pathlib import Path

from scale.placement.colocated import Colocated
from scale.placement.interface import Placement


class Recorded(Colocated):
    def _note(self, call: str, **fields: object) -> None:
        if self.acc.is_main_process:
            with (Path(self.cfg.output.dir) / "placement_calls.jsonl").open("a") as f:
                f.write(json.dumps({"call": call, **fields}) + "\n")

    def start(self, step: int, end: int) -> None:
        self._note("start", step=step, end=end)

    def collect(self, step_done: int):
        self._note("collect", step=step_done)
        return super().collect(step_done)

    def publish(self, version: int) -> dict[str, float]:
        self._note("publish", version=version)
        return super().publish(version)

    def close(self) -> None:
        self._note("close")
        super().close()


class NotAPlacement:
    """What ``rollout.mode`` must not accept: a class with the calls but not the interface."""


class Incomplete(Placement):
    """A placement without the calls the loop cannot do without (collect, publish)."""
