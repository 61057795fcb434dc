"""The import rules of docs/design/scale-layout.md, checked on the source (no module is imported):
no import cycle among dapo/, toybench/ and scale/, and every import points down the layers,

    core (dapo/) < toybench/ | scale base (config, records) < plumbing (scale/dist) < roles
    (scale/learner, scale/generator) < placements (scale/placement) < the loop (scale/trainer)
    < operations (scale/ops, scale/rehearsal, dapo/cli.py)

with the two roles independent of each other and the two placements too. Imports inside
functions count. ``DAPO_LAYOUT_ROOT`` points the checks at another checkout (read only)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(os.environ.get("DAPO_LAYOUT_ROOT") or Path(__file__).resolve().parents[1])
PACKAGES = ("dapo", "toybench", "scale")

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("dapo",)),
    ("toy regime", ("toybench",)),
    ("scale base", ("scale", "scale.config", "scale.records")),
    ("plumbing", ("scale.dist",)),
    ("roles", ("scale.learner", "scale.generator")),
    ("placements", ("scale.placement",)),
    ("loop", ("scale.trainer",)),
    ("operations", ("scale.ops", "dapo.cli")),
    ("rehearsal", ("scale.rehearsal",)),
]
"""Lowest first; a module belongs to the layer of its longest matching prefix."""

APART = [
    ("scale.learner", "scale.generator"),
    ("scale.placement.colocated", "scale.placement.disaggregated"),
    ("scale", "toybench"),
]
"""Pairs that import nothing of each other (either way)."""


def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The project module that ``name`` (a module or a name inside one) lives in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in its body, functions included)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets.update(f"{base}.{a.name}" for a in node.names)  # a submodule, or a name in base
        graph[name] = {o for t in targets if (o := _owner(t, modules)) and o != name}
    return graph


def _layer(name: str) -> tuple[int, str]:
    best = (-1, "", "")
    for i, (label, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > len(best[2]):
                best = (i, label, p)
    return best[0], best[1]


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (``a -> b -> ... -> a``), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that points up the layers or joins two modules kept apart."""
    bad = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            (la, na), (lb, nb) = _layer(a), _layer(b)
            if lb > la:
                bad.append(f"{a} ({na}) imports {b} ({nb}), a layer above it")
            for x, y in APART:
                if (_under(a, x) and _under(b, y)) or (_under(a, y) and _under(b, x)):
                    bad.append(f"{a} imports {b}: {x} and {y} import nothing of each other")
    return bad


def test_every_module_has_a_layer():
    graph = import_graph()
    assert "scale.trainer" in graph and "dapo.update" in graph, f"no project under {ROOT}"
    orphans = [m for m in graph if _layer(m)[0] < 0]
    assert not orphans, f"modules outside every layer (add them to LAYERS): {orphans}"


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_imports_point_down_the_layers():
    bad = layer_violations(import_graph())
    assert not bad, "imports against the layers:\n  " + "\n  ".join(bad)


def test_the_core_imports_neither_scale_nor_toybench():
    graph = import_graph()
    bad = [
        f"{a} imports {b}"
        for a in sorted(graph)
        if _under(a, "dapo") and a != "dapo.cli"
        for b in sorted(graph[a])
        if not _under(b, "dapo")
    ]
    assert not bad, "the core (dapo/) must stay free of scale/ and toybench/:\n  " + "\n  ".join(bad)


def test_every_scale_folder_says_what_it_holds_and_may_import():
    missing = []
    for init in sorted((ROOT / "scale").rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if "import" not in doc:
            missing.append(str(init.relative_to(ROOT)))
    assert not missing, f"folders without a docstring saying what they hold and may import: {missing}"
