"""The server's rooms hold: each exists, the root stays small, no room imports one above it, no loops.

docs/dev/architecture.md ("The server's rooms") gives the order; this file is where it is checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SERVER = Path(__file__).resolve().parents[2] / "kvpilot" / "engine" / "server"
PACKAGE = "kvpilot.engine.server"
# Ground first: a room imports only from its own room or one below it, never from one above or the root.
ROOMS = ["wire", "tools", "http", "runtime", "endpoints"]
ROOT_FILES = {"__init__.py", "cli.py"}  # the public names and `kvpilot serve`; everything else has a room


def _module_name(path: Path) -> str:
    name = ".".join((PACKAGE, *path.relative_to(SERVER).with_suffix("").parts))
    return name.removesuffix(".__init__")


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement names, relative ones resolved against `module`."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join(parts + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def _import_graph() -> dict[str, set[str]]:
    """server module -> server modules it imports (function-level and TYPE_CHECKING imports included)."""
    files = {_module_name(p): p for p in SERVER.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = _imported(node, module, path.name == "__init__.py")
            graph[module] |= {n for n in names if n in files and n != module}
    return graph


def _room(module: str) -> int:
    """The room's place in ROOMS; the server's root (cli, the package) sits above every room."""
    rest = module.removeprefix(PACKAGE).removeprefix(".")
    first = rest.split(".")[0]
    return ROOMS.index(first) if first in ROOMS else len(ROOMS)


def _loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = [stack.pop()]
            while component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_room_is_a_package_and_the_root_holds_only_its_entry_points():
    missing = [room for room in ROOMS if not (SERVER / room / "__init__.py").is_file()]
    assert missing == []
    root = sorted(p.name for p in SERVER.iterdir() if p.is_file() and p.suffix == ".py")
    assert set(root) <= ROOT_FILES, f"{sorted(set(root) - ROOT_FILES)} belong in a room: {ROOMS}"
    rooms = {p.name for p in SERVER.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert rooms == set(ROOMS), "a new room needs its place in ROOMS and in docs/dev/architecture.md"


def test_no_room_imports_a_room_above_it_or_the_root():
    upward = [
        f"{a} ({ROOMS[_room(a)]}) -> {b} ({ROOMS[_room(b)] if _room(b) < len(ROOMS) else 'the root'})"
        for a, targets in sorted(_import_graph().items()) if _room(a) < len(ROOMS)
        for b in sorted(targets) if _room(b) > _room(a)
    ]  # fmt: skip
    assert upward == []


def test_no_server_module_imports_one_that_imports_it_back():
    assert _loops(_import_graph()) == []


def test_a_room_package_imports_nothing_so_one_module_never_loads_its_room():
    heavy = [m for m, targets in _import_graph().items() if _room(m) < len(ROOMS) and m.count(".") == 3 and targets]
    assert heavy == []


def test_the_checks_see_upward_relative_and_looping_imports():
    # The graph the tests above read: a relative import is resolved, and a loop or an upward edge is found.
    assert _imported(ast.parse("from ..http.errors import APIError").body[0], f"{PACKAGE}.wire.prompts", False) == [
        f"{PACKAGE}.http.errors", f"{PACKAGE}.http.errors.APIError"]  # fmt: skip
    assert _loops({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _room(f"{PACKAGE}.endpoints.app") > _room(f"{PACKAGE}.runtime.engine_loop") > _room(f"{PACKAGE}.wire.logprobs")
    assert _room(f"{PACKAGE}.cli") == _room(PACKAGE) == len(ROOMS)
    graph = _import_graph()
    assert f"{PACKAGE}.wire.request_bodies" in graph[f"{PACKAGE}.wire.prompts"]
