"""The noxfile's own behaviour that users see: no misleading "uv binary not found." line, and
a reused environment that skips pip when nothing it depends on changed."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import pytest

pytest.importorskip("nox")


def _noxfile():
    """The noxfile as a module, its sessions kept out of nox's registry (a second load would
    register them again, which nox warns about)."""
    import nox.registry

    spec = importlib.util.spec_from_file_location(
        "noxfile_under_test", Path(__file__).parents[1] / "noxfile.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["noxfile_under_test"] = module
    saved = dict(nox.registry._REGISTRY)
    try:
        spec.loader.exec_module(module)
    finally:
        nox.registry._REGISTRY.clear()
        nox.registry._REGISTRY.update(saved)
    return module


def test_the_uv_notice_is_dropped_and_nothing_else():
    from nox.logger import logger

    _noxfile()

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("nox", logging.INFO, __file__, 1, msg, None, None)

    assert not logger.filter(record("uv binary not found."))
    assert logger.filter(record("Creating virtual environment (virtualenv) using python in .nox/tests"))
    assert logger.filter(record("uv binary not found. (and more)"))


class _Session:
    """What ``_install`` uses of a nox session, recording each pip call."""

    def __init__(self, venv):
        self.virtualenv = type("V", (), {"location": str(venv)})()
        self.calls = []

    def log(self, *args):
        pass

    def install(self, *args):
        self.calls.append(("install", *args))

    def run_install(self, *args, **kwargs):
        self.calls.append(("run_install", *args))


def test_a_reused_environment_skips_pip_until_what_it_was_built_from_changes(tmp_path, monkeypatch):
    nf = _noxfile()
    first = _Session(tmp_path)
    nf._install(first, "toy,report,gate")
    assert [c[:2] for c in first.calls] == [("install", nf.TORCH), ("install", "-e")]
    again = _Session(tmp_path)
    nf._install(again, "toy,report,gate")
    assert again.calls == []  # the stamp matches: no pip at all
    other = _Session(tmp_path)
    nf._install(other, "dev,scale,scale-cpu,peers")  # other extras: installs, peers and the cleanup too
    assert ("install", "--no-deps", *nf.PEERS) in other.calls
    assert any(c[0] == "run_install" and "uninstall" in c for c in other.calls)
    monkeypatch.setattr(nf, "TORCH", "torch==9.9")  # another torch spec: installs again
    changed = _Session(tmp_path)
    nf._install(changed, "dev,scale,scale-cpu,peers")
    assert changed.calls and changed.calls[0] == ("install", "torch==9.9")
