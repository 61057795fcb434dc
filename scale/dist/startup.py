"""A trainer process's start: its heavy libraries imported once, then set aside by the garbage
collector.

A ``dapo train`` process holds about a million objects from torch, transformers, accelerate
and vLLM that live as long as it does. Python's full collections walk all of them: the ones
the interpreter starts while those libraries import (they create objects by the hundred
thousand), and the explicit ``gc.collect()`` calls vLLM makes while it loads a model and
starts its engine core, about 0.4 s each on a CPU host. On a one-process tiny run
(``dapo train --config tiny-cpu``, 2-core CPU host) the collector took 5.0 s of 14.3 s; with
this module, 3.0 s of 12.7 s (what remains are the full collections of vLLM's and this
package's teardown, which must reach everything). Importing them first with the collector
paused, then :func:`gc.freeze`, moves them to a generation no collection walks. What the run
creates afterwards (process groups, models, engines) is collected as before: vLLM's engine
shutdown unfreezes everything before its own collection, and
:func:`scale.dist.topology.shutdown` collects fully too.
"""

from __future__ import annotations

import gc
import importlib

from .topology import preload_collective_modules


def heavy_modules(*, learner: bool, vllm: bool) -> list[str]:
    """What a process imports in any case: torch and transformers; accelerate where it trains
    (``learner``); vLLM where it hosts a rollout engine (``rollout.engine: vllm``, and a
    colocated rank or a generator process: a disaggregated run's learners host none)."""
    mods = ["torch", "transformers", "safetensors.torch"]
    return mods + ["accelerate"] * learner + ["vllm"] * vllm


def import_and_freeze(*, learner: bool, vllm: bool) -> None:
    """Import :func:`heavy_modules` with the collector paused, then freeze what exists.

    A module that fails to import is left to the code that needs it, which says what to
    install. Call it before any process group exists: a group created before the freeze
    would be frozen with the cycles that hold it, and outlive its teardown
    (:func:`scale.dist.topology.shutdown`). It runs
    :func:`scale.dist.topology.preload_collective_modules` too, which has the same rule."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        preload_collective_modules()
        for name in heavy_modules(learner=learner, vllm=vllm):
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            if name == "vllm":
                module.LLM  # noqa: B018 (vllm imports its engine lazily, on first access)
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
