"""The noxfile's own behaviour that users see: no misleading "uv binary not found." line."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import pytest

pytest.importorskip("nox")


def test_the_uv_notice_is_dropped_and_nothing_else():
    from nox.logger import logger

    spec = importlib.util.spec_from_file_location(
        "noxfile_under_test", Path(__file__).parents[1] / "noxfile.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["noxfile_under_test"] = module
    spec.loader.exec_module(module)

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("nox", logging.INFO, __file__, 1, msg, None, None)

    assert not logger.filter(record("uv binary not found."))
    assert logger.filter(record("Creating virtual environment (virtualenv) using python in .nox/tests"))
    assert logger.filter(record("uv binary not found. (and more)"))
