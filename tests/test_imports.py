"""Who imports whom inside ``mate_cli``, read from the source (ast): no cycles between modules, a part imports only
parts of lower floors (:data:`FLOORS`), inside every package the children import one way, no two modules share a name
for two ideas, and nothing outside ``mate_cli/commands/`` and ``mate_cli/cli.py`` imports a command.

Every import counts, module-level or inside a function, so a cycle cannot hide behind
a function-local import."""

from __future__ import annotations

import ast
import re
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
    assert "mate_cli.layout" in graph["mate_cli.modeling.encoder"]
    assert len(graph) > 40


#: the package's floors, bottom up (docs/architecture.md's map): a part (a top-level module or package) imports only
#: parts of lower floors, never another part of its own floor, so no two packages can import each other
FLOORS = (
    ("errors", "paths", "console", "silenced", "proc_memory", "signals"),
    ("io", "layout", "pretrained", "tasks", "metrics", "trainer"),
    ("data", "modeling"),
    ("lit_modules", "callbacks", "bench", "config"),
    ("run",),
    ("pipelines", "report"),
    ("commands",),
    ("cli", "__init__"),
)

#: module names that two packages share because they name the same thing: a command and its package (bench, report,
#: pointr), a dataset's reader (data/) and its official metric (metrics/), one task's data, model and module
SAME_IDEA = {"bench", "report", "pointr", "hybridqa", "sqa", "wtq", "span", "xh", "mlm"}


def part_of(module: str) -> str:
    return module.split(".")[1] if "." in module else "__init__"


def floor_of(module: str) -> int:
    """The floor of ``mate_cli.<part>...`` (``mate_cli`` itself: its ``__init__``)."""
    return next(i for i, parts in enumerate(FLOORS) if part_of(module) in parts)


def imports_not_downward(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{m} -> {n}"
        for m, names in sorted(graph.items())
        for n in sorted(names)
        if part_of(n) != part_of(m) and floor_of(n) >= floor_of(m)
    ]


def test_every_part_has_a_floor_and_imports_only_lower_floors():
    graph = import_graph()
    assert all(floor_of(m) >= 0 for m in graph)  # a new top-level part without a floor raises here
    assert imports_not_downward(graph) == []
    assert imports_not_downward({"mate_cli.data.x": {"mate_cli.run.y"}}) == ["mate_cli.data.x -> mate_cli.run.y"]
    assert imports_not_downward({"mate_cli.data.x": {"mate_cli.modeling.y"}}) == [
        "mate_cli.data.x -> mate_cli.modeling.y"
    ]


def packages() -> list[str]:
    return sorted(module_name(p) for p in PACKAGE.rglob("__init__.py"))


def children_graph(package: str, graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The direct children of ``package`` (a module, or a subpackage taken whole) and which imports which; the
    package's own ``__init__``, which may gather its children (the attention registry), is left out."""

    def child(module: str) -> str | None:
        if not module.startswith(package + "."):
            return None
        return module[len(package) + 1 :].split(".")[0]

    children: dict[str, set[str]] = {}
    for module, names in graph.items():
        if (own := child(module)) is not None:
            edges = children.setdefault(own, set())
            edges.update(c for n in names if (c := child(n)) is not None and c != own)
    return children


def test_inside_every_package_imports_go_one_way():
    graph = import_graph()
    assert "mate_cli.modeling.attention.mate" in packages() and len(packages()) > 12
    cycles = {p: cycle for p in packages() if (cycle := find_cycle(children_graph(p, graph)))}
    assert cycles == {}
    toy = {"p.a": {"p.b.x"}, "p.b.x": {"p.b.y"}, "p.b.y": {"p.a"}}
    assert find_cycle(children_graph("p", toy)) == ["a", "b", "a"]


def test_a_module_name_means_one_thing():
    by_name: dict[str, set[str]] = {}
    for module in import_graph():
        if module != "mate_cli":
            by_name.setdefault(module.rsplit(".", 1)[-1], set()).add(module)
    assert {name for name, modules in by_name.items() if len(modules) > 1} == SAME_IDEA


def test_the_architecture_pages_floors_are_the_tests():
    """docs/architecture.md lists the floors bottom up, one line each: ``<n>. `part`, `part` ...``."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("### Floors", 1)[1].split("\n\n", 2)[1]
    listed = [tuple(re.findall(r"`([\w/]+?)/?`", line.split(":", 1)[0])) for line in section.splitlines()]
    assert listed == [tuple(part for part in floor) for floor in FLOORS]


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
    import): what both need, the process's peak RSS, lives in mate_cli/proc_memory.py."""
    graph = import_graph()

    def reached(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    training = [
        m
        for m in graph
        if part_of(m) in ("lit_modules", "callbacks", "trainer", "modeling", "data", "metrics", "layout", "pretrained")
    ]
    assert len(training) > 30
    found = {m: sorted(n for n in reached(m) if n.startswith("mate_cli.bench")) for m in training}
    assert not {m: b for m, b in found.items() if b}
