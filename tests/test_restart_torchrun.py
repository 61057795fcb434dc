"""Restarted by the launcher, on real processes (scale/ops/restart.py): a rank SIGKILLed in the
middle of a 2-process run, or a disaggregated run's generator process, and torchrun's elastic
agent (``--max-restarts``, what ``dapo launch`` writes) restarts the group; the run resumes
from its last checkpoint by itself, finishes, and logs the uninterrupted run's metrics. A run
that dies at the same step on every attempt stops with one line instead of using up its
restarts on the same crash."""

from __future__ import annotations

import json

import pytest
from multiproc import MultiprocessError, run_script
from scale_support import need
from test_scale_trainer import DISAGG, SKIP, metrics, overrides, same

need("transformers", "accelerate", "datasets", "safetensors", "yaml")

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

RUN = (
    "rollout.engine=hf",
    "train.steps=4",
    "output.checkpoint_every=1",
    "eval.every=0",
    "algo.mini_batch_groups=4",  # one optimizer step per batch
)
"""4 steps of the tiny preset on 2 processes, a checkpoint after each."""

KILLER = """
import os, signal, sys
import scale.trainer as trainer

real = trainer.Trainer.train_step

def train_step(self):
    first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if (
        self.step + 1 == int(os.environ["KILL_AT_STEP"])
        and os.environ.get("RANK") == os.environ["KILL_RANK"]
        and (first or os.environ.get("KILL_EVERY_ATTEMPT") == "1")
    ):
        if os.environ.get("KILL_GENERATOR") == "1":  # generator 0 of a disaggregated run, not the rank
            os.kill(self.placement.pool.procs[0].pid, signal.SIGKILL)
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    return real(self)

trainer.Trainer.train_step = train_step
from dapo.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _launch(tiny, tmp_path, run, killer=False, max_restarts=0, nproc=2, nodes=1, extra=(), **env):
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    argv = [str(script)] if killer else ["-m", "dapo.cli"]
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        return run_script(
            [*argv, "train", "--config", "tiny-cpu", "--quiet", *overrides(tiny, run, *RUN, *extra)],
            nproc=nproc,
            nodes=nodes,
            max_restarts=max_restarts,
            timeout_s=400,
            dist_timeout_s=20,
        )


def test_a_rank_killed_mid_run_is_restarted_and_the_run_ends_as_the_uninterrupted_one(tiny, tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    _launch(tiny, tmp_path, ref)
    ranks = _launch(tiny, tmp_path, run, killer=True, max_restarts=2, KILL_AT_STEP="3", KILL_RANK="1")
    rows = [json.loads(x) for x in (run / "restarts.jsonl").read_text().splitlines()]
    assert [(r["torchrun"], r["reached"], r["resumes_from"], r["stopped"]) for r in rows] == [
        (1, 2, 2, False)
    ]
    said = ranks[0].stderr
    assert "torchrun restart 1: the attempt before reached step 2; resuming from checkpoint step 2" in said
    assert [m["step"] for m in metrics(run)] == [1, 2, 3, 4]
    same(metrics(ref), metrics(run), tol=1e-5, skip=SKIP)


def test_a_killed_generator_process_is_restarted_with_its_learner(tiny, tmp_path):
    """Disaggregated, k = 2: generator 0 SIGKILLed while the learner makes step 3; the learner
    stops (exit 4, the engine failed), torchrun restarts it, and the resumed run (the
    checkpoint's batches in flight kept, new generator processes) ends as the uninterrupted one."""
    disagg = (*DISAGG, "rollout.max_staleness=2", "train.steps=6")  # batch 6 waits for version 3
    ref, run = tmp_path / "ref", tmp_path / "run"
    _launch(tiny, tmp_path, ref, nproc=1, extra=disagg)
    ranks = _launch(
        tiny,
        tmp_path,
        run,
        killer=True,
        max_restarts=1,
        nproc=1,
        extra=disagg,
        KILL_AT_STEP="3",
        KILL_RANK="0",
        KILL_GENERATOR="1",
    )
    assert (run / "restarts.jsonl").is_file(), ranks[0].stderr[-3000:]
    rows = [json.loads(x) for x in (run / "restarts.jsonl").read_text().splitlines()]
    assert [(r["torchrun"], r["reached"], r["resumes_from"]) for r in rows] == [(1, 2, 2)]
    assert "resuming from checkpoint step 2" in ranks[0].stderr
    same(metrics(ref), metrics(run), tol=1e-5, skip=SKIP)


def test_a_run_that_dies_at_the_same_step_on_every_attempt_stops_saying_so(tiny, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(MultiprocessError) as failed:
        _launch(
            tiny,
            tmp_path,
            run,
            killer=True,
            max_restarts=2,
            KILL_AT_STEP="3",
            KILL_RANK="0",
            KILL_EVERY_ATTEMPT="1",
        )
    rows = [json.loads(x) for x in (run / "restarts.jsonl").read_text().splitlines()]
    # attempt 0 and restart 1 died in step 3; restart 2 stopped before building anything
    assert [(r["torchrun"], r["reached"], r["stopped"]) for r in rows] == [(1, 2, False), (2, 2, True)]
    assert "torchrun restart 2: the last two attempts both died after step 2 was logged, in step 3" in str(
        failed.value
    )
    assert "exit status 6" in str(failed.value)
    assert [m["step"] for m in metrics(run)] == [1, 2]  # nothing trained after the stop


def test_two_simulated_nodes_restart_together_from_the_checkpoint(tiny, tmp_path):
    """2 nodes x 2 processes, a static rendezvous (what accelerate's multi-node config and
    torchrun with --node-rank use): rank 3, on node 1, SIGKILLed in step 3. Node 1's agent
    restarts its ranks at once; node 0's ranks learn of the death from the heartbeat and end,
    and its agent restarts them too. The restarted group's default process group is keyed by the
    attempt (scale.dist.topology.init_restarted_group): a static rendezvous keeps one store for
    every attempt, and without the key the restarted ranks read the dead attempt's addresses
    (gloo's connectFullMesh refused). The run resumes from step 2 and ends as the
    uninterrupted run."""
    run = tmp_path / "run"
    quick = ("train.heartbeat_s=1", "train.heartbeat_timeout_s=5", "rollout.gen_groups=4")
    _launch(
        tiny,
        tmp_path,
        run,
        killer=True,
        max_restarts=1,
        nproc=2,
        nodes=2,
        extra=quick,
        KILL_AT_STEP="3",
        KILL_RANK="3",
    )
    rows = [json.loads(x) for x in (run / "restarts.jsonl").read_text().splitlines()]
    assert [(r["torchrun"], r["reached"], r["resumes_from"]) for r in rows] == [(1, 2, 2)]
    ref = tmp_path / "ref"
    _launch(tiny, tmp_path, ref, nproc=2, nodes=2, extra=quick)
    same(metrics(ref), metrics(run), tol=1e-5, skip=SKIP)
