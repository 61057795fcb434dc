"""Rank entry of tests/test_multiproc.py::test_lazy_gloo_init_makes_group_creation_no_barrier.

Rank 0 waits, writes ``OUT.ready``, then joins the group; rank 1 joins at once and records
whether ``OUT.ready`` existed when ``init_process_group`` returned (NCCL-like lazy
connection: it did not; eager gloo: it did, creation waited for rank 0)."""

import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

out = Path(sys.argv[1])
rank = int(os.environ["RANK"])
if rank == 0:
    time.sleep(3)
    out.with_suffix(".ready").write_text("")
dist.init_process_group("gloo")
if rank == 1:
    out.write_text("waited" if out.with_suffix(".ready").exists() else "did not wait")
dist.barrier()
dist.destroy_process_group()
