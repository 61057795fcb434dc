"""Skip scale tests when the scale extra is missing, unless DAPO_REQUIRE_SCALE=1 (set by
the nox session, so CI never passes by skipping)."""

import importlib.util
import os

import pytest

REQUIRED = os.environ.get("DAPO_REQUIRE_SCALE") == "1"


def need(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        if REQUIRED:
            raise RuntimeError(f"DAPO_REQUIRE_SCALE=1 but {missing} are not installed")
        pytest.skip(f"needs {missing} (pip install 'dapo-repro[scale]')", allow_module_level=True)
