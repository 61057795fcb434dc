"""The CPU rehearsal of a multi-node run (``python -m scale.rehearsal``, ``nox -s rehearsal``):
the scenarios and their checks (``run``) and the 32B preset scaled down to CPU processes
(``preset_copy``).

The top of the tree: may import anything in ``scale``; nothing imports it.
"""
