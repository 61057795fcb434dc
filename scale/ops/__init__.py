"""The operations around a run: the ``dapo train / eval / export`` commands (``cli``),
``dapo launch`` (``launch``, templates in ``launch/``), ``dapo stage`` (``stage``), ``dapo
plan`` (``plan``) and the engine fit it shares with ``dapo train`` (``fit``), the installed
stack's check (``preflight``), the toy gate (``gate``), what the toys' off-policy table says of the config's staleness
(``staleness_table``) and the tiny preset's files (``tiny``).

May import everything below (the loop, placements, roles, plumbing, config); only ``cli``
imports the loop, and nothing here imports ``cli``.
"""
