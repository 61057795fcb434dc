"""The ``dapo`` command. Subcommands live in their own packages and are imported only when
run, so ``dapo --help`` works with nothing but the core installed."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from . import __version__
from .cliargs import EXIT_DEPENDENCY, EXIT_USAGE, DependencyError, Parser, UsageError

# name -> (one-line help, "module:function" taking argv and returning an exit code,
#          "module:function" returning the command's argparse parser, for --help and the fuzz test)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "version": ("print the version", "dapo.cli:_version", "dapo.cli:_version_parser"),
    "toy": (
        "toy regime: failure-mode experiments, ladder, factorial, health suite",
        "toybench.cli:main",
        "toybench.cli:build_parser",
    ),
    "diagnose": (
        "diagnose a run's health from its training log (this trainer's, verl's, TRL's, W&B, TensorBoard)",
        "dapo.health.cli:main",
        "dapo.health.cli:build_parser",
    ),
    "train": (
        "full regime: DAPO training from a YAML config",
        "scale.ops.cli:train_main",
        "scale.ops.cli:train_parser",
    ),
    "eval": (
        "evaluate a model: avg@k, pass@k, cons@k",
        "scale.ops.cli:eval_main",
        "scale.ops.cli:eval_parser",
    ),
    "export": (
        "a sharded training checkpoint -> one safetensors model directory",
        "scale.ops.cli:export_main",
        "scale.ops.cli:export_parser",
    ),
    "plan": (
        "estimate memory and step time of a run on a cluster",
        "scale.ops.plan:main",
        "scale.ops.plan:build_parser",
    ),
    "stage": (
        "fetch a config's model and data once, for runs with the hub offline",
        "scale.ops.stage:main",
        "scale.ops.stage:build_parser",
    ),
    "launch": (
        "generate a multi-node launch (slurm, torchrun, accelerate)",
        "scale.ops.launch:main",
        "scale.ops.launch:build_parser",
    ),
    "gate": (
        "write or check the toy gate in front of full-scale runs",
        "scale.ops.gate:main",
        "scale.ops.gate:build_parser",
    ),
}

EXIT_IO = 74
"""Exit status when the operating system refuses a file operation (BSD's EX_IOERR)."""

EXIT_INTERNAL = 70
"""Exit status of an unexpected internal error (BSD's EX_SOFTWARE); the traceback is in a log."""

# optional dependency -> the extra that provides it
OPTIONAL = {
    "gymnasium": "toy",
    "scipy": "toy",
    "seaborn": "report",
    "matplotlib": "report",
    "pandas": "report",
    "transformers": "scale",
    "accelerate": "scale",
    "datasets": "scale",
    "safetensors": "scale",
    "tokenizers": "scale",
    "yaml": "scale",
    "vllm": "vllm",
}


def _version_parser() -> argparse.ArgumentParser:
    return Parser(prog="dapo version", description="Print the version.")


def _version(argv: list[str]) -> int:
    _version_parser().parse_args(argv)
    print(f"dapo {__version__}")
    return 0


def resolve(target: str) -> Any:
    """The object a ``"module:function"`` entry of :data:`COMMANDS` names."""
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def _crash_log(command: str) -> Path:
    """Write the current exception's traceback to a log and return its path (``runs/logs/``,
    or the temporary directory if that cannot be written)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    text = f"dapo {command} (pid {os.getpid()}, {stamp})\nargv: {sys.argv}\n\n{traceback.format_exc()}"
    for folder in (Path("runs/logs"), Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"dapo-{command}-{stamp}-{os.getpid()}.log"
            path.write_text(text)
            return path.resolve()
        except OSError:
            continue
    raise RuntimeError("no writable directory for the crash log")


def _available(target: str) -> bool:
    module = target.split(":")[0]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {k: v for k, v in COMMANDS.items() if _available(v[1])}
    parser = Parser(
        prog="dapo",
        description="DAPO, checkable: toy failure-mode benchmarks, run diagnosis, full-scale training.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n"
        + "\n".join(f"  {k:<10} {v[0]}" for k, v in commands.items())
        + "\n\n`dapo COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"dapo {__version__}")
    parser.add_argument("command", choices=sorted(commands), metavar="COMMAND")
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    if not argv:
        parser.print_help()
        return 2
    if argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    try:
        ns = parser.parse_args(argv[:1])
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    command = ns.command
    try:
        return int(resolve(commands[command][1])(argv[1:]) or 0)
    except UsageError as err:
        print(f"dapo {command}: {err}", file=sys.stderr)
        return EXIT_USAGE
    except DependencyError as err:
        print(f"dapo {command}: {err}", file=sys.stderr)
        return EXIT_DEPENDENCY
    except SystemExit as exit_:  # argparse (--help, a bad argument) inside the command
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        if top not in OPTIONAL:
            return _internal(command)
        extra = "gate" if command == "gate" else OPTIONAL[top]  # the gate needs only YAML
        print(
            f"dapo {command}: needs {top}, which is not installed. Install it with: "
            f"pip install 'dapo-repro[{extra}]'",
            file=sys.stderr,
        )
        return EXIT_DEPENDENCY
    except ImportError as err:  # an engine that names the extra it needs (scale/generator/engines)
        if "pip install" not in str(err):
            return _internal(command)
        print(f"dapo {command}: {str(err).splitlines()[0]}", file=sys.stderr)
        return EXIT_DEPENDENCY
    except KeyboardInterrupt:
        print(f"dapo {command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `dapo diagnose LOG | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141
    except OSError as err:  # a read-only mount, a full disk, a file removed under us
        if err.filename is None:
            return _internal(command)
        path = _crash_log(command)
        print(
            f"dapo {command}: {err.strerror or err}: {err.filename} (details in {path})",
            file=sys.stderr,
        )
        return EXIT_IO
    except Exception:
        return _internal(command)


def _internal(command: str) -> int:
    """One line for an unexpected error, the traceback in a log (``DAPO_DEBUG=1`` re-raises)."""
    if os.environ.get("DAPO_DEBUG"):
        raise
    err = sys.exc_info()[1]
    path = _crash_log(command)
    first = (str(err).splitlines() or [""])[0]
    print(
        f"dapo {command}: internal error: {type(err).__name__}: {first} (traceback in {path}; "
        "please report it with that file)",
        file=sys.stderr,
    )
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
