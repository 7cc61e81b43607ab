"""The engine's layout holds: no import loops, a small root, torch-free config/core, the public API."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "kvpilot"


def _module_name(path: Path) -> str:
    name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def _import_graph() -> dict[str, set[str]]:
    """module -> kvpilot modules it imports (TYPE_CHECKING and function-level imports included)."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            graph[module] |= {n for n in names if n in files and n != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_engine_module_imports_one_that_imports_it_back():
    graph = _import_graph()
    # a package's __init__ that only re-exports (config/) counts as an edge to what it re-exports
    loops = [loop for loop in _cycles(graph) if any(m.startswith("kvpilot.engine") for m in loop)]
    assert loops == []


# docs/dev/architecture.md's layers, ground first: a module imports only from its level or below
LEVELS = [
    ["config", "context", "kernels", "sampling_params", "tokenizer", "metrics.stats_contract", "structured.spec",
     "parallel", "stop_matcher"],
    ["core", "layers"],
    ["models", "metrics"],
    ["validation"],
    ["strategies"],
    ["worker", "step_hooks", "structured"],
    ["llm_engine"],
    ["llm", "server", "make_model"],
]


def _level(module: str) -> int:
    """The level of a kvpilot.engine module: its longest matching prefix in LEVELS (the package: top)."""
    rest = module.removeprefix("kvpilot.engine").removeprefix(".")
    matches = [(len(n), i) for i, names in enumerate(LEVELS) for n in names if rest == n or rest.startswith(n + ".")]
    return max(matches)[1] if matches else len(LEVELS) - 1


def test_engine_modules_import_only_their_level_or_below():
    graph = _import_graph()
    upward = [
        f"{a} (level {_level(a)}) -> {b} (level {_level(b)})"
        for a, targets in graph.items() if a.startswith("kvpilot.engine")
        for b in targets if b.startswith("kvpilot.engine") and _level(b) > _level(a)
    ]  # fmt: skip
    assert upward == []


def test_the_engine_root_holds_under_ten_files():
    files = sorted(p.name for p in (PACKAGE / "engine").iterdir() if p.is_file())
    assert len(files) < 10, files


def test_torch_free_layers_import_no_torch_and_the_public_api_loads_lazily():
    code = (
        "import sys; import kvpilot, kvpilot.operator, kvpilot.engine.config, kvpilot.engine.config.strategy, "
        "kvpilot.engine.core.scheduler, kvpilot.engine.core.state_pool, kvpilot.engine.metrics.stats_contract; "
        "assert 'torch' not in sys.modules, 'torch was imported'; "
        "from kvpilot import LLM, SamplingParams; import kvpilot.engine as e; "
        "assert LLM is e.LLM and SamplingParams is e.SamplingParams and LLM.__module__ == 'kvpilot.engine.llm'; "
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_an_unknown_engine_attribute_names_what_is_exported():
    import kvpilot.engine

    with pytest.raises(AttributeError, match="exports"):
        kvpilot.engine.NoSuchThing  # noqa: B018


STRATEGIES = "kvpilot.engine.strategies"
STRATEGY_PACKAGES = ("eviction", "gqa", "kv_quant", "linear", "mla")  # calibration/: shared load-time helpers
# the four that once asked each strategy in turn: now they loop over the registry (strategies/registry.py)
REGISTRY_USERS = ("kvpilot.engine.worker.model_runner", "kvpilot.engine.worker.kv_cache",
                  "kvpilot.engine.worker.cuda_graphs", "kvpilot.engine.step_hooks")
# what a registry user may still import from one strategy's package: the 8-bit layer the KV cache wires
ALLOWED_DIRECT = {"kvpilot.engine.worker.kv_cache": {"kvpilot.engine.strategies.kv_quant.layer"}}


def _strategy_node(module: str) -> str:
    """strategies' own import graph by package: 'mla' for strategies.mla.*, 'contract' for the root module."""
    return module.removeprefix(STRATEGIES + ".").split(".")[0]


def test_strategies_packages_import_no_loop_and_only_the_registry_imports_them_all():
    graph = _import_graph()
    packages: dict[str, set[str]] = {}
    for a, targets in graph.items():
        if a.startswith(STRATEGIES + "."):
            node = _strategy_node(a)
            packages.setdefault(node, set()).update(
                _strategy_node(b) for b in targets if b.startswith(STRATEGIES + ".") and _strategy_node(b) != node
            )
    assert _cycles({n: {t for t in ts if t in packages} for n, ts in packages.items()}) == []
    importers = {n for n, ts in packages.items() if "registry" in ts}
    assert importers == set(), f"only code above strategies/ imports the registry: {importers}"
    for name in STRATEGY_PACKAGES:  # a strategy package imports the contract and shared helpers, no other strategy
        assert packages[name] <= {"contract", "calibration"}, (name, packages[name])


def test_each_strategy_declares_one_contract_and_the_registry_holds_each_once():
    from kvpilot.engine.config import EngineConfig, ModelConfig
    from kvpilot.engine.strategies.contract import MemoryStrategy
    from kvpilot.engine.strategies.registry import Strategies

    declared = {}
    for name in STRATEGY_PACKAGES:
        module = __import__(f"{STRATEGIES}.{name}.strategy", fromlist=["*"])
        classes = [v for v in vars(module).values()
                   if isinstance(v, type) and issubclass(v, MemoryStrategy) and v is not MemoryStrategy]
        assert len(classes) == 1, (name, classes)
        declared[classes[0].name] = classes[0]
    checkpoint = ModelConfig.from_dict({"model_type": "llama", "num_attention_heads": 4, "hidden_size": 64,
                                        "vocab_size": 128, "intermediate_size": 128, "num_hidden_layers": 2,
                                        "num_key_value_heads": 2, "max_position_embeddings": 256})
    registry = Strategies(EngineConfig(model="unused"), checkpoint)
    assert sorted(type(s).__name__ for s in registry) == sorted(c.__name__ for c in declared.values())
    assert [s.name for s in registry] == ["eviction", "kv_quant", "linear", "mla", "gqa"]
    assert registry.enabled == []  # the defaults turn no strategy on


def test_runner_kv_cache_graphs_and_step_hooks_reach_strategies_only_through_the_registry():
    graph = _import_graph()
    for module in REGISTRY_USERS:
        direct = {b for b in graph[module] if b.startswith(STRATEGIES + ".")
                  and _strategy_node(b) not in ("registry", "contract")}
        assert direct <= ALLOWED_DIRECT.get(module, set()), (module, sorted(direct))
