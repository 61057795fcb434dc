"""Rank entry of tests/test_multiproc.py::test_a_late_rank_joins_the_learners_group_and_collectives_stay_bounded.

Rank 1 reaches ``scale.dist.topology.make_accelerator`` three process-group timeouts
(``$DAPO_DIST_TIMEOUT_S``) after rank 0, as a rank still importing on a loaded node does: the
group must be built all the same. Then rank 1 stays silent for three timeouts more while rank 0
enters a collective: that collective must give up after about one timeout. Rank 0 writes
``{"built": true, "collective": "gave up" | "completed", "waited_s": ...}`` to OUT."""

import json
import os
import sys
import time

from multiproc import _exit_now

out = sys.argv[1]
rank = int(os.environ["RANK"])
timeout_s = float(os.environ["DAPO_DIST_TIMEOUT_S"])
if rank == 1:
    time.sleep(3 * timeout_s)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from scale.config import load  # noqa: E402
from scale.dist.topology import make_accelerator, preload_collective_modules  # noqa: E402

preload_collective_modules()
make_accelerator(load("tiny-cpu", [f"output.dir={os.path.dirname(out)}"]))
dist.barrier()  # both ranks are in the group
if rank == 0:
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.zeros(1))
        how = "completed"
    except RuntimeError:
        how = "gave up"
    with open(out, "w") as f:
        json.dump({"built": True, "collective": how, "waited_s": time.monotonic() - t0}, f)
else:
    time.sleep(3 * timeout_s)
_exit_now(0)  # a group whose collective timed out is not torn down; the test reads OUT
