"""Command-line arguments checked at the boundary: every value is parsed and range-checked
before any work starts, and a bad one ends the command with one line on stderr naming the
argument, and exit status 2.

Each option of every ``dapo`` command takes its ``type=`` from here (or ``choices=``), so
``tests/test_cli_fuzz.py`` can read what is valid from the parser itself: the range of an
:class:`Int`, the kind of file an :class:`InFile` must hold. A new option is then fuzzed
without anyone writing a test for it, and an option declared with a bare ``type=int`` fails
that test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

EXIT_USAGE = 2
"""Exit status for bad input (argparse's own)."""


class UsageError(Exception):
    """Bad user input found after parsing (a relation between arguments, a file's content).
    :func:`dapo.cli.main` prints ``prog: message`` and exits with :data:`EXIT_USAGE`."""


EXIT_DEPENDENCY = 3
"""Exit status when an optional dependency is missing or does not load."""


class DependencyError(Exception):
    """An installed package that the command needs is missing or broken; the message says
    the command that fixes it. :func:`dapo.cli.main` prints it in one line and exits with
    :data:`EXIT_DEPENDENCY`."""


class Parser(argparse.ArgumentParser):
    """``argparse`` that reports a bad argument in one line (``prog: argument --x: why``)
    instead of the usage block followed by the error, and names the option a mistyped one is
    closest to (``unrecognized arguments: --run-lable (did you mean --run-label?)``), among the
    options of the (sub)command that was given it."""

    _left_over: Parser | None = None
    """The innermost parser of the current ``parse_args`` that left arguments unrecognised."""

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        Parser._left_over = None
        return super().parse_args(args, namespace)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        if extras and Parser._left_over is None:
            Parser._left_over = self
        return ns, extras

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            message = prefix + " ".join(
                _did_you_mean(word, Parser._left_over or self) for word in message[len(prefix) :].split()
            )
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _did_you_mean(word: str, parser: argparse.ArgumentParser) -> str:
    """``word``, with the closest option of ``parser`` when it looks like a mistyped one."""
    import difflib

    if not word.startswith("--"):
        return word
    name = word.split("=", 1)[0]
    options = [o for o in parser._option_string_actions if o.startswith("--")]
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.7)
    return f"{word} (did you mean {close[0]}?)" if close else word


class Int:
    """An integer in ``[lo, hi]`` (either bound optional); ``why`` is added to the message."""

    def __init__(self, lo: int | None = None, hi: int | None = None, why: str = ""):
        self.lo, self.hi = lo, hi
        self.why = f" ({why})" if why else ""
        self.__name__ = "integer"

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if self.lo is not None and value < self.lo:
            raise argparse.ArgumentTypeError(f"must be >= {self.lo}{self.why}, got {value}")
        if self.hi is not None and value > self.hi:
            raise argparse.ArgumentTypeError(f"must be <= {self.hi}{self.why}, got {value}")
        return value

    def __repr__(self) -> str:
        return f"Int(lo={self.lo}, hi={self.hi})"


class Float:
    """A finite number in ``(lo, hi]`` / ``[lo, hi]`` (``lo_open`` says which)."""

    def __init__(self, lo: float | None = None, hi: float | None = None, lo_open: bool = False):
        self.lo, self.hi, self.lo_open = lo, hi, lo_open
        self.__name__ = "number"

    def __call__(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            raise argparse.ArgumentTypeError(
                f"must be {'>' if self.lo_open else '>='} {self.lo:g}, got {value:g}"
            )
        if self.hi is not None and value > self.hi:
            raise argparse.ArgumentTypeError(f"must be <= {self.hi:g}, got {value:g}")
        return value

    def __repr__(self) -> str:
        return f"Float(lo={self.lo}, hi={self.hi}, lo_open={self.lo_open})"


class InFile:
    """An existing, readable file. ``kind="json"`` also parses it (a file that is not JSON
    is refused here, with the parser's line and column)."""

    def __init__(self, kind: str | None = None):
        if kind not in (None, "json"):
            raise ValueError(f"unknown file kind {kind!r}")
        self.kind = kind
        self.__name__ = "file"

    def __call__(self, text: str) -> Path:
        path = Path(text)
        if not text or not path.exists():
            raise argparse.ArgumentTypeError(f"no such file: {text!r}")
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"not a file: {text!r}")
        try:
            content = path.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise argparse.ArgumentTypeError(f"cannot read {text!r}: {err}") from None
        if self.kind == "json":
            try:
                json.loads(content)
            except json.JSONDecodeError as err:
                raise argparse.ArgumentTypeError(f"{text!r} is not valid JSON: {err}") from None
        return path

    def __repr__(self) -> str:
        return f"InFile(kind={self.kind!r})"


class InDir:
    """An existing directory."""

    __name__ = "directory"

    def __call__(self, text: str) -> Path:
        path = Path(text)
        if not text or not path.is_dir():
            raise argparse.ArgumentTypeError(f"no such directory: {text!r}")
        return path

    def __repr__(self) -> str:
        return "InDir()"


def _writable_target(path: Path) -> str | None:
    """Why ``path`` cannot be created or written, or None."""
    parent = path
    while not parent.exists():
        if parent.parent == parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        return f"{str(parent)!r} is not a directory"
    if not os.access(parent, os.W_OK):
        return f"{str(parent)!r} is not writable"
    return None


class OutDir:
    """A directory that exists and is writable, or can be created."""

    __name__ = "directory"

    def __call__(self, text: str) -> Path:
        path = Path(text)
        if not text:
            raise argparse.ArgumentTypeError("expected a directory, got ''")
        if path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory")
        if (why := _writable_target(path)) is not None:
            raise argparse.ArgumentTypeError(f"cannot write to {text!r}: {why}")
        return path

    def __repr__(self) -> str:
        return "OutDir()"


class OutFile:
    """A file that can be written (its directory exists and is writable, or can be created)."""

    __name__ = "file"

    def __call__(self, text: str) -> Path:
        path = Path(text)
        if not text or text.endswith(os.sep):
            raise argparse.ArgumentTypeError(f"expected a file name, got {text!r}")
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is a directory")
        if (why := _writable_target(path.parent if path.parent != Path("") else Path("."))) is not None:
            raise argparse.ArgumentTypeError(f"cannot write {text!r}: {why}")
        return path

    def __repr__(self) -> str:
        return "OutFile()"


class Text:
    """Free text, non-empty (names, labels, hosts: checked by the command where they are used)."""

    __name__ = "text"

    def __call__(self, text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError("must not be empty")
        return text

    def __repr__(self) -> str:
        return "Text()"


TYPES = (Int, Float, InFile, InDir, OutDir, OutFile, Text)
"""Every ``type=`` a ``dapo`` option may have (checked by the fuzz test)."""
