"""The generator role: the prompt set and stream (``data``), the engines (``engines/``),
global dynamic sampling (``rollout``), evaluation (``evaluation``), the generator's inputs
built from the config before any model loads (``prompts``: model files, tokenizer, prompt set
and stream, prompt selection, the engine's context; owns the stream's position and the
selection's history, its part of a checkpoint) and :class:`~scale.generator.role.Generator`
(``role``: one rollout group's generation rounds and evaluation on its engine).

May import the core, ``scale.config``, ``scale.records`` and ``scale.dist``; nothing of the
learner, the placements or the operations.
"""
