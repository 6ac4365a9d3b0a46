"""The project's own tidy check (as TigerBeetle's tidy.zig): the layer map of
docs/architecture.md, no import circles, and a ratchet on long functions. Every import counts,
inside functions and under TYPE_CHECKING too: an import hidden there is still a dependency a
reader must follow."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

# Lowest first: a module may import its own layer and those below, never one above. A module
# belongs to the longest prefix that names it.
LAYERS: list[tuple[str, ...]] = [
    (
        "tidelog.errors",
        "tidelog.version",
        "tidelog.invariant",
        "tidelog.formats",
        "tidelog.features",
    ),
    ("tidelog.logs", "tidelog.config", "tidelog.acls", "tidelog.tls", "tidelog.scram"),
    ("tidelog.principals",),
    ("tidelog.record",),
    ("tidelog.storage",),
    ("tidelog.replication", "tidelog.archive"),
    ("tidelog.protocol",),
    ("tidelog.cluster_status",),
    ("tidelog.client",),
    ("tidelog.node",),
    ("tidelog.kafka",),
    # The process that assembles a node and its listeners (Kafka's among them).
    ("tidelog.node.server", "tidelog.node.listeners.http"),
    ("tidelog.spark", "tidelog.cli", "tidelog.testing", "tidelog.devcerts", "tidelog.console"),
    ("tidelog", "tidelog.__main__"),
]

# The listeners that serve clients, and what they may use of the core: its door (handle, after
# authorize) and the services a listener counts with and is held to. What they read of the
# cluster, they read through the core's read-only view (node/cluster_view.py), never from the
# core's parts (its metadata, hosts, registry, cleaner...). The peer channel is not one of them:
# it carries the core's own replication.
LISTENERS = ("tidelog.kafka", "tidelog.node.listeners.client", "tidelog.node.listeners.http")
CORE_DOORS = frozenset(
    {
        "handle",
        "authorize",
        "request_type",
        "require_started",
        "propose_metadata",
        "access",
        "asker",
        "config",
        "node_id",
        "counters",
        "quotas",
        "request_metrics",
        "fail_stop",
        "login_guard",
        "view",
    }
)

# Functions longer than this many lines, and how many may be (a ratchet: lower it as they are
# split, never raise it). Declarative code belongs in tables. None is left: a function that
# grows past the limit is split when it does.
FUNCTION_LINES_MAX = 80
LONG_FUNCTIONS_MAX = 0


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in SRC.rglob("*.py")}
EXTENSIONS = {module_name(p) for p in SRC.rglob("*.pyi")}  # C extensions (record._codec)


def imported(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """(module, line) for every tidelog module the file imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tidelog"):
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if not module.startswith("tidelog"):
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                if sub in MODULES:
                    yield sub, node.lineno
                elif sub not in EXTENSIONS:
                    yield module, node.lineno


def import_graph() -> dict[str, dict[str, int]]:
    graph: dict[str, dict[str, int]] = {}
    for name, path in MODULES.items():
        graph[name] = {m: line for m, line in imported(name, path) if m in MODULES and m != name}
    return graph


def layer_of(module: str) -> int:
    best, best_len = -1, -1
    for rank, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = rank, len(prefix)
    return best


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer() -> None:
    assert [m for m in MODULES if layer_of(m) < 0] == []


def test_nothing_imports_a_layer_above_its_own() -> None:
    graph = import_graph()
    upward = [
        f"{m} (layer {layer_of(m)}) imports {d} (layer {layer_of(d)}) at line {line}"
        for m, deps in sorted(graph.items())
        for d, line in sorted(deps.items())
        if layer_of(d) > layer_of(m)
    ]
    assert upward == []


def test_no_module_imports_itself_through_others() -> None:
    assert circles(import_graph()) == []


def test_long_functions_only_go_down() -> None:
    long: list[str] = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > FUNCTION_LINES_MAX:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines})")
    assert len(long) <= LONG_FUNCTIONS_MAX, "\n".join(sorted(long))


def reaches_into_core(source: str) -> list[tuple[int, str]]:
    """(line, attribute) of each `core.X` or `<...>.core.X` whose X is not one of CORE_DOORS."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr not in CORE_DOORS:
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "core") or (
                isinstance(owner, ast.Attribute) and owner.attr == "core"
            ):
                found.append((node.lineno, node.attr))
    return sorted(found)


def test_listeners_read_the_cluster_through_its_view() -> None:
    reaching = [
        f"{path.relative_to(SRC)}:{line} core.{attr}"
        for name, path in sorted(MODULES.items())
        if any(name == p or name.startswith(p + ".") for p in LISTENERS)
        for line, attr in reaches_into_core(path.read_text())
    ]
    assert reaching == []
    # /metrics reads the view alone.
    assert "tidelog.node.core" not in import_graph()["tidelog.node.exposition"]


def test_invariants_are_not_bare_asserts() -> None:
    """`python -O` strips assert statements; src/ states invariants with tidelog.invariant."""
    bare = [
        f"{path.relative_to(SRC)}:{node.lineno}"
        for path in MODULES.values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert)
    ]
    assert bare == []


def test_the_checks_see_what_they_check() -> None:
    """The checks above must be able to fail: a circle and an upward import, as modules."""
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {}}
    assert circles(graph) == [["a", "b", "c"]]
    assert layer_of("tidelog.node.core") > layer_of("tidelog.storage.log")
    assert layer_of("tidelog.node.server") > layer_of("tidelog.kafka.broker")
    edges = import_graph()
    assert "tidelog.storage.segment" in edges["tidelog.storage.log"]
    reaching = (
        "core.handle(p, r, b'')\nself.broker.core.metadata.topics\ncore.hosts\ncore.view.topics"
    )
    assert reaches_into_core(reaching) == [(2, "metadata"), (3, "hosts")]


def test_every_benchmark_imports() -> None:
    """bench/replicated.py imported merge_status from where it no longer was, and no run saw it:
    benchmarks are not tests, but each must at least load. A third-party package it needs that
    is not installed (bench/compare.py's, from the bench extra) is not a failure."""
    import importlib.util
    import sys

    bench = SRC.parent / "bench"
    sys.path.insert(0, str(bench))
    try:
        for path in sorted(bench.glob("*.py")):
            spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # (dataclasses look their module up)
            try:
                spec.loader.exec_module(module)
            except ModuleNotFoundError as exc:
                assert exc.name is not None and not exc.name.startswith("tidelog"), path.name
            finally:
                del sys.modules[spec.name]
    finally:
        sys.path.remove(str(bench))


# -- waits in tests: one deadline loop, in helpers.py ----------------------------------------

TESTS = Path(__file__).resolve().parent

# Loops on the clock that are not waits: they run for a time on purpose. Every other loop of
# tests/ that compares the clock is a call to helpers.py's wait_for family instead.
CLOCK_LOOPS_ALLOWED = {
    "netlab.py:probe_isolated": "produces to a cut-off leader for a window",
    "netlab.py:nemesis": "faults for the run's seconds",
    "test_jepsen.py:nemesis": "kills and pauses for the soak's seconds",
    "test_fuzz.py:test_grammar_aware_fuzzing_never_breaks_a_live_node": "fuzzes for FUZZ_SECONDS",
    "test_replaced_disk.py:test_a_replaced_disk_never_elects_a_leader_without_acknowledged_records": (
        "no leader for all of 6 s: a condition that must hold throughout, not one awaited"
    ),
    "test_trust.py:timed_requests": "a well-formed client's load for N seconds",
    "test_trust.py:stall": "sends a stalled frame for up to 6 s",
    "test_trust.py:attack": "sends without reading for up to 4 s",
    "test_turns.py:busy": "keeps the CPU busy",
}
CLOCKS = {"monotonic", "time", "perf_counter"}


def compares_the_clock(node: ast.AST) -> bool:
    """A comparison with time.monotonic(), time.time() or time.perf_counter() in it."""
    return any(
        isinstance(sub, ast.Compare)
        and any(
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr in CLOCKS
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id == "time"
            for call in ast.walk(sub)
        )
        for sub in ast.walk(node)
    )


def clock_loops(source: str) -> list[str]:
    """The function around every while loop that compares the clock (in its test or its body),
    as "name:line": a deadline loop of its own."""
    found: list[str] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = function
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = child.name
            if isinstance(child, ast.While) and compares_the_clock(child):
                found.append(f"{name}:{child.lineno}")
            visit(child, name)

    visit(ast.parse(source), "<module>")
    return found


def test_tests_wait_with_the_helpers_not_loops_of_their_own() -> None:
    sample = "def f():\n    end = time.monotonic() + 5\n    while True:\n"
    sample += "        assert time.monotonic() < end\n        time.sleep(0.1)\n"
    assert clock_loops(sample) == ["f:3"], "the check sees a deadline loop"
    assert clock_loops("wait_for('x', lambda: True, 5)\n") == []
    found = {
        f"{path.name}:{loop}"
        for path in sorted(TESTS.glob("*.py"))
        if path.name != "helpers.py"
        for loop in clock_loops(path.read_text())
    }
    allowed = {loop for loop in found if loop.rpartition(":")[0] in CLOCK_LOOPS_ALLOWED}
    assert sorted(found - allowed) == [], "wait with helpers.wait_for (or its kin) instead"
    stale = set(CLOCK_LOOPS_ALLOWED) - {loop.rpartition(":")[0] for loop in allowed}
    assert stale == set(), "allowed loops that are gone: take them off CLOCK_LOOPS_ALLOWED"
