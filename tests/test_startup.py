"""scale/dist/startup.py: a trainer process imports its heavy libraries with the collector
paused and freezes them, and what it creates afterwards (process groups above all) is still
collected at teardown, after an engine froze and unfroze it too, and at the interpreter's exit."""

import gc
import subprocess
import sys
import weakref

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


class _Cycle:
    def __init__(self) -> None:
        self.me = self  # only a collection that walks it frees it


def _frozen_garbage() -> weakref.ref:
    """A reference cycle that is garbage once frozen: a collection frees it only after an
    unfreeze, so whether it is still alive says whether *it* is still frozen, whatever other
    threads (pytest-xdist's I/O thread) free or freeze meanwhile (the interpreter-wide
    ``gc.get_freeze_count()`` moves with them: it failed this test 2 of 2 fresh-clone runs)."""
    cycle = _Cycle()
    ref = weakref.ref(cycle)
    gc.freeze()
    del cycle
    return ref


def test_an_unfreeze_inside_the_teardown_happens_once_at_its_end(restore_gc):
    gc.unfreeze()
    unfreeze = gc.unfreeze
    frozen = _frozen_garbage()
    with startup.unfreeze_deferred():
        gc.unfreeze()  # vLLM's engine shutdown
        gc.collect()
        assert frozen() is not None  # its collections walk only the young heap
    assert gc.unfreeze is unfreeze and gc.get_freeze_count() == 0  # unfrozen once, at the end
    gc.collect()
    assert frozen() is None  # the next full collection reaches what was frozen

    kept = _frozen_garbage()
    with startup.unfreeze_deferred():  # nobody asked: the heap stays frozen
        gc.collect()
    gc.collect()
    assert kept() is not None and gc.get_freeze_count() > 0

    with pytest.raises(RuntimeError), startup.unfreeze_deferred():
        gc.unfreeze()
        raise RuntimeError("a failed teardown")
    assert gc.unfreeze is unfreeze  # the real function is back, even after a raise
    gc.collect()
    assert kept() is None  # and the unfreeze it noted before the raise was made


@pytest.mark.multiprocess
def test_a_group_an_engine_froze_is_released_after_a_deferred_unfreeze():
    run_script(["tests/freeze_worker.py", "engine"], nproc=2, timeout_s=120)


@pytest.mark.multiprocess
def test_a_group_an_engine_froze_and_never_unfroze_would_outlive_teardown():
    """The control: it is the deferred unfreeze at the teardown's end that releases it."""
    with pytest.raises(MultiprocessError) as err:
        run_script(["tests/freeze_worker.py", "engine-kept-frozen"], nproc=2, timeout_s=120)
    assert f": exit status {LEAK_STATUS}" in str(err.value)


CYCLE = """
import gc
from scale.dist import startup

class Cycle:
    def __init__(self):
        self.me = self  # garbage as soon as it is made, but only a collection reaches a cycle
    def __del__(self):
        print("finalized", flush=True)

"""


@pytest.mark.parametrize(
    ("freeze", "finalized"),
    [
        ("with startup.frozen_after():\n    Cycle()\n", True),
        ("gc.disable()\nCycle()\ngc.freeze()\n", False),  # the control: gc.freeze() alone
    ],
    ids=["frozen_after", "control-gc.freeze"],
)
def test_what_was_frozen_is_finalized_at_the_interpreters_exit(freeze, finalized):
    """A frozen extension object is never freed otherwise (nanobind, under vLLM, then prints
    dozens of lines of leaked instances at exit, even after a one-line refusal)."""
    out = subprocess.run([sys.executable, "-c", CYCLE + freeze], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert ("finalized" in out.stdout) is finalized, out
