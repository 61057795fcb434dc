"""A trainer process's start: its heavy libraries imported once, then set aside by the garbage
collector.

A ``dapo train`` process holds about a million objects from torch, transformers, accelerate
and vLLM that live as long as it does. Python's full collections walk all of them: the ones
the interpreter starts while those libraries import (they create objects by the hundred
thousand), and the explicit ``gc.collect()`` calls vLLM makes while it loads a model and
starts its engine core, about 0.4 s each on a CPU host. On a one-process tiny run
(``dapo train --config tiny-cpu``, 2-core CPU host) the collector took 5.0 s of 14.3 s; with
this module, 3.0 s of 12.7 s. Importing them first with the collector paused, then
:func:`gc.freeze`, moves them to a generation no collection walks. What the run creates
afterwards (process groups, models, engines) is collected as before.

The teardown had the rest: vLLM's engine shutdown unfreezes the whole heap (its own startup
freezes everything alive, the run's objects and the frozen imports alike) and collects it
fully, twice, and accelerate's ``free_memory()`` collects again, before
:func:`scale.dist.topology.shutdown`'s two full collections: five walks of the whole heap,
2.4 s of that run. :func:`unfreeze_deferred` holds vLLM's unfreeze back until the teardown's
end, so the collections inside it walk only what is not frozen, and the one unfreeze at its
end leaves ``topology.shutdown`` to reach everything the engine held, before and after the
group is destroyed, as before.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
from collections.abc import Iterator

from .topology import preload_collective_modules


def heavy_modules(*, learner: bool, vllm: bool) -> list[str]:
    """What a process imports in any case: torch and transformers; accelerate where it trains
    (``learner``); vLLM where it hosts a rollout engine (``rollout.engine: vllm``, and a
    colocated rank or a generator process: a disaggregated run's learners host none)."""
    mods = ["torch", "transformers", "safetensors.torch"]
    return mods + ["accelerate"] * learner + ["vllm"] * vllm


def import_and_freeze(*, learner: bool, vllm: bool) -> None:
    """:func:`import_heavy` with the collector paused, then freeze what exists
    (:func:`frozen_after`). Call it before any process group exists: a group created before
    the freeze would be frozen with the cycles that hold it, and outlive its teardown
    (:func:`scale.dist.topology.shutdown`)."""
    with frozen_after():
        import_heavy(learner=learner, vllm=vllm)


def import_heavy(*, learner: bool, vllm: bool) -> None:
    """Import :func:`heavy_modules` and
    :func:`scale.dist.topology.preload_collective_modules` (which has the same rule as the
    freeze). A module that fails to import is left to the code that needs it, which says what
    to install."""
    preload_collective_modules()
    for name in heavy_modules(learner=learner, vllm=vllm):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if name == "vllm":
            module.LLM  # noqa: B018 (vllm imports its engine lazily, on first access)


@contextlib.contextmanager
def frozen_after() -> Iterator[None]:
    """Run the block (a process's imports) with the collector paused, then :func:`gc.freeze`
    what exists, even when the block raises. The same rule as :func:`import_and_freeze`:
    no process group may exist yet.

    The heap is unfrozen at the interpreter's exit (:mod:`atexit`), so that its last
    collection finalizes what was frozen: a frozen extension object is never freed, and
    nanobind (triton's bindings, which vLLM imports) prints dozens of lines of leaked
    instances at exit, after a one-line refusal too."""
    global _unfreeze_at_exit
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
        if not _unfreeze_at_exit:
            atexit.register(gc.unfreeze)
            _unfreeze_at_exit = True


_unfreeze_at_exit = False


@contextlib.contextmanager
def unfreeze_deferred() -> Iterator[None]:
    """Run a process's teardown with :func:`gc.unfreeze` held back until the block ends.

    Inside, an unfreeze (vLLM's engine shutdown asks for one) only takes note, so the
    collections the block makes walk what is not frozen; at its end the heap is unfrozen
    once if anything asked, and the caller's next full collection
    (:func:`scale.dist.topology.shutdown`) reaches everything the engine held. For the end of
    a process: until then an engine's objects are not collected (their memory, device
    memory included, is freed at that later collection)."""
    unfreeze = gc.unfreeze
    asked = False

    def note() -> None:
        nonlocal asked
        asked = True

    gc.unfreeze = note
    try:
        yield
    finally:
        gc.unfreeze = unfreeze
        if asked:
            unfreeze()
