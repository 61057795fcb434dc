"""scale/dist/startup.py: a trainer process imports its heavy libraries with the collector
paused and freezes them, and what it creates afterwards (process groups above all) is still
collected at teardown."""

import gc
import sys

import pytest
from multiproc import LEAK_STATUS, MultiprocessError, run_script

from scale.dist import startup


@pytest.fixture
def restore_gc():
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


def test_the_imported_heap_is_frozen_and_the_collector_left_as_it_was(restore_gc):
    gc.unfreeze()
    gc.enable()
    startup.import_and_freeze(learner=True, vllm=False)
    assert gc.isenabled() and gc.get_freeze_count() > 100_000  # torch and transformers alone
    assert all(name in sys.modules for name in startup.heavy_modules(learner=True, vllm=False))
    gc.disable()
    startup.import_and_freeze(learner=False, vllm=False)
    assert not gc.isenabled()  # a caller's paused collector stays paused


def test_each_role_imports_what_it_uses_and_a_missing_library_is_left_to_its_user(restore_gc, monkeypatch):
    base = startup.heavy_modules(learner=False, vllm=False)
    assert "vllm" not in base and "accelerate" not in base  # a disaggregated run's generator: no accelerate
    assert startup.heavy_modules(learner=True, vllm=False) == [*base, "accelerate"]  # its learners: no engine
    assert startup.heavy_modules(learner=True, vllm=True) == [*base, "accelerate", "vllm"]  # a colocated rank
    monkeypatch.setattr(startup, "heavy_modules", lambda **kw: ["json", "no_such_library_here"])
    startup.import_and_freeze(
        learner=True, vllm=True
    )  # no ImportError: the code that needs it says what to install
    assert gc.get_freeze_count() > 0 and gc.isenabled()


@pytest.mark.multiprocess
def test_a_group_created_after_the_freeze_is_released_at_teardown():
    run_script(["tests/freeze_worker.py", "before"], nproc=2, timeout_s=120)


@pytest.mark.multiprocess
def test_a_group_frozen_with_the_imports_would_outlive_teardown():
    """The control: the rule (freeze before any group exists) is what keeps the group
    collectable; frozen, the cycle that holds it is never collected."""
    with pytest.raises(MultiprocessError) as err:
        run_script(["tests/freeze_worker.py", "after"], nproc=2, timeout_s=120)
    assert "outlived destroy_process_group()" in str(err.value)
    assert f": exit status {LEAK_STATUS}" in str(err.value)
