"""Guards for the tooling that checks the tests: a reformat or refactor must not silently
disable a seeded bug (``nox -s mutation`` would then report it as caught without running it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bugs():
    spec = importlib.util.spec_from_file_location("seeded_bugs", ROOT / "tests/mutation/seeded_bugs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["seeded_bugs"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.BUGS


@pytest.mark.parametrize("bug", _bugs(), ids=lambda b: b.name)
def test_every_seeded_bug_still_applies_exactly_once(bug):
    source = (ROOT / bug.file).read_text()
    assert source.count(bug.old) == 1, f"{bug.file}: the seeded bug's target text is gone or ambiguous"
    assert bug.new != bug.old
