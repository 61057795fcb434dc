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


@pytest.fixture(scope="session")
def toy_results():
    """The four failure-mode experiments at their declared seeds (run once per session)."""
    from toybench.experiment import run_experiments
    from toybench.experiments import REGISTRY

    return {r.experiment.name: r for r in run_experiments(list(REGISTRY.values()), seeds=10, jobs=2)}


# With several workers (``pytest -n 2 --dist loadgroup``, what ``nox -s tests`` runs) a file's
# tests stay together on one worker (its module fixtures, such as a loss corpus, are built
# once), and what takes minutes starts first, so that no worker begins a long file when the
# others are nearly done. test_scale_trainer.py (a third of the suite's time, one `dapo train`
# per test) is split in two halves, one per worker, each building its own tiny model; running
# its tests one by one instead puts several multi-process runs on the two cores at once, which
# measured slower (2026-12-03: 59 tests done after 16 minutes). What each test checks is unchanged.
SLOW_FIRST = (
    "test_scale_trainer.py",
    "test_check.py",
    "test_gpu_check.py",
    "test_health.py",
    "test_toy_engine.py",
    "test_toy_off_policy_family.py",
    "test_toy_suite.py",
    "test_multiproc.py",
    "test_rollout.py",
)
HALVES = {"test_scale_trainer.py"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))
    seen: dict[str, int] = {}
    for item in items:
        name = item.path.name
        group = name
        if name in HALVES:  # alternate, in file order: each half gets long and short tests
            i = seen[name] = seen.get(name, -1) + 1
            group = f"{name}:{i % 2}"
        item.add_marker(pytest.mark.xdist_group(group))
