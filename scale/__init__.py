"""The full regime: DAPO at scale with accelerate (DDP/FSDP2) and vLLM.

Folders, lowest first; a module imports only from its own layer or the ones below it
(``tests/test_layout.py`` checks it, with no import cycle anywhere):

* ``config.py`` (the run config), ``records.py`` (a run's JSONL records): import only the core;
* ``dist/``: the distributed plumbing (process groups, collectives, heartbeat, hub, bridge);
* ``learner/`` and ``generator/``: the two roles, each built from the config in one place;
  neither imports the other;
* ``placement/``: colocated and disaggregated, each wiring the roles;
* ``trainer.py``: the training loop, written once over either placement;
* ``ops/``: the operations around a run (CLI, launch, stage, plan, fit, preflight, gate);
* ``rehearsal/``: the CPU rehearsal of a multi-node run.

See docs/design/scale-layout.md.
"""
