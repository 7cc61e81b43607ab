"""The operator's layout holds: a small root, reconcile/ status/ rollout/, no import loops, layers, no engine."""

from __future__ import annotations

import ast
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

KVPILOT = Path(__file__).resolve().parents[2] / "kvpilot"
OPERATOR = KVPILOT / "operator"
PREFIX = "kvpilot.operator"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(KVPILOT.parent).with_suffix("").parts).removesuffix(".__init__")


def _imports() -> dict[str, set[str]]:
    """operator module -> every module name it imports (function-level imports included)."""
    found: dict[str, set[str]] = {}
    for path in OPERATOR.rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        found[_module_name(path)] = names
    return found


def _graph() -> dict[str, set[str]]:
    """operator module -> the operator modules it imports."""
    imports = _imports()
    return {m: {n for n in names if n in imports and n != m} for m, names in imports.items()}


def test_no_operator_module_imports_one_that_imports_it_back():
    try:
        TopologicalSorter(_graph()).prepare()
    except CycleError as exc:
        pytest.fail(f"import loop: {' -> '.join(exc.args[1])}")


# docs/operator.md's layers, ground first: a module imports only from its level or below. The
# state machine, the spec's parts and the metrics' phase names sit low so the shared root can use them.
LEVELS = [
    ["constants", "pod_overrides", "autoscaling.spec", "analysis.gateway",
     "rollout.phases", "rollout.state", "rollout.actions", "rollout.machine"],
    ["kube", "spec", "options", "context", "operator_metrics"],
    ["builders", "routing", "analysis", "status"],
    ["reconcile", "autoscaling", "rollout"],
    ["handlers"],
    ["cli"],
]


def _level(module: str) -> int:
    """The level of an operator module: its longest matching prefix in LEVELS (the empty package: ground)."""
    rest = module.removeprefix(PREFIX).removeprefix(".")
    if not rest:
        return 0
    matches = [(len(n), i) for i, names in enumerate(LEVELS) for n in names if rest == n or rest.startswith(n + ".")]
    assert matches, f"{module} has no level in LEVELS: add it (or its package) where it belongs"
    return max(matches)[1]


def test_operator_modules_import_only_their_level_or_below():
    upward = [
        f"{a} (level {_level(a)}) -> {b} (level {_level(b)})"
        for a, targets in _graph().items() for b in targets if _level(b) > _level(a)
    ]  # fmt: skip
    assert upward == []


def test_the_root_holds_only_what_every_part_shares():
    root = sorted(p.name for p in OPERATOR.iterdir() if p.is_file())
    assert len(root) <= 9, root
    assert not [name for name in root if name.startswith("rollout")], "rollout means the rollout/ package only"
    packages = {p.name for p in OPERATOR.iterdir() if (p / "__init__.py").is_file()}
    assert {"reconcile", "status", "rollout"} <= packages, packages


def test_status_and_the_state_machine_import_nothing_that_decides_or_does_io():
    imports, graph = _imports(), _graph()
    machine = {f"{PREFIX}.rollout.{m}" for m in ("phases", "state", "actions", "machine")}
    for module in machine:
        third_party = {n for n in imports[module] if n.split(".")[0] not in sys.stdlib_module_names | {"kvpilot"}}
        assert third_party == set() and graph[module] <= machine, (
            f"{module} imports {sorted(third_party | (graph[module] - machine))}: the state machine is pure")
    ground = {PREFIX} | {f"{PREFIX}.{m}" for m in ("constants", "context", "kube", "spec")}
    for module, targets in graph.items():
        if module.startswith(f"{PREFIX}.status"):
            theirs = {n for n in targets if not n.startswith(f"{PREFIX}.status")}
            assert theirs <= ground, f"{module} imports {sorted(theirs - ground)}: status is built from decisions"


def test_only_the_handlers_and_the_command_import_kopf():
    users = sorted(m for m, names in _imports().items() if "kopf" in names)
    assert users and all(m.startswith(f"{PREFIX}.handlers") or m == f"{PREFIX}.cli" for m in users), users


def test_the_operator_imports_no_engine_module():
    allowed = ("kvpilot.operator", "kvpilot.planner", "kvpilot.storage", "kvpilot.promql", "kvpilot.strategy_schema")
    foreign = sorted({f"{m} -> {n}" for m, names in _imports().items() for n in names
                      if n.startswith("kvpilot.") and not n.startswith(allowed)})
    assert foreign == []
    code = ("import sys; import kvpilot.operator.cli, kvpilot.operator.handlers; "
            "print(sorted(m for m in sys.modules if m.startswith('kvpilot.engine') or m in ('torch', 'triton')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=KVPILOT.parent)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
