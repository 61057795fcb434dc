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
        self.bin = str(Path(venv) / "bin")
        self.calls = []

    def log(self, *args):
        pass

    def install(self, *args):
        self.calls.append(("install", *args))

    def run_install(self, *args, **kwargs):
        self.calls.append(("run_install", *args))


def test_a_reused_environment_skips_pip_until_what_it_was_built_from_changes(tmp_path, monkeypatch):
    nf = _noxfile()
    monkeypatch.setattr(nf, "_uv", lambda: None)  # a machine without uv: the environment's pip
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


def test_with_uv_every_install_goes_through_uv_into_the_sessions_environment(tmp_path, monkeypatch):
    """Where uv is installed beside nox, torch, the package, the peers and the cleanup all go
    through it, into the session's own interpreter, with pip's indexes carried over."""
    nf = _noxfile()
    monkeypatch.setattr(nf, "_uv", lambda: "/opt/uv/bin/uv")
    monkeypatch.setattr(nf, "_pip_index_flags", lambda: ("--find-links", "/wheels"))
    s = _Session(tmp_path)
    nf._install(s, "dev,scale,scale-cpu,peers")
    python = str(tmp_path / "bin" / "python")
    install = ("run_install", "/opt/uv/bin/uv", "pip", "install", "--find-links", "/wheels", "--quiet")
    assert s.calls == [
        (*install, "--python", python, nf.TORCH),
        (*install, "--python", python, "-e", ".[dev,scale,scale-cpu,peers]"),
        (*install, "--python", python, "--no-deps", *nf.PEERS),
        ("run_install", "/opt/uv/bin/uv", "pip", "uninstall", "--quiet", "--python", python, *nf.UNUSED),
    ]
    assert nf._installed(_Session(tmp_path), nf._stamp("dev,scale,scale-cpu,peers"))


def test_pips_index_configuration_becomes_uvs_flags():
    """What ``pip config list`` prints, from pip.conf scopes and ``$PIP_*`` (pip 23-26 quote
    values with single quotes, or double where the value holds one): the environment's index
    wins, every extra index and find-links location is kept once, other keys are ignored."""
    nf = _noxfile()
    base = ("--compile-bytecode", "--index-strategy", "unsafe-best-match")
    assert nf.uv_flags("") == base
    listing = "\n".join(
        [
            "global.cert='/etc/ssl/certs/ca-certificates.crt'",
            "global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'",
            "global.find-links='/opt/wheels'",
            "global.index-url='https://mirror.example/simple'",
            "install.index-url='https://install.example/simple'",
            ":env:.default-timeout='180'",
            ":env:.find-links='/opt/wheels'",
            ':env:.index-url="https://env.example/simple?user=o\'brien"',
            "user.extra-index-url='https://extra.example/simple'",
        ]
    )
    assert nf.uv_flags(listing) == (
        *base,
        "--index-url",
        "https://env.example/simple?user=o'brien",
        "--extra-index-url",
        "file:///opt/pypi/simple",
        "--extra-index-url",
        "file:///opt/pypi-more/simple",
        "--extra-index-url",
        "https://extra.example/simple",
        "--find-links",
        "/opt/wheels",
    )
    assert nf.uv_flags("global.no-index='true'\n:env:.no-index='0'") == base  # the environment wins
    assert nf.uv_flags("global.no-index='yes'") == (*base, "--no-index")


@pytest.mark.parametrize("status, found", [(0, True), (1, False)])
def test_a_uv_on_path_that_does_not_run_is_none(tmp_path, monkeypatch, status, found):
    """A shim on PATH (pyenv's, for a Python without uv) exits nonzero: the sessions use pip
    then, rather than fail at their first install."""
    nf = _noxfile()
    fake = tmp_path / "uv"
    fake.write_text(f"#!/bin/sh\nexit {status}\n")
    fake.chmod(0o755)
    monkeypatch.setitem(sys.modules, "uv", None)  # no uv package: PATH only
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nf._uv.__wrapped__() == (str(fake) if found else None)
