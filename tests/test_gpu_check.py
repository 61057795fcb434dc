"""benchmarks/gpu_check.py must be ready when a GPU is lent: its whole run (the 32B preset's
settings with offload, a tensor-parallel vLLM engine in dapo launch's environment, two
generate / dynamic-sampling / exchange / update / sync cycles, a DCP round trip) runs here on
CPU processes at a small shape, and prints a verdict per item."""

import json
import os
import re
from pathlib import Path

import pytest
from generator_patch import sitecustomize
from multiproc import run_script
from scale_support import need

need("transformers", "accelerate", "safetensors", "yaml", "vllm")

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
ROOT = Path(__file__).resolve().parents[1]
SHAPE = "--cpu --layers 2 --vocab 2048 --heads 2".split()
"""The model every CPU pass of the check builds: 2 layers, 2 heads of 64, 2,048 tokens."""
SMALL = [*SHAPE, *"--response 24 --prompt 8 --bucket-mb 4".split()]
"""The check at a shape 2 CPU processes run in seconds."""


def test_the_gpu_check_runs_end_to_end_on_cpu_and_gives_a_verdict_per_item(tmp_path, monkeypatch):
    # as NCCL: the group connects at its first collective, so its creation is no barrier
    monkeypatch.setenv("TORCH_GLOO_LAZY_INIT", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # as dapo launch writes it
    out = tmp_path / "gpu_check.json"
    # 2 prompts a round: the KV cache's fill matters on a GPU only (a setting, recorded, not an item)
    args = [*SMALL, "--prompts", "2", "--scratch", str(tmp_path / "scratch")]
    ranks = run_script(
        [str(ROOT / "benchmarks/gpu_check.py"), *args, "--max-tokens", "96", "--out", str(out)],
        nproc=2,
        timeout_s=420,
    )
    r = json.loads(out.read_text())
    assert "error" not in r, r.get("traceback")
    verdicts = {x["item"]: x["verdict"] for x in r["items"]}
    assert len(verdicts) == 10 and r["failed"] == [], r["items"]
    # what a CPU cannot show is said, not passed
    assert verdicts["sleep frees engine memory"] == "skipped"
    assert verdicts["load: FSDP2 shards offloaded to host memory"] == "skipped"
    assert all(
        v == "pass"
        for k, v in verdicts.items()
        if k not in ("sleep frees engine memory", "load: FSDP2 shards offloaded to host memory")
    )
    assert r["launch_env_inherited"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert r["engine_load_path"] in ("reload", "load_weights") and r["kv_fill_requested"] < 1
    assert [c["optimizer_steps"] for c in r["cycles"]] == [1, 1, 1]
    assert r["vllm"]["model_runner"] == "cpu" and r["vllm"]["version"].startswith("0.")  # recorded
    gaps = [c["logp_gap_mean"] for c in r["cycles"]]
    assert max(gaps[:2]) < 0.05 <= gaps[2]  # synced versions agree; the unsent one is seen
    table = ranks[0].stdout
    assert re.search(r"point-to-point exchange of the shares +pass", table) and "passed; details in" in table
    # its model, data and checkpoints (~0.5 GB at the real shape) do not outlive it
    assert r["scratch"].startswith("removed") and not any((tmp_path / "scratch").iterdir())


BREAK_EACH = """
import dataclasses, os, runpy, sys
sys.path.insert(0, {root!r})
import torch
import scale.learner.checkpoint as ckpt
import scale.learner.role as role
import scale.learner.sync as s
from scale.generator.rollout import GlobalDynamicSampler as GDS

rank = int(os.environ.get("RANK", "0"))
metrics, take, update, sync = GDS.metrics, GDS.take, role.run_update, s.sync

# dynamic sampling: each rank computes its own metrics (not the global ones)
GDS.metrics = lambda self: {{**metrics(self), "sampling/which_rank": float(rank)}}


def take_same(self):  # the exchange: every rank ends up with the same group (ids from 0 on each)
    batch = take(self)
    if batch is None:
        return batch
    ids = torch.unique(batch.group_ids, return_inverse=True)[1]
    return dataclasses.replace(batch, group_ids=ids.to(batch.group_ids.dtype))


def nan_update(*a, **k):  # the update: a non-finite loss
    return {{**update(*a, **k), "actor/loss": float("nan")}}


first = []


def wide_sync(engine, lm, **k):  # the sync: every tensor gathered at once (10 buckets' worth), and
    if not first:  # issue 47's false pass: after the first it loads nothing, only wakes the engine
        first.append(sync(engine, lm, **k))  # (and reports the first one's figures)
    else:
        engine.wake()
    stats = first[0]
    return dataclasses.replace(stats, peak_bytes=10 * max(stats.peak_bytes, stats.largest_tensor_bytes, 1))


GDS.take, role.run_update, s.sync = take_same, nan_update, wide_sync
real_load = ckpt.load


def load_without_optimizer(path, *, model, optimizer):  # DCP: the model back, the optimizer's state not
    real_load(path, model=model, optimizer=optimizer)
    for state in optimizer.state.values():
        for t in state.values():
            if isinstance(t, torch.Tensor):
                t.zero_()


ckpt.load = load_without_optimizer
sys.argv = [{script!r}, *sys.argv[1:]]
runpy.run_path({script!r}, run_name="__main__")
"""

BROKEN_ITEMS = [
    "engine: started in the launch environment",
    "dynamic sampling: global rounds and reports",
    "point-to-point exchange of the shares",
    "update: optimizer steps with a finite loss",
    "sync: memory within 2x the bucket",
    "engine = trainer after each sync (log-prob gap)",
    "DCP save and load of the sharded model and optimizer",
]


def test_each_item_of_the_gpu_check_fails_when_what_it_checks_is_broken(tmp_path, monkeypatch):
    """Issues 47 and 71: an item that cannot fail proves nothing. One run breaks, each in its own
    way, what seven items check: the launch environment (started with another allocator
    setting than dapo launch writes), dynamic sampling (per-rank metrics), the exchange (the
    same group on every rank), the update (a non-finite loss), the sync's memory (ten buckets
    at once), the sync itself (after the first it loads nothing and only wakes the engine: the
    false pass of issue 47, when one step at the preset's lr changed no bf16 weight; with the
    perturbed update the gap sees it) and DCP (a load that restores the model but not the
    optimizer's state, which the item's old three-parameter comparison passed): exactly those
    seven fail, by name; the control (the gap sees a version the engine was not sent) still
    passes. (The sync's break had a run of its own, 4 minutes of CI's CPU; together they break
    nothing the other needs.)"""
    from multiproc import MultiprocessError

    monkeypatch.setenv("TORCH_GLOO_LAZY_INIT", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "")  # the launch writes expandable_segments:True
    wrapper = tmp_path / "broken_each.py"
    wrapper.write_text(BREAK_EACH.format(root=str(ROOT), script=str(ROOT / "benchmarks/gpu_check.py")))
    out = tmp_path / "gpu_check.json"
    args = [*SMALL, "--prompts", "1", "--scratch", str(tmp_path / "scratch")]
    with pytest.raises(MultiprocessError):
        run_script([str(wrapper), *args, "--max-tokens", "96", "--out", str(out)], nproc=2, timeout_s=420)
    r = json.loads(out.read_text())
    assert "error" not in r, r.get("traceback")
    verdicts = {x["item"]: x["verdict"] for x in r["items"]}
    assert sorted(r["failed"]) == sorted(BROKEN_ITEMS), r["items"]
    assert verdicts["control: the gap sees a version the engine was not sent"] == "pass", r["items"]
    dcp = next(x for x in r["items"] if x["item"].startswith("DCP"))
    assert "differ: ['optim/" in dcp["value"] and "param/" not in dcp["value"].split("differ:")[1]
    assert not any((tmp_path / "scratch").iterdir())  # a failed check leaves nothing behind either


def disaggregated_check(tmp_path, env=None):
    """``--disaggregated`` at a shape one learner and one generator process run in about a
    minute: the JSON report and the finished process."""
    import subprocess
    import sys

    out = tmp_path / "gpu_check_disaggregated.json"
    args = [*SHAPE, "--disaggregated", "--response", "12"]
    args += ["--bucket-mb", "4", "--max-tokens", "96", "--timeout", "240", "--out", str(out)]
    args += ["--scratch", str(tmp_path / "scratch")]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gpu_check.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "DAPO_DIST_TIMEOUT_S": "60", **(env or {})},
    )
    r = json.loads(out.read_text())
    assert "error" not in r, (r.get("traceback"), done.stderr[-2000:])
    assert r["scratch"].startswith("removed") and not any((tmp_path / "scratch").iterdir())
    return r, done


LEG = "disaggregated: engine = learner at every step of the k = 0 leg (log-prob gap)"


def test_the_gpu_checks_disaggregated_phase_runs_on_cpu_and_gives_a_verdict_per_item(tmp_path):
    """``--disaggregated`` launches dapo train itself (1 FSDP2 learner + 1 vLLM generator
    process, k = 2, partial rollouts, 4 steps, then resumed for 3 steps at k = 0) and judges
    placement, staleness, weights, the log-prob gap at step 1 and at every k = 0 step, and the
    control (the gap sees stale versions: the weight decay makes every version differ); on
    CPU the placement item is skipped, not passed."""
    r, done = disaggregated_check(tmp_path)
    verdicts = {x["item"]: x["verdict"] for x in r["items"]}
    assert len(verdicts) == 9 and r["failed"] == [], r["items"]
    assert verdicts["disaggregated: placement and weight transport"] == "skipped"
    assert sum(v == "pass" for v in verdicts.values()) == 8
    assert r["staleness_max"] == [0, 1, 2, 2, 0, 0, 0] and r["weights_backend"] == "gloo"
    assert r["exit"] == [0] and r["k0_exit"] == [0]
    assert done.returncode == 0 and "passed; details in" in done.stdout


# in each generator process the vLLM engine's first weight load happens; every later one does nothing
BREAK_GENERATOR_LOADS = sitecustomize(
    "scale.generator.engines.vllm_engine",
    "VLLMEngine",
    "sync_weights",
    """
def wrap(real):
    calls = []

    def sync_weights(self, named_tensors):
        calls.append(1)
        if len(calls) == 1:
            real(self, named_tensors)

    return sync_weights
""",
)


def test_the_gpu_checks_disaggregated_phase_fails_a_generator_whose_loads_do_nothing(tmp_path):
    """The false pass of issue 47 (6b): a generator process whose engine loads its first
    version and nothing after it passed, the digests being those of the tensors it received.
    Each generator process of the run (the k = 2 run's, then the k = 0 leg's) loads only its
    first version: the k = 0 leg's gap fails by name (step 5, its first load, agrees), and the
    received-digest item still passes, which is why it is not enough."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BREAK_GENERATOR_LOADS)
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    r, done = disaggregated_check(tmp_path, {"PYTHONPATH": path})
    verdicts = {x["item"]: x["verdict"] for x in r["items"]}
    assert r["failed"] == [LEG], r["items"]
    assert verdicts["disaggregated: the generator received what the learner published (digests)"] == "pass"
    assert r["exit"] == [0] and r["k0_exit"] == [0] and len(r["logp_gap"]) == 7
    assert r["logp_gap"][4][0] < 0.05 <= r["logp_gap"][6][0]  # version 4 loaded; 6 not, 4 held
    assert done.returncode == 1 and f"FAILED: {LEG}" in done.stdout


ONE_GPU_ITEMS = {
    "allocator: started in the launch environment": "pass",
    "nccl: one-rank collectives on the GPU": "skipped",
    "train: bf16 steps of the trainer with the HF engine": "pass",
    "checkpoint: saved and resumed": "pass",
    "engine = learner: log-prob gap (bf16)": "pass",
    "LoRA: bf16 steps (the adapters train, the engine gets merged weights)": "skipped",
    "memory: the update's peak within dapo plan (full)": "skipped",
    "memory: the update's peak within dapo plan (lora)": "skipped",
    "LoRA: the update's peak below full fine-tuning's": "skipped",
    "vllm: the engine items (benchmarks/gpu_check.py)": "skipped",
}


def test_the_one_gpu_check_rehearses_on_cpu_and_says_what_it_cannot_run_here(tmp_path):
    """``--one-gpu`` (issue 71: the machine this project can be lent is one GPU without vLLM)
    runs dapo train itself: 2 steps with the HF engine checkpointed, resumed for a third, 2 LoRA
    steps. On CPU the same code path: what a CPU can show passes, the GPU-only items (NCCL,
    measured memory against dapo plan, the LoRA run whose items are memory, LoRA's saving, the
    vLLM items) say why they cannot run."""
    import subprocess
    import sys

    out = tmp_path / "one.json"
    args = [*SHAPE, "--one-gpu", "--response", "24", "--max-tokens", "96"]
    args += ["--timeout", "400", "--out", str(out), "--scratch", str(tmp_path / "scratch")]
    env = {
        **os.environ,
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gpu_check.py"), *args],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )
    r = json.loads(out.read_text())
    assert "error" not in r, (r.get("traceback"), done.stderr[-2000:])
    assert {x["item"]: x["verdict"] for x in r["items"]} == ONE_GPU_ITEMS, r["items"]
    assert all(x.get("why") for x in r["items"] if x["verdict"] == "skipped")
    assert r["failed"] == [] and done.returncode == 0 and "cannot run here: no CUDA device" in done.stdout
    assert r["planned_train_gib"]["lora"] < r["planned_train_gib"]["full"]  # the plan's arithmetic, recorded
    assert r["scratch"].startswith("removed") and not any((tmp_path / "scratch").iterdir())
