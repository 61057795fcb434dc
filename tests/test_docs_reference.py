"""The generated reference pages (docs/reference/) are what ``python docs/gen_reference.py``
writes today, and they name every CLI argument, config field and metric: checked by walking
the parsers, the dataclasses and the schema here, not through the generator's own lists."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest

from dapo.cli import COMMANDS, resolve
from dapo.config import AlgoConfig
from dapo.schema import SCHEMA

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


@pytest.mark.parametrize("page", sorted(gen.PAGES))
def test_generated_page_is_fresh(page):
    path = REFERENCE / page
    assert path.is_file(), f"docs/reference/{page} is missing; run: {gen.COMMAND}"
    assert path.read_text() == gen.PAGES[page](), (
        f"docs/reference/{page} is stale (the code changed after it was generated); run: {gen.COMMAND}"
    )


def _sections(text: str) -> dict[str, str]:
    """Heading text (backticks dropped) -> the text up to the next heading."""
    parts = re.split(r"^#+ (.*)$", text, flags=re.M)
    return {parts[i].strip("` "): parts[i + 1] for i in range(1, len(parts), 2)}


def _parsers(parser: argparse.ArgumentParser, name: str):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_cli_page_names_every_argument():
    sections = _sections((REFERENCE / "cli.md").read_text())
    missing = []
    for command, (_, _, target) in COMMANDS.items():
        for name, parser in _parsers(resolve(target)(), f"dapo {command}"):
            if name not in sections:
                missing.append(f"the section of {name!r}")
                continue
            for action in parser._actions:
                if action.help == argparse.SUPPRESS or isinstance(
                    action, (argparse._HelpAction, argparse._SubParsersAction)
                ):
                    continue
                for label in action.option_strings or [action.metavar or action.dest]:
                    if f"`{label}`" not in sections[name]:
                        missing.append(f"{name} {label}")
    assert not missing, f"docs/reference/cli.md lacks: {missing}; run: {gen.COMMAND}"


def _leaf_keys(cls: type, prefix: str):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _leaf_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def test_config_page_names_every_field():
    from scale.config import RunConfig

    text = (REFERENCE / "config.md").read_text()
    keys = [*_leaf_keys(AlgoConfig, "algo."), *_leaf_keys(RunConfig, "")]
    assert "algo.eps_high" in keys and "rollout.max_staleness" in keys and "model.lora.rank" in keys
    missing = [k for k in keys if f"| `{k}` |" not in text]
    assert not missing, f"docs/reference/config.md lacks: {missing}; run: {gen.COMMAND}"


def test_metrics_page_names_every_metric():
    text = (REFERENCE / "metrics.md").read_text()
    missing = [name for name in SCHEMA if f"| `{name}` |" not in text]
    assert not missing, f"docs/reference/metrics.md lacks: {missing}; run: {gen.COMMAND}"


@dataclass(frozen=True)
class _Documented:
    a: int = 1
    """the first"""


@dataclass(frozen=True)
class _Undocumented:
    section: _Documented
    """a section"""
    b: float = 2.0
    c: str = "x"
    """the third"""


def test_a_field_without_docstring_is_refused_by_name():
    rows = list(gen.config_fields(_Documented, "s."))
    assert rows == [("s.a", "int", "`1`", "the first", None)]
    with pytest.raises(gen.UndocumentedField, match=r"_Undocumented\.b \(s\.b\)"):
        list(gen.config_fields(_Undocumented, "s."))


def test_cells_stay_one_table_cell():
    assert gen.cell("a | b\n  c ``x<y`` and <z> :class:`Foo`") == "a \\| b c `x<y` and &lt;z> `Foo`"


def test_every_version_range_the_docs_quote_is_pyprojects():
    """A version range quoted in the README or the docs (``vllm>=0.32,<0.33``) is the one
    pyproject.toml declares for that package: no page keeps an old range. (Exact ``==`` versions
    in the docs are install commands, such as the CPU build of torch, not claims of the pin.)"""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared: dict[str, set[str]] = {}
    for req in [
        *project["dependencies"],
        *(r for rs in project["optional-dependencies"].values() for r in rs),
    ]:
        m = re.match(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*([<>=!~][^;]*)?", req)
        if m and m.group(2):
            declared.setdefault(m.group(1).lower(), set()).add(m.group(2).replace(" ", ""))
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    pin = re.compile(r"`([A-Za-z0-9_.\-]+)((?:[<>=!~]=?[0-9][0-9A-Za-z.*]*,?)+)`")
    found = 0
    for page in pages:
        for name, spec in pin.findall(page.read_text()):
            if name.lower() in declared and ("<" in spec or ">" in spec):
                found += 1
                assert spec in declared[name.lower()], (
                    f"{page.relative_to(ROOT)}: `{name}{spec}`, pyproject.toml declares {sorted(declared[name.lower()])}"
                )
    assert found >= 2  # the vLLM pins of the launch guide at least
