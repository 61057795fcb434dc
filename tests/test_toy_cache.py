"""The toy runs kept on disk (toybench.memo): a second process reads back the built-in losses'
runs a first one trained, exactly; nothing else is read back (a user's loss, another code
version, a damaged or foreign file), and nothing is kept when the cache is off."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toybench import memo

ROOT = Path(__file__).resolve().parents[1]

# one small check experiment in a fresh process: what it trained, what it read back, its logs
SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from dapo.registry import resolve
from toybench.check import derived_experiment
from toybench.experiment import run_experiments, with_steps
from toybench.check import MODES

losses = [resolve("cispo"), resolve("broken_losses:symmetric_clip")]
exp = with_steps(derived_experiment(MODES["entropy_collapse"], losses, {{}}), 8)
stats = {{}}
res = run_experiments([exp], seeds=2, jobs=1, progress=False, memo=True, stats=stats)[0]
print(json.dumps({{"stats": stats, "logs": repr(res.logs)}}))
"""


def one_process(cache) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(tests=str(ROOT / "tests"))],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**__import__("os").environ, "DAPO_TOY_CACHE": str(cache), "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def files(cache: Path) -> list[Path]:
    return sorted(cache.glob("*/*.json.gz"))


def test_a_second_process_reads_back_the_built_in_runs_exactly_and_retrains_the_users(tmp_path):
    """4 arms x 4 seeds (2 per block): the unprotected arm, the fix and cispo (built in) are
    kept, the user's loss is not: a second process trains 4 runs, not 16, and its logs are the
    first's to the last digit. A file cut short, and a file holding another run, are misses:
    trained again and rewritten."""
    cache = tmp_path / "cache"
    first = one_process(cache)
    assert (first["stats"]["runs"], first["stats"]["reused"]) == (16, 0)
    assert len(files(cache)) == 12  # the user's loss is code that can change: never kept
    second = one_process(cache)
    assert (second["stats"]["runs"], second["stats"]["reused"]) == (4, 12)
    assert second["logs"] == first["logs"]
    kept = files(cache)
    kept[0].write_bytes(kept[0].read_bytes()[:40])  # cut short, as by a full disk
    kept[2].write_bytes(kept[1].read_bytes())  # another run's contents under this run's name
    third = one_process(cache)
    assert (third["stats"]["runs"], third["stats"]["reused"]) == (6, 10)
    assert third["logs"] == first["logs"]
    assert len(files(cache)) == 12 and files(cache)[0].stat().st_size > 40  # rewritten whole


KEY = ("batched", "RunSpec(task='x', loss='dapo', seed=3)")
LOG = [{"actor/entropy": 0.5, "toy/expected_accuracy": float("nan")}, {"actor/entropy": 1e-300}]


def test_a_log_read_back_is_the_log_written_and_another_code_version_reads_nothing(tmp_path, monkeypatch):
    """NaN, denormals and every digit survive the file; a change to the source of toybench or
    dapo (another fingerprint) misses; the oldest versions' folders go beyond KEEP_VERSIONS."""
    monkeypatch.setenv("DAPO_TOY_CACHE", str(tmp_path))
    memo.clear()
    memo.put(KEY, LOG)
    memo.clear()  # this process forgets: the disk answers
    assert repr(memo.get(KEY)) == repr(LOG)
    got = memo.get(KEY)
    got[0]["actor/entropy"] = -1.0  # a caller's copy
    assert repr(memo.get(KEY)) == repr(LOG)
    memo.clear()
    for version in range(memo.KEEP_VERSIONS + 1):
        monkeypatch.setattr(memo, "fingerprint", lambda v=version: f"version{v}")
        assert memo.get(KEY) is None  # each version trains its own runs
        memo.put(KEY, LOG)
        memo.clear()
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert len(folders) == memo.KEEP_VERSIONS and f"version{memo.KEEP_VERSIONS}" in folders
    memo.clear()


@pytest.mark.parametrize("value", ["off", "0", ""])
def test_the_cache_off_keeps_nothing_on_disk(tmp_path, monkeypatch, value):
    monkeypatch.setenv("DAPO_TOY_CACHE", value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    memo.clear()
    memo.put(KEY, LOG)
    memo.clear()
    assert memo.get(KEY) is None and not any(tmp_path.rglob("*.json.gz"))
    assert memo.cache_dir() is None


def test_the_default_cache_is_under_the_users_cache_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("DAPO_TOY_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert memo.cache_dir() == tmp_path / "dapo" / "toy-runs"
