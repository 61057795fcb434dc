"""Generators on nodes of their own (``rollout.generator_nodes``, scale/placement/generator_node.py):
how the generators split over the nodes, the config's and the launcher's checks, and the
rehearsal on real processes: a learner node (torchrun) and two generator nodes (an agent each,
as the SLURM job step dapo launch writes would start them) train as the run whose generators
rank 0 starts itself; the learner killed mid-run is restarted by torchrun, the agents start the
new pool's generators, and the run resumes from its checkpoint and ends as the uninterrupted one."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scale_support import need

from scale.placement.generator_node import share

need("transformers", "accelerate", "datasets", "safetensors", "yaml")


@given(st.integers(1, 8), st.integers(1, 6), st.integers(1, 4))
def test_every_generator_runs_on_exactly_one_node_on_gpus_of_its_own(nodes, per_node, tp):
    generators = nodes * per_node
    seen = []
    for m in range(nodes):
        s = share(m, nodes, generators, tp)
        procs = s.processes()
        assert len(procs) == per_node * tp
        devices = [d for _, j, ds in procs if j == 0 for d in ds]
        assert sorted(devices, key=int) == [
            str(d) for d in range(per_node * tp)
        ]  # the node's first GPUs, once each
        assert {j for _, j, _ in procs} == set(range(tp))
        seen += sorted({i for i, _, _ in procs})
    assert seen == list(range(generators))


def test_a_node_outside_the_run_is_refused():
    with pytest.raises(ValueError, match="generator node 2 of 2"):
        share(2, 2, 4, 1)


@pytest.mark.parametrize(
    "over, field",
    [
        (["rollout.generator_nodes=2"], "rollout.generator_nodes"),  # colocated
        (
            [
                "rollout.mode=disaggregated",
                "rollout.generators=3",
                "rollout.generator_nodes=2",
                "eval.every=0",
            ],
            "rollout.generator_nodes",
        ),
        (
            ["rollout.mode=disaggregated", "rollout.generator_nodes=-1", "eval.every=0"],
            "rollout.generator_nodes",
        ),
    ],
)
def test_the_config_refuses_generator_nodes_that_cannot_hold_the_generators(over, field):
    from dapo.config import ConfigError
    from scale.config import load

    with pytest.raises(ConfigError) as err:
        load("tiny-cpu", over)
    assert err.value.field == field


def test_a_run_without_a_launchers_store_is_refused_in_one_line(tiny, tmp_path, monkeypatch):
    from test_scale_trainer import DISAGG, overrides, run_cli

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    r = run_cli(
        [
            "train",
            "--config",
            "tiny-cpu",
            "--quiet",
            *overrides(tiny, tmp_path / "run", *DISAGG, "rollout.generator_nodes=1"),
        ],
        drop=("MASTER_ADDR",),
    )
    assert r.returncode == 2, r.stderr
    assert "rollout.generator_nodes=1" in r.stderr and "MASTER_ADDR is not set" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_generator_nodes_train_restart_and_resume_as_the_local_generators(tiny, tmp_path):
    """k = 1, 2 generators: the reference run starts them on its own node; the rehearsal runs
    one on each of two generator nodes (two agents beside the learner's torchrun), the learner
    SIGKILLed in step 3 and restarted by torchrun: the agents see the restarted learner's pool,
    start its generators, and the run resumes from step 2 and logs the reference's metrics."""
    from multiproc import run_script
    from test_restart_torchrun import KILLER, RUN
    from test_scale_trainer import DISAGG, SKIP, metrics, overrides, same

    disagg = (*DISAGG, "rollout.max_staleness=1", *RUN)
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    ref, run = tmp_path / "ref", tmp_path / "run"
    train = ["train", "--config", "tiny-cpu", "--quiet"]
    run_script(
        ["-m", "dapo.cli", *train, *overrides(tiny, ref, *disagg)], nproc=1, timeout_s=400, dist_timeout_s=20
    )
    agents = tuple(
        ["-m", "scale.placement.generator_node", "--node", str(m), "--wait-s", "120", "--lost-s", "20"]
        for m in range(2)
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KILL_AT_STEP", "3")
        mp.setenv("KILL_RANK", "0")
        ranks = run_script(
            [
                str(script),
                *train,
                *overrides(tiny, run, *disagg, "rollout.generator_nodes=2", "train.heartbeat_timeout_s=20"),
            ],
            nproc=1,
            max_restarts=1,
            beside=agents,
            timeout_s=400,
            dist_timeout_s=20,
        )
    assert "resuming from checkpoint step 2" in ranks[0].stderr
    # every agent exited 0 (run_script checks): each saw the run end, after serving the
    # restarted learner's pool (the first pool's bridge died with the killed learner)
    rows = [json.loads(x) for x in (run / "restarts.jsonl").read_text().splitlines()]
    assert [(r["torchrun"], r["reached"], r["resumes_from"]) for r in rows] == [(1, 2, 2)]
    same(metrics(ref), metrics(run), tol=1e-5, skip=SKIP)
    for i in range(2):  # each generator wrote its log on the shared output directory
        assert (run / f"generator{i}.log").is_file()


def test_the_agent_says_in_one_line_when_the_learners_store_never_opens():
    import subprocess

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "scale.placement.generator_node",
            "--master",
            "127.0.0.1",
            "--port",
            "1",
            "--node",
            "0",
            "--wait-s",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .startswith("generator_node: the learners' store at 127.0.0.1:1 did not open")
    )


NODE_KILLER = """
import os, signal, sys
from pathlib import Path
import scale.trainer as trainer

real = trainer.Trainer.train_step

def train_step(self):
    if self.step + 1 == 2:  # a generator node lost: its agent SIGKILLed (its generators die with it)
        for p in Path("/proc").iterdir():
            try:
                argv = (p / "cmdline").read_bytes().split(b"\\0")
            except OSError:
                continue
            if b"scale.placement.generator_node" in argv:
                os.kill(int(p.name), signal.SIGKILL)
    return real(self)

trainer.Trainer.train_step = train_step
from dapo.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_lost_generator_node_ends_the_run_naming_it(tiny, tmp_path):
    """The fault the beat exists for: the generator node's agent and its generators SIGKILLed
    in step 2 (no exit report can come), before the version batch 4 needs exists (k = 1: version
    2), so the run cannot finish without it: the learner stops within train.heartbeat_timeout_s
    with exit status 4, naming the node, its checkpoints kept for --resume auto. (Killed in
    step 3, batch 4 may already have arrived; the run then ends, noting the lost node.)"""
    from multiproc import MultiprocessError, run_script
    from test_restart_torchrun import RUN
    from test_scale_trainer import DISAGG, metrics, overrides

    script = tmp_path / "node_killer.py"
    script.write_text(NODE_KILLER)
    run = tmp_path / "run"
    over = overrides(tiny, run, *DISAGG, "rollout.max_staleness=1", *RUN, "rollout.generator_nodes=1")
    with pytest.raises(MultiprocessError) as failed:
        run_script(
            [
                str(script),
                "train",
                "--config",
                "tiny-cpu",
                "--quiet",
                *over,
                "train.heartbeat_s=1",
                "train.heartbeat_timeout_s=5",
            ],
            nproc=1,
            beside=(
                ["-m", "scale.placement.generator_node", "--node", "0", "--wait-s", "120", "--lost-s", "10"],
            ),
            timeout_s=300,
            dist_timeout_s=20,
        )
    said = str(failed.value)
    assert "rollout engine failed: generator node 0 stopped answering" in said, said[-3000:]
    assert "exit status 4" in said or "exitcode: 4" in said, said[-3000:]
    steps = [m["step"] for m in metrics(run)]
    assert steps[:1] == [1] and 4 not in steps  # batches 2 and 3 may have arrived before the loss
    assert (run / "checkpoints").is_dir()
