"""Every ``dapo`` command, fuzzed from its own parser: each option's declared type
(:mod:`dapo.cliargs`) says what is valid, hypothesis draws what is not, and the command must
answer with one line on stderr that names the argument, exit status 2, and no traceback.

Nothing here lists the options: a new option is fuzzed as soon as it is declared, and one
declared without a checked type or without help text fails :func:`test_every_option_is_declared`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dapo import cli
from dapo.cliargs import TYPES, Float, InDir, InFile, Int, OutDir, OutFile, Text

SKIP = (argparse._HelpAction, argparse._VersionAction)


def _leaves(
    prefix: list[str], parser: argparse.ArgumentParser
) -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for name, child in subs[0].choices.items():
        yield from _leaves([*prefix, name], child)


def _all_leaves() -> list[tuple[list[str], argparse.ArgumentParser]]:
    out = []
    for name, (_, main, make_parser) in cli.COMMANDS.items():
        if not cli._available(main):
            continue
        out += list(_leaves([name], cli.resolve(make_parser)()))
    return out


LEAVES = _all_leaves()


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, (*SKIP, argparse._SubParsersAction))]


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def _id(leaf: list[str], action: argparse.Action) -> str:
    return " ".join(leaf) + " " + (action.option_strings[-1] if action.option_strings else action.dest)


CASES = [(leaf, a) for leaf, p in LEAVES for a in _options(p) if _takes_value(a)]


def test_every_command_is_covered():
    names = {leaf[0] for leaf, _ in LEAVES}
    assert {"toy", "diagnose", "plan", "launch", "gate", "version"} <= names
    assert len(CASES) >= 40  # every value-taking option of every subcommand


@pytest.mark.parametrize(("leaf", "parser"), LEAVES, ids=[" ".join(leaf) for leaf, _ in LEAVES])
def test_every_option_is_declared(leaf, parser):
    """Help text on every option, and every value either a choice or a checked type."""
    assert parser.description or leaf[-1] != leaf[0], f"{leaf}: no description"
    for action in _options(parser):
        name = _id(leaf, action)
        assert action.help and action.help != argparse.SUPPRESS, f"{name}: no help text"
        if _takes_value(action):
            assert action.choices is not None or isinstance(action.type, TYPES), (
                f"{name}: declare type= from dapo.cliargs (Int, Float, InFile, InDir, OutDir, OutFile, Text) "
                "or choices=, so that its values are checked before any work"
            )


@pytest.mark.parametrize("leaf,parser", LEAVES, ids=[" ".join(leaf) for leaf, _ in LEAVES])
def test_help_describes_the_command_and_its_defaults(leaf, parser):
    """`--help` of every command says what it does and, for each option with a default, what
    the default is (a user should not have to read the source to learn what runs)."""
    assert (parser.description or "").strip(), f"dapo {' '.join(leaf)}: no description line"
    for action in _options(parser):
        if not action.option_strings or action.default in (None, False, [], argparse.SUPPRESS):
            continue
        assert "default" in (action.help or "").lower(), (
            f"{_id(leaf, action)}: its help does not state its default ({action.default!r})"
        )


# ---- valid and invalid values, read from the declared types ------------------------------------


def _valid(action: argparse.Action, tmp: Path) -> str:
    t = action.type
    if action.choices is not None:
        return str(next(iter(action.choices)))
    if isinstance(t, Int):
        return str(max(t.lo if t.lo is not None else 1, 1) if t.hi is None or t.hi >= 1 else t.hi)
    if isinstance(t, Float):
        lo = t.lo if t.lo is not None else 0.0
        hi = t.hi if t.hi is not None else lo + 2.0
        return repr((lo + hi) / 2)
    if isinstance(t, InFile):
        path = tmp / f"valid-{action.dest}.json"
        path.write_text(json.dumps({"experiments": {}}) if t.kind == "json" else "x\n")
        return str(path)
    if isinstance(t, OutDir):
        return str(tmp / f"out-{action.dest}")
    if isinstance(t, InDir):
        return str(tmp)
    if isinstance(t, OutFile):
        return str(tmp / f"out-{action.dest}.json")
    return "tiny-cpu" if action.dest == "config" else "x"


def _invalid(action: argparse.Action, tmp: Path) -> st.SearchStrategy[str]:
    t = action.type
    if action.choices is not None and not isinstance(t, TYPES):
        return st.text(min_size=1, max_size=8).filter(
            lambda s: s not in action.choices and not s.startswith("-")
        )
    if isinstance(t, Int):
        bad = [st.sampled_from(["1.5", "abc", "", "nan", "1e3x"])]
        if t.lo is not None:
            bad.append(st.integers(max_value=t.lo - 1).map(str))
        if t.hi is not None:
            bad.append(st.integers(min_value=t.hi + 1).map(str))
        return st.one_of(*bad)
    if isinstance(t, Float):
        bad = [st.sampled_from(["abc", "", "nan", "inf", "-inf", "1..2"])]
        if t.lo is not None:
            below = st.floats(
                max_value=t.lo, exclude_max=not t.lo_open, allow_nan=False, allow_infinity=False
            )
            bad.append(below.map(repr))
        if t.hi is not None:
            above = st.floats(min_value=t.hi, exclude_min=True, allow_nan=False, allow_infinity=False)
            bad.append(above.map(repr))
        return st.one_of(*bad)
    a_file = tmp / "a-regular-file"
    a_file.write_text("not a directory\n")
    if isinstance(t, InFile):
        garbage_file = tmp / "garbage.json"
        garbage_file.write_text("{not json at all")
        binary = tmp / "binary.json"
        binary.write_bytes(b"\xff\xfe\x00garbage")
        options = [str(tmp / "missing.json"), str(tmp), ""]
        if t.kind == "json":
            options += [str(garbage_file), str(binary)]
        return st.sampled_from(options)
    if isinstance(t, OutDir):
        return st.sampled_from([str(a_file), str(a_file / "sub"), ""])
    if isinstance(t, InDir):
        return st.sampled_from([str(a_file), str(tmp / "missing-dir"), ""])
    if isinstance(t, OutFile):
        return st.sampled_from([str(tmp), str(a_file / "out.json"), ""])
    if isinstance(t, Text):
        return st.sampled_from(["", "   "])
    raise AssertionError(
        f"{action.dest}: no invalid values known for {t!r}"
    )  # see test_every_option_is_declared


def _baseline(parser: argparse.ArgumentParser, skip: argparse.Action, tmp: Path) -> list[str]:
    """Valid values for everything required (and for files read by default), so that the
    fuzzed argument is the only thing wrong."""
    argv: list[str] = []
    for a in _options(parser):
        if a is skip or not _takes_value(a):
            continue
        needed = a.required or (isinstance(a.type, InFile) and isinstance(a.default, str))
        if not a.option_strings:
            if a.nargs not in ("*", "?"):
                argv.append(_valid(a, tmp))
        elif needed:
            argv.append(f"{a.option_strings[-1]}={_valid(a, tmp)}")
    return argv


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.mark.parametrize(("leaf", "action"), CASES, ids=[_id(leaf, a) for leaf, a in CASES])
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_invalid_value_gets_one_line_and_exit_2(leaf, action, data, fuzz_dir, capsys, monkeypatch):
    monkeypatch.chdir(fuzz_dir)
    parser = {tuple(k): p for k, p in LEAVES}[tuple(leaf)]
    bad = data.draw(_invalid(action, fuzz_dir), label="value")
    if action.option_strings:
        arg = [f"{action.option_strings[-1]}={bad}"]
        argv = [*leaf, *_baseline(parser, action, fuzz_dir), *arg]
    else:
        rest = _baseline(parser, action, fuzz_dir)
        argv = [*leaf, *rest, bad] if action.nargs == "*" else [*leaf, bad, *rest]
        if action.nargs != "*" and any(
            not b.option_strings and b is not action and b.nargs not in ("*", "?") for b in _options(parser)
        ):
            pytest.skip("several positionals: the order is the parser's")
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", f"{argv}: exit {rc}\n{err}"
    assert "Traceback" not in err and "internal error" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"{argv}: expected one line on stderr, got:\n{err}"
    name = action.option_strings[-1] if action.option_strings else (action.metavar or action.dest)
    assert name in lines[0] or action.dest in lines[0], (
        f"{argv}: the message does not name {name}: {lines[0]}"
    )


@pytest.mark.parametrize(("leaf", "parser"), LEAVES, ids=[" ".join(leaf) for leaf, _ in LEAVES])
def test_unknown_option_and_missing_required(leaf, parser, fuzz_dir, capsys, monkeypatch):
    monkeypatch.chdir(fuzz_dir)
    base = _baseline(parser, None, fuzz_dir)
    assert cli.main([*leaf, *base, "--no-such-option"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--no-such-option" in err
    for i, token in enumerate(base):
        if token.startswith("--") and "=" in token:
            assert cli.main([*leaf, *base[:i], *base[i + 1 :]]) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and token.split("=")[0] in err


def test_top_level(capsys):
    assert cli.main(["no-such-command"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no-such-command" in err
    assert cli.main(["--help"]) == 0 and "commands:" in capsys.readouterr().out


def test_config_help_names_every_bundled_preset():
    """`--config` of every command that takes one lists the presets that exist, not a copy
    that falls behind (it once named two of three)."""
    from scale.config import PRESET_DIR

    presets = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
    assert len(presets) >= 3
    seen = 0
    for leaf, parser in LEAVES:
        for action in _options(parser):
            if "--config" in action.option_strings:
                seen += 1
                for name in presets:
                    assert name in action.help, f"dapo {' '.join(leaf)} --config help omits {name}"
    assert seen >= 5  # train, plan, launch, gate write, gate check


@pytest.mark.parametrize("leaf", [["toy", "check"], ["toy", "run"]], ids=" ".join)
def test_help_gives_the_exit_statuses(leaf):
    parser = {tuple(k): v for k, v in LEAVES}[tuple(leaf)]
    assert "exit status" in (parser.epilog or ""), f"dapo {' '.join(leaf)} --help"
