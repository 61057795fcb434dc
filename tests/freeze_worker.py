"""Rank entry of tests/test_startup.py: a process group held by a reference cycle is released
at teardown when :func:`scale.dist.startup.import_and_freeze` ran before the group existed
(``before``), and outlives it when the freeze came after (``after``: the cycle is frozen and
no collection reaches it, which is why the freeze must come first).

``engine``: as in a colocated rank, an engine's start freezes everything alive, the group's
cycle included (vLLM's ``freeze_gc_heap``), and its shutdown unfreezes it, here inside
:func:`scale.dist.startup.unfreeze_deferred` as ``dapo train``'s teardown runs it: the group
must still be released. ``engine-kept-frozen``, the control: the engine's freeze without its
unfreeze leaks the group, so the deferred unfreeze is what releases it.

Exits as :func:`multiproc.worker` does: 0 on a clean teardown, 3 on a leaked group."""

import gc
import sys

import torch
import torch.distributed as dist
from multiproc import worker

from scale.dist.startup import import_and_freeze, unfreeze_deferred
from scale.dist.topology import dist_timeout


class Holder:
    """What a trainer's objects often are: a cycle (self-reference) that holds the group."""

    def __init__(self):
        self.me = self
        self.group = dist.group.WORLD


def body():
    when = sys.argv[1]
    if when != "after":
        import_and_freeze(learner=True, vllm=False)
    dist.init_process_group("gloo", timeout=dist_timeout(30))
    holder = Holder()
    if when == "after":
        import_and_freeze(learner=True, vllm=False)
    x = torch.ones(1)
    dist.all_reduce(x, group=holder.group)
    assert x.item() == dist.get_world_size()
    if when.startswith("engine"):
        gc.freeze()  # the engine's start
        with unfreeze_deferred():  # dapo train's teardown
            if when == "engine":
                gc.unfreeze()  # the engine's shutdown
            gc.collect()  # its own collection: the frozen heap is not walked
    # holder goes with this frame; only a collection can free its cycle, and with it the group


worker(body)
