"""No import cycles among gradwatch's modules: every import points one way.

The imports are read from the source with ``ast`` (every ``import`` statement, at
module level or inside a function, and under ``if TYPE_CHECKING:`` too: a cycle there
still ties the two modules together for the reader and for mypy).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The package of each top-level folder (pyproject.toml, [tool.setuptools.package-dir]).
PARTS = ("protocol", "trainer_hooks", "server", "client", "integrations", "notebook")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for part in PARTS:
        for path in sorted((ROOT / part).rglob("*.py")):
            relative = path.relative_to(ROOT).with_suffix("")
            names = list(relative.parts)
            if names[-1] == "__init__":
                names.pop()
            found[".".join(["gradwatch", *names])] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The gradwatch modules ``name`` imports (a package's submodule named in
    ``from package import submodule`` counts as that submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            subs = {f"{target}.{alias.name}" for alias in node.names}
            found = subs & known.keys()
            out.update(found)
            if len(found) < len(subs):  # some name is the module's own, not a submodule
                out.add(target)
    return {m for m in out if m in known and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def import_graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def test_gradwatch_modules_import_each_other_one_way_only() -> None:
    graph = import_graph()
    assert len(graph) > 100, f"expected gradwatch's modules, found {len(graph)}"
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = import_graph()
    # Any real edge a -> b plus b -> a is a cycle the check must name.
    a = "gradwatch.server.schema"
    b = next(iter(sorted(graph[a])))
    graph[b] = {*graph[b], a}
    assert any({a, b} <= set(c) for c in _cycles(graph))
