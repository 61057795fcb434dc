"""The learner role: the policy (``policy``; its LoRA adapters: ``lora``), its ranks
(``sharding``: DDP or FSDP2), its sharded checkpoints (``checkpoint``), the weights it
streams out (``sync``), and
:class:`~scale.learner.role.Learner` (``role``: built from the config, owns model, optimizer,
schedule and their part of a checkpoint; one update per step).

May import the core, ``scale.config`` and ``scale.dist``; nothing of the generator, the
placements or the operations.
"""
