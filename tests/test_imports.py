"""Who imports whom inside ``mate_cli``, read from the source (ast): no cycles, nothing
imports a module on a floor above its own (:data:`FLOORS`), and nothing outside
``mate_cli/commands/`` and ``mate_cli/cli.py`` imports a command.

Every import counts, module-level or inside a function, so a cycle cannot hide behind
a function-local import."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mate_cli"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = PACKAGE.parent / Path(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path) -> set[str]:
    """The ``mate_cli`` modules ``path`` imports (``from pkg import submodule`` names the submodule)."""
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}") else base)
    return {name for name in found if name == "mate_cli" or name.startswith("mate_cli.")} - {this}


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None (depth-first search with colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_detector_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_sees_function_local_and_relative_imports(tmp_path):
    graph = import_graph()
    assert "mate_cli.modeling.layout" in graph["mate_cli.modeling.encoder"]
    assert len(graph) > 40


#: the package's floors, bottom up (docs/architecture.md's map): a module imports its own floor's and lower ones only
FLOORS = (
    ("errors", "io", "console", "paths", "silenced", "tasks"),
    ("modeling", "data", "metrics"),
    ("lit_modules", "bench"),
    ("config", "run"),
    ("pipelines", "report"),
    ("commands",),
    ("cli", "__init__"),
)


def floor_of(module: str) -> int:
    """The floor of ``mate_cli.<part>...`` (``mate_cli`` itself: its ``__init__``)."""
    part = module.split(".")[1] if "." in module else "__init__"
    return next(i for i, parts in enumerate(FLOORS) if part in parts)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{m} -> {n}" for m, names in sorted(graph.items()) for n in sorted(names) if floor_of(n) > floor_of(m)]


def test_every_module_has_a_floor_and_none_imports_upward():
    graph = import_graph()
    assert all(floor_of(m) >= 0 for m in graph)  # a new top-level part without a floor raises here
    assert upward_imports(graph) == []
    assert upward_imports({"mate_cli.data.x": {"mate_cli.run.y"}}) == ["mate_cli.data.x -> mate_cli.run.y"]


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_only_commands_and_cli_import_commands():
    offenders = {
        module: sorted(n for n in imported if n.startswith("mate_cli.commands"))
        for module, imported in import_graph().items()
        if not module.startswith("mate_cli.commands") and module != "mate_cli.cli"
    }
    assert not {m: n for m, n in offenders.items() if n}


def test_training_imports_nothing_of_the_bench():
    """Training, data and models never import ``mate bench`` (its measuring module probes libc in a subprocess at
    import): what both need, the process's peak RSS, lives in mate_cli/lit_modules/proc_memory.py."""
    graph = import_graph()

    def reached(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    training = [m for m in graph if m.startswith(("mate_cli.lit_modules", "mate_cli.modeling", "mate_cli.data"))]
    assert len(training) > 30
    found = {m: sorted(n for n in reached(m) if n.startswith("mate_cli.bench")) for m in training}
    assert not {m: b for m, b in found.items() if b}
