"""The ``dapo`` command. Subcommands live in their own packages and are imported only when
run, so ``dapo --help`` works with nothing but the core installed."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__

# name -> (one-line help, "module:function" taking argv and returning an exit code, extra)
COMMANDS: dict[str, tuple[str, str, str | None]] = {
    "version": ("print the version", "dapo.cli:_version", None),
    "toy": ("toy regime: failure-mode experiments, ladder, factorial", "toybench.cli:main", "toy"),
    "diagnose": ("diagnose a run's metrics against reference curves", "dapo.health_cli:main", None),
    "train": ("full regime: DAPO training from a YAML config", "scale.cli:train_main", "scale"),
    "eval": ("evaluate a model: avg@k, pass@k, cons@k", "scale.cli:eval_main", "scale"),
    "plan": ("estimate memory and step time of a run on a cluster", "scale.plan:main", None),
    "launch": ("generate a multi-node launch (slurm, torchrun, accelerate)", "scale.launch:main", None),
    "gate": ("write or check the toy gate in front of full-scale runs", "scale.gate:main", None),
}


def _version(argv: list[str]) -> int:
    print(f"dapo {__version__}")
    return 0


def _available(target: str) -> bool:
    module = target.split(":")[0]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {k: v for k, v in COMMANDS.items() if _available(v[1])}
    parser = argparse.ArgumentParser(
        prog="dapo",
        description="DAPO, checkable: toy failure-mode benchmarks, run diagnosis, full-scale training.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {k:<10} {v[0]}" for k, v in commands.items())
        + "\n\n`dapo COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"dapo {__version__}")
    parser.add_argument("command", choices=sorted(commands), metavar="COMMAND")
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    if not argv:
        parser.print_help()
        return 2
    ns = parser.parse_args(argv[:1])
    _, target, extra = commands[ns.command]
    module, func = target.split(":")
    try:
        fn = getattr(importlib.import_module(module), func)
    except ImportError as err:
        hint = f" Install it with: pip install 'dapo-repro[{extra}]'" if extra else ""
        print(f"dapo {ns.command}: a dependency is missing ({err.name or err}).{hint}", file=sys.stderr)
        return 3
    return int(fn(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
