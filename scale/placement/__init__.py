"""The two placements of the roles (``rollout.mode``), one module each:

* ``colocated``: both roles on every rank, the engine asleep while the learner trains,
  the weights synced in place after each step;
* ``disaggregated``: the run's ranks are learners; generator processes (``generator_process``)
  sample with versions up to ``rollout.max_staleness`` old over the bridge; the staleness
  clock, the batches in flight and their part of a checkpoint; ``generator_node``: the
  agent that starts them on nodes of their own (``rollout.generator_nodes``) and the
  learner's view of it.

Each offers the loop (``scale.trainer``) the same few calls: start, collect, before the
update, publish, evaluate, rank state, close. May import the roles, ``scale.dist``,
``scale.records``, ``scale.config`` and the core; the two placements import nothing of each
other, and nothing here imports the loop or the operations.
"""
