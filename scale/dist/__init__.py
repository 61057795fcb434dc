"""The distributed plumbing: process groups and their lifecycle (``topology``), the
collective-device check (``collective_devices``), the heartbeat that names a dead rank
(``heartbeat``), the hub read once per node (``hub``) and the learner/generator bridge
(``bridge``).

May import the core (``dapo``) and ``scale.config`` only; nothing of the roles, the placements
or the operations.
"""
