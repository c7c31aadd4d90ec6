"""The package's layering, checked from its source: data flows one way.

Every module of ``servegym`` belongs to a layer (its subpackage, or for a top-level module
its own name); a module may import its own layer and the layers below it, never one above.
So no two subpackages import each other (no cycle), scoring is pure (it never reaches the
runner, the agents, the pipeline or a track), and typer/rich live in ``servegym/cli/`` alone.
Imports inside functions count: a lazy import is still a dependency. Imports under
``if TYPE_CHECKING:`` do not (they never run).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "servegym"

LAYERS: list[set[str]] = [
    # plain helpers every layer may use
    {"__init__", "errors", "paths", "tomlfile", "overrides", "aio_serve", "registry"},
    {"workloads"},
    {"loadgen", "run_folder"},
    # what servers are and how they start: ServingConfig, launchers, the simulator
    {"engines"},
    # where servers and agent commands run: the local sandbox, Docker
    {"sandbox"},
    # pure functions of records and measurements
    {"scoring"},
    {"tasks"},
    # the RAG pipeline, the CPU track's setup, a real track's reference (its config, outputs,
    # probe re-scoring)
    {"pipeline", "cpu_track", "reference"},
    {"providers"},
    {"agents"},
    # a track: starts a config, measures it on a workload sample, stops it
    {"tracks"},
    {"runner"},
    # above the runner: leaderboards, reports, the judge, server figures
    {"reporting"},
    # outside frameworks that drive trials (Inspect AI): above the runner, beside no one
    {"integrations"},
    # the command line, and `python -m servegym` which starts it
    {"cli", "__main__"},
]
"""Bottom to top."""

UI_LIBRARIES = ("typer", "rich", "click")


def _layer_of(name: str) -> int:
    for i, layer in enumerate(LAYERS):
        if name in layer:
            return i
    raise AssertionError(
        f"servegym.{name} belongs to no layer: add it to LAYERS in tests/test_architecture.py"
    )


def _unit(module: str) -> str:
    """``servegym.scoring.metrics`` -> ``scoring``; ``servegym.errors`` -> ``errors``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Line numbers of the statements under ``if TYPE_CHECKING:`` blocks."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for child in node.body:
                    for sub in ast.walk(child):
                        if hasattr(sub, "lineno"):
                            lines.add(sub.lineno)
    return lines


def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    """Every module ``module`` imports (absolute names), with the line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _type_checking_only(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            out.append((base, node.lineno))
            out += [(f"{base}.{a.name}", node.lineno) for a in node.names]
    return out


def _edges() -> dict[tuple[str, str], list[str]]:
    """(from unit, to unit) -> where, for every import between two units."""
    modules = _modules()
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, path in modules.items():
        for target, line in _imports(module, path):
            if not target.startswith("servegym.") or target not in modules:
                continue
            a, b = _unit(module), _unit(target)
            if a != b:
                edges[(a, b)].append(f"{path.relative_to(PACKAGE.parent)}:{line} -> {target}")
    return edges


def test_every_module_has_a_layer() -> None:
    for module in _modules():
        _layer_of(_unit(module))


def test_no_layer_imports_a_layer_above_it() -> None:
    wrong = [
        where
        for (a, b), places in sorted(_edges().items())
        if _layer_of(b) > _layer_of(a)
        for where in places
    ]
    assert not wrong, "imports that point up the layers:\n" + "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_subpackages() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in _edges():
        graph[a].add(b)
    assert not _cycles(graph)


def test_cycle_detection_finds_a_planted_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_scoring_is_pure() -> None:
    """Scoring is functions of records and measurements: it never imports what runs them."""
    banned = {"runner", "agents", "pipeline", "tracks", "reporting", "cli", "cpu_track"}
    wrong = [w for (a, b), places in _edges().items() if a == "scoring" and b in banned
             for w in places]  # fmt: skip
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("library", UI_LIBRARIES)
def test_command_line_libraries_only_in_cli(library: str) -> None:
    wrong = []
    for module, path in _modules().items():
        if module == "servegym.cli" or module.startswith("servegym.cli."):
            continue
        for target, line in _imports(module, path):
            if target == library or target.startswith(library + "."):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_the_checks_see_a_planted_violation(tmp_path: Path) -> None:
    """The import reader finds relative, lazy and aliased imports (so the tests above can
    fail), and skips TYPE_CHECKING blocks."""
    src = tmp_path / "servegym" / "scoring" / "x.py"
    src.parent.mkdir(parents=True)
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "from ..runner import trial\n"
        "if TYPE_CHECKING:\n"
        "    from servegym.agents import base\n"
        "def f():\n"
        "    import rich.table as t\n"
    )
    found = {name for name, _ in _imports("servegym.scoring.x", src)}
    assert "servegym.runner.trial" in found
    assert "rich.table" in found
    assert "servegym.agents.base" not in found
