"""The documentation's commands and paths exist: every ``dapo ...`` command line in README.md
and docs/**/*.md is parsed by the real parser of its command, and every repository path
named in backticks is there.

Commands are read from shell code blocks (```bash, ```sh, ```shell, ```console or unlabelled:
lines that start with ``dapo `` or ``$ dapo ``, comments dropped, ``\\`` continuations joined)
and from inline code spans that start with ``dapo ``. A full command in a code block must
parse as it stands (values are not checked: a file a command reads need not exist here). A
mention (an inline span, or a synopsis with ``...`` or ``[optional]`` brackets) may leave out
values and required arguments, but every command, subcommand, option and choice it names must
exist. Placeholders (``LOSS``, ``<file>``) are fine wherever a value goes.

A path is one inline span under a top-level directory of this repository with a file
extension or a trailing ``/`` (``*`` globs allowed). One whose parent directory is not here
is taken for another project's (verl's ``docs/algo/baseline.md``) and skipped, so a renamed
file is caught but a renamed folder deeper than the top level is not.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import glob
import io
import re
import shlex
from pathlib import Path

import pytest

from dapo.cli import COMMANDS, resolve

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL = {"", "bash", "sh", "shell", "console", "zsh"}
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
OPERATORS = {"|", "||", "&&", ";", "&"}
# what a mention may leave out (besides required arguments): an option's value
INCOMPLETE = re.compile(r"expected (one|at least one|\d+) arguments?")
TOP_DIRS = ("dapo", "toybench", "scale", "tests", "reports", "benchmarks", "docs", ".ci")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _blocks_and_prose(path: Path) -> tuple[list[tuple[int, str, str]], str]:
    """(line number, fence language, line) of every line inside a fenced block, and the text
    with those lines blanked (line numbers kept) for the inline spans."""
    inside, fence, lang = False, "", ""
    block, prose = [], []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = FENCE.match(line)
        if not inside and match:
            inside, fence, lang = True, match.group(1), match.group(2).lower()
            prose.append("")
        elif inside and line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
            inside = False
            prose.append("")
        elif inside:
            block.append((number, lang, line))
            prose.append("")
        else:
            prose.append(line)
    return block, "\n".join(prose)


def _is_command(text: str) -> bool:
    """``dapo ...``, but not one of its messages (``dapo train: why``)."""
    return re.match(r"dapo(\s|$)", text) is not None and not re.match(r"dapo \S+:(\s|$)", text)


def _commands(path: Path) -> list[tuple[str, str, bool]]:
    """(file:line, command text, is a mention) of every ``dapo`` command in the file."""
    found = []
    block, prose = _blocks_and_prose(path)
    pending, start = "", 0
    for number, lang, line in block:
        if lang not in SHELL:
            continue
        text = line.strip()
        if not pending:
            start = number
            if text.startswith("$ "):
                text = text[2:].lstrip()
            elif lang == "console":
                continue  # output, not a command
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        text, pending = pending + text, ""
        if _is_command(text):
            found.append((f"{_rel(path)}:{start}", text, False))
    for match in SPAN.finditer(prose):
        span = match.group(1)
        if "\n\n" not in span and _is_command(span):
            number = prose.count("\n", 0, match.start()) + 1
            found.append((f"{_rel(path)}:{number}", " ".join(span.split()), True))
    return found


def _placeholder(token: str) -> bool:
    return bool(re.fullmatch(r"[A-Z][A-Z0-9_]*|<[^>]*>|\S*\.\.\.\S*|…", token))


@functools.cache
def _parser(name: str, mention: bool) -> argparse.ArgumentParser:
    """The command's real parser with its values' conversions removed (a file it reads need
    not exist here; options, subcommands and choices are still checked); for a mention, with
    nothing required either."""
    parser = resolve(COMMANDS[name][2])()

    def strip(p: argparse.ArgumentParser) -> None:
        for action in p._actions:
            action.type = None
            action.required = action.required and not mention
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    strip(sub)

    strip(parser)
    return parser


def _problem(text: str, mention: bool) -> str | None:
    """Why ``text`` does not parse, or None."""
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as err:
        return f"not a shell line: {err}"
    for i, token in enumerate(tokens):  # the first command of a pipeline or a list
        if token in OPERATORS or re.match(r"\d?>|<$", token):
            tokens = tokens[:i]
            break
    if any(t.startswith("[") or t.endswith("]") or "..." in t for t in tokens):
        mention = True  # a synopsis
        tokens = [t.strip("[]") for t in tokens if "..." not in t and t.strip("[]")]
    args = tokens[1:]
    if not args or args[0] in ("-h", "--help", "--version"):
        return None
    name = args[0]
    if name not in COMMANDS:
        return None if _placeholder(name) else f"no command {name!r}"
    if mention and len(args) == 1:
        return None
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            _parser(name, mention).parse_args(args[1:])
        except SystemExit as exit_:
            if exit_.code in (0, None):
                return None
            message = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "parse error"
            choice = re.search(r"invalid choice: '([^']*)'", message)
            if choice and _placeholder(choice.group(1)):
                return None
            if mention and INCOMPLETE.search(message):
                return None
            return message
    return None


CASES = [case for path in FILES for case in _commands(path)]


def test_the_documentation_has_commands():
    assert len(CASES) > 20, CASES


@pytest.mark.parametrize(("where", "command", "mention"), CASES, ids=[f"{w} {c}"[:120] for w, c, _ in CASES])
def test_documented_command_parses(where, command, mention):
    problem = _problem(command, mention)
    assert problem is None, f"{where}: `{command}`: {problem}"


def test_the_checker_refuses_what_does_not_exist():
    assert _problem("dapo toy run all --seeds 3", False) is None
    assert _problem("dapo toy run all --seeds-nope 3", False) is not None
    assert _problem("dapo toy run", False) is not None  # a command needs its experiment
    assert _problem("dapo toy run", True) is None  # a mention does not
    assert _problem("dapo toy check LOSS --claims ...", False) is None
    assert _problem("dapo toy nope", True) is not None
    assert _problem("dapo toy SUBCOMMAND --help", False) is None
    assert _problem("dapo nope --x", True) is not None
    assert _problem("dapo toy run --policy nope", True) is not None
    assert _problem("dapo eval --bogus", True) is not None  # not hidden by the missing --model
    assert _problem("dapo eval --k", True) is None
    assert _problem("dapo diagnose LOG | head -3", False) is None
    assert _problem("dapo COMMAND --help", False) is None


def _paths(path: Path) -> list[tuple[str, str]]:
    found = []
    _, prose = _blocks_and_prose(path)
    for match in SPAN.finditer(prose):
        span = match.group(1).strip()
        name = re.sub(r"(\.\w+)(:[\w.]+|#.*)$", r"\1", span)  # file.py:function, file.md#anchor
        if (
            name.split("/")[0] in TOP_DIRS
            and "/" in name
            and not re.search(r"[\s<>{}$]", name)
            and (name.endswith("/") or re.search(r"\.\w+$", name.split("/")[-1]))
        ):
            number = prose.count("\n", 0, match.start()) + 1
            found.append((f"{_rel(path)}:{number}", name))
    return found


PATHS = [case for path in FILES for case in _paths(path)]


@pytest.mark.parametrize(("where", "name"), PATHS, ids=[f"{w} {n}" for w, n in PATHS])
def test_documented_path_exists(where, name):
    parent = str(ROOT / name.rstrip("/")).rsplit("/", 1)[0]
    if not glob.glob(parent):
        pytest.skip(f"{where}: `{name}` is under no directory of this repository: another project's path")
    assert glob.glob(str(ROOT / name)), f"{where}: `{name}` does not exist in the repository"


GUIDES = ("getting-started", "how-to", "results")
# characters a code block shows at a 1280-pixel browser window: the docstring below says whence
PAGE_WIDTH = 78


def test_no_code_line_in_the_guides_is_wider_than_the_page():
    """The mkdocs-material theme's code block shows about 78 characters of a line at a
    1280-pixel browser window (measured with headless Chromium on 2026-12-07); the rest is
    behind a horizontal scroll bar, and longer lines hid their trailing comments
    (``dapo toy check dapo    # a built-in: dapo grpo dr_grpo ...``) from readers. So no line
    of a fenced code block in the home page, docs/getting-started, docs/how-to or docs/results is
    longer: a
    comment goes on its own line above its command, and a longer command is split with ``\\``
    continuations, which the parse test above joins. (docs/reference/ is generated.) A block
    of program output (```text) is exempt: it shows a program's lines as printed, and scrolls
    rather than show breaks the program does not print."""
    wide = [
        f"{_rel(path)}:{number} ({len(line)} characters)"
        for path in [
            ROOT / "docs" / "index.md",
            *(p for g in GUIDES for p in sorted((ROOT / "docs" / g).rglob("*.md"))),
        ]
        for number, lang, line in _blocks_and_prose(path)[0]
        if len(line) > PAGE_WIDTH and lang != "text"
    ]
    assert not wide, f"code lines wider than the page's {PAGE_WIDTH} characters:\n" + "\n".join(wide)
