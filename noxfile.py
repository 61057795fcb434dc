"""From toy to full scale. Each session installs what it needs from this repo's files.

    nox -s tests        unit, property and toy-experiment tests (CPU, a few minutes)
    nox -s toy          the four failure-mode experiments (the main job, ~1 minute)
    nox -s bench_toy    the toy speed benchmark -> benchmarks/results/toy_speed.json

torch: sessions install ``$DAPO_TORCH`` first (default ``torch==2.13.0``, the CPU wheel
these CI machines carry on disk; on a GPU cluster set DAPO_TORCH=torch or your CUDA build).
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

TORCH = os.environ.get("DAPO_TORCH", "torch==2.13.0")


def _install(session: nox.Session, extras: str) -> None:
    session.install(TORCH)
    session.install("-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """Unit, property (hypothesis) and toy-experiment tests."""
    _install(session, "dev")
    session.run("pytest", "-q", *session.posargs)


@nox.session
def toy(session: nox.Session) -> None:
    """The main job: every failure-mode experiment, 10 paired seeds, verdicts and figures."""
    _install(session, "toy,report")
    session.run("dapo", "toy", "run", "all", "--seeds", "10", "--out", "runs/toy", *session.posargs)


@nox.session
def bench_toy(session: nox.Session) -> None:
    """Wall time of the toy suite against a serial baseline (committed as JSON)."""
    _install(session, "toy")
    session.run("python", "benchmarks/toy_speed.py")
