"""The ``dapo`` command. Subcommands live in their own packages and are imported only when
run, so ``dapo --help`` works with nothing but the core installed."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__

# name -> (one-line help, "module:function" taking argv and returning an exit code)
COMMANDS: dict[str, tuple[str, str]] = {
    "version": ("print the version", "dapo.cli:_version"),
    "toy": ("toy regime: failure-mode experiments, ladder, factorial, health suite", "toybench.cli:main"),
    "diagnose": ("diagnose a run's metrics against reference curves", "dapo.health_cli:main"),
    "train": ("full regime: DAPO training from a YAML config", "scale.cli:train_main"),
    "eval": ("evaluate a model: avg@k, pass@k, cons@k", "scale.cli:eval_main"),
    "plan": ("estimate memory and step time of a run on a cluster", "scale.plan:main"),
    "launch": ("generate a multi-node launch (slurm, torchrun, accelerate)", "scale.launch:main"),
    "gate": ("write or check the toy gate in front of full-scale runs", "scale.gate:main"),
}


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
    "tqdm": "scale",
    "vllm": "vllm",
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
    ns = parser.parse_args(argv[:1])
    _, target = commands[ns.command]
    module, func = target.split(":")
    try:
        fn = getattr(importlib.import_module(module), func)
        return int(fn(argv[1:]) or 0)
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        if top not in OPTIONAL:
            raise
        print(
            f"dapo {ns.command}: needs {top}, which is not installed. Install it with: "
            f"pip install 'dapo-repro[{OPTIONAL[top]}]'",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
